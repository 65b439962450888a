"""The local engine: a store on disk (segment files + an LMDB view).

Bootstrap (creating or opening a store, its id, the cursor key ring, discarding a view
that a reboot may have torn, a private view for read-only readers that cannot lock the
store), reads and maintenance; the commit protocol is in `commit.py` (`CommitPath`, the
base class of `LocalEngine`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import threading
import weakref
from collections.abc import Sequence
from functools import partial

import lmdb
import msgspec

from cursors import KeyRing

from ..abandoned import wait_for_dropped
from ..engine import (
    AbortImport,
    EventsPage,
    Expire,
    Lease,
    PageReaders,
    PolicyChange,
    Progress,
    StoredSnapshot,
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
    SessionState,
    StoreStats,
    VerifyProblem,
    VerifyReport,
)
from ..records import CheckpointTaken, SnapshotTaken
from ..sessions import FeedEntry, SessionRow
from ..waiter import Notifier
from .catch_up import CatchUp
from .commit import CommitPath
from .commit_queue import CommitQueue
from .commits_seen import CommitsSeen
from .compaction import Compactions, finish_swaps
from .expiry import ExpiryTimer, wait_while_held
from .failures import (
    disk_errors,
    held_by_this_process,
    open_failure,
    reads_disk,
    unavailable,
)
from .files import DEFAULT_FILE_OPS, Permissions
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
from .planner import Request, SealRetention
from .private_tail import PrivateTail
from .reader import ReaderCache, read_page
from .recorded_policy import RecordedPolicy
from .recovery import process_alive
from .retention import SummaryCache
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


class LocalEngine(CommitPath):
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
    _released: bool  # (the close went through: `close`)

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
        self._released = False
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
        release recorded, when the store can still be written). Idempotent: a close cut
        short (a Ctrl+C, any error) is finished by the next one, which does each step
        again or finds it done; once the files are released, a close does nothing."""
        if self._released:
            return
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
            wait_while_held(expiry.busy, 5)
        self.compactions.wait(5)  # (the same for a compaction)
        self._commits.close()  # (False: closed by a close that was cut short after it)
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
        self._released = True  # (all of it: a close cut short before here does it again)

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
