"""Retention: history windows, and reclaiming sealed segments that hold nothing live.

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

from ..models import RetentionPolicy
from ..sessions import SessionRow
from .files import fsync_dir
from .frames import segment_name, sidecar_name
from .log import SegmentLog
from .segments import summarize_segment
from .sidecar import SegmentSummary, read_summary
from .view import View

__all__ = ["dead_segments", "delete_segment_files", "forget_segments", "window_start"]


def window_start(
    txn: lmdb.Transaction, view: View, row: SessionRow, policy: RetentionPolicy, now: int
) -> int:
    """The first ordinal the session's history windows keep (frame granularity: a window
    never cuts a batch, and the newest frame is kept whatever its size)."""
    limit_bytes = row.max_history_bytes or policy.max_history_bytes
    limit_age = row.max_history_age_ms or policy.max_history_age_ms
    over_bytes = limit_bytes is not None and row.retained_bytes > limit_bytes
    if not over_bytes and limit_age is None:
        return row.first_ordinal
    new_first = row.first_ordinal
    frames = view.locations(txn, row.incarnation)
    if not frames:
        return new_first
    if over_bytes and limit_bytes is not None:
        for frame in frames:
            if row.appended_bytes - frame.bytes_before <= limit_bytes:
                new_first = max(new_first, frame.first_ordinal)
                break
        else:
            new_first = max(new_first, frames[-1].first_ordinal)
    if limit_age is not None:
        horizon = now - limit_age
        if frames[-1].time_ms < horizon:
            new_first = max(new_first, row.last_ordinal + 1)
        else:
            for frame in frames:
                if frame.time_ms >= horizon:
                    new_first = max(new_first, frame.first_ordinal)
                    break
    return new_first


def _summary(log: SegmentLog, base: int, cache: dict[int, SegmentSummary]) -> SegmentSummary:
    summary = cache.get(base)
    if summary is None:
        log.ops.point("retention.read_sidecar", base)
        summary = read_summary(log.directory, base) or summarize_segment(
            log.directory, base, log.ops
        )
        cache[base] = summary
    return summary


def _pinned(txn: lmdb.Transaction, view: View, first: int, last: int) -> bool:
    for position, incarnation in view.pins_between(txn, first, last):
        tomb = view.tombstone(txn, incarnation)
        same_segment = first <= incarnation <= last
        if not (tomb == position and same_segment):
            return True  # an eviction pin dies with its creation record; others keep it
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
        for incarnation, position in view.tombstones_between(
            txn, summary.base_position, summary.last_position
        ):
            view.forget_tombstone(txn, incarnation, position)


def delete_segment_files(log: SegmentLog, bases: list[int]) -> int:
    """Delete the files of forgotten segments; returns the bytes freed."""
    log.ops.point("retention.delete", bases)
    with log.files_lock():
        freed = 0
        for base in bases:
            for name in (
                segment_name(base),
                segment_name(base, compressed=True),
                sidecar_name(base),
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
