"""Compaction: rewriting sealed segments without their dead frames, zstd-compressed.

A frame is live when any record in it is: an event of a live session at or above its
first retained ordinal, or a pinned record (see `index`). Liveness only ever goes from
live to dead, so the rewrite can be computed from a read snapshot without the writer lock:
a frame dead then is dead forever, and a frame copied while live that dies meanwhile is
merely reclaimed later. Only the swap (rename into place, new sidecar, forgetting
tombstones whose creation record went away) happens under the writer lock, after checking
that the source file is still the one that was read.

Kept frames keep their positions, ordinals and uncompressed offsets, so the view's
locations stay valid. A reader whose snapshot still points at a dropped frame finds no
block for it and retries with a fresh snapshot, which then says the history expired.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

import lmdb
import msgspec

from .index import U64, View
from .segments import (
    FrameInfo,
    SegmentLog,
    SegmentSummary,
    _fsync_dir,
    compress_segment,
    segment_name,
    write_summary,
)

__all__ = ["DEFAULT_DEAD_SHARE", "CompactionReport", "live_frames", "swap_segment"]

DEFAULT_DEAD_SHARE: Final = 0.5


class CompactionReport(msgspec.Struct, frozen=True):
    """What `compact()` did: segments rewritten and deleted, bytes on disk before and after,
    live bytes copied (uncompressed) and the seconds it took."""

    segments_rewritten: list[str]
    segments_deleted: list[str]
    bytes_before: int
    bytes_after: int
    live_bytes_copied: int
    seconds: float


def live_frames(
    txn: lmdb.Transaction, view: View, summary: SegmentSummary
) -> tuple[set[int], int, int]:
    """(offsets of live frames, live bytes, total bytes) of a sealed segment."""
    frames = summary.frames
    ends = [offset for offset, _, _ in frames[1:]] + [summary.data_end]
    live: set[int] = set()
    for incarnation, runs in summary.sessions.items():
        row = view.row_by_incarnation(txn, incarnation)
        if row is None:
            continue
        for _, last_ordinal, offset in runs:
            if last_ordinal >= row.first_ordinal:
                live.add(offset)
    pins = txn.cursor(db=view.pins)
    for offset, first_position, count in frames:
        if offset in live:
            continue
        if pins.set_range(U64.pack(first_position)):
            (position,) = U64.unpack(pins.key())
            if position < first_position + count:
                live.add(offset)
    total = live_bytes = 0
    for (offset, _, _), end in zip(frames, ends, strict=True):
        total += end - offset
        if offset in live:
            live_bytes += end - offset
    return live, live_bytes, total


def rewrite(directory: str, base: int, live: set[int]) -> tuple[str, SegmentSummary]:
    """Write the compacted copy to a temporary file (no lock needed)."""

    def keep(info: FrameInfo) -> bool:
        return info.offset in live

    return compress_segment(directory, base, keep=keep, publish=False)


def file_identity(directory: str, base: int) -> tuple[str, int, int] | None:
    """(name, inode, size) of the file currently holding a segment, or None."""
    for compressed in (False, True):
        name = segment_name(base, compressed=compressed)
        try:
            st = os.stat(os.path.join(directory, name))
        except FileNotFoundError:
            continue
        return name, st.st_ino, st.st_size
    return None


def swap_segment(
    txn: lmdb.Transaction,
    view: View,
    log: SegmentLog,
    base: int,
    temporary: str,
    summary: SegmentSummary,
    source: tuple[str, int, int],
    original_last_position: int,
) -> bool:
    """Put a compacted copy in place of its source (caller holds the writer lock).

    Returns False (and discards the copy) when the source changed since it was read."""
    directory = log.directory
    with log.files_lock():
        if file_identity(directory, base) != source:
            # Deleted (dead) or replaced by another writer since it was read.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            return False
        final = os.path.join(directory, segment_name(base, compressed=True))
        os.replace(temporary, final)
        if source[0] == segment_name(base):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, segment_name(base)))
        _fsync_dir(directory)
        write_summary(directory, summary)
    # Eviction tombstones whose creation record was dropped: the eviction record need
    # no longer survive, since nothing can resurrect the session.
    kept = summary.frames
    cursor = txn.cursor(db=view.tombstones)
    forgotten: list[tuple[bytes, bytes]] = []
    if cursor.set_range(U64.pack(base)):
        while True:
            (incarnation,) = U64.unpack(cursor.key())
            if incarnation > original_last_position:
                break
            if not any(first <= incarnation < first + count for _, first, count in kept):
                forgotten.append((bytes(cursor.key()), bytes(cursor.value())))
            if not cursor.next():
                break
    for key, value in forgotten:
        txn.delete(key, db=view.tombstones)
        txn.delete(value, db=view.pins)
    return True
