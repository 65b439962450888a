"""The planner: validates one batch of operations against the view inside the writer's
transaction and turns them into the records of one frame, in order, as if they were
applied one by one. One method per operation type (an import's operations: one function
each in `import_steps`, which change the planner's state through its methods); a failure
while planning one operation fails that operation alone and leaves no trace in the frame.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import Any, Final, Literal

import lmdb
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
    OrdinalConflict,
    SessionExists,
    SessionNotFound,
    SessionNotWritable,
)
from ..models import RetentionReport, SessionState, VerifyProblem
from ..records import (
    CheckpointTaken,
    EventAppended,
    HistoryTrimmed,
    IdempotencyKeyUsed,
    OwnerAcquired,
    OwnerReleased,
    Record,
    SessionCreated,
    SessionEvicted,
    SnapshotTaken,
    StateChanged,
)
from ..sessions import (
    TRANSITIONS,
    SessionRow,
    check_ordinals_left,
    ends_as_is,
    stored_state_problem,
)
from ..turns import check_lease, check_turn, open_turn_after
from .compaction import SealActive, SwapSegment, seal_active, swap_segment
from .failures import store_wide
from .frames import segment_name
from .import_steps import abort_import, commit_import, stage_events, stage_sessions
from .log import SegmentLog
from .recorded_policy import RecordedPolicy
from .retention import (
    FrameTimes,
    SummaryCache,
    candidate_rows,
    dead_segments,
    forget_segments,
    policy_mark,
    window_start,
)
from .segments import LogHole
from .sidecar import EventRun, FrameDigest, add_run, encode_other
from .verify import fix_store
from .view import View

__all__ = ["Pending", "Planner", "Request", "SealRetention"]

_ABSENT: Final = object()


class SealRetention(ApplyRetention, frozen=True):
    """The retention pass a seal makes due (the local engine's own, never submitted by the
    facade): without time rules in the policy it reads only the rows that can have changed
    since the last pass (SPEC 8, "What a pass reads")."""


class Request:
    """One operation waiting in the commit queue, and what became of it."""

    __slots__ = ("done", "error", "operation", "result", "wake")

    def __init__(self, operation: Operation[Any]) -> None:
        self.operation = operation
        self.wake: Any = None  # a held raw lock while it waits for a leader (released to wake)
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class Pending:
    """The planner's view of one session while a batch is being validated."""

    __slots__ = ("incarnation", "last_ordinal", "row", "state", "turn")

    def __init__(self, row: SessionRow) -> None:
        self.row = row
        self.incarnation = row.incarnation
        self.state = row.session_state
        self.last_ordinal = row.last_ordinal
        self.turn = row.turn_request_id  # (the open turn, after the batch's turn events)


class Planner:
    """Plans one batch (see the module docstring); `finish` fills in results that need
    the projected rows, `doomed` lists segments to delete once the transaction commits,
    `evicted` the sessions whose lock files go then, `unpin` segments to compact
    afterwards (`compaction.unpin_segments`)."""

    def __init__(
        self,
        txn: lmdb.Transaction,
        view: View,
        log: SegmentLog,
        summaries: SummaryCache,
        policy: RecordedPolicy,
        identity: tuple[bytes, bytes],
        next_position: int,
        now: int,
    ) -> None:
        self.txn = txn
        self.view = view
        self.log = log
        self.summaries = summaries
        self.policy = policy
        self.store_id, self.boot_id = identity
        self.first_position = next_position
        self.next_position = next_position
        self.now = now
        self.records: list[Record] = []
        self.sessions: dict[str, Pending | None] = {}
        self.idem: dict[tuple[int, str], IdempotencyKeyUsed] = {}
        # Lease generations planned in this batch, per incarnation.
        self.generations: dict[int, int] = {}
        # The frame's event runs (coalesced) and its other records (index, record).
        self.event_runs: list[EventRun] = []
        self.others: list[tuple[int, Record]] = []
        self.loose_events: list[tuple[int, int, int]] = []
        # Segments the view forgot in this transaction: deleted once it commits.
        self.doomed: list[int] = []
        self.evicted: list[str] = []
        # Sealed segments whose compaction would let eviction records go (`_reclaim`).
        self.unpin: set[int] = set()
        self.rebuilt = False
        # Frames cut off the active segment that a fix in this batch accepts the loss of.
        self.hole: LogHole | None = None
        self.cuts: list[VerifyProblem] = []  # (active segments a fix cut: `cut_at_damage`)
        # Rows known to be what the view holds (the writer's last batch): not read again.
        self.known_rows: dict[str, SessionRow] = {}
        self.finishers: list[tuple[Request, Callable[[], object]]] = []
        # How to take back what planning an operation changed in the planner's state
        # (sessions, their pending state, idempotency keys), for a failed operation.
        self._undo: list[Callable[[], None]] = []

    # -- bookkeeping -----------------------------------------------------------------------

    def emit(self, record: Record) -> int:
        """Add a non-event record (events go in whole runs, in `_append`)."""
        self.others.append((len(self.records), record))
        self.records.append(record)
        position = self.next_position
        self.next_position += 1
        return position

    def pending(self, session_id: str) -> Pending | None:
        if session_id not in self.sessions:
            row = self.known_rows.get(session_id)
            if row is None:
                row = self.view.row(self.txn, session_id)
            self.sessions[session_id] = None if row is None else Pending(row)
        return self.sessions[session_id]

    def _existing(self, session_id: str) -> Pending:
        pending = self.pending(session_id)
        if pending is None:
            raise SessionNotFound(
                f"no session {session_id!r} in this store: create it first "
                "(Journal.create_session or `journal sessions list` to check the id)"
            )
        return pending

    def set_session(self, session_id: str, pending: Pending | None) -> None:
        previous = self.sessions.get(session_id, _ABSENT)

        def undo() -> None:
            if previous is _ABSENT:
                self.sessions.pop(session_id, None)
            else:
                self.sessions[session_id] = previous  # type: ignore[assignment]

        self._undo.append(undo)
        self.sessions[session_id] = pending

    def plan_session(self, session_id: str, row: SessionRow) -> Pending:
        """Plan `row` as session `session_id`'s from here on (undone if the request fails)."""
        pending = Pending(row)
        self.set_session(session_id, pending)
        return pending

    def set_field(self, pending: Pending, field: str, value: object) -> None:
        """Set one of `pending`'s fields (undone if the request fails)."""
        previous = getattr(pending, field)
        self._undo.append(lambda: setattr(pending, field, previous))
        setattr(pending, field, value)

    def _remember_key(self, key: tuple[int, str], used: IdempotencyKeyUsed) -> None:
        previous = self.idem.get(key)

        def undo() -> None:
            if previous is None:
                self.idem.pop(key, None)
            else:
                self.idem[key] = previous

        self._undo.append(undo)
        self.idem[key] = used

    def rows_read(self) -> list[SessionRow]:
        """Rows of existing sessions read in this transaction (the projection adopts them
        instead of reading them again)."""
        if self.rebuilt:
            return []  # the view was rebuilt under them
        return [
            pending.row
            for pending in self.sessions.values()
            if pending is not None and pending.incarnation < self.first_position
        ]

    def plan(self, request: Request) -> None:
        """Plan one request; its failure (of any kind) is its own and leaves no trace."""
        runs = self.event_runs
        last_run = (runs[-1].count, runs[-1].data_bytes) if runs else (0, 0)
        mark = (
            len(self.records),
            self.next_position,
            len(runs),
            len(self.finishers),
            len(self.others),
            len(self._undo),
            len(self.loose_events),
        )
        request.error = None
        request.result = None
        try:
            self.log.ops.point("plan.operation", request.operation)
            self._dispatch(request, request.operation)
        except Exception as e:
            if isinstance(request.operation, SealActive) and store_wide(e):
                # The rotation's file changes are not undone here: a seal that failed
                # after the next segment's birth (its sidecar unwritten) fails its batch,
                # as one inside an append does, so no frame of the batch lands after the
                # sealed segment while it lacks its sidecar (SPEC 8, "Sealing the active
                # segment"). The next commit's catch-up finishes the seal.
                raise
            records, next_position, run_count, finishers, others, undo, loose = mark
            del self.loose_events[loose:]
            while len(self._undo) > undo:
                self._undo.pop()()
            del self.records[records:]
            self.next_position = next_position
            # add_run may have merged into the last run: put it back as it was.
            del runs[run_count:]
            if runs:
                runs[-1].count, runs[-1].data_bytes = last_run
            del self.finishers[finishers:]
            del self.others[others:]
            request.result = None
            request.error = e

    def _dispatch(self, request: Request, operation: Operation[Any]) -> None:
        match operation:
            case Append():
                self._append(request, operation)
            case CreateSession():
                self._create(request, operation)
            case Transition():
                self._transition(request, operation)
            case Expire():
                self._expire(request, operation)
            case CompactSession():
                self._compact_session(request, operation)
            case Checkpoint():
                self._checkpoint(request, operation)
            case ApplyRetention():
                self._retention(request, operation)
            case VerifyFix():
                self._verify_fix(request, operation)
            case AppendTurnEvent():
                self._turn_event(request, operation)
            case AcquireLease():
                self._acquire(request, operation)
            case ReleaseLease():
                self._release(request, operation)
            case StageEvents():
                stage_events(self, request, operation)
            case StageSessions():
                stage_sessions(self, request, operation)
            case CommitImport():
                commit_import(self, request, operation)
            case AbortImport():
                abort_import(self, request, operation)
            case SwapSegment():
                request.result = swap_segment(self.txn, self.view, self.log, operation)
                self.summaries.pop(operation.base, None)
            case SealActive():
                request.result = seal_active(self.txn, self.view, self.log, operation)
            case _:
                raise TypeError(f"the local engine cannot plan {type(operation).__name__}")

    # -- one method per operation ----------------------------------------------------------

    def _create(self, request: Request, op: CreateSession) -> None:
        position = self._create_session(op)
        self.finishers.append((request, lambda: self._feed_row(position)))

    def _create_session(self, op: CreateSession) -> int:
        if self.pending(op.session_id) is not None:
            raise SessionExists(
                f"session {op.session_id!r} already exists: pick another id, or use "
                "get_session to inspect it"
            )
        record = SessionCreated(
            session_id=op.session_id,
            created_at_ms=self.now,
            mode=op.mode,
            context_id=op.context_id,
            tags=op.tags,
            extensions=op.extensions,
            ttl_ms=op.ttl_ms,
            max_suspend_ms=op.max_suspend_ms,
            max_history_bytes=op.max_history_bytes,
            max_history_age_ms=op.max_history_age_ms,
        )
        position = self.emit(record)
        self.set_session(op.session_id, Pending(SessionRow.created(record, position)))
        return position

    def _append(self, request: Request, op: Append) -> None:
        session_id = op.session_id
        if op.create is not None and self.pending(session_id) is None:
            # Created with its first append, in this operation: both or neither.
            self._create_session(op.create)
        pending = self._existing(session_id)
        incarnation = pending.incarnation
        if op.turn is not None:
            planned = self.generations.get(incarnation, pending.row.owner_generation)
            check_turn(op.turn, pending.row, planned, pending.turn)
        key = op.idempotency_key
        if key is not None:
            used = self.idem.get((incarnation, key))
            if used is None:
                entry = self.view.idem_entry(self.txn, incarnation, key)
                if entry is not None:
                    used = IdempotencyKeyUsed(
                        incarnation,
                        key,
                        entry.first_ordinal,
                        entry.last_ordinal,
                        entry.digest,
                        entry.last_position,
                    )
            if used is not None:
                if used.digest != op.digest:
                    raise IdempotencyKeyReused(
                        f"idempotency key {key!r} was already used on session "
                        f"{session_id!r} with different events: use a new key for new events"
                    )
                request.result = Appended(
                    incarnation,
                    used.first_ordinal,
                    used.last_ordinal,
                    used.last_position,
                    deduplicated=True,
                )
                return
        if pending.state is not SessionState.OPEN:
            hint = (
                "resume it first"
                if pending.state is SessionState.SUSPENDED
                else "it has ended; create a new session"
            )
            raise SessionNotWritable(f"session {session_id!r} is {pending.state.value}: {hint}")
        expected = op.expected_last_ordinal
        if expected is not None and expected != pending.last_ordinal:
            raise OrdinalConflict(
                f"session {session_id!r} ends at ordinal {pending.last_ordinal}, not "
                f"{expected}: read the new events and retry",
                expected=expected,
                actual=pending.last_ordinal,
            )
        events = op.events
        count = len(events)
        check_ordinals_left(session_id, pending.last_ordinal, count)
        first = pending.last_ordinal + 1
        now = self.now
        base = self.next_position
        add_run(
            self.event_runs,
            EventRun(
                len(self.records),
                incarnation,
                first,
                count,
                op.data_bytes or sum(len(e.data) for e in events),
                now,
            ),
        )
        self.records.extend(
            [
                EventAppended(incarnation, first + i, now, e.type, e.data, e.request_id, base + i)
                for i, e in enumerate(events)
            ]
        )
        self.next_position += len(events)
        position = self.next_position - 1
        last = first + len(events) - 1
        self.set_field(pending, "last_ordinal", last)
        if key is not None:
            used = IdempotencyKeyUsed(incarnation, key, first, last, op.digest, position)
            self._remember_key((incarnation, key), used)
            self.emit(used)
        request.result = Appended(incarnation, first, last, position, time_ms=now)

    def _transition(self, request: Request, op: Transition) -> None:
        pending = self._existing(op.session_id)
        allowed, target = TRANSITIONS[op.kind]
        if pending.state not in allowed:
            if ends_as_is(op.kind, pending.state):
                session_id = op.session_id
                self.finishers.append((request, lambda: self.current_row(session_id)))
                return
            raise IllegalTransition(
                f"cannot {op.kind} session {op.session_id!r}: it is {pending.state.value} "
                f"(allowed from: {', '.join(sorted(s.value for s in allowed))})"
            )
        position = self.emit(StateChanged(pending.incarnation, target.wire, self.now))
        self.set_field(pending, "state", target)
        self.finishers.append((request, lambda: self._feed_row(position)))

    def expire_due(self) -> None:
        """Expire what is due now, before the batch's requests are planned: a session
        past its deadline takes no append even before an expiry pass ran."""
        self._expire_rows(self.now)

    def _expire(self, request: Request, op: Expire) -> None:
        positions = self._expire_rows(self.now if op.now_ms is None else op.now_ms)
        self.finishers.append((request, lambda: [self._feed_row(p) for p in positions]))

    def _expire_rows(self, now: int) -> list[int]:
        positions: list[int] = []
        for incarnation in self.view.due(self.txn, now):
            row = self.view.row_by_incarnation(self.txn, incarnation)
            if row is None:
                continue
            if row.session_id in self.sessions:
                continue  # changed earlier in this batch: its stored deadline is stale
            pending = self.pending(row.session_id)
            if pending is None or pending.incarnation != incarnation or pending.state.terminal:
                continue
            position = self.emit(
                StateChanged(incarnation, SessionState.EXPIRED.wire, self.now, "deadline")
            )
            self.set_field(pending, "state", SessionState.EXPIRED)
            positions.append(position)
        return positions

    def _compact_session(self, request: Request, op: CompactSession) -> None:
        self._stored_state(request, "snapshot", SnapshotTaken, op)

    def _checkpoint(self, request: Request, op: Checkpoint) -> None:
        self._stored_state(request, "checkpoint", CheckpointTaken, op)

    def _stored_state(
        self,
        request: Request,
        what: Literal["snapshot", "checkpoint"],
        record: type[SnapshotTaken] | type[CheckpointTaken],
        op: CompactSession | Checkpoint,
    ) -> None:
        """A snapshot or a checkpoint of the session's state through an ordinal."""
        pending = self._existing(op.session_id)
        through = op.through_ordinal
        problem = stored_state_problem(what, pending.row, pending.last_ordinal, through)
        lost = self.view.missing(self.txn, pending.incarnation)
        if problem is None and what == "checkpoint" and lost is not None and through < lost.last:
            # (A rebuild, verify's, drops it: the session then starts after the loss.)
            problem = (
                f"{lost.describe()}: a checkpoint through {through} could never be used "
                f"(the events after it are gone); checkpoint through {lost.last} or later"
            )
        if problem is not None:
            raise InvalidArgument(problem)
        position = self.emit(record(pending.incarnation, through, self.now, op.data))
        request.result = SnapshotRef(pending.incarnation, through, position)

    def _turn_event(self, request: Request, op: AppendTurnEvent) -> None:
        pending = self._existing(op.session_id)
        row = pending.row
        planned = self.generations.get(pending.incarnation, row.owner_generation)
        check_lease(op.session_id, op.incarnation, op.generation, row, planned)
        if pending.state is not SessionState.OPEN:
            raise SessionNotWritable(
                f"session {op.session_id!r} is {pending.state.value}: the turn cannot be recorded"
            )
        check_ordinals_left(op.session_id, pending.last_ordinal, 1)
        ordinal = pending.last_ordinal + 1
        position = self.next_position
        record = EventAppended(
            pending.incarnation, ordinal, self.now, op.type, op.data, op.request_id, position
        )
        # Never part of a run: every projection (commit, catch-up, sidecar) sees its type.
        self.others.append((len(self.records), record))
        self.records.append(record)
        self.loose_events.append((len(self.records) - 1, pending.incarnation, ordinal))
        self.next_position += 1
        self.set_field(pending, "last_ordinal", ordinal)
        self.set_field(pending, "turn", open_turn_after(pending.turn, op.type, op.request_id))
        request.result = Appended(pending.incarnation, ordinal, ordinal, position, time_ms=self.now)

    def _acquire(self, request: Request, op: AcquireLease) -> None:
        pending = self._existing(op.session_id)
        if pending.state.terminal:
            raise SessionNotWritable(
                f"session {op.session_id!r} is {pending.state.value}: an ended session "
                "has no owner; create a new session"
            )
        generation = self._next_generation(pending)
        self.emit(
            OwnerAcquired(
                pending.incarnation,
                generation,
                op.pid,
                op.start_time,
                op.host,
                op.boot_id,
                self.now,
            )
        )
        session_id = op.session_id
        self.finishers.append((request, lambda: self.current_row(session_id)))

    def _release(self, request: Request, op: ReleaseLease) -> None:
        pending = self.pending(op.session_id)
        if (
            pending is not None
            and pending.incarnation == op.incarnation
            and pending.row.owner_generation == op.generation
        ):
            if pending.row.owner_pid:
                self.emit(OwnerReleased(pending.incarnation, op.generation, self.now))
            session_id = op.session_id
            self.finishers.append((request, lambda: self.current_row(session_id)))

    def _next_generation(self, pending: Pending) -> int:
        """One more than the last generation, counting leases planned in this batch."""
        key = pending.incarnation
        planned = self.generations.get(key, pending.row.owner_generation)
        previous = self.generations.get(key)

        def undo() -> None:
            if previous is None:
                self.generations.pop(key, None)
            else:
                self.generations[key] = previous

        self._undo.append(undo)
        self.generations[key] = planned + 1
        return planned + 1

    def _retention(self, request: Request, op: ApplyRetention) -> None:
        now = self.now if op.now_ms is None else op.now_ms
        # The policy recorded now, by whomever (SPEC 8); one changed since reads every row.
        changed = self.policy.refresh()
        policy = self.policy.policy
        trimmed: list[str] = []
        evicted: list[str] = []
        sealed = self.log.bases()[:-1]
        narrow = (
            type(op) is SealRetention
            and not changed
            and policy.session_retention_ms is None
            and policy.max_history_age_ms is None
        )
        mark = policy_mark(policy)
        rows = (
            candidate_rows(self.txn, self.view, self.log, self.summaries, sealed, mark)
            if narrow
            else list(self.view.rows(self.txn))
        )
        self.log.ops.point("retention.rows", len(rows))
        times = FrameTimes(self.txn, self.view, self.log, self.summaries)
        skipped = False
        for row in rows:
            if self.sessions.get(row.session_id, _ABSENT) is not _ABSENT:
                # Changed earlier in this batch (an expiry): left for the next pass, which
                # must then look at these segments again.
                skipped = True
                continue
            if row.session_state.terminal and policy.session_retention_ms is not None:
                since = (
                    row.created_at_ms
                    if policy.session_retention_from == "started"
                    else (row.ended_at_ms or row.created_at_ms)
                )
                if since + policy.session_retention_ms <= now:
                    self.emit(SessionEvicted(row.incarnation, self.now))
                    self.set_session(row.session_id, None)
                    evicted.append(row.session_id)
                    continue
            new_first = window_start(self.txn, self.view, row, policy, now, times)
            if new_first > row.first_ordinal:
                self.emit(HistoryTrimmed(row.incarnation, new_first, self.now))
                trimmed.append(row.session_id)
        if sealed and not skipped:
            self.view.retention.cover_through(self.txn, sealed[-1], mark)
        self.finishers.append((request, lambda: self._reclaim(trimmed, evicted)))

    def _verify_fix(self, request: Request, op: VerifyFix) -> None:
        # Under the segment-files lock (kept until the transaction is over, as a swap's):
        # another process's retention pass deletes the files it made dead after its
        # commit, outside the writer lock, and would delete them between the fix's
        # listing of the segments and its reads (SPEC 9).
        with self.log.files_lock(keep=True):
            report, rebuilt, missing = fix_store(
                self.log, self.view, self.txn, (self.store_id, self.boot_id), self.hole, op.progress
            )
        if self.cuts:  # (reported once)
            report = msgspec.structs.replace(report, problems=self.cuts + report.problems)
            self.cuts.clear()  # (the engine's list)
        if rebuilt:
            self.summaries.clear()
            self.rebuilt = True
        for lost in missing:
            # The loss accepted: the log now says where the session's history begins (a
            # rebuild took the events for trimmed already; later ones find them accounted).
            self.emit(HistoryTrimmed(lost.incarnation, lost.last + 1, self.now))
        request.result = report

    # -- after projection ------------------------------------------------------------------

    def digest(self) -> FrameDigest:
        """What the planned frame holds, for the sidecar (the same as a rescan finds)."""
        return FrameDigest(
            [msgspec.structs.replace(run) for run in self.event_runs],
            [(index, encode_other(record)) for index, record in self.others],
            list(self.loose_events),
        )

    def _feed_row(self, position: int) -> SessionRow:
        entry = self.view.feed_entry(self.txn, position)
        assert entry is not None, "a planned lifecycle record has no feed entry"
        return entry.row

    def current_row(self, session_id: str) -> SessionRow:
        row = self.view.row(self.txn, session_id)
        if row is None:
            raise SessionNotFound(f"no session {session_id!r} in this store")
        return row

    def _reclaim(self, trimmed: list[str], evicted: list[str]) -> RetentionReport:
        held: list[int] = []
        dead = dead_segments(self.txn, self.view, self.log, self.summaries, held)
        if held:
            # Kept only by eviction records of sessions created in older segments: compacting
            # those drops the creation records, then those may go (SPEC 8, "Eviction records").
            bases = self.log.bases()
            self.unpin.update(bases[bisect_right(bases, position) - 1] for position in held)
        forget_segments(self.txn, self.view, self.log, dead)
        for summary in dead:
            self.summaries.pop(summary.base_position, None)
        self.doomed.extend(summary.base_position for summary in dead)
        self.evicted.extend(evicted)
        return RetentionReport(trimmed, evicted, [segment_name(s.base_position) for s in dead], 0)

    def finish(self) -> None:
        """Fill in results that need the projected rows (after the projection flushed)."""
        for request, result in self.finishers:
            if request.error is None:
                request.result = result()
