"""The JetStream engine: a journal stored in one NATS JetStream stream (SPEC 16).

A synchronous facade over an asyncio client: the connection runs its own event-loop
thread (`client.Connection`), and every `Engine` method runs its coroutine there, so the
journal's sync and async APIs both work. Reads are in `reads.py`, writes in `writes.py`,
opening the store in `opening.py`, the owner leases and their heartbeats in `leases.py`;
this module keeps the expiry timer; the change source that wakes the shared waiter is in
`row_changes.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from nats.errors import NoRespondersError

from cursors import KeyRing

from ..engine import (
    READ_SCOPE,
    EventsPage,
    Lease,
    Operation,
    PolicyChange,
    StoredSnapshot,
    VerifyFix,
    read_ended,
)
from ..engine import Progress as ProgressCallback
from ..errors import (
    JournalClosed,
    JournalCorrupt,
    ReadOnlyStore,
    StoreUnavailable,
)
from ..models import (
    CompactionReport,
    ReadContext,
    RetentionPolicy,
    SessionState,
    StoreStats,
    VerifyProblem,
    VerifyReport,
)
from ..remote import without_password
from ..sessions import FeedEntry, SessionRow
from ..waiter import HeadUnknown, Notifier
from .client import PASS_RETRY_S, ApiError, Closed, Connection, Unavailable, failure
from .commits_seen import CommitsSeen
from .imports import MAX_IMPORT_SESSIONS, Imports
from .layout import Meta, Subjects
from .leases import Leases, boot_id, start_time
from .opening import identity_and_policy
from .owners import HEARTBEAT_S, PROCESS_LEASES, OwnerJudge
from .reads import FRESH_S, Lasting, Moved, StoreReader
from .row_changes import RowChanges
from .server_clock import ServerClock
from .writes import Writer

__all__ = ["JetStreamEngine", "JetStreamOptions"]

T = TypeVar("T")

# How often the expiry timer reads every row's deadline (deadlines set by other
# processes are kept within this).
EXPIRY_SCAN_S: Final = 30.0
# How long a read is asked again while the servers do not answer.
READ_RETRY_S: Final = PASS_RETRY_S  # (the maintenance passes' window too)
_STREAM_PREFIX: Final = "JOURNAL_"


@dataclass
class JetStreamOptions:
    """How to open a store on JetStream (the keywords of `Journal.open`)."""

    servers: list[str]
    store: str
    # The stream's replication factor: None takes an existing stream's and creates one
    # with 1; a number that differs from an existing stream's is refused at open.
    replicas: int | None = None
    create: bool = True
    readonly: bool = False
    retention: RetentionPolicy | None = None  # None: the store's recorded policy
    key_ring: KeyRing | None = None
    # How often an owner's lease beats (below LEASE_S; a test of what happens between
    # beats opens its engine with a longer one, through `Journal.over`).
    heartbeat_s: float = HEARTBEAT_S
    # The engine's fault points (SPEC 1.3): called as point(name, detail) on the engine's
    # event loop thread at the places a race matters; a test pauses, acts or raises there.
    point: Callable[[str, object], None] | None = None
    # How long the open asks again while the servers do not answer or refuse for a while
    # (a stream electing its leader after a failover): as long as a read does.
    open_retry_s: float = READ_RETRY_S


def _no_point(name: str, detail: object) -> None:
    """No fault points armed (the default)."""


class _Readers:
    """What one reader keeps across pages: where its last page ended (incarnation ->
    (ordinal, sequence)), so the next page starts there without a search."""

    def __init__(self) -> None:
        self.ends: dict[int, tuple[int, int]] = {}

    def __enter__(self) -> _Readers:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def release(self) -> None:
        return None  # (nothing held: `ends` are positions)

    close = release


def _jetstream_answers(conn: Connection) -> bool:
    """Whether JetStream's API answers at all (`$JS.API.INFO`, the account's info)."""
    try:
        conn.call(conn.api("$JS.API.INFO"))
    except NoRespondersError:
        return False
    except (*Unavailable, ApiError):
        return True  # (something is there: a timeout or an error is not "not enabled")
    return True


class JetStreamEngine:
    """The engine (see the module docstring). Use `JetStreamEngine.open`."""

    max_import_sessions: int | None = MAX_IMPORT_SESSIONS
    joins_staging_steps: bool = True
    reads_block: bool = True
    reads_uncut: bool = False
    keys_in_stream: bool = True
    store_id: bytes
    key_ring: KeyRing
    readonly: bool
    location: str
    waiter: Notifier

    @classmethod
    def open(cls, options: JetStreamOptions) -> JetStreamEngine:
        stream = _STREAM_PREFIX + options.store
        conn = Connection(options.servers, stream)
        try:
            return cls(conn, options)
        except BaseException:
            conn.close()
            raise

    def __init__(self, conn: Connection, options: JetStreamOptions) -> None:
        self.conn = conn
        self.subjects = Subjects(options.store)
        self.readonly = options.readonly
        self.replicas = options.replicas
        self.heartbeat_s = options.heartbeat_s
        self.point = options.point or _no_point
        servers = ",".join(s.removeprefix("nats://") for s in options.servers)
        # (no password: `Journal.path`, its repr and messages show it)
        self.location = without_password(f"nats://{servers}/{options.store}")
        self._pid = os.getpid()
        self._host = socket.gethostname()
        self._boot = boot_id()
        self._closed = self._released = False
        self.reader = StoreReader(conn, self.subjects, writable=not self.readonly, point=self.point)
        self.clock = ServerClock(conn, self.point)  # (every time the engine records or judges)
        self._owners = OwnerJudge(
            conn,
            self.reader,
            self.subjects,
            (self._host, self._boot, self._pid),
            lambda row, taking: PROCESS_LEASES.alive(self.store_id, row, taking),
            self.clock,
        )
        try:
            meta, self.key_ring, policy = self._identity_and_policy(options)
        except Unavailable as e:
            # "No responders" from the JetStream API itself means it is not enabled; a
            # stream without a leader yet can answer a publish the same way, so the API
            # is asked once on its own before saying so.
            if isinstance(e, NoRespondersError) and not _jetstream_answers(conn):
                raise StoreUnavailable(
                    f"the NATS servers at {self.location.rsplit('/', 1)[0]} run without "
                    "JetStream (nothing answers its API): enable it in their configuration "
                    "(a `jetstream { store_dir: DIR, sync_interval: always }` block, SPEC 16.1)"
                ) from None
            raise StoreUnavailable(
                f"the NATS servers did not answer while opening store {options.store!r} "
                f"({type(e).__name__}): the servers may be down, or electing leaders after "
                "a restart or in a new cluster: retry once they answer"
            ) from None
        except ApiError as e:
            if e.no_leader:
                # (refused so for the open's 30 s: said as a read says it; until
                # 2026-12-05 it said to retry in a few seconds or see the account's
                # limits, nothing of a majority down: a crash trial's quorum loss)
                raise StoreUnavailable(
                    f"cannot open store {options.store!r}: {failure(e)}"
                ) from None
            then = "retry in a few seconds" if e.transient else "check the servers' logs"
            raise StoreUnavailable(
                f"JetStream refused to open the store: {e}: {then} (a refusal that passes "
                "is a stream electing its leader; else see the account's JetStream limits)"
            ) from None
        self.store_id = meta.store_id
        conn.opened = True  # (a "stream not found" from now on is asked again first)
        seen = CommitsSeen(self.reader, lambda: self._closed)  # (which sessions moved)
        self.waiter = Notifier(
            self._waiter_head,
            lambda: RowChanges(self.conn, self.subjects, self.point),
            lambda: seen.read(self._look),
        )
        self.writer = Writer(
            self.reader, policy, self._owner_alive, self._committed, self.point, self.clock
        )
        importer = (self._pid, max(start_time(self._pid), 0), self._host, self._boot)
        self.writer.imports = Imports(
            self.reader,
            self.store_id,
            importer,
            self._owner_alive,
            self._committed,
            self.heartbeat_s,
            self.point,
            self.clock,
        )
        self.leases = Leases(
            conn,
            self.subjects,
            self.store_id,
            (self._host, self._boot),
            self.heartbeat_s,
            self.submit,
            self._run,
            self.writer.submit,
            lambda: self._closed,
            self.point,
        )
        self._expiry_wake: asyncio.Event | None = None
        self._expiry: asyncio.Task[None] | None = None
        if not self.readonly:
            self._expiry = conn.call(self._start_expiry())

    # -- plumbing --------------------------------------------------------------------------

    def check_usable(self) -> None:
        if self._closed:
            raise JournalClosed.already()
        if os.getpid() != self._pid:
            raise JournalClosed.inherited("the NATS connection's thread does not survive fork")

    def _call(
        self,
        coro: Any,
        timeout: float | None = None,
        cut: Callable[[], JournalClosed] = JournalClosed.meanwhile,
    ) -> Any:
        """`_run`, but the client's `Unavailable` and `ApiError` are raised as they are."""
        try:
            self.check_usable()
        except BaseException:
            coro.close()
            raise
        try:
            return self.conn.call(coro, timeout)
        except Closed:
            raise cut() from None

    def _run(
        self,
        coro: Any,
        timeout: float | None = None,
        cut: Callable[[], JournalClosed] = JournalClosed.meanwhile,
    ) -> Any:
        """The call's result; `cut()` is raised when another thread's `close()` cut it."""
        try:
            return self._call(coro, timeout, cut)
        except Unavailable as e:
            if self._closed:  # (the connection closed under the call: not the servers)
                raise cut() from None
            raise StoreUnavailable(
                f"{failure(e)}: check that they run and that this host reaches them"
            ) from None
        except ApiError as e:
            raise StoreUnavailable(failure(e)) from None

    def _identity_and_policy(
        self, options: JetStreamOptions
    ) -> tuple[Meta, KeyRing, RetentionPolicy]:
        """What the open reads (and writes, the first time), asked again for up to
        `open_retry_s` while the servers do not answer or refuse for a while, as a read
        is: a supervisor that restarts a watcher during a failover got `StoreUnavailable`
        after one try of 5 s (until 2026-12-05: a JetStream trial) where every call of a
        journal already open rode it out. (Each step is one a concurrent open may take
        too: creating the stream, the identity record's compare-and-set, the policy's.)
        A server without JetStream is told at once (`_jetstream_answers`)."""
        deadline = time.monotonic() + options.open_retry_s
        conn = self.conn
        while True:
            try:
                found: tuple[Meta, KeyRing, RetentionPolicy] = conn.call(
                    identity_and_policy(conn, self.subjects, self.reader, options)
                )
                return found
            except Unavailable as e:
                if isinstance(e, NoRespondersError) and not _jetstream_answers(conn):
                    raise
                if conn.denied is not None:
                    # (a user the servers do not let use the JetStream API: its
                    # requests go unanswered, and asking again for 30 s mended nothing)
                    raise StoreUnavailable(
                        f"the NATS servers refused a request while opening store "
                        f"{options.store!r}: {conn.denied}: give this user the "
                        "permissions JetStream needs (publish to $JS.API.>, and the "
                        "store's subjects; SPEC 16.1)"
                    ) from None
                if time.monotonic() > deadline:
                    raise
            except ApiError as e:
                if not e.transient or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def _ask(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """A read, asked again for a while when the servers do not answer (a leader
        election takes seconds): readers and watchers ride it out."""
        deadline = time.monotonic() + READ_RETRY_S
        # (an asyncio follower's read, in a worker thread: it ends when its task is
        # cancelled, not asked again for up to 30 s in a thread nobody waits for)
        scope = READ_SCOPE.get()
        while True:
            if scope is not None:
                scope.check()
            try:
                result: T = self._run(make())
                return result
            except Lasting as e:  # (said at once, as the public class)
                raise StoreUnavailable(str(e)) from None
            except StoreUnavailable:
                if self._closed or time.monotonic() > deadline:
                    raise
                if scope is None:
                    time.sleep(0.1)
                else:
                    scope.sleep(0.1)

    def _waiter_head(self) -> int:
        if self._closed:
            return 1 << 63  # (every follower looks, and ends)
        head: int = self._look(self.reader.head)
        return head

    def _look(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """The shared waiter's read of the head, asked once: `HeadUnknown` while the
        servers do not answer, so waiting followers say nothing in an outage (SPEC 16.4)
        and the thread goes on checking their `stop` events. (Asked again for 30 s, its
        failure had every follower raise about 60 s into an outage: an operator trial.)"""
        if not self.conn.connected:  # (reconnecting: a request would wait 5 s for nothing)
            raise HeadUnknown
        try:
            result: T = self._call(make())
            return result
        except Unavailable:
            if self._closed:
                raise JournalClosed.meanwhile() from None
            raise HeadUnknown from None
        except ApiError as e:
            if e.transient:  # (no stream leader yet)
                raise HeadUnknown from None
            raise StoreUnavailable(failure(e)) from None

    def _committed(self, seq: int, row: SessionRow | None, first: int) -> None:
        self.waiter.publish(seq + 1, None if row is None else (row.incarnation,), first)
        if row is not None and self._expiry_wake is not None:
            due = row.deadline()
            if due is not None:
                self._expiry_wake.set()

    def submit(self, operation: Operation[T]) -> T:
        if self.readonly:
            raise ReadOnlyStore(
                "this journal was opened with readonly=True; open it writable to change it"
            )
        if isinstance(operation, VerifyFix):
            # Nothing is derived from the stream: the check is the repair's whole work.
            fixed: Any = self.verify(operation.progress)  # (a VerifyReport)
            return fixed  # type: ignore[no-any-return]
        # (Cut by another thread's close() with the write sent or not: said so, since a
        # caller that takes "closed" for "not written" would write it twice.)
        result: T = self._run(self.writer.submit(operation), cut=JournalClosed.mid_write)
        return result

    def head(self) -> int:
        if self._closed:
            return 1 << 63
        head: int = self._ask(self.reader.head)
        return head

    # -- reads -----------------------------------------------------------------------------

    def session(self, session_id: str) -> SessionRow | None:
        state = self._ask(lambda: self.reader.row(session_id))
        return state.row

    def confirm_current(self) -> None:
        self._run(self.reader.in_touch(read_ended()))  # (a follower's: ends once stopped)

    def withdrawals(self) -> int:
        return 0  # (no private view that serves frames past a head: `Engine.withdrawals`)

    def session_id_of(self, incarnation: int) -> str | None:
        self.point("sessions.id_of", incarnation)
        found: str | None = self._ask(lambda: self.reader.session_id_of(incarnation))
        return found

    def sessions(
        self, after_id: str | None, state: SessionState | None, limit: int
    ) -> tuple[list[SessionRow], bool]:
        result: tuple[list[SessionRow], bool] = self._ask(
            lambda: self._sessions(after_id, state, limit)
        )
        return result

    async def _sessions(
        self, after_id: str | None, state: SessionState | None, limit: int
    ) -> tuple[list[SessionRow], bool]:
        # No ordered index of subjects: every session's token is listed (O(sessions) per
        # page, SPEC 16), then rows are fetched in order until the page is full.
        tokens = await self.reader.tokens()
        if after_id is not None:
            after = Subjects.token(after_id)
            tokens = [t for t in tokens if t > after]
        rows: list[SessionRow] = []
        chunk = limit + 1 if state is None else max(limit + 1, 256)
        for start in range(0, len(tokens), chunk):
            part = tokens[start : start + chunk]
            found = await self.reader.rows_of(part)
            for token in part:
                row = found.get(token, (None, 0))[0]
                if row is None or (state is not None and row.session_state is not state):
                    continue
                if len(rows) == limit:
                    return rows, True
                rows.append(row)
        return rows, False

    def registry(self) -> tuple[int, list[SessionRow]]:
        ended = read_ended()  # (a follower's snapshot: its listing's wait ends once stopped)
        result: tuple[int, list[SessionRow]] = self._ask(lambda: self._registry(ended))
        return result

    async def _registry(self, ended: Callable[[], bool] | None) -> tuple[int, list[SessionRow]]:
        return await self.reader.registry(
            lambda at: self.point("sessions.snapshot_point", at), ended
        )

    def feed(
        self, after_position: int, limit: int, newest_first: bool = False
    ) -> tuple[list[tuple[int, FeedEntry]], int, int]:
        self.point("reads.feed", after_position)  # (on the caller's thread)
        result: tuple[list[tuple[int, FeedEntry]], int, int] = self._ask(
            lambda: self._feed(after_position, limit, newest_first)
        )
        return result

    async def _feed(
        self, after: int, limit: int, newest_first: bool
    ) -> tuple[list[tuple[int, FeedEntry]], int, int]:
        # The head the follower waits past: the stream's before the entries are read,
        # raised past the entries it read and what this process knew committed before
        # (every entry up to that is among them). Not what it knows after: another
        # thread's commit or head read raised that meanwhile, past an entry committed
        # after this read looked, and the follower waited for the commit after it
        # (found by a CI run: a lifecycle watcher missed the last session created).
        known = self.reader.known
        head = await self.reader.head()
        if newest_first:
            # (The stream is not read backwards: only the entry at the position itself,
            # which a registry's point always is, `Reader.registry`.)
            at = await self.reader.feed(after - 1, 1) if after > 0 and limit else []
            entries = [(p, e) for p, e in at if p == after]
        else:
            entries = await self.reader.feed(after, limit)
        # The floor after the entries: it is raised before the purges it covers, so an
        # entry purged above `after` before they were read shows as a floor above it.
        floor = await self.reader.feed_floor()
        reach = entries[-1][0] + 1 if entries else 0
        return entries, max(head, known + 1, reach), floor

    def readers(self) -> _Readers:
        return _Readers()

    def read(
        self,
        session_id: str,
        incarnation: int,
        after_ordinal: int,
        max_bytes: int,
        context: ReadContext,
        readers: Any,
    ) -> EventsPage:
        ends = readers.ends if isinstance(readers, _Readers) else {}
        page: EventsPage = self._ask(
            lambda: self._read(session_id, incarnation, after_ordinal, max_bytes, context, ends)
        )
        if page.events:
            ends[incarnation] = (page.events[-1].ordinal, page.events[-1].position)
        return page

    async def _read(
        self,
        session_id: str,
        incarnation: int,
        after: int,
        max_bytes: int,
        context: ReadContext,
        ends: dict[int, tuple[int, int]],
    ) -> EventsPage:
        self.point("reads.page", session_id)
        deadline = time.monotonic() + FRESH_S
        attempt = 0
        gap_under = -1  # the row sequence a leader read last found a gap under
        while True:
            # Every commit known before the row is asked for is in it (read through the
            # leader): the head to wait past (not `known` after the answer: SPEC 16).
            known = self.reader.known
            state = await self.reader.row(session_id)
            head = max(known, state.seq) + 1
            row = state.row
            if row is None or row.incarnation != incarnation or after < row.first_ordinal - 1:
                return EventsPage([], False, row, head)
            if after >= row.last_ordinal:
                return EventsPage([], False, row, head)
            # A replica that lags answers direct gets without the newest events: after
            # two tries the page is read through the leader.
            leader = attempt >= 2
            try:
                end = ends.get(incarnation)
                if end is not None and end[0] == after and attempt == 0:
                    start: int | None = end[1] + 1  # the next event lies above the last
                else:
                    start = await self.reader.seq_of(row, state.token, after + 1)
                if start is None:
                    raise Moved(after + 1, after + 1)
                events, more, _ = await self.reader.events(
                    row, state.token, start, after, max_bytes, context, leader
                )
            except Unavailable:
                # No replica began to answer the direct gets (`Connection.direct`): while
                # a node hangs, the servers may send every one of a few seconds to it
                # (a follower stopped with SIGSTOP: watchers on the leader's own node
                # stalled 3-5 s at a time, until 2026-12-06). The page is read again
                # through the leader, who answers; its silence is the caller's to ride out.
                if leader:
                    raise
                attempt = 2
                continue
            except Moved as moved:
                # Trimmed meanwhile (the next row says so), or a replica not there yet. An
                # ordinal missing in the leader's events twice under the same row is
                # neither: the stream lost an event.
                attempt += 1
                lost = leader and moved.gap and gap_under == state.seq
                if leader and moved.gap:
                    gap_under = state.seq
                if lost or time.monotonic() > deadline:
                    if leader and moved.gap:
                        raise JournalCorrupt(
                            self.subjects.events(state.token),
                            after,
                            f"the events of session {session_id!r} after ordinal {after} do "
                            f"not follow its row ({moved}; the offset is the ordinal)",
                        ) from None
                    raise StoreUnavailable(
                        f"the events of session {session_id!r} after ordinal {after} stayed "
                        f"unreadable for {FRESH_S:g} s ({moved}): check the cluster"
                    ) from None
                await asyncio.sleep(0 if attempt < 3 else 0.005)
                continue
            return EventsPage(events, more, row, head)

    def snapshot(self, row: SessionRow) -> StoredSnapshot | None:
        stored = self._ask(lambda: self.reader.snapshot(row.snapshot_position))
        if stored is None:
            return None
        return StoredSnapshot(row.snapshot_position, stored.through_ordinal, stored.data)

    def checkpoint(self, row: SessionRow) -> StoredSnapshot | None:
        if not row.checkpoint_position:
            return None
        stored = self._ask(lambda: self.reader.snapshot(row.checkpoint_position, ".ck"))
        if stored is None or stored.through_ordinal != row.checkpoint_ordinal:
            raise JournalCorrupt(
                "stream",
                row.checkpoint_position,
                f"the checkpoint of {row.session_id!r} is missing",
            )
        return StoredSnapshot(row.checkpoint_position, stored.through_ordinal, stored.data)

    # -- owners ----------------------------------------------------------------------------

    def acquire(self, session_id: str, wait_s: float) -> Lease:
        self.check_usable()
        if self.readonly:
            raise ReadOnlyStore("own() needs a writable journal")
        return self.leases.acquire(session_id, wait_s)

    def owner_alive(self, row: SessionRow) -> bool | None:
        if not row.owner_pid:
            return False
        alive: bool | None = self._ask(lambda: self._owner_alive(row))
        return alive

    def owners_alive(self, rows: list[SessionRow]) -> list[bool | None]:
        alive: list[bool | None] = self._ask(lambda: self._owners.all_alive(rows))
        return alive

    async def _owner_alive(self, row: SessionRow, taking: int = 0) -> bool | None:
        """Whether the owner `row` records is alive; `taking`: 1 when asked by an `own()`
        of the session in flight itself."""
        return await self._owners.alive(row, taking)

    # -- expiry ----------------------------------------------------------------------------

    async def _start_expiry(self) -> asyncio.Task[None]:
        self._expiry_wake = asyncio.Event()
        return asyncio.get_running_loop().create_task(self._expiring())

    async def _expiring(self) -> None:
        assert self._expiry_wake is not None
        wake = self._expiry_wake
        while not self._closed:
            try:
                rows = await self.reader.all_rows()
                dues = [d for row in rows if (d := row.deadline()) is not None]
                nearest = min(dues) if dues else None
                wait = EXPIRY_SCAN_S
                if nearest is not None:
                    now = await self.clock.now_ms()
                    wait = min(wait, max(0.0, (nearest - now) / 1000))
                if wait > 0:
                    wake.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(wake.wait(), wait)
                    if wake.is_set():
                        continue  # a new deadline: read them again
                await self.writer.expire(None)
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(1.0)  # the servers are away: try again later

    # -- maintenance -----------------------------------------------------------------------

    def verify(self, progress: ProgressCallback | None) -> VerifyReport:
        # (asked again as a read is, from the start: until 2026-12-05 it was asked once,
        # and right after a stream leader's kill raised `StoreUnavailable` after 5 s)
        report: VerifyReport = self._ask(lambda: self._verify(progress))
        return report

    async def _verify(self, progress: ProgressCallback | None) -> VerifyReport:
        """The nearest honest check: every session's retained events are dense and end
        where its row says (the server checks its own files)."""
        rows = await self.reader.all_rows()
        problems: list[VerifyProblem] = []
        events = 0
        total = sum(max(0, r.last_ordinal - r.first_ordinal + 1) for r in rows)
        context = ReadContext("", lambda event: "")
        for row in rows:
            token = Subjects.token(row.session_id)
            after = row.first_ordinal - 1
            if after >= row.last_ordinal:
                continue
            start = await self.reader.seq_of(row, token, after + 1)
            while start is not None and after < row.last_ordinal:
                try:
                    page, more, next_seq = await self.reader.events(
                        row, token, start, after, 4 << 20, context
                    )
                except Moved:
                    try:  # through the leader: a replica that lags is no damage
                        page, more, next_seq = await self.reader.events(
                            row, token, start, after, 4 << 20, context, True
                        )
                    except Moved as e:
                        where = f"session {row.session_id!r}"
                        problems.append(VerifyProblem(where, e.expected, str(e)))
                        break
                events += len(page)
                after = page[-1].ordinal if page else after
                if progress is not None:
                    progress(events, total)
                start = next_seq if more else None
        return VerifyReport(0, len(rows), events, problems)

    def compact(self, dead_share: float, progress: ProgressCallback | None) -> CompactionReport:
        self.check_usable()  # (the server compacts its own message blocks: nothing to do)
        return CompactionReport([], [], 0, 0, 0, 0.0)

    def retention_policy(self) -> RetentionPolicy:
        return self._ask(self.writer.policy_now)

    def change_retention_policy(self, change: PolicyChange) -> RetentionPolicy:
        policy: RetentionPolicy = self._run(self.writer.change_policy(change))
        return policy

    def stats(self) -> StoreStats:
        return self._ask(self._stats)

    async def _stats(self) -> StoreStats:
        counts: dict[str, int] = {}
        for row in await self.reader.all_rows():
            counts[row.session_state.value] = counts.get(row.session_state.value, 0) + 1
        info = await self.conn.api(f"$JS.API.STREAM.INFO.{self.conn.stream}")
        state = info["state"]
        replicas = int((info.get("config") or {}).get("num_replicas", 1))
        return StoreStats(
            counts, 0, int(state.get("bytes", 0)), int(state["last_seq"]) + 1, replicas
        )

    def close(self) -> None:
        """Idempotent: a close cut short (a Ctrl+C, any error) is finished by the next
        one, which does each step again or finds it done; once the connection is closed,
        a close does nothing."""
        if self._released:
            return
        if os.getpid() != self._pid:
            self._closed = True
            return
        self.leases.release_all()
        self._closed = True
        try:
            self.writer.imports.close()  # (up to 2 s: its heartbeat's purge)
        finally:
            # The requests in flight end now (a head read of the waiter thread, which the
            # waiter's close waits for, would wait up to 5 s while the servers do not
            # answer), also after a Ctrl+C in the purge wait.
            self.conn.cut()
            self.waiter.close()
            if self._expiry is not None:
                task = self._expiry
                with contextlib.suppress(Exception):
                    self.conn.loop.call_soon_threadsafe(task.cancel)
            self.conn.close()
        self._released = True
