"""What an archive holds (`read_archive_contents`): read and checked as an import's
check pass reads it (`ArchiveReader`, the same limits and errors), without a store and
writing nothing."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import IO

from .archive import ArchiveLimits, ArchiveReader, SessionSection
from .arguments import check_callback
from .models import ArchiveContents, ArchivedSession, SessionState

__all__ = ["read_archive_contents"]


def read_archive_contents(
    src: str | os.PathLike[str] | IO[bytes],
    limits: ArchiveLimits | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ArchiveContents:
    """What the archive at `src` (a path or a binary file object, read once from where
    it stands) holds: its header and, per session, what an import would create.

    The whole archive is read and checked in one streaming pass, exactly as
    `Journal.import_sessions` checks it before it writes anything (format, version,
    shapes, order, ordinals, counts, checksum, end marker): a damaged, truncated or
    hostile archive raises the same `ArchiveInvalid` (with its `reason` and `offset`),
    and `limits` bounds what is read as it does there. Memory grows with the number
    of sessions (at most `limits.max_sessions`), not with their size. A path that
    cannot be opened, a text stream or an object without `read` are `InvalidArgument`.
    `progress(done, total)` counts archive bytes read (`total` 0 while a stream's size
    is unknown).
    """
    # (Imported here: `import journal` does not load the export and import machinery.)
    from .transfer import archive_limits, open_source, source_position, source_size

    limits = archive_limits(limits)
    check_callback("progress", progress)
    with contextlib.ExitStack() as stack:
        source = open_source(src, stack)
        total = source_size(source, source_position(source) or 0)
        reader = ArchiveReader(source, limits)
        sessions: list[ArchivedSession] = []
        # A session's records end where the next one's begin: each is summed up when
        # the next is read (the last when the reader has checked the footer).
        previous: tuple[SessionSection, int] | None = None
        for section in reader.sections():
            if previous is not None:
                sessions.append(_summary(*previous, end=section.offset))
            events = 0
            for batch in section.batches:
                events += len(batch)
                if progress is not None:
                    progress(reader.archive_bytes, total)
            previous = (section, events)
        if previous is not None:
            sessions.append(_summary(*previous, end=reader.sessions_end))
    if progress is not None:
        progress(reader.archive_bytes, total or reader.archive_bytes)
    header = reader.header
    return ArchiveContents(
        version=header.version,
        library_version=header.library_version,
        source_store_id=header.store_id,
        exported_at_ms=header.exported_at_ms,
        sessions=sessions,
        events=reader.events,
        archive_bytes=reader.archive_bytes,
        content_bytes=reader.content_bytes,
        sha256=reader.sha256,
    )


def _summary(section: SessionSection, events: int, *, end: int) -> ArchivedSession:
    """The section's session of `events` events, its records ending at content offset
    `end`."""
    meta = section.session
    return ArchivedSession(
        session_id=meta.session_id,
        state=SessionState(meta.state),
        mode=meta.mode,
        created_at_ms=meta.created_at_ms,
        ended_at_ms=meta.ended_at_ms,
        first_ordinal=meta.first_ordinal,
        last_ordinal=meta.last_ordinal,
        events=events,
        snapshot_ordinal=None if section.snapshot is None else section.snapshot.through_ordinal,
        checkpoint_ordinal=(
            None if section.checkpoint is None else section.checkpoint.through_ordinal
        ),
        open_turn=meta.turn_request_id,
        content_bytes=end - section.offset,
    )
