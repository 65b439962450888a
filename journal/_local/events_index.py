"""The events index: the view's `events` database, where each frame holding a session's
events starts (SPEC 7.2), so that a read seeks to the frame holding an ordinal and reads
on from there.

    events   u64 incarnation -> sorted duplicates of 44 bytes, one per frame holding the
             session's events: u64 first ordinal of the session in the frame, u64 segment,
             u64 frame offset, u64 session bytes appended before the frame, u64 frame time
             (ms), u32 CRC32 of the key and the rest

The database is dup-sorted with fixed-size values (LMDB's DUPSORT | DUPFIXED) and a
session's next frame is put with MDB_APPENDDUP: its values arrive in ordinal order and fill
their pages. Keyed by incarnation and ordinal instead (view format 4), sessions appending
in turn put each new key inside a page that also holds the next session's first keys,
where LMDB splits a full page in the middle: the index stayed about half full.

Each value's CRC is checked when it is read (the file check at open skips them: this is
most of the view); a damaged value is `JournalCorrupt` naming `index`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import Final, NamedTuple

import lmdb

from .view_codec import CRC, U64, Raw, corrupt, key_u64

__all__ = ["LOST_SEGMENT_WAY", "EventsIndex", "Location"]

# What to do when the index places frames in a segment file the log no longer has (lost,
# or deleted by hand): `verify` and a read say the same (SPEC 9).
LOST_SEGMENT_WAY: Final = (
    "restore the file from a backup (verify --fix does not drop them; deleting index/ "
    "rebuilds it without them, accepting the loss)"
)

# first ordinal, segment, frame offset, session bytes appended before the frame, frame time
_LOCATION: Final = struct.Struct(">QQQQQ")
_LOCATION_CRC: Final = struct.Struct(">QQQQQI")


class Location(NamedTuple):
    """Where the frame holding a run of a session's events starts."""

    first_ordinal: int
    segment: int
    offset: int
    bytes_before: int
    time_ms: int


def _location(key: Raw, raw: Raw) -> tuple[int, int, int, int, int]:
    """(first ordinal, segment, offset, bytes before, time) of an events duplicate."""
    if len(key) != 8 or len(raw) != _LOCATION_CRC.size:
        raise corrupt(f"an events entry of {len(key)}+{len(raw)} bytes")
    first_ordinal, segment, offset, before, time_ms, crc = _LOCATION_CRC.unpack(raw)
    if zlib.crc32(memoryview(raw)[:-4], zlib.crc32(key)) != crc:
        raise corrupt(f"the events entry {bytes(key)!r}/{first_ordinal} fails its checksum")
    return first_ordinal, segment, offset, before, time_ms


def _events_cursor(
    txn: lmdb.Transaction, db: lmdb._Database, incarnation: int, ordinal: int
) -> lmdb.Cursor | None:
    """A cursor on the session's last events duplicate whose frame starts at or below
    `ordinal` (one seek), or None when there is none."""
    cursor = txn.cursor(db=db)
    key = U64.pack(incarnation)
    target = U64.pack(ordinal)
    if cursor.set_range_dup(key, target):
        if cursor.value()[:8] != target and not cursor.prev_dup():
            return None
        return cursor
    if not cursor.set_key(key):
        return None
    cursor.last_dup()
    return cursor


class EventsIndex:
    """The `events` database of one LMDB environment. Every method works in the caller's
    transaction."""

    __slots__ = ("_db",)

    def __init__(self, db: lmdb._Database) -> None:
        self._db = db

    def put(
        self,
        txn: lmdb.Transaction,
        incarnation: int,
        first_ordinal: int,
        segment: int,
        offset: int,
        bytes_before: int,
        time_ms: int,
    ) -> None:
        """Record where the frame holding the session's events from `first_ordinal` on
        starts (replacing what was recorded for that frame)."""
        key = U64.pack(incarnation)
        value = _LOCATION.pack(first_ordinal, segment, offset, bytes_before, time_ms)
        value += CRC.pack(zlib.crc32(value, zlib.crc32(key)))
        if txn.put(key, value, db=self._db, append=True):
            return  # (the usual case: the session's next frame)
        # Not the session's newest frame (a compaction moving one, a rebuild): in place.
        self.delete(txn, incarnation, first_ordinal)
        txn.put(key, value, db=self._db)

    def delete(self, txn: lmdb.Transaction, incarnation: int, first_ordinal: int) -> None:
        cursor = txn.cursor(db=self._db)
        target = U64.pack(first_ordinal)
        if cursor.set_range_dup(U64.pack(incarnation), target) and cursor.value()[:8] == target:
            cursor.delete()

    def locations(
        self, txn: lmdb.Transaction, incarnation: int, *, up_to_ordinal: int | None = None
    ) -> list[Location]:
        """The session's frame locations in ordinal order (those whose frame starts at or
        below `up_to_ordinal`, when given)."""
        key = U64.pack(incarnation)
        cursor = txn.cursor(db=self._db)
        found: list[Location] = []
        if not cursor.set_key(key):
            return found
        for raw in cursor.iternext_dup():
            location = Location(*_location(key, raw))
            if up_to_ordinal is not None and location.first_ordinal > up_to_ordinal:
                break
            found.append(location)
        return found

    def frame_holding(
        self, txn: lmdb.Transaction, incarnation: int, ordinal: int
    ) -> Location | None:
        """The location of the session's last frame starting at or below `ordinal` (one
        seek), or None when none does."""
        cursor = _events_cursor(txn, self._db, incarnation, ordinal)
        if cursor is None:
            return None
        return Location(*_location(cursor.key(), cursor.value()))

    def frames_from(
        self, txn: lmdb.Transaction, incarnation: int, from_ordinal: int
    ) -> Iterator[tuple[int, int, int, int]]:
        """(first ordinal, segment, offset, the session's data bytes in earlier frames) of
        each frame holding its events, from the frame holding `from_ordinal` on, in order."""
        key = U64.pack(incarnation)
        cursor = _events_cursor(txn, self._db, incarnation, from_ordinal)
        if cursor is None:
            # Every frame starts after from_ordinal (or there is none): from the first.
            cursor = txn.cursor(db=self._db)
            if not cursor.set_key(key):
                return
        # `_location` inline, with the key's CRC computed once (a replay reads every entry)
        key_crc = zlib.crc32(key)
        unpack = _LOCATION_CRC.unpack
        size = _LOCATION_CRC.size
        for raw in cursor.iternext_dup(keys=False, values=True):
            if len(raw) != size:
                _location(key, raw)  # raises
            first_ordinal, segment, offset, before, _, crc = unpack(raw)
            if zlib.crc32(raw[:-4], key_crc) != crc:
                _location(key, raw)  # raises
            yield first_ordinal, segment, offset, before

    def segments_used(self, txn: lmdb.Transaction) -> Iterator[tuple[int, int]]:
        """(incarnation, segment) of every frame location, one at a time."""
        for key, raw in txn.cursor(db=self._db):
            yield key_u64(key, "events"), _location(key, raw)[1]

    def everything(self, txn: lmdb.Transaction) -> dict[tuple[int, int], tuple[int, int]]:
        """(incarnation, first ordinal) -> (segment, offset) of every frame location."""
        found: dict[tuple[int, int], tuple[int, int]] = {}
        for key, raw in txn.cursor(db=self._db):
            first_ordinal, segment, offset, _, _ = _location(key, raw)
            found[key_u64(key, "events"), first_ordinal] = segment, offset
        return found
