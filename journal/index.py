"""The LMDB view: a materialised projection of the segment log, rebuildable from it.

Nothing here is the truth: every entry is derived from records in the segments by
`Projection`, the one code path used both when a writer commits and when a writer catches
up with frames it has not indexed (another process's, or a crashed writer's). LMDB's own
fsync is off because the view can always be rebuilt; the segment fsync is the commit point.

Named databases (keys big-endian so LMDB's byte order is numeric order):

    meta         b"head" -> Head; b"store" -> store id; b"boot" -> boot id of the last writer
    sessions     session id (utf-8) -> SessionRow
    incarnations u64 incarnation -> session id (kept after eviction: page tokens resolve it)
    events       u64 incarnation + u64 first ordinal in a frame -> u64 segment, u64 offset,
                 u64 session bytes appended before the frame, u64 frame time (ms)
    idem         u64 incarnation + key (utf-8) -> IdemEntry
    feed         u64 position of a lifecycle record -> FeedEntry
    deadlines    u64 due ms + u64 incarnation -> b""  (TTL and suspension caps)
    pins         u64 position -> u64 incarnation: non-event records that must survive
                 compaction (a live session's creation, last transition, snapshot, trim
                 and idempotency records; an eviction record while its session's
                 creation record may still exist)
    tombstones   u64 incarnation -> u64 position of its eviction record
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Final

import lmdb
import msgspec

from .models import LifecycleEventType, SessionState
from .records import (
    EventAppended,
    HistoryTrimmed,
    IdempotencyKeyUsed,
    Record,
    SessionCreated,
    SessionEvicted,
    SnapshotTaken,
    StateChanged,
    decode_record,
)
from .segments import FrameInfo, SegmentSummary

__all__ = [
    "DEFAULT_MAX_SUSPEND_MS",
    "FeedEntry",
    "Head",
    "IdemEntry",
    "Projection",
    "SessionRow",
    "View",
]

DEFAULT_MAX_SUSPEND_MS: Final = 7 * 24 * 3600 * 1000
_INITIAL_MAP_SIZE: Final = 1 << 36

U64: Final = struct.Struct(">Q")
U64X2: Final = struct.Struct(">QQ")
# events value: segment, frame offset, session bytes appended before the frame, frame time
LOCATION: Final = struct.Struct(">QQQQ")


class SessionRow(msgspec.Struct, array_like=True):
    """A session's registry entry in the view (mutable while a projection updates it)."""

    session_id: str
    incarnation: int
    state: int
    mode: str
    context_id: str | None
    tags: dict[str, str]
    extensions: dict[str, bytes]
    created_at_ms: int
    ended_at_ms: int | None
    first_ordinal: int
    last_ordinal: int
    ttl_ms: int | None
    max_suspend_ms: int
    suspended_at_ms: int | None
    lifecycle_position: int
    last_event_position: int = 0
    retained_bytes: int = 0
    snapshot_ordinal: int = 0
    snapshot_position: int = 0
    max_history_bytes: int | None = None
    max_history_age_ms: int | None = None
    appended_bytes: int = 0
    trim_position: int = 0
    snapshot_segment: int = 0
    snapshot_offset: int = 0

    @classmethod
    def created(cls, record: SessionCreated, incarnation: int) -> SessionRow:
        """The row of a session just created by `record` (at position `incarnation`)."""
        return cls(
            session_id=record.session_id,
            incarnation=incarnation,
            state=SessionState.OPEN.wire,
            mode=record.mode,
            context_id=record.context_id,
            tags=dict(record.tags),
            extensions=dict(record.extensions),
            created_at_ms=record.created_at_ms,
            ended_at_ms=None,
            first_ordinal=1,
            last_ordinal=0,
            ttl_ms=record.ttl_ms,
            max_suspend_ms=record.max_suspend_ms,
            suspended_at_ms=None,
            lifecycle_position=incarnation,
            max_history_bytes=record.max_history_bytes,
            max_history_age_ms=record.max_history_age_ms,
        )

    @property
    def session_state(self) -> SessionState:
        return SessionState.from_wire(self.state)

    def deadline(self) -> int | None:
        """When `expire_due` must expire this session, or None."""
        state = self.session_state
        if state.terminal:
            return None
        due: list[int] = []
        if self.ttl_ms is not None:
            due.append(self.created_at_ms + self.ttl_ms)
        if state is SessionState.SUSPENDED and self.suspended_at_ms is not None:
            due.append(self.suspended_at_ms + (self.max_suspend_ms or DEFAULT_MAX_SUSPEND_MS))
        return min(due) if due else None


class Head(msgspec.Struct, array_like=True):
    """How far the view has indexed the log: the active segment and the end of its last
    indexed frame, the next position to assign, and the last lifecycle record's position."""

    segment: int
    end_offset: int
    next_position: int
    lifecycle_position: int = 0


class FeedEntry(msgspec.Struct, array_like=True):
    """One lifecycle-feed entry: what happened and the session's row right after."""

    event_type: str
    at_ms: int
    row: SessionRow


class IdemEntry(msgspec.Struct, array_like=True):
    first_ordinal: int
    last_ordinal: int
    digest: bytes
    last_position: int = 0
    position: int = 0


_encoder: Final = msgspec.msgpack.Encoder()
_row_decoder: Final = msgspec.msgpack.Decoder(SessionRow)
_head_decoder: Final = msgspec.msgpack.Decoder(Head)
_feed_decoder: Final = msgspec.msgpack.Decoder(FeedEntry)
_idem_decoder: Final = msgspec.msgpack.Decoder(IdemEntry)


class View:
    """The LMDB environment and its named databases."""

    def __init__(self, path: str, *, readonly: bool = False) -> None:
        self.readonly = readonly
        self.env = lmdb.open(
            path,
            map_size=_INITIAL_MAP_SIZE,
            max_dbs=16,
            max_readers=1024,
            sync=False,
            metasync=False,
            readahead=False,
            readonly=readonly,
            lock=True,
            subdir=True,
        )
        names = (
            b"meta",
            b"sessions",
            b"incarnations",
            b"events",
            b"idem",
            b"feed",
            b"deadlines",
            b"pins",
            b"tombstones",
        )
        if readonly:
            # Handles opened inside a read transaction die with it: let LMDB open them in
            # its own (committed) transaction instead.
            handles = [self.env.open_db(name, create=False) for name in names]
        else:
            with self.env.begin(write=True) as txn:
                handles = [self.env.open_db(name, txn=txn, create=True) for name in names]
        self._handles = handles
        (
            self.meta,
            self.sessions,
            self.incarnations,
            self.events,
            self.idem,
            self.feed,
            self.deadlines,
            self.pins,
            self.tombstones,
        ) = handles

    def close(self) -> None:
        self.env.close()

    def all_dbs(self) -> list[lmdb._Database]:
        return list(self._handles)

    # -- reads (any transaction) ---------------------------------------------------------

    def head(self, txn: lmdb.Transaction) -> Head | None:
        raw = txn.get(b"head", db=self.meta)
        return None if raw is None else _head_decoder.decode(raw)

    def put_head(self, txn: lmdb.Transaction, head: Head) -> None:
        txn.put(b"head", _encoder.encode(head), db=self.meta)

    def row(self, txn: lmdb.Transaction, session_id: str) -> SessionRow | None:
        raw = txn.get(session_id.encode(), db=self.sessions)
        return None if raw is None else _row_decoder.decode(raw)

    def session_id_of(self, txn: lmdb.Transaction, incarnation: int) -> str | None:
        raw = txn.get(U64.pack(incarnation), db=self.incarnations)
        return None if raw is None else bytes(raw).decode()

    def row_by_incarnation(self, txn: lmdb.Transaction, incarnation: int) -> SessionRow | None:
        session_id = self.session_id_of(txn, incarnation)
        if session_id is None:
            return None
        row = self.row(txn, session_id)
        return row if row is not None and row.incarnation == incarnation else None

    def idem_entry(self, txn: lmdb.Transaction, incarnation: int, key: str) -> IdemEntry | None:
        raw = txn.get(U64.pack(incarnation) + key.encode(), db=self.idem)
        return None if raw is None else _idem_decoder.decode(raw)

    def iter_frame_locations(
        self, txn: lmdb.Transaction, incarnation: int, from_ordinal: int
    ) -> Iterator[tuple[int, int, int]]:
        """(first ordinal, segment, offset) of each frame holding the session's events,
        starting with the frame that holds `from_ordinal`, in ordinal order."""
        cursor = txn.cursor(db=self.events)
        prefix = U64.pack(incarnation)
        target = U64X2.pack(incarnation, from_ordinal)
        if cursor.set_range(target):
            if cursor.key() != target:
                # The frame holding from_ordinal starts before it: step back to it.
                if cursor.prev():
                    if cursor.key()[:8] != prefix:
                        cursor.next()
                else:
                    cursor.first()
        elif not cursor.last():
            return
        while True:
            key = cursor.key()
            if key[:8] != prefix:
                return
            _, first_ordinal = U64X2.unpack(key)
            segment, offset, _, _ = LOCATION.unpack(cursor.value())
            yield first_ordinal, segment, offset
            if not cursor.next():
                return

    @staticmethod
    def decode_feed(raw: bytes) -> FeedEntry:
        return _feed_decoder.decode(raw)

    @staticmethod
    def decode_row(raw: bytes) -> SessionRow:
        return _row_decoder.decode(raw)


_TRANSITION_EVENTS: Final = {
    SessionState.SUSPENDED: LifecycleEventType.SUSPENDED,
    SessionState.RESOLVED: LifecycleEventType.RESOLVED,
    SessionState.EXPIRED: LifecycleEventType.EXPIRED,
    SessionState.CANCELLED: LifecycleEventType.CANCELLED,
}


class Projection:
    """Applies committed frames to the view inside one write transaction.

    Rows touched by a frame are cached and written back by `flush()`; the same instance may
    apply many frames (catch-up, rebuild) before flushing. The projection tolerates a log
    whose dead records were compacted away: a session's first surviving event starts its
    retained range, and trim or snapshot records raise `first_ordinal` whenever they come.
    """

    def __init__(self, view: View, txn: lmdb.Transaction, head: Head) -> None:
        self.view = view
        self.txn = txn
        self.head = head
        self.rows: dict[int, SessionRow] = {}
        self._old_deadlines: dict[int, int | None] = {}
        self._evicted: dict[int, SessionRow] = {}

    def adopt(self, row: SessionRow) -> None:
        """Use a row read from this very transaction instead of reading it again."""
        if row.incarnation not in self.rows:
            self.rows[row.incarnation] = row
            self._old_deadlines[row.incarnation] = row.deadline()

    def row(self, incarnation: int) -> SessionRow | None:
        row = self.rows.get(incarnation)
        if row is None:
            row = self.view.row_by_incarnation(self.txn, incarnation)
            if row is None:
                return None
            self.rows[incarnation] = row
            self._old_deadlines[incarnation] = row.deadline()
        return row

    def apply(
        self,
        info: FrameInfo,
        records: list[Record],
        runs: Sequence[tuple[int, int, int, int, int]] = (),
    ) -> None:
        """Project one committed frame. `runs` (from the writer that planned the frame) are
        (start index, count, incarnation, first ordinal, data bytes) of consecutive event
        records of one session, applied in O(1) each; without runs (catch-up, rebuild)
        every record is applied one by one, with the same result."""
        indexed: set[int] = set()
        at = 0
        for start, count, incarnation, first_ordinal, data_bytes in runs:
            if start > at:
                self._apply_records(info, records, at, start, indexed)
            record = records[start]
            timestamp = record.timestamp_ms if isinstance(record, EventAppended) else 0
            if not self._apply_run(
                incarnation,
                first_ordinal,
                count,
                info.first_position + start,
                data_bytes,
                info.segment,
                info.offset,
                timestamp,
                incarnation not in indexed,
            ):
                self._apply_records(info, records, start, start + count, indexed)
            indexed.add(incarnation)
            at = start + count
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
            (run[0], 0, i) for i, run in enumerate(summary.event_runs)
        ]
        items += [(other[0], 1, i) for i, other in enumerate(summary.others)]
        items.sort()
        indexed: set[tuple[int, int]] = set()
        for position, kind, i in items:
            if kind == 1:
                _, frame_offset, encoded = summary.others[i]
                info = FrameInfo(segment, frame_offset, position, 1, 0)
                self._apply_records(info, [decode_record(encoded)], 0, 1, set())
                continue
            _, incarnation, first, count, frame_offset, size, at = summary.event_runs[i]
            self._apply_run(
                incarnation,
                first,
                count,
                position,
                size,
                segment,
                frame_offset,
                at,
                (frame_offset, incarnation) not in indexed,
            )
            indexed.add((frame_offset, incarnation))
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
            # Only a compacted log has gaps: what came before is not retained.
            row.first_ordinal = max(row.first_ordinal, first)
            self._trim(row)
        if first_in_frame:
            self.txn.put(
                U64X2.pack(incarnation, first),
                LOCATION.pack(segment, frame_offset, row.appended_bytes, timestamp),
                db=self.view.events,
            )
        row.last_ordinal = first + count - 1
        row.last_event_position = position + count - 1
        row.appended_bytes += size
        row.retained_bytes += size
        return True

    def _index_frame(self, row: SessionRow, ordinal: int, info: FrameInfo, record: Record) -> None:
        timestamp = record.timestamp_ms if isinstance(record, EventAppended) else 0
        self.txn.put(
            U64X2.pack(row.incarnation, ordinal),
            LOCATION.pack(info.segment, info.offset, row.appended_bytes, timestamp),
            db=self.view.events,
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
                        # Only a compacted log has gaps: what came before is not retained.
                        row.first_ordinal = max(row.first_ordinal, record.ordinal)
                        self._trim(row)
                    if current not in indexed:
                        indexed.add(current)
                        self._index_frame(row, record.ordinal, info, record)
                    row.last_ordinal = record.ordinal
                    row.last_event_position = position
                    row.appended_bytes += len(record.data)
                    row.retained_bytes += len(record.data)
                position += 1
                continue
            current = -1
            if isinstance(record, SessionCreated):
                row = SessionRow.created(record, position)
                self.rows[position] = row
                self._old_deadlines[position] = None
                txn.put(U64.pack(position), record.session_id.encode(), db=view.incarnations)
                self._pin(position, position)
                self._feed(position, LifecycleEventType.CREATED, record.created_at_ms, row)
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
                    event = (
                        LifecycleEventType.RESUMED
                        if state is SessionState.OPEN
                        else _TRANSITION_EVENTS[state]
                    )
                    self._feed(position, event, record.at_ms, row)
            elif isinstance(record, IdempotencyKeyUsed):
                row = self.row(record.incarnation)
                if row is not None:
                    txn.put(
                        U64.pack(record.incarnation) + record.key.encode(),
                        _encoder.encode(
                            IdemEntry(
                                record.first_ordinal,
                                record.last_ordinal,
                                record.digest,
                                record.last_position,
                                position,
                            )
                        ),
                        db=view.idem,
                    )
                    self._pin(position, record.incarnation)
            elif isinstance(record, HistoryTrimmed):
                row = self.row(record.incarnation)
                if row is not None:
                    if row.trim_position:
                        self._unpin(row.trim_position)
                    row.trim_position = position
                    self._pin(position, row.incarnation)
                    row.last_ordinal = max(row.last_ordinal, record.first_ordinal - 1)
                    if record.first_ordinal > row.first_ordinal:
                        row.first_ordinal = record.first_ordinal
                        self._trim(row)
            elif isinstance(record, SnapshotTaken):
                row = self.row(record.incarnation)
                if row is not None:
                    if row.snapshot_position:
                        self._unpin(row.snapshot_position)
                    row.snapshot_ordinal = record.through_ordinal
                    row.snapshot_position = position
                    row.snapshot_segment = info.segment
                    row.snapshot_offset = info.offset
                    self._pin(position, row.incarnation)
                    row.last_ordinal = max(row.last_ordinal, record.through_ordinal)
                    if record.through_ordinal + 1 > row.first_ordinal:
                        row.first_ordinal = record.through_ordinal + 1
                        self._trim(row)
            elif isinstance(record, SessionEvicted):
                row = self.row(record.incarnation)
                if row is not None:
                    del self.rows[record.incarnation]
                    self._evicted[record.incarnation] = row
                    self._drop_session(row)
                    self._feed(position, LifecycleEventType.EVICTED, record.at_ms, row)
                    # Kept while the creation record may survive somewhere: a rebuild must
                    # not bring the session back.
                    self._pin(position, record.incarnation)
                    txn.put(U64.pack(record.incarnation), U64.pack(position), db=view.tombstones)
            position += 1

    def _pin(self, position: int, incarnation: int) -> None:
        self.txn.put(U64.pack(position), U64.pack(incarnation), db=self.view.pins)

    def _unpin(self, position: int) -> None:
        self.txn.delete(U64.pack(position), db=self.view.pins)

    def _trim(self, row: SessionRow) -> None:
        """Drop what fell below `first_ordinal`: index entries of frames wholly below it
        and idempotency keys of appends wholly below it."""
        txn = self.txn
        view = self.view
        prefix = U64.pack(row.incarnation)
        cursor = txn.cursor(db=view.events)
        below: list[tuple[bytes, int]] = []  # entries of frames starting at or below first
        if cursor.set_range(prefix):
            while cursor.key()[:8] == prefix:
                key = bytes(cursor.key())
                if U64X2.unpack(key)[1] > row.first_ordinal:
                    break
                below.append((key, LOCATION.unpack(cursor.value())[2]))
                if not cursor.next():
                    break
        everything = row.last_ordinal < row.first_ordinal
        # The last frame starting at or below first_ordinal still holds it (unless nothing
        # is retained at all): every earlier frame is wholly below it.
        doomed = below if everything else below[:-1]
        for key, _ in doomed:
            txn.delete(key, db=view.events)
        if everything:
            row.retained_bytes = 0
        elif below:
            row.retained_bytes = max(0, row.appended_bytes - below[-1][1])
        cursor = txn.cursor(db=view.idem)
        stale: list[tuple[bytes, int]] = []
        if cursor.set_range(prefix):
            while cursor.key()[:8] == prefix:
                entry = _idem_decoder.decode(cursor.value())
                if entry.last_ordinal < row.first_ordinal:
                    stale.append((bytes(cursor.key()), entry.position))
                if not cursor.next():
                    break
        for key, position in stale:
            txn.delete(key, db=view.idem)
            if position:
                self._unpin(position)

    def _drop_session(self, row: SessionRow) -> None:
        """An evicted session: remove its row, index entries, keys and pins (its
        incarnation -> id entry stays, so old page tokens still resolve)."""
        txn = self.txn
        view = self.view
        txn.delete(row.session_id.encode(), db=view.sessions)
        prefix = U64.pack(row.incarnation)
        for db in (view.events, view.idem):
            cursor = txn.cursor(db=db)
            keys: list[bytes] = []
            if cursor.set_range(prefix):
                while cursor.key()[:8] == prefix:
                    keys.append(bytes(cursor.key()))
                    if db is view.idem:
                        position = _idem_decoder.decode(cursor.value()).position
                        if position:
                            self._unpin(position)
                    if not cursor.next():
                        break
            for key in keys:
                txn.delete(key, db=db)
        for position in (
            row.incarnation,
            row.lifecycle_position,
            row.snapshot_position,
            row.trim_position,
        ):
            if position:
                self._unpin(position)

    def _feed(self, position: int, event: LifecycleEventType, at_ms: int, row: SessionRow) -> None:
        # The row is encoded now: later records in this frame must not change this entry.
        self.txn.put(
            U64.pack(position),
            _encoder.encode(FeedEntry(event.value, at_ms, row)),
            db=self.view.feed,
        )
        self.head.lifecycle_position = position

    def flush(self) -> None:
        txn = self.txn
        view = self.view
        for incarnation in self._evicted:
            old = self._old_deadlines.get(incarnation)
            if old is not None:
                txn.delete(U64X2.pack(old, incarnation), db=view.deadlines)
        for incarnation, row in self.rows.items():
            txn.put(row.session_id.encode(), _encoder.encode(row), db=view.sessions)
            old = self._old_deadlines.get(incarnation)
            new = row.deadline()
            if old != new:
                if old is not None:
                    txn.delete(U64X2.pack(old, incarnation), db=view.deadlines)
                if new is not None:
                    txn.put(U64X2.pack(new, incarnation), b"", db=view.deadlines)
            self._old_deadlines[incarnation] = new
        self._evicted.clear()
        view.put_head(txn, self.head)
