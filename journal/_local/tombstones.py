"""Forgetting the eviction tombstones whose session's creation record left the log: the
writer's view when retention or compaction removes it (`forget_creation`), and a
read-only journal's private view when it next looks (`forget_gone_creations`, SPEC 10).

An evicted session leaves a tombstone in the view (its incarnation's id stays, and its
eviction record is pinned) while its creation record may survive somewhere, so that a
rebuild cannot bring the session back. The writer forgets it when the record goes: when
retention deletes its segment (`retention.forget_segments`) or compaction drops its frame
(`compaction.swap_segment`). A private view learns of neither (it only projects new
frames), so before this it kept every tombstone ever made: a long-lived reader beside a
writer that churns sessions grew its view's file and memory without bound (found by a
soak: 27,000 tombstones, incarnation ids and pins after 75 s, against the writer's 700).

`forget_gone_creations` runs in the refresh's write transaction. It looks only when the
segment files changed since it last looked (the refresh's own listing, shared with its
projection):
then each tombstone whose creation position no existing frame holds goes, with its id and
pin (`View.forget_tombstone`). A sealed segment's frames come from its sidecar; a file
deleted or replaced meanwhile leaves the tombstone for the next look.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Callable
from typing import Final

import lmdb

from ..models import LifecycleEventType
from .log import SegmentLog
from .segments import summarize_segment
from .sidecar import read_summary
from .view import View

__all__ = ["forget_creation", "forget_ended", "forget_gone_creations"]

# The segment listing each private view last looked at (a view closes with its journal).
_LOOKED: Final[weakref.WeakKeyDictionary[View, list[tuple[int, bool]]]] = (
    weakref.WeakKeyDictionary()
)
_ALL: Final = (1 << 64) - 1
_ENDS: Final = frozenset(
    e.value
    for e in (LifecycleEventType.RESOLVED, LifecycleEventType.EXPIRED, LifecycleEventType.CANCELLED)
)
_PAGE: Final = 256


def forget_creation(view: View, txn: lmdb.Transaction, incarnation: int, position: int) -> int:
    """The writer's view forgets an evicted session whose creation record leaves the log
    (its tombstone, id and eviction pin), and the lifecycle feed changes no rebuild can
    make again: a rebuilt view knows no session for the records of its end and eviction
    (SPEC 7.7). Its EVICTED entry (at `position`, its last change) goes and the floor
    rises to it, so a cursor from before it expires on the live view as on a rebuilt one;
    returns that floor, which the caller records in the log before the record goes."""
    view.forget_tombstone(txn, incarnation, position)
    view.prune_feed(txn, position, position)
    view.raise_feed_floor(txn, position)
    return position


def forget_ended(
    view: View,
    txn: lmdb.Transaction,
    first: int,
    last: int,
    kept: Callable[[int], bool] = lambda position: False,
) -> int:
    """Before the feed entries of the records leaving the log in `[first, last]` (but
    those `kept`) are pruned: an evicted session whose end record leaves while its
    creation record stays (its tombstone is there) would be EVICTED in a state a rebuild
    cannot give (it finds the session never ended), so its EVICTED entry goes and the
    floor rises to it, as `forget_creation` does; returns the highest such (0: none).

    It reads the fewer of the tombstones' EVICTED entries (whose row names the end
    record: `lifecycle_position`) and the feed entries in the range: decoding one takes
    about 4 us, five times deleting it (80 ms for 20,000), and tombstones are few (the
    expiry thread compacts the creation records that keep them, SPEC 8)."""
    tombstones = view.tombstones_between(txn, 0, _ALL)
    if not tombstones:
        return 0
    ended: list[int] = []  # the EVICTED entries whose session's end leaves
    if len(tombstones) <= last - first + 1:
        for _, eviction in tombstones:
            evicted = view.feed_entry(txn, eviction)
            end = 0 if evicted is None else evicted.row.lifecycle_position
            if first <= end <= last and not kept(end):
                ended.append(eviction)
    else:
        after = first - 1
        while after < last:
            entries = view.feed_after(txn, after, _PAGE)
            for position, entry in entries:
                if position > last:
                    break
                if entry.event_type in _ENDS and not kept(position):
                    evicted_at = view.tombstone(txn, entry.row.incarnation)
                    if evicted_at is not None:
                        ended.append(evicted_at)
            after = last if len(entries) < _PAGE else entries[-1][0]
    for eviction in ended:
        view.prune_feed(txn, eviction, eviction)
        view.raise_feed_floor(txn, eviction)
    return max(ended, default=0)


def forget_gone_creations(
    log: SegmentLog, view: View, txn: lmdb.Transaction, listing: list[tuple[int, bool]]
) -> None:
    """Forget the tombstones of `view` whose creation record the log no longer holds;
    `listing`: the log's segments (base, compressed), as the refresh listed them."""
    if not listing or _LOOKED.get(view) == listing:
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
    if settled:
        _LOOKED[view] = listing


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
