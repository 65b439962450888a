"""Turns: settled outcomes, reserved event types, and outcome-unknown detection when a
turn's owner dies (a real process, SIGKILL) or the session ends mid-turn."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _pipes import reap

from journal import (
    EventIn,
    InvalidArgument,
    Journal,
    OutcomeUnknown,
    OwnerBusy,
    RetentionPolicy,
    SessionNotWritable,
    StoreUnavailable,
)
from journal._local.files import FileOps

ROOT = Path(__file__).resolve().parent.parent
UNKNOWN = {
    "status": "failed",
    "error": {
        "code": "WATCH_OUTCOME_UNKNOWN",
        "message": "the previous owner ended without recording a settled result; the "
        "prompt may have executed",
    },
}

_MID_TURN = """
import sys
from journal import EventIn, Journal
with Journal.open(sys.argv[1], durability="fsync") as j:
    owner = j.own("s")
    turn = owner.turn("r-killed").__enter__()
    turn.append([EventIn("message", b'{"step": 1}')])
    print("mid-turn", flush=True)
    sys.stdin.readline()  # killed here
"""


def _child_env() -> dict[str, str]:
    """The environment of a child Python process that imports this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _kinds(j: Journal, session_id: str, cursor: str | None = None) -> list[tuple[Any, ...]]:
    return [(e.type, e.request_id, json.loads(e.data)) for e in j.replay(session_id, cursor)]


def test_turns_record_completed_cancelled_and_failed_outcomes(tmp_path: Path) -> None:
    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        with j.own("s") as owner:
            with owner.turn("r1") as turn:
                appended = turn.append([EventIn("message", b'{"text": "hi"}')])
                assert appended.first_ordinal == 2
            with owner.turn("r2") as turn:
                turn.cancel()
            with pytest.raises(OwnerBusy), owner.turn("r3"):
                raise OwnerBusy("the tool was busy", pid=7)
            with pytest.raises(ValueError), owner.turn("r4"):
                raise ValueError("bad input")
        assert _kinds(j, "s") == [
            ("turn_started", "r1", {}),
            ("message", "r1", {"text": "hi"}),
            ("turn_result", "r1", {"status": "completed"}),
            ("turn_started", "r2", {}),
            ("turn_result", "r2", {"status": "cancelled"}),
            ("turn_started", "r3", {}),
            (
                "turn_result",
                "r3",
                {
                    "status": "failed",
                    "error": {"code": "OWNER_BUSY", "message": "the tool was busy"},
                },
            ),
            ("turn_started", "r4", {}),
            (
                "turn_result",
                "r4",
                {"status": "failed", "error": {"code": "ValueError", "message": "bad input"}},
            ),
        ]
        # Every turn event is a session event with an ordinal and a cursor.
        events = list(j.replay("s"))
        assert [e.ordinal for e in events] == list(range(1, 10))
        assert all(e.cursor for e in events)


def test_turn_types_are_reserved_and_one_turn_at_a_time(tmp_path: Path) -> None:
    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        for kind in ("turn_started", "turn_result"):
            with pytest.raises(InvalidArgument, match="reserved for turns"):
                j.append("s", [EventIn(kind, b'{"status": "completed"}')])
        # A message whose payload imitates a turn record is a message.
        j.append("s", [EventIn("message", b'{"type": "turn_result"}')])
        with (
            j.own("s") as owner,
            owner.turn("r1"),
            pytest.raises(InvalidArgument, match="one turn at a time"),
        ):
            owner.turn("r2")
        assert [e.type for e in j.replay("s")] == ["message", "turn_started", "turn_result"]


def test_a_session_resolved_mid_turn_ends_its_watchers_with_outcome_unknown(
    tmp_path: Path,
) -> None:
    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        owner = j.own("s")
        turn = owner.turn("r1").__enter__()
        seen: list[str] = []
        errors: list[OutcomeUnknown] = []

        def watch() -> None:
            try:
                for event in j.watch("s"):
                    seen.append(event.cursor)
            except OutcomeUnknown as e:
                errors.append(e)

        watcher = threading.Thread(target=watch)
        watcher.start()
        time.sleep(0.2)
        assert not errors  # its owner is alive: the stream just waits
        j.resolve_session("s")
        watcher.join(10)
        assert not watcher.is_alive()
        assert len(errors) == 1 and errors[0].request_id == "r1"
        assert errors[0].cursor == seen[-1]
        assert errors[0].session_ended  # (nobody can settle it: no resuming helps)
        with pytest.raises(SessionNotWritable):
            turn.__exit__(None, None, None)
        owner.release()


def test_an_owner_killed_mid_turn_is_reported_and_settled_by_the_next_owner(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    with Journal.open(store) as j:
        j.create_session("s")
        j.append("s", [EventIn("message", b'{"before": true}')])
    env = _child_env()
    child = subprocess.Popen(
        [sys.executable, "-c", _MID_TURN, str(store)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "mid-turn"
        with Journal.open(store) as j:
            delivered: list[Any] = []
            errors: list[OutcomeUnknown] = []

            def watch() -> None:
                try:
                    for event in j.watch("s"):
                        delivered.append(event)
                except OutcomeUnknown as e:
                    errors.append(e)

            watcher = threading.Thread(target=watch)  # started before the kill
            watcher.start()
            deadline = time.monotonic() + 10
            while len(delivered) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
            assert not errors and watcher.is_alive()  # the owner lives: it waits
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            watcher.join(10)
            assert not watcher.is_alive()
            assert len(errors) == 1, errors
            error = errors[0]
            assert error.request_id == "r-killed" and error.code == "WATCH_OUTCOME_UNKNOWN"
            assert not error.session_ended  # (a next owner settles it)
            assert [e.type for e in delivered] == ["message", "turn_started", "message"]
            assert error.cursor == delivered[-1].cursor
            # The next owner records the unknown outcome before own() returns.
            with j.own("s") as owner, owner.turn("r-next") as turn:
                # It says which turn it recorded so (a restarting runtime learns it here).
                assert owner.recovered_turn == "r-killed"
                turn.append([EventIn("message", b'{"after": true}')])
            assert _kinds(j, "s", error.cursor) == [
                ("turn_result", "r-killed", UNKNOWN),
                ("turn_started", "r-next", {}),
                ("message", "r-next", {"after": True}),
                ("turn_result", "r-next", {"status": "completed"}),
            ]
            # No other result is ever invented: owning again adds nothing.
            before = j.get_session("s").last_ordinal
            with j.own("s") as again:
                assert again.recovered_turn is None
            assert j.get_session("s").last_ordinal == before
            assert j.verify().ok
    finally:
        reap(child)


def test_a_restarted_runtime_folds_its_session_after_own_to_hold_the_recovered_turn(
    tmp_path: Path,
) -> None:
    """README ("Runtime state that survives a restart"): own() records a dead owner's
    unsettled turn as failed, so a fold taken before it lacks that result, and a
    following one stops at the turn (OutcomeUnknown to on_error); fold after own()."""
    store = tmp_path / "store"
    with Journal.open(store) as j:
        j.create_session("s")
    with _child_mid_turn(_MID_TURN, str(store)) as child:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    settled = lambda n, e: n + (e.type == "turn_result")  # noqa: E731
    with Journal.open(store) as j:
        errors: list[BaseException] = []
        early = j.fold("s", settled, 0)
        following = j.fold("s", settled, 0, follow=True, on_error=errors.append)
        deadline = time.monotonic() + 10
        while following.following and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not following.following
        assert [type(e) for e in errors] == [OutcomeUnknown]
        with j.own("s") as owner:
            assert owner.recovered_turn == "r-killed"
            assert early.state == following.state == 0  # taken before own(): stale
            assert j.fold("s", settled, 0).state == 1  # after own(): the result
            assert early.refresh() == 1


_EXECS_MID_TURN = """
import os, sys
from journal import EventIn, Journal
j = Journal.open(sys.argv[1], durability="os")
turn = j.own("s").turn("r-exec").__enter__()
print("mid-turn", flush=True)
sys.stdin.readline()
# A self-restart (or a crash reporter) replaces the program: the lease's descriptor is
# closed by exec, the pid and its start time stay.
os.execv("/bin/sleep", ["sleep", "60"])
"""


def _outcome_of_watch(j: Journal, seconds: float) -> OutcomeUnknown | None:
    """What a watch of "s" raises within `seconds` (None: it kept waiting)."""
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    try:
        for _event in j.watch("s", stop=stop):
            pass
    except OutcomeUnknown as e:
        return e
    finally:
        timer.cancel()
    return None


@pytest.mark.parametrize("end", ["killed, not reaped", "exec"])
def test_an_owner_that_is_a_zombie_or_called_exec_is_gone(tmp_path: Path, end: str) -> None:
    # Both kept watchers waiting for ever: the pid existed with the owner's start time
    # (a supervisor that watches does not reap its killed child; exec keeps the pid),
    # though the lease's lock was free and own() succeeded at once.
    store = tmp_path / "store"
    with Journal.open(store) as j:
        j.create_session("s")
    script = _MID_TURN if end != "exec" else _EXECS_MID_TURN
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(store)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_child_env(),
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "mid-turn"
        with Journal.open(store) as j:
            assert j.get_session("s").owner is not None
            assert _outcome_of_watch(j, 0.3) is None  # alive: the watch waits
            if end == "exec":
                child.stdin.write("\n")  # type: ignore[union-attr]
                child.stdin.flush()  # type: ignore[union-attr]
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    with open(f"/proc/{child.pid}/cmdline", "rb") as f:
                        if f.read().startswith(b"sleep"):
                            break
                    time.sleep(0.01)
                assert child.poll() is None  # the process lives on
            else:
                child.send_signal(signal.SIGKILL)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    with open(f"/proc/{child.pid}/stat", "rb") as f:
                        if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                            break
                    time.sleep(0.01)
            error = _outcome_of_watch(j, 5)
            assert error is not None, "the watch kept waiting for a dead owner"
            assert error.request_id == ("r-exec" if end == "exec" else "r-killed")
            assert j.get_session("s").owner is None
            with j.own("s"):
                pass
    finally:
        reap(child)


_DIES_MID_TURN = """
import os, sys
from journal import EventIn, Journal
j = Journal.open(sys.argv[1], durability="os", segment_bytes=4096)
turn = j.own("s").turn("r1").__enter__()
for _ in range(12):  # the turn_started record ends up in a sealed segment
    turn.append([EventIn("message", b"m" * 700)])
os._exit(0)  # dies with the turn open: no result, no release
"""


def test_an_unsettled_turn_survives_a_rebuild_of_the_view(tmp_path: Path) -> None:
    options: dict[str, Any] = {"durability": "os", "segment_bytes": 4096}
    with Journal.open(tmp_path, **options) as j:
        j.create_session("s")
    env = _child_env()
    subprocess.run([sys.executable, "-c", _DIES_MID_TURN, str(tmp_path)], env=env, check=True)
    assert len(list((tmp_path / "segments").glob("*.idx"))) >= 2
    shutil.rmtree(tmp_path / "index")
    os.unlink(tmp_path / "view-boot")
    with Journal.open(tmp_path, **options) as j:  # rebuilt from sidecars + active segment
        assert j.verify().ok
        with pytest.raises(OutcomeUnknown) as unknown:
            list(j.watch("s"))
        assert unknown.value.request_id == "r1"
        with j.own("s"):
            pass
        last = list(j.replay("s"))[-1]
        assert (last.type, last.request_id, json.loads(last.data)) == ("turn_result", "r1", UNKNOWN)
        assert j.verify().ok


def test_a_settled_turn_stays_settled_after_retention_and_a_rebuild(tmp_path: Path) -> None:
    """Only `turn_started` was pinned while a turn was open; once settled, retention could
    delete the segment of its result but keep the one of its start (live for another
    reason): a rebuild then saw an unsettled turn, verify() reported the view as differing
    from the log, and the next own() invented a failed result for a completed turn."""
    big = b'{"x":"' + b"y" * 3000 + b'"}'
    options: dict[str, Any] = {"durability": "os", "segment_bytes": 8192}
    with Journal.open(tmp_path, **options) as j:
        j.create_session("s")
        with j.own("s") as owner, owner.turn("r1") as turn:
            for _ in range(6):
                turn.append([EventIn("message", big)])
        for _ in range(3):
            j.append("s", [EventIn("message", big)])
        j.compact_session("s", j.get_session("s").last_ordinal, b"snap")
        assert j.apply_retention().deleted_segments
        report = j.verify()
        assert report.ok, report.problems
    shutil.rmtree(tmp_path / "index")
    os.unlink(tmp_path / "view-boot")
    with Journal.open(tmp_path, **options) as j:
        before = j.get_session("s").last_ordinal
        with j.own("s"):
            pass
        assert j.get_session("s").last_ordinal == before  # nothing invented
        assert j.verify().ok


def test_an_older_turns_start_left_by_compaction_does_not_reopen_it_in_a_rebuild(
    tmp_path: Path,
) -> None:
    """Pinning the latest turn event is not enough when an older turn's `turn_started`
    survives compaction (in a compressed segment with few dead bytes) while its result
    and the next turn's start (in another segment) are dropped: a rebuild met the lone
    start, then the next turn's result, and kept the older turn open. Found by a soak:
    verify() reported a healthy store's session as differing from the log."""
    big = b'{"x":"' + b"y" * 3000 + b'"}'
    options: dict[str, Any] = {
        "durability": "os",
        "segment_bytes": 8192,
        "retention": RetentionPolicy(max_history_bytes=None),
    }
    with Journal.open(tmp_path, **options) as j:
        j.create_session("s")
        j.create_session("keep")  # live data beside the turn events
        with j.own("s") as owner:
            first = owner.turn("r1").__enter__()
            for _ in range(3):
                j.append("keep", [EventIn("message", big)])
            j.compact()  # the segment of r1's start: compressed, r1's start kept (pinned)
            first.__exit__(None, None, None)
            with owner.turn("r2"):
                for _ in range(3):  # r1's result and r2's start: sealed in another segment
                    j.append("keep", [EventIn("message", big)])
            j.compact_session("s", j.get_session("s").last_ordinal, b"snap")
            j.compact()  # drops r1's result and r2's start; r1's start stays (few dead bytes)
        assert j.get_session("s").open_turn is None
        report = j.verify()
        assert report.ok, report.problems
    shutil.rmtree(tmp_path / "index")
    os.unlink(tmp_path / "view-boot")
    with Journal.open(tmp_path, **options) as j:
        assert j.get_session("s").open_turn is None
        before = j.get_session("s").last_ordinal
        with j.own("s"):
            pass
        assert j.get_session("s").last_ordinal == before  # no failed result invented
        assert j.verify().ok


def test_an_owner_of_an_evicted_session_cannot_write_into_its_successor(tmp_path: Path) -> None:
    from journal import RetentionPolicy

    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)
    with Journal.open(tmp_path, durability="os", retention=policy) as j:
        j.create_session("s")
        stale = j.own("s")
        ended = j.resolve_session("s").ended_at_ms
        assert ended is not None
        assert j.apply_retention(now_ms=ended + 10).evicted_sessions == ["s"]
        j.create_session("s")  # a new incarnation under the same id
        stale.release()
        with j.own("s") as fresh:
            assert fresh.generation == 1  # generations start again per incarnation
            with pytest.raises(OwnerBusy), stale.turn("stale"):
                pass
            with fresh.turn("ok"):
                pass
        assert [(e.type, e.request_id) for e in j.replay("s")] == [
            ("turn_started", "ok"),
            ("turn_result", "ok"),
        ]


def test_an_owner_that_released_its_lease_cannot_append_to_its_open_turn(
    tmp_path: Path,
) -> None:
    # Nobody took the lease over (same incarnation, same generation): the store refuses
    # the write because the session records no owner, not because another one holds it.
    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        owner = j.own("s")
        turn = owner.turn("r1").__enter__()
        turn.append([EventIn("message", b"1")])
        owner.release()
        with pytest.raises(OwnerBusy):
            turn.append([EventIn("message", b"2")])
        with pytest.raises(OwnerBusy):
            turn.__exit__(None, None, None)  # nor record its result
        assert [(e.type, e.data) for e in j.replay("s")] == [
            ("turn_started", b"{}"),
            ("message", b"1"),
        ]
        assert j.get_session("s").owner is None


def test_a_forked_child_does_not_keep_a_dead_owners_lease(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
    script = """
import os, sys, time
from journal import Journal
j = Journal.open(sys.argv[1], durability="os")
owner = j.own("s")
owner.turn("r1").__enter__()
child = os.fork()
if child == 0:
    time.sleep(30)  # outlives its parent
    os._exit(0)
print(child, flush=True)
sys.stdin.readline()
"""
    env = _child_env()
    owner = subprocess.Popen(
        [sys.executable, "-c", script, str(store)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert owner.stdout is not None
    grandchild = int(owner.stdout.readline())
    try:
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        with Journal.open(store, durability="os") as j, j.own("s", wait_s=5) as successor:
            assert successor.generation == 2
            last = list(j.replay("s"))[-1]
            assert (last.type, json.loads(last.data)) == ("turn_result", UNKNOWN)
    finally:
        reap(owner)
        os.kill(grandchild, signal.SIGKILL)


def test_a_turn_runs_once_and_says_when_it_was_never_started(tmp_path: Path) -> None:
    """Found by a runtime-author trial: `turn.append` on a turn made by `owner.turn()`
    but not entered said the turn "is settled" (nothing was written for it), and entering
    a `Turn` a second time appended a second `turn_started` for the same request id
    (after its `turn_result`, and outside the owner's one-turn-at-a-time guard), which
    left the session with an open turn nobody would settle."""
    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        with j.own("s") as owner:
            turn = owner.turn("r1")
            with pytest.raises(InvalidArgument, match="'r1' has not started: use it as"):
                turn.append([EventIn("message", b"early")])
            with turn:
                turn.append([EventIn("message", b"1")])
                with pytest.raises(InvalidArgument, match="'r1' was entered already"):
                    turn.__enter__()
            with pytest.raises(InvalidArgument, match="'r1' was entered already"):
                turn.__enter__()
            with owner.turn("r2"):
                pass
        assert [(e.type, e.request_id) for e in j.replay("s")] == [
            ("turn_started", "r1"),
            ("message", "r1"),
            ("turn_result", "r1"),
            ("turn_started", "r2"),
            ("turn_result", "r2"),
        ]
        assert j.get_session("s").open_turn is None


def test_one_turn_at_a_time_holds_across_threads(tmp_path: Path) -> None:
    """Two threads make and run a turn of one owner at once: never two blocks run at
    once (the later `owner.turn()` replaces an unstarted turn, whose entry then raises,
    or raises itself while a block runs), and every turn started gets its result."""
    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        with j.own("s") as owner:
            lock = threading.Lock()
            inside = [0, 0]  # (blocks running now, the most at once)
            ran: list[str] = []
            for attempt in range(50):
                barrier = threading.Barrier(2)

                def take(name: str, barrier: Any = barrier) -> None:
                    barrier.wait()
                    try:
                        with owner.turn(name):
                            with lock:
                                inside[0] += 1
                                inside[1] = max(inside)
                            time.sleep(0.001)
                            with lock:
                                inside[0] -= 1
                        ran.append(name)
                    except InvalidArgument:
                        pass

                threads = [
                    threading.Thread(target=take, args=(f"t{attempt}-{i}",)) for i in range(2)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
            assert inside[1] == 1 and len(ran) >= 50
        events = list(j.replay("s"))
        started = [e.request_id for e in events if e.type == "turn_started"]
        results = [e.request_id for e in events if e.type == "turn_result"]
        assert started == results and sorted(started) == sorted(ran)
        assert j.get_session("s").open_turn is None


class _FailNextCommit(FileOps):
    """Fails the next commit batch once armed (fault point commit.batch_taken)."""

    armed = False

    def point(self, name: str, detail: object = None) -> None:
        if self.armed and name == "commit.batch_taken":
            self.armed = False
            raise OSError(5, "Input/output error (injected)")


def test_a_result_that_failed_to_be_recorded_is_recorded_before_the_next_turn(
    tmp_path: Path,
) -> None:
    """A turn whose result write failed (the store did not answer, a disk error) stayed
    open in the session, and the owner's next turn_started moved the open turn on: the
    earlier turn never got a result, and watchers never an OutcomeUnknown for it (found
    by a JetStream chaos trial: two turns so lost). The owner now records the result it
    meant before starting the next turn, when that turn is still the session's open one."""
    ops = _FailNextCommit()
    with Journal.open(tmp_path / "store", durability="os", file_ops=ops) as j:
        j.create_session("s")
        with j.own("s") as owner:
            with pytest.raises(StoreUnavailable) as failed, owner.turn(request_id="r1") as turn:
                turn.append([EventIn("m", b"one")])
                ops.armed = True  # (the result's write fails)
            assert not ops.armed, f"the fault point did not fire: {failed.value!r}"
            assert j.get_session("s").open_turn == "r1"
            with owner.turn(request_id="r2") as turn:
                turn.append([EventIn("m", b"two")])
        stored = [(e.type, e.request_id, e.data) for e in j.replay("s")]
    completed = json.dumps({"status": "completed"}, separators=(",", ":")).encode()
    assert [(t, r) for t, r, _ in stored] == [
        ("turn_started", "r1"),
        ("m", "r1"),
        ("turn_result", "r1"),
        ("turn_started", "r2"),
        ("m", "r2"),
        ("turn_result", "r2"),
    ]
    assert stored[2][2] == stored[5][2]
    assert json.loads(stored[2][2]) == json.loads(completed)


def test_awatch_tasks_judging_a_gone_owner_do_not_hold_the_event_loop(tmp_path: Path) -> None:
    """An owner gone mid-turn is checked twice, 5 ms apart, before `OutcomeUnknown`: that
    pause is a wait of the follower, not a sleep on the loop. Until 2026-12-03 each
    `awatch` task slept the 5 ms on its event loop: 1,000 of them held it 2.4 s in one
    stretch and ended after 5.3 s (found by an asyncio runtime trial). Checked without a
    clock (a first version asserted the loop's longest stall, which a loaded CI machine
    exceeded): no `time.sleep` runs on the loop's thread while the tasks judge."""
    with Journal.open(tmp_path / "store", durability="os") as j:
        j.create_session("s")
        owner = j.own("s")
        owner.turn("r-left").__enter__()
        owner.release()  # the turn stays unsettled and its owner is gone

        async def main() -> int:
            ended = 0

            async def watch() -> None:
                nonlocal ended
                with pytest.raises(OutcomeUnknown):
                    async for _ in j.awatch("s"):
                        pass
                ended += 1

            await asyncio.gather(*(watch() for _ in range(50)))
            return ended

        sleeps: list[object] = []

        def profile(frame: object, event: str, arg: object) -> None:
            if event == "c_call" and arg is time.sleep:
                sleeps.append(arg)

        sys.setprofile(profile)  # (this thread only: the loop's)
        try:
            ended = asyncio.run(main())
        finally:
            sys.setprofile(None)
        assert ended == 50
        assert not sleeps, f"{len(sleeps)} sleeps on the event loop's thread"  # before: 50


class _CountingEngine:
    """An engine that counts its page reads and owner checks."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.reads = 0
        self.owner_checks = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read(self, *args: Any) -> Any:
        self.reads += 1
        return self._inner.read(*args)

    def owner_alive(self, row: Any) -> Any:
        self.owner_checks += 1
        return self._inner.owner_alive(row)

    def owners_alive(self, rows: list[Any]) -> Any:
        self.owner_checks += len(rows)
        return self._inner.owners_alive(rows)


def _counting_engine(store: Path) -> _CountingEngine:
    from journal._local import open_local

    return _CountingEngine(
        open_local(str(store), (False, False, "os", 1 << 26, None, False), None, None, None)
    )


def test_followers_of_a_turn_in_progress_share_one_owner_check(tmp_path: Path) -> None:
    """While a live owner is mid-turn, its session's followers wait like idle ones: one
    owner check per turn every 100 ms for all of them, which wakes them when the owner is
    gone. Until 2026-12-03 each follower woke every 100 ms to read a page and check the
    owner itself (1,000 `awatch` tasks of one session: 94% of a core; 0.5% now)."""
    store = tmp_path / "store"
    with _owner_mid_turn(store) as child:
        engine = _counting_engine(store)
        with Journal.over(engine) as j:
            errors: list[BaseException] = []
            delivered: list[int] = []
            subs = [
                j.subscribe("s", lambda e: delivered.append(e.ordinal), on_error=errors.append)
                for _ in range(20)
            ]
            streams = [j.watch("s") for _ in range(10)]
            outcomes: list[BaseException] = []

            def follow(stream: Any) -> None:
                try:
                    for _ in stream:
                        pass
                except OutcomeUnknown as e:
                    outcomes.append(e)

            threads = [threading.Thread(target=follow, args=(s,)) for s in streams]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 30
            while len(delivered) < 20 * 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(delivered) == 20 * 2  # turn_started and the message, each
            # Every follower waits at the head now: the 10 watch threads and the delivery
            # thread wait, and no page was read for 0.3 s (30 s for liveness; a fixed 0.3 s
            # after the subscriptions' deliveries left a watch thread run late reading its
            # first pages in the second below).
            deadline = time.monotonic() + 30
            while engine.waiter.waiting < len(streams) + 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            reads, quiet_since = engine.reads, time.monotonic()
            while time.monotonic() - quiet_since < 0.3 and time.monotonic() < deadline:
                time.sleep(0.01)
                if engine.reads != reads:
                    reads, quiet_since = engine.reads, time.monotonic()
            reads, checks = engine.reads, engine.owner_checks
            time.sleep(1.0)
            # 30 followers for a second: 300 page reads and 300 owner checks before;
            # now no read and one check every 100 ms (at most 10 in a second; fewer on
            # a slow machine, never more).
            assert engine.reads - reads == 0
            assert engine.owner_checks - checks <= 11
            child.kill()
            child.wait()
            for thread in threads:
                thread.join(30)
            deadline = time.monotonic() + 30
            while len(errors) < 20 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(outcomes) == 10 and len(errors) == 20
            assert all(isinstance(e, OutcomeUnknown) for e in errors)
            assert {e.request_id for e in outcomes + errors} == {"r-killed"}  # type: ignore[attr-defined]
            for sub in subs:
                sub.close()


def test_a_closed_subscription_kept_by_its_caller_leaves_the_owner_checks(
    tmp_path: Path,
) -> None:
    """A subscription waiting for a live owner's turn is registered with the journal's
    owner checks; once closed it is not, although the caller still holds it (a
    `with journal.subscribe(...) as sub:` block keeps `sub` after it). Until 2026-12-03
    its pager, and with it the registration, lived as long as the Subscription object:
    the owner was checked every 100 ms, and the journal-owners thread never ended."""
    store = tmp_path / "store"
    with _owner_mid_turn(store), Journal.open(store) as j:
        delivered: list[int] = []
        errors: list[BaseException] = []
        sub = j.subscribe("s", lambda e: delivered.append(e.ordinal), on_error=errors.append)
        deadline = time.monotonic() + 30
        while not _owner_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert delivered == [1, 2] and _owner_threads()  # it waits for the owner
        sub.close()
        assert sub.wait(30)
        # Nothing registered: the thread ends 1 s later (before: never, while `sub`
        # was held).
        deadline = time.monotonic() + 30
        while _owner_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _owner_threads()
        assert not errors


_OWNS_MANY_MID_TURN = """
import os, sys
from journal import EventIn, Journal
from journal._local.files import FileOps

class ReleaseFails(FileOps):
    failing = False

    def point(self, name, detail=None):
        if self.failing and name == "commit.batch_taken":
            raise OSError(5, "injected: the release is not recorded")

ops = ReleaseFails()
j = Journal.open(sys.argv[1], durability="os", file_ops=ops)
owners = []
for i in range(int(sys.argv[2])):
    owner = j.own(f"s{i}")
    owner.turn(f"r{i}").__enter__().append([EventIn("message", b"{}")])
    owners.append(owner)
print("mid-turn", flush=True)
for line in sys.stdin:
    if line == "drop s1\\n":
        # The lease of s1 alone goes without a record (the release's commit fails): its
        # lock is free, the row still names this process mid-turn.
        ops.failing = True
        try:
            owners[1].release()
        except Exception:  # (StoreUnavailable)
            pass
        ops.failing = False
        print("dropped", flush=True)
    elif line == "exec\\n":
        os.execv("/bin/sleep", ["sleep", "60"])  # every lease's descriptor goes
"""


@contextlib.contextmanager
def _owner_of_many_mid_turn(store: Path, count: int) -> Iterator[subprocess.Popen[bytes]]:
    """A store with sessions s0, s1, ... whose owner, one child process, is mid-turn in
    each (killed at the end if still alive)."""
    with Journal.open(store, durability="os") as j:
        for i in range(count):
            j.create_session(f"s{i}")
    with _child_mid_turn(_OWNS_MANY_MID_TURN, str(store), str(count)) as child:
        yield child


@contextlib.contextmanager
def _child_mid_turn(script: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """A child process running `script` with `args`, once it printed "mid-turn" (killed
    at the end if still alive)."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=_child_env(),
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"mid-turn\n"
        yield child
    finally:
        reap(child)


class _Followers:
    """A `watch` thread for each of `count` sessions s0, s1, ...: what each raised."""

    def __init__(self, j: Journal, count: int) -> None:
        self.stop = threading.Event()
        self.ended: dict[str, BaseException | None] = {}
        self._threads = [
            threading.Thread(target=self._follow, args=(j, f"s{i}")) for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def _follow(self, j: Journal, session_id: str) -> None:
        try:
            for _event in j.watch(session_id, stop=self.stop):
                pass
            self.ended[session_id] = None
        except BaseException as e:
            self.ended[session_id] = e

    def wait_for(self, session_ids: set[str]) -> None:
        deadline = time.monotonic() + 30
        while not session_ids <= self.ended.keys() and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(30)


_OPENED: list[str] = []  # paths opened while `_counting_opens` counts
_COUNTING = threading.Event()


def _count_opens(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _COUNTING.is_set():
        _OPENED.append(os.fsdecode(args[0]) if isinstance(args[0], (str, bytes)) else "")


@contextlib.contextmanager
def _counting_opens() -> Iterator[list[str]]:
    """The paths this process opens meanwhile (an audit hook: it cannot be removed, so
    it is added once and counts only inside this block)."""
    if not getattr(_count_opens, "added", False):
        sys.addaudithook(_count_opens)
        _count_opens.added = True  # type: ignore[attr-defined]
    _OPENED.clear()
    _COUNTING.set()
    try:
        yield _OPENED
    finally:
        _COUNTING.clear()


def test_the_owner_checks_of_many_turns_of_one_owner_read_its_start_time_once_a_round(
    tmp_path: Path,
) -> None:
    """The journal's owner checks read the start time of a process that owns many of the
    unsettled turns followed once a round, not once per turn: until 2026-12-03 1,000
    sessions mid-turn in one owner process cost the observer 22-25% of a core in owner
    checks (10,000 reads of /proc/<pid>/stat and as many lock probes a second), 4% now.
    """
    with _five_followed_turns(tmp_path / "store") as (child, engine, followers, deadline):
        with _counting_opens() as opened:
            checks = engine.owner_checks
            while engine.owner_checks < checks + 5 * 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            checks = engine.owner_checks - checks
        assert checks >= 5 * 4 and not followers.ended
        reads = opened.count(f"/proc/{child.pid}/stat")
        # One a round (a round that began before the count, or ended after it, may
        # count too); before: one per check, 5 a round.
        assert reads <= checks // 5 + 2, (reads, checks)


@contextlib.contextmanager
def _five_followed_turns(
    store: Path,
) -> Iterator[tuple[subprocess.Popen[bytes], _CountingEngine, _Followers, float]]:
    """Sessions s0..s4 mid-turn in one child owner, a `watch` of each in a journal over a
    counting engine, once a few rounds of owner checks were made: (child, engine,
    followers, a deadline 30 s from the start)."""
    with _owner_of_many_mid_turn(store, 5) as child:
        engine = _counting_engine(store)
        j = Journal.over(engine)
        followers = _Followers(j, 5)
        try:
            deadline = time.monotonic() + 30
            while engine.owner_checks < 5 * 3 and time.monotonic() < deadline:
                time.sleep(0.01)  # (every follower registered, a few rounds made)
            yield child, engine, followers, deadline
        finally:
            followers.close()
            j.close()


def test_owner_checks_of_many_turns_of_one_owner_see_each_lease_go(tmp_path: Path) -> None:
    """The owner checks probe a lease's lock less often while its owner's pid lives (SPEC
    7.8): one lease let go of alone without a record still ends its followers, within
    about a second, and the others go on waiting; an owner that calls exec (every lease
    gone at once) ends them all at the next round."""
    with _five_followed_turns(tmp_path / "store") as (child, engine, followers, deadline):
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(b"drop s1\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"dropped\n"
        followers.wait_for({"s1"})
        assert isinstance(followers.ended.get("s1"), OutcomeUnknown)
        assert followers.ended.keys() == {"s1"}  # the others' owner lives
        checks = engine.owner_checks
        while engine.owner_checks < checks + 4 * 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert followers.ended.keys() == {"s1"}
        child.stdin.write(b"exec\n")
        child.stdin.flush()
        followers.wait_for({f"s{i}" for i in range(5)})
        assert child.poll() is None  # (the process lives on, as sleep)
        assert all(isinstance(e, OutcomeUnknown) for e in followers.ended.values())
        assert {e.request_id for e in followers.ended.values()} == {  # type: ignore[union-attr]
            f"r{i}" for i in range(5)
        }


def _exec_sleep(child: subprocess.Popen[bytes]) -> None:
    """Have the child owner call exec (every lease's descriptor closes; the pid and its
    start time stay), and wait until it runs `sleep`."""
    assert child.stdin is not None
    child.stdin.write(b"exec\n")
    child.stdin.flush()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{child.pid}/cmdline", "rb") as f:
            if f.read().startswith(b"sleep"):
                return
        time.sleep(0.01)
    raise AssertionError("the child did not exec sleep within 10 s")


def test_a_round_of_owner_checks_probes_one_lock_of_a_live_owner_and_all_when_one_is_free(
    tmp_path: Path,
) -> None:
    """`OwnerRounds` (the local engine's `owners_alive`) probes a live owner's locks
    probed held lately one a round, the least recently probed: a lease let go of alone is
    seen within as many rounds as the owner has leases followed (or `PROBE_S`), an exec
    (every lock free) in the next round. (Probes here are never due by time.)"""
    from journal._local.leases import OwnerRounds

    store = tmp_path / "store"
    with _owner_of_many_mid_turn(store, 5) as child:
        engine = _counting_engine(store)
        rows = [engine.session(f"s{i}") for i in range(5)]
        rounds = OwnerRounds(str(store), socket.gethostname(), probe_s=3600)
        assert rounds.check(rows) == [True] * 5
        with _counting_opens() as opened:
            assert rounds.check(rows) == [True] * 5
        # One probe of the owner's 5 locks (before: 5 a round, with a /proc read each).
        assert len([path for path in opened if "/locks/owner-" in path]) == 1, opened
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(b"drop s1\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"dropped\n"
        assert engine.session("s1") == rows[1]  # (no record: the row is unchanged)
        seen = [rounds.check(rows) for _ in range(5)]
        assert [True, False, True, True, True] in seen
        assert all(alive[0] and alive[2:] == [True] * 3 for alive in seen)
        del rows[1]  # (gone: no longer checked, as the journal's checks drop it)
        assert rounds.check(rows) == [True] * 4
        _exec_sleep(child)
        assert rounds.check(rows) == [False] * 4  # one probe found its lock free: all
        engine.close()


def test_rounds_of_two_journals_over_one_engine_keep_each_others_probes(
    tmp_path: Path,
) -> None:
    """Journals over one local engine share its `OwnerRounds`, each round called by its
    own journal's thread with its own followers' rows. Until 2026-12-03 a round kept only
    its own rows' probes, so with two journals following different turns of one owner
    each round probed every lock again (200 turns, one owner, one journal: 166 lock
    probes a second; two journals: 1,933, as many as with no memory at all)."""
    from journal._local.leases import OwnerRounds

    store = tmp_path / "store"
    with _owner_of_many_mid_turn(store, 6) as child:
        engine = _counting_engine(store)
        rows = [engine.session(f"s{i}") for i in range(6)]
        first, second = rows[:3], rows[3:]  # (the followed turns of two journals)
        rounds = OwnerRounds(str(store), socket.gethostname(), probe_s=3600)
        assert rounds.check(first) == [True] * 3
        assert rounds.check(second) == [True] * 3
        with _counting_opens() as opened:
            assert rounds.check(first) == [True] * 3
            assert rounds.check(second) == [True] * 3
        # One probe of the owner's locks a round (before: 3 a round, none remembered).
        assert len([path for path in opened if "/locks/owner-" in path]) == 2, opened
        # What a round finds still holds for the other journal's next round: a lease let
        # go of alone is seen, and an exec ends every turn at once.
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(b"drop s1\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"dropped\n"
        seen = [rounds.check(first) for _ in range(3)]
        assert [True, False, True] in seen
        del first[1]
        _exec_sleep(child)
        assert rounds.check(second) == [False] * 3
        assert rounds.check(first) == [False] * 2
        engine.close()


def _unused_pid() -> int:
    """A pid no process has now (as `/proc` shows a live process it hides: `hidepid=2`
    hides other users' processes)."""
    with open("/proc/sys/kernel/pid_max") as f:
        pid = int(f.read()) - 1
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


def test_an_owner_whose_pid_proc_does_not_show_lives_while_its_lock_is_held(
    tmp_path: Path,
) -> None:
    """A pid that `/proc` does not show is not proof its process is gone: with `/proc`
    mounted `hidepid=2`, an observer of another user (a store shared with a group) saw
    no owner alive, and until 2026-12-03 raised `OutcomeUnknown` for every turn in
    progress. The lease's lock, still held, decides; once it is free, the owner is gone.
    (The hidden owner is played by the row of a live owner with a pid nobody has.)"""
    import msgspec

    from journal._local.leases import PROCESS_BOOT, OwnerRounds, lock_path, owner_alive

    store = tmp_path / "store"
    host = socket.gethostname()
    with _owner_of_many_mid_turn(store, 2) as child:
        engine = _counting_engine(store)
        rows = [engine.session(f"s{i}") for i in range(2)]
        hidden = [msgspec.structs.replace(row, owner_pid=_unused_pid()) for row in rows]
        locks = [lock_path(str(store), row.session_id) for row in rows]
        pairs = zip(hidden, locks, strict=True)
        assert [owner_alive(row, host, PROCESS_BOOT, lock) for row, lock in pairs] == [True, True]
        rounds = OwnerRounds(str(store), host, probe_s=3600)
        assert rounds.check(hidden) == [True, True]
        assert rounds.check(hidden) == [True, True]
        # Without its lock to ask, the pid alone says gone (as before).
        assert owner_alive(hidden[0], host, PROCESS_BOOT) is False
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(b"drop s1\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"dropped\n"
        assert owner_alive(hidden[1], host, PROCESS_BOOT, locks[1]) is False
        assert rounds.check(hidden) == [True, False]
        child.kill()
        child.wait()
        assert rounds.check(hidden) == [False, False]
        assert owner_alive(hidden[0], host, PROCESS_BOOT, locks[0]) is False
        assert rounds.check(rows) == [False, False]  # (the real pid: gone, as before)
        engine.close()


def _owner_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "journal-owners"]


@contextlib.contextmanager
def _owner_mid_turn(store: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A store with session "s" whose owner, a child process, is mid-turn (killed at the
    end if still alive)."""
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
    with _child_mid_turn(_MID_TURN, str(store)) as child:
        yield child
