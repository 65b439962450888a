"""A turn's request id runs once (SPEC.md section 7.8): a retry of a turn that has ended,
in this owner, a later one or another process, gets the outcome recorded (`TurnSettled`)
instead of running again; a turn whose start failed may be started again; a result
retention dropped is forgotten."""

from __future__ import annotations

import gc
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from unittest.mock import ANY

import msgspec
import pytest
from _commit_interrupts import SignalAtNextCommit, raising_on_sigusr1
from test_archives import _craft, _session

from journal import EventIn, Journal, Owner, RetentionPolicy, StoreUnavailable, TurnSettled
from journal._local.files import FileOps
from journal.archive import ArchiveEvent
from journal.session_cursors import SessionCursors
from journal.turn_results import KeptRead, KeptTurnResults
from journal.turn_writers import TurnWriter

ROOT = Path(__file__).resolve().parent.parent
UNKNOWN_CODE = "WATCH_OUTCOME_UNKNOWN"


def _turn_events(j: Journal) -> list[tuple[str, str | None]]:
    return [(e.type, e.request_id) for e in j.replay("s") if e.type.startswith("turn_")]


def test_a_retried_request_id_gets_the_recorded_outcome_and_does_not_run_again(
    tmp_path: Path,
) -> None:
    """A turn started with the request id of a turn that had ended ran again, with a
    second turn_started and result for one request id (found by a runtime-author trial):
    an idempotent retry must not run the prompt twice."""
    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        with j.own("s") as owner:
            with owner.turn("done") as turn:
                turn.append([EventIn("m", b"{}")])
            with pytest.raises(ValueError), owner.turn("failed"):
                raise ValueError("tool crashed")
            with owner.turn("cancelled") as turn:
                turn.cancel()
            with pytest.raises(TurnSettled) as info:
                owner.turn("done")
            with owner.turn("next"):
                pass  # (the refusal left the owner's one-turn slot free)
        before = _turn_events(j)
        results = {e.request_id: e for e in j.replay("s") if e.type == "turn_result"}
        error = info.value
        assert (error.code, error.status) == ("TURN_SETTLED", "ALREADY_EXISTS")
        assert error.request_id == "done"
        assert error.result == {"status": "completed"}
        assert error.cursor == results["done"].cursor
        assert "new request id" in str(error)
        copy = pickle.loads(pickle.dumps(error))
        assert (type(copy), copy.result, copy.cursor) == (TurnSettled, error.result, error.cursor)
        with j.own("s") as owner:  # (a later owner reads them from the history)
            for request_id, result in [
                ("failed", {"status": "failed", "error": {"code": "ValueError", "message": ANY}}),
                ("cancelled", {"status": "cancelled"}),
                ("next", {"status": "completed"}),
            ]:
                with pytest.raises(TurnSettled, match=f"turn {request_id!r}") as info:
                    owner.turn(request_id)
                assert info.value.result == result
                assert info.value.cursor == results[request_id].cursor
        assert _turn_events(j) == before


_KILLED_MID_TURN = """
import sys
from journal import Journal
with Journal.open(sys.argv[1], durability="fsync") as j:
    with j.own("s") as owner, owner.turn("done"):
        pass
    owner = j.own("s")
    turn = owner.turn("r-killed").__enter__()
    print("mid-turn", flush=True)
    sys.stdin.readline()  # killed here
"""


def test_a_runtime_restarted_after_a_kill_cannot_run_the_killed_turn_again(
    tmp_path: Path,
) -> None:
    """The owner process is SIGKILLed mid-turn; a new process owns the session (which
    records the turn's outcome as unknown) and retries the request id from its queue: it
    gets TurnSettled with WATCH_OUTCOME_UNKNOWN (the prompt may have executed), and the
    turn the killed process completed before is refused too."""
    store = tmp_path / "store"
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_TURN, str(store)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "mid-turn"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with Journal.open(store, durability="os") as j, j.own("s") as owner:
        assert owner.recovered_turn == "r-killed"
        with pytest.raises(TurnSettled, match="WATCH_OUTCOME_UNKNOWN") as info:
            owner.turn("r-killed")
        assert info.value.result["error"] == {"code": UNKNOWN_CODE, "message": ANY}
        with pytest.raises(TurnSettled):
            owner.turn("done")
        with owner.turn("r-retried"):
            pass
        assert _turn_events(j) == [
            ("turn_started", "done"),
            ("turn_result", "done"),
            ("turn_started", "r-killed"),
            ("turn_result", "r-killed"),
            ("turn_started", "r-retried"),
            ("turn_result", "r-retried"),
        ]


class _FailCommits(FileOps):
    """Fails the next `count` commit batches (fault point commit.batch_taken)."""

    count = 0

    def point(self, name: str, detail: object = None) -> None:
        if self.count and name == "commit.batch_taken":
            self.count -= 1
            raise OSError(5, "Input/output error (injected)")


def test_a_turn_whose_result_write_failed_is_not_run_again(tmp_path: Path) -> None:
    """The block ran, its result's write failed: the owner remembers the result, so a
    retry of the request id is refused with it (not recorded yet: no cursor), and the
    owner's next turn records it first."""
    ops = _FailCommits()
    with Journal.open(tmp_path, durability="os", file_ops=ops) as j:
        j.create_session("s")
        with j.own("s") as owner:
            with pytest.raises(StoreUnavailable), owner.turn("r1"):
                ops.count = 1
            with pytest.raises(TurnSettled, match="not recorded yet") as info:
                owner.turn("r1")
            assert (info.value.result, info.value.cursor) == ({"status": "completed"}, None)
            with owner.turn("r2"):
                pass
            with pytest.raises(TurnSettled) as info:
                owner.turn("r1")
            assert info.value.cursor is not None
        assert _turn_events(j) == [
            ("turn_started", "r1"),
            ("turn_result", "r1"),
            ("turn_started", "r2"),
            ("turn_result", "r2"),
        ]


def test_a_turn_ended_by_another_thread_while_one_was_made_does_not_run_again(
    tmp_path: Path,
) -> None:
    """`owner.turn(id)` checked that `id` had not ended before it took the owner's turn
    slot: a thread whose call had checked, when another thread's turn of the same id then
    ran and ended, entered a turn that ran again (a second `turn_started`). Entering a
    turn checks again once it holds the slot. The first thread is held right after its
    check by a trace function (no code of the journal patched)."""
    checked, go = threading.Event(), threading.Event()
    check_new = TurnWriter.check_new.__code__

    def hold_after_check(frame: FrameType, event: str, _arg: object) -> object:
        if event == "call" and frame.f_code is check_new:
            return hold_after_check
        if event == "return" and frame.f_code is check_new:
            checked.set()
            assert go.wait(10)
        return None

    outcome: list[BaseException | str] = []

    def late(owner: Owner) -> None:
        sys.settrace(hold_after_check)
        try:
            turn = owner.turn("r1")
        finally:
            sys.settrace(None)
        try:
            with turn:
                outcome.append("ran")
        except BaseException as error:
            outcome.append(error)

    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        with j.own("s") as owner:
            worker = threading.Thread(target=late, args=(owner,))
            worker.start()
            assert checked.wait(10)
            with owner.turn("r1"):
                pass
            go.set()
            worker.join(10)
            assert len(outcome) == 1 and isinstance(outcome[0], TurnSettled), outcome
        assert _turn_events(j) == [("turn_started", "r1"), ("turn_result", "r1")]


class _CountedReads(FileOps):
    def __init__(self) -> None:
        self.read = 0

    def pread_into(self, fd: int, buffer: bytearray | memoryview, offset: int) -> int:
        got = super().pread_into(fd, buffer, offset)
        self.read += got
        return got


def test_an_owner_taken_per_prompt_reads_only_the_history_since_the_last_owners_read(
    tmp_path: Path,
) -> None:
    """A worker pool that takes the owner lease for each prompt: every owner's first
    turn read the session's whole retained history to find its ended turns (41 ms an
    own-and-turn at 100,000 events, against 1 ms on an empty session). The journal keeps
    the last read, and the next owner reads the events after it: here under a tenth of
    the 6 MB history per owner."""
    ops = _CountedReads()
    with Journal.open(tmp_path, durability="os", file_ops=ops) as j:
        j.create_session("s")
        for _ in range(12):
            j.append("s", [EventIn("message", b"x" * 500)] * 1000)
        read = []
        for prompt in range(4):
            before = ops.read
            with j.own("s") as owner, owner.turn(f"r{prompt}"):
                pass
            read.append(ops.read - before)
        assert read[0] > 6_000_000
        assert max(read[1:]) < 600_000, read
        with j.own("s") as owner:
            for prompt in range(4):
                with pytest.raises(TurnSettled):
                    owner.turn(f"r{prompt}")


def test_a_turn_another_process_ended_between_two_owners_here_is_known(tmp_path: Path) -> None:
    """The next owner of this journal reads what came after its last read, so a turn
    another process's owner ran meanwhile is not run again."""
    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        with j.own("s") as owner, owner.turn("here"):
            pass
        subprocess.run(
            [sys.executable, "-c", _OTHER_OWNER, str(tmp_path)],
            check=True,
            cwd=ROOT,
            timeout=60,
        )
        with j.own("s") as owner:
            for request_id in ("here", "there"):
                with pytest.raises(TurnSettled):
                    owner.turn(request_id)


_OTHER_OWNER = """
import sys
from journal import Journal
with Journal.open(sys.argv[1], durability="os") as j:
    with j.own("s") as owner, owner.turn("there"):
        pass
"""


def test_the_results_kept_between_owners_are_bounded() -> None:
    """At most `limit` results in all: the least recently read sessions' go first, and a
    read larger than the bound is not kept."""
    kept = KeptTurnResults(limit=10)

    def read(count: int) -> KeptRead:
        return KeptRead((1, 1, 0), "c", {str(i): (b"{}", "c") for i in range(count)}, count)

    kept.put("a", read(4))
    kept.put("b", read(4))
    kept.put("a", read(5))  # (read again: the most recent now)
    kept.put("c", read(4))
    assert (kept.get("a"), kept.get("b"), kept.get("c")) == (read(5), None, read(4))
    kept.put("d", read(11))
    assert kept.get("d") is None and kept.get("a") == read(5)


def test_the_reads_kept_between_owners_are_bounded_when_they_found_no_result() -> None:
    """A session's first owner reads no result (its first turn has not run yet): such
    reads counted for nothing, so a worker pool that ran one prompt on each of a million
    sessions kept a million reads (about 1.7 KB a session held, measured through
    `own()`). At most `limit` sessions' reads are kept too."""
    kept = KeptTurnResults(limit=10)
    empty = KeptRead((1, 1, 0), "c", {}, 1)
    for i in range(11):
        kept.put(f"s{i}", empty)
    assert kept.get("s0") is None
    assert all(kept.get(f"s{i}") == empty for i in range(1, 11))


def _cut_off_r2_after_the_journal_read_it(j: Journal, store: Path) -> None:
    """Turns r1 and r2 of session "s", the journal's last read of its results ending at
    r2's result; then r2's frames cut off (one torn) and the hole accepted by
    `verify(fix=True)`."""
    j.create_session("s")
    with j.own("s") as owner, owner.turn("r1"):
        pass
    (active,) = sorted((store / "segments").glob("*.seg"))
    kept_end = len(active.read_bytes().rstrip(b"\0"))
    with j.own("s") as owner, owner.turn("r2"):
        pass
    with j.own("s") as owner, pytest.raises(TurnSettled):
        owner.turn("r2")  # (the journal's read now ends at r2's result)
    with open(active, "r+b") as f:
        f.truncate(kept_end + 10)
    assert j.verify(fix=True).fixed


def test_an_owner_after_an_accepted_hole_past_the_last_read_reads_the_whole_history(
    tmp_path: Path,
) -> None:
    """The journal's last read of the session ended past what `verify(fix=True)` kept
    of its log (committed frames cut off: SPEC 9): the next owner's read from its cursor
    raised `CursorFuture` out of `owner.turn()`, for every request id, until the session
    grew past it again. It reads the whole history then, as for a cursor refused
    otherwise: r2's turn, cut off, runs; r1's stays refused."""
    with Journal.open(tmp_path, durability="os") as j:
        _cut_off_r2_after_the_journal_read_it(j, tmp_path)
        assert [e.request_id for e in j.replay("s")] == ["r1", "r1"]
        with j.own("s") as owner:
            with owner.turn("r2"):
                pass
            with pytest.raises(TurnSettled):
                owner.turn("r1")


def test_an_owner_after_an_accepted_hole_rewritten_past_the_last_read_reads_it_whole(
    tmp_path: Path,
) -> None:
    """As above, but another process's owner wrote again past the ordinal the journal's
    last read ended at before the next owner here: the row's marker is unchanged, so
    only the kept cursor's check (its event's time, SPEC 5) tells that its event is not
    the one read. The next owner reads the whole history: r2's turn, cut off, runs, and
    the turn written over its ordinals stays refused. (Passed before: a guard.)"""
    with Journal.open(tmp_path, durability="os") as j:
        _cut_off_r2_after_the_journal_read_it(j, tmp_path)  # (its read ended at ordinal 4)
        subprocess.run(
            [sys.executable, "-c", _OTHER_OWNER, str(tmp_path)], check=True, cwd=ROOT, timeout=60
        )
        j.append("s", [EventIn("m", b"{}")])
        assert [e.request_id for e in j.replay("s")] == ["r1", "r1", "there", "there", None]
        with j.own("s") as owner:
            with pytest.raises(TurnSettled):
                owner.turn("there")
            with owner.turn("r2"):
                pass


def test_the_results_kept_between_owners_are_bounded_in_bytes(tmp_path: Path) -> None:
    """A failed turn's result holds its exception's message, of any length: the reads
    kept between owners were bounded by their count of results only (16,384, "about
    5 MB"), so 200 KB messages kept 12 MB for 60 sessions (3.3 GB at the bound)."""
    with Journal.open(tmp_path, durability="os") as j:
        for i in range(60):
            j.create_session(f"s{i}")
            with j.own(f"s{i}") as owner, pytest.raises(ValueError), owner.turn("r"):
                raise ValueError("x" * 200_000)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(60):
                with j.own(f"s{i}") as owner, pytest.raises(TurnSettled):
                    owner.turn("r")  # (the next owner of this journal reads after it)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert held < 6_000_000, held


def test_the_results_kept_between_owners_count_their_request_ids(tmp_path: Path) -> None:
    """A request id may be 64 KiB, and only the results' data counted against the 4 MiB
    bound: a worker pool that took the lease for each prompt kept every long request id
    of its sessions long after they were evicted (38 KB a session with 32 KiB ids in a
    soak, up to 1 GiB at the bound of 16,384 results); 12.6 MB here. (Small segments: the
    active segment's index holds its turn records, ids and all, until it is sealed.)"""
    policy = RetentionPolicy(session_retention_ms=1)
    with Journal.open(tmp_path, durability="os", segment_bytes=1 << 20, retention=policy) as j:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(192):
                j.create_session(f"s{i}")
                for request_id in (f"{i:03d}".ljust(64 << 10, "r"), "short"):  # (2nd reads 1st)
                    with j.own(f"s{i}") as owner, owner.turn(request_id):
                        pass
                j.resolve_session(f"s{i}")
            j.apply_retention(now_ms=2**62)
            assert j.stats().sessions == {}
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert held < 6_000_000, held


class _TrimWhileRead(FileOps):
    """Once armed, trims the session to a 1 MB byte window from another process when
    2 MB were read (its first page of 1 MB read, its next pages not)."""

    def __init__(self, store: Path) -> None:
        super().__init__()
        self.store = store
        self.armed = False
        self.read = 0

    def pread_into(self, fd: int, buffer: bytearray | memoryview, offset: int) -> int:
        got = super().pread_into(fd, buffer, offset)
        if self.armed:
            self.read += got
            if self.read > 2_000_000:
                self.armed = False
                subprocess.run(
                    [sys.executable, "-c", _TRIM, str(self.store)], check=True, cwd=ROOT, timeout=60
                )
        return got


_TRIM = """
import sys
import msgspec
from journal import Journal
with Journal.open(sys.argv[1]) as j:
    j.change_retention_policy(lambda p: msgspec.structs.replace(p, max_history_bytes=1_000_000))
    assert j.apply_retention().trimmed_sessions == ["s"]
"""


def _history_with_a_turn(path: Path, ops: FileOps, history_bytes: int) -> None:
    """Session "s" in a store without a history window: `history_bytes` of events of 10
    KB, appended 10 a batch, after which the turn "late" ran."""
    policy = RetentionPolicy(max_history_bytes=None)
    with Journal.open(path, durability="os", retention=policy, file_ops=ops) as j:
        j.create_session("s")
        for _ in range(history_bytes // 100_000):
            j.append("s", [EventIn("message", b"x" * 10_000)] * 10)
        with j.own("s") as owner, owner.turn("late"):
            pass


def test_a_trim_during_an_owners_first_read_does_not_fail_its_turn(tmp_path: Path) -> None:
    """Another process's retention pass trimmed the session while the first owner read
    its 10 MB history: the read's next page raised `CursorExpired` out of
    `owner.turn()`, which takes no cursor. It reads the history again from its new
    beginning."""
    ops = _TrimWhileRead(tmp_path)
    _history_with_a_turn(tmp_path, ops, 10_000_000)
    # (a new journal object: nothing kept of a read before)
    with Journal.open(tmp_path, durability="os", file_ops=ops) as j:
        ops.armed = True
        with j.own("s") as owner:
            with owner.turn("r"):
                pass
            assert not ops.armed, "the history was not trimmed during the read"
            with pytest.raises(TurnSettled):
                owner.turn("late")


class _TrimAtEachPass(FileOps):
    """Once given its journal, trims the session (in this process) at the first large
    read of each pass over its history: `windows` are the byte windows of the trims, one
    per pass, each 2 MB shorter, so each passes the read's next page."""

    def __init__(self, windows: list[int]) -> None:
        super().__init__()
        self.windows = windows
        self.journal: Journal | None = None
        self.next_offset = 0  # (a pass reads its first page from the new beginning)

    def pread_into(self, fd: int, buffer: bytearray | memoryview, offset: int) -> int:
        got = super().pread_into(fd, buffer, offset)
        j, self.journal = self.journal, None  # (not again from the trim's own reads)
        if j is not None and self.windows and offset >= self.next_offset and got > 500_000:
            window = self.windows.pop(0)
            j.change_retention_policy(
                lambda p: msgspec.structs.replace(p, max_history_bytes=window)
            )
            assert j.apply_retention().trimmed_sessions == ["s"]
            self.next_offset = offset + 2_000_000
        self.journal = j
        return got


def test_trims_passing_an_owners_first_read_many_times_do_not_fail_its_turn(
    tmp_path: Path,
) -> None:
    """Each trim that passed the read made it start again from the history's new
    beginning, at most 5 times: the sixth raised `CursorExpired` out of `owner.turn()`,
    which takes no cursor (retention trimming faster than the read). It goes on from the
    new beginning instead, keeping what it found: it always ends."""
    ops = _TrimAtEachPass([16_000_000 - 2_000_000 * k for k in range(1, 7)])
    _history_with_a_turn(tmp_path, ops, 16_000_000)
    with Journal.open(tmp_path, durability="os", file_ops=ops) as j:
        ops.journal = j  # (a new journal object: nothing kept of a read before)
        with j.own("s") as owner:
            with owner.turn("r"):
                pass
            assert not ops.windows, "the history was not trimmed six times during the read"
            with pytest.raises(TurnSettled):
                owner.turn("late")
        ops.journal = None
        with j.own("s") as owner, pytest.raises(TurnSettled):
            owner.turn("r")  # (the next owner reads the trimmed history whole)


def test_a_held_owner_holds_at_most_4_mib_of_result_data(tmp_path: Path) -> None:
    """A held owner kept the data of every result it found or recorded, bounded by their
    count only (64 plus twice what its read found): failed turns with messages of 1 MB
    held 8 MB for 8 turns, for as long as it was held. It holds the most recent results'
    data within 4 MiB; an older one's is read again when its request id is retried:
    refused with the recorded result, not run again."""
    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        with j.own("s") as owner:
            tracemalloc.start()
            try:
                for i in range(8):
                    with pytest.raises(ValueError), owner.turn(f"r{i}"):
                        raise ValueError(str(i) * 1_000_000)
                gc.collect()
                # (the results' data the owner holds, made in turns.py and
                # turn_writers.py: the local engine's active segment holds its own copy
                # of each turn record)
                made = [
                    tracemalloc.Filter(True, str(ROOT / "journal" / name))
                    for name in ("turns.py", "turn_writers.py")
                ]
                held = sum(
                    stat.size for stat in tracemalloc.take_snapshot().filter_traces(made).traces
                )
            finally:
                tracemalloc.stop()
            for i in range(8):
                with pytest.raises(TurnSettled) as info:
                    owner.turn(f"r{i}")
                assert info.value.result["error"]["message"] == str(i) * 1_000_000
            with owner.turn("next"):
                pass
        assert _turn_events(j).count(("turn_started", "r0")) == 1
    assert held < 5_000_000, held


class _Interrupted(Exception):
    """What the test's SIGUSR1 handler raises (a Ctrl+C's KeyboardInterrupt, tamed)."""


def test_a_turn_whose_start_failed_may_be_started_again(tmp_path: Path) -> None:
    """Its block never ran, so its request id is not used up: whether the start did not
    commit or committed with the caller getting an error (a Ctrl+C held until the commit
    was done), the retry runs the turn and records one result for it, not a failed one
    first (which would make the request id's history say it failed)."""

    failing = _FailCommits()
    with Journal.open(tmp_path / "lost", durability="os", file_ops=failing) as j:
        j.create_session("s")
        with j.own("s") as owner:
            failing.count = 1
            with pytest.raises(StoreUnavailable), owner.turn("r1"):
                pytest.fail("the block ran though its start raised")
            with owner.turn("r1") as turn:
                turn.append([EventIn("m", b"{}")])
        assert _turn_events(j) == [("turn_started", "r1"), ("turn_result", "r1")]
    signalling = SignalAtNextCommit()
    with (
        raising_on_sigusr1(_Interrupted("interrupted as the turn started")),
        Journal.open(tmp_path / "committed", durability="os", file_ops=signalling) as j,
    ):
        j.create_session("s")
        with j.own("s") as owner:
            signalling.armed = True
            with pytest.raises(_Interrupted), owner.turn("r1"):
                pytest.fail("the block ran though its start raised")
            assert not signalling.armed and j.get_session("s").open_turn == "r1"
            with owner.turn("r1") as turn:
                turn.append([EventIn("m", b"{}")])
        events = _turn_events(j)
        results = [json.loads(e.data) for e in j.replay("s") if e.type == "turn_result"]
    assert events == [("turn_started", "r1"), ("turn_started", "r1"), ("turn_result", "r1")]
    assert results == [{"status": "completed"}]


def test_a_turn_whose_result_committed_with_a_lost_reply_is_not_run_again(
    tmp_path: Path,
) -> None:
    """The result's write committed but its caller got an error (a Ctrl+C held until the
    commit was done; on JetStream a lost reply): the owner's next turn found the turn
    ended and recorded nothing, and then forgot it, since the owner had read the history
    before the result and never saw it recorded, so the request id ran a second time
    though its result was readable. The owner now reads the history again."""

    ops = SignalAtNextCommit()
    with (
        raising_on_sigusr1(_Interrupted("interrupted as the result was written")),
        Journal.open(tmp_path, durability="os", file_ops=ops) as j,
    ):
        j.create_session("s")
        with j.own("s") as owner:
            with pytest.raises(_Interrupted), owner.turn("r1"):
                ops.armed = True
            assert not ops.armed and j.get_session("s").open_turn is None
            with pytest.raises(TurnSettled, match="not recorded yet"):
                owner.turn("r1")
            with owner.turn("r2"):
                pass
            with pytest.raises(TurnSettled) as info:
                owner.turn("r1")
            assert info.value.result == {"status": "completed"}
            assert info.value.cursor == next(
                e.cursor for e in j.replay("s") if e.type == "turn_result"
            )
        events = _turn_events(j)
    assert events == [
        ("turn_started", "r1"),
        ("turn_result", "r1"),
        ("turn_started", "r2"),
        ("turn_result", "r2"),
    ]


def test_a_request_id_whose_result_was_compacted_away_runs_again(tmp_path: Path) -> None:
    """Request ids are remembered while their turn's result is readable (after the
    session's latest snapshot or trim): one whose result a snapshot covers starts a new
    turn, as a retry of an idempotency key trimmed away appends again."""
    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        with j.own("s") as owner:
            with owner.turn("old"):
                pass
            with owner.turn("latest"):
                pass
        old_result = next(e for e in j.replay("s") if e.request_id == "old" and e.ordinal > 1)
        j.compact_session("s", old_result.ordinal, b"snap")
        with j.own("s") as owner:
            with pytest.raises(TurnSettled):
                owner.turn("latest")
            with owner.turn("old"):
                pass
        assert _turn_events(j) == [
            ("turn_started", "latest"),
            ("turn_result", "latest"),
            ("turn_started", "old"),
            ("turn_result", "old"),
        ]


def test_an_imported_sessions_ended_turns_are_remembered(tmp_path: Path) -> None:
    """An archive brings its turns' results along; one whose data is not a JSON object
    (an archive made elsewhere: turn events are the journal's own) is still an ended
    turn, reported as unreadable, never a ValueError from owner.turn()."""
    archive = _craft(
        [
            (
                _session("s", 1, 4),
                None,
                [
                    ArchiveEvent(1, "turn_started", 1001, "r1", b"{}"),
                    ArchiveEvent(2, "turn_result", 1002, "r1", b'{"status":"completed"}'),
                    ArchiveEvent(3, "turn_started", 1003, "r2", b"{}"),
                    ArchiveEvent(4, "turn_result", 1004, "r2", b"not json"),
                ],
            )
        ]
    )
    with Journal.open(tmp_path, durability="os") as j:
        j.import_sessions(io.BytesIO(archive))
        with j.own("s") as owner:
            with pytest.raises(TurnSettled) as info:
                owner.turn("r1")
            assert info.value.result == {"status": "completed"}
            with pytest.raises(TurnSettled, match="unreadable") as info:
                owner.turn("r2")
            assert info.value.result == {"status": "unreadable", "data": "not json"}
            with owner.turn("r3"):
                pass


def _kept_by_turns(run: Callable[[int], None], count: int) -> int:
    """How many blocks allocated under journal/turns.py or journal/turn_writers.py are
    still alive after `run(count)` turns (tracemalloc)."""
    gc.collect()
    tracemalloc.start(8)
    try:
        run(count)
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    kept = snapshot.filter_traces(
        [
            tracemalloc.Filter(True, f"*journal/{name}", all_frames=True)
            for name in ("turns.py", "turn_writers.py")
        ]
    )
    return sum(stat.count for stat in kept.statistics("filename"))


def test_an_owner_held_for_many_turns_keeps_only_the_retained_results(tmp_path: Path) -> None:
    """An owner held for good (a runtime's, for months) kept the result of every turn it
    ever ran, by request id, also those retention trimmed away (about 300 bytes a turn,
    found by a soak: 10 MB after 27,000 turns of one session): what it keeps follows the
    retained history now (it reads it again once it keeps twice what it last read)."""
    with Journal.open(tmp_path, durability="os", segment_bytes=16 << 10) as j:
        j.create_session("s", max_history_bytes=8 << 10)
        with j.own("s") as owner:
            done = [0]

            def run(count: int) -> None:
                for _ in range(count):
                    with owner.turn(request_id=f"r{done[0]}") as turn:
                        turn.append([EventIn(type="message", data=b"x" * 200)])
                    done[0] += 1

            run(100)  # (the history read once, the window filled)
            few = _kept_by_turns(run, 100)
            many = _kept_by_turns(run, 1000)
        assert j.get_session("s").first_ordinal > 3 * 1000  # trimmed: a few turns kept
    assert many < 2 * few + 200, (few, many)


def test_an_owners_read_of_the_history_signs_no_cursor_per_event(tmp_path: Path) -> None:
    """The read that finds the ended turns keeps the cursor of the last event it read:
    it took every event's cursor (`Event.cursor`, an HMAC each, computed on first use),
    so an owner's first turn on a session of 100,000 events took 425 ms where a replay
    takes 45 ms (48 ms before the reads were kept between owners). One cursor a read,
    and those of the results it found."""
    signs = 0
    sign = SessionCursors.cursor.__code__

    def count(frame: FrameType, event: str, _arg: object) -> None:
        nonlocal signs
        if event == "call" and frame.f_code is sign:
            signs += 1

    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        with j.own("s") as owner, owner.turn("r1"):
            pass
        j.append("s", [EventIn("message", b"x")] * 2_000)
    # (a new journal object: nothing kept of a read before, so the whole history is read)
    with Journal.open(tmp_path, durability="os") as j, j.own("s") as owner:
        sys.setprofile(count)
        try:
            with pytest.raises(TurnSettled):
                owner.turn("r1")
        finally:
            sys.setprofile(None)
    assert signs < 10, signs
