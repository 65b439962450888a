"""Compaction: rewriting sealed segments without their dead frames, zstd-compressed.

A frame is live when any record in it is: an event of a live session at or above its
first retained ordinal, or a pinned record (see `index`). Liveness only ever goes from
live to dead, so the rewrite can be computed from a read snapshot without the writer lock:
a frame dead then is dead forever, and a frame copied while live that dies meanwhile is
merely reclaimed later. Only the swap (rename into place, new sidecar, forgetting
tombstones whose creation record went away) happens under the writer lock, after checking
that the source file is still the one that was read.

Kept frames keep their positions, ordinals and uncompressed offsets, so the view's
locations stay valid. A reader whose snapshot still points at a dropped frame finds no
block for it and retries with a fresh snapshot, which then says the history expired.

The active segment is never rewritten, so `compact()` first seals it (`SealActive`) when
it holds at least `SEAL_DEAD_BYTES` dead (half of `segment_bytes` if that is less), and
at least `dead_share` of its bytes: the writer rotates as at `segment_bytes`, and the
segment is then compacted like any sealed one. Below that, the new segment file is not
worth it (SPEC 8, "Sealing the active segment").
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from typing import Final, NamedTuple, Protocol, TypeVar

import lmdb
import msgspec

from ..engine import ApplyRetention, Operation, Progress
from ..errors import JournalCorrupt, StoreUnavailable, WriteOutcomeUnknown
from ..models import CompactionReport
from .compression import compress_segment
from .expiry import wait_while_held
from .failures import unavailable
from .files import fsync_dir
from .frames import SEGMENT_HEADER_SIZE, SEGMENT_SUFFIX, FrameInfo, segment_name, sidecar_name
from .log import SegmentLog
from .segments import summarize_segment
from .sidecar import SegmentSummary, read_summary, write_summary
from .view import Head, View

__all__ = [
    "DEFAULT_DEAD_SHARE",
    "SEAL_DEAD_BYTES",
    "Compactions",
    "SealActive",
    "SwapSegment",
    "Unfinished",
    "compact_store",
    "finish_swaps",
    "live_frames",
    "seal_active",
    "swap_marks",
    "swap_segment",
    "unfinished_swaps",
    "unpin_segments",
]

DEFAULT_DEAD_SHARE: Final = 0.5
# The dead bytes the active segment must hold for `compact()` to seal it (or half of
# `segment_bytes`, for smaller segments, which seal by themselves as often): a seal starts
# a segment file (born with its zeros, kept while anything in it lives), so one for a few
# dead frames would, run by a periodic `journal compact`, leave a trail of small files.
SEAL_DEAD_BYTES: Final = 1 << 20

ResultT = TypeVar("ResultT")
_log: Final = logging.getLogger("journal")


class Submit(Protocol):
    """The engine's `submit`: commits one operation, returns its result."""

    def __call__(self, operation: Operation[ResultT], /) -> ResultT: ...


class SwapSegment(Operation[bool], frozen=True):
    """Put a compacted copy (`temporary`) in place of sealed segment `base`, if the file
    there is still `source` (name, inode, size); planned under the writer lock. Without
    `temporary`, the copy is in place already and only the view's part is done."""

    base: int
    temporary: str
    summary: SegmentSummary
    source: tuple[str, int, int]
    original_last_position: int
    # (inode, size) of the copy: a batch tried again (the view's map grew) finds it in
    # place, renamed by the try whose transaction did not commit.
    copy: tuple[int, int] = (0, 0)


class SealActive(Operation[int | None], frozen=True):
    """Seal the active segment `base`, if it still is the active one and holds a frame
    (planned under the writer lock); the result is the bytes its file took, or None.
    Found sealed already, the result is the bytes its file takes now (None if gone)."""

    base: int


def seal_active(txn: lmdb.Transaction, view: View, log: SegmentLog, seal: SealActive) -> int | None:
    """Rotate the writer past the active segment, as a full one is (caller holds the
    writer lock, after the catch-up), and move the view's head to the new segment.

    A crash or a failed commit after the rotation leaves the head at the end of the sealed
    segment, as one inside a rotating append does: the next catch-up moves it."""
    writer = log.writer
    if writer.base_position != seal.base:
        # Sealed since `compact()` looked at it: by an earlier try of this very batch (its
        # commit failed after the rotation and was tried again: a full map), or by another
        # writer (a full segment). Either way it was not counted as sealed before.
        found = _file_identity(log.directory, seal.base)
        return None if found is None else found[2]  # (None: deleted as dead since)
    if not writer.frame_count:
        return None  # empty
    size = os.fstat(writer.fileno()).st_size
    # Not compressed whole (with `compress_sealed`) only to be compressed again without
    # its dead frames by the compaction that follows (SPEC 8, "Sealing the active segment").
    log.rotate(compress=False)
    log.ops.point("compaction.sealed", seal.base)
    head = view.head(txn)
    assert head is not None, "a writer's commit runs after its catch-up"
    # (A batch that also appends overwrites this head with its frame's end.)
    view.put_head(
        txn,
        Head(
            log.writer.base_position,
            SEGMENT_HEADER_SIZE,
            log.writer.next_position,
            head.lifecycle_position,
        ),
    )
    return size


class _ActiveSegment(NamedTuple):
    """The active segment as the seal's decision found it: the bytes of its committed
    frames (its zeros ahead not counted), how many of them were dead (None: too few
    frames to look), and the bytes its file took if it was sealed (else None)."""

    frame_bytes: int = 0
    dead_bytes: int | None = None
    sealed: int | None = None


def _seal_if_worth_it(
    log: SegmentLog, view: View, submit: Submit, dead_share: float
) -> _ActiveSegment:
    """Seal the active segment when compacting it would give enough back (module doc),
    decided without the lock by a scan of its frames up to the view's head, made only
    when they could hold enough dead (liveness read after it: dead frames stay dead).
    The dead share is of the frames' bytes, as a sealed segment's is (frame granularity:
    a frame is dead once every record in it is)."""
    enough = min(SEAL_DEAD_BYTES, log.segment_bytes // 2)
    with view.begin() as txn:
        head = view.head(txn)
    del txn  # (no read transaction object outlives its transaction: SPEC 7)
    if head is None:
        return _ActiveSegment()
    if head.end_offset - SEGMENT_HEADER_SIZE < enough:
        return _ActiveSegment(head.end_offset - SEGMENT_HEADER_SIZE)
    try:
        summary = summarize_segment(
            log.directory, head.segment, log.ops, committed_end=head.end_offset
        )
    except FileNotFoundError:
        return _ActiveSegment()  # sealed and compressed meanwhile by another writer
    with view.begin() as txn:
        _, live_bytes, total = live_frames(txn, view, summary)
    del txn
    dead = total - live_bytes
    if dead < enough or dead < dead_share * total:
        return _ActiveSegment(total, dead)
    try:
        return _ActiveSegment(total, dead, submit(SealActive(head.segment)))
    except StoreUnavailable as e:
        raise _no_room_to_commit(e, log.directory, head.segment, summary, seal=True) from e


def live_frames(
    txn: lmdb.Transaction, view: View, summary: SegmentSummary
) -> tuple[set[int], int, int]:
    """(offsets of live frames, live bytes, total bytes) of a sealed segment."""
    frames = summary.frames
    ends = [offset for offset, _, _ in frames[1:]] + [summary.data_end]
    live: set[int] = set()
    for incarnation, runs in summary.sessions.items():
        row = view.row_by_incarnation(txn, incarnation)
        if row is None:
            continue
        for _, last_ordinal, offset in runs:
            if last_ordinal >= row.first_ordinal:
                live.add(offset)
    for offset, first_position, count in frames:
        if offset in live:
            continue
        if any(view.pins_between(txn, first_position, first_position + count - 1)):
            live.add(offset)
    total = live_bytes = 0
    for (offset, _, _), end in zip(frames, ends, strict=True):
        total += end - offset
        if offset in live:
            live_bytes += end - offset
    return live, live_bytes, total


def _file_identity(directory: str, base: int) -> tuple[str, int, int] | None:
    """(name, inode, size) of the file currently holding a segment, or None."""
    for compressed in (False, True):
        name = segment_name(base, compressed=compressed)
        try:
            st = os.stat(os.path.join(directory, name))
        except FileNotFoundError:
            continue
        return name, st.st_ino, st.st_size
    return None


def swap_segment(txn: lmdb.Transaction, view: View, log: SegmentLog, swap: SwapSegment) -> bool:
    """Put a compacted copy in place of its source (caller holds the writer lock).

    Returns False (and discards the copy) when the source changed since it was read."""
    directory = log.directory
    base = swap.base
    survives = _held_by(swap.summary)
    with log.files_lock(keep=True):  # (kept until the transaction committed)
        found = _file_identity(directory, base)
        final_name = segment_name(base, compressed=True)
        # Renamed into place by an earlier try of this batch, whose transaction did not
        # commit (a full map: the batch is tried again): the view's part is still to do.
        again = swap.copy != (0, 0) and found == (final_name, *swap.copy)
        if found != swap.source and not again:
            # Deleted (dead) or replaced by another writer since it was read.
            if swap.temporary:
                with contextlib.suppress(FileNotFoundError):
                    log.ops.unlink(swap.temporary)
            return False
        # The lifecycle feed entries of dropped records go (the feed's floor rises, and
        # is recorded in the log before the records leave it: SPEC 7.7).
        pruned = view.prune_feed(txn, base, swap.original_last_position, survives)
        if pruned:
            log.record_feed_floor(pruned)
        if not again:
            log.sync_committed()  # (the records that made the dropped frames dead first)
            # The old sidecar goes first: if the new one cannot be written after the swap,
            # the sidecar is missing (readers scan, the next catch-up writes it), never stale.
            # Its deletion is synced before the rename, and the rename before the plain
            # file's deletion: POSIX keeps no order between a directory's unsynced changes,
            # and a power cut that kept the later one alone would leave a stale sidecar
            # beside the copy, or no segment at all (the copy still a temporary file).
            try:
                log.ops.unlink(os.path.join(directory, sidecar_name(base)))
            except FileNotFoundError:
                pass
            else:
                fsync_dir(directory, log.ops)
            log.ops.replace(swap.temporary, os.path.join(directory, final_name))
            log.ops.point("compaction.replaced", base)
        if swap.temporary:  # (none: only the view's part is left, `_finish_swap`)
            if swap.source[0] == segment_name(base):
                fsync_dir(directory, log.ops)
                with contextlib.suppress(FileNotFoundError):
                    log.ops.unlink(os.path.join(directory, segment_name(base)))
            fsync_dir(directory, log.ops)
            write_summary(directory, swap.summary, log.ops, log.permissions)
    # Eviction tombstones whose creation record was dropped: the eviction record need
    # no longer survive, since nothing can resurrect the session.
    for incarnation, position in view.tombstones_between(txn, base, swap.original_last_position):
        if not survives(incarnation):
            view.forget_tombstone(txn, incarnation, position)
    return True


def _held_by(summary: SegmentSummary) -> Callable[[int], bool]:
    """Whether a position lies in one of the frames a segment's file holds."""
    kept = summary.frames  # (offset, first position, count), in position order
    starts = [first for _, first, _ in kept]

    def held(position: int) -> bool:
        at = bisect_right(starts, position) - 1
        return at >= 0 and position < starts[at] + kept[at][2]

    return held


def _finish_swap(
    log: SegmentLog,
    view: View,
    submit: Submit,
    summary: SegmentSummary,
    source: tuple[str, int, int],
    next_base: int | None,
) -> None:
    """Do the view's part of a swap whose rename (its commit point) was made but whose
    batch did not commit (it failed, or the process died), if the view still holds the
    tombstones of creation records the file no longer has, or lifecycle feed entries of
    records it no longer has (SPEC 8, "Compaction"): a compressed segment that is not
    rewritten again would otherwise keep them, and the pins of their eviction records,
    for good."""
    base = summary.base_position
    # (The segment's positions end where the next one's begin: a compaction may have
    # dropped its last frames, whose creation records' tombstones are the ones to go.)
    last_position = summary.last_position if next_base is None else next_base - 1
    held = _held_by(summary)
    with view.begin() as txn:
        tombstones = view.tombstones_between(txn, base, last_position)
        # (a dropped frame may hold feed records only: a live session's earlier
        # transitions, whose entries go with them)
        stale_feed = view.feed_goes(txn, base, last_position, held)
    del txn  # (no read transaction object outlives its transaction: SPEC 7)
    if not stale_feed and all(held(incarnation) for incarnation, _ in tombstones):
        return
    # The file in place is the copy: the swap finds it as a batch tried again does.
    submit(SwapSegment(base, "", summary, source, last_position, source[1:]))


# `<base>.seg.zst.swap.<pid>`: a swap of `base` by process `pid` may be between its rename
# (its commit point) and its transaction's commit. A writer's open finishes the view's
# part of such a swap once `pid` is gone (`finish_swaps`).
_SWAP_MARK: Final = ".swap."


def _mark_swap(log: SegmentLog, base: int) -> str:
    """Leave a durable mark of a swap of `base` about to be submitted; its path."""
    path = os.path.join(
        log.directory, f"{segment_name(base, compressed=True)}{_SWAP_MARK}{os.getpid()}"
    )
    os.close(log.permissions.create_file(path, os.O_WRONLY))
    fsync_dir(log.directory, log.ops)
    return path


def _marked(log: SegmentLog, alive: Callable[[int], bool]) -> Iterator[tuple[str, int]]:
    """(name, base) of the swap marks of processes that are gone (only names this module
    makes: no other file of the directory is taken for one)."""
    for name in sorted(os.listdir(log.directory)):
        head, mark, pid = name.rpartition(_SWAP_MARK)
        base = int(head[:20]) if head[:20].isdigit() else -1
        if not mark or not pid.isdigit() or base < 0 or head != segment_name(base, compressed=True):
            continue
        if not alive(int(pid)):
            yield name, base


def swap_marks(log: SegmentLog) -> set[int]:
    """The bases of the segments that swap marks name, live processes' too: a swap in
    progress, or one whose batch failed after its rename (an OS error writing the new
    sidecar: the mark stays), whose missing sidecar the next commit's catch-up writes."""
    return {base for _, base in _marked(log, lambda _pid: False)}


def _left_to_finish(
    log: SegmentLog, base: int, every: list[int]
) -> tuple[SegmentSummary, tuple[str, int, int], int | None] | None:
    """(summary, file identity, base of the next segment) of a marked swap's segment when
    its compressed file alone is in place (a plain one beside it is deleted first, by a
    writer's catch-up); None when there is no such file. `every`: the segments' bases."""
    source = _file_identity(log.directory, base)
    if source is None or not source[0].endswith(".zst"):
        return None
    later = bisect_right(every, base)
    next_base = every[later] if later < len(every) else None
    summary = read_summary(log.directory, base) or summarize_segment(log.directory, base, log.ops)
    return summary, source, next_base


def finish_swaps(log: SegmentLog, view: View, submit: Submit, alive: Callable[[int], bool]) -> None:
    """Do the view's part of the swaps that processes which are gone left marked (killed
    after a swap's rename, before its transaction committed: the view still held the
    tombstones, ids and eviction pins of the creation records the copy dropped, and the
    feed entries of its dropped records, and `verify()` reported them after every open
    until the next compaction passed the segment; found by a crash trial), then remove
    their marks. A mark of a swap that was never renamed, or committed, finds nothing to do."""
    every: list[int] | None = None  # (the segments' bases, listed once a mark is found)
    for name, base in _marked(log, alive):
        every = log.bases() if every is None else every
        try:
            left = _left_to_finish(log, base, every)
            if left is not None:
                _finish_swap(log, view, submit, *left)
        except FileNotFoundError:
            pass  # (deleted meanwhile by another writer's retention pass)
        except JournalCorrupt as damage:  # (`verify` reports it; the mark stays)
            name_of = segment_name(base, compressed=True)
            _log.warning("an interrupted compaction of %s is left: %s", name_of, damage)
            continue
        with contextlib.suppress(FileNotFoundError):
            log.ops.unlink(os.path.join(log.directory, name))


class Unfinished(NamedTuple):
    """A marked swap of a process that is gone, whose view's part the next writable open
    does (`finish_swaps`): the positions of its segment, and which of them the file in
    place still holds. Until then the view keeps the tombstones (with their ids and the
    pins of their eviction records) of the incarnations in the range the file no longer
    holds, and the lifecycle feed entries of the positions it no longer holds; `verify`
    compares the view as that part will leave it."""

    first_position: int
    last_position: int
    held: Callable[[int], bool]


def unfinished_swaps(
    log: SegmentLog, alive: Callable[[int], bool]
) -> tuple[set[int], list[Unfinished]]:
    """The bases of the segments of the swaps that processes which are gone left marked
    (a plain file may still be beside the copy, and the new sidecar still unwritten: a
    writer's catch-up finishes those), and the swaps among them whose view's part is
    left (their copy alone in place; damage is `verify`'s to report, and passed over)."""
    bases: set[int] = set()
    left: list[Unfinished] = []
    every: list[int] | None = None
    for _, base in _marked(log, alive):
        every = log.bases() if every is None else every
        bases.add(base)
        try:
            found = _left_to_finish(log, base, every)
        except (FileNotFoundError, JournalCorrupt):
            continue
        if found is not None:
            summary, _, next_base = found
            last = summary.last_position if next_base is None else next_base - 1
            left.append(Unfinished(base, last, _held_by(summary)))
    return bases, left


def sealed_bytes(log: SegmentLog) -> int:
    """Bytes of the sealed segments and their sidecars (the active one is preallocated;
    the directory's other files, such as `feed-floor`, are not segments)."""
    total = 0
    for base in log.bases()[:-1]:
        for name in (segment_name(base), segment_name(base, compressed=True), sidecar_name(base)):
            with contextlib.suppress(FileNotFoundError):
                total += os.path.getsize(os.path.join(log.directory, name))
    return total


def compact_store(
    log: SegmentLog, view: View, submit: Submit, dead_share: float, progress: Progress | None
) -> CompactionReport:
    """Run a retention pass, then rewrite every sealed segment worth it (see module doc)."""
    started = time.perf_counter()
    bytes_before = sealed_bytes(log)
    retention = submit(ApplyRetention(None))
    deleted = list(retention.deleted_segments)
    trimmed, evicted = list(retention.trimmed_sessions), list(retention.evicted_sessions)
    damage: JournalCorrupt | None = None
    try:
        active = _seal_if_worth_it(log, view, submit, dead_share)
    except JournalCorrupt as found:
        if not found.segment.endswith(SEGMENT_SUFFIX):
            raise  # (the view's damage: every swap would meet it)
        damage, active = (
            found,
            _ActiveSegment(),
        )  # the active segment's: the sealed ones are still done
    sealed = active.sealed
    if sealed is not None:
        # Counted from here on as the sealed segments are; a pass deletes it if all dead.
        bytes_before += sealed
        again = submit(ApplyRetention(None))
        deleted += again.deleted_segments
        # (a session the first pass trimmed and this one evicted is reported evicted only)
        gone = set(again.evicted_sessions)
        trimmed = [s for s in trimmed if s not in gone]
        trimmed = list(dict.fromkeys(trimmed + again.trimmed_sessions))
        evicted += again.evicted_sessions
    rewritten: list[str] = []
    copied = 0
    every = log.bases()
    bases = every[:-1]
    for done, base in enumerate(bases, start=1):
        try:
            copied += _compact_segment(log, view, submit, base, every[done], dead_share, rewritten)
        except JournalCorrupt as found:
            damage = _passed_over(damage, found, base)
        finally:
            if progress is not None:
                progress(done, len(bases))
    if damage is not None:
        raise damage
    seconds = time.perf_counter() - started
    return CompactionReport(
        rewritten,
        deleted,
        bytes_before,
        sealed_bytes(log),
        copied,
        seconds,
        trimmed,
        evicted,
        active.frame_bytes,
        active.dead_bytes,
    )


class Compactions:
    """The compactions of one engine: one at a time in this process (two would write the
    same temporary copy of a segment), whether `compact()` asked for it or a retention
    pass (`ask`: segments whose compaction lets eviction records go, done by `unpin`)."""

    def __init__(self, log: SegmentLog, view: View, submit: Submit) -> None:
        self._log, self._view, self._submit = log, view, submit
        self._running = threading.Lock()
        self._asked: set[int] = set()
        self._asked_lock = threading.Lock()

    def compact(self, dead_share: float, progress: Progress | None) -> CompactionReport:
        with self._running:
            return compact_store(self._log, self._view, self._submit, dead_share, progress)

    def ask(self, bases: set[int]) -> None:
        with self._asked_lock:
            self._asked |= bases

    def unpin(self, stop: Callable[[], bool]) -> bool:
        """Compact the segments asked for (left for the next time they are asked for
        while another compaction runs); whether one was rewritten."""
        with self._asked_lock:
            asked, self._asked = self._asked, set()
        if not asked or not self._running.acquire(blocking=False):
            return False
        try:
            bases = sorted(asked & set(self._log.bases()[:-1]))
            return unpin_segments(self._log, self._view, self._submit, bases, stop) > 0
        finally:
            self._running.release()

    def wait(self, timeout_s: float) -> None:
        """Let a compaction in flight finish (at most `timeout_s`)."""
        wait_while_held(self._running, timeout_s)


def unpin_segments(
    log: SegmentLog, view: View, submit: Submit, bases: list[int], stop: Callable[[], bool]
) -> int:
    """Rewrite the sealed segments `bases` without their dead frames, so that the creation
    records of evicted sessions in them go and their eviction records, which alone keep
    newer segments, may go too (the next retention pass deletes those segments: SPEC 8,
    "Eviction records"), until `stop()`. Returns how many were rewritten (none when no
    dead frame was left to drop: a creation record sharing its frame with a live one)."""
    rewritten: list[str] = []
    damage: JournalCorrupt | None = None
    every = log.bases()
    for base in bases:
        if stop():
            break
        later = bisect_right(every, base)
        next_base = every[later] if later < len(every) else None
        try:
            _compact_segment(log, view, submit, base, next_base, 0.0, rewritten, unpin=True)
        except JournalCorrupt as found:
            damage = _passed_over(damage, found, base)
    if damage is not None:
        raise damage
    return len(rewritten)


def _no_room_for_copy(error: OSError, directory: str, base: int, live_bytes: int) -> OSError:
    """`error` (ENOSPC, EDQUOT) from writing the compacted copy of segment `base`, saying
    what compaction needs room for, and about how much: the copy is written beside the old
    file, which is deleted only once the copy replaced it. (Until 2026-12-07 "free space,
    replace the disk" alone: an operator trial, `journal compact` on a full disk.)"""
    try:
        found = os.statvfs(directory)
        free = f"; {_megabytes(found.f_bavail * found.f_frsize)} are free there"
    except OSError:
        free = ""
    return OSError(
        error.errno,
        f"{error.strerror}: compaction writes a copy of segment {segment_name(base)} "
        f"without its dead frames beside it, and deletes the old file only after, so it "
        f"needs room for that copy: up to {_megabytes(live_bytes)} (its live frames, before "
        f"compression){free}; free that much outside the store (deleting a store file "
        "loses events) and compact again",
        error.filename,
    )


def _no_room_to_commit(
    error: StoreUnavailable, directory: str, base: int, summary: SegmentSummary, *, seal: bool
) -> StoreUnavailable:
    """`error` as it is, unless the disk had no room (ENOSPC, EDQUOT; not for want of
    inodes, which `error` names) for the commit that seals the active segment `base`
    (`seal`) or swaps in its compacted copy: then saying what that commit writes, that
    nothing was lost, and about how much to free, as `_no_room_for_copy` does for the
    copy. (Until 2026-12-07 "could not be read or written ... (free space, replace the
    disk)" alone.) `summary`: the segment's, or its copy's, whose sidecar the commit
    writes; the view's pages take some room too (a margin of 1 MB)."""
    if error.errno not in (errno.ENOSPC, errno.EDQUOT) or isinstance(error, WriteOutcomeUnknown):
        return error
    free = ""
    with contextlib.suppress(OSError):
        found = os.statvfs(directory)
        if found.f_files > 0 and found.f_favail == 0 and found.f_bavail > 0:
            return error  # (out of inodes: `error` says so)
        free = f"; {_megabytes(found.f_bavail * found.f_frsize)} are free there"
    index_bytes = len(msgspec.msgpack.encode(summary)) + 64
    cause = error.__cause__
    refused = os.strerror(error.errno) + (
        f" ({cause.filename})" if isinstance(cause, OSError) and cause.filename else ""
    )
    if seal:
        step = (
            f"compaction seals the active segment {segment_name(base)} before it compacts "
            "it: it cuts the segment's zeros ahead, writes its index file, starts a new "
            "active segment and moves the view's head there, and the disk had no room "
            "left for that; nothing was lost (a seal left half done is finished by the "
            "next commit, as a full segment's is)"
        )
    else:
        step = (
            f"compaction put its copy of segment {segment_name(base)} without its dead "
            "frames in place of the old file (writing the copy's index file and the "
            "view's changes with it), and the disk had no room left for that; nothing was "
            "lost (the copy holds every live frame; a swap left half done is finished by "
            "the next compaction or writable open)"
        )
    return StoreUnavailable(
        f"the store's files could not be written: {refused}: {step}. It needs room for "
        f"the index file, about {_megabytes(index_bytes)}, and a few pages of the view"
        f"{free}; free at least {_megabytes(index_bytes + (1 << 20))} outside the store "
        "(deleting a store file loses events) and compact again",
        errno=error.errno,
    )


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"


def _passed_over(first: JournalCorrupt | None, found: JournalCorrupt, base: int) -> JournalCorrupt:
    """The damage to raise once the other segments are done: the first found. Damage of
    anything but segment `base` itself (the view's, which its swap met) is raised at
    once: every later swap would meet it again, each after writing a compressed copy."""
    if found.segment not in (segment_name(base), segment_name(base, compressed=True)):
        raise found
    return first or found


def _compact_segment(
    log: SegmentLog,
    view: View,
    submit: Submit,
    base: int,
    next_base: int | None,
    dead_share: float,
    rewritten: list[str],
    unpin: bool = False,
) -> int:
    """Rewrite one sealed segment if it is worth it; returns the live bytes copied.
    (`next_base`: the base of the segment after it, if any; `unpin`: only to drop dead
    frames, so never a compressed one without any.)"""
    directory = log.directory
    source = _file_identity(directory, base)
    if source is None:
        return 0
    try:
        # (A writer's open checks sidecars by checksum only: one that fails the other
        # checks is still there, and its segment is scanned, as retention does.)
        summary = read_summary(directory, base) or summarize_segment(directory, base, log.ops)
    except FileNotFoundError:
        return 0  # deleted meanwhile by another writer's retention pass
    with view.begin() as txn:
        live, live_bytes, total = live_frames(txn, view, summary)
    del txn  # (no read transaction object outlives its transaction: SPEC 7)
    log.ops.point("compaction.live_frames", base)
    compressed = source[0].endswith(".zst")
    if not live:
        return 0  # dead: the retention pass deletes those
    if compressed and (total - live_bytes < dead_share * total or (unpin and live_bytes == total)):
        _finish_swap(log, view, submit, summary, source, next_base)
        return 0

    def keep(info: FrameInfo) -> bool:
        return info.offset in live

    try:
        temporary, new_summary = compress_segment(
            directory, base, keep=keep, publish=False, ops=log.ops, permissions=log.permissions
        )
    except FileNotFoundError:
        return 0  # deleted meanwhile by another writer's retention pass
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise _no_room_for_copy(e, directory, base, live_bytes) from e
    log.ops.point("compaction.rewritten", base)
    if compressed and os.path.getsize(temporary) > source[2]:
        # Kept frames that were not contiguous compress in separate blocks; when that
        # costs more than the dead frames it drops, keep the old file.
        os.unlink(temporary)
        _finish_swap(log, view, submit, summary, source, next_base)
        return 0
    copy = os.stat(temporary)
    swap = SwapSegment(
        base, temporary, new_summary, source, summary.last_position, (copy.st_ino, copy.st_size)
    )
    try:
        try:
            mark = _mark_swap(log, base)
        except OSError as e:  # (its mark refused: nothing was submitted)
            raise unavailable(e) from e
        swapped = submit(swap)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)  # (gone already when it was renamed into place)
        # (The mark stays: the view's part may be left to do, `finish_swaps`.)
        if isinstance(e, StoreUnavailable):
            raise _no_room_to_commit(e, directory, base, new_summary, seal=False) from e
        raise
    with contextlib.suppress(FileNotFoundError):
        log.ops.unlink(mark)  # (committed, or abandoned before its rename)
    if swapped:
        rewritten.append(segment_name(base, compressed=True))
        return live_bytes
    return 0
