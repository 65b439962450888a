"""Planning an import's operations (SPEC 12) inside the write transaction, one function per
operation, called by the planner's dispatch: staging sessions and their events under ids
no caller can name (`SessionStaged`), making staged sessions visible under their
targets' ids, and rolling back the staged sessions of an abandoned import. The planner's
state (its records, runs and pending sessions) is changed only through its own methods,
so a failed operation leaves no trace (`Planner.plan`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..archive import ArchiveCheckpoint, ArchiveEvent, ArchiveSession, ArchiveSnapshot
from ..engine import AbortImport, CommitImport, StageEvents, StageSessions
from ..errors import InvalidArgument, SessionExists, SessionNotFound
from ..models import SessionState
from ..records import (
    TURN_EVENT_TYPES,
    CheckpointTaken,
    EventAppended,
    HistoryTrimmed,
    SessionEvicted,
    SessionImported,
    SnapshotTaken,
    StateChanged,
)
from ..sessions import SessionRow
from .leases import PROCESS_BOOT, identity
from .sidecar import EventRun, add_run

if TYPE_CHECKING:
    from .planner import Pending, Planner, Request

__all__ = ["abort_import", "commit_import", "stage_events", "stage_sessions"]


def stage_sessions(planner: Planner, request: Request, op: StageSessions) -> None:
    ids = []
    for item in op.sessions:
        _one_step(item.steps)
        staging_id = _stage_row(
            planner,
            item.session,
            item.snapshot,
            item.checkpoint,
            op.source_store,
            op.exported_at_ms,
        )
        pending = planner.pending(staging_id)
        assert pending is not None
        _stage_into(planner, pending, item.events)
        ids.append(staging_id)
    planner.finishers.append((request, lambda: [planner.current_row(i) for i in ids]))


def _stage_row(
    planner: Planner,
    meta: ArchiveSession,
    snapshot: ArchiveSnapshot | None,
    checkpoint: ArchiveCheckpoint | None,
    source_store: str,
    exported_at_ms: int,
) -> str:
    """Stage one session's row (its snapshot, trimmed start and checkpoint too); its
    staging id."""
    position = planner.next_position
    staging_id = f"\x00import\x00{position}"
    importer = identity()
    record = meta.staged(staging_id, source_store, exported_at_ms, importer, PROCESS_BOOT)
    planner.emit(record)
    row = SessionRow.staged_from(record, position)
    through = 0
    if snapshot is not None:
        through = snapshot.through_ordinal
        planner.emit(SnapshotTaken(position, through, planner.now, snapshot.data))
    if meta.first_ordinal > through + 1:
        planner.emit(HistoryTrimmed(position, meta.first_ordinal, planner.now))
    if checkpoint is not None:
        # (Before the events it stands for: the row, invisible until the commit, shows
        # it then or is evicted with it by `AbortImport`.)
        planner.emit(
            CheckpointTaken(position, checkpoint.through_ordinal, planner.now, checkpoint.data)
        )
    row.last_ordinal = meta.first_ordinal - 1
    planner.plan_session(staging_id, row)
    return staging_id


def _staged(planner: Planner, incarnation: int) -> tuple[str, Pending]:
    staging_id = planner.view.session_id_of(planner.txn, incarnation)
    pending = None if staging_id is None else planner.pending(staging_id)
    if staging_id is None or pending is None or not pending.row.staged:
        raise SessionNotFound(f"no import in progress at incarnation {incarnation}")
    return staging_id, pending


def stage_events(planner: Planner, request: Request, op: StageEvents) -> None:
    _one_step(op.steps)
    _, pending = _staged(planner, op.incarnation)
    request.result = _stage_into(planner, pending, op.events)


def _one_step(steps: tuple[int, ...]) -> None:
    """An operation's events are one frame, which a history window trims whole: one
    staging step (the engine does not `joins_staging_steps`)."""
    if steps:
        raise InvalidArgument("the local engine stages one staging step an operation")


def _stage_into(planner: Planner, pending: Pending, events: list[ArchiveEvent]) -> int:
    """Append archived events to a staged row; its new last ordinal."""
    incarnation = pending.incarnation
    expected = pending.last_ordinal + 1
    position = planner.next_position
    records = planner.records
    run: EventRun | None = None  # the run being built (runs break at turn events)
    for event in events:
        if event.ordinal != expected:
            raise InvalidArgument(
                f"imported event ordinal {event.ordinal} where {expected} was due"
            )
        record = EventAppended(
            incarnation,
            expected,
            event.timestamp_ms,
            event.type,
            event.data,
            event.request_id,
            position,
        )
        if event.type in TURN_EVENT_TYPES:
            # Never part of a run (as in the planner's `_turn_event`).
            if run is not None:
                add_run(planner.event_runs, run)
                run = None
            planner.others.append((len(records), record))
            planner.loose_events.append((len(records), incarnation, expected))
        elif run is None:
            run = EventRun(
                len(records), incarnation, expected, 1, len(event.data), event.timestamp_ms
            )
        else:
            run.count += 1
            run.data_bytes += len(event.data)
        records.append(record)
        position += 1
        expected += 1
    if run is not None:
        add_run(planner.event_runs, run)
    planner.next_position = position
    planner.set_field(pending, "last_ordinal", expected - 1)
    return expected - 1


def commit_import(planner: Planner, request: Request, op: CommitImport) -> None:
    chosen: set[str] = set()
    staged: list[tuple[str, Pending]] = []
    taken: list[str] = []
    for target in op.targets:
        if target.session_id in chosen or planner.pending(target.session_id) is not None:
            taken.append(target.session_id)
        else:
            staged.append(_staged(planner, target.incarnation))
        chosen.add(target.session_id)
    if taken:
        # (Every id taken, and the ways that take an archive of many sessions: until
        # 2026-12-05 the first only, and `--as`, which such an archive refuses.)
        raise SessionExists.imported_over(taken, meanwhile=True)
    for target, (staging_id, pending) in zip(op.targets, staged, strict=True):
        planner.emit(SessionImported(target.incarnation, target.session_id, planner.now))
        state = SessionState.from_wire(target.state)
        if state is not SessionState.OPEN:
            planner.emit(StateChanged(target.incarnation, target.state, target.state_at_ms))
        # The same (unchanged) row: the projection may adopt it, and renames it.
        planner.set_session(staging_id, None)
        visible = planner.plan_session(target.session_id, pending.row)
        visible.last_ordinal = pending.last_ordinal
        visible.state = state
    ids = [target.session_id for target in op.targets]
    planner.finishers.append((request, lambda: [planner.current_row(i) for i in ids]))


def abort_import(planner: Planner, request: Request, op: AbortImport) -> None:
    count = 0
    for incarnation in op.incarnations:
        staging_id = planner.view.session_id_of(planner.txn, incarnation)
        pending = None if staging_id is None else planner.pending(staging_id)
        if staging_id is None or pending is None or not pending.row.staged:
            continue
        if pending.incarnation != incarnation:
            continue
        planner.emit(SessionEvicted(incarnation, planner.now))
        planner.set_session(staging_id, None)
        count += 1
    request.result = count
