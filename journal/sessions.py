"""Engine-neutral session semantics: the registry row every engine keeps, lifecycle rules
(allowed transitions, deadlines), the lifecycle event a change reports, and the public
metadata a row turns into.

Every engine stores a `SessionRow` per session and a `FeedEntry` per lifecycle change;
what those mean is decided here, once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal

import msgspec

from .errors import SessionNotWritable
from .models import ImportedFrom, LifecycleEventType, OwnerInfo, SessionMetadata, SessionState
from .records import SessionCreated, SessionStaged

__all__ = [
    "DEFAULT_MAX_SUSPEND_MS",
    "TRANSITIONS",
    "FeedEntry",
    "SessionRow",
    "TransitionKind",
    "check_ordinals_left",
    "ends_as_is",
    "lifecycle_event_of",
    "metadata",
    "metadata_page",
    "recorded_owner",
    "stored_state_problem",
]

DEFAULT_MAX_SUSPEND_MS: Final = 7 * 24 * 3600 * 1000
_ORDINAL_END: Final = 1 << 62  # ordinals are below it (arguments.MAX_SETTING)

TransitionKind = Literal["suspend", "resume", "resolve", "cancel"]

# What each transition is allowed from, and the state it leads to.
TRANSITIONS: Final[dict[TransitionKind, tuple[frozenset[SessionState], SessionState]]] = {
    "suspend": (frozenset({SessionState.OPEN}), SessionState.SUSPENDED),
    "resume": (frozenset({SessionState.SUSPENDED}), SessionState.OPEN),
    "resolve": (frozenset({SessionState.OPEN, SessionState.SUSPENDED}), SessionState.RESOLVED),
    "cancel": (frozenset({SessionState.OPEN, SessionState.SUSPENDED}), SessionState.CANCELLED),
}


def ends_as_is(kind: TransitionKind, state: SessionState) -> bool:
    """Whether `kind` on a session in `state` returns it unchanged, recording nothing:
    a cancel of any terminal session, and a resolve of a resolved one (a caller retrying
    its own resolve, whose first answer was lost, has what it asked for). Every other
    transition from a state it is not allowed from raises `IllegalTransition`."""
    if kind == "cancel":
        return state.terminal
    return kind == "resolve" and state is SessionState.RESOLVED


_STATE_EVENTS: Final = {
    SessionState.OPEN: LifecycleEventType.RESUMED,
    SessionState.SUSPENDED: LifecycleEventType.SUSPENDED,
    SessionState.RESOLVED: LifecycleEventType.RESOLVED,
    SessionState.EXPIRED: LifecycleEventType.EXPIRED,
    SessionState.CANCELLED: LifecycleEventType.CANCELLED,
}


def lifecycle_event_of(state: SessionState) -> LifecycleEventType:
    """The lifecycle event a transition into `state` reports."""
    return _STATE_EVENTS[state]


class SessionRow(msgspec.Struct, array_like=True):
    """A session's registry entry (mutable while an engine projects records into it).

    `incarnation` is the store position of the session's creation: a session re-created
    under the same id is another incarnation, and nothing of the old one applies to it.
    """

    session_id: str
    incarnation: int
    state: int
    mode: str
    context_id: str | None
    tags: dict[str, str]
    extensions: dict[str, bytes]
    created_at_ms: int
    ended_at_ms: int | None
    first_ordinal: int
    last_ordinal: int
    ttl_ms: int | None
    max_suspend_ms: int
    suspended_at_ms: int | None
    lifecycle_position: int
    last_event_position: int = 0
    retained_bytes: int = 0
    snapshot_ordinal: int = 0
    snapshot_position: int = 0
    max_history_bytes: int | None = None
    max_history_age_ms: int | None = None
    appended_bytes: int = 0
    trim_position: int = 0
    snapshot_segment: int = 0
    snapshot_offset: int = 0
    # The owner lease: the last generation issued, and the holder's identity while a
    # lease is recorded (pid 0: none). A recorded holder may have died: see `metadata`.
    owner_generation: int = 0
    owner_pid: int = 0
    owner_start_time: int = 0
    owner_host: str = ""
    owner_boot_id: str = ""
    owner_since_ms: int = 0
    owner_position: int = 0
    # The last turn's request id while it is unsettled, and the position of the latest
    # turn event (pinned, so a rebuild after retention or compaction knows the state).
    turn_request_id: str | None = None
    turn_position: int = 0
    # Imports: a staged row is invisible until its `SessionImported` record (pinned at
    # `name_position`) names it; `imported_store` (hex, "" if never imported) and
    # `imported_exported_at_ms` say where the history came from.
    staged: bool = False
    name_position: int = 0
    imported_store: str = ""
    imported_exported_at_ms: int = 0
    # The latest checkpoint (a `CheckpointTaken`, pinned): what it covers and where its
    # record lies. Cleared once history below it leaves (it could never be used again).
    checkpoint_ordinal: int = 0
    checkpoint_position: int = 0
    checkpoint_segment: int = 0
    checkpoint_offset: int = 0
    # The JetStream engine's age window (SPEC 16): the commit time of the newest event
    # (0: not recorded, as in a row an older release wrote), and the first ordinal from
    # which no event is stamped earlier than the one before it (commit times follow the
    # wall clock, which may step back). The local engine keeps both 0 (it reads the
    # commit times of its events index in order).
    last_event_ms: int = 0
    stamped_in_order_from: int = 0

    @classmethod
    def created(cls, record: SessionCreated, incarnation: int) -> SessionRow:
        """The row of a session just created by `record` (at position `incarnation`)."""
        return cls(
            session_id=record.session_id,
            incarnation=incarnation,
            state=SessionState.OPEN.wire,
            mode=record.mode,
            context_id=record.context_id,
            tags=dict(record.tags),
            extensions=dict(record.extensions),
            created_at_ms=record.created_at_ms,
            ended_at_ms=None,
            first_ordinal=1,
            last_ordinal=0,
            ttl_ms=record.ttl_ms,
            max_suspend_ms=record.max_suspend_ms,
            suspended_at_ms=None,
            lifecycle_position=incarnation,
            max_history_bytes=record.max_history_bytes,
            max_history_age_ms=record.max_history_age_ms,
        )

    @classmethod
    def staged_from(cls, record: SessionStaged, incarnation: int) -> SessionRow:
        """The invisible row of an imported session being written; the importing
        process is recorded as its owner until the import commits."""
        created = SessionCreated(
            record.staging_id,
            record.created_at_ms,
            record.mode,
            record.context_id,
            record.tags,
            record.extensions,
            record.ttl_ms,
            record.max_suspend_ms,
            record.max_history_bytes,
            record.max_history_age_ms,
        )
        return msgspec.structs.replace(
            cls.created(created, incarnation),
            owner_pid=record.pid,
            owner_start_time=record.start_time,
            owner_host=record.host,
            owner_boot_id=record.boot_id,
            turn_request_id=record.turn_request_id,
            staged=True,
            imported_store=record.source_store,
            imported_exported_at_ms=record.exported_at_ms,
        )

    @property
    def session_state(self) -> SessionState:
        return SessionState.from_wire(self.state)

    def deadline(self) -> int | None:
        """When the session must expire (its TTL or its suspension cap), or None."""
        state = self.session_state
        if state.terminal or self.staged:
            return None
        due: list[int] = []
        if self.ttl_ms is not None:
            due.append(self.created_at_ms + self.ttl_ms)
        if state is SessionState.SUSPENDED and self.suspended_at_ms is not None:
            due.append(self.suspended_at_ms + (self.max_suspend_ms or DEFAULT_MAX_SUSPEND_MS))
        return min(due) if due else None


class FeedEntry(msgspec.Struct, array_like=True):
    """One lifecycle-feed entry: what happened and the session's row right after."""

    event_type: str
    at_ms: int
    row: SessionRow


def recorded_owner(row: SessionRow) -> OwnerInfo | None:
    """The owner the row records (it may have died since: engines tell)."""
    if not row.owner_pid:
        return None
    return OwnerInfo(
        row.owner_pid,
        row.owner_start_time,
        row.owner_host,
        row.owner_generation,
        row.owner_since_ms,
    )


def metadata_page(
    rows: list[SessionRow], owners_alive: Callable[[list[SessionRow]], list[bool | None]]
) -> list[SessionMetadata]:
    """The public metadata of rows listed together, each with its owner while alive
    (uncertain is alive): the owned rows' owners checked in one call of the engine's
    `owners_alive` (the local engine reads each owner pid's start time once, and probes a
    lease lock found held within the last second only once per owner: a page of 1,000
    sessions of one owner cost 33 ms checked row by row)."""
    owned = [row for row in rows if row.owner_pid]
    dead = {
        id(row)
        for row, alive in zip(owned, owners_alive(owned) if owned else [], strict=True)
        if alive is False
    }
    return [metadata(row, None if id(row) in dead else recorded_owner(row)) for row in rows]


def metadata(row: SessionRow, owner: OwnerInfo | None = None) -> SessionMetadata:
    """The public metadata of a registry row (`owner`: the live owner, if any)."""
    return SessionMetadata(
        session_id=row.session_id,
        state=row.session_state,
        mode=row.mode,
        context_id=row.context_id,
        extension_keys=tuple(sorted(row.extensions)),
        tags=dict(row.tags),
        created_at_ms=row.created_at_ms,
        started_at_ms=row.created_at_ms,
        ended_at_ms=row.ended_at_ms,
        first_ordinal=row.first_ordinal,
        last_ordinal=row.last_ordinal,
        owner=owner,
        incarnation=row.incarnation,
        ttl_ms=row.ttl_ms,
        max_suspend_ms=row.max_suspend_ms,
        max_history_bytes=row.max_history_bytes,
        max_history_age_ms=row.max_history_age_ms,
        suspended_at_ms=row.suspended_at_ms,
        expires_at_ms=row.deadline(),
        imported_from=(
            ImportedFrom(row.imported_store, row.imported_exported_at_ms)
            if row.imported_store
            else None
        ),
        open_turn=row.turn_request_id,
    )


def stored_state_problem(
    kind: Literal["snapshot", "checkpoint"], row: SessionRow, last_ordinal: int, through: int
) -> str | None:
    """Why a snapshot or checkpoint of `row`'s session through ordinal `through` is
    refused (`InvalidArgument`), or None; `last_ordinal` is the session's last ordinal as
    the engine sees it now. The same rules on every engine."""
    current = row.snapshot_ordinal if kind == "snapshot" else row.checkpoint_ordinal
    if through > last_ordinal:
        return (
            f"session {row.session_id!r} ends at ordinal {last_ordinal}; a {kind} cannot "
            f"stand for events up to {through}"
        )
    if through < current:
        return (
            f"session {row.session_id!r} already has a {kind} through ordinal {current}; a "
            "new one must reach at least that far"
        )
    if kind == "checkpoint" and through < row.first_ordinal - 1:
        return (
            f"session {row.session_id!r} retains events from ordinal {row.first_ordinal} on; "
            f"a checkpoint through {through} could never be used (the events after it are "
            "gone)"
        )
    return None


def check_ordinals_left(session_id: str, last_ordinal: int, count: int) -> None:
    """`SessionNotWritable` unless `count` more events fit below ordinal 2**62 (only an
    imported session can be that far: an archive may leave one at 2**62 - 1)."""
    if last_ordinal + count >= _ORDINAL_END:
        raise SessionNotWritable(
            f"session {session_id!r} ends at ordinal {last_ordinal}: {count} more would "
            "reach 2**62, past the largest ordinal; create a new session"
        )
