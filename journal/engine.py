"""The engine seam: the typed operations the facade submits, the rows and pages an engine
returns, and the `Engine` protocol a storage engine implements.

Engines deal in positions, ordinals, incarnations and records; they never see cursor
strings or page tokens (the facade signs and checks those) and never raise cursor errors
(the facade decides future/expired from the rows they return). Each operation commits
atomically on its own: in a batch of operations, one that fails leaves no trace and does
not affect the others.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import msgspec

from cursors import KeyRing

from .models import (
    CompactionReport,
    Event,
    EventIn,
    ReadContext,
    RetentionPolicy,
    RetentionReport,
    SessionState,
    StoreStats,
    VerifyReport,
)
from .sessions import FeedEntry, SessionRow, TransitionKind

if TYPE_CHECKING:
    from .archive import ArchiveCheckpoint, ArchiveEvent, ArchiveSession, ArchiveSnapshot
    from .waiter import Notifier

__all__ = [
    "READ_SCOPE",
    "AbortImport",
    "AcquireLease",
    "Append",
    "AppendTurnEvent",
    "Appended",
    "ApplyRetention",
    "Checkpoint",
    "CommitImport",
    "CompactSession",
    "CreateSession",
    "Engine",
    "EventsPage",
    "Expire",
    "Flag",
    "ImportTarget",
    "Lease",
    "Operation",
    "PageReaders",
    "PolicyChange",
    "Progress",
    "ReadScope",
    "ReleaseLease",
    "SnapshotRef",
    "StageEvents",
    "StageSessions",
    "StagedSession",
    "StoredSnapshot",
    "Transition",
    "TurnGuard",
    "VerifyFix",
    "interrupt_as_itself",
    "read_ended",
    "start_thread",
]

ResultT = TypeVar("ResultT")
ResultT_co = TypeVar("ResultT_co", covariant=True)
Progress = Callable[[int, int], None]
PolicyChange = Callable[[RetentionPolicy], RetentionPolicy]


class Flag:
    """A `threading.Event` that any thread sets without a lock a KeyboardInterrupt could
    leave held: `threading.Event.set` enters a `Condition` in Python code, and a Ctrl+C
    whose handler raised right after that acquired its lock left the lock held for good,
    and the next `set` or `wait` of any thread hung on it (the shared waiter's flags: a
    journal's `close()` hung, `journal watch` still running long after its SIGINT, a
    review; a `ReadScope` cancelled by `Stream.close()` or `Subscription.close()` in the
    main thread, until 2026-12-05: the read's next wait hung, a review). Here `set` is
    one release of a raw lock held while the flag is not set. `clear` and `wait` are for
    the one thread that waits on it (the shared waiter's thread, a scope's reader)."""

    __slots__ = ("_flag", "_gate")

    def __init__(self) -> None:
        self._flag = False
        self._gate = threading.Lock()
        self._gate.acquire()

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        try:  # noqa: SIM105 (no Python-level `__enter__` for a handler to raise in)
            self._gate.release()
        except RuntimeError:
            pass  # (set already)

    def clear(self) -> None:
        """(The waiting thread only.)"""
        self._flag = False
        self._gate.acquire(False)

    def wait(self, timeout: float) -> bool:
        """(The waiting thread only.) Until set, or `timeout` ends; whether it is set."""
        if not self._flag and self._gate.acquire(True, timeout):
            with contextlib.suppress(RuntimeError):  # (a `set` meanwhile released it)
                self._gate.release()  # (it stays open while set)
        return self._flag


@contextlib.contextmanager
def interrupt_as_itself() -> Iterator[None]:
    """A Ctrl+C raised as what it is from a `threading.Condition.wait` inside: one whose
    handler raised before the `try` there (the lock let go) came out as
    RuntimeError("release unlocked lock") (a review)."""
    try:
        yield
    except RuntimeError as error:
        if isinstance(error.__context__, KeyboardInterrupt):
            raise error.__context__ from None
        raise


def start_thread(thread: threading.Thread) -> None:
    """`thread.start()`, a Ctrl+C landing inside it raised as what it is (`start` waits on
    a `threading.Event`: `interrupt_as_itself`). The caller forgets the thread when this
    raises: it may not have begun, or begun without `start` being told (the shared
    waiter's and the owner checks' threads take their place themselves then, if still
    free)."""
    with interrupt_as_itself():
        thread.start()


class ReadScope:
    """A follower's read that may be given up from another thread: an asyncio follower's
    read in a worker thread (`follow.ReadThreads`: its task was cancelled), a stream's
    page (`Stream.close` from another thread, or its `stop` event), a subscription's
    page (`Subscription.close`, or the journal's close). `cancel()` ends it: an engine
    that waits on the network stops asking again (`check`, `sleep`) and cuts the request
    in flight (the hooks registered with `on_cancel`); the read then raises
    `concurrent.futures.CancelledError`, which the follower takes as its end."""

    def __init__(self) -> None:
        # (Reentrant: a signal handler's close in the thread that holds it sends requests.)
        self._lock = threading.RLock()
        self._cancelled = Flag()
        self._hooks: list[Callable[[], object]] = []
        self._stop: threading.Event | None = None

    def cancel(self) -> None:
        with self._lock:
            self._cancelled.set()
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    def stop_with(self, stop: threading.Event) -> None:
        """Also end (when asked again, not the request in flight) once `stop` is set."""
        self._stop = stop

    def ended(self) -> bool:
        """Whether cancelled (or stopped); any thread may ask."""
        stop = self._stop
        return self._cancelled.is_set() or (stop is not None and stop.is_set())

    def check(self) -> None:
        """Raise `concurrent.futures.CancelledError` once cancelled (or stopped)."""
        if self.ended():
            raise concurrent.futures.CancelledError

    def sleep(self, seconds: float) -> None:
        """Sleep, ending at once (raising) when cancelled, within 50 ms when stopped."""
        if self._stop is None:
            self._cancelled.wait(seconds)
        else:
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0 and not self._stop.is_set():
                if self._cancelled.wait(min(left, 0.05)):
                    break
        self.check()

    @contextmanager
    def on_cancel(self, hook: Callable[[], object]) -> Iterator[None]:
        """Call `hook` if the scope is cancelled while the block runs (at once if it was)."""
        with self._lock:
            registered = not self._cancelled.is_set()
            if registered:
                self._hooks.append(hook)
        if not registered:
            hook()
        try:
            yield
        finally:
            if registered:
                with self._lock:
                    if hook in self._hooks:
                        self._hooks.remove(hook)


# The read scope of the running thread's read (None: a plain synchronous call).
READ_SCOPE: ContextVar[ReadScope | None] = ContextVar("journal_read_scope", default=None)


def read_ended() -> Callable[[], bool] | None:
    """The running thread's read scope's `ended` (None: a plain synchronous call), for
    an engine whose read asks again where the scope is not set (an event loop's thread)."""
    scope = READ_SCOPE.get()
    return None if scope is None else scope.ended


class Operation(msgspec.Struct, Generic[ResultT], frozen=True):
    """Base of every operation; `ResultT` is what `Engine.submit` returns for it."""


# -- results -----------------------------------------------------------------------------


class Appended(msgspec.Struct, frozen=True):
    """What an append took: ordinals, the position of its last event, whether an
    idempotency key matched an earlier append (then nothing was written), and the time
    stamped on its events (None for a deduplicated append: the facade reads the time of
    its last event, still retained, for the cursor's check)."""

    incarnation: int
    first_ordinal: int
    last_ordinal: int
    last_position: int
    deduplicated: bool = False
    time_ms: int | None = None


class SnapshotRef(msgspec.Struct, frozen=True):
    """A snapshot just stored: where its record lies (`position`) and what it covers."""

    incarnation: int
    through_ordinal: int
    position: int


class StoredSnapshot(msgspec.Struct, frozen=True):
    """A session's latest snapshot as stored: its record's position, coverage and data."""

    position: int
    through_ordinal: int
    data: bytes


class EventsPage(msgspec.Struct):
    """One page read in one consistent snapshot of the store.

    `row` is the session's row in that snapshot (None when it no longer exists). When the
    row is None, another incarnation, or starts above `after_ordinal + 1`, `events` is
    empty: the facade tells the caller (evicted, expired). `head` is the committed next
    position, to wait on when the page is empty."""

    events: list[Event]
    has_more: bool
    row: SessionRow | None
    head: int


# -- operations --------------------------------------------------------------------------


class CreateSession(Operation[SessionRow], frozen=True):
    session_id: str
    mode: str
    context_id: str | None
    tags: dict[str, str]
    extensions: dict[str, bytes]
    ttl_ms: int | None
    max_suspend_ms: int
    max_history_bytes: int | None
    max_history_age_ms: int | None


class TurnGuard(msgspec.Struct, frozen=True):
    """The turn an append belongs to (`Turn.append`): the append is refused unless the
    owner holding lease `generation` of incarnation `incarnation` still holds it and
    `request_id` is the session's open turn (`turns.check_turn`)."""

    incarnation: int
    generation: int
    request_id: str


class Append(Operation[Appended], frozen=True):
    """Append `events` to an OPEN session. `digest` identifies the events for an
    idempotency key (a retry with other events is refused). With `create`, a session
    that does not exist is created by it first, in the same commit (both or neither).
    `data_bytes`, when not 0, is the sum of the events' data lengths. With `turn`, the
    events belong to that turn of an owner (refused once the turn or the lease is gone)."""

    session_id: str
    events: list[EventIn]
    expected_last_ordinal: int | None = None
    idempotency_key: str | None = None
    digest: bytes = b""
    create: CreateSession | None = None
    # The events' data bytes when the caller counted them (0: the engine counts them).
    data_bytes: int = 0
    turn: TurnGuard | None = None


class Transition(Operation[SessionRow], frozen=True):
    """A lifecycle transition (`sessions.TRANSITIONS`); cancelling a terminal session
    returns it unchanged."""

    session_id: str
    kind: TransitionKind


class Expire(Operation[list[SessionRow]], frozen=True):
    """Expire every session whose deadline is at or before `now_ms` (None: now)."""

    now_ms: int | None = None


class CompactSession(Operation[SnapshotRef], frozen=True):
    session_id: str
    through_ordinal: int
    data: bytes


class Checkpoint(Operation[SnapshotRef], frozen=True):
    """Store `data` as the session's checkpoint through `through_ordinal` (replacing an
    earlier one), keeping every event: no ordinal, retained range or cursor changes.
    Refused (`InvalidArgument`) past the last ordinal, below the current checkpoint, or
    below the retained range (the events after it would be missing)."""

    session_id: str
    through_ordinal: int
    data: bytes


class ApplyRetention(Operation[RetentionReport], frozen=True):
    now_ms: int | None = None


class VerifyFix(Operation[VerifyReport], frozen=True):
    """Check the store and repair what is derived (engine-specific)."""

    progress: Progress | None = None


class AcquireLease(Operation[SessionRow], frozen=True):
    """Record that the process identified here took the session's owner lease (the
    engine holds the exclusive lock first); the new generation is the row's plus one."""

    session_id: str
    pid: int
    start_time: int
    host: str
    boot_id: str


class ReleaseLease(Operation[SessionRow], frozen=True):
    """Record the release of lease `generation` of session incarnation `incarnation`
    (nothing when it is no longer current)."""

    session_id: str
    incarnation: int
    generation: int


class AppendTurnEvent(Operation[Appended], frozen=True):
    """Append a turn event (`turn_started` or `turn_result`) for `request_id`, on behalf
    of the owner holding lease `generation` of incarnation `incarnation` (refused with
    `OwnerBusy` otherwise: a released, replaced or re-created session's lease)."""

    session_id: str
    incarnation: int
    generation: int
    type: str
    request_id: str
    data: bytes


class StageEvents(Operation[int], frozen=True):
    """Append archived events (ordinals, times and request ids as given, continuing
    the staged row densely) to staged incarnation `incarnation`; the new last ordinal.
    A history window trims them in `steps` (SPEC 8): each index in `events` (ascending,
    past 0) begins a staging step, trimmed as an append of its own; none: one step. Only
    an engine that `joins_staging_steps` is given more than one."""

    incarnation: int
    events: list[ArchiveEvent]
    steps: tuple[int, ...] = ()


class StagedSession(msgspec.Struct, frozen=True):
    """One archived session to stage with others (`StageSessions`): its metadata,
    snapshot, the events it brings (all of them, or the first of `StageEvents` steps)
    and its checkpoint."""

    session: ArchiveSession
    snapshot: ArchiveSnapshot | None
    events: list[ArchiveEvent]
    checkpoint: ArchiveCheckpoint | None = None
    # The id it will take at the commit ("": its own; an engine may stage under it).
    target: str = ""
    # Where its events' staging steps after the first begin (`StageEvents.steps`).
    steps: tuple[int, ...] = ()


class StageSessions(Operation[list[SessionRow]], frozen=True):
    """Begin importing sessions of an archive, in one operation (rows in the same order):
    for each, an invisible row (no id a caller can name, no lifecycle entry, no deadline
    or retention) with the archive's metadata, its snapshot, its retained range's start
    and its checkpoint, then the events given (as `StageEvents`; a large session's others follow in
    `StageEvents` steps). The importing process is recorded so an import it never
    finished can be rolled back once it is gone (engine-specific)."""

    sessions: list[StagedSession]
    source_store: str
    exported_at_ms: int


class ImportTarget(msgspec.Struct, frozen=True):
    """A staged incarnation, the id it takes, and its lifecycle state (wire value) since
    `state_at_ms` (ignored for OPEN)."""

    incarnation: int
    session_id: str
    state: int
    state_at_ms: int


class CommitImport(Operation[list[SessionRow]], frozen=True):
    """Make every staged session of one import visible at once, or none: `SessionExists`
    when an id is taken."""

    targets: list[ImportTarget]


class AbortImport(Operation[int], frozen=True):
    """Roll back staged incarnations (those still staged); how many were rolled back."""

    incarnations: list[int]


class Lease(Protocol):
    """An engine's hold on a session's owner lease (exclusive until released)."""

    session_id: str
    incarnation: int
    generation: int

    @property
    def held(self) -> bool:
        """Whether this process still holds it (not released, not a forked child's copy)."""

    def release(self) -> None:
        """Record the release and let the lease go (idempotent)."""


class PageReaders(AbstractContextManager["PageReaders"], Protocol):
    """Engine-specific state one reader keeps across pages (open files, read-ahead)."""

    def close(self) -> None: ...

    def release(self) -> None:
        """Let go of open files and read-ahead until the next page (which reopens what it
        needs): a follower that waits its turn while others read keeps nothing."""


class Engine(Protocol):
    """What a storage engine provides to the `Journal` facade."""

    # The most sessions one import may hold (None: no limit); an archive of more is
    # refused in the check pass, before anything is written.
    max_import_sessions: int | None
    # Whether one staging operation may hold several of an import's staging steps
    # (`StageEvents.steps`), a history window trimming each as its own: JetStream's
    # events record where their step began; the local engine's window trims whole
    # frames, one an operation, so there each step is an operation (SPEC 12.3).
    joins_staging_steps: bool
    # Whether a read waits on the network (up to 30 s in an outage): the asyncio
    # followers then read in a worker thread, not on the caller's loop, and such an
    # engine ends a read whose `READ_SCOPE` is cancelled.
    reads_block: bool
    # Whether a read-only journal of this engine may serve frames whose cut is owed,
    # cut off again after it read them (SPEC 14.4): only such a journal's followers
    # check their last event again (`withdrawals`), and another journal given a cursor
    # of such an event cannot tell that from a store restored from an older copy, and
    # says both.
    reads_uncut: bool
    store_id: bytes
    key_ring: KeyRing
    # Whether the store keeps its own cursor keys in its stream (JetStream), not in a key
    # file: a foreign cursor's message says how keys work there (SPEC 16.5).
    keys_in_stream: bool
    readonly: bool
    location: str
    waiter: Notifier

    def check_usable(self) -> None:
        """Raise `JournalClosed` when closed or inherited across fork()."""

    def submit(self, operation: Operation[ResultT]) -> ResultT:
        """Commit one operation (batched with concurrent ones); its result or its error."""

    def head(self) -> int:
        """The committed next position (what followers wait to pass)."""

    def session(self, session_id: str) -> SessionRow | None: ...

    def confirm_current(self) -> None:
        """Return once a read asked now holds every commit acknowledged before the call,
        whoever made it (`StoreUnavailable` when that cannot be made sure of). The
        facade asks it before a refusal a copy behind the store would cause (no such
        session, a cursor past a session's or the feed's end) and reads again; a
        JetStream stream's leader cut off from its cluster answers from a stale copy
        for a while (SPEC 16.4). The local engine has one copy: it returns at once."""

    def withdrawals(self) -> int:
        """How many times frames this journal had read were found cut off the log since it
        opened (a read-only local journal's private view serves the frames after the
        view's head, which a writer whose commit failed may cut off again: SPEC 14.4); 0
        where reads serve only what is committed. A follower that delivered events checks
        the last one again when this changes, and cursor errors then name the cut."""

    def session_id_of(self, incarnation: int) -> str | None:
        """The id a session incarnation had (kept after eviction, for page tokens, while
        the log holds its creation record)."""

    def sessions(
        self, after_id: str | None, state: SessionState | None, limit: int
    ) -> tuple[list[SessionRow], bool]:
        """Up to `limit` rows in session-id order after `after_id`, and whether more follow."""

    def registry(self) -> tuple[int, Sequence[SessionRow]]:
        """Every row and the last lifecycle position, from one consistent snapshot."""

    def feed(
        self, after_position: int, limit: int, newest_first: bool = False
    ) -> tuple[list[tuple[int, FeedEntry]], int, int]:
        """Lifecycle entries after `after_position` (at most `limit`), the head, and the
        feed's floor: entries at or below the floor may have been pruned, so a follower
        after a position below it would miss some (0 when nothing was pruned).
        `newest_first`: the entries at or below `after_position` instead, newest first
        (an engine that cannot read its feed backwards gives at most the entry at
        `after_position` itself: the lifecycle feed then anchors nothing, SPEC 7.7)."""

    def readers(self) -> PageReaders: ...

    def read(
        self,
        session_id: str,
        incarnation: int,
        after_ordinal: int,
        max_bytes: int,
        context: ReadContext,
        readers: PageReaders,
    ) -> EventsPage:
        """Events after `after_ordinal` by the page rule (about `max_bytes` of data, and
        at least one event if any follows), with `context` attached to each."""

    def snapshot(self, row: SessionRow) -> StoredSnapshot | None: ...

    def checkpoint(self, row: SessionRow) -> StoredSnapshot | None:
        """The session's latest checkpoint (`row.checkpoint_position` names it)."""

    def acquire(self, session_id: str, wait_s: float) -> Lease:
        """Take the session's owner lease for this process, waiting up to `wait_s` for a
        live holder to let go (`OwnerBusy` after that)."""

    def owner_alive(self, row: SessionRow) -> bool | None:
        """Whether the owner the row records is alive (None: cannot tell from here)."""

    def owners_alive(self, rows: list[SessionRow]) -> list[bool | None]:
        """`owner_alive` of each row, in order: the live followers' owner checks of one
        round (SPEC 7.8), which an engine may answer cheaper than one by one (the local
        engine reads the start time of each distinct owner pid once)."""

    def verify(self, progress: Progress | None) -> VerifyReport:
        """Check everything, change nothing (`VerifyFix` repairs)."""

    def compact(self, dead_share: float, progress: Progress | None) -> CompactionReport: ...

    def stats(self) -> StoreStats: ...

    def retention_policy(self) -> RetentionPolicy:
        """The store's recorded retention policy now (the default where none is): what a
        writer applies from its next retention pass on, whoever recorded it (SPEC 8)."""

    def change_retention_policy(self, change: PolicyChange) -> RetentionPolicy:
        """Record `change(the recorded policy)` as the store's policy, atomically against
        other recordings (`change` may be called more than once); the policy recorded."""

    def close(self) -> None:
        """Release everything; pending waits end. Idempotent, and a close cut short (an
        interrupt, any error) is finished by the next one (SPEC 1.2)."""
