"""The `Journal`: the public facade over a storage engine.

The facade checks arguments, signs and checks cursors and page tokens (scope digests,
future and expired decisions), applies the page rule's results, turns engine rows into
public models, and starts the follows that `journal.followers` drives. Engines
(`journal._local` for a store on disk) deal only in positions, ordinals, incarnations and
records (see `journal.engine`), so every engine gets this behaviour once and identically.
"""

import os
import threading
from collections.abc import (
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from functools import partial
from typing import IO, TypeVar

from cursors import KeyRing, TokenCodec

from ._local import DEFAULT_DEAD_SHARE, DEFAULT_SEGMENT_BYTES, Durability, FileOps, open_local
from ._local.opening import Repair
from .abandoned import Detachable
from .archive import ArchiveLimits
from .arguments import (
    DEFAULT_PAGE_BYTES,
    DEFAULT_PAGE_SIZE,
    REPLAY_PAGE_BYTES,
    EventChecker,
    check_callback,
    check_create,
    check_dead_share,
    check_engine,
    check_flag,
    check_listing,
    check_max_bytes,
    check_name,
    check_now,
    check_repair,
    check_seconds,
    check_snapshot,
    check_stop,
    checked_policy_change,
)
from .engine import (
    Append,
    AppendTurnEvent,
    ApplyRetention,
    Checkpoint,
    CompactSession,
    Engine,
    Expire,
    Operation,
    PageReaders,
    Progress,
    Transition,
    VerifyFix,
)
from .errors import (
    CursorFuture,
    InvalidArgument,
    JournalClosed,
    ReadOnlyStore,
    SessionNotFound,
)
from .event_pages import EventPages
from .fold_codecs import Codec
from .folds import DEFAULT_TRIES, Fold
from .follow import Stream
from .followers import Followers, JournalEnds
from .lifecycle import LifecycleFeed
from .models import (
    AppendResult,
    CompactionReport,
    Event,
    EventIn,
    ExportReport,
    ImportReport,
    LifecycleEvent,
    Page,
    RetentionPolicy,
    RetentionReport,
    SessionMetadata,
    SessionPage,
    SessionState,
    Snapshot,
    StoreStats,
    VerifyReport,
)
from .parts import assemble
from .remote import is_remote, open_remote
from .session_cursors import SessionCursors, Start
from .session_views import SessionViews
from .sessions import SessionRow, TransitionKind, metadata_page
from .subscriptions import Deliveries, ErrorHandler, Subscription, check_listener
from .turn_results import KeptTurnResults
from .turn_writers import TurnWriter, TurnWriters
from .turns import Owner, take_over

__all__ = ["DEFAULT_DEAD_SHARE", "Journal"]

ResultT = TypeVar("ResultT")
StateT = TypeVar("StateT")


class Journal:
    """An open session journal: `Journal.open(path)` (the embedded local store) or
    `Journal.over(engine)`; a context manager, closed by `close()`.

    Thread-safe: any number of threads may append, read and watch; concurrent appends share
    one commit (group commit). Several processes may open the same store.
    """

    path: str
    readonly: bool
    store_id: bytes
    _engine: Engine
    _closed: bool
    _released: bool
    _releasing: list[object]
    _codec: TokenCodec
    _sessions: SessionViews
    _lifecycle: LifecycleFeed
    _deliveries: Deliveries
    _events: EventChecker
    _kept_turns: KeptTurnResults
    _turn_writers: TurnWriters
    _followers: Followers
    _cursors: SessionCursors
    _pages: EventPages
    _dropped: Detachable
    _close_parts: Callable[[], None]

    def __init__(self) -> None:
        """Not for direct use: open a journal with `Journal.open(path, ...)`."""
        raise TypeError("use Journal.open(path, ...) to open a journal")

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("read-only" if self.readonly else "writable")
        return f"Journal({self.path!r}, {state})"

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        readonly: bool = False,
        durability: Durability = "fsync",
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        retention: RetentionPolicy | None = None,
        compress_sealed: bool = False,
        key_ring: KeyRing | None = None,
        file_ops: FileOps | None = None,
        file_mode: int | None = None,
        store: str | None = None,
        replicas: int | None = None,
        repair: Repair = False,
    ) -> "Journal":
        """Open (or create) the store at `path` on the embedded local engine (a `nats://`
        URL: the store `store` on NATS JetStream, created with `replicas` copies, 1 when
        None; a number that differs from an existing store's is refused; SPEC 16).

        `durability="fsync"` (default): an acknowledged append is on disk. `"os"`: written
        to the OS; survives a process crash, not a power cut. `file_mode`: the permission
        bits of every file the store creates (directories get a search bit wherever it
        has a read bit); None keeps the store's recorded mode, 0o600 for a new store
        (private). Given for an existing store, it is recorded there and applies to files
        created from then on; existing files keep their mode. `retention`: the store's
        policy, recorded by a writer for every later open without one (None: the recorded
        policy, the default `RetentionPolicy()` where none is). `file_ops` is the local
        engine's fault-point seam for tests (a `journal._local.files.FileOps`).
        `repair=True` (local, writable) opens a store whose active segment is damaged
        (`JournalCorrupt` says so: what a power cut does to a store written with
        durability "os"), for `verify(fix=True)` only, which cuts the segment at the
        damage keeping a copy (SPEC 9); until it has, every write raises the damage. A
        segment no "os" writer wrote is media damage, cut only with "cut-durable".
        `readonly=True` refuses the keywords that would change the store (retention,
        file_mode, repair); durability, segment_bytes and compress_sealed do nothing there.
        """
        given = (create, readonly, durability, segment_bytes, retention, compress_sealed)
        check_repair(repair, readonly)
        if is_remote(path, store, replicas):  # a nats:// URL: SPEC 16
            if repair:
                raise InvalidArgument(
                    "repair is for stores on disk (a damaged active segment) and means "
                    "nothing for a nats:// store: leave it out"
                )
            engine = open_remote(path, store, replicas, given, key_ring, file_ops, file_mode)
        else:
            engine = open_local(path, given, key_ring, file_ops, file_mode, repair)
        return cls.over(engine)

    @classmethod
    def over(cls, engine: Engine) -> "Journal":
        """A journal over an engine that is already open (for engine authors and tests)."""
        check_engine(engine)
        self = object.__new__(cls)
        self._engine = engine
        self.path = engine.location
        self.readonly = engine.readonly
        self.store_id = engine.store_id
        self._closed = self._released = False
        self._releasing = []  # (the claims of the closes under way, `_release`)
        parts = assemble(engine)
        self._codec = parts.codec
        self._cursors = parts.cursors
        self._sessions = parts.sessions
        self._lifecycle = parts.lifecycle
        self._pages = parts.pages
        self._deliveries = parts.deliveries
        self._followers = parts.followers
        self._events = EventChecker()
        self._kept_turns = KeptTurnResults()
        self._turn_writers = TurnWriters()
        self._close_parts = parts.close
        self._dropped = parts.close_when_dropped(self, engine.location)
        return self

    @property
    def closed(self) -> bool:
        """Whether the journal was closed (`close()`, or dropped): a watch ends without an
        error both when its session ends and when its journal is closed, and a loop
        that must tell the two apart asks this. True from the moment a close begins
        (while it waits for turn blocks, which still write: SPEC 7.8)."""
        return self._is_closed()

    def close(self) -> None:
        """Close the journal; pending watches end (without an error: see `closed`).
        Idempotent. The turn blocks of its owners running in other threads end first
        and record their results, as for `Owner.release()`, with no limit (not one
        running in this thread, nor on a thread running an asyncio event loop or on the
        delivery thread, nor at interpreter exit; a Ctrl+C during that wait closes at
        once and is raised); no turn starts meanwhile, and live follows and
        subscriptions end before that wait (a block may wait for one). A close cut
        short (a Ctrl+C, any error) is finished by the next one."""
        if self._released:
            return
        try:
            # (A close on the delivery thread does not wait: a block may wait for a
            # delivery, as for an event loop.)
            self._turn_writers.begin_close()
            self._deliveries.begin_close()  # (wakes the live follows too)
            self._turn_writers.wait_before_close(self._deliveries.on_thread())
        finally:
            self._release()

    def _release(self) -> None:
        """Let go of the engine and the parts, once (SPEC 7): each step done again or found
        done by a close after one cut short, marked done only once all of them were. Of
        concurrent closes one releases, the others return (one from a listener of the
        journal's subscriptions must: the releasing one joins the delivery thread); so
        does a close from a signal handler run inside this thread's release, which goes
        on once the handler returns."""
        claim = object()
        try:
            # Each close lines up its own claim and takes it out again in one step each
            # (`append`, `remove`), both inside the `try`: however it is cut short, no
            # claim outlives its close. The first in line releases. (A claim taken in one
            # step before the `try` and let go in its `finally` stayed with the thread
            # when an interrupt landed in between: a close of any other thread then
            # returned at once, and nothing was released; a review.)
            self._releasing.append(claim)
            if self._releasing[0] is not claim:
                return  # (another thread's close, or this thread's that a handler cut into)
            try:
                if not self._closed:
                    # (the results its owners remember, as their release() would)
                    self._turn_writers.record_before_close()
            finally:
                self._closed = True
                self._close_parts()  # (each part's close is idempotent)
            self._dropped.detach()  # (until then, one dropped is closed as it is collected)
            self._released = True
        finally:
            # (No call before the removal, where an interrupt could land and leave it;
            # not lined up only when cut short before the `append`.)
            if claim in self._releasing:
                self._releasing.remove(claim)

    def __enter__(self) -> "Journal":
        if self._closed:  # (as `with f:` of a closed file; it failed at the first call)
            raise JournalClosed.already()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise JournalClosed.already()
        self._engine.check_usable()

    def _check_writable(self, what: str) -> None:
        self._check_open()
        if self.readonly:
            raise ReadOnlyStore(f"{what} needs a writable journal")

    def _is_closed(self) -> bool:
        """Whether live follows end: closed, or closing (SPEC 7.8)."""
        return self._closed or self._turn_writers.closing()

    def _submit(self, operation: Operation[ResultT]) -> ResultT:
        if self.readonly:
            raise ReadOnlyStore(
                "this journal was opened with readonly=True; open it writable to change it"
            )
        if self._closed:
            raise JournalClosed.already()
        return self._engine.submit(operation)  # the engine checks the rest (fork, ...)

    # -- sessions: writes ------------------------------------------------------------------

    def create_session(
        self,
        session_id: str,
        mode: str = "",
        context_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        extensions: Mapping[str, bytes] | None = None,
        ttl_ms: int | None = None,
        max_suspend_ms: int = 0,
        *,
        max_history_bytes: int | None = None,
        max_history_age_ms: int | None = None,
    ) -> SessionMetadata:
        """Create an OPEN session (`SessionExists` if the id is taken); it expires `ttl_ms`
        after it starts, or once suspended for `max_suspend_ms` (0: 7 days)."""
        operation = check_create(
            session_id,
            mode,
            context_id,
            tags,
            extensions,
            ttl_ms,
            max_suspend_ms,
            max_history_bytes,
            max_history_age_ms,
        )
        return self._sessions.metadata(self._submit(operation))

    def append(
        self,
        session_id: str,
        events: Sequence[EventIn],
        expected_last_ordinal: int | None = None,
        idempotency_key: str | None = None,
        *,
        create: bool = False,
    ) -> AppendResult:
        """Append events to an OPEN session; returns after they are committed. With
        `create=True` a missing session is created (open, default settings) by the same
        commit: if the append is refused, no session was created either."""
        creation = None
        if check_flag("create", create):
            creation = check_create(session_id, "", None, None, None, None, 0, None, None)
        operation = self._events.append(
            session_id, events, expected_last_ordinal, idempotency_key, creation
        )
        return self._cursors.append_result(session_id, self._submit(operation), operation)

    def suspend_session(self, session_id: str) -> SessionMetadata:
        """OPEN -> SUSPENDED: no appends until resumed; expires after `max_suspend_ms`."""
        return self._transition("suspend", session_id)

    def resume_session(self, session_id: str) -> SessionMetadata:
        """SUSPENDED -> OPEN."""
        return self._transition("resume", session_id)

    def resolve_session(self, session_id: str) -> SessionMetadata:
        """OPEN or SUSPENDED -> RESOLVED (terminal); a resolved one is returned as is."""
        return self._transition("resolve", session_id)

    def cancel_session(self, session_id: str) -> SessionMetadata:
        """OPEN or SUSPENDED -> CANCELLED; an already terminal session is returned as is."""
        return self._transition("cancel", session_id)

    def _transition(self, kind: TransitionKind, session_id: str) -> SessionMetadata:
        session_id = check_name("session_id", session_id)
        return self._sessions.metadata(self._submit(Transition(session_id, kind)))

    def expire_due(self, now_ms: int | None = None) -> list[SessionMetadata]:
        """Expire sessions past their TTL or suspension cap; returns what it expired."""
        rows = self._submit(Expire(check_now(now_ms)))
        return metadata_page(rows, self._engine.owners_alive)

    def compact_session(self, session_id: str, through_ordinal: int, snapshot: bytes) -> Snapshot:
        """Store `snapshot` as standing for every event up to `through_ordinal` and drop
        those events: the retained range then starts at `through_ordinal + 1`. Ordinals of
        the events kept do not change. Works on terminal sessions too."""
        session_id = check_name("session_id", session_id)
        through_ordinal, snapshot = check_snapshot(through_ordinal, snapshot)
        ref = self._submit(CompactSession(session_id, through_ordinal, snapshot))
        return Snapshot(
            session_id,
            ref.through_ordinal,
            snapshot,
            self._cursors.cursor(session_id, ref.incarnation, ref.position, ref.through_ordinal),
        )

    def snapshot(self, session_id: str) -> Snapshot | None:
        """The session's latest snapshot (with a cursor to resume after it), or None."""
        return self._sessions.snapshot(self._row(session_id))

    def checkpoint_session(
        self, session_id: str, through_ordinal: int, checkpoint: bytes
    ) -> Snapshot:
        """Store `checkpoint` as standing for every event up to `through_ordinal`, keeping
        them all: unlike `compact_session`, no ordinal, retained range or cursor changes.
        It replaces the session's earlier checkpoint (it must reach at least as far)."""
        session_id = check_name("session_id", session_id)
        through_ordinal, checkpoint = check_snapshot(through_ordinal, checkpoint, "checkpoint")
        ref = self._submit(Checkpoint(session_id, through_ordinal, checkpoint))
        cursor = self._cursors.cursor(
            session_id, ref.incarnation, ref.position, ref.through_ordinal
        )
        return Snapshot(session_id, ref.through_ordinal, checkpoint, cursor)

    def checkpoint(self, session_id: str) -> Snapshot | None:
        """The session's latest checkpoint (with a cursor to resume after it), or None
        (none taken, or history below it left the retained range since)."""
        return self._sessions.checkpoint(session_id, self._row)

    # -- maintenance -----------------------------------------------------------------------

    def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Apply the history windows and session retention, then delete segments that hold
        nothing live. Also runs by itself whenever the writer starts a new segment."""
        return self._submit(ApplyRetention(check_now(now_ms)))

    def verify(self, fix: bool = False, progress: Progress | None = None) -> VerifyReport:
        """Check every frame checksum, every sidecar, and the view against the log.

        `fix=False` only reports (problems name the segment and byte offset). `fix=True`
        rewrites bad sidecars and rebuilds the derived view; damaged frames themselves
        cannot be repaired (restore the segment from a backup).
        `progress(done_bytes, total_bytes)` is called as segments are checked."""
        check_flag("fix", fix)
        check_callback("progress", progress)
        self._check_open()
        if fix:
            self._check_writable("verify(fix=True)")
            report: VerifyReport = self._submit(VerifyFix(progress))
            self._lifecycle.forget_shared()  # (its copy may hold rows the fix repaired)
            return report
        return self._engine.verify(progress)

    def compact(
        self, dead_share: float = DEFAULT_DEAD_SHARE, progress: Progress | None = None
    ) -> CompactionReport:
        """Reclaim space: delete sealed segments that hold nothing live, and rewrite (zstd,
        block-wise) those whose dead share is at least `dead_share`, or that are not yet
        compressed, copying only live frames; first seal the active segment (local engine)
        when 1 MiB (half a segment, if less) and `dead_share` of it are dead, so its space
        comes back too. Positions, ordinals and cursors are unchanged. Writers and readers
        keep working meanwhile. `progress(done, total)` counts segments.
        """
        dead_share = check_dead_share(dead_share)
        check_callback("progress", progress)
        self._check_writable("compact()")
        return self._engine.compact(dead_share, progress)

    def stats(self) -> StoreStats:
        """Sizes of the store: sessions by state, segment files, bytes on disk."""
        self._check_open()
        return self._engine.stats()

    def retention_policy(self) -> RetentionPolicy:
        """The store's recorded retention policy (default: `RetentionPolicy()`), which
        every writer applies from its next retention pass on, whoever recorded it."""
        self._check_open()
        return self._engine.retention_policy()

    def change_retention_policy(
        self, change: Callable[[RetentionPolicy], RetentionPolicy]
    ) -> RetentionPolicy:
        """Record `change(recorded)` as the store's policy, where `recorded` is the policy
        recorded at that moment, so changes from several processes at once all apply
        (`change` may be called again with a newer one: keep it free of side effects);
        e.g. `lambda p: msgspec.structs.replace(p, max_history_age_ms=3_600_000)`. Every
        writer applies it from its next retention pass on. Returns the policy recorded."""
        change = checked_policy_change(change)
        self._check_writable("change_retention_policy()")
        return self._engine.change_retention_policy(change)

    # -- archives --------------------------------------------------------------------------

    def export_sessions(
        self,
        session_ids: Iterable[str] | None,
        dest: str | os.PathLike[str] | IO[bytes],
        progress: Progress | None = None,
    ) -> ExportReport:
        """Write the sessions (None: every session) to a portable archive at `dest` (a
        path: written to a temporary file and renamed over it, so a failed export leaves
        nothing and a file already there is replaced whole, as `open(path, "wb")` would;
        the CLI's `export` asks for `--force` first; or a binary file object). Each
        session is exported exactly up to the head it had when its export began, while
        writers keep appending. `progress(done, total)` counts events. The format is in
        SPEC.md ("Archives")."""
        check_callback("progress", progress)
        self._check_open()
        from . import transfer  # (imported by the archive calls alone: not a start-up's)

        return transfer.export_sessions(self._engine, session_ids, dest, progress)

    def import_sessions(
        self,
        src: str | os.PathLike[str] | IO[bytes],
        rename: Mapping[str, str] | None = None,
        progress: Progress | None = None,
        limits: ArchiveLimits | None = None,
    ) -> ImportReport:
        """Import every session of the archive at `src` (a path or a binary file object),
        or none: the archive is checked whole first (`ArchiveInvalid` with a `reason`),
        then its sessions become visible together. `rename` maps archive ids to new ids;
        an id that exists raises `SessionExists`. Imported sessions are new incarnations:
        ordinals, types, timestamps, request ids, snapshot, checkpoint and state are kept,
        cursors of the source store are foreign here. `progress(done, total)` counts
        archive bytes over two passes; `limits` raises the caps on what a reader accepts."""
        check_callback("progress", progress)
        self._check_open()
        from . import transfer  # (as in export_sessions)

        return transfer.import_sessions(self._engine, src, rename, progress, limits)

    # -- owners ----------------------------------------------------------------------------

    def own(self, session_id: str, wait_s: float = 0.0) -> Owner:
        """Take the session's owner lease (exclusive; one per session across processes):
        `with j.own(session_id) as owner: ...`. Waits up to `wait_s` seconds for a live
        owner to let go, then raises `OwnerBusy` (with that owner's pid). Plain `append()`
        works with or without a lease."""
        session_id = check_name("session_id", session_id)
        wait = check_seconds("wait_s", wait_s)
        self._check_open()
        if self.readonly:
            raise ReadOnlyStore("own() needs a writable journal")
        lease = self._engine.acquire(session_id, wait)
        writer = TurnWriter(
            lease,
            self._events.append,
            partial(self._committed, session_id),
            partial(self._row, session_id),
            partial(self.replay, session_id),
            self._kept_turns,
            self._turn_writers.closing,
        )
        self._turn_writers.add(writer)
        return take_over(self._engine, lease, writer)

    def _committed(self, session_id: str, operation: Append | AppendTurnEvent) -> AppendResult:
        return self._cursors.append_result(session_id, self._submit(operation), operation)

    # -- sessions: reads -------------------------------------------------------------------

    def get_session(self, session_id: str) -> SessionMetadata:
        """The session's metadata; `SessionNotFound` if it does not exist."""
        return self._sessions.metadata(self._row(session_id))

    def _row(self, session_id: str) -> SessionRow:
        self._check_open()
        session_id = check_name("session_id", session_id)
        row = self._engine.session(session_id)
        if row is None:
            self._engine.confirm_current()  # (a copy behind the store: SPEC 16.4)
            row = self._engine.session(session_id)
        if row is None:
            raise SessionNotFound(
                f"no session {session_id!r} in this store: check the id with "
                "`journal sessions list`"
            )
        return row

    def list_sessions_page(
        self,
        page_size: int = DEFAULT_PAGE_SIZE,
        page_token: str | None = None,
        state: SessionState | None = None,
    ) -> SessionPage:
        """One page of sessions in session-id order; pass `next_page_token` for the next."""
        self._check_open()
        return self._sessions.page(page_size, page_token, state)

    def list_sessions(
        self, state: SessionState | None = None, page_size: int = DEFAULT_PAGE_SIZE
    ) -> Iterator[SessionMetadata]:
        """Every session (optionally in one state), lazily, page by page."""
        check_listing(page_size, state)  # now, not at the first next()
        self._check_open()  # (now too: until 2026-12-05 at the first next())
        return self._sessions.every(state, page_size, self._check_open)

    # -- events: reads ---------------------------------------------------------------------

    def _start(
        self, session_id: str, cursor: str | None, readers: PageReaders | None = None
    ) -> tuple[SessionRow, Start]:
        """The session and where to read after; cursor errors are raised here. (A
        cursor's event is read through `readers` when given: the page read next with
        them then reuses the frame.)"""
        row = self._row(session_id)
        try:
            return row, self._cursors.start(row, cursor, readers)
        except CursorFuture:
            self._engine.confirm_current()  # (a copy behind the store: SPEC 16.4)
            row = self._row(session_id)
            return row, self._cursors.start(row, cursor, readers)

    def read(
        self, session_id: str, cursor: str | None = None, max_bytes: int = DEFAULT_PAGE_BYTES
    ) -> Page:
        """One bounded page of retained events after `cursor` (from the start if None):
        events while their data total at most `max_bytes`, and always at least one event
        if any follows, so one oversized event gets through whole."""
        check_max_bytes(max_bytes)
        self._check_open()
        with self._engine.readers() as readers:
            row, start = self._start(session_id, cursor, readers)
            events, has_more, _, _, _ = self._pages.page(
                row, self._cursors.context(row), readers, start.after, max_bytes
            )
        next_cursor = events[-1].cursor if events else cursor
        return Page(events, next_cursor, has_more)

    def replay(
        self, session_id: str, cursor: str | None = None, max_bytes: int | None = None
    ) -> Stream[Event]:
        """Every retained event after `cursor`, page by page (what is committed now).

        Pages hold at most `max_bytes` of event data; by default the first 1 MiB (so the
        first event comes soon) and the next 4 MiB (fewer pages: a long replay is faster).
        """
        if max_bytes is None:
            page_bytes = (DEFAULT_PAGE_BYTES, REPLAY_PAGE_BYTES)
        else:
            check_max_bytes(max_bytes)
            page_bytes = (max_bytes, max_bytes)
        row, start = self._start(session_id, cursor)
        return self._followers.events(row, start, cursor, None, False, page_bytes, self._ends())

    def watch(
        self,
        session_id: str,
        cursor: str | None = None,
        stop: threading.Event | None = None,
        max_bytes: int = DEFAULT_PAGE_BYTES,
    ) -> Stream[Event]:
        """Replay the retained events after `cursor`, then follow new ones live.

        Ends by itself when the session is terminal and every event was delivered, or
        promptly after `stop` is set. Cursor errors are raised here, before iteration.
        """
        check_stop(stop)
        check_max_bytes(max_bytes)
        row, start = self._start(session_id, cursor)
        page_bytes = (max_bytes, max_bytes)
        return self._followers.events(row, start, cursor, stop, True, page_bytes, self._ends())

    def _ends(self) -> JournalEnds:
        """How its followers learn that it ended (each holds its own: not the journal)."""
        return JournalEnds(lambda: self._closed, self._is_closed)

    def awatch(
        self,
        session_id: str,
        cursor: str | None = None,
        max_bytes: int = DEFAULT_PAGE_BYTES,
    ) -> AsyncIterator[Event]:
        """The asyncio twin of `watch`; cancel the task (or break) to stop. A step
        cancelled from outside (`asyncio.wait_for(anext(it), t)`) does not end it: the
        next step goes on after the last event delivered (SPEC 7.6)."""
        return self._followers.aevents(session_id, cursor, max_bytes, self._start, self._ends())

    # -- lifecycle feed --------------------------------------------------------------------

    def watch_sessions(
        self, cursor: str | None = None, stop: threading.Event | None = None
    ) -> Stream[LifecycleEvent]:
        """Lifecycle events: with no cursor, one CREATED per existing session first; then
        live changes. Resuming from an event's cursor yields the changes after it (from
        a CREATED of the snapshot but its last: the changes since of the sessions it had
        delivered, the snapshot's sessions after it, then the changes; SPEC 7.7)."""
        check_stop(stop)
        self._check_open()
        return self._followers.lifecycle(cursor, stop, self._ends())

    def awatch_sessions(self, cursor: str | None = None) -> AsyncIterator[LifecycleEvent]:
        """The asyncio twin of `watch_sessions` (a step cancelled from outside does not end
        it, as with `awatch`)."""
        return self._followers.alifecycle(cursor, self._check_open, self._ends())

    # -- subscriptions and folds -----------------------------------------------------------

    def subscribe(
        self,
        session_id: str,
        listener: Callable[[Event], object],
        cursor: str | None = None,
        on_error: ErrorHandler | None = None,
        *,
        max_bytes: int = DEFAULT_PAGE_BYTES,
    ) -> Subscription[Event]:
        """Call `listener(event)` for every event after `cursor`, in order, exactly once,
        replay first and then live, on this journal's one delivery thread (however many
        subscriptions); `sub()` unsubscribes. See `Subscription` for the guarantees.
        Errors that end it go to `on_error` (default: logged); cursor errors raise here."""
        check_listener(listener)
        check_callback("on_error", on_error)
        check_max_bytes(max_bytes)
        row, start = self._start(session_id, cursor)
        return self._followers.subscribe(row, start, cursor, listener, on_error, max_bytes)

    def subscribe_sessions(
        self,
        listener: Callable[[LifecycleEvent], object],
        cursor: str | None = None,
        on_error: ErrorHandler | None = None,
    ) -> Subscription[LifecycleEvent]:
        """`subscribe` over `watch_sessions`: lifecycle events (with no cursor, one
        CREATED per existing session first), on the delivery thread."""
        check_listener(listener)
        check_callback("on_error", on_error)
        self._check_open()
        return self._followers.subscribe_lifecycle(cursor, listener, on_error)

    def fold(
        self,
        session_id: str,
        apply: Callable[[StateT, Event], StateT] | None,
        initial: StateT,
        *,
        codec: Codec[StateT] | None = None,
        version: int | str = 0,
        follow: bool = False,
        snapshot_every: int | None = None,
        tries: int = DEFAULT_TRIES,
        on_error: ErrorHandler | None = None,
    ) -> Fold[StateT]:
        """The session's state: the pure reducer `apply(state, event) -> state` over its
        events from `initial`, restored from its newest snapshot or checkpoint of this
        `version` (`CursorExpired` if the events it needs are gone). `codec` stores the
        state (default JSON, which merges `state_changed` events: `Fold.set`); `follow`,
        `snapshot_every`, `tries`, `on_error`: see `Fold` and SPEC section 7.11."""
        session_id = check_name("session_id", session_id)
        self._check_open()
        return Fold(
            self,
            session_id,
            apply,
            initial,
            codec,
            version,
            follow,
            snapshot_every,
            tries,
            on_error,
        )
