"""Hosts whose clocks disagree, on the JetStream engine (SPEC 16.5, "owner liveness"): an
owner on another host is judged by when the server stored its heartbeats, on the
servers' clock, not by the time its own clock put in them. Each owner is a child process
that names another host and runs its wall clock off by a given amount."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _nats import shared_server

from journal import Journal, OwnerBusy

_SKEWED_OWNER = """
import socket, sys, time
skew_ns = int(sys.argv[3]) * 1_000_000
real_ns, real_s = time.time_ns, time.time
time.time_ns = lambda: real_ns() + skew_ns  # this host's clock is off
time.time = lambda: real_s() + skew_ns / 1e9
socket.gethostname = lambda: "another-host"  # the owner runs on another machine
from journal import EventIn, Journal
j = Journal.open(sys.argv[1], store=sys.argv[2])
turn = j.own("s").turn("r-remote").__enter__()
turn.append([EventIn("message", b'{"working": true}')])
print("mid-turn", flush=True)
sys.stdin.readline()
turn.append([EventIn("message", b'{"still": true}')])
print("appended", flush=True)
time.sleep(600)
"""


def _store(path: Path) -> str:
    return "t" + hashlib.sha256(str(path).encode()).hexdigest()[:24]


@pytest.fixture
def owner_elsewhere(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """A session `s` owned, mid-turn, by a child on another host with its clock off by
    `request.param` ms; yields the URL and the store's name."""
    url, name = shared_server().url, _store(tmp_path)
    with Journal.open(url, store=name) as j:
        j.create_session("s")
    root = Path(__file__).resolve().parent.parent
    child = subprocess.Popen(
        [sys.executable, "-c", _SKEWED_OWNER, url, name, str(request.param)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    request.node.owner = child
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "mid-turn"
        yield url, name
    finally:
        child.kill()
        child.wait(10)


@pytest.mark.parametrize("owner_elsewhere", [-20_000, -3_600_000], indirect=True)
def test_a_live_owner_whose_clock_is_behind_keeps_its_lease(
    owner_elsewhere: tuple[str, str], request: pytest.FixtureRequest
) -> None:
    """Until 2026-12-06 its heartbeats looked 20 s old to a host with the right time:
    `own()` took the lease from the live owner at once, recorded its turn in progress as
    failed (WATCH_OUTCOME_UNKNOWN), and the owner's next append raised `OwnerBusy`."""
    url, name = owner_elsewhere
    child = request.node.owner
    with Journal.open(url, store=name) as j:
        time.sleep(2.5)  # beyond any grace of a fresh lease: only its beats keep it
        with pytest.raises(OwnerBusy):
            j.own("s")
        meta = j.get_session("s")
        assert meta.owner is not None and meta.owner.pid == child.pid
        assert meta.open_turn == "r-remote"
    child.stdin.write("\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "appended"  # its turn goes on


@pytest.mark.parametrize("owner_elsewhere", [86_400_000], indirect=True)
def test_a_dead_owner_whose_clock_is_ahead_is_judged_dead_when_its_beats_lapse(
    owner_elsewhere: tuple[str, str], request: pytest.FixtureRequest
) -> None:
    """Until 2026-12-06 the heartbeats of a host a day ahead looked a day younger than
    they were: the session stayed `OwnerBusy` for a day after its owner was killed."""
    url, name = owner_elsewhere
    child = request.node.owner
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    with Journal.open(url, store=name) as j:
        given_up = time.monotonic() + 60  # (the lease lapses 10 s after the last beat)
        while True:
            try:
                owner = j.own("s")
                break
            except OwnerBusy:
                assert time.monotonic() < given_up, "the dead owner's lease never lapsed"
                time.sleep(0.5)
        with owner:
            assert owner.recovered_turn == "r-remote"
