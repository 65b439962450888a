"""The projector: applies committed frames (or a sealed segment's sidecar) to the LMDB
view, in one write transaction. One apply path serves a writer's commit, its catch-up
with frames it has not indexed (another process's, or a crashed writer's), a rebuild of
the whole view, and a read-only reader's refresh of its private view.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Sequence
from itertools import pairwise

import lmdb

from ..errors import JournalCorrupt
from ..models import LifecycleEventType, SessionState
from ..records import (
    TURN_EVENT_TYPES,
    CheckpointTaken,
    EventAppended,
    HistoryTrimmed,
    IdempotencyKeyUsed,
    OwnerAcquired,
    OwnerReleased,
    Record,
    SessionCreated,
    SessionEvicted,
    SessionImported,
    SessionStaged,
    SnapshotTaken,
    StateChanged,
    decode_frame_body,
    decode_record,
)
from ..sessions import FeedEntry, SessionRow, lifecycle_event_of
from ..turns import open_turn_after
from .files import DEFAULT_FILE_OPS, FileOps
from .frames import SEGMENT_HEADER_SIZE, FrameInfo, segment_name
from .log import SegmentLog
from .segments import (
    KnownZeros,
    SegmentReader,
    active_frames,
    frame_records,
    summarize_segment,
)
from .sidecar import SUMMARY_FORMAT, EventRun, SegmentSummary, read_summary
from .view import Head, IdemEntry, MissingEvents, View

__all__ = [
    "Projection",
    "log_missing",
    "project_log",
    "project_segments",
]

_log = logging.getLogger("journal")


class Projection:
    """Applies committed frames to the view inside one write transaction.

    Rows touched by a frame are cached and written back by `flush()`; the same instance may
    apply many frames (catch-up, rebuild) before flushing. The projection tolerates a log
    whose dead records were compacted away: a session's first surviving event starts its
    retained range, and trim or snapshot records raise `first_ordinal` whenever they come.
    """

    def __init__(
        self, view: View, txn: lmdb.Transaction, head: Head, ops: FileOps = DEFAULT_FILE_OPS
    ) -> None:
        self.view = view
        self._ops = ops
        self.txn = txn
        self.head = head
        self.rows: dict[int, SessionRow] = {}
        self._old_deadlines: dict[int, int | None] = {}
        self._evicted: dict[int, SessionRow] = {}
        # The state index entry (state, session id) each loaded row has in the view.
        self._listed: dict[int, tuple[int, str]] = {}
        self.nearest_new_deadline: int | None = None  # of the deadlines flushed
        # Incarnations with events missing since their last turn event seen (a compacted
        # log): their open turn is what the next turn event says (`_turn_event`).
        self._turn_gaps: set[int] = set()
        # The last lifecycle record of a session this projection does not know (its
        # creation record left the log), whose feed entry it cannot make: 0 if none.
        self.unknown_change = 0
        # Per incarnation: the last run of ordinals missing before an event of the log,
        # and where that event's frame is; and the start of its retained range that the
        # log's records set (trims, snapshots). A run at or past that start lost events
        # that no record accounts for (`unaccounted_gaps`).
        self._gaps: dict[int, tuple[int, int, int, int]] = {}
        self._starts: dict[int, int] = {}

    def adopt(self, row: SessionRow) -> None:
        """Use a row read from this very transaction instead of reading it again."""
        if row.incarnation not in self.rows:
            self.rows[row.incarnation] = row
            self._old_deadlines[row.incarnation] = row.deadline()
            self._loaded(row)

    def row(self, incarnation: int) -> SessionRow | None:
        row = self.rows.get(incarnation)
        if row is None:
            row = self.view.row_by_incarnation(self.txn, incarnation)
            if row is None:
                return None
            self.rows[incarnation] = row
            self._old_deadlines[incarnation] = row.deadline()
            self._loaded(row)
        return row

    def _loaded(self, row: SessionRow) -> None:
        if not row.staged:
            self._listed[row.incarnation] = (row.state, row.session_id)

    def apply(self, info: FrameInfo, records: list[Record], runs: Sequence[EventRun] = ()) -> None:
        """Project one committed frame. `runs` (from the writer that planned the frame) are
        its runs of consecutive events of one session, applied in O(1) each; without runs
        (catch-up, rebuild) every record is applied one by one, with the same result."""
        indexed: set[int] = set()
        at = 0
        for run in runs:
            start = run.start
            incarnation = run.incarnation
            if start > at:
                self._apply_records(info, records, at, start, indexed)
            if not self._apply_run(
                incarnation,
                run.first_ordinal,
                run.count,
                info.first_position + start,
                run.data_bytes,
                info.segment,
                info.offset,
                run.time_ms,
                incarnation not in indexed,
            ):
                self._apply_records(info, records, start, start + run.count, indexed)
            indexed.add(incarnation)
            at = start + run.count
        if at < len(records):
            self._apply_records(info, records, at, len(records), indexed)
        self.head.next_position = info.first_position + info.count
        self.head.segment = info.segment
        self.head.end_offset = info.end_offset

    def apply_summary(self, summary: SegmentSummary) -> None:
        """Project a sealed segment from its (format 2) sidecar alone, in position order:
        the same view as applying its frames, without reading the segment."""
        segment = summary.base_position
        items: list[tuple[int, int, int]] = [
            (run.position, 0, i) for i, run in enumerate(summary.event_runs)
        ]
        items += [(other.position, 1, i) for i, other in enumerate(summary.others)]
        items.sort()
        # Per frame: the sessions whose first event in it was indexed already (a turn
        # event among the other records may come first).
        indexed: dict[int, set[int]] = {}
        for position, kind, i in items:
            if kind == 1:
                other = summary.others[i]
                info = FrameInfo(segment, other.frame_offset, position, 1, 0)
                seen = indexed.setdefault(other.frame_offset, set())
                self._apply_records(info, [decode_record(other.encoded)], 0, 1, seen)
                continue
            run = summary.event_runs[i]
            self._apply_run(
                run.incarnation,
                run.first_ordinal,
                run.count,
                position,
                run.data_bytes,
                segment,
                run.frame_offset,
                run.time_ms,
                run.incarnation not in indexed.setdefault(run.frame_offset, set()),
            )
            indexed[run.frame_offset].add(run.incarnation)
        self.head.segment = segment
        self.head.end_offset = summary.data_end
        self.head.next_position = max(self.head.next_position, summary.last_position + 1)

    def _apply_run(
        self,
        incarnation: int,
        first: int,
        count: int,
        position: int,
        size: int,
        segment: int,
        frame_offset: int,
        timestamp: int,
        first_in_frame: bool,
    ) -> bool:
        """Apply `count` consecutive events of one session from ordinal `first` (stored at
        `position` on). Returns False only for a run that overlaps what the row already has
        (the caller then goes record by record)."""
        row = self.row(incarnation)
        if row is None or first + count - 1 <= row.last_ordinal:
            return True  # an evicted session's, or already applied
        if first <= row.last_ordinal:
            return False
        if first != row.last_ordinal + 1:
            self._gap(row, first, segment, frame_offset)
        if first_in_frame:
            self.view.events.put(
                self.txn, incarnation, first, segment, frame_offset, row.appended_bytes, timestamp
            )
        row.last_ordinal = first + count - 1
        row.last_event_position = position + count - 1
        row.appended_bytes += size
        row.retained_bytes += size
        return True

    def _index_frame(self, row: SessionRow, ordinal: int, info: FrameInfo, record: Record) -> None:
        timestamp = record.timestamp_ms if isinstance(record, EventAppended) else 0
        self.view.events.put(
            self.txn,
            row.incarnation,
            ordinal,
            info.segment,
            info.offset,
            row.appended_bytes,
            timestamp,
        )

    def _apply_records(
        self, info: FrameInfo, records: list[Record], lo: int, hi: int, indexed: set[int]
    ) -> None:
        txn = self.txn
        view = self.view
        position = info.first_position + lo
        current = -1
        row: SessionRow | None = None
        for index in range(lo, hi):
            record = records[index]
            if isinstance(record, EventAppended):
                # Frames are mostly runs of one session's events: look its row up once.
                if record.incarnation != current:
                    current = record.incarnation
                    row = self.row(current)
                if row is not None and record.ordinal > row.last_ordinal:
                    if record.ordinal != row.last_ordinal + 1:
                        self._gap(row, record.ordinal, info.segment, info.offset)
                    if current not in indexed:
                        indexed.add(current)
                        self._index_frame(row, record.ordinal, info, record)
                    row.last_ordinal = record.ordinal
                    row.last_event_position = position
                    row.appended_bytes += len(record.data)
                    row.retained_bytes += len(record.data)
                    if record.type in TURN_EVENT_TYPES:
                        self._turn_event(row, record, position)
                position += 1
                continue
            current = -1
            if isinstance(record, SessionCreated):
                row = SessionRow.created(record, position)
                self.rows[position] = row
                self._old_deadlines[position] = None
                view.put_incarnation(txn, position, record.session_id)
                if row.max_history_age_ms is not None:
                    view.retention.add_aged(txn, position)
                self._pin(position, position)
                self._feed(position, LifecycleEventType.CREATED, record.created_at_ms, row)
            elif isinstance(record, SessionStaged):
                row = SessionRow.staged_from(record, position)
                self.rows[position] = row
                self._old_deadlines[position] = None
                view.put_incarnation(txn, position, record.staging_id)
                if row.max_history_age_ms is not None:
                    view.retention.add_aged(txn, position)
                self._pin(position, position)
            elif isinstance(record, SessionImported):
                row = self.row(record.incarnation)
                if row is not None and row.staged:
                    view.delete_row(txn, row.session_id)
                    view.put_incarnation(txn, row.incarnation, record.session_id)
                    row.session_id = record.session_id
                    row.staged = False
                    row.owner_pid = 0
                    row.owner_start_time = 0
                    row.owner_host = ""
                    row.owner_boot_id = ""
                    row.name_position = position
                    self._pin(position, row.incarnation)
                    self._feed(position, LifecycleEventType.CREATED, record.at_ms, row)
                    # Its events may lie in segments a pass covered while it was staged.
                    view.retention.uncover(txn, row.incarnation)
                elif row is None:
                    self.unknown_change = position
            elif isinstance(record, StateChanged):
                row = self.row(record.incarnation)
                if row is not None:
                    state = SessionState.from_wire(record.state)
                    row.state = record.state
                    if row.lifecycle_position != row.incarnation:
                        self._unpin(row.lifecycle_position)
                    row.lifecycle_position = position
                    self._pin(position, row.incarnation)
                    row.suspended_at_ms = record.at_ms if state is SessionState.SUSPENDED else None
                    if state.terminal:
                        row.ended_at_ms = record.at_ms
                    self._feed(position, lifecycle_event_of(state), record.at_ms, row)
                else:
                    self.unknown_change = position
            elif isinstance(record, IdempotencyKeyUsed):
                row = self.row(record.incarnation)
                if row is not None:
                    view.put_idem(
                        txn,
                        record.incarnation,
                        record.key,
                        IdemEntry(
                            record.first_ordinal,
                            record.last_ordinal,
                            record.digest,
                            record.last_position,
                            position,
                        ),
                    )
                    self._pin(position, record.incarnation)
            elif isinstance(record, HistoryTrimmed):
                row = self.row(record.incarnation)
                if row is not None:
                    if row.trim_position:
                        self._unpin(row.trim_position)
                    row.trim_position = position
                    self._pin(position, row.incarnation)
                    self._recorded_start(row.incarnation, record.first_ordinal)
                    if record.first_ordinal - 1 > row.last_ordinal:  # (dropped events)
                        self._turn_gaps.add(row.incarnation)
                        row.last_ordinal = record.first_ordinal - 1
                    if record.first_ordinal > row.first_ordinal:
                        row.first_ordinal = record.first_ordinal
                        self._trim(row)
            elif isinstance(record, SnapshotTaken):
                row = self.row(record.incarnation)
                if row is not None:
                    if row.snapshot_position:
                        self._unpin(row.snapshot_position)
                    row.snapshot_ordinal = record.through_ordinal
                    self._recorded_start(row.incarnation, record.through_ordinal + 1)
                    row.snapshot_position = position
                    row.snapshot_segment = info.segment
                    row.snapshot_offset = info.offset
                    self._pin(position, row.incarnation)
                    if record.through_ordinal > row.last_ordinal:  # (dropped events)
                        self._turn_gaps.add(row.incarnation)
                        row.last_ordinal = record.through_ordinal
                    if record.through_ordinal + 1 > row.first_ordinal:
                        row.first_ordinal = record.through_ordinal + 1
                        self._trim(row)
            elif isinstance(record, CheckpointTaken):
                row = self.row(record.incarnation)
                # (A rebuild may meet one that history left behind: it stays unused.)
                if (
                    row is not None
                    and record.through_ordinal >= row.checkpoint_ordinal
                    and record.through_ordinal >= row.first_ordinal - 1
                ):
                    if row.checkpoint_position:
                        self._unpin(row.checkpoint_position)
                    row.checkpoint_ordinal = record.through_ordinal
                    row.checkpoint_position = position
                    row.checkpoint_segment = info.segment
                    row.checkpoint_offset = info.offset
                    self._pin(position, row.incarnation)
            elif isinstance(record, OwnerAcquired):
                row = self.row(record.incarnation)
                if row is not None:
                    self._owner_record(row, position)
                    row.owner_generation = max(row.owner_generation, record.generation)
                    row.owner_pid = record.pid
                    row.owner_start_time = record.start_time
                    row.owner_host = record.host
                    row.owner_boot_id = record.boot_id
                    row.owner_since_ms = record.at_ms
            elif isinstance(record, OwnerReleased):
                row = self.row(record.incarnation)
                # >=: after compaction the release may be all that is left of a lease.
                if row is not None and record.generation >= row.owner_generation:
                    self._owner_record(row, position)
                    row.owner_generation = record.generation
                    row.owner_pid = 0
                    row.owner_start_time = 0
                    row.owner_host = ""
                    row.owner_boot_id = ""
                    row.owner_since_ms = 0
            elif isinstance(record, SessionEvicted):
                row = self.row(record.incarnation)
                if row is not None:
                    if not SessionState.from_wire(row.state).terminal:
                        self.unknown_change = position  # (its end record left the log)
                    del self.rows[record.incarnation]
                    self._evicted[record.incarnation] = row
                    self._drop_session(row)
                    self._feed(position, LifecycleEventType.EVICTED, record.at_ms, row)
                    # Kept while the creation record may survive somewhere: a rebuild must
                    # not bring the session back.
                    self._pin(position, record.incarnation)
                    view.put_tombstone(txn, record.incarnation, position)
                    view.forget_missing(txn, record.incarnation)
                else:
                    self.unknown_change = position
            position += 1

    def _turn_event(self, row: SessionRow, record: EventAppended, position: int) -> None:
        """Turn events are never in runs (see `sidecar.FrameDigest`): every path sees
        them. The latest turn event of a session is pinned, like its latest owner record:
        a rebuild after retention or compaction then knows whether its last turn settled
        (a lone `turn_started` without its result would make one up)."""
        if row.turn_position:
            self._unpin(row.turn_position)
        row.turn_position = position
        self._pin(position, row.incarnation)
        open_turn = row.turn_request_id
        if row.incarnation in self._turn_gaps:
            # Turn events before this one were dropped with the gap (only the latest is
            # pinned): an older turn's surviving start says nothing. A turn's result is
            # written only while it is the open turn, so this event alone tells.
            self._turn_gaps.discard(row.incarnation)
            open_turn = record.request_id
        row.turn_request_id = open_turn_after(open_turn, record.type, record.request_id)

    def _owner_record(self, row: SessionRow, position: int) -> None:
        """The latest owner record is pinned (a rebuild must know the generation)."""
        if row.owner_position:
            self._unpin(row.owner_position)
        row.owner_position = position
        self._pin(position, row.incarnation)

    def _pin(self, position: int, incarnation: int) -> None:
        self.view.pin(self.txn, position, incarnation)

    def _unpin(self, position: int) -> None:
        self.view.unpin(self.txn, position)

    def _gap(self, row: SessionRow, first: int, segment: int, frame_offset: int) -> None:
        """The log holds no events of `row` between its last and `first`: retention or
        compaction dropped them (a trim or snapshot record says so), or a file was lost.
        What came before is not retained."""
        self._gaps[row.incarnation] = (row.last_ordinal + 1, first - 1, segment, frame_offset)
        row.first_ordinal = max(row.first_ordinal, first)
        self._trim(row)
        self._turn_gaps.add(row.incarnation)

    def _recorded_start(self, incarnation: int, first_ordinal: int) -> None:
        """A trim or snapshot record starts the session at `first_ordinal`: it accounts
        for lost events below it (`View.put_missing`), which reads refuse no more."""
        self._starts[incarnation] = max(self._starts.get(incarnation, 1), first_ordinal)
        missing = self.view.missing(self.txn, incarnation)
        if missing is not None and first_ordinal > missing.last:
            self.view.forget_missing(self.txn, incarnation)

    def unaccounted_gaps(self) -> list[MissingEvents]:
        """The runs of events of live sessions that the log lacks although no record of it
        trims, snapshots or evicts them (a segment file was lost), after projecting the
        whole log (a rebuild). Each such session's retained range is set back to start
        where the log's records say, not after the loss: reads from there up to the loss
        need the lost events, and are refused (`View.put_missing`), where one from past
        them goes on."""
        found = []
        for incarnation, (first, last, segment, offset) in sorted(self._gaps.items()):
            start = self._starts.get(incarnation, 1)
            row = self.row(incarnation)
            if row is None or row.staged or last < start:
                continue  # (evicted, an import's staging, or trimmed: accounted for)
            row.first_ordinal = start
            found.append(
                MissingEvents(row.session_id, incarnation, max(first, start), last, segment, offset)
            )
        return found

    def _trim(self, row: SessionRow) -> None:
        """Drop what fell below `first_ordinal`: index entries of frames wholly below it
        and idempotency keys of appends wholly below it."""
        txn = self.txn
        view = self.view
        # Entries of frames starting at or below first_ordinal.
        below = view.events.locations(txn, row.incarnation, up_to_ordinal=row.first_ordinal)
        everything = row.last_ordinal < row.first_ordinal
        # The last frame starting at or below first_ordinal still holds it (unless nothing
        # is retained at all): every earlier frame is wholly below it.
        doomed = below if everything else below[:-1]
        for location in doomed:
            view.events.delete(txn, row.incarnation, location.first_ordinal)
        if everything:
            row.retained_bytes = 0
        elif below:
            row.retained_bytes = max(0, row.appended_bytes - below[-1].bytes_before)
        if row.checkpoint_position and row.checkpoint_ordinal < row.first_ordinal - 1:
            # The events after it are gone: it can never be used again.
            self._unpin(row.checkpoint_position)
            row.checkpoint_ordinal = row.checkpoint_position = 0
            row.checkpoint_segment = row.checkpoint_offset = 0
        for key, entry in view.idem_entries(txn, row.incarnation):
            if entry.last_ordinal < row.first_ordinal:
                view.delete_idem(txn, row.incarnation, key)
                if entry.position:
                    self._unpin(entry.position)

    def _drop_session(self, row: SessionRow) -> None:
        """An evicted session: remove its row, index entries, keys and pins (its
        incarnation -> id entry stays, so old page tokens still resolve)."""
        txn = self.txn
        view = self.view
        view.delete_row(txn, row.session_id)
        view.retention.drop_aged(txn, row.incarnation)
        for location in view.events.locations(txn, row.incarnation):
            view.events.delete(txn, row.incarnation, location.first_ordinal)
        for key, entry in view.idem_entries(txn, row.incarnation):
            view.delete_idem(txn, row.incarnation, key)
            if entry.position:
                self._unpin(entry.position)
        for position in (
            row.incarnation,
            row.lifecycle_position,
            row.snapshot_position,
            row.trim_position,
            row.owner_position,
            row.turn_position,
            row.name_position,
            row.checkpoint_position,
        ):
            if position:
                self._unpin(position)

    def _feed(self, position: int, event: LifecycleEventType, at_ms: int, row: SessionRow) -> None:
        if row.staged:
            return  # an import being written has no lifecycle yet
        # The row is encoded now: later records in this frame must not change this entry.
        self.view.put_feed(self.txn, position, FeedEntry(event.value, at_ms, row))
        self.head.lifecycle_position = position

    def touched(self) -> set[int]:
        """The incarnations of the sessions this projection read or changed (a superset of
        those its frames touched): whose followers a commit wakes."""
        return self.rows.keys() | self._evicted.keys()

    def flush(self) -> None:
        txn = self.txn
        view = self.view
        states = view.states
        for incarnation in self._evicted:
            old = self._old_deadlines.get(incarnation)
            if old is not None:
                view.delete_deadline(txn, old, incarnation)
            gone = self._listed.pop(incarnation, None)
            if gone is not None:
                states.delete(txn, *gone)
        for incarnation, row in self.rows.items():
            view.put_row(txn, row)
            # The state index changes with the row, in this transaction (a state change,
            # a new session, an import's rename).
            was = self._listed.get(incarnation)
            listed = None if row.staged else (row.state, row.session_id)
            if listed != was:
                if was is not None:
                    states.delete(txn, *was)
                if listed is None:
                    del self._listed[incarnation]
                else:
                    states.put(txn, *listed, incarnation)
                    self._listed[incarnation] = listed
            old = self._old_deadlines.get(incarnation)
            new = row.deadline()
            if old != new:
                if old is not None:
                    view.delete_deadline(txn, old, incarnation)
                if new is not None:
                    view.put_deadline(txn, new, incarnation)
                    if self.nearest_new_deadline is None or new < self.nearest_new_deadline:
                        self.nearest_new_deadline = new
            self._old_deadlines[incarnation] = new
        self._evicted.clear()
        view.put_head(txn, self.head)


def project_segments(
    log: SegmentLog,
    projection: Projection,
    until: Head | None = None,
    known_zeros: KnownZeros | None = None,
    listed: list[int] | None = None,
) -> list[int]:
    """Apply every frame after `projection.head` (across segments) to the projection;
    with `until`, only the frames before its next position (a view as of that head);
    `known_zeros` only from the holder of the write lock (`segments.KnownZeros`).

    The one loop behind a writer's catch-up, a rebuild and a read-only refresh. Positions
    never go backwards; sealed segments may have gaps (retention deletes dead segments,
    compaction drops dead frames), the active segment is dense. Returns the bases of the
    sealed segments visited (a writer checks their sidecars). Does not flush. `listed`:
    the segments' bases as the caller listed them just before (else listed here).
    """
    head = projection.head
    bases = [b for b in (log.bases() if listed is None else listed) if b >= head.segment]
    if not bases:
        raise JournalCorrupt(
            segment_name(head.segment), 0, "the active segment indexed by the view is missing"
        )
    start_segment, start_offset = head.segment, head.end_offset
    for i, base in enumerate(bases):
        last = i == len(bases) - 1
        if until is not None and base != start_segment and base > until.segment:
            break  # (one after the view's: it may be empty, the frames before it dropped)
        if base != start_segment:
            if base < head.next_position:
                raise JournalCorrupt(
                    segment_name(base),
                    0,
                    f"segment starts at position {base}, expected {head.next_position}",
                )
            head.segment = base
            head.end_offset = SEGMENT_HEADER_SIZE
            head.next_position = base
        start = start_offset if base == start_segment else SEGMENT_HEADER_SIZE
        zeros = known_zeros if last else None
        log.ops.point("projection.segment", base)
        with SegmentReader(log.directory, base, log.ops, zeros) as reader:
            frames = reader.frames(start, tail=last)
            for info, body in active_frames(frames, base, log.directory) if last else frames:
                if until is not None and info.first_position >= until.next_position:
                    break
                expected = head.next_position
                if info.first_position < expected or (last and info.first_position != expected):
                    raise JournalCorrupt(
                        reader.name,
                        info.offset,
                        f"frame starts at position {info.first_position}, expected {expected}",
                    )
                records = frame_records(reader.name, info, body, decode_frame_body)
                try:
                    projection.apply(info, records)
                except (struct.error, OverflowError):
                    # A checksummed record holding a number no view key can (a negative
                    # ordinal or incarnation, one past 2^64): damage, not a crash.
                    raise JournalCorrupt(
                        reader.name, info.offset, "a record holds a number out of range"
                    ) from None
    return bases[:-1]


def project_log(
    log: SegmentLog,
    view: View,
    txn: lmdb.Transaction,
    *,
    use_sidecars: bool = True,
    until: Head | None = None,
    record_floor: bool = False,
    missing: list[MissingEvents] | None = None,
) -> Head:
    """Project the whole log into an empty view (a rebuild); returns the head. With
    `until` (and without sidecars), the log as it was at that head. With `record_floor`
    (a writer), a feed floor the log had no record of is recorded in it. Events of live
    sessions the log lacks unaccounted for (`Projection.unaccounted_gaps`) are recorded
    in the view (reads refuse them), and go in `missing`, or without it are logged.

    With `use_sidecars`, sealed segments whose sidecar carries their records (format 2)
    are projected from it without being read; the rest, and the active segment, are read.
    """
    bases = log.bases()
    first = bases[0] if bases else 1
    projection = Projection(view, txn, Head(first, SEGMENT_HEADER_SIZE, first, 0), log.ops)
    if use_sidecars:
        for base in bases[:-1]:
            summary = read_summary(log.directory, base)
            if summary is None or summary.format < SUMMARY_FORMAT:
                break
            projection.apply_summary(summary)
            projection.head.segment = base
        else:
            if bases and projection.head.segment != bases[-1]:
                projection.head.segment = bases[-1]
                projection.head.end_offset = SEGMENT_HEADER_SIZE
                projection.head.next_position = max(projection.head.next_position, bases[-1])
    if bases:
        project_segments(log, projection, until)
    gaps = projection.unaccounted_gaps()
    projection.flush()
    for gap in gaps:
        view.put_missing(txn, gap)
    if missing is not None:
        missing += gaps
    else:
        log_missing(log, gaps)
    # The feed of a rebuilt view lacks the entries of every lifecycle record the log no
    # longer holds: the log records the highest a view pruned; a log from before it did
    # is judged by what it lacks at all (conservative: any record may have been one).
    # Nor can it make those of the changes of sessions whose creation record is gone, or
    # the eviction of one whose end record is: the live view keeps them until their own
    # records go, so cursors from before them expire here rather than skip (SPEC 7.7).
    recorded = log.feed_floor()
    floor = _highest_missing(log, bases) if recorded is None else recorded
    floor = max(floor, projection.unknown_change)
    if record_floor and floor != recorded:
        log.record_feed_floor(floor)
    view.raise_feed_floor(txn, floor)
    return projection.head


def log_missing(log: SegmentLog, gaps: list[MissingEvents]) -> None:
    """Say on the `journal` logger what a rebuild at open found missing (SPEC 9)."""
    for gap in gaps:
        _log.error(
            "%s (store %s): reads of the session from before event %d raise "
            "JournalCorrupt; restore the file from a backup and run `journal verify --fix`, "
            "or accept the loss with `journal verify --fix`",
            gap.describe(),
            os.path.dirname(log.directory),
            gap.last + 1,
        )


def _highest_missing(log: SegmentLog, bases: list[int]) -> int:
    """The highest position below the active segment that no frame of the log holds
    (retention deleted its segment, or compaction its frame), 0 when there is none."""
    if not bases:
        return 0
    highest = bases[0] - 1
    for base, next_base in pairwise(bases):
        try:
            summary = read_summary(log.directory, base) or summarize_segment(
                log.directory, base, log.ops
            )
        except FileNotFoundError:
            highest = next_base - 1  # deleted meanwhile by a writer's retention pass
            continue
        expected = base
        for _, first, count in summary.frames:
            if first > expected:
                highest = first - 1
            expected = first + count
        if next_base > expected:
            highest = next_base - 1
    return highest
