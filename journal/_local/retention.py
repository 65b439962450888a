"""Retention: history windows, and reclaiming sealed segments that hold nothing live.

A sealed segment is dead when no record in it is still needed: no pinned record (a live
session's creation, latest transition, snapshot, trim or idempotency record, or an
eviction record whose session's creation record survives elsewhere) lies in its position
range, and every session with events in it (from the sidecar) is evicted or has trimmed
them all. Dead segments are forgotten by the view in the writer's transaction and their
files deleted after it commits; a reader still holding one open keeps reading it.
Between passes the writer keeps a small entry per sealed segment (`SummaryCache`), within
a byte budget, not its sidecar, and the commit times of the imported frames an age window
keeps while they straddle its horizon (`FrameTimes`).
"""

from __future__ import annotations

import bisect
import logging
import os
import zlib
from array import array
from typing import Final, NamedTuple

import lmdb
import msgspec

from ..errors import JournalCorrupt
from ..models import RetentionPolicy
from ..records import EventAppended, decode_frame_body
from ..sessions import SessionRow
from .events_index import Location
from .files import fsync_dir
from .frames import segment_name, sidecar_name
from .log import SegmentLog
from .os_marks import mark_name
from .segments import SegmentReader, frame_records, summarize_segment
from .sidecar import SegmentSummary, read_summary
from .view import View

_log: Final = logging.getLogger("journal")
# The newest time `FrameTimes` gives a frame that cannot be read: no window's horizon
# reaches it, so the frame stays.
_UNREADABLE: Final = 1 << 63

__all__ = [
    "DEFAULT_SUMMARY_BUDGET",
    "FrameTimes",
    "SegmentLiveness",
    "StagedFrame",
    "SummaryCache",
    "candidate_rows",
    "dead_segments",
    "delete_segment_files",
    "forget_segments",
    "window_start",
]


def window_start(
    txn: lmdb.Transaction,
    view: View,
    row: SessionRow,
    policy: RetentionPolicy,
    now: int,
    times: FrameTimes,
) -> int:
    """The first ordinal the session's history windows keep (frame granularity: a window
    never cuts a batch, and the newest frame is kept whatever its size). `times` reads the
    commit times of the events of frames an import staged."""
    limit_bytes = row.max_history_bytes or policy.max_history_bytes
    limit_age = row.max_history_age_ms or policy.max_history_age_ms
    over_bytes = limit_bytes is not None and row.retained_bytes > limit_bytes
    if not over_bytes and limit_age is None:
        return row.first_ordinal
    new_first = row.first_ordinal
    if over_bytes and limit_bytes is not None:
        newest = _first_frame_within(txn, view, row, row.appended_bytes - limit_bytes)
        if newest is None:
            return new_first  # no frames
        new_first = max(new_first, newest.first_ordinal)
    if limit_age is not None:
        frames = view.events.locations(txn, row.incarnation)
        if not frames:
            return new_first
        # Kept: from the first batch holding an event committed within the window on.
        # Commit times follow the wall clock, which may step back: the newest batch older
        # than the window does not make every batch old (until 2026-12-05 it trimmed them
        # all, batches committed minutes ago before a step back of a day included).
        horizon = now - limit_age
        # An index entry holds the time of the session's first event in the frame. The
        # events of an append's frame share its commit time; those of a frame an import
        # staged (before its `SessionImported` record, at `name_position`) keep their
        # original, different times: such a frame, older by its first event or holding
        # events a snapshot compacted, is read, and stays while its newest retained event
        # is within the window (until 2026-12-05 it left whole by its first event, events
        # minutes old with it). An archive's events were committed before it was
        # exported: a frame holding compacted events whose first event is stamped later
        # is an append's, not read (until 2026-12-05 each pass read such a frame of the
        # active segment again); one an import staged from a source whose clock stepped
        # back is then judged by that time, and keeps more.
        staged_before = row.name_position
        for frame in frames:
            newest_ms = frame.time_ms
            if frame.segment <= staged_before and (
                newest_ms < horizon
                or (
                    frame.first_ordinal < row.first_ordinal
                    and newest_ms <= row.imported_exported_at_ms
                )
            ):
                staged = times.newest(row, frame)
                if staged is None:
                    staged_before = 0  # (an append's frame: so are the ones after it)
                else:
                    newest_ms = staged
                if newest_ms >= horizon:
                    # (An append's frame too: one holding events a snapshot compacted was
                    # read again by every pass, until 2026-12-05.)
                    times.stays(frame)
                else:
                    times.leaves(frame)
            if newest_ms >= horizon:
                new_first = max(new_first, frame.first_ordinal)
                break
        else:
            new_first = max(new_first, row.last_ordinal + 1)
    return new_first


class StagedFrame(NamedTuple):
    """What an age window needs of a frame an import may have staged: its first position,
    and per session with events in it, the times that are newer than every later event's
    of the session in the frame, with their ordinals (`ordinals[i]`, `times[i]`, in
    ordinal order; one entry where times grow): the newest time of the session's events
    from ordinal `o` on is that of the first entry at or after `o`."""

    first_position: int
    newest: dict[int, tuple[array[int], array[int]]]

    @classmethod
    def of(cls, first_position: int, events: list[EventAppended]) -> StagedFrame:
        found: dict[int, tuple[array[int], array[int]]] = {}
        for event in reversed(events):
            entry = found.get(event.incarnation)
            if entry is None:
                found[event.incarnation] = (
                    array("q", [event.ordinal]),
                    array("q", [event.timestamp_ms]),
                )
            elif event.timestamp_ms > entry[1][-1]:
                entry[0].append(event.ordinal)
                entry[1].append(event.timestamp_ms)
        for ordinals, times in found.values():
            ordinals.reverse()
            times.reverse()
        return cls(first_position, found)

    def newest_from(self, incarnation: int, ordinal: int) -> int | None:
        """The newest time of the session's events in the frame from `ordinal` on (None:
        it has none there)."""
        entry = self.newest.get(incarnation)
        if entry is None:
            return None
        at = bisect.bisect_left(entry[0], ordinal)
        return entry[1][at] if at < len(entry[0]) else None

    @property
    def cost(self) -> int:
        """The bytes the entry is charged in a `SummaryCache` (as `SegmentLiveness.cost`)."""
        return _ENTRY_BYTES + sum(_ENTRY_BYTES // 2 + 16 * len(o) for o, _ in self.newest.values())


class FrameTimes:
    """The newest commit time of a session's retained events in a frame an import staged,
    for one retention pass (`window_start`): read from the frame, once a pass. A frame of a
    sealed segment that stays (its newest event within the window, its first older: it
    straddles the horizon; or an append's, read because a snapshot compacted its first
    events) is kept in the writer's `SummaryCache` for later passes
    (sealed frames never change) and forgotten once it leaves every session that looked
    at it; a frame of the active segment is read by every pass that needs it."""

    def __init__(
        self, txn: lmdb.Transaction, view: View, log: SegmentLog, cache: SummaryCache
    ) -> None:
        self._txn = txn
        self._view = view
        self._log = log
        self._cache = cache
        # The frames this pass read or found kept (None: it could not be read), and
        # those that stay for a session.
        self._read: dict[tuple[int, int], StagedFrame | None] = {}
        self._stayed: set[tuple[int, int]] = set()
        self._head: tuple[int, int | None] | None = None

    def newest(self, row: SessionRow, frame: Location) -> int | None:
        """The newest time of the session's retained events in `frame` when an import
        staged it (a frame whose first position is past the session's `SessionImported`
        record is an append's: None, its stored time is its events'). A frame that
        cannot be read (its file lost, a read error) counts as within the window: it
        stays (`verify` reports it) and a warning is logged; one whose bytes fail their
        checks gives its stored time (logged too)."""
        staged = self._staged(frame.segment, frame.offset)
        if staged is None:
            return _UNREADABLE
        if staged is _DAMAGED:
            return frame.time_ms
        if staged.first_position > row.name_position:
            return None
        newest = staged.newest_from(row.incarnation, max(frame.first_ordinal, row.first_ordinal))
        return frame.time_ms if newest is None else newest

    def stays(self, frame: Location) -> None:
        """`frame`, looked at by this pass, stays: kept for later passes when it is
        sealed."""
        key = (frame.segment, frame.offset)
        self._stayed.add(key)
        staged = self._read.get(key)
        if staged is not None and staged is not _DAMAGED and frame.segment < self._head_now()[0]:
            self._cache.keep_staged_frame(frame.segment, frame.offset, staged)

    def leaves(self, frame: Location) -> None:
        """`frame`, looked at by this pass, leaves the session: no longer kept, unless it
        stays for another session (until 2026-12-05 a kept frame stayed in the cache
        until its segment died, and an import's segments live while its sessions do,
        its `SessionStaged` records pinned: the cache, full of frames no pass needed
        again, no longer kept the segments' entries, read from their sidecars by every
        pass)."""
        key = (frame.segment, frame.offset)
        if key not in self._stayed:
            self._cache.drop_staged_frame(frame.segment, frame.offset)

    def _head_now(self) -> tuple[int, int | None]:
        """(The view's head segment, its committed end), read once a pass."""
        if self._head is None:
            head = self._view.head(self._txn)
            self._head = (head.segment, head.end_offset) if head is not None else (0, None)
        return self._head

    def _staged(self, segment: int, offset: int) -> StagedFrame | None:
        key = (segment, offset)
        if key in self._read:
            return self._read[key]
        staged = self._cache.staged_frame(segment, offset)
        if staged is None:
            active_segment, committed_end = self._head_now()
            # (Segments below the view's head segment are sealed; a segment sealed in this
            # very batch is still read as the active one, up to the committed end.)
            active = segment >= active_segment
            staged = _read_staged(self._log, segment, offset, committed_end if active else None)
        self._read[key] = staged
        return staged


def _read_staged(
    log: SegmentLog, segment: int, offset: int, committed_end: int | None
) -> StagedFrame | None:
    """The `StagedFrame` of the frame at (`segment`, `offset`); `_DAMAGED` when its bytes
    fail their checks, None when it cannot be read (both logged)."""
    try:
        log.ops.point("retention.read_frame", (segment, offset))
        with SegmentReader(log.directory, segment, log.ops) as reader:
            info, body = reader.read_frame(offset, committed_end)
            records = frame_records(reader.name, info, body, decode_frame_body)
    except JournalCorrupt as e:
        # No reader can serve its events and `verify --fix` cannot repair it: judged by
        # the time its index entry records, as every frame was before 2026-12-05 (until
        # 2026-12-05 it stayed, and the session's later history with it, for good).
        _log.warning(
            "retention: the frame at offset %d of segment %s cannot be read (%s): an age "
            "window judges it by its session's first event's time (verify reports it)",
            offset,
            segment_name(segment),
            e,
        )
        return _DAMAGED
    except OSError as e:
        _log.warning(
            "retention: the frame at offset %d of segment %s cannot be read (%s): its "
            "events, and the session's later ones, stay until it can (verify reports it)",
            offset,
            segment_name(segment),
            e,
        )
        return None
    events = [record for record in records if isinstance(record, EventAppended)]
    return StagedFrame.of(info.first_position, events)


# What `FrameTimes` reads of a frame whose bytes fail their checks: no times of its own,
# so each session's recorded time (its first event's) in the frame gives the frame's.
_DAMAGED: Final = StagedFrame(0, {})


def _first_frame_within(
    txn: lmdb.Transaction, view: View, row: SessionRow, bytes_before: int
) -> Location | None:
    """The session's first frame with at least `bytes_before` appended before it (the
    oldest frame a byte window keeps), else its newest frame; None when it has no frames.

    A binary search over ordinals, one index seek per step: the bytes before a frame
    grow with its ordinal (a linear scan read every retained frame of the session on
    every retention pass)."""
    lo, hi = row.first_ordinal, row.last_ordinal
    if hi < lo:
        return view.events.frame_holding(txn, row.incarnation, hi)
    found: Location | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        frame = view.events.frame_holding(txn, row.incarnation, mid)
        if frame is not None and frame.bytes_before >= bytes_before:
            found, hi = frame, frame.first_ordinal - 1
        else:
            lo = mid + 1
    return found or view.events.frame_holding(txn, row.incarnation, row.last_ordinal)


class SegmentLiveness(NamedTuple):
    """What a retention pass needs of a sealed segment: its position range and, per
    session with events in it, the last ordinal it holds there (`incarnations[i]` holds
    events up to `last_ordinals[i]`; 16 bytes a session, as sidecar values are below
    2^63)."""

    base_position: int
    last_position: int
    incarnations: array[int]
    last_ordinals: array[int]

    @classmethod
    def of(cls, summary: SegmentSummary) -> SegmentLiveness:
        return cls(
            summary.base_position,
            summary.last_position,
            array("Q", summary.sessions),
            array("Q", [max(last for _, last, _ in runs) for runs in summary.sessions.values()]),
        )

    @property
    def cost(self) -> int:
        """The bytes the entry is charged in a `SummaryCache` (an estimate that does not
        depend on the interpreter: 16 bytes a session plus a fixed share for the
        objects)."""
        return _ENTRY_BYTES + 16 * len(self.incarnations)


# The tuple, two ints, two array headers and a dict slot, rounded up.
_ENTRY_BYTES: Final = 384
# 4 MiB: about 10,000 single-session segments, or 260,000 (segment, session) pairs.
DEFAULT_SUMMARY_BUDGET: Final = 4 << 20


class SummaryCache:
    """Retention's deliberate cache of sealed segments between passes (sealed segments
    never change, except by a compaction swap, which `pop`s its entry).

    It keeps a `SegmentLiveness` per segment, not the sidecar (a sidecar costs about
    0.3 to 0.5 KB of memory per frame), and at most `budget_bytes` of them: a segment that does
    not fit is read from its sidecar again by every pass and not kept, so a writer's
    memory does not grow with the store. Entries leave when their segment is dead (the
    oldest segments die first, which frees room for newer ones). Within the same budget it
    keeps the `StagedFrame`s of sealed segments that `FrameTimes` hands it; they leave when
    `FrameTimes` drops them (the frame left its sessions) or with their segment."""

    def __init__(self, budget_bytes: int = DEFAULT_SUMMARY_BUDGET) -> None:
        self.budget_bytes = budget_bytes
        self._entries: dict[int, SegmentLiveness] = {}
        # Also, within the same budget: segment -> offset -> the commit times of a frame
        # an import staged (`FrameTimes`), read by age windows.
        self._staged: dict[int, dict[int, StagedFrame]] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def cached_bytes(self) -> int:
        """What the kept entries are charged (at most `budget_bytes`)."""
        return self._bytes

    def get(self, log: SegmentLog, base: int) -> SegmentLiveness:
        """The segment's liveness, from the cache or else from its sidecar (or, when the
        sidecar is missing or bad, a scan of the segment): FileNotFoundError when the
        segment was deleted meanwhile."""
        entry = self._entries.get(base)
        if entry is None:
            log.ops.point("retention.read_sidecar", base)
            summary = read_summary(log.directory, base) or summarize_segment(
                log.directory, base, log.ops
            )
            entry = SegmentLiveness.of(summary)
            if self._bytes + entry.cost <= self.budget_bytes:
                self._entries[base] = entry
                self._bytes += entry.cost
        return entry

    def staged_frame(self, base: int, offset: int) -> StagedFrame | None:
        """The kept commit times of the frame at `offset` of sealed segment `base`."""
        frames = self._staged.get(base)
        return None if frames is None else frames.get(offset)

    def keep_staged_frame(self, base: int, offset: int, frame: StagedFrame) -> None:
        """Keep the commit times of a frame of a sealed segment, if they fit the budget."""
        frames = self._staged.setdefault(base, {})
        if offset not in frames and self._bytes + frame.cost <= self.budget_bytes:
            frames[offset] = frame
            self._bytes += frame.cost
        elif not frames:
            del self._staged[base]

    def drop_staged_frame(self, base: int, offset: int) -> None:
        """Forget the kept commit times of a frame (no longer needed)."""
        frames = self._staged.get(base)
        if frames is not None:
            frame = frames.pop(offset, None)
            if frame is not None:
                self._bytes -= frame.cost
            if not frames:
                del self._staged[base]

    def pop(self, base: int, default: None = None) -> SegmentLiveness | None:
        """Forget a segment (dead, or replaced by a compaction swap)."""
        for frame in self._staged.pop(base, {}).values():
            self._bytes -= frame.cost
        entry = self._entries.pop(base, default)
        if entry is not None:
            self._bytes -= entry.cost
        return entry

    def clear(self) -> None:
        """Forget every segment (the view was rebuilt)."""
        self._entries.clear()
        self._staged.clear()
        self._bytes = 0


def _pins(txn: lmdb.Transaction, view: View, first: int, last: int) -> tuple[bool, list[int]]:
    """(whether a pinned record in the position range must stay, and the creation
    positions of the evicted sessions whose eviction records there stay only while their
    creation record, in an older segment, may still exist). An eviction pin dies with its
    creation record, so one whose creation record is in the same segment is not a pin."""
    held: list[int] = []
    for position, incarnation in view.pins_between(txn, first, last):
        if view.tombstone(txn, incarnation) != position:
            return True, []
        if not first <= incarnation <= last:
            held.append(incarnation)
    return False, held


def dead_segments(
    txn: lmdb.Transaction,
    view: View,
    log: SegmentLog,
    cache: SummaryCache,
    held: list[int] | None = None,
) -> list[SegmentLiveness]:
    """Sealed segments holding nothing live (the active segment is never dead). With
    `held`, the creation positions are added there of evicted sessions whose eviction
    records alone keep a segment (`unpin_segments` frees it)."""
    dead = []
    for base in log.bases()[:-1]:
        try:
            segment = cache.get(log, base)
        except FileNotFoundError:
            continue  # deleted meanwhile by another writer's retention pass
        pinned, creations = _pins(txn, view, base, segment.last_position)
        if pinned:
            continue
        live = False
        for incarnation, last_ordinal in zip(
            segment.incarnations, segment.last_ordinals, strict=True
        ):
            row = view.row_by_incarnation(txn, incarnation)
            if row is not None and last_ordinal >= row.first_ordinal:
                live = True
                break
        if live:
            continue
        if creations:
            if held is not None:
                held.extend(creations)
            continue
        dead.append(segment)
    return dead


def forget_segments(
    txn: lmdb.Transaction, view: View, log: SegmentLog, dead: list[SegmentLiveness]
) -> None:
    """Drop view state that only existed for records in `dead`: eviction tombstones whose
    creation record goes with them (and their pins), and the lifecycle feed entries of
    their records (the feed's floor rises, recorded in the log before the segments go:
    SPEC 7.7)."""
    highest = 0
    for summary in dead:
        first, last = summary.base_position, summary.last_position
        highest = max(highest, view.prune_feed(txn, first, last))
        for incarnation, position in view.tombstones_between(txn, first, last):
            view.forget_tombstone(txn, incarnation, position)
    if highest:
        log.record_feed_floor(highest)


def delete_segment_files(log: SegmentLog, bases: list[int]) -> int:
    """Delete the files of forgotten segments; returns the bytes freed."""
    log.ops.point("retention.delete", bases)
    if bases:
        log.sync_committed()  # (the records that made them dead first)
    with log.files_lock():
        freed = 0
        for base in bases:
            for name in (
                segment_name(base),
                segment_name(base, compressed=True),
                sidecar_name(base),
                mark_name(base),
            ):
                path = os.path.join(log.directory, name)
                try:
                    freed += os.path.getsize(path)
                    log.ops.unlink(path)
                except FileNotFoundError:
                    pass  # another writer deleted it first
        if bases:
            fsync_dir(log.directory, log.ops)
    log.ops.point("retention.deleted", bases)
    return freed


def policy_mark(policy: RetentionPolicy) -> int:
    """A number naming the windows a pass applied (the `retained` mark carries it): a pass
    under another policy (another process's) did not check what this one would."""
    return zlib.crc32(msgspec.msgpack.encode(policy))


def candidate_rows(
    txn: lmdb.Transaction,
    view: View,
    log: SegmentLog,
    cache: SummaryCache,
    sealed: list[int],
    mark: int,
) -> list[SessionRow]:
    """The rows a pass after a seal must look at when only byte windows and the sessions'
    own age windows apply: sessions with events in a segment of `sealed` newer than the
    last committed pass covered (only an append grows a session's bytes), and sessions
    with an age window of their own (SPEC 8, "What a pass reads"). In session-id order,
    as a full pass."""
    covered = view.retention.covered_through(txn, mark)
    imported = view.retention.imported_since(txn)
    if imported is not None:
        # Sessions imported since: their events follow their staging records, from the
        # segment holding the lowest one on (a pass may have covered those meanwhile).
        holding = max(bisect.bisect_right(sealed, imported) - 1, 0)
        if sealed:
            covered = min(covered, sealed[holding] - 1)
    incarnations: set[int] = set(view.retention.aged(txn))
    for base in sealed:
        if base <= covered:
            continue
        try:
            incarnations.update(cache.get(log, base).incarnations)
        except FileNotFoundError:
            continue  # deleted meanwhile by another writer's retention pass
    rows = []
    for incarnation in incarnations:
        row = view.row_by_incarnation(txn, incarnation)
        if row is not None and not row.staged:
            rows.append(row)
    rows.sort(key=lambda row: row.session_id)
    return rows
