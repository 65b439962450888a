"""A read-only journal's private view forgets the eviction tombstones whose session's
creation record left the log, as the writer's view does (SPEC 10).

An evicted session leaves a tombstone in the view (its incarnation's id stays, and its
eviction record is pinned) while its creation record may survive somewhere, so that a
rebuild cannot bring the session back. The writer forgets it when the record goes: when
retention deletes its segment (`retention.forget_segments`) or compaction drops its frame
(`compaction.swap_segment`). A private view learns of neither (it only projects new
frames), so before this it kept every tombstone ever made: a long-lived reader beside a
writer that churns sessions grew its view's file and memory without bound (found by a
soak: 27,000 tombstones, incarnation ids and pins after 75 s, against the writer's 700).

`forget_gone_creations` runs in the refresh's write transaction. It looks only when the
segment files changed since it last looked: the refresh's own listing (shared with its
projection) differs, or the segments directory's modification time does (a compaction
renames its copy over a compressed segment of the same name; until 2026-12-04 only the
listing was compared, and the tombstones of the sessions whose creations a second
compaction of a compressed segment dropped stayed for good). A directory modified less
than a second before the look is looked at again next time (a file system stamps
changes within one clock tick with the same time). Then each tombstone whose creation
position no existing frame holds goes, with its id and pin (`View.forget_tombstone`). A
sealed segment's frames come from its sidecar; a file deleted or replaced meanwhile
leaves the tombstone for the next look.
"""

from __future__ import annotations

import bisect
import os
import time
import weakref
from typing import Final

import lmdb

from .log import SegmentLog
from .segments import summarize_segment
from .sidecar import read_summary
from .view import View

__all__ = ["forget_gone_creations"]

_Look = tuple[list[tuple[int, bool]], int]  # (segment listing, directory's mtime in ns)
# What each private view last looked at (a view closes with its journal).
_LOOKED: Final[weakref.WeakKeyDictionary[View, _Look]] = weakref.WeakKeyDictionary()
_ALL: Final = (1 << 64) - 1
# A directory modified this recently may be modified again with the same time stamp.
_SETTLE_NS: Final = 1_000_000_000


def forget_gone_creations(
    log: SegmentLog, view: View, txn: lmdb.Transaction, listing: list[tuple[int, bool]]
) -> None:
    """Forget the tombstones of `view` whose creation record the log no longer holds;
    `listing`: the log's segments (base, compressed), as the refresh listed them."""
    if not listing:
        return
    look = (listing, os.stat(log.directory).st_mtime_ns)
    if _LOOKED.get(view) == look:
        return
    bases = [base for base, _ in listing]
    frames: dict[int, list[tuple[int, int]] | None] = {}
    settled = True
    for incarnation, position in view.tombstones_between(txn, 0, _ALL):
        at = bisect.bisect_right(bases, incarnation) - 1
        if at == len(bases) - 1:
            continue  # in the active segment: dense, never compacted
        if at >= 0:
            base = bases[at]
            if base not in frames:
                frames[base] = _frames(log, base)
            held = frames[base]
            if held is None:
                settled = False  # deleted or replaced meanwhile: look again next time
                continue
            i = bisect.bisect_right(held, (incarnation, _ALL)) - 1
            if i >= 0 and held[i][0] <= incarnation < held[i][0] + held[i][1]:
                continue  # its creation record is still there
        view.forget_tombstone(txn, incarnation, position)
    if settled and time.time_ns() - look[1] >= _SETTLE_NS:
        _LOOKED[view] = look


def _frames(log: SegmentLog, base: int) -> list[tuple[int, int]] | None:
    """(first position, count) of each frame of a sealed segment; None when its files
    were deleted or replaced while they were read."""
    try:
        summary = read_summary(log.directory, base) or summarize_segment(
            log.directory, base, log.ops
        )
    except FileNotFoundError:
        return None
    return sorted((first, count) for _, first, count in summary.frames)
