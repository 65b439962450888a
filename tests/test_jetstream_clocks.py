"""Hosts whose clocks disagree, on the JetStream engine (SPEC 16.5, "owner liveness", and
8, "Clock steps"): an owner on another host is judged by when the server stored its
heartbeats, on the servers' clock, not by the time its own clock put in them; what a
writer records and judges (creations, event stamps, suspensions, deadlines, windows)
follows the servers' clock too. Each owner or writer is a child process that names
another host and runs its wall clock off by a given amount."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from _nats import shared_server

from journal import EventIn, Journal, OwnerBusy, SessionState

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
    # (`with`: its pipes are closed once it ended; the test item keeps `child` to the
    # end of the run, and the pipes with it otherwise: two descriptors a test)
    with subprocess.Popen(
        [sys.executable, "-c", _SKEWED_OWNER, url, name, str(request.param)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    ) as child:
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


# A writer on another host whose clock is off by argv[3] ms: runs `body` with `j` a
# writable journal of the store, and prints what it leaves in `out` as JSON.
_SKEWED_WRITER = """
import json, socket, sys, time
skew_ns = int(sys.argv[3]) * 1_000_000
real_ns, real_s = time.time_ns, time.time
time.time_ns = lambda: real_ns() + skew_ns
time.time = lambda: real_s() + skew_ns / 1e9
socket.gethostname = lambda: "another-host"
from journal import EventIn, Journal
out = {}
with Journal.open(sys.argv[1], store=sys.argv[2]) as j:
    exec(sys.argv[4])
print(json.dumps(out), flush=True)
"""


def _skewed_writer(url: str, name: str, skew_ms: int, body: str) -> dict[str, object]:
    """Run `body` in a writer whose clock is off by `skew_ms`; what it put in `out`."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", _SKEWED_WRITER, url, name, str(skew_ms), body],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


_HOUR: Final = 3_600_000


def test_a_writer_whose_clock_is_ahead_judges_deadlines_and_windows_on_the_servers_clock(
    tmp_path: Path,
) -> None:
    """Until 2026-12-06 a writable journal on a host 2 hours ahead expired at once (its
    expiry timer at open, `expire_due()`, its next commit) a session with a 1-hour ttl
    created by a host with the right time, and its retention pass trimmed a 1-hour age
    window of events a moment old."""
    url, name = shared_server().url, _store(tmp_path)
    with Journal.open(url, store=name) as j:
        j.create_session("t", ttl_ms=_HOUR)
        j.create_session("w", max_history_age_ms=_HOUR)
        j.append("w", [EventIn("message", b"{}")])
    body = (
        "time.sleep(0.2)\n"  # (the expiry timer's pass at open)
        "out['expired'] = [m.session_id for m in j.expire_due()]\n"
        "j.append('t', [EventIn('message', b'{}')])\n"
        "out['trimmed'] = j.apply_retention().trimmed_sessions\n"
    )
    found = _skewed_writer(url, name, 2 * _HOUR, body)
    assert found == {"expired": [], "trimmed": []}
    with Journal.open(url, store=name) as j:
        assert j.get_session("t").state is SessionState.OPEN
        assert j.get_session("t").last_ordinal == 1
        assert [e.ordinal for e in j.read("w").events] == [1]


def test_what_a_writer_whose_clock_is_behind_records_follows_the_servers_clock(
    tmp_path: Path,
) -> None:
    """Until 2026-12-06 a host 2 hours behind created sessions, suspended them and
    stamped events 2 hours in the past: a host with the right time expired its session
    with a 1-hour ttl, and its suspended one with a 1-hour limit, at once."""
    url, name = shared_server().url, _store(tmp_path)
    body = (
        "j.create_session('t', ttl_ms=3_600_000)\n"
        "j.create_session('p', max_suspend_ms=3_600_000)\n"
        "j.suspend_session('p')\n"
        "j.append('t', [EventIn('message', b'{}')])\n"
    )
    before = time.time_ns() // 1_000_000
    _skewed_writer(url, name, -2 * _HOUR, body)
    after = time.time_ns() // 1_000_000
    with Journal.open(url, store=name) as j:
        assert j.expire_due() == []
        t, p = j.get_session("t"), j.get_session("p")
        assert (t.state, p.state) == (SessionState.OPEN, SessionState.SUSPENDED)
        # (The servers' clock is this host's: within a second of what it saw.)
        stamps = [t.created_at_ms, p.suspended_at_ms, *(e.timestamp_ms for e in j.read("t").events)]
        assert all(s is not None and before - 1000 <= s <= after + 1000 for s in stamps)


# A writer whose clock is stepped 2 hours ahead after its first commit, then 2 more while
# the servers leave its measurement of their clock unanswered (the fault point
# `clock.measure`); it prints which measurements it made (True: one left unanswered).
_STEPPED_WRITER = """
import json, sys, time
from nats.errors import TimeoutError as NatsTimeout
skew = [0]
real_ns, real_s = time.time_ns, time.time
time.time_ns = lambda: real_ns() + skew[0]
time.time = lambda: real_s() + skew[0] / 1e9
from journal import EventIn, Journal
from journal._jetstream.engine import JetStreamEngine, JetStreamOptions
measured, unanswered = [], [False]
def point(name, detail):
    if name == "clock.measure":
        measured.append(unanswered[0])
        if unanswered[0]:
            raise NatsTimeout
options = JetStreamOptions(servers=[sys.argv[1]], store=sys.argv[2], point=point)
with Journal.over(JetStreamEngine.open(options)) as j:
    j.create_session("t", ttl_ms=3_600_000)
    skew[0] = 2 * 3_600_000_000_000
    j.append("t", [EventIn("message", b"{}")])
    skew[0], unanswered[0] = 4 * 3_600_000_000_000, True
    j.append("t", [EventIn("message", b"{}")])
    expired = [m.session_id for m in j.expire_due()]
print(json.dumps({"measured": measured, "expired": expired}), flush=True)
"""


def test_a_step_of_the_writers_clock_is_measured_again_and_rides_out_an_unanswered_measurement(
    tmp_path: Path,
) -> None:
    """The offset is measured again at once when the local clock steps; when that
    measurement goes unanswered the writes go on, on the monotonic clock."""
    url, name = shared_server().url, _store(tmp_path)
    root = Path(__file__).resolve().parent.parent
    before = time.time_ns() // 1_000_000
    done = subprocess.run(
        [sys.executable, "-c", _STEPPED_WRITER, url, name],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=False,
    )
    after = time.time_ns() // 1_000_000
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["expired"] == []
    # (The first measurement, the one after the first step, the unanswered one: a few,
    # none for each write; the expiry timer may take one of the first two.)
    assert found["measured"][-1] is True and found["measured"].count(False) in (2, 3)
    with Journal.open(url, store=name) as j:
        t = j.get_session("t")
        assert t.state is SessionState.OPEN and t.last_ordinal == 2
        stamps = [t.created_at_ms, *(e.timestamp_ms for e in j.read("t").events)]
        assert all(before - 1000 <= s <= after + 1000 for s in stamps), stamps


def test_an_import_by_a_writer_whose_clock_is_behind_expires_what_is_past_its_deadline(
    tmp_path: Path,
) -> None:
    """An imported session whose deadline has passed on the servers' clock expires before
    the import returns (SPEC 12.3), also where the importer's clock is behind."""
    source = tmp_path / "source"
    with Journal.open(source) as j:
        j.create_session("ttl", ttl_ms=500)
        j.create_session("plain")
    archive = tmp_path / "sessions.archive"
    with Journal.open(source, readonly=True) as j:  # (a reader: nothing expires)
        j.export_sessions(None, str(archive))
        due = [m.expires_at_ms for m in j.list_sessions() if m.expires_at_ms is not None]
    time.sleep(max(0.0, (max(due) - time.time() * 1000) / 1000) + 0.05)
    url, name = shared_server().url, _store(tmp_path)
    with Journal.open(url, store=name):
        pass
    # (It closes as soon as the import returns, as `journal import` does.)
    _skewed_writer(url, name, -2 * _HOUR, f"j.import_sessions({str(archive)!r})\n")
    with Journal.open(url, store=name, readonly=True) as j:  # (no writer: none expires)
        states = {m.session_id: m.state for m in j.list_sessions()}
    assert states == {"plain": SessionState.OPEN, "ttl": SessionState.EXPIRED}
