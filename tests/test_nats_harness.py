"""The tests' NATS servers (`tests/_nats.py`) under two test workers.

A server's client port is chosen free (bound and released) before the server binds it,
so another process, another worker's server say, may take it in between. `start` waited
for the port to take connections, so it could return with its own server exited and the
tests talking to the other one, whose worker stops it when it ends. It now waits for the
server's own log to say that it listens, and chooses another port when its choice was
taken before the first start.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _nats import CuttingProxy, DelayingProxy, HoldingProxy, NatsServer, shared_server


def test_a_server_whose_chosen_port_was_taken_starts_on_another(tmp_path: Path) -> None:
    server = NatsServer(tmp_path, "moved", jetstream=False)
    taken = server.port
    with socket.socket() as other:  # another process's server, listening there first
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", taken))
        other.listen()
        try:
            server.start()
            time.sleep(0.2)
            assert server.process is not None and server.process.poll() is None
            assert server.port != taken
            with socket.create_connection(("127.0.0.1", server.port), 2) as client:
                assert client.recv(4).startswith(b"INFO")  # (a NATS server greets first)
        finally:
            server.stop()


def test_a_server_given_its_port_does_not_move(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        server = NatsServer(tmp_path, "fixed", port=port, jetstream=False)
        try:
            try:
                server.start()
            except RuntimeError as e:
                assert "in use" in str(e)
            else:
                raise AssertionError("started on a port another socket listens on")
            assert server.port == port
        finally:
            server.stop()


@pytest.mark.parametrize("kind", [CuttingProxy, HoldingProxy, DelayingProxy])
def test_a_closed_proxy_takes_no_more_connections(kind: Any) -> None:
    """A proxy's close closed its listening socket while its thread waited in accept(),
    which a close from another thread does not wake on Linux: the socket went on
    listening, and a connection made after the close was still forwarded to the
    server. Its close now shuts its sockets down, which wakes their threads."""
    server = shared_server()
    proxy = kind(server.port)
    before = {t for t in threading.enumerate() if t.name.endswith("(_accept)")}
    with socket.create_connection(("127.0.0.1", proxy.port), 2) as client:
        assert client.recv(4).startswith(b"INFO")  # (forwarded: the proxy accepts)
    time.sleep(0.2)  # (its thread back in accept())
    proxy.close()
    deadline = time.monotonic() + 5
    while {t for t in threading.enumerate() if t.name.endswith("(_accept)")} >= before:
        assert time.monotonic() < deadline, "the proxy's thread still waits in accept()"
        time.sleep(0.05)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), 2).close()
