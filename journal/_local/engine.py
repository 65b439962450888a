"""The local engine: a store on disk (segment files + an LMDB view).

Bootstrap (creating or opening a store, its id, the cursor key ring, discarding a view
that a reboot may have torn, a private view for read-only readers that cannot lock the
store), the commit protocol, reads and maintenance.

Commit protocol (SPEC 7.1): one thread at a time leads a group commit. In the LMDB write
transaction (the writers' lock across processes) it indexes committed frames the view
has not seen and cuts off a torn tail (`catch_up`), plans every queued operation, writes
their records as ONE frame, syncs it once, projects it, commits, and only then
acknowledges the callers.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Sequence
from functools import partial
from typing import Final, TypeVar

import lmdb
import msgspec

from cursors import KeyRing

from ..abandoned import wait_for_dropped
from ..engine import (
    AbortImport,
    Append,
    ApplyRetention,
    EventsPage,
    Expire,
    Lease,
    Operation,
    PageReaders,
    PolicyChange,
    Progress,
    StoredSnapshot,
    VerifyFix,
)
from ..errors import (
    JournalClosed,
    JournalError,
    ReadOnlyStore,
    SessionNotFound,
    StoreUnavailable,
)
from ..forking import INHERITED, TRANSACTIONS
from ..models import (
    CompactionReport,
    ReadContext,
    RetentionPolicy,
    RetentionReport,
    SessionState,
    StoreStats,
    VerifyProblem,
    VerifyReport,
)
from ..records import CheckpointTaken, SnapshotTaken
from ..sessions import FeedEntry, SessionRow
from ..waiter import Notifier
from .catch_up import CatchUp
from .commit_queue import CommitQueue
from .commits_seen import CommitsSeen
from .compaction import Compactions, SealActive, SwapSegment, finish_swaps
from .cut_tails import cut_at_damage
from .expiry import ExpiryTimer
from .failures import (
    disk_errors,
    held_by_this_process,
    open_failure,
    os_error_of,
    outcome_unknown,
    reads_disk,
    store_wide,
    unavailable,
)
from .files import DEFAULT_FILE_OPS, Permissions
from .frames import FrameInfo
from .inotify import DirectoryChanges
from .known_rows import KnownRows
from .leases import (
    BOOT_ID,
    PROCESS_BOOT,
    LocalLease,
    OwnerRounds,
    acquire_operation,
    busy,
    drop_lock,
    lock_path,
    owner_alive,
    remove_evicted_locks,
    take_lock,
)
from .log import SegmentLog
from .opening import (
    LocalOptions,
    discard_view_after_reboot,
    key_ring_for,
    open_checked_view,
    open_reader_view,
    remove_private_view,
)
from .planner import Planner, Request, SealRetention
from .private_tail import PrivateTail
from .projector import Projection
from .reader import ReaderCache, read_page
from .recorded_policy import RecordedPolicy
from .recovery import process_alive
from .retention import SummaryCache, delete_segment_files
from .segments import ActiveDamage, LogHole
from .store_file import (
    STORE_FORMAT,
    finish_creation,
    record_in_store,
    remove_stray_temporaries,
    store_at_open,
)
from .stored import stored_record
from .verify import verify_store
from .view_codec import ListedRows

__all__ = ["STORE_FORMAT", "LocalEngine", "LocalOptions"]

_log: Final = logging.getLogger("journal")
ResultT = TypeVar("ResultT")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class LocalEngine:
    """The segment-and-LMDB engine of one open store (see the module docstring).

    Thread-safe; several processes may open the same store. Use `LocalEngine.open`.
    Its parts (`log`, `view`, `summaries`, `compactions`, `expiry`, and `private_dir`,
    the directory of a read-only journal's private view, else None) are its own: tests
    and benchmarks look at them; the facade never does.
    """

    max_import_sessions: int | None = None
    joins_staging_steps: bool = False
    reads_block: bool = False
    reads_uncut: bool = True
    keys_in_stream: bool = False
    store_id: bytes
    key_ring: KeyRing
    readonly: bool
    location: str
    waiter: Notifier
    _readers: weakref.WeakSet[ReaderCache]
    _leases: set[LocalLease]

    @classmethod
    def open(cls, path: str, options: LocalOptions) -> LocalEngine:
        try:
            return cls._open(path, options)
        except StoreUnavailable as e:
            if not held_by_this_process(e):
                raise
            # A forked child holding its parent's journals (unusable here: `check_usable`)
            # closes them, as their close() would. Or a journal of this
            # process dropped without close() may be closing it now (in its own thread:
            # `abandoned`): once that is done, the store is free. One that only a reference
            # cycle still holds (an exception's traceback that holds the frame that held
            # it) is collected first: it held the store until the cycle collector ran, so
            # an open right after failed (a trial). The open is tried again
            # even when no close was in flight by then: one that ended after the first
            # try failed was not waited for, and that open raised "open already" with
            # the store free (1 in 10 opens right after a dropped journal).
            if not INHERITED.close_all():
                gc.collect()
                wait_for_dropped(5.0)
        return cls._open(path, options)

    @classmethod
    def _open(cls, path: str, options: LocalOptions) -> LocalEngine:
        self = object.__new__(cls)
        self._closed = True  # until _init has opened everything
        self._readers = weakref.WeakSet()
        self._leases = set()
        try:
            self._init(path, options)
        except BaseException as e:
            self._release()  # nothing opened so far may outlive the failed open
            failure = open_failure(e, path, options.readonly)
            if failure is None:
                raise
            raise failure from e
        INHERITED.add(self)
        return self

    def inherited(self) -> bool:
        """Whether a parent process opened this journal (this is a forked child), open."""
        return os.getpid() != self._pid and not self._closed

    def _init(self, path: str, options: LocalOptions) -> None:
        readonly = options.readonly
        ops = options.file_ops or DEFAULT_FILE_OPS
        # Every file is opened by a path made from this one, so a relative path is made
        # absolute once: a chdir of the process later (a runtime entering a workspace)
        # does not move the store from under the journal (SPEC 7).
        self.location = path = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
        self._host = socket.gethostname()
        self.owners_alive = OwnerRounds(path, self._host).check  # (`Engine.owners_alive`)
        self.readonly = readonly
        self._ops = ops
        self._pid = os.getpid()
        self._private_lock, self._private_tail = threading.RLock(), PrivateTail()  # (`close`)
        store_file = os.path.join(path, "store.json")
        store = store_at_open(
            path, options.create, readonly, options.file_mode, options.retention, ops
        )
        # The policy in force: the store's as recorded now, read again at each pass (SPEC 8).
        self.policy = RecordedPolicy(store_file, options.retention or store.retention)
        self.store_id = store.store_id
        self.permissions = permissions = Permissions(store.file_mode)
        self.key_ring = key_ring_for(path, options.key_ring, readonly, permissions)
        self.log = SegmentLog(
            os.path.join(path, "segments"),
            self.store_id,
            segment_bytes=options.segment_bytes,
            sync=options.durability == "fsync",
            compress_sealed=options.compress_sealed,
            ops=ops,
            permissions=permissions,
        )
        # Read-only on a store whose LMDB files this process cannot lock (no write access):
        # a private view outside the store, built from the segments and kept up to date by
        # scanning the active segment's tail. Nothing in the store is created or locked.
        self.private_dir: str | None = None
        # Why a read-only journal does not use the store's view, when that is damage
        # (`verify` reports it: the private view it uses instead is rebuilt from the log).
        self._shared_damage: VerifyProblem | None = None
        index = os.path.join(path, "index")
        rebooted = False
        if not readonly:
            remove_stray_temporaries(path, process_alive)
            rebooted = discard_view_after_reboot(path, permissions, BOOT_ID)
            self.view = open_checked_view(index, permissions)
        else:
            # (Before the build: a segment file restored after it is new to the first refresh.)
            self._private_tail.listed_before(self.log)
            self.view, self.private_dir, self._shared_damage = open_reader_view(index, self.log)
        # What retention needs of sealed segments' sidecars, within a byte budget.
        self.summaries = SummaryCache()
        self._retention_due = False
        # This process's first pass after a seal reads every row (the policy may have
        # changed since the last open); once one succeeded, later ones are narrow.
        self._first_sweep: Request | None = None
        self._catch_up = CatchUp(
            self.log, self.view, self.store_id, self._ops, after_reboot=rebooted
        )
        self._commits = CommitQueue(self._run_commit, self._follow_up, self._ops)
        self._rows = KnownRows()  # (rows the last batch of appends wrote: `known_rows`)
        self._cuts: list[VerifyProblem] = []  # (made for a fix: its report says so)
        self._cut_durable = options.repair == "cut-durable"  # (`cut_tails.cut_at_damage`)
        changes = partial(self._head_changes, CommitsSeen(self.log.directory, self._ops))
        self.waiter = Notifier(self.head, self.changes, changes, rewinds=True, lagging_reads=True)
        self.expiry: ExpiryTimer | None = None
        self.compactions = Compactions(self.log, self.view, self.submit)
        self._closing = False
        self._closed = False
        if not readonly:
            # (Opened anyway, so `verify(fix=True)` can accept the loss: until then every
            # write fails with this error, and reads of the lost frames too. Damage in the
            # active segment only with `repair`: without a view, reads would find nothing.)
            anyway = (LogHole, ActiveDamage) if options.repair else (LogHole,)
            with self._commits.leading(), contextlib.suppress(*anyway):
                self._run_commit([])
            # (The first segment and the view are there: a store whose creation this or an
            # earlier open began is finished, SPEC 7.)
            finish_creation(path, ops)
            self._roll_back_abandoned_imports()
            finish_swaps(self.log, self.view, self.submit, process_alive)
            self.expiry = ExpiryTimer(self)

    def changes(self) -> DirectoryChanges | None:
        """What the waiter thread sleeps on (module `inotify`): the view's directory, where
        every commit ends, or the segments a private view projects itself."""
        if self.private_dir is None:
            return DirectoryChanges.open([os.path.join(self.location, "index")])
        return DirectoryChanges.open([self.log.directory])

    def next_deadline(self) -> int | None:
        """The nearest session deadline (for the expiry timer)."""
        self.check_usable()
        with self.view.begin() as txn:
            return self.view.next_deadline(txn)

    def expire_now(self) -> None:
        """Expire what is due (for the expiry timer)."""
        self.submit(Expire())

    def maintain(self) -> None:
        """The maintenance commits asked for (the expiry thread runs it, `ExpiryTimer.poke`):
        compact the sealed segments whose evicted sessions' eviction records alone keep
        newer segments; a retention pass then deletes what that freed (SPEC 8, "Eviction
        records"). Only after a rewrite: a pass that finds the same segments held again
        asks again, and this must not turn into a loop of passes."""
        if self.compactions.unpin(lambda: self._closing):
            self.submit(SealRetention(None))

    def _roll_back_abandoned_imports(self) -> None:
        """Roll back imports whose importing process is gone (killed before its commit):
        their staged sessions never became visible, and now never will."""
        with self.view.begin() as txn:
            staged = self.view.staged_rows(txn)
        del txn  # (no read transaction object outlives its transaction: SPEC 7)
        dead = [
            row.incarnation for row in staged if owner_alive(row, self._host, PROCESS_BOOT) is False
        ]
        if dead:
            self.submit(AbortImport(dead))

    def close(self) -> None:
        """Close the engine; pending waits end; leases still held are released (and the
        release recorded, when the store can still be written). Idempotent."""
        for lease in list(self._leases):
            with contextlib.suppress(JournalError, OSError, lmdb.Error):
                lease.release()
        if os.getpid() != self._pid:
            # A forked child: the parent's threads (a leader, the expiry timer) are not
            # here, and the condition's lock may have been held at fork: touch neither.
            # fork() waited for LMDB transactions in flight, so the environments close
            # (unless the fork came from inside one: closing would free its reader slot,
            # which is the parent's). The private view of a read-only journal is the
            # parent's: it stays.
            self._closed = True
            if TRANSACTIONS.held_at_fork:
                self.log.close()
            else:
                self._release(remove_private=False)
            return
        self._closing = True  # (a `maintain` in flight stops at its next segment)
        expiry = getattr(self, "expiry", None)
        if expiry is not None:
            expiry.stop()
            # A pass in flight finishes before the environment goes (it would meet a
            # closed one); bounded, in case close() runs where that pass waits.
            if expiry.busy.acquire(timeout=5):
                expiry.busy.release()
        self.compactions.wait(5)  # (the same for a compaction)
        if not self._commits.close():
            return
        self._closed = True
        self.waiter.publish(1 << 63)
        try:
            self.waiter.close()  # its thread reads no head from now on
        finally:
            # Followers that are not being advanced still hold segment files: release
            # them (a page in flight finishes first; see ReaderCache). A signal handler's
            # close inside an LMDB transaction of its thread: as it ends (`ForkGate.defer`).
            for readers in list(self._readers):
                readers.close()
            if not TRANSACTIONS.defer(self._release):
                self._release()

    def _release(self, *, remove_private: bool = True) -> None:
        """Close the files and environments opened so far (close, or a failed open)."""
        log = getattr(self, "log", None)
        if log is not None:
            log.close()
        view = getattr(self, "view", None)
        if view is not None:
            if remove_private:
                with self._private_lock:
                    view.close()
            else:
                view.close()  # (a forked child: the lock may have been held at fork)
        private = getattr(self, "private_dir", None)
        if private is not None and remove_private:
            remove_private_view(private)

    @reads_disk
    def check_usable(self) -> None:
        if self._closed:
            raise JournalClosed.already()
        if os.getpid() != self._pid:
            raise JournalClosed.inherited("LMDB handles do not survive fork")
        if self.private_dir is not None:
            self._refresh_private_view()

    @reads_disk
    def head(self) -> int:
        return self._head_changes(None)[0]

    def _head_changes(self, seen: CommitsSeen | None) -> tuple[int, set[int] | None]:
        """The committed head (a view replaced or cut short is seen as the transaction
        begins) and, with `seen` (the waiter thread's), the sessions the commits since
        its previous call touched (None: not known)."""
        if self._closed:
            return 1 << 63, None
        if self.private_dir is not None:
            self._refresh_private_view()
        with self.view.begin() as txn:
            head = self.view.head(txn)
        touched = None if seen is None else seen.since_last(head)
        return (1 if head is None else head.next_position), touched

    def _refresh_private_view(self) -> None:
        """Project frames the writer committed since (read-only private view: `PrivateTail`)."""
        with self._private_lock:
            if not self._closed:
                self._private_tail.refresh(self.log, self.view, self._ops)

    # -- the commit path -------------------------------------------------------------------

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

    # -- reads -----------------------------------------------------------------------------

    def session(self, session_id: str) -> SessionRow | None:
        with self.view.begin() as txn:
            return self.view.row(txn, session_id)

    def confirm_current(self) -> None:
        """One copy, every commit in it (`Engine.confirm_current`)."""

    def withdrawals(self) -> int:
        """Rebuilds of the private view after a cut under it (`Engine.withdrawals`)."""
        return self._private_tail.cuts

    def session_id_of(self, incarnation: int) -> str | None:
        with self.view.begin() as txn:
            return self.view.session_id_of(txn, incarnation)

    def sessions(
        self, after_id: str | None, state: SessionState | None, limit: int
    ) -> tuple[list[SessionRow], bool]:
        rows: list[SessionRow] = []
        view = self.view
        self._ops.point("sessions.list", after_id)
        with view.begin() as txn:
            # A state filter reads its state's index, not every row (SPEC 7.7).
            found = (
                view.rows(txn, after_id)
                if state is None
                else view.states.rows(txn, state.wire, after_id)
            )
            for row in found:
                if len(rows) == limit:
                    return rows, True
                rows.append(row)
        return rows, False

    def registry(self) -> tuple[int, Sequence[SessionRow]]:
        view = self.view
        with view.begin() as txn:
            head = view.head(txn)
            point = 0 if head is None else head.next_position - 1
            encoded = view.encoded_rows(txn)
        return point, ListedRows(encoded)

    def feed(
        self, after_position: int, limit: int, newest_first: bool = False
    ) -> tuple[list[tuple[int, FeedEntry]], int, int]:
        with (view := self.view).begin() as txn:
            head, floor = view.head(txn), view.feed_floor(txn)
            entries = view.feed_after(txn, after_position, limit, newest_first) if limit else []
        return entries, 1 if head is None else head.next_position, floor

    def readers(self) -> PageReaders:
        readers = ReaderCache(self.log.directory, self._ops)
        self._readers.add(readers)
        return readers

    @reads_disk
    def read(
        self,
        session_id: str,
        incarnation: int,
        after_ordinal: int,
        max_bytes: int,
        context: ReadContext,
        readers: PageReaders,
    ) -> EventsPage:
        if not isinstance(readers, ReaderCache):
            raise TypeError("readers must come from this engine's readers()")
        refresh = None if self.private_dir is None else self._refresh_private_view
        return read_page(
            self.view, session_id, incarnation, after_ordinal, max_bytes, context, readers, refresh
        )

    @reads_disk
    def snapshot(self, row: SessionRow) -> StoredSnapshot | None:
        return stored_record(self.log, row, SnapshotTaken)

    @reads_disk
    def checkpoint(self, row: SessionRow) -> StoredSnapshot | None:
        if not row.checkpoint_position:
            return None
        return stored_record(self.log, row, CheckpointTaken)

    # -- owner leases ----------------------------------------------------------------------

    def acquire(self, session_id: str, wait_s: float) -> Lease:
        self.check_usable()
        if self.readonly:
            raise ReadOnlyStore("own() needs a writable journal")
        row = self.session(session_id)
        if row is None:
            raise SessionNotFound(
                f"no session {session_id!r} in this store: create it before owning it"
            )
        path = lock_path(self.location, session_id)
        try:
            fd = take_lock(path, wait_s, self.permissions, self.check_usable)
        except OSError as e:  # the lock file: a directory, a FIFO, a full disk, ...
            raise unavailable(e) from e
        if fd is None:
            raise busy(session_id, path, wait_s)
        try:
            updated = self.submit(acquire_operation(session_id, PROCESS_BOOT))
        except BaseException:
            drop_lock(fd, path, self._ops)
            raise
        lease = LocalLease(
            self.submit,
            session_id,
            updated.incarnation,
            updated.owner_generation,
            (fd, path, self._ops),
            self._leases.discard,
        )
        self._leases.add(lease)
        return lease

    def owner_alive(self, row: SessionRow) -> bool | None:
        lock = lock_path(self.location, row.session_id)
        return owner_alive(row, self._host, PROCESS_BOOT, lock)

    # -- maintenance -----------------------------------------------------------------------

    @reads_disk
    def verify(self, progress: Progress | None) -> VerifyReport:
        step = partial(self._private_tail.catch_up, self.log, self.view, self._ops)
        first = None if self.private_dir is None else (self._private_lock, step)
        report = verify_store(self.log, self.view, not self.readonly, progress, first)
        if self._shared_damage is None:
            return report
        return msgspec.structs.replace(report, problems=[self._shared_damage, *report.problems])

    @disk_errors("maintenance")
    def compact(self, dead_share: float, progress: Progress | None) -> CompactionReport:
        self.check_usable()  # (before the lock: a forked child's copy of it may be held)
        return self.compactions.compact(dead_share, progress)

    def retention_policy(self) -> RetentionPolicy:
        return self.policy.current()

    @disk_errors("maintenance")
    def change_retention_policy(self, change: PolicyChange) -> RetentionPolicy:
        self.check_usable()
        # (`change` runs under the open lock, while `store.json` is read and replaced.)
        record_in_store(self.location, self.permissions, retention=change, ops=self._ops)
        return self.policy.current()

    @reads_disk
    def stats(self) -> StoreStats:
        with self.view.begin() as txn:
            counts = self.view.states.counts(txn)  # (the index's keys, not the rows)
            head = self.view.head(txn)
        end = None if head is None else (head.segment, head.end_offset)
        segments, size, ahead = self.log.files(end)  # (ahead: the zeros past `end`)
        next_position = 1 if head is None else head.next_position
        return StoreStats(dict(sorted(counts.items())), segments, size, next_position, None, ahead)


# Requests that may have finished part of their work before a failure (a swap's rename,
# a seal's rotation, a retention pass's deleted files, a fix's repairs): their error
# says what was done stays done, not that nothing was committed.
_MAINTENANCE: Final = (SwapSegment, SealActive, ApplyRetention, VerifyFix)


def _during(operation: object) -> str:
    return "maintenance" if isinstance(operation, _MAINTENANCE) else "commit"


class _SegmentCut(Exception):
    """A fix cut the active segment at damage in the transaction it aborted: commit the
    batch again."""
