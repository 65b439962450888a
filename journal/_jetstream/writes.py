"""Writes of the JetStream engine: each operation planned against a session's row and
committed as one atomic batch ending with the new row, with a compare-and-set on the row
subject (SPEC 16). A stale row (another writer committed first) is read again and the
operation planned again; a lost reply is settled by looking for the commit's write token.

Coroutines on the connection's loop; writers of one session in this process take turns
(a per-session lock), so they do not compete for the compare-and-set among themselves.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec

from ..engine import (
    AbortImport,
    AcquireLease,
    Append,
    Appended,
    AppendTurnEvent,
    ApplyRetention,
    CommitImport,
    CompactSession,
    CreateSession,
    Expire,
    Operation,
    ReleaseLease,
    SnapshotRef,
    StageEvents,
    StageSession,
    Transition,
    VerifyFix,
)
from ..errors import (
    IdempotencyKeyReused,
    IllegalTransition,
    InvalidArgument,
    OrdinalConflict,
    OwnerBusy,
    SessionExists,
    SessionNotFound,
    SessionNotWritable,
    StoreUnavailable,
    Unsupported,
)
from ..models import LifecycleEventType, RetentionPolicy, RetentionReport, SessionState
from ..records import TURN_STARTED
from ..sessions import TRANSITIONS, FeedEntry, SessionRow, lifecycle_event_of
from .client import ApiError, BatchMessage, Unavailable
from .layout import (
    ENCODER,
    Marker,
    StoredEvent,
    StoredFeed,
    StoredSnapshot,
    Subjects,
    resolve,
)
from .reads import RowState, StoreReader

__all__ = ["MAX_APPEND_EVENTS", "Writer"]

# JetStream refuses an atomic batch of more than 1,000 messages (error 10199); an append
# also writes its row, and may write a creation record and an idempotency marker.
MAX_APPEND_EVENTS: Final = 997
# How long a write keeps trying across a lost connection or a leader election.
WRITE_S: Final = 30.0
_WRONG_LAST_SEQUENCE: Final = 10071
_TOO_LARGE: Final = frozenset({10054, 10199})
_TOKEN: Final = "Journal-Write"

Owner = Callable[[SessionRow], Awaitable[bool | None]]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Plan:
    """What one planned commit writes (`messages`, the row last; none: nothing to write),
    and how its result follows from the sequence its row got."""

    __slots__ = ("messages", "result", "row")

    def __init__(
        self,
        messages: list[BatchMessage],
        row: SessionRow | None,
        result: Callable[[int], Any],
    ) -> None:
        self.messages = messages
        self.row = row
        self.result = result


def _done(value: Any) -> _Plan:
    return _Plan([], None, lambda _seq: value)


def _resolved(row: SessionRow, seq: int) -> SessionRow:
    return resolve(msgspec.structs.replace(row), seq)


def _rel(index: int, count: int) -> int:
    """The relative position of message `index` of a batch of `count` (row last)."""
    return -(count - 1 - index)


class Writer:
    """Plans and commits operations (see the module docstring)."""

    def __init__(
        self,
        reader: StoreReader,
        policy: RetentionPolicy,
        owner_alive: Owner,
        committed: Callable[[int, SessionRow | None], None],
    ) -> None:
        self.reader = reader
        self.conn = reader.conn
        self.subjects = reader.subjects
        self.policy = policy
        self._owner_alive = owner_alive
        self._committed = committed
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # Rows this engine committed last, per session: the next write starts from them
        # (a compare-and-set failure means they are stale: read again).
        self._rows: dict[str, RowState] = {}

    # -- the commit loop -------------------------------------------------------------------

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    async def _state(self, session_id: str, fresh: bool) -> RowState:
        if not fresh:
            cached = self._rows.get(session_id)
            if cached is not None:
                return cached
        return await self.reader.row(session_id)

    async def write(
        self,
        session_id: str,
        plan: Callable[[RowState, int], Awaitable[_Plan]],
        expire_first: bool = True,
    ) -> Any:
        """Plan and commit one operation on one session, again on a stale row."""
        lock = self._lock(session_id)
        async with lock:
            fresh = False
            deadline = time.monotonic() + WRITE_S
            while True:
                state = await self._state(session_id, fresh)
                now = _now_ms()
                row = state.row
                if expire_first and row is not None:
                    due = row.deadline()
                    if due is not None and due <= now:
                        # Past its deadline: expired first, whatever is asked (as every
                        # commit of the local engine expires what is due).
                        expired = self._state_change(state, SessionState.EXPIRED, now)
                        if await self._commit(session_id, state, expired) is None:
                            fresh = True
                        else:
                            fresh = False
                        continue
                planned = await plan(state, now)
                if not planned.messages:
                    return planned.result(0)
                seq = await self._commit(session_id, state, planned)
                if seq is None:
                    fresh = True
                    if time.monotonic() > deadline:
                        raise StoreUnavailable(
                            f"session {session_id!r} kept changing under this write for "
                            f"{WRITE_S:g} s: retry"
                        )
                    continue
                return planned.result(seq)

    async def _commit(self, session_id: str, state: RowState, plan: _Plan) -> int | None:
        """Publish the plan's batch with the compare-and-set on the row subject; the row's
        sequence, or None when the row was stale (nothing written)."""
        token = uuid.uuid4().hex
        messages = self._stamped(state, plan.messages, token)
        deadline = time.monotonic() + WRITE_S
        uncertain = False
        seq: int | None
        while True:
            try:
                seq = await self.conn.publish_batch(messages)
            except ApiError as e:
                if e.err_code == _WRONG_LAST_SEQUENCE:
                    if uncertain:
                        seq = await self._settle(state, messages, token)
                        if seq is not None:
                            break
                    self._rows.pop(session_id, None)
                    return None
                if e.err_code in _TOO_LARGE:
                    raise InvalidArgument(
                        f"JetStream refused this write to session {session_id!r}: "
                        f"{e.description} (a message is limited by the stream's max_msg_size "
                        "and the server's max_payload, a batch to 1,000 messages): write "
                        "less at once"
                    ) from None
                if e.code == 503 or e.err_code in (10008, 10077, 10201):
                    uncertain = True  # no leader yet (or a batch cut by a failover)
                else:
                    raise StoreUnavailable(
                        f"JetStream refused the write to session {session_id!r}: "
                        f"{e.description} (error {e.err_code})"
                    ) from None
            except Unavailable:
                uncertain = True
            if uncertain:
                # The batch may have been stored without its reply reaching us.
                seq = await self._settle(state, messages, token)
                if seq is not None:
                    break
                if time.monotonic() > deadline:
                    raise StoreUnavailable(
                        f"no reply from JetStream for {WRITE_S:g} s writing to session "
                        f"{session_id!r}; the write was not committed: check the servers "
                        "and retry (with an idempotency key to make the retry safe)"
                    )
                await asyncio.sleep(0.1)
                continue
            break
        assert seq is not None
        self.reader.saw(seq)
        if plan.row is None:
            self._rows.pop(session_id, None)
            new_state = RowState(None, seq, state.token)
        else:
            new_state = RowState(_resolved(plan.row, seq), seq, state.token)
            if len(self._rows) >= 4096:
                self._rows.clear()
            self._rows[session_id] = new_state
        self._committed(seq, new_state.row)
        return seq

    def _stamped(
        self, state: RowState, messages: list[BatchMessage], token: str
    ) -> list[BatchMessage]:
        """The batch with the row's compare-and-set and the write token on every message
        of the session's own subjects but its events after the first."""
        session_prefix = self.subjects.session_wide(state.token)[:-1]
        stamped: list[BatchMessage] = []
        first_event = True
        last = len(messages) - 1
        for index, (subject, payload, headers) in enumerate(messages):
            headers = dict(headers)
            is_event = subject.endswith(".ev")
            if subject.startswith(session_prefix) and (not is_event or first_event):
                headers[_TOKEN] = token
            if is_event:
                first_event = False
            if index == last:
                headers["Nats-Expected-Last-Subject-Sequence"] = str(state.seq)
                headers["Nats-Rollup"] = "sub"
            stamped.append((subject, payload, headers))
        return stamped

    async def _settle(
        self, state: RowState, messages: list[BatchMessage], token: str
    ) -> int | None:
        """Whether a batch whose reply was lost was stored: the first message on the
        session's subjects after the compare-and-set value is the commit that won it; the
        row's sequence if that is ours, else None."""
        try:
            first = await self.conn.msg_get(
                {"seq": state.seq + 1, "next_by_subj": self.subjects.session_wide(state.token)}
            )
        except (ApiError, *Unavailable):
            return None
        if first is None or first.headers.get(_TOKEN) != token:
            return None
        session_prefix = self.subjects.session_wide(state.token)[:-1]
        index = next(
            i for i, (subject, _, _) in enumerate(messages) if subject.startswith(session_prefix)
        )
        return first.seq - index + len(messages) - 1

    # -- batch pieces ----------------------------------------------------------------------

    def _row_message(self, state: RowState, row: SessionRow | None) -> BatchMessage:
        payload = b"" if row is None else ENCODER.encode(row)
        return (self.subjects.row(state.token), payload, {})

    def _feed_message(
        self, state: RowState, event: LifecycleEventType, now: int, row: SessionRow, anchor: int
    ) -> BatchMessage:
        entry = FeedEntry(event.value, now, row)
        return (
            self.subjects.lifecycle(state.token),
            ENCODER.encode(StoredFeed(entry, anchor)),
            {},
        )

    def _state_change(self, state: RowState, target: SessionState, now: int) -> _Plan:
        assert state.row is not None
        row = msgspec.structs.replace(
            state.row,
            state=target.wire,
            lifecycle_position=-1,
            suspended_at_ms=now if target is SessionState.SUSPENDED else None,
            ended_at_ms=now if target.terminal else state.row.ended_at_ms,
        )
        messages = [
            self._feed_message(state, lifecycle_event_of(target), now, row, 1),
            self._row_message(state, row),
        ]
        return _Plan(messages, row, lambda seq: _resolved(row, seq))

    # -- operations ------------------------------------------------------------------------

    async def submit(self, operation: Operation[Any]) -> Any:
        match operation:
            case Append():
                return await self._append(operation)
            case CreateSession():
                return await self._create(operation)
            case Transition():
                return await self._transition(operation)
            case Expire():
                return await self.expire(operation.now_ms)
            case CompactSession():
                return await self._compact(operation)
            case ApplyRetention():
                return await self.retain(operation.now_ms)
            case AppendTurnEvent():
                return await self._turn_event(operation)
            case AcquireLease():
                return await self._acquire(operation)
            case ReleaseLease():
                return await self._release(operation)
            case StageSession() | StageEvents() | CommitImport() | AbortImport():
                raise Unsupported(
                    "import_sessions is not available on a nats:// store: import the "
                    "archive into a local store, or replay its events with append()"
                )
            case VerifyFix():
                raise AssertionError("the engine answers VerifyFix itself")
            case _:
                raise TypeError(f"the JetStream engine cannot plan {type(operation).__name__}")

    def _new_row(self, op: CreateSession, now: int, index: int, count: int) -> SessionRow:
        position = _rel(index, count)
        return SessionRow(
            session_id=op.session_id,
            incarnation=position,
            state=SessionState.OPEN.wire,
            mode=op.mode,
            context_id=op.context_id,
            tags=dict(op.tags),
            extensions=dict(op.extensions),
            created_at_ms=now,
            ended_at_ms=None,
            first_ordinal=1,
            last_ordinal=0,
            ttl_ms=op.ttl_ms,
            max_suspend_ms=op.max_suspend_ms,
            suspended_at_ms=None,
            lifecycle_position=position,
            max_history_bytes=op.max_history_bytes,
            max_history_age_ms=op.max_history_age_ms,
        )

    def _exists(self, session_id: str) -> SessionExists:
        return SessionExists(
            f"session {session_id!r} already exists: pick another id, or use "
            "get_session to inspect it"
        )

    async def _create(self, op: CreateSession) -> SessionRow:
        async def plan(state: RowState, now: int) -> _Plan:
            if state.row is not None:
                raise self._exists(op.session_id)
            row = self._new_row(op, now, 0, 2)
            messages = [
                self._feed_message(state, LifecycleEventType.CREATED, now, row, 1),
                self._row_message(state, row),
            ]
            return _Plan(messages, row, lambda seq: _resolved(row, seq))

        return await self.write(op.session_id, plan)  # type: ignore[no-any-return]

    async def _append(self, op: Append) -> Appended:
        session_id = op.session_id
        count = len(op.events)
        if count > MAX_APPEND_EVENTS:
            raise InvalidArgument(
                f"an append to a nats:// store takes at most {MAX_APPEND_EVENTS} events "
                f"(JetStream's atomic batch holds 1,000 messages), got {count}: split it "
                "into several appends (with expected_last_ordinal to keep them in order)"
            )

        async def plan(state: RowState, now: int) -> _Plan:
            row = state.row
            creating = row is None
            if row is None and op.create is None:
                raise SessionNotFound(
                    f"no session {session_id!r} in this store: create it first "
                    "(Journal.create_session or `journal sessions list` to check the id)"
                )
            key = op.idempotency_key
            marker_seq = 0
            if key is not None:
                found = await self.reader.marker(state.token, key)
                if found is not None:
                    marker, marker_seq = found
                    if (
                        row is not None
                        and marker.incarnation == row.incarnation
                        and marker.last_ordinal >= row.first_ordinal
                    ):
                        if marker.digest != op.digest:
                            raise IdempotencyKeyReused(
                                f"idempotency key {key!r} was already used on session "
                                f"{session_id!r} with different events: use a new key for "
                                "new events"
                            )
                        return _done(
                            Appended(
                                row.incarnation,
                                marker.first_ordinal,
                                marker.last_ordinal,
                                marker.last_position,
                                deduplicated=True,
                            )
                        )
            total = (1 if creating else 0) + count + (1 if key is not None else 0) + 1
            if row is None:
                assert op.create is not None
                row = self._new_row(op.create, now, 0, total)
            state_now = row.session_state
            if state_now is not SessionState.OPEN:
                hint = (
                    "resume it first"
                    if state_now is SessionState.SUSPENDED
                    else "it has ended; create a new session"
                )
                raise SessionNotWritable(f"session {session_id!r} is {state_now.value}: {hint}")
            expected = op.expected_last_ordinal
            if expected is not None and expected != row.last_ordinal:
                raise OrdinalConflict(
                    f"session {session_id!r} ends at ordinal {row.last_ordinal}, not "
                    f"{expected}: read the new events and retry",
                    expected=expected,
                    actual=row.last_ordinal,
                )
            messages: list[BatchMessage] = []
            if creating:
                messages.append(
                    self._feed_message(state, LifecycleEventType.CREATED, now, row, total - 1)
                )
            first = row.last_ordinal + 1
            before = row.appended_bytes
            subject = self.subjects.events(state.token)
            running = before
            for offset, event in enumerate(op.events):
                stored = StoredEvent(
                    first + offset,
                    now,
                    event.type,
                    event.data,
                    event.request_id,
                    first,
                    before,
                    running,
                )
                running += len(event.data)
                messages.append((subject, ENCODER.encode(stored), {}))
            last = first + count - 1
            last_index = len(messages) - 1
            data_bytes = running - before
            if key is not None:
                marker = Marker(
                    row.incarnation,
                    key,
                    first,
                    last,
                    op.digest,
                    _rel(last_index, total),
                    total - 1 - len(messages),
                )
                if creating:
                    marker.incarnation = _rel(0, total)
                messages.append(
                    (
                        self.subjects.marker(state.token, key),
                        ENCODER.encode(marker),
                        {"Nats-Expected-Last-Subject-Sequence": str(marker_seq)},
                    )
                )
            new = msgspec.structs.replace(
                row,
                last_ordinal=last,
                last_event_position=_rel(last_index, total),
                retained_bytes=row.retained_bytes + data_bytes,
                appended_bytes=row.appended_bytes + data_bytes,
            )
            messages.append(self._row_message(state, new))

            def result(seq: int) -> Appended:
                resolved = _resolved(new, seq)
                return Appended(resolved.incarnation, first, last, resolved.last_event_position)

            return _Plan(messages, new, result)

        appended: Appended = await self.write(session_id, plan)
        if not appended.deduplicated:
            await self._keep_window(session_id)
        return appended

    async def _keep_window(self, session_id: str) -> None:
        """The byte window, kept as the writer goes (the age window needs a pass)."""
        state = self._rows.get(session_id)
        if state is None or state.row is None:
            return
        row = state.row
        limit = row.max_history_bytes or self.policy.max_history_bytes
        if limit is not None and row.retained_bytes > limit:
            await self._trim_to_window(session_id, _now_ms())

    async def _transition(self, op: Transition) -> SessionRow:
        async def plan(state: RowState, now: int) -> _Plan:
            row = state.row
            if row is None:
                raise SessionNotFound(
                    f"no session {op.session_id!r} in this store: create it first "
                    "(Journal.create_session or `journal sessions list` to check the id)"
                )
            allowed, target = TRANSITIONS[op.kind]
            current = row.session_state
            if current not in allowed:
                if op.kind == "cancel" and current.terminal:
                    return _done(row)
                raise IllegalTransition(
                    f"cannot {op.kind} session {op.session_id!r}: it is {current.value} "
                    f"(allowed from: {', '.join(sorted(s.value for s in allowed))})"
                )
            return self._state_change(state, target, now)

        return await self.write(op.session_id, plan)  # type: ignore[no-any-return]

    async def expire(self, now_ms: int | None) -> list[SessionRow]:
        """Expire every session due at `now_ms` (a scan of every row: SPEC 16)."""
        when = _now_ms() if now_ms is None else now_ms
        expired: list[SessionRow] = []
        for row in await self.reader.all_rows():
            due = row.deadline()
            if due is None or due > when:
                continue

            async def plan(state: RowState, now: int, incarnation: int = row.incarnation) -> _Plan:
                current = state.row
                if current is None or current.incarnation != incarnation:
                    return _done(None)
                deadline = current.deadline()
                if deadline is None or deadline > when:
                    return _done(None)
                return self._state_change(state, SessionState.EXPIRED, now)

            result = await self.write(row.session_id, plan, expire_first=False)
            if result is not None:
                expired.append(result)
        return expired

    async def _compact(self, op: CompactSession) -> SnapshotRef:
        through = op.through_ordinal
        cut: list[int] = []

        async def plan(state: RowState, now: int) -> _Plan:
            row = state.row
            if row is None:
                raise SessionNotFound(
                    f"no session {op.session_id!r} in this store: create it first"
                )
            if through > row.last_ordinal:
                raise InvalidArgument(
                    f"session {op.session_id!r} ends at ordinal {row.last_ordinal}; a snapshot "
                    f"cannot stand for events up to {through}"
                )
            if through < row.snapshot_ordinal:
                raise InvalidArgument(
                    f"session {op.session_id!r} already has a snapshot through ordinal "
                    f"{row.snapshot_ordinal}; a new one must reach at least that far"
                )
            first = max(row.first_ordinal, through + 1)
            retained, keep_from = await self._cut_at(row, state.token, first)
            cut[:] = [keep_from]
            snapshot = StoredSnapshot(row.incarnation, through, now, op.data)
            new = msgspec.structs.replace(
                row,
                snapshot_ordinal=through,
                snapshot_position=-1,
                first_ordinal=first,
                retained_bytes=retained,
            )
            messages = [
                (
                    self.subjects.snapshot(state.token),
                    ENCODER.encode(snapshot),
                    {"Nats-Rollup": "sub"},
                ),
                self._row_message(state, new),
            ]
            return _Plan(
                messages,
                new,
                lambda seq: SnapshotRef(_resolved(new, seq).incarnation, through, seq - 1),
            )

        ref: SnapshotRef = await self.write(op.session_id, plan)
        token = Subjects.token(op.session_id)
        # Not atomic with the commit (JetStream purges are their own request): readers
        # never read below the row's first ordinal, and the purge is idempotent.
        if cut and cut[0]:
            await self.reader.purge(self.subjects.events(token), cut[0])
        return ref

    async def _cut_at(self, row: SessionRow, token: str, first: int) -> tuple[int, int]:
        """(retained bytes, sequence to purge the events below) for a history starting at
        ordinal `first`."""
        if first > row.last_ordinal:
            return 0, row.last_event_position + 1
        if first <= row.first_ordinal:
            return row.retained_bytes, 0
        seq = await self.reader.seq_of(row, token, first)
        if seq is None:
            return row.retained_bytes, 0
        probe = await self.reader.first_event_at(token, seq)
        if probe is None:
            return row.retained_bytes, 0
        return row.appended_bytes - probe[1].bytes_before, seq

    async def _trim_to_window(self, session_id: str, now: int) -> bool:
        cut: list[int] = []

        async def plan(state: RowState, _now: int) -> _Plan:
            row = state.row
            if row is None:
                return _done(False)
            first = await self._window_start(row, state.token, now)
            if first <= row.first_ordinal:
                return _done(False)
            retained, keep_from = await self._cut_at(row, state.token, first)
            cut[:] = [keep_from]
            new = msgspec.structs.replace(row, first_ordinal=first, retained_bytes=retained)
            return _Plan([self._row_message(state, new)], new, lambda _seq: True)

        trimmed: bool = await self.write(session_id, plan, expire_first=False)
        if trimmed and cut and cut[0]:
            await self.reader.purge(self.subjects.events(Subjects.token(session_id)), cut[0])
        return trimmed

    async def _window_start(self, row: SessionRow, token: str, now: int) -> int:
        """The first ordinal the history windows keep (an append is never cut, and the
        newest one is kept whatever its size), as the local engine's `window_start`."""
        limit_bytes = row.max_history_bytes or self.policy.max_history_bytes
        limit_age = row.max_history_age_ms or self.policy.max_history_age_ms
        over_bytes = limit_bytes is not None and row.retained_bytes > limit_bytes
        new_first = row.first_ordinal
        if row.last_ordinal < row.first_ordinal:
            return new_first
        if over_bytes and limit_bytes is not None:
            floor = row.appended_bytes - limit_bytes
            seq = await self.reader.seq_where(row, token, lambda e: e.batch_bytes_before >= floor)
            if seq is None:
                seq = row.last_event_position  # the newest append is kept
            probe = await self.reader.first_event_at(token, seq)
            if probe is not None:
                new_first = max(new_first, probe[1].batch_first)
        if limit_age is not None:
            horizon = now - limit_age
            newest = await self.reader.first_event_at(token, row.last_event_position)
            if newest is not None and newest[1].timestamp_ms < horizon:
                new_first = max(new_first, row.last_ordinal + 1)
            else:
                seq = await self.reader.seq_where(row, token, lambda e: e.timestamp_ms >= horizon)
                if seq is not None:
                    probe = await self.reader.first_event_at(token, seq)
                    if probe is not None:
                        new_first = max(new_first, probe[1].batch_first)
        return new_first

    async def retain(self, now_ms: int | None) -> RetentionReport:
        """History windows and session retention over every session (a scan: SPEC 16)."""
        now = _now_ms() if now_ms is None else now_ms
        policy = self.policy
        trimmed: list[str] = []
        evicted: list[str] = []
        for row in await self.reader.all_rows():
            if row.session_state.terminal and policy.session_retention_ms is not None:
                since = (
                    row.created_at_ms
                    if policy.session_retention_from == "started"
                    else (row.ended_at_ms or row.created_at_ms)
                )
                if since + policy.session_retention_ms <= now:
                    if await self._evict(row.session_id, row.incarnation):
                        evicted.append(row.session_id)
                    continue
            if await self._trim_to_window(row.session_id, now):
                trimmed.append(row.session_id)
        return RetentionReport(trimmed, evicted, [], 0)

    async def _evict(self, session_id: str, incarnation: int) -> bool:
        async def plan(state: RowState, now: int) -> _Plan:
            row = state.row
            if row is None or row.incarnation != incarnation:
                return _done(False)
            messages = [
                self._feed_message(state, LifecycleEventType.EVICTED, now, row, 1),
                self._row_message(state, None),
            ]
            return _Plan(messages, None, lambda _seq: True)

        lock = self._lock(session_id)
        evicted: bool = await self.write(session_id, plan, expire_first=False)
        if evicted:
            async with lock:
                tombstone = await self.reader.row(session_id)
                if tombstone.row is None and tombstone.seq:
                    # Everything of the old incarnation, the tombstone included: a session
                    # created again since has its row above it and is kept.
                    token = Subjects.token(session_id)
                    await self.reader.purge(self.subjects.session_all(token), tombstone.seq + 1)
                self._rows.pop(session_id, None)
        return evicted

    async def _turn_event(self, op: AppendTurnEvent) -> Appended:
        async def plan(state: RowState, now: int) -> _Plan:
            row = state.row
            if row is None:
                raise SessionNotFound(f"no session {op.session_id!r} in this store")
            if (
                row.incarnation != op.incarnation
                or row.owner_generation != op.generation
                or not row.owner_pid
            ):
                raise OwnerBusy(
                    f"the owner lease (generation {op.generation}) of session "
                    f"{op.session_id!r} is no longer held by this owner: take it again "
                    "with own()",
                    pid=row.owner_pid,
                )
            if row.session_state is not SessionState.OPEN:
                raise SessionNotWritable(
                    f"session {op.session_id!r} is {row.session_state.value}: the turn "
                    "cannot be recorded"
                )
            ordinal = row.last_ordinal + 1
            before = row.appended_bytes
            stored = StoredEvent(
                ordinal, now, op.type, op.data, op.request_id, ordinal, before, before
            )
            if op.type == TURN_STARTED:
                turn: str | None = op.request_id
            elif op.request_id == row.turn_request_id:
                turn = None
            else:
                turn = row.turn_request_id
            new = msgspec.structs.replace(
                row,
                last_ordinal=ordinal,
                last_event_position=-1,
                retained_bytes=row.retained_bytes + len(op.data),
                appended_bytes=before + len(op.data),
                turn_request_id=turn,
                turn_position=-1,
            )
            messages = [
                (self.subjects.events(state.token), ENCODER.encode(stored), {}),
                self._row_message(state, new),
            ]
            return _Plan(
                messages,
                new,
                lambda seq: Appended(_resolved(new, seq).incarnation, ordinal, ordinal, seq - 1),
            )

        return await self.write(op.session_id, plan)  # type: ignore[no-any-return]

    async def _acquire(self, op: AcquireLease) -> SessionRow:
        async def plan(state: RowState, now: int) -> _Plan:
            row = state.row
            if row is None:
                raise SessionNotFound(
                    f"no session {op.session_id!r} in this store: create it before owning it"
                )
            if row.session_state.terminal:
                raise SessionNotWritable(
                    f"session {op.session_id!r} is {row.session_state.value}: an ended "
                    "session has no owner; create a new session"
                )
            if row.owner_pid and await self._owner_alive(row) is not False:
                raise OwnerBusy(
                    f"session {op.session_id!r} is owned by pid {row.owner_pid} on "
                    f"{row.owner_host}: wait for it to finish, or pass a longer wait_s",
                    pid=row.owner_pid,
                )
            new = msgspec.structs.replace(
                row,
                owner_generation=row.owner_generation + 1,
                owner_pid=op.pid,
                owner_start_time=op.start_time,
                owner_host=op.host,
                owner_boot_id=op.boot_id,
                owner_since_ms=now,
                owner_position=0,
            )
            return _Plan([self._row_message(state, new)], new, lambda seq: _resolved(new, seq))

        return await self.write(op.session_id, plan)  # type: ignore[no-any-return]

    async def _release(self, op: ReleaseLease) -> SessionRow | None:
        async def plan(state: RowState, now: int) -> _Plan:
            row = state.row
            if (
                row is None
                or row.incarnation != op.incarnation
                or row.owner_generation != op.generation
                or not row.owner_pid
            ):
                return _done(row)
            new = msgspec.structs.replace(
                row,
                owner_pid=0,
                owner_start_time=0,
                owner_host="",
                owner_boot_id="",
                owner_since_ms=0,
            )
            return _Plan([self._row_message(state, new)], new, lambda seq: _resolved(new, seq))

        return await self.write(op.session_id, plan, expire_first=False)  # type: ignore[no-any-return]
