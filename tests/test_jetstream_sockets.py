"""The sockets of a journal's NATS connection (`journal/_jetstream/client.py`) through a
server that hangs (stopped with SIGSTOP: its kernel still accepts connections, and nothing
answers on them), on a server of the test's own (`-m slow`).

nats-py 2.16 drops the socket of a connection attempt whose server accepted it and never
said INFO: on a reconnect the next attempt's connection replaces it unclosed, and one that
`Journal.open` gives up on is left to the garbage collector with its client. Each was
closed by the collector with a ResourceWarning ("unclosed <StreamWriter ...>"), one for
every 2 s attempt of an outage: 29 in the 65 s of an import's unanswered commit
(`test_an_import_commit_left_without_an_answer_is_write_outcome_unknown`)."""

from __future__ import annotations

import gc
import os
import signal
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from _nats import NatsServer, wait_for_jetstream

from journal import Journal, StoreUnavailable

pytestmark = pytest.mark.slow


def sockets_to(port: int) -> int:
    """This process's open TCP sockets to `port` on the loopback (its descriptors that
    are sockets, found in /proc/net/tcp by their inode)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # (closed meanwhile; the listing's own descriptor)
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    with open("/proc/net/tcp") as table:
        for line in table.read().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].split(":")[1], 16)
            if remote_port == port and fields[9] in inodes:
                count += 1
    return count


def _resource_warnings(seen: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path, "hangs")
    server.start()
    wait_for_jetstream([server.url])
    try:
        yield server
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.stop()


def test_reconnects_to_a_hung_server_close_the_sockets_they_give_up(
    server: NatsServer,
) -> None:
    """A journal whose server hung for 12 s (its pings unanswered for 4 to 6 s, then
    reconnects each waiting 2 s for the server's INFO) and came back: no socket was left
    to the garbage collector, and none is open once the journal closed."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        j = Journal.open(server.url, store="hangs")
        try:
            j.create_session("s")
            os.kill(server.pid, signal.SIGSTOP)
            try:
                time.sleep(12)
            finally:
                os.kill(server.pid, signal.SIGCONT)
            deadline = time.monotonic() + 30
            while True:  # (once the client reconnected)
                try:
                    assert [m.session_id for m in j.list_sessions()] == ["s"]
                    break
                except StoreUnavailable:
                    assert time.monotonic() < deadline, "the journal never reconnected"
            assert sockets_to(server.port) == 1
        finally:
            j.close()
        gc.collect()
    assert _resource_warnings(seen) == []
    assert sockets_to(server.port) == 0


def test_an_open_refused_by_a_hung_server_leaves_no_socket(server: NatsServer) -> None:
    """`Journal.open` of a server that hangs gives up after its 5 s (StoreUnavailable),
    a connection attempt underway: its socket is closed, not left to the collector."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        os.kill(server.pid, signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable):
                Journal.open(server.url, store="hangs")
            open_after = sockets_to(server.port)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        gc.collect()
    assert _resource_warnings(seen) == []
    assert open_after == 0
