"""The local engine's commit path: `CommitPath`, the base class of `LocalEngine`.

Commit protocol (SPEC 7.1): one thread at a time leads a group commit. In the LMDB write
transaction (the writers' lock across processes) it indexes committed frames the view
has not seen and cuts off a torn tail (`catch_up`), plans every queued operation, writes
their records as ONE frame, syncs it once, projects it, commits, and only then
acknowledges the callers.
"""

from __future__ import annotations

import abc
import logging
import time
from typing import Final, TypeVar

import lmdb
import msgspec

from ..engine import Append, ApplyRetention, Expire, Operation, VerifyFix
from ..errors import JournalError
from ..models import RetentionReport, VerifyProblem
from ..waiter import Notifier
from .catch_up import CatchUp
from .commit_queue import CommitQueue
from .compaction import Compactions, SealActive, SwapSegment
from .cut_tails import cut_at_damage
from .expiry import ExpiryTimer
from .failures import os_error_of, outcome_unknown, store_wide, unavailable
from .files import FileOps, Permissions
from .frames import FrameInfo
from .known_rows import KnownRows
from .leases import BOOT_ID, remove_evicted_locks
from .log import SegmentLog
from .planner import Planner, Request, SealRetention
from .projector import Projection
from .recorded_policy import RecordedPolicy
from .retention import SummaryCache, delete_segment_files
from .segments import ActiveDamage, LogHole
from .view import View

__all__ = ["CommitPath"]

_log: Final = logging.getLogger("journal")
ResultT = TypeVar("ResultT")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class CommitPath(abc.ABC):
    """Group commit (see the module docstring): `submit`, and the batches the commit
    queue's leader commits. `LocalEngine` extends it: its open sets the parts declared
    here, and it says when the engine may be used (`check_usable`)."""

    store_id: bytes
    location: str
    permissions: Permissions
    log: SegmentLog
    view: View
    summaries: SummaryCache
    policy: RecordedPolicy
    waiter: Notifier
    compactions: Compactions
    expiry: ExpiryTimer | None
    _ops: FileOps
    _catch_up: CatchUp
    _commits: CommitQueue
    _rows: KnownRows
    _cuts: list[VerifyProblem]
    _cut_durable: bool
    _retention_due: bool
    _first_sweep: Request | None

    @abc.abstractmethod
    def check_usable(self) -> None:
        """Raises when the engine may not be used (`LocalEngine.check_usable`)."""

    def submit(self, operation: Operation[ResultT]) -> ResultT:
        """Commit `operation` with whatever else is queued (group commit); its result."""
        self.check_usable()
        if isinstance(operation, VerifyFix) and self.view.inspect() is not None:
            self.view.repair()  # the commit replaces the damaged view (SPEC section 9)
        request = Request(operation)
        # (A fix runs the caller's progress callback inside its commit: left interruptible.)
        self._commits.submit(request, here=isinstance(operation, VerifyFix))
        error = request.error
        if isinstance(error, OSError):
            # Failed alone while it was planned (a compaction swap, a fix writing a
            # sidecar): what it interrupted is finished by the next catch-up.
            self._catch_up.interrupted()
            raise unavailable(error, _during(operation)) from error
        if error is not None:
            request.error = None
            try:
                raise error
            finally:
                # Its traceback holds the frames it passed (the commit's, and through
                # them the caller's journal): none may hold it back, or a journal dropped
                # after a failed call (SessionExists) stayed open, its store "open
                # already", until the cycle collector ran (a trial).
                del error, request
        result: ResultT = request.result
        return result

    def _follow_up(self) -> Request | None:
        """After a batch: the retention pass a seal made due (SPEC 8, "What a pass reads")."""
        if not self._retention_due:
            return None
        self._retention_due = False
        sweep = self._first_sweep
        if sweep is not None and sweep.error is None and sweep.result is not None:
            return Request(SealRetention(None))
        self._first_sweep = Request(ApplyRetention(None))
        return self._first_sweep

    def _run_commit(self, batch: list[Request], taken: bool = False) -> None:
        try:
            if taken:
                self._ops.point("commit.batch_taken", len(batch))
            for attempt in range(8):
                try:
                    self._commit(batch)
                    return
                except lmdb.MapFullError:
                    if attempt == 7:
                        raise
                    self.view.grow()
                except _SegmentCut:
                    if attempt == 7:
                        raise
        except BaseException as e:
            if isinstance(e, Exception) and len(batch) > 1 and not store_wide(e):
                # Something one request carried failed after planning (encoding its
                # records, projecting them): nothing was committed, so commit each
                # request alone and let the failure stay with the one that causes it.
                for r in batch:
                    self._run_commit([r])
                return
            # Nothing of this batch was committed: no caller may see a result.
            error: BaseException = e
            os_error = os_error_of(e, self.location) if isinstance(e, lmdb.Error) else e
            if isinstance(os_error, OSError):
                error = unavailable(os_error)
                # Work the failure interrupted (a seal, a rename) is finished by the next
                # catch-up, as after a crash.
                self._catch_up.interrupted()
            for r in batch:
                r.result = None
                r.error = error
                if isinstance(os_error, OSError) and _during(r.operation) == "maintenance":
                    r.error = unavailable(os_error, "maintenance")
            if not batch:
                if error is e:
                    raise
                raise error from e

    def _commit(self, batch: list[Request]) -> None:
        view = self.view
        log = self.log
        before: tuple[int, int, int] | None = None
        info: FrameInfo | None = None  # (where the frame was written)
        try:
            # (A compaction swap keeps the segment-files lock until the transaction is
            # over, and no longer: the undo below takes the writer lock again.)
            with log.keeping_files_lock(), view.begin(write=True) as txn:
                try:
                    head = self._catch_up.run(txn)
                    hole = None
                except LogHole as e:
                    # Only a verify(fix=True) goes on: it accepts the loss.
                    viewed, hole = view.head(txn), e
                    fixes = [r for r in batch if isinstance(r.operation, VerifyFix)]
                    if viewed is None or not fixes:
                        raise
                    head = viewed
                    for r in batch:
                        if r not in fixes:
                            r.error = e
                    batch = fixes
                except ActiveDamage as e:
                    if not any(isinstance(r.operation, VerifyFix) for r in batch):
                        raise
                    # A fix cuts the segment there (a copy kept first; only with "cut-durable"
                    # where no "os" writer wrote it), and the batch is committed again on the
                    # log as cut (`_run_commit`).
                    cut = cut_at_damage(
                        log.directory,
                        e.base,
                        e.offset,
                        self._ops,
                        self.permissions,
                        cut_durable=self._cut_durable,
                    )
                    self._cuts.append(cut)
                    raise _SegmentCut from e
                planner = Planner(
                    txn,
                    view,
                    log,
                    self.summaries,
                    self.policy,
                    (self.store_id, BOOT_ID),
                    head.next_position,
                    _now_ms(),
                )
                planner.hole, planner.cuts = hole, self._cuts
                planner.known_rows = self._rows.valid(
                    txn.id(), head.next_position, id(self.view.env)
                )
                explicit = any(isinstance(r.operation, Expire) for r in batch)
                if hole is None and batch and not explicit:
                    # (An explicit expiry in the batch does it, and reports what it did.)
                    planner.expire_due()
                for request in batch:
                    planner.plan(request)
                # A refused frame another writer indexed is acknowledged for plain appends
                # only: all they change in the view comes from the frame's records.
                known = all(type(r.operation) is Append for r in batch)
                projection = Projection(view, txn, head, self._ops)
                # Rows the planner read in this transaction are the ones the projection
                # would read again: hand them over.
                for row in planner.rows_read():
                    projection.adopt(row)
                if planner.records:
                    before = log.writer_end()
                    info = log.append_records(planner.records, planner.digest())
                    if info.segment != before[0]:
                        # A segment was sealed: the moment to let retention reclaim space.
                        self._retention_due = True
                    projection.apply(info, planner.records, planner.event_runs)
                    self._ops.point("commit.view_flush")
                    projection.flush()
                planner.finish()
                self._ops.point("commit.view_commit")
                transaction_id = txn.id()
            # The transaction committed: from here on the frame is acknowledged.
        except BaseException as e:
            self._rows.forget()
            if before is None:
                raise
            log.owe_cut(before)  # (cut under the write lock again: `undo_append`)
            self._ops.point("commit.refused")
            # (Another writer that took the lock first indexed the frame? It is committed.)
            frame = (info, planner.records) if info and known and isinstance(e, Exception) else None
            cutting = False
            try:
                with view.begin(write=True) as txn:
                    h = view.head(txn)
                    at = None if h is None else (h.segment, h.end_offset, h.next_position)
                    cutting = True
                    indexed = log.undo_append(at, frame)
            except (OSError, lmdb.Error, JournalError) as cut:
                if cutting and isinstance(cut, JournalError):
                    raise  # (the cut was made; or it met committed frames cut: `LogHole`)
                # The frame stays, its cut owed: not "nothing committed" (SPEC 14.4). Nor
                # when the transaction the cut needs cannot begin (the view is damaged or
                # gone): the rebuild of the view, or the next writer, indexes the frame.
                self._catch_up.interrupted()
                raise outcome_unknown(e, cut, self.location) from cut
            if not indexed:
                raise
            _log.warning("a failed commit's frame was indexed by another writer: acknowledged")
        else:
            self._rows.remember(batch, planner, projection, transaction_id, view)
        if planner.doomed:
            try:
                freed = delete_segment_files(log, planner.doomed)
            except OSError as e:
                # The batch committed: its callers must not see a failure (a retry would
                # duplicate). The next retention pass finds the files dead and deletes them.
                _log.warning("could not delete dead segments %s: %s", planner.doomed, e)
                freed = 0
            for request in batch:
                if isinstance(request.result, RetentionReport):
                    request.result = msgspec.structs.replace(request.result, reclaimed_bytes=freed)
        if planner.unpin:
            self.compactions.ask(planner.unpin)
            if self.expiry is not None:
                self.expiry.poke()
        if planner.evicted:
            remove_evicted_locks(self.location, planner.evicted, self._ops)
        if info is not None:  # (waking the followers of the sessions it touched only)
            # (The frame's end: a refused frame another writer indexed was maybe not
            # projected here.)
            self.waiter.publish(info.last_position + 1, projection.touched(), info.first_position)
            due = projection.nearest_new_deadline
            if due is not None and self.expiry is not None:
                self.expiry.nearer(due)


# Requests that may have finished part of their work before a failure (a swap's rename,
# a seal's rotation, a retention pass's deleted files, a fix's repairs): their error
# says what was done stays done, not that nothing was committed.
_MAINTENANCE: Final = (SwapSegment, SealActive, ApplyRetention, VerifyFix)


def _during(operation: object) -> str:
    return "maintenance" if isinstance(operation, _MAINTENANCE) else "commit"


class _SegmentCut(Exception):
    """A fix cut the active segment at damage in the transaction it aborted: commit the
    batch again."""
