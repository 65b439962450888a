"""What values an archive's records may hold (SPEC.md, "Archives", field limits): the
store's own limits, so that whatever the store accepts an export carries and an import
accepts. Each check raises `ArchiveInvalid` (`invalid_field`, or `too_large` for a size)
at the record's content offset."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .arguments import (
    MAX_BATCH_BYTES,
    MAX_EVENT_BYTES,
    MAX_METADATA_BYTES,
    MAX_SETTING,
    metadata_bytes,
    mode_ok,
    name_ok,
)
from .errors import ArchiveInvalid
from .models import SessionState

if TYPE_CHECKING:
    from .archive import ArchiveCheckpoint, ArchiveEvent, ArchiveSession, ArchiveSnapshot

__all__ = ["check_checkpoint", "check_event", "check_session", "check_snapshot"]


def _in_range(value: int | None, low: int = 0) -> bool:
    return value is None or low <= value < MAX_SETTING


def _session_problem(session: ArchiveSession) -> str:
    state = {s.value: s for s in SessionState}.get(session.state)
    if not name_ok(session.session_id):
        return "not a valid session id (1 to 256 bytes of UTF-8 without control characters)"
    if state is None:
        return f"unknown state {session.state!r}"
    if not mode_ok(session.mode):
        return "not a valid mode (at most 256 bytes of UTF-8 without control characters)"
    if session.first_ordinal < 1 or session.last_ordinal < session.first_ordinal - 1:
        return f"retained range [{session.first_ordinal}, {session.last_ordinal}] is not a range"
    if not (_in_range(session.last_ordinal) and _in_range(session.created_at_ms)):
        return "an ordinal or time out of range"
    times = (session.suspended_at_ms, session.ended_at_ms)
    if not all(_in_range(t) for t in times):
        return "a lifecycle time out of range"
    if (state is SessionState.SUSPENDED) != (session.suspended_at_ms is not None):
        return "suspended_at_ms must be set exactly when the session is suspended"
    if state.terminal != (session.ended_at_ms is not None):
        return "ended_at_ms must be set exactly when the session has ended"
    settings = (session.ttl_ms, session.max_history_bytes, session.max_history_age_ms)
    if not all(_in_range(v, 1) for v in settings) or not _in_range(session.max_suspend_ms):
        return "a retention or deadline setting out of range"
    return ""


def check_session(session: ArchiveSession, at: int) -> int:
    """Check a session's fields; what its metadata and unsettled turn's request id take
    (UTF-8 and bytes), which an import's commit holds (`max_metadata_bytes`)."""
    problem = _session_problem(session)
    if problem:
        raise ArchiveInvalid(
            "invalid_field", f"session {session.session_id[:80]!r}: {problem}", offset=at
        )
    size = metadata_bytes(session.mode, session.context_id, session.tags, session.extensions)
    if size > MAX_METADATA_BYTES:
        raise ArchiveInvalid(
            "too_large",
            f"session {session.session_id[:80]!r}: its metadata is over {MAX_METADATA_BYTES} bytes",
            offset=at,
        )
    turn = session.turn_request_id
    return size + (0 if turn is None else len(turn.encode("utf-8", "surrogatepass")))


def check_snapshot(session: ArchiveSession, snapshot: ArchiveSnapshot, at: int) -> None:
    if len(snapshot.data) > MAX_BATCH_BYTES:
        raise ArchiveInvalid("too_large", "a snapshot over 64 MiB", offset=at)
    if not 1 <= snapshot.through_ordinal < session.first_ordinal:
        raise ArchiveInvalid(
            "invalid_field",
            f"session {session.session_id!r}: a snapshot through ordinal "
            f"{snapshot.through_ordinal} must lie below the retained range "
            f"(first ordinal {session.first_ordinal})",
            offset=at,
        )


def check_checkpoint(
    session: ArchiveSession, checkpoint: ArchiveCheckpoint, version: int, at: int
) -> None:
    """A checkpoint in an archive of format `version` (2 on): as the store keeps one
    (SPEC 8), at most 64 MiB, through an ordinal from 1 within `[first_ordinal - 1,
    last_ordinal]` (so at or above the snapshot's)."""
    if version < 2:
        raise ArchiveInvalid(
            "corrupt",
            f"session {session.session_id[:80]!r}: a checkpoint record in a version "
            f"{version} archive (checkpoints came with version 2)",
            offset=at,
        )
    if len(checkpoint.data) > MAX_BATCH_BYTES:
        raise ArchiveInvalid("too_large", "a checkpoint over 64 MiB", offset=at)
    through = checkpoint.through_ordinal
    if through < 1 or not session.first_ordinal - 1 <= through <= session.last_ordinal:
        raise ArchiveInvalid(
            "invalid_field",
            f"session {session.session_id[:80]!r}: a checkpoint through ordinal {through} "
            f"must lie from 1 and within [first ordinal - 1, last ordinal] = "
            f"[{session.first_ordinal - 1}, {session.last_ordinal}]",
            offset=at,
        )


def check_event(event: ArchiveEvent, at: int) -> None:
    if len(event.data) > MAX_EVENT_BYTES:
        raise ArchiveInvalid(
            "too_large", f"event {event.ordinal} is over {MAX_EVENT_BYTES} bytes", offset=at
        )
    if not name_ok(event.type):
        raise ArchiveInvalid(
            "invalid_field", f"event {event.ordinal} has an invalid type", offset=at
        )
    if not 0 <= event.timestamp_ms < MAX_SETTING:
        raise ArchiveInvalid(
            "invalid_field", f"event {event.ordinal} has a timestamp out of range", offset=at
        )
