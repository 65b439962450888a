"""The LMDB view: a materialised projection of the segment log, rebuildable from it.

Nothing here is the truth: every entry is derived from records in the segments by the
projector. LMDB's own fsync is off because the view can always be rebuilt; the segment
fsync is the commit point. Every key layout and prefix scan lives in this module; callers
pass transactions (`View.begin`) and get rows, entries and numbers back.

Named databases (keys big-endian so LMDB's byte order is numeric order):

    meta         b"head" -> Head; b"store" -> store id; b"boot" -> boot id of the last writer
    sessions     session id (utf-8) -> SessionRow (staged imports: NUL-prefixed ids)
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

import contextlib
import os
import struct
from collections.abc import Iterator
from typing import Final, NamedTuple

import lmdb
import msgspec

from ..sessions import FeedEntry, SessionRow
from .files import DEFAULT_PERMISSIONS, Permissions

__all__ = ["Head", "IdemEntry", "Location", "View"]

_INITIAL_MAP_SIZE: Final = 1 << 36
# Staged imports are keyed by ids starting with NUL; every id a caller can name is above.
_STAGED_END: Final = b"\x01"

_U64: Final = struct.Struct(">Q")
_U64X2: Final = struct.Struct(">QQ")
# events value: segment, frame offset, session bytes appended before the frame, frame time
_LOCATION: Final = struct.Struct(">QQQQ")
_NAMES: Final = (
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


class Head(msgspec.Struct, array_like=True):
    """How far the view has indexed the log: the active segment and the end of its last
    indexed frame, the next position to assign, and the last lifecycle record's position."""

    segment: int
    end_offset: int
    next_position: int
    lifecycle_position: int = 0


class IdemEntry(msgspec.Struct, array_like=True):
    """An idempotency key's append: its ordinals, the events' digest, the position of its
    last event and of the key's own record."""

    first_ordinal: int
    last_ordinal: int
    digest: bytes
    last_position: int = 0
    position: int = 0


class Location(NamedTuple):
    """Where the frame holding a run of a session's events starts."""

    first_ordinal: int
    segment: int
    offset: int
    bytes_before: int
    time_ms: int


_encoder: Final = msgspec.msgpack.Encoder()
_row_decoder: Final = msgspec.msgpack.Decoder(SessionRow)
_head_decoder: Final = msgspec.msgpack.Decoder(Head)
_feed_decoder: Final = msgspec.msgpack.Decoder(FeedEntry)
_idem_decoder: Final = msgspec.msgpack.Decoder(IdemEntry)


class View:
    """The LMDB environment and its named databases."""

    def __init__(
        self, path: str, *, readonly: bool = False, permissions: Permissions = DEFAULT_PERMISSIONS
    ) -> None:
        self.readonly = readonly
        created: list[str] = []
        if not readonly:
            permissions.make_dirs(path)
            created = [
                file
                for file in (os.path.join(path, "data.mdb"), os.path.join(path, "lock.mdb"))
                if not os.path.exists(file)
            ]
        self.env = lmdb.open(
            path,
            mode=permissions.file,
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
        for file in created:
            # LMDB creates its files with the mode less the umask: give them the mode.
            with contextlib.suppress(FileNotFoundError):
                permissions.fix_created(file)
        if readonly:
            # Handles opened inside a read transaction die with it: let LMDB open them in
            # its own (committed) transaction instead.
            handles = [self.env.open_db(name, create=False) for name in _NAMES]
        else:
            with self.env.begin(write=True) as txn:
                handles = [self.env.open_db(name, txn=txn, create=True) for name in _NAMES]
        self._handles = handles
        (
            self._meta,
            self._sessions,
            self._incarnations,
            self._events,
            self._idem,
            self._feed,
            self._deadlines,
            self._pins,
            self._tombstones,
        ) = handles

    def begin(self, *, write: bool = False) -> lmdb.Transaction:
        """A transaction (a context manager); a write transaction is the store's
        cross-process writer lock."""
        return self.env.begin(write=write)

    def grow(self) -> None:
        """Double the map size (after `lmdb.MapFullError`)."""
        self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def close(self) -> None:
        self.env.close()

    def clear(self, txn: lmdb.Transaction) -> None:
        """Empty every database (before a rebuild)."""
        for db in self._handles:
            txn.drop(db, delete=False)

    # -- meta ------------------------------------------------------------------------------

    def head(self, txn: lmdb.Transaction) -> Head | None:
        raw = txn.get(b"head", db=self._meta)
        return None if raw is None else _head_decoder.decode(raw)

    def put_head(self, txn: lmdb.Transaction, head: Head) -> None:
        txn.put(b"head", _encoder.encode(head), db=self._meta)

    def store_id(self, txn: lmdb.Transaction) -> bytes | None:
        raw = txn.get(b"store", db=self._meta)
        return None if raw is None else bytes(raw)

    def put_store_id(self, txn: lmdb.Transaction, store_id: bytes) -> None:
        txn.put(b"store", store_id, db=self._meta)

    def boot_id(self, txn: lmdb.Transaction) -> bytes | None:
        raw = txn.get(b"boot", db=self._meta)
        return None if raw is None else bytes(raw)

    def put_boot_id(self, txn: lmdb.Transaction, boot_id: bytes) -> None:
        txn.put(b"boot", boot_id, db=self._meta)

    # -- sessions --------------------------------------------------------------------------

    def row(self, txn: lmdb.Transaction, session_id: str) -> SessionRow | None:
        raw = txn.get(session_id.encode(), db=self._sessions)
        return None if raw is None else _row_decoder.decode(raw)

    def put_row(self, txn: lmdb.Transaction, row: SessionRow) -> None:
        txn.put(row.session_id.encode(), _encoder.encode(row), db=self._sessions)

    def delete_row(self, txn: lmdb.Transaction, session_id: str) -> None:
        txn.delete(session_id.encode(), db=self._sessions)

    def rows(
        self, txn: lmdb.Transaction, after_id: str | None = None, *, staged: bool = False
    ) -> Iterator[SessionRow]:
        """Rows in session-id order, after `after_id` when given. Staged imports (ids
        starting with NUL, which no caller can name, so they sort first) are skipped
        unless `staged`."""
        cursor = txn.cursor(db=self._sessions)
        after = None if after_id is None else after_id.encode()
        if after is None and not staged:
            after = _STAGED_END
        positioned = cursor.set_range(after) if after is not None else cursor.first()
        if positioned and after is not None and cursor.key() == after:
            positioned = cursor.next()
        while positioned:
            yield _row_decoder.decode(cursor.value())
            positioned = cursor.next()

    def staged_rows(self, txn: lmdb.Transaction) -> list[SessionRow]:
        """The rows of staged imports (see `rows`)."""
        rows: list[SessionRow] = []
        cursor = txn.cursor(db=self._sessions)
        positioned = cursor.first()
        while positioned and bytes(cursor.key()) < _STAGED_END:
            rows.append(_row_decoder.decode(cursor.value()))
            positioned = cursor.next()
        return rows

    def encoded_rows(self, txn: lmdb.Transaction) -> list[bytes]:
        """Every visible row, still encoded (copied out of the transaction; see
        `decode_row`)."""
        return [
            bytes(raw) for key, raw in txn.cursor(db=self._sessions) if bytes(key) >= _STAGED_END
        ]

    @staticmethod
    def decode_row(raw: bytes) -> SessionRow:
        return _row_decoder.decode(raw)

    def session_id_of(self, txn: lmdb.Transaction, incarnation: int) -> str | None:
        raw = txn.get(_U64.pack(incarnation), db=self._incarnations)
        return None if raw is None else bytes(raw).decode()

    def put_incarnation(self, txn: lmdb.Transaction, incarnation: int, session_id: str) -> None:
        txn.put(_U64.pack(incarnation), session_id.encode(), db=self._incarnations)

    def row_by_incarnation(self, txn: lmdb.Transaction, incarnation: int) -> SessionRow | None:
        session_id = self.session_id_of(txn, incarnation)
        if session_id is None:
            return None
        row = self.row(txn, session_id)
        return row if row is not None and row.incarnation == incarnation else None

    # -- event locations -------------------------------------------------------------------

    def put_location(
        self,
        txn: lmdb.Transaction,
        incarnation: int,
        first_ordinal: int,
        segment: int,
        offset: int,
        bytes_before: int,
        time_ms: int,
    ) -> None:
        txn.put(
            _U64X2.pack(incarnation, first_ordinal),
            _LOCATION.pack(segment, offset, bytes_before, time_ms),
            db=self._events,
        )

    def delete_location(self, txn: lmdb.Transaction, incarnation: int, first_ordinal: int) -> None:
        txn.delete(_U64X2.pack(incarnation, first_ordinal), db=self._events)

    def locations(
        self, txn: lmdb.Transaction, incarnation: int, *, up_to_ordinal: int | None = None
    ) -> list[Location]:
        """The session's frame locations in ordinal order (those whose frame starts at or
        below `up_to_ordinal`, when given)."""
        prefix = _U64.pack(incarnation)
        cursor = txn.cursor(db=self._events)
        found: list[Location] = []
        if not cursor.set_range(prefix):
            return found
        while cursor.key()[:8] == prefix:
            _, first_ordinal = _U64X2.unpack(cursor.key())
            if up_to_ordinal is not None and first_ordinal > up_to_ordinal:
                break
            found.append(Location(first_ordinal, *_LOCATION.unpack(cursor.value())))
            if not cursor.next():
                break
        return found

    def iter_frame_locations(
        self, txn: lmdb.Transaction, incarnation: int, from_ordinal: int
    ) -> Iterator[tuple[int, int, int]]:
        """(first ordinal, segment, offset) of each frame holding the session's events,
        starting with the frame that holds `from_ordinal`, in ordinal order."""
        cursor = txn.cursor(db=self._events)
        prefix = _U64.pack(incarnation)
        target = _U64X2.pack(incarnation, from_ordinal)
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
            _, first_ordinal = _U64X2.unpack(key)
            segment, offset, _, _ = _LOCATION.unpack(cursor.value())
            yield first_ordinal, segment, offset
            if not cursor.next():
                return

    def all_locations(self, txn: lmdb.Transaction) -> dict[tuple[int, int], tuple[int, int]]:
        """(incarnation, first ordinal) -> (segment, offset) of every frame location."""
        return {
            _U64X2.unpack(key): _LOCATION.unpack(value)[:2]
            for key, value in txn.cursor(db=self._events)
        }

    # -- idempotency keys ------------------------------------------------------------------

    def idem_entry(self, txn: lmdb.Transaction, incarnation: int, key: str) -> IdemEntry | None:
        raw = txn.get(_U64.pack(incarnation) + key.encode(), db=self._idem)
        return None if raw is None else _idem_decoder.decode(raw)

    def put_idem(self, txn: lmdb.Transaction, incarnation: int, key: str, entry: IdemEntry) -> None:
        txn.put(_U64.pack(incarnation) + key.encode(), _encoder.encode(entry), db=self._idem)

    def idem_entries(self, txn: lmdb.Transaction, incarnation: int) -> list[tuple[str, IdemEntry]]:
        prefix = _U64.pack(incarnation)
        cursor = txn.cursor(db=self._idem)
        found: list[tuple[str, IdemEntry]] = []
        if cursor.set_range(prefix):
            while cursor.key()[:8] == prefix:
                key = bytes(cursor.key()[8:]).decode()
                found.append((key, _idem_decoder.decode(cursor.value())))
                if not cursor.next():
                    break
        return found

    def delete_idem(self, txn: lmdb.Transaction, incarnation: int, key: str) -> None:
        txn.delete(_U64.pack(incarnation) + key.encode(), db=self._idem)

    # -- lifecycle feed --------------------------------------------------------------------

    def put_feed(self, txn: lmdb.Transaction, position: int, entry: FeedEntry) -> None:
        txn.put(_U64.pack(position), _encoder.encode(entry), db=self._feed)

    def feed_entry(self, txn: lmdb.Transaction, position: int) -> FeedEntry | None:
        raw = txn.get(_U64.pack(position), db=self._feed)
        return None if raw is None else _feed_decoder.decode(raw)

    def feed_after(
        self, txn: lmdb.Transaction, after_position: int, limit: int
    ) -> list[tuple[int, FeedEntry]]:
        cursor = txn.cursor(db=self._feed)
        found: list[tuple[int, FeedEntry]] = []
        positioned = cursor.set_range(_U64.pack(after_position + 1))
        while positioned and len(found) < limit:
            (position,) = _U64.unpack(cursor.key())
            found.append((position, _feed_decoder.decode(cursor.value())))
            positioned = cursor.next()
        return found

    # -- deadlines -------------------------------------------------------------------------

    def put_deadline(self, txn: lmdb.Transaction, due_ms: int, incarnation: int) -> None:
        txn.put(_U64X2.pack(due_ms, incarnation), b"", db=self._deadlines)

    def delete_deadline(self, txn: lmdb.Transaction, due_ms: int, incarnation: int) -> None:
        txn.delete(_U64X2.pack(due_ms, incarnation), db=self._deadlines)

    def next_deadline(self, txn: lmdb.Transaction) -> int | None:
        """The nearest deadline (ms), or None."""
        cursor = txn.cursor(db=self._deadlines)
        if not cursor.first():
            return None
        due_ms, _ = _U64X2.unpack(cursor.key())
        return int(due_ms)

    def due(self, txn: lmdb.Transaction, now_ms: int) -> list[int]:
        """Incarnations whose deadline is at or before `now_ms`, earliest first."""
        cursor = txn.cursor(db=self._deadlines)
        found: list[int] = []
        positioned = cursor.first()
        while positioned:
            due_ms, incarnation = _U64X2.unpack(cursor.key())
            if due_ms > now_ms:
                break
            found.append(incarnation)
            positioned = cursor.next()
        return found

    # -- pins and tombstones ---------------------------------------------------------------

    def pin(self, txn: lmdb.Transaction, position: int, incarnation: int) -> None:
        txn.put(_U64.pack(position), _U64.pack(incarnation), db=self._pins)

    def unpin(self, txn: lmdb.Transaction, position: int) -> None:
        txn.delete(_U64.pack(position), db=self._pins)

    def pins_between(
        self, txn: lmdb.Transaction, first_position: int, last_position: int
    ) -> Iterator[tuple[int, int]]:
        """(position, incarnation) of the pinned records in the position range."""
        cursor = txn.cursor(db=self._pins)
        positioned = cursor.set_range(_U64.pack(first_position))
        while positioned:
            (position,) = _U64.unpack(cursor.key())
            if position > last_position:
                return
            yield position, _U64.unpack(cursor.value())[0]
            positioned = cursor.next()

    def tombstone(self, txn: lmdb.Transaction, incarnation: int) -> int | None:
        """The position of an evicted incarnation's eviction record, if still kept."""
        raw = txn.get(_U64.pack(incarnation), db=self._tombstones)
        return None if raw is None else _U64.unpack(raw)[0]

    def put_tombstone(self, txn: lmdb.Transaction, incarnation: int, position: int) -> None:
        txn.put(_U64.pack(incarnation), _U64.pack(position), db=self._tombstones)

    def tombstones_between(
        self, txn: lmdb.Transaction, first_incarnation: int, last_incarnation: int
    ) -> list[tuple[int, int]]:
        """(incarnation, eviction position) of tombstones of incarnations in the range."""
        cursor = txn.cursor(db=self._tombstones)
        found: list[tuple[int, int]] = []
        positioned = cursor.set_range(_U64.pack(first_incarnation))
        while positioned:
            (incarnation,) = _U64.unpack(cursor.key())
            if incarnation > last_incarnation:
                break
            found.append((incarnation, _U64.unpack(cursor.value())[0]))
            positioned = cursor.next()
        return found

    def forget_tombstone(self, txn: lmdb.Transaction, incarnation: int, position: int) -> None:
        """Drop a tombstone and the pin of its eviction record."""
        txn.delete(_U64.pack(incarnation), db=self._tombstones)
        self.unpin(txn, position)
