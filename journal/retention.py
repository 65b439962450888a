"""Reclaiming space: which sealed segments hold nothing live, and removing them.

A sealed segment is dead when no record in it is still needed: no pinned record (a live
session's creation, latest transition, snapshot, trim or idempotency record, or an
eviction record whose session's creation record survives elsewhere) lies in its position
range, and every session with events in it (from the sidecar) is evicted or has trimmed
them all. Dead segments are forgotten by the view in the writer's transaction and their
files deleted after it commits; a reader still holding one open keeps reading it.
"""

from __future__ import annotations

import os

import lmdb

from .index import U64, View
from .segments import (
    SegmentLog,
    SegmentSummary,
    _fsync_dir,
    _sidecar_name,
    read_summary,
    segment_name,
    summarize_segment,
)

__all__ = ["dead_segments", "delete_segment_files", "forget_segments"]


def _summary(log: SegmentLog, base: int, cache: dict[int, SegmentSummary]) -> SegmentSummary:
    summary = cache.get(base)
    if summary is None:
        summary = read_summary(log.directory, base) or summarize_segment(log.directory, base)
        cache[base] = summary
    return summary


def _pinned(txn: lmdb.Transaction, view: View, first: int, last: int) -> bool:
    cursor = txn.cursor(db=view.pins)
    if not cursor.set_range(U64.pack(first)):
        return False
    while True:
        (position,) = U64.unpack(cursor.key())
        if position > last:
            return False
        (incarnation,) = U64.unpack(cursor.value())
        tomb = txn.get(U64.pack(incarnation), db=view.tombstones)
        same_segment = first <= incarnation <= last
        if not (tomb is not None and U64.unpack(tomb)[0] == position and same_segment):
            return True  # an eviction pin dies with its creation record; others keep it
        if not cursor.next():
            return False


def dead_segments(
    txn: lmdb.Transaction, view: View, log: SegmentLog, cache: dict[int, SegmentSummary]
) -> list[SegmentSummary]:
    """Sealed segments holding nothing live (the active segment is never dead)."""
    dead = []
    for base in log.bases()[:-1]:
        try:
            summary = _summary(log, base, cache)
        except FileNotFoundError:
            continue  # deleted meanwhile by another writer's retention pass
        if _pinned(txn, view, base, summary.last_position):
            continue
        live = False
        for incarnation, runs in summary.sessions.items():
            row = view.row_by_incarnation(txn, incarnation)
            if row is not None and max(last for _, last, _ in runs) >= row.first_ordinal:
                live = True
                break
        if not live:
            dead.append(summary)
    return dead


def forget_segments(txn: lmdb.Transaction, view: View, dead: list[SegmentSummary]) -> None:
    """Drop view state that only existed for records in `dead`: eviction tombstones whose
    creation record goes with them (and their pins)."""
    for summary in dead:
        cursor = txn.cursor(db=view.tombstones)
        doomed: list[tuple[bytes, bytes]] = []
        if cursor.set_range(U64.pack(summary.base_position)):
            while U64.unpack(cursor.key())[0] <= summary.last_position:
                doomed.append((bytes(cursor.key()), bytes(cursor.value())))
                if not cursor.next():
                    break
        for key, value in doomed:
            txn.delete(key, db=view.tombstones)
            txn.delete(value, db=view.pins)


def delete_segment_files(log: SegmentLog, bases: list[int]) -> int:
    """Delete the files of forgotten segments; returns the bytes freed."""
    with log.files_lock():
        return _delete(log, bases)


def _delete(log: SegmentLog, bases: list[int]) -> int:
    freed = 0
    for base in bases:
        for name in (
            segment_name(base),
            segment_name(base, compressed=True),
            _sidecar_name(base),
        ):
            path = os.path.join(log.directory, name)
            try:
                freed += os.path.getsize(path)
                os.unlink(path)
            except FileNotFoundError:
                pass  # another writer deleted it first
    if bases:
        _fsync_dir(log.directory)
    return freed
