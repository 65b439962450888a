"""The LMDB view: a materialised projection of the segment log, rebuildable from it.

Nothing here is the truth: every entry is derived from records in the segments by
`Projection`, the one code path used both when a writer commits and when a writer catches
up with frames it has not indexed (another process's, or a crashed writer's). LMDB's own
fsync is off because the view can always be rebuilt; the segment fsync is the commit point.

Named databases (keys big-endian so LMDB's byte order is numeric order):

    meta         b"head" -> Head; b"store" -> store id; b"boot" -> boot id of the last writer
    sessions     session id (utf-8) -> SessionRow
    incarnations u64 incarnation -> session id (kept after eviction: page tokens resolve it)
    events       u64 incarnation + u64 first ordinal in a frame -> u64 segment, u64 offset
    idem         u64 incarnation + key (utf-8) -> IdemEntry
    feed         u64 position of a lifecycle record -> FeedEntry
    deadlines    u64 due ms + u64 incarnation -> b""  (TTL and suspension caps)
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
)
from .segments import FrameInfo

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
        names = (b"meta", b"sessions", b"incarnations", b"events", b"idem", b"feed", b"deadlines")
        if readonly:
            # Handles opened inside a read transaction die with it: let LMDB open them in
            # its own (committed) transaction instead.
            handles = [self.env.open_db(name, create=False) for name in names]
        else:
            with self.env.begin(write=True) as txn:
                handles = [self.env.open_db(name, txn=txn, create=True) for name in names]
        (
            self.meta,
            self.sessions,
            self.incarnations,
            self.events,
            self.idem,
            self.feed,
            self.deadlines,
        ) = handles

    def close(self) -> None:
        self.env.close()

    def all_dbs(self) -> list[lmdb._Database]:
        return [
            self.meta,
            self.sessions,
            self.incarnations,
            self.events,
            self.idem,
            self.feed,
            self.deadlines,
        ]

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
            segment, offset = U64X2.unpack(cursor.value())
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
    apply many frames (catch-up) before flushing.
    """

    def __init__(self, view: View, txn: lmdb.Transaction, head: Head) -> None:
        self.view = view
        self.txn = txn
        self.head = head
        self.rows: dict[int, SessionRow] = {}
        self._old_deadlines: dict[int, int | None] = {}
        self._evicted: dict[int, SessionRow] = {}

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
            row = self.row(incarnation)
            if row is not None and first_ordinal == row.last_ordinal + 1:
                row.last_ordinal = first_ordinal + count - 1
                row.last_event_position = info.first_position + start + count - 1
                row.retained_bytes += data_bytes
                if incarnation not in indexed:
                    indexed.add(incarnation)
                    self.txn.put(
                        U64X2.pack(incarnation, first_ordinal),
                        U64X2.pack(info.segment, info.offset),
                        db=self.view.events,
                    )
            else:
                self._apply_records(info, records, start, start + count, indexed)
            at = start + count
        if at < len(records):
            self._apply_records(info, records, at, len(records), indexed)
        self.head.next_position = info.first_position + info.count
        self.head.segment = info.segment
        self.head.end_offset = info.end_offset

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
                if row is not None and record.ordinal == row.last_ordinal + 1:
                    row.last_ordinal = record.ordinal
                    row.last_event_position = position
                    row.retained_bytes += len(record.data)
                    if current not in indexed:
                        indexed.add(current)
                        txn.put(
                            U64X2.pack(current, record.ordinal),
                            U64X2.pack(info.segment, info.offset),
                            db=view.events,
                        )
                position += 1
                continue
            current = -1
            kind = record.__class__
            if kind is SessionCreated:
                assert isinstance(record, SessionCreated)
                row = SessionRow(
                    session_id=record.session_id,
                    incarnation=position,
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
                    lifecycle_position=position,
                    max_history_bytes=record.max_history_bytes,
                    max_history_age_ms=record.max_history_age_ms,
                )
                self.rows[position] = row
                self._old_deadlines[position] = None
                txn.put(U64.pack(position), record.session_id.encode(), db=view.incarnations)
                self._feed(position, LifecycleEventType.CREATED, record.created_at_ms, row)
            elif kind is StateChanged:
                assert isinstance(record, StateChanged)
                row = self.row(record.incarnation)
                if row is not None:
                    state = SessionState.from_wire(record.state)
                    row.state = record.state
                    row.lifecycle_position = position
                    if state is SessionState.SUSPENDED:
                        row.suspended_at_ms = record.at_ms
                    else:
                        row.suspended_at_ms = None
                    if state.terminal:
                        row.ended_at_ms = record.at_ms
                    event = (
                        LifecycleEventType.RESUMED
                        if state is SessionState.OPEN
                        else _TRANSITION_EVENTS[state]
                    )
                    self._feed(position, event, record.at_ms, row)
            elif kind is IdempotencyKeyUsed:
                assert isinstance(record, IdempotencyKeyUsed)
                txn.put(
                    U64.pack(record.incarnation) + record.key.encode(),
                    _encoder.encode(
                        IdemEntry(
                            record.first_ordinal,
                            record.last_ordinal,
                            record.digest,
                            record.last_position,
                        )
                    ),
                    db=view.idem,
                )
            elif kind is HistoryTrimmed:
                assert isinstance(record, HistoryTrimmed)
                row = self.row(record.incarnation)
                if row is not None and record.first_ordinal > row.first_ordinal:
                    row.first_ordinal = record.first_ordinal
            elif kind is SnapshotTaken:
                assert isinstance(record, SnapshotTaken)
                row = self.row(record.incarnation)
                if row is not None:
                    row.snapshot_ordinal = record.through_ordinal
                    row.snapshot_position = position
                    if record.through_ordinal + 1 > row.first_ordinal:
                        row.first_ordinal = record.through_ordinal + 1
            elif kind is SessionEvicted:
                assert isinstance(record, SessionEvicted)
                row = self.row(record.incarnation)
                if row is not None:
                    del self.rows[record.incarnation]
                    self._evicted[record.incarnation] = row
                    txn.delete(row.session_id.encode(), db=view.sessions)
                    self._feed(position, LifecycleEventType.EVICTED, record.at_ms, row)
            position += 1

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
