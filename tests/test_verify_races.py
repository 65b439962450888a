"""`verify()` while a compaction swaps a segment (SPEC 8, "Segment file changes across
processes"; SPEC 9).

A compaction swap deletes the segment's sidecar, renames its copy into place and writes
the new sidecar, all under the segment-files lock. A verify run that began after the
rename and read the sidecar before it was written saw the same segment files before and
after (sidecars are not among them), so it reported "sidecar missing or bad" on a sound
store (found as a flaky verify beside a writer's expiry thread, 3 runs of 20): a run that
finds a problem is now repeated under the lock before the problem is reported. And the
swap's transaction, which forgets the tombstones of the creation records it dropped,
committed after the swap released the lock: a run between compared them with a rebuild
of the new file. The swap keeps the lock until its batch has committed now."""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import lmdb
import pytest
from _cli_runs import run_cli
from _procs_retention import Child

from journal import (
    CursorExpired,
    EventIn,
    Journal,
    LifecycleEventType,
    RetentionPolicy,
    SessionNotFound,
    StoreUnavailable,
    VerifyReport,
)
from journal._local.files import FileOps

_POLICY = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)
# Ended sessions are evicted by the passes the tests run with a clock two hours ahead.
_AN_HOUR = RetentionPolicy(max_history_bytes=None, session_retention_ms=3_600_000)


def _evict_three_beside_a_kept_session(j: Journal) -> None:
    """Three sessions ended and evicted (a pass with the clock two hours ahead) in a
    segment that "kept"'s events seal: compacting it drops their creation records."""
    for i in range(3):
        j.create_session(f"gone{i}")
        j.resolve_session(f"gone{i}")
    j.create_session("kept")
    for _ in range(2):
        j.append("kept", [EventIn("m", b"k" * 3000)])  # (seals their segment)
    later = time.time_ns() // 1_000_000 + 7_200_000
    assert len(j.apply_retention(now_ms=later).evicted_sessions) == 3


class VerifyInTheSwap(FileOps):
    """Runs `verify()` on another thread once the compacted copy is in place and its
    sidecar is not written yet, and waits for it up to `wait_s` (the swap holds the
    segment-files lock meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.journal: Journal | None = None
        self.reports: list[VerifyReport] = []
        self.finished_in_the_swap: bool | None = None

    def point(self, name: str, detail: object = None) -> None:
        if name != "compaction.replaced" or self.journal is None:
            return
        journal, self.journal = self.journal, None
        thread = threading.Thread(target=lambda: self.reports.append(journal.verify()))
        thread.start()
        thread.join(1.0)
        self.finished_in_the_swap = not thread.is_alive()
        self.thread = thread


def test_a_verify_between_a_swaps_rename_and_its_sidecar_reports_nothing(
    tmp_path: Path,
) -> None:
    ops = VerifyInTheSwap()
    with Journal.open(
        tmp_path / "store", durability="os", segment_bytes=4096, retention=_POLICY, file_ops=ops
    ) as j:
        j.create_session("kept")
        j.create_session("gone")
        for n in range(12):
            j.append("kept" if n % 3 == 0 else "gone", [EventIn("m", b"x" * 600)])
        j.cancel_session("gone")
        j.compact_session("gone", 6, b"")
        ops.journal = j
        assert j.compact(0.0).segments_rewritten
        ops.thread.join(10)
        (report,) = ops.reports
        assert report.ok, report.problems
        # (It may finish inside the swap: the swap's mark excuses the missing sidecar
        # since 2026-12-06, SPEC 9; a run that finds a problem there waits for the lock.)
        assert ops.finished_in_the_swap is not None


class VerifyBeforeTheSwapsCommit(FileOps):
    """Runs `verify()` on another thread when the batch of a compaction swap, its copy in
    place, is about to commit the view's changes (the tombstones it forgot), and waits
    for it up to 1 s."""

    def __init__(self) -> None:
        super().__init__()
        self.journal: Journal | None = None
        self.swapped = False
        self.reports: list[VerifyReport] = []
        self.finished_before_the_commit: bool | None = None
        self.thread: threading.Thread | None = None

    def point(self, name: str, detail: object = None) -> None:
        if name == "compaction.replaced" and self.journal is not None:
            self.swapped = True
        elif name == "commit.view_commit" and self.swapped and self.journal is not None:
            journal, self.journal = self.journal, None
            self.thread = threading.Thread(target=lambda: self.reports.append(journal.verify()))
            self.thread.start()
            self.thread.join(1.0)
            self.finished_before_the_commit = not self.thread.is_alive()


def test_a_verify_between_a_swap_and_its_commit_reports_nothing(tmp_path: Path) -> None:
    """The swap replaced the segment (without the creation records of evicted sessions)
    and forgot their tombstones in its transaction, which commits after it released the
    segment-files lock: a verify run between saw the new files and the old tombstones,
    and reported them, also from its run under that lock. The lock is kept now until the
    batch has committed."""
    ops = VerifyBeforeTheSwapsCommit()
    with Journal.open(
        tmp_path / "store", durability="os", segment_bytes=4096, retention=_AN_HOUR, file_ops=ops
    ) as j:
        _evict_three_beside_a_kept_session(j)
        ops.journal = j
        assert j.compact(0.0).segments_rewritten
        assert ops.thread is not None
        ops.thread.join(10)
        (report,) = ops.reports
        assert report.ok, report.problems
        assert ops.finished_before_the_commit is False  # (it waited for the lock)


def _waits_for_a_flock(pid: int) -> bool:
    """Whether process `pid` is blocked taking a flock (a `->` line of /proc/locks)."""
    with open("/proc/locks") as f:  # ("3: -> FLOCK  ADVISORY  WRITE <pid> <inode> ...")
        return any(line.split()[1:3] + line.split()[5:6] == ["->", "FLOCK", str(pid)] for line in f)


class FailTheSwapsBatchBesideAnOpen(FileOps):
    """Lets the batch of a compaction swap carry a record (an expiry: it waits before
    planning until the session with `ttl_ms` is due), fails it after its frame was
    written, and before its undo takes the writer lock again opens the store writable in
    another process, waiting until that one waits for the segment-files lock (its
    catch-up takes it under the writer lock) or, when nobody holds that, has opened."""

    def __init__(self, store: Path) -> None:
        super().__init__()
        self.store = store
        self.due_s: float | None = None
        self.swap_next = self.swapped = False
        self.opener: subprocess.Popen[bytes] | None = None

    def point(self, name: str, detail: object = None) -> None:
        if self.due_s is None:
            return
        if name == "compaction.rewritten":
            self.swap_next = True
        elif name == "commit.batch_taken" and self.swap_next:
            self.swap_next = False
            time.sleep(max(0.0, self.due_s - time.time()) + 0.05)
        elif name == "compaction.replaced":
            self.swapped = True
        elif name == "commit.view_commit" and self.swapped:
            raise OSError(errno.EIO, "injected")
        elif name == "commit.refused" and self.swapped:
            self.due_s = None
            code = f"from journal import Journal; Journal.open({str(self.store)!r}).close()"
            self.opener = subprocess.Popen([sys.executable, "-c", code])
            give_up = time.monotonic() + 10
            while not _waits_for_a_flock(self.opener.pid) and time.monotonic() < give_up:
                if self.opener.poll() is not None:
                    break
                time.sleep(0.01)


def test_a_swaps_failed_batch_releases_the_files_lock_before_its_undo(tmp_path: Path) -> None:
    """A swap's batch that failed after its frame was written takes the writer lock again
    to cut the frame. It kept the segment-files lock until then: another writer process
    whose open held the writer lock and waited for the segment-files lock (its catch-up
    finishing interrupted work) deadlocked with it. The lock is kept until the
    transaction is over, and no longer."""
    store = tmp_path / "store"
    ops = FailTheSwapsBatchBesideAnOpen(store)
    with Journal.open(
        store, durability="os", segment_bytes=4096, retention=_AN_HOUR, file_ops=ops
    ) as j:
        _evict_three_beside_a_kept_session(j)
        j.create_session("ttl", ttl_ms=500)
        ops.due_s = time.time() + 0.5
        errors: list[BaseException] = []

        def compact() -> None:
            try:
                j.compact(0.0)
            except BaseException as e:
                errors.append(e)

        thread = threading.Thread(target=compact, daemon=True)
        thread.start()
        thread.join(10)
        deadlocked = thread.is_alive()
        assert ops.opener is not None
        if deadlocked:
            ops.opener.kill()  # (its writer lock goes with it: the compaction ends)
            thread.join(20)
        assert not deadlocked
        assert ops.opener.wait(20) == 0
        (error,) = errors
        assert "injected" in str(error)
        j.append("kept", [EventIn("m", b"after")])  # (the writer goes on)


class FullMapAfterTheSwap(FileOps):
    """The view's map is full when a swap's batch commits, once, after the copy was
    renamed into place: the engine grows the map and tries the batch again."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.swapped = 0

    def point(self, name: str, detail: object = None) -> None:
        if name == "compaction.replaced":
            self.swapped += 1
        elif name == "commit.view_commit" and self.armed and self.swapped:
            self.armed = False
            raise lmdb.MapFullError("injected")


def test_a_swap_tried_again_after_a_full_map_finishes_its_view_part(tmp_path: Path) -> None:
    # The retried swap found its own copy in place of the source it expected, took it for
    # another writer's and gave up: the compaction reported nothing rewritten, and the
    # view kept the tombstones, ids and pins of the sessions whose creation records the
    # copy had dropped ("tombstones table differs from the log (3 entries, a rebuilt view
    # has 0 ...)") until a later compaction rewrote that segment again (a review).
    ops = FullMapAfterTheSwap()
    with Journal.open(
        tmp_path / "store", durability="os", segment_bytes=4096, retention=_AN_HOUR, file_ops=ops
    ) as j:
        _evict_three_beside_a_kept_session(j)
        ops.armed = True
        report = j.compact(0.0)
        assert not ops.armed, "the map never filled in a swap's batch"
        assert ops.swapped == 1  # (renamed once: the try again found it in place)
        assert report.segments_rewritten == ["00000000000000000001.seg.zst"]
        assert j.verify().problems == []
        assert [e.data[:1] for e in j.replay("kept")] == [b"k", b"k"]


class FailTheViewPartOfASwap(FileOps):
    """Fails the batch of a compaction swap (an I/O error as its transaction commits)
    once, after its copy was renamed into place: the swap's commit point was passed."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = self.swapped = False

    def point(self, name: str, detail: object = None) -> None:
        if name == "compaction.replaced" and self.armed:
            self.swapped = True
        elif name == "commit.view_commit" and self.swapped:
            self.armed = self.swapped = False
            raise OSError(errno.EIO, "injected")


_STALE = "tombstones table differs from the log (3 entries, a rebuilt view has 0"


def _fail_a_swap_then_compact(
    j: Journal, ops: FailTheViewPartOfASwap, stale: str, dead_share: float = 0.5
) -> None:
    """`compact(dead_share)` whose swap's batch fails after the rename leaves `stale` in
    what `verify()` reports; the next `compact()` rewrites nothing and clears it."""
    ops.armed = True
    with pytest.raises(StoreUnavailable, match="injected") as failed:
        j.compact(dead_share)
    # (the rename was made: the error does not say that nothing was committed)
    assert "nothing of this call was committed" not in str(failed.value)
    assert "what this call finished stays done" in str(failed.value)
    assert any(stale in p.what for p in j.verify().problems)
    assert j.compact().segments_rewritten == []  # (the file is the copy already)
    assert j.verify().problems == []


def test_a_swap_whose_batch_failed_after_its_rename_is_finished_by_the_next_compact(
    tmp_path: Path,
) -> None:
    # The caller got the error, and the view kept the tombstones (with the ids and the
    # eviction pins) of the sessions whose creation records the copy dropped: `verify()`
    # reported them, and a later `compact()` left the compressed segment (no dead frame
    # in it) alone, so they stayed until a `compact(0.0)` rewrote it. Now the next
    # compaction that passes the segment does the swap's view part.
    store = tmp_path / "store"
    ops = FailTheViewPartOfASwap()
    with Journal.open(
        store, durability="os", segment_bytes=4096, retention=_AN_HOUR, file_ops=ops
    ) as j:
        _evict_three_beside_a_kept_session(j)
        _fail_a_swap_then_compact(j, ops, _STALE)
        assert [e.data[:1] for e in j.replay("kept")] == [b"k", b"k"]
        sessions = sorted(s.session_id for s in j.list_sessions())
    shutil.rmtree(store / "index")
    with Journal.open(store) as j:
        assert sorted(s.session_id for s in j.list_sessions()) == sessions == ["kept"]
        assert j.verify().problems == []


def _kill_in_a_swap(store: Path, child_args: list[str]) -> None:
    """Run `compact()` in a child process and SIGKILL it in its first swap."""
    child = Child(child_args[0], str(store), *child_args[1:])
    try:
        assert child.next_line() == "ready"
        child.send("go")
        assert child.next_line() == "paused"  # the copy is in place; the view unchanged
    finally:
        child.kill()


_KILLED_IN_A_SWAP = pytest.mark.parametrize(
    "child_args",
    [
        ["compact_paused", "compaction.replaced"],
        ["compact_paused_before_the_swap_commits"],
    ],
)


@_KILLED_IN_A_SWAP
def test_a_crash_after_a_swaps_rename_is_finished_by_the_next_writable_open(
    tmp_path: Path, child_args: list[str]
) -> None:
    """Killed after the rename (its new sidecar not yet written, or written), before the
    view's transaction: until 2026-12-06 only the next compaction did the view's part,
    and `verify()` reported the stale tables after every open until then (DATA_LOSS,
    exit 7, from `journal verify`: a crash trial killing `journal compact`). Until
    2026-12-06 a read-only `verify()` still reported them (or the missing sidecar)
    until a writable open: it compares the view as that open leaves it."""
    store = tmp_path / "store"
    with Journal.open(store, durability="os", segment_bytes=4096, retention=_AN_HOUR) as j:
        _evict_three_beside_a_kept_session(j)
    _kill_in_a_swap(store, child_args)
    done = run_cli(store, "--format", "json", "verify")  # (read-only)
    assert (done.returncode, done.stderr) == (0, ""), done.stdout
    assert '"problems":0' in done.stdout
    with Journal.open(store, readonly=True) as j:
        assert j.verify().problems == []
        assert [s.session_id for s in j.list_sessions()] == ["kept"]
        assert [e.data[:1] for e in j.replay("kept")] == [b"k", b"k"]
        with pytest.raises(SessionNotFound):
            j.get_session("gone0")
    assert list((store / "segments").glob("*.swap.*"))  # (left to a writable open)
    with Journal.open(store, durability="os", retention=_AN_HOUR) as j:
        assert j.verify().problems == []
        assert not list((store / "segments").glob("*.swap.*"))  # (the swap's mark went)
        assert j.compact().segments_rewritten == []
        assert j.verify().problems == []
        assert [e.data[:1] for e in j.replay("kept")] == [b"k", b"k"]
        with pytest.raises(SessionNotFound):
            j.get_session("gone0")


@_KILLED_IN_A_SWAP
def test_a_read_only_journal_reads_and_verifies_a_store_a_killed_swap_dropped_feed_records_of(
    tmp_path: Path, child_args: list[str]
) -> None:
    """The copy dropped a live session's earlier transitions: until the next writable
    open prunes their lifecycle feed entries, a read-only journal reading the store's
    view still delivers those changes (they happened) to a cursor before them, which is
    expired after that open; its `verify()` reported "lifecycle feed differs from the
    log (0 missing, 5 extra or stale)" until 2026-12-06."""
    store = tmp_path / "store"
    with Journal.open(store, durability="os", segment_bytes=4096, retention=_AN_HOUR) as j:
        j.create_session("a")
        with j.watch_sessions() as snapshot:
            cursor = next(snapshot).cursor  # (the CREATED of its snapshot)
        for _ in range(3):
            j.suspend_session("a")
            j.resume_session("a")
        for _ in range(2):
            j.append("a", [EventIn("m", b"k" * 3000)])  # (seals their segment)
    _kill_in_a_swap(store, child_args)
    changes = [LifecycleEventType.SUSPENDED, LifecycleEventType.RESUMED] * 3
    with Journal.open(store, readonly=True) as j:
        assert j.verify().problems == []
        assert [e.data[:1] for e in j.replay("a")] == [b"k", b"k"]
        with j.watch_sessions(cursor) as stream:
            assert [next(stream).event_type for _ in changes] == changes
    with Journal.open(store, durability="os", retention=_AN_HOUR) as j:
        assert j.verify().problems == []
        assert [e.data[:1] for e in j.replay("a")] == [b"k", b"k"]
        with pytest.raises(CursorExpired), j.watch_sessions(cursor) as stream:
            next(stream)


def test_a_writable_open_removes_only_the_swap_marks_it_names(tmp_path: Path) -> None:
    """A file of `segments/` that merely ends like a mark (`.swap.<pid>` of a process
    that is gone) is not the store's: the open leaves it (a review: any such name was
    removed)."""
    store = tmp_path / "store"
    with Journal.open(store, durability="os", retention=_AN_HOUR) as j:
        j.create_session("s")
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(gone.stdout)
    names = [
        f"notes.swap.{pid}",
        f"{'9' * 19}.seg.zst.swap.{pid}x",
        f"-{'0' * 19}1.seg.zst.swap.{pid}",
    ]
    mark = f"{0:020d}.seg.zst.swap.{pid}"  # (a mark of a segment the store lacks: removed)
    for name in [*names, mark]:
        (store / "segments" / name).write_bytes(b"")
    with Journal.open(store, durability="os", retention=_AN_HOUR) as j:
        assert j.verify().problems == []
    left = sorted(p.name for p in (store / "segments").glob("*swap*"))
    assert left == sorted(names)


def test_a_failed_swap_that_dropped_only_feed_records_is_finished_by_the_next_compact(
    tmp_path: Path,
) -> None:
    # The dropped frames hold a live session's earlier transitions (their lifecycle feed
    # entries go with them), and no creation record: the next compaction looked for
    # tombstones only, found none and left the feed as it was, so `verify()` reported
    # the stale entries after every later `compact()` until a `compact(0.0)`.
    store = tmp_path / "store"
    ops = FailTheViewPartOfASwap()
    with Journal.open(
        store, durability="os", segment_bytes=4096, retention=_AN_HOUR, file_ops=ops
    ) as j:
        j.create_session("a")
        for _ in range(3):
            j.suspend_session("a")
            j.resume_session("a")
        for _ in range(2):
            j.append("a", [EventIn("m", b"k" * 3000)])  # (seals their segment)
        _fail_a_swap_then_compact(j, ops, "lifecycle feed differs from the log", 0.0)
        assert [e.data[:1] for e in j.replay("a")] == [b"k", b"k"]
    shutil.rmtree(store / "index")
    with Journal.open(store) as j:
        assert j.verify().problems == []
