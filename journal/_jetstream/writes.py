"""Writes of the JetStream engine: one planning method per operation (committed by the
loop in `commit.py`), and the eviction and expiry passes (SPEC 16); the history windows
that appends and retention passes trim to are `windows.py`'s."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Final

import msgspec

from ..engine import (
    AbortImport,
    AcquireLease,
    Append,
    Appended,
    AppendTurnEvent,
    ApplyRetention,
    Checkpoint,
    CommitImport,
    CompactSession,
    CreateSession,
    Expire,
    Operation,
    ReleaseLease,
    SnapshotRef,
    StageEvents,
    StageSessions,
    Transition,
    VerifyFix,
)
from ..errors import (
    IdempotencyKeyReused,
    IllegalTransition,
    InvalidArgument,
    JournalError,
    OrdinalConflict,
    OwnerBusy,
    SessionExists,
    SessionNotFound,
    SessionNotWritable,
    StoreUnavailable,
)
from ..models import LifecycleEventType, RetentionReport, SessionState
from ..sessions import TRANSITIONS, SessionRow, ends_as_is, stored_state_problem
from ..turns import check_lease, check_turn, open_turn_after
from .client import PASS_RETRY_S, ApiError, BatchMessage, Unavailable, asked_again, failure
from .commit import Plan, done, rel, resolved
from .feed_pruning import FeedPruner
from .imports import Imports
from .layout import ENCODER, Marker, StoredEvent, StoredSnapshot, Subjects, stamps_recorded
from .reads import RowState
from .windows import HistoryWindows, without_dead_checkpoint

__all__ = ["MAX_APPEND_EVENTS", "Writer"]

# JetStream refuses an atomic batch of more than 1,000 messages (error 10199); an append
# also writes its row, and may write a creation record and an idempotency marker.
MAX_APPEND_EVENTS: Final = 997
# How often an append compares the recorded retention policy with the one in force.
POLICY_CHECK_S: Final = 1.0


class Writer(HistoryWindows):
    """Plans each operation (see the module docstring)."""

    imports: Imports  # (set by the engine once it knows the store's id)

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
            case Checkpoint():
                return await self._checkpoint(operation)
            case ApplyRetention():
                return await self.retain(operation.now_ms)
            case AppendTurnEvent():
                return await self._turn_event(operation)
            case AcquireLease():
                return await self._acquire(operation)
            case ReleaseLease():
                return await self._release(operation)
            case StageSessions() | StageEvents() | AbortImport():
                return await self.imports.submit(operation)
            case CommitImport():
                rows: list[SessionRow] = await self.imports.submit(operation)
                # Those due on the servers' clock expire now, returned expired (SPEC 12.3:
                # the caller's check, on the host's clock, would scan every row again). A
                # failure leaves them to the expiry timer.
                if any(row.deadline() is not None for row in rows):
                    with contextlib.suppress(JournalError, ApiError, *Unavailable):
                        done = {r.incarnation: r for r in await self.expire(None, rows)}
                        rows = [done.get(row.incarnation, row) for row in rows]
                return rows
            case VerifyFix():
                raise AssertionError("the engine answers VerifyFix itself")
            case _:
                raise TypeError(f"the JetStream engine cannot plan {type(operation).__name__}")

    def _new_row(self, op: CreateSession, now: int, index: int, count: int) -> SessionRow:
        position = rel(index, count)
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

    async def _finish_roll_back(self, state: RowState) -> None:
        """Finish the import rollback whose tombstone a create is about to write over
        (its claim is named by nothing else once the create rolls it up: SPEC 16.5)."""
        message = await self.conn.msg_get({"seq": state.seq})
        if message is not None and not message.data:
            await self.imports.finish_roll_back(state.token, message)

    def _exists(self, session_id: str) -> SessionExists:
        return SessionExists(
            f"session {session_id!r} already exists: pick another id, or use "
            "get_session to inspect it"
        )

    async def _create(self, op: CreateSession) -> SessionRow:
        async def plan(state: RowState, now: int) -> Plan:
            if state.row is not None:
                raise self._exists(op.session_id)
            if state.seq:  # (a tombstone, or a staged row: written over, rolled up)
                await self._finish_roll_back(state)
            row = self._new_row(op, now, 0, 2)
            messages = [
                self.feed_message(state, LifecycleEventType.CREATED, now, row, 1),
                self.row_message(state, row),
            ]
            return Plan(messages, row, lambda seq: resolved(row, seq))

        return await self.write(op.session_id, plan)  # type: ignore[no-any-return]

    async def _append(self, op: Append) -> Appended:
        session_id = op.session_id
        count = len(op.events)
        if count > MAX_APPEND_EVENTS:
            raise InvalidArgument(
                f"an append to a nats:// store takes at most {MAX_APPEND_EVENTS} events "
                f"(JetStream's atomic batch holds 1,000 messages), got {count}: split it "
                "into several, kept in order with expected_last_ordinal (`--expected-last`)"
            )

        async def plan(state: RowState, now: int) -> Plan:
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
                        return done(
                            Appended(
                                row.incarnation,
                                marker.first_ordinal,
                                marker.last_ordinal,
                                marker.last_position,
                                deduplicated=True,
                            )
                        )
            total = (1 if creating else 0) + count + (1 if key is not None else 0) + 1
            if op.turn is not None:
                if row is None:
                    raise SessionNotFound(f"no session {session_id!r} in this store")
                check_turn(op.turn, row, row.owner_generation, row.turn_request_id)
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
                    self.feed_message(state, LifecycleEventType.CREATED, now, row, total - 1)
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
                    rel(last_index, total),
                    total - 1 - len(messages),
                )
                if creating:
                    marker.incarnation = rel(0, total)
                messages.append(
                    (
                        self.subjects.marker(state.token, key),
                        ENCODER.encode(marker),
                        {"Nats-Expected-Last-Subject-Sequence": str(marker_seq)},
                    )
                )
            newest, in_order_from = stamps_recorded(row, first, (now,))
            new = msgspec.structs.replace(
                row,
                last_ordinal=last,
                last_event_position=rel(last_index, total),
                retained_bytes=row.retained_bytes + data_bytes,
                appended_bytes=row.appended_bytes + data_bytes,
                last_event_ms=newest,
                stamped_in_order_from=in_order_from,
            )
            messages.append(self.row_message(state, new))

            def result(seq: int) -> Appended:
                final = resolved(new, seq)
                return Appended(
                    final.incarnation, first, last, final.last_event_position, time_ms=now
                )

            return Plan(messages, new, result)

        appended: Appended = await self.write(session_id, plan)
        if not appended.deduplicated:
            await self._keep_window(session_id)
        return appended

    async def _keep_window(self, session_id: str) -> None:
        """The byte window, kept as the writer goes (the age window needs a pass)."""
        state = self.last_rows.get(session_id)
        if state is None or state.row is None:
            return
        row = state.row
        try:  # (the recorded policy, compared at most once a second: SPEC 16.5)
            policy = await self.policy_now(at_most_every_s=POLICY_CHECK_S)
        except (ApiError, *Unavailable):
            policy = self.policy  # (the append committed: its caller must not see this)
        limit = row.max_history_bytes or policy.max_history_bytes
        if limit is not None and row.retained_bytes > limit:
            await self.trim_to_window(session_id, await self.clock.now_ms())

    async def _transition(self, op: Transition) -> SessionRow:
        async def plan(state: RowState, now: int) -> Plan:
            row = state.row
            if row is None:
                raise SessionNotFound(
                    f"no session {op.session_id!r} in this store: create it first "
                    "(Journal.create_session or `journal sessions list` to check the id)"
                )
            allowed, target = TRANSITIONS[op.kind]
            current = row.session_state
            if current not in allowed:
                if ends_as_is(op.kind, current):
                    return done(row)
                raise IllegalTransition(
                    f"cannot {op.kind} session {op.session_id!r}: it is {current.value} "
                    f"(allowed from: {', '.join(sorted(s.value for s in allowed))})"
                )
            return self.state_change(state, target, now)

        return await self.write(op.session_id, plan)  # type: ignore[no-any-return]

    async def expire(
        self, now_ms: int | None, rows: list[SessionRow] | None = None
    ) -> list[SessionRow]:
        """Expire every session due at `now_ms` (a scan of every row: SPEC 16), or every
        one of `rows` due then."""
        when = await asked_again(self.clock.now_ms) if now_ms is None else now_ms
        expired: list[SessionRow] = []
        for row in await asked_again(self.reader.all_rows) if rows is None else rows:
            due = row.deadline()
            if due is None or due > when:
                continue

            async def plan(state: RowState, now: int, incarnation: int = row.incarnation) -> Plan:
                current = state.row
                if current is None or current.incarnation != incarnation:
                    return done(None)
                deadline = current.deadline()
                if deadline is None or deadline > when:
                    return done(None)
                return self.state_change(state, SessionState.EXPIRED, now)

            result = await self.write(row.session_id, plan, expire_first=False)
            if result is not None:
                expired.append(result)
        return expired

    async def _compact(self, op: CompactSession) -> SnapshotRef:
        through = op.through_ordinal
        cut: list[int] = []

        async def plan(state: RowState, now: int) -> Plan:
            row = state.row
            if row is None:
                raise SessionNotFound(
                    f"no session {op.session_id!r} in this store: create it first"
                )
            problem = stored_state_problem("snapshot", row, row.last_ordinal, through)
            if problem is not None:
                raise InvalidArgument(problem)
            first = max(row.first_ordinal, through + 1)
            retained, keep_from = await self.cut_at(row, state.token, first)
            cut[:] = [keep_from]
            snapshot = StoredSnapshot(row.incarnation, through, now, op.data)
            new = without_dead_checkpoint(
                msgspec.structs.replace(
                    row,
                    snapshot_ordinal=through,
                    snapshot_position=-1,
                    first_ordinal=first,
                    retained_bytes=retained,
                )
            )
            return self._stored_state_plan(
                state, self.subjects.snapshot(state.token), snapshot, new
            )

        ref: SnapshotRef = await self.write(op.session_id, plan)
        # Not atomic with the commit (JetStream purges are their own request): readers
        # never read below the row's first ordinal, and the purge is idempotent.
        if cut and cut[0]:
            await self.purge_trimmed(Subjects.token(op.session_id), cut[0])
        return ref

    async def _checkpoint(self, op: Checkpoint) -> SnapshotRef:
        through = op.through_ordinal

        async def plan(state: RowState, now: int) -> Plan:
            row = state.row
            if row is None:
                raise SessionNotFound(
                    f"no session {op.session_id!r} in this store: create it first"
                )
            problem = stored_state_problem("checkpoint", row, row.last_ordinal, through)
            if problem is not None:
                raise InvalidArgument(problem)
            checkpoint = StoredSnapshot(row.incarnation, through, now, op.data)
            new = msgspec.structs.replace(row, checkpoint_ordinal=through, checkpoint_position=-1)
            return self._stored_state_plan(
                state, self.subjects.checkpoint(state.token), checkpoint, new
            )

        ref: SnapshotRef = await self.write(op.session_id, plan)
        return ref

    def _stored_state_plan(
        self, state: RowState, subject: str, stored: StoredSnapshot, new: SessionRow
    ) -> Plan:
        """A snapshot or checkpoint: its rolled-up subject (only the newest message kept)
        and the session's row in one batch; its result names the row's sequence."""
        messages = [
            (subject, ENCODER.encode(stored), {"Nats-Rollup": "sub"}),
            self.row_message(state, new),
        ]
        through = stored.through_ordinal
        return Plan(
            messages,
            new,
            lambda seq: SnapshotRef(resolved(new, seq).incarnation, through, seq - 1),
        )

    async def retain(self, now_ms: int | None) -> RetentionReport:
        """History windows and session retention over every session (a scan: SPEC 16),
        then the feed's pruning.

        A read the servers leave unanswered, or refuse for want of a leader (a
        failover), is asked again with the pass for as long as a read is (PASS_RETRY_S):
        every step may be taken again (what a try committed is found done) and what it
        did is kept for the report. (Until 2026-12-05 the pass tried once:
        `apply_retention` and `journal compact` right after a stream leader's kill
        raised `StoreUnavailable` after 5 s, 3 times of 3, where every read rode the
        election out: a crash trial.) The writes' own failures are `StoreUnavailable`
        already, and end the pass."""
        now = await asked_again(self.clock.now_ms) if now_ms is None else now_ms
        # (Dicts, in the order done: a try after a failed one may trim a session again.
        # Lists searched for each session cost 56 s of the connection's loop for a pass
        # of 100,000 trims: a review.)
        trimmed: dict[str, None] = {}
        evicted: dict[str, None] = {}
        deadline = time.monotonic() + PASS_RETRY_S
        pruning = False
        while True:
            try:
                if not pruning:
                    await self._retain_sessions(now, trimmed, evicted)
                    pruning = True
                # (The feed entries of the sessions evicted a day before and earlier:
                # SPEC 16.2; now_ms None: the servers' clock.)
                await FeedPruner(self.reader, self.point, self.clock).prune(now_ms)
                return RetentionReport(list(trimmed), list(evicted), [], 0)
            except (ApiError, *Unavailable) as e:
                transient = not isinstance(e, ApiError) or e.transient
                if transient and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                    continue
                if not (pruning and (trimmed or evicted)):
                    raise
                what = failure(e)
            except StoreUnavailable as e:
                if not (pruning and (trimmed or evicted)):
                    raise
                what = str(e)
            # (Said here: the engine's answer for a request that failed would be that
            # nothing was committed, and a caller could make the changes again.)
            raise StoreUnavailable(
                f"pruning the lifecycle feed failed: {what}; this pass's "
                f"{len(evicted)} eviction(s) and {len(trimmed)} history trim(s) committed "
                "before it and stay done (a pass run again goes on from there)"
            ) from None

    async def _retain_sessions(
        self, now: int, trimmed: dict[str, None], evicted: dict[str, None]
    ) -> None:
        """One try of the pass over the sessions; what it trims and evicts is added to
        `trimmed` and `evicted` (once each: a try after a failed one finds done what the
        failed one did)."""
        policy = await self.policy_now()
        tokens = await self.reader.tokens()
        rows = await self.reader.rows_of(tokens)
        for token in tokens:
            row, seq = rows.get(token, (None, 0))
            if row is None:
                session_id = Subjects.session_of_token(token)
                if seq and session_id is not None:
                    await self._no_row(session_id, token)
                continue
            if row.session_state.terminal and policy.session_retention_ms is not None:
                since = (
                    row.created_at_ms
                    if policy.session_retention_from == "started"
                    else (row.ended_at_ms or row.created_at_ms)
                )
                if since + policy.session_retention_ms <= now:
                    evicting = await self._evict(row.session_id, row.incarnation)
                    if evicting:
                        evicted[row.session_id] = None
                    continue
            trimming = await self.trim_to_window(row.session_id, now)
            if trimming:
                trimmed[row.session_id] = None

    async def _no_row(self, session_id: str, token: str) -> None:
        """A row subject whose message reads as no row: a tombstone, whose purge failed
        (or runs), or an import's staged row, rolled back once its importer is dead."""
        message = await self.conn.msg_get({"last_by_subj": self.subjects.row(token)})
        if message is None:
            return
        if not message.data:
            await self.imports.finish_roll_back(token, message)  # (its claim: first)
            await self._purge_evicted(session_id, message.seq)
        else:
            await self.imports.roll_back_if_dead(token, message)

    async def _evict(self, session_id: str, incarnation: int) -> bool:
        async def plan(state: RowState, now: int) -> Plan:
            row = state.row
            if row is None or row.incarnation != incarnation:
                return done(0)
            messages = [
                self.feed_message(state, LifecycleEventType.EVICTED, now, row, 1),
                self.row_message(state, None),
            ]
            return Plan(messages, None, lambda seq: seq)

        # The sequence of the tombstone (the row message this commit wrote), 0: not evicted.
        tombstone: int = await self.write(session_id, plan, expire_first=False)
        if tombstone:
            self.point("eviction.committed", session_id)
            await self._purge_evicted(session_id, tombstone)
        return bool(tombstone)

    async def _purge_evicted(self, session_id: str, tombstone: int) -> None:
        """Purge an evicted incarnation: everything of the session's subjects up to its
        tombstone (at sequence `tombstone`), the tombstone included. A session created
        again since (by any process: not under this lock) wrote after the tombstone and is
        kept. (It was read back here, and a session created again before that read left
        the old incarnation in the stream for good.) A purge that fails leaves the
        tombstone, so the next retention pass purges it (idempotent)."""
        async with self.lock(session_id):
            token = Subjects.token(session_id)
            await self.reader.purge_or_leave(self.subjects.session_all(token), tombstone + 1)
            self.last_rows.pop(session_id, None)

    async def _turn_event(self, op: AppendTurnEvent) -> Appended:
        async def plan(state: RowState, now: int) -> Plan:
            row = state.row
            if row is None:
                raise SessionNotFound(f"no session {op.session_id!r} in this store")
            check_lease(op.session_id, op.incarnation, op.generation, row, row.owner_generation)
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
            turn = open_turn_after(row.turn_request_id, op.type, op.request_id)
            newest, in_order_from = stamps_recorded(row, ordinal, (now,))
            new = msgspec.structs.replace(
                row,
                last_ordinal=ordinal,
                last_event_ms=newest,
                stamped_in_order_from=in_order_from,
                last_event_position=-1,
                retained_bytes=row.retained_bytes + len(op.data),
                appended_bytes=before + len(op.data),
                turn_request_id=turn,
                turn_position=-1,
            )
            messages = [
                (self.subjects.events(state.token), ENCODER.encode(stored), {}),
                self.row_message(state, new),
            ]
            return Plan(
                messages,
                new,
                lambda seq: Appended(
                    resolved(new, seq).incarnation, ordinal, ordinal, seq - 1, time_ms=now
                ),
            )

        return await self.write(op.session_id, plan)  # type: ignore[no-any-return]

    async def _acquire(self, op: AcquireLease) -> SessionRow:
        async def plan(state: RowState, now: int) -> Plan:
            row = state.row
            if row is None:
                raise SessionNotFound(
                    f"no session {op.session_id!r} in this store: create it before owning it"
                )
            if row.owner_pid and await self.owner_alive(row, 1) is not False:
                raise OwnerBusy.held(
                    op.session_id,
                    row.owner_pid,
                    f"pid {row.owner_pid} on {row.owner_host}",
                    # (The pid namespace too: containers' main processes are all pid 1.)
                    (row.owner_pid, row.owner_host, row.owner_boot_id)
                    == (op.pid, op.host, op.boot_id),
                )
            if row.session_state.terminal:
                raise SessionNotWritable(
                    f"session {op.session_id!r} is {row.session_state.value}: an ended "
                    "session has no owner; create a new session"
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
            return Plan([self.row_message(state, new)], new, lambda seq: resolved(new, seq))

        return await self.write(op.session_id, plan)  # type: ignore[no-any-return]

    async def _release(self, op: ReleaseLease) -> SessionRow | None:
        async def plan(state: RowState, now: int) -> Plan:
            row = state.row
            if (
                row is None
                or row.incarnation != op.incarnation
                or row.owner_generation != op.generation
                or not row.owner_pid
            ):
                return done(row)
            new = msgspec.structs.replace(
                row,
                owner_pid=0,
                owner_start_time=0,
                owner_host="",
                owner_boot_id="",
                owner_since_ms=0,
            )
            return Plan([self.row_message(state, new)], new, lambda seq: resolved(new, seq))

        return await self.write(op.session_id, plan, expire_first=False)  # type: ignore[no-any-return]
