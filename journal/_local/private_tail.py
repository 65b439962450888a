"""A read-only journal's private view across a hole that `verify(fix=True)` accepted (SPEC 9,
"Accepting a hole"; SPEC 10), or across the cut of a refused frame it had projected (SPEC
14.4: a writer's commit failed after its frame was written, and its cut was owed).

A private view projects only the frames after its head. When committed frames were cut
off the active segment and the writer accepted the loss, later appends overwrite the
bytes the view had projected: its head never went back, it never saw the new frames, and
its index placed events where other frames now lie. `PrivateTail` keeps the header of
the last frame the view projected and compares it at every refresh (an fstat and one
24-byte read): a segment file that ends before the view's head, other bytes there, or no
frame ending at the head, mean the log was cut back under the view, which is then rebuilt
from the log in one transaction (from the cut on, before the fix accepts it). Its head
goes back, so the shared waiter (section 7.6) wakes the followers as in a writer's
process; and `cuts` counts the rebuilds, so that a follower checks that the last event it
delivered is still there (it may have been cut off, and another committed at its ordinal).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Final

from ..errors import JournalCorrupt
from .files import FileOps
from .frames import FRAME_HEADER, FRAME_HEADER_SIZE, FRAME_MAGIC, SEGMENT_HEADER_SIZE, segment_name
from .log import SegmentLog
from .reader_views import build_private, project_new, refresh_private
from .segments import open_segment
from .view import Head, View

__all__ = ["PrivateTail"]

_log: Final = logging.getLogger("journal")
_Frame = tuple[int, int, bytes]  # (segment base, offset, header) of the view's last frame


class _Cut(Exception):
    """No frame of the segment ends where the view's head says its frames end."""


class PrivateTail:
    """The last frame a private view projected (None: not known, or none to compare)."""

    __slots__ = ("_frame", "_listed", "_tried", "cuts")

    def __init__(self) -> None:
        self._frame: _Frame | None = None
        # How many times the view was rebuilt because the log was cut back under frames
        # it had projected (`Engine.withdrawals`: followers then check what they delivered).
        self.cuts = 0
        # While the view records events missing from the log (SPEC 9, "Events the log
        # lacks"): the segment files listed before the view was built (`listed_before`)
        # or at the first refresh since, else None.
        self._listed: set[int] | None = None
        # The files that came back whose rebuild failed (a copy still being written), with
        # their sizes and times: tried again once they change.
        self._tried: dict[int, tuple[int, int]] | None = None

    def listed_before(self, log: SegmentLog) -> None:
        """Note the segment files before the view is built (at open), so that one restored
        after the build and before the first refresh is seen as new."""
        self._listed = set(log.bases())

    def refresh(self, log: SegmentLog, view: View, ops: FileOps) -> None:
        """`refresh_private`, after rebuilding the view if the log was cut under it, or if
        a segment file lost came back."""
        self._rebuild_if_cut(log, view, ops, once=False)
        self._rebuild_if_restored(log, view)
        refresh_private(log, view, ops)

    def _rebuild_if_restored(self, log: SegmentLog, view: View) -> None:
        """A segment file that appears below the view's segment was restored (rotation
        adds them above, compaction replaces them under their names): a view that found
        events missing is rebuilt, to serve them again. (Without, a long-lived reader
        refused them after the restore and the writer's fix, which writes no frame:
        a review.) One listing per refresh while something is missing, none else."""
        with view.begin() as txn:
            head = view.head(txn)
            lacking = view.any_missing(txn)
        if not lacking or head is None:
            self._listed = self._tried = None
            return
        listed = set(log.bases())
        seen, self._listed = self._listed, listed
        new = set() if seen is None else listed - seen
        came = sorted(base for base in new if base < head.segment)
        if not came:
            return
        marks = _marks(log, came)
        if marks == self._tried:
            self._listed = seen  # (as they were when their rebuild failed: not again)
            return
        _log.warning(
            "%s: a segment file came back: rebuilding this read-only journal's view",
            log.directory,
        )
        try:
            build_private(log, view)
        except JournalCorrupt as e:
            # A file caught while it is being copied back (cut short): the view is kept
            # (it refuses the lost events as before) and the rebuild is tried again once
            # the file changes. (A review: the file was then taken as seen, and the
            # reader refused the events until it reopened.)
            _log.warning("%s: the view is kept, rebuilt again once the file changes", e)
            self._listed, self._tried = seen, marks
            return
        self._frame = None
        self._tried = None

    def catch_up(self, log: SegmentLog, view: View, ops: FileOps) -> None:
        """What `verify` does first in each of its tries (it retries itself, the last time
        under the segment-files lock): `refresh` in one try, also when no frame came, so
        the feed's pruning and the forgetting of tombstones catch up with a retention pass
        or compaction that changed only segment files. Damage is left for it to report."""
        with contextlib.suppress(JournalCorrupt):
            self._rebuild_if_cut(log, view, ops, once=True)
            project_new(log, view, ops)

    def _rebuild_if_cut(self, log: SegmentLog, view: View, ops: FileOps, once: bool) -> None:
        head = _head(view)
        if head is not None:
            try:
                self._frame = _last_frame(log, ops, head, self._frame)
            except _Cut:
                _log.warning(
                    "%s: the log no longer holds frames this read-only journal's view "
                    "indexed (a refused write its writer cut off again, or a hole accepted "
                    "by verify --fix): rebuilding the view",
                    log.directory,
                )
                # (Counted before the rebuild and after: a page read from the rebuilt view
                # finds the count changed, whichever moment it read it.)
                self.cuts += 1
                self.listed_before(log)
                build_private(log, view, once)
                self._frame = None
                self.cuts += 1


def _marks(log: SegmentLog, bases: list[int]) -> dict[int, tuple[int, int]]:
    """The size and modification time of each of these segment files (either form)."""
    marks: dict[int, tuple[int, int]] = {}
    for base in bases:
        for compressed in (False, True):
            path = os.path.join(log.directory, segment_name(base, compressed=compressed))
            with contextlib.suppress(FileNotFoundError):
                info = os.stat(path)
                marks[base] = (info.st_size, info.st_mtime_ns)
    return marks


def _head(view: View) -> Head | None:
    with view.begin() as txn:
        return view.head(txn)


def _last_frame(log: SegmentLog, ops: FileOps, head: Head, known: _Frame | None) -> _Frame | None:
    """The frame that ends at `head` (found from `known` on, when it is in that segment,
    else from the segment's start); `_Cut` when the segment's frames do not end there or
    `known` no longer lies where it was. None when there is nothing to compare (no frame
    in the segment, or no plain file: sealed and compressed since)."""
    if head.end_offset <= SEGMENT_HEADER_SIZE:
        return None
    try:
        fd = open_segment(os.path.join(log.directory, segment_name(head.segment)), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        if os.fstat(fd).st_size < head.end_offset:
            raise _Cut  # (cut short: the writer refuses writes until the fix accepts it)
        offset = SEGMENT_HEADER_SIZE
        if known is not None and known[0] == head.segment:
            if ops.pread(fd, FRAME_HEADER_SIZE, known[1]) != known[2]:
                raise _Cut
            offset = known[1]
        while True:
            header = ops.pread(fd, FRAME_HEADER_SIZE, offset)
            if len(header) < FRAME_HEADER_SIZE:
                raise _Cut
            magic, length = FRAME_HEADER.unpack(header)[:2]
            end = offset + FRAME_HEADER_SIZE + length
            if magic != FRAME_MAGIC or end > head.end_offset:
                raise _Cut
            if end == head.end_offset:
                return head.segment, offset, header
            offset = end
    finally:
        os.close(fd)
