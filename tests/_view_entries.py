"""Reading and rewriting the view's events index by hand (tests that damage it).

The `events` database maps a u64 incarnation to sorted duplicates of 44 bytes: u64 first
ordinal, u64 segment, u64 offset, u64 bytes before, u64 frame time, u32 CRC32 of the key
and the rest (journal/_local/view.py).
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import lmdb

_U64 = struct.Struct(">Q")


def _env(store: Path, readonly: bool, directory: str = "index") -> lmdb.Environment:
    return lmdb.open(str(store / directory), max_dbs=16, map_size=1 << 36, readonly=readonly)


def read_locations(store: Path) -> dict[tuple[int, int], bytes]:
    """(incarnation, first ordinal) -> the stored duplicate, CRC and all."""
    env = _env(store, True)
    try:
        with env.begin() as txn:
            db = env.open_db(b"events", txn=txn, create=False)
            return {
                (_U64.unpack(key)[0], _U64.unpack(value[:8])[0]): bytes(value)
                for key, value in txn.cursor(db=db)
            }
    finally:
        env.close()


def sealed_location(incarnation: int, payload: bytes) -> bytes:
    """`payload` (first ordinal and the four u64 fields) with a valid CRC."""
    return payload + struct.pack(">I", zlib.crc32(payload, zlib.crc32(_U64.pack(incarnation))))


def replace_location(store: Path, incarnation: int, ordinal: int, duplicate: bytes) -> None:
    """Put `duplicate` in place of the one for the frame starting at `ordinal`."""
    env = _env(store, False)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(b"events", txn=txn, dupsort=True, dupfixed=True)
            cursor = txn.cursor(db=db)
            key, target = _U64.pack(incarnation), _U64.pack(ordinal)
            if cursor.set_range_dup(key, target) and cursor.value()[:8] == target:
                cursor.delete()
            txn.put(key, duplicate, db=db)
    finally:
        env.close()


def feed_positions(store: Path, directory: str = "index") -> list[int]:
    """The positions of the lifecycle feed's entries in the view at `store/directory`
    (the journal must be closed)."""
    env = _env(store, True, directory)
    try:
        with env.begin() as txn:
            db = env.open_db(b"feed", txn=txn, create=False)
            return [_U64.unpack(key)[0] for key, _ in txn.cursor(db=db)]
    finally:
        env.close()


def entry_counts(store: Path, directory: str = "index") -> dict[str, int]:
    """How many entries the `tombstones`, `incarnations` and `pins` databases of the view
    at `store/directory` hold (the journal must be closed, or the view a copy)."""
    env = _env(store, True, directory)
    try:
        with env.begin() as txn:
            counts = {}
            for name in ("tombstones", "incarnations", "pins"):
                db = env.open_db(name.encode(), txn=txn, create=False)
                counts[name] = txn.stat(db)["entries"]
            return counts
    finally:
        env.close()
