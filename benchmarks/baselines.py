"""The baselines: SQLite (WAL, synchronous=FULL), raw py-lmdb puts, and a JSONL file.

Each is set up the way a careful user would (no deliberately weak settings) and durable
per batch: a batch counts as written only once its data is on disk.
"""

from __future__ import annotations

import os
import sqlite3
import struct
from typing import Final

import lmdb

from .events import SESSION, Dataset
from .timing import Measurement, store_files, time_batches, time_read

SQLITE_FILE: Final = "events.db"
JSONL_FILE: Final = "events.jsonl"
LMDB_MAP_SIZE: Final = 8 << 30

# One B-tree keyed by (session, seq). Measured against a rowid table (which keeps a second
# index for the key): the same append rate within noise, reads ~5-10% faster, so this is
# the stronger baseline.
_SQLITE_SCHEMA: Final = """
CREATE TABLE events (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID
"""
_SQLITE_INSERT: Final = "INSERT INTO events (session, seq, body) VALUES (?, ?, ?)"
# With the session fixed, the primary key already yields seq order: no sort step.
_SQLITE_SELECT: Final = "SELECT session, seq, body FROM events WHERE session = ? ORDER BY seq"
_LMDB_KEY: Final = struct.Struct(">Q")


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- SQLite --------------------------------------------------------------------------------


def sqlite_append(directory: str, data: Dataset) -> Measurement:
    """One transaction (executemany) per batch; WAL with synchronous=FULL syncs each commit."""
    conn = sqlite3.connect(os.path.join(directory, SQLITE_FILE), isolation_level=None)
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise RuntimeError(f"SQLite refused WAL mode (got {mode!r})")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(_SQLITE_SCHEMA)

        def write_batch(first_seq: int, bodies: list[bytes]) -> None:
            conn.execute("BEGIN")
            conn.executemany(
                _SQLITE_INSERT, [(SESSION, first_seq + i, body) for i, body in enumerate(bodies)]
            )
            conn.execute("COMMIT")

        measurement = time_batches(data, write_batch)
        measurement.files = store_files(directory)
    finally:
        conn.close()
    return measurement


def sqlite_read(directory: str, data: Dataset) -> Measurement:
    """Every row of the session in seq order, each materialised as a tuple."""

    def read_all() -> int:
        conn = sqlite3.connect(os.path.join(directory, SQLITE_FILE))
        try:
            count = 0
            for _row in conn.execute(_SQLITE_SELECT, (SESSION,)):
                count += 1
            return count
        finally:
            conn.close()

    return time_read(data.count, read_all)


# -- LMDB ----------------------------------------------------------------------------------


def _lmdb_open(directory: str, *, readonly: bool = False) -> lmdb.Environment:
    return lmdb.open(
        directory, map_size=LMDB_MAP_SIZE, sync=True, writemap=False, readonly=readonly
    )


def lmdb_append(directory: str, data: Dataset) -> Measurement:
    """One write transaction of puts per batch; the commit syncs (LMDB's default)."""
    env = _lmdb_open(directory)
    try:
        pack = _LMDB_KEY.pack

        def write_batch(first_seq: int, bodies: list[bytes]) -> None:
            with env.begin(write=True) as txn:
                put = txn.put
                for i, body in enumerate(bodies):
                    put(pack(first_seq + i), body)

        measurement = time_batches(data, write_batch)
        measurement.files = store_files(directory)
    finally:
        env.close()
    return measurement


def lmdb_read(directory: str, data: Dataset) -> Measurement:
    """A cursor over the whole database, each (key, value) copied out as bytes."""

    def read_all() -> int:
        env = _lmdb_open(directory, readonly=True)
        try:
            count = 0
            with env.begin() as txn:
                for _key, _value in txn.cursor():
                    count += 1
            return count
        finally:
            env.close()

    return time_read(data.count, read_all)


# -- JSONL ---------------------------------------------------------------------------------


def jsonl_append(directory: str, data: Dataset) -> Measurement:
    """One write of the batch's lines, then one fdatasync, per batch."""
    path = os.path.join(directory, JSONL_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        _fsync_dir(directory)

        def write_batch(first_seq: int, bodies: list[bytes]) -> None:
            chunk = memoryview(b"\n".join(bodies) + b"\n")
            while chunk:
                chunk = chunk[os.write(fd, chunk) :]
            os.fdatasync(fd)

        measurement = time_batches(data, write_batch)
        measurement.files = store_files(directory)
    finally:
        os.close(fd)
    return measurement


def jsonl_read(directory: str, data: Dataset) -> Measurement:
    """Every line as bytes (not JSON-decoded: the other readers do not parse payloads)."""

    def read_all() -> int:
        count = 0
        with open(os.path.join(directory, JSONL_FILE), "rb", buffering=1 << 20) as lines:
            for _line in lines:
                count += 1
        return count

    return time_read(data.count, read_all)
