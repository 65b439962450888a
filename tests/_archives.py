"""A one-session archive written field by field: the seam that stamps a session's times
and its events' commit times as another host's clock would (tests of clock steps)."""

from __future__ import annotations

from pathlib import Path

from journal.archive import ARCHIVE_FORMAT, ArchiveEvent, ArchiveHeader, ArchiveSession
from journal.archive_writer import ArchiveWriter


def write_one_session(
    path: Path,
    session_id: str,
    events: list[ArchiveEvent],
    *,
    exported_at_ms: int,
    created_at_ms: int,
    state: str = "open",
    ended_at_ms: int | None = None,
    ttl_ms: int | None = None,
    max_history_age_ms: int | None = None,
) -> None:
    """Write an archive of one session holding `events` (ordinals from 1) to `path`."""
    with path.open("wb") as out:
        writer = ArchiveWriter(out)
        writer.header(ArchiveHeader(ARCHIVE_FORMAT, 1, "0", exported_at_ms, "00" * 16, 1))
        writer.session(
            ArchiveSession(
                session_id=session_id,
                mode="",
                context_id=None,
                tags={},
                extensions={},
                state=state,
                created_at_ms=created_at_ms,
                suspended_at_ms=None,
                ended_at_ms=ended_at_ms,
                first_ordinal=1,
                last_ordinal=len(events),
                ttl_ms=ttl_ms,
                max_suspend_ms=0,
                max_history_bytes=None,
                max_history_age_ms=max_history_age_ms,
                turn_request_id=None,
            ),
            None,
        )
        writer.events(events)
        writer.finish()
