"""A writer's catch-up, at the start of every commit inside the write transaction (SPEC
7.1): index the committed frames the view has not seen (another process's, or a crashed
writer's), rebuilding a missing view from the log; record the boot; finish what a crash
or a failure interrupted (a seal, a rename); cut off what never committed (keeping a copy
of bytes read from the log first, SPEC 3.3), and position the writer after the last
committed frame.
"""

from __future__ import annotations

import lmdb

from ..errors import StoreIncompatible
from .files import FileOps
from .frames import SEGMENT_HEADER_SIZE
from .leases import BOOT_ID
from .log import SegmentLog
from .projector import Projection, project_log, project_segments
from .recovery import discard_unborn_tail, finish_interrupted
from .segments import KnownZeros
from .sidecar import read_summary
from .view import Head, View

__all__ = ["CatchUp"]


class CatchUp:
    """One writer's catch-up (see the module docstring) and what it remembers between
    commits: what it found zero at the active segment's end, whether it recorded the
    boot, and whether what an earlier failure interrupted was finished."""

    __slots__ = (
        "_after_reboot",
        "_boot_recorded",
        "_finished_interrupted",
        "_known_zeros",
        "_log",
        "_ops",
        "_store_id",
        "_view",
    )

    def __init__(
        self,
        log: SegmentLog,
        view: View,
        store_id: bytes,
        ops: FileOps,
        *,
        after_reboot: bool = False,
    ) -> None:
        self._log = log
        self._view = view
        self._store_id = store_id
        self._ops = ops
        # What this writer's catch-ups found zero at the active segment's end (it compares
        # only what was added since: `segments.KnownZeros`).
        self._known_zeros = KnownZeros()
        self._finished_interrupted = False
        self._boot_recorded = False
        # This journal's open discarded a view of another boot (`discard_view_after_reboot`):
        # until a catch-up of it succeeds, a rebuild reads only what the disk holds.
        self._after_reboot = after_reboot

    def interrupted(self) -> None:
        """A failure may have interrupted work (a seal, a rename): the next catch-up
        finishes it, as after a crash, even at the same place."""
        self._finished_interrupted = False

    def run(self, txn: lmdb.Transaction) -> Head:
        """Index committed frames the view has not seen; position the writer after them."""
        view = self._view
        log = self._log
        head = view.head(txn)
        rebuilt = head is None  # (then a cut keeps a copy: below)
        if head is not None:
            log.cut_pending_frames((head.segment, head.end_offset, head.next_position))
        if head is None:
            stored = view.store_id(txn)
            if stored is not None and stored != self._store_id:
                raise StoreIncompatible("the index belongs to another store; delete index/")
            view.put_store_id(txn, self._store_id)
            if not log.bases():
                log.start_first_segment()
                log.record_feed_floor(0)  # (nothing pruned: a rebuild may trust the feed)
                head = Head(1, SEGMENT_HEADER_SIZE, 1, 0)
                view.put_head(txn, head)  # a new store's view says where its log ends
            else:
                # No view yet (new, deleted, or discarded after a reboot): rebuild it from
                # the sidecars of sealed segments and a scan of the rest.
                discard_unborn_tail(log)
                finish_interrupted(log, rebuilding=True)
                self._finished_interrupted = True
                # (Before the boot is recorded: a view nobody committed to since the reboot.)
                from_disk = self._after_reboot and view.boot_id(txn) is None
                head = project_log(log, view, txn, record_floor=True)
                if not from_disk and head.segment == log.bases()[-1]:
                    # The page cache may hold frames of the active segment that are not on
                    # disk (a refused frame whose sync failed, an "os" writer's): written
                    # again and synced before anything is acknowledged after them (SPEC
                    # 14.4). After a reboot the page cache is gone: nothing to do.
                    log.sync_indexed(
                        (head.segment, SEGMENT_HEADER_SIZE), (head.segment, head.end_offset)
                    )
            # (A new store's first segment was born synced; a rebuilt log is on disk.)
            log.synced_to((head.segment, head.end_offset, head.next_position))
        if not self._boot_recorded:
            if view.boot_id(txn) != BOOT_ID:
                view.put_boot_id(txn, BOOT_ID)
            self._boot_recorded = True
        if not self._finished_interrupted and log.writer_at(
            head.segment, head.end_offset, head.next_position
        ):
            # (After a failure: what it interrupted is finished even at the same place.)
            finish_interrupted(log)
            self._finished_interrupted = True
        if log.writer_at(head.segment, head.end_offset, head.next_position):
            self._after_reboot = False
            return head
        discard_unborn_tail(log)
        if not self._finished_interrupted:
            finish_interrupted(log)
            self._finished_interrupted = True
        recorded = (head.segment, head.end_offset, head.next_position)
        indexed_from = head.next_position
        projection = Projection(view, txn, head, self._ops)
        for base in project_segments(log, projection, known_zeros=self._known_zeros):
            if read_summary(log.directory, base) is None:
                log.seal(base)
        projection.flush()
        head = projection.head
        if head.next_position != indexed_from:
            # (Frames no commit acknowledged: made durable before they are: SPEC 14.4;
            # with the frames before them in the head's segment.)
            log.sync_indexed(recorded[:2], (head.segment, head.end_offset))
            log.synced_to((head.segment, head.end_offset, head.next_position))
        elif not rebuilt:
            # The writer was not at the head: others committed since its last commit (or it
            # has not committed yet), maybe with durability "os": their frames in the
            # active segment are synced before this commit builds on them (SPEC 14.4).
            log.sync_segment(recorded)
        # Bytes past a head the view recorded never committed; past one read from the log
        # (a rebuild, frames indexed here) a cut keeps a copy first (SPEC 3.3).
        kept = rebuilt or head.next_position != indexed_from
        log.attach_writer(head.segment, head.end_offset, head.next_position, kept)
        self._after_reboot = False
        return head
