"""Export and import of sessions as portable archives (`archive`), over any engine.

Export reads each session through the engine's bounded pages up to the head it had when
its export began, and streams the archive to a temporary file renamed into place. Import
checks the whole archive first (one streaming pass that writes nothing), then stages
every session through the engine and commits them in one operation; a failure stages
nothing visible and rolls the staged sessions back.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any, Final, TypeVar

import msgspec

from .archive import (
    ARCHIVE_FORMAT,
    ARCHIVE_VERSION,
    ArchiveCheckpoint,
    ArchiveEvent,
    ArchiveHeader,
    ArchiveLimits,
    ArchiveReader,
    ArchiveSession,
    ArchiveSnapshot,
    SessionSection,
)
from .archive_writer import ArchiveWriter, event_batches, event_bytes
from .arguments import DEFAULT_PAGE_BYTES, check_name, metadata_bytes
from .engine import (
    AbortImport,
    CommitImport,
    Engine,
    Expire,
    ImportTarget,
    StagedSession,
    StageEvents,
    StageSessions,
    StoredSnapshot,
)
from .errors import (
    ArchiveInvalid,
    ExportIncomplete,
    InvalidArgument,
    JournalCorrupt,
    JournalError,
    ReadOnlyStore,
    SessionExists,
    SessionNotFound,
    StoreUnavailable,
)
from .export_files import user_path, write_file
from .import_windows import StagingWindows
from .models import (
    Event,
    ExportReport,
    ImportedSession,
    ImportReport,
    ReadContext,
    SessionState,
)
from .sessions import SessionRow

_log = logging.getLogger("journal")

__all__ = [
    "IMPORT_COMMITTED",
    "IMPORT_UNKNOWN",
    "archive_limits",
    "export_sessions",
    "import_sessions",
    "open_source",
    "source_position",
    "source_size",
]

T = TypeVar("T")

# The note an interrupt raised out of `import_sessions` carries when it came after the
# commit: the import is done (the caller's retry would meet `SessionExists`).
IMPORT_COMMITTED: Final = (
    "the import was committed before this interrupt came: its sessions are in the store"
)
# The note when it came as the import committed and the rollback failed too.
IMPORT_UNKNOWN: Final = (
    "this interrupt came as the import committed and its rollback failed: whether its "
    "sessions were imported is not known (list them to see)"
)

Progress = Callable[[int, int], None]
Destination = str | os.PathLike[str] | IO[bytes]

# Events handed to the engine per staging operation (one commit each); sessions whose
# events fit go together, at most `_STAGE_SESSIONS` at a time.
_STAGE_BYTES = 4 << 20
_STAGE_EVENTS = 10_000
_STAGE_SESSIONS = 1_000


def _no_cursor(event: Event) -> str:
    return ""  # export never asks an event for its cursor


# -- export ----------------------------------------------------------------------------


def export_sessions(
    engine: Engine,
    session_ids: Iterable[str] | None,
    dest: Destination,
    progress: Progress | None,
) -> ExportReport:
    if isinstance(dest, (str, os.PathLike)):
        given = user_path("dest", dest)
        rows = _rows_to_export(engine, session_ids)
        report = write_file(given, lambda out: _write_archive(engine, rows, out, progress))
        return msgspec.structs.replace(report, path=given)
    if not callable(getattr(dest, "write", None)) or isinstance(dest, io.TextIOBase):
        raise InvalidArgument("dest must be a path or a binary file object opened for writing")
    _check_opened_for("dest", dest, "writable", "writing", "wb")
    rows = _rows_to_export(engine, session_ids)
    return _write_archive(engine, rows, dest, progress)


def _rows_to_export(engine: Engine, session_ids: Iterable[str] | None) -> list[SessionRow]:
    if session_ids is None:
        _, rows = engine.registry()
        return sorted(rows, key=lambda row: row.session_id)
    if isinstance(session_ids, (str, bytes)) or not isinstance(session_ids, Iterable):
        raise InvalidArgument("session_ids must be a list of ids (or None for every session)")
    ids = [check_name("session_id", session_id) for session_id in session_ids]
    twice = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if twice:
        raise InvalidArgument(f"sessions named twice: {', '.join(map(repr, twice[:5]))}")
    result: list[SessionRow] = []
    for session_id in ids:
        row = engine.session(session_id)
        if row is None:
            raise SessionNotFound(
                f"no session {session_id!r} in this store: nothing was exported "
                "(`journal sessions list` shows the ids)"
            )
        result.append(row)
    return result


def _write_archive(
    engine: Engine, rows: list[SessionRow], out: IO[bytes], progress: Progress | None
) -> ExportReport:
    from . import __version__

    writer = ArchiveWriter(out)
    # Version 1 (which older releases read) unless a session has a checkpoint to carry.
    with_checkpoints = any(row.checkpoint_position for row in rows)
    writer.header(
        ArchiveHeader(
            ARCHIVE_FORMAT,
            ARCHIVE_VERSION if with_checkpoints else 1,
            __version__,
            int(time.time() * 1000),
            engine.store_id.hex(),
            len(rows),
        )
    )
    total = sum(max(0, row.last_ordinal - row.first_ordinal + 1) for row in rows)
    done = 0
    with engine.readers() as readers:
        for listed in rows:
            # Each session's export begins here: its head now is where it ends.
            row = _current(engine, listed)
            snapshot = _snapshot(engine, row)
            checkpoint = _checkpoint(engine, row, with_checkpoints)
            writer.session(
                _archived_session(row),
                None
                if snapshot is None
                else ArchiveSnapshot(snapshot.through_ordinal, snapshot.data),
                checkpoint,
            )
            for batch in event_batches(_session_events(engine, row, readers)):
                writer.events(batch)
                done += len(batch)
                if progress is not None:
                    progress(done, total)
    events, sha256 = writer.finish()
    return ExportReport(writer.counts, events, writer.archive_bytes, writer.content_bytes, sha256)


def _current(engine: Engine, listed: SessionRow) -> SessionRow:
    row = engine.session(listed.session_id)
    if row is None or row.incarnation != listed.incarnation:
        raise ExportIncomplete(
            f"session {listed.session_id!r} was evicted while the export ran; export again"
        )
    return row


def _snapshot(engine: Engine, row: SessionRow) -> StoredSnapshot | None:
    if not row.snapshot_ordinal:
        return None
    try:
        return engine.snapshot(row)
    except JournalCorrupt:
        now = engine.session(row.session_id)
        if now is None or now.snapshot_position != row.snapshot_position:
            # Compacted away meanwhile by a newer snapshot: not damage.
            raise ExportIncomplete(
                f"session {row.session_id!r} was compacted while it was exported; export again"
            ) from None
        raise


def _checkpoint(
    engine: Engine, row: SessionRow, with_checkpoints: bool
) -> ArchiveCheckpoint | None:
    """The row's checkpoint for its archive (SPEC 12.2)."""
    if not row.checkpoint_position or not (
        row.first_ordinal - 1 <= row.checkpoint_ordinal <= row.last_ordinal
    ):
        return None  # (none, or one that could never be used: the store drops those)
    if not with_checkpoints:
        # The header, written before this session's turn, said version 1.
        raise ExportIncomplete(
            f"session {row.session_id!r} took its first checkpoint while the export ran; "
            "export again"
        )
    try:
        stored = engine.checkpoint(row)
    except (JournalCorrupt, StoreUnavailable):
        now = engine.session(row.session_id)
        if now is None or now.checkpoint_position != row.checkpoint_position:
            # Replaced meanwhile (and its record reclaimed): not damage.
            raise ExportIncomplete(
                f"session {row.session_id!r} took a new checkpoint while it was exported; "
                "export again"
            ) from None
        raise
    return None if stored is None else ArchiveCheckpoint(stored.through_ordinal, stored.data)


def _archived_session(row: SessionRow) -> ArchiveSession:
    state = row.session_state
    return ArchiveSession(
        session_id=row.session_id,
        mode=row.mode,
        context_id=row.context_id,
        tags=dict(row.tags),
        extensions=dict(row.extensions),
        state=state.value,
        created_at_ms=row.created_at_ms,
        suspended_at_ms=row.suspended_at_ms if state is SessionState.SUSPENDED else None,
        ended_at_ms=row.ended_at_ms if state.terminal else None,
        first_ordinal=row.first_ordinal,
        last_ordinal=max(row.last_ordinal, row.first_ordinal - 1),
        ttl_ms=row.ttl_ms,
        max_suspend_ms=row.max_suspend_ms,
        max_history_bytes=row.max_history_bytes,
        max_history_age_ms=row.max_history_age_ms,
        turn_request_id=row.turn_request_id,
    )


def _session_events(engine: Engine, row: SessionRow, readers: Any) -> Iterator[ArchiveEvent]:
    """The row's retained events, exactly up to its `last_ordinal`."""
    context = ReadContext(row.session_id, _no_cursor)
    after = row.first_ordinal - 1
    while after < row.last_ordinal:
        page = engine.read(
            row.session_id, row.incarnation, after, DEFAULT_PAGE_BYTES, context, readers
        )
        if page.row is None or page.row.incarnation != row.incarnation:
            raise ExportIncomplete(
                f"session {row.session_id!r} was evicted while it was exported; export again"
            )
        if not page.events:
            raise ExportIncomplete(
                f"session {row.session_id!r} lost events after ordinal {after} while it was "
                "exported (retention or compaction); export again"
            )
        for event in page.events:
            if event.ordinal > row.last_ordinal:
                return
            yield ArchiveEvent(
                event.ordinal, event.type, event.timestamp_ms, event.request_id, event.data
            )
            after = event.ordinal


# -- import ----------------------------------------------------------------------------


def import_sessions(
    engine: Engine,
    src: Destination,
    rename: Mapping[str, str] | None,
    progress: Progress | None,
    limits: ArchiveLimits | None,
) -> ImportReport:
    if engine.readonly:
        raise ReadOnlyStore("import_sessions needs a writable journal")
    limits = archive_limits(limits)
    renames = _check_rename(rename)
    with contextlib.ExitStack() as stack:
        source = open_source(src, stack)
        spool: IO[bytes] | None = None
        start = source_position(source)
        if start is None:  # (a pipe: the check pass copies it, the import reads the copy)
            start = 0
            spool = stack.enter_context(tempfile.TemporaryFile(prefix="journal-import-"))
        size = source_size(source, start)
        checked = _check_archive(source, limits, spool, _Halves(progress, size, 0))
        header, counts, data_bytes, sha256, archive_bytes = checked
        sources = [session_id for session_id, _ in counts]
        most = engine.max_import_sessions
        if most is not None and len(sources) > most:
            raise InvalidArgument(
                f"this store imports at most {most} sessions at once and the archive "
                f"holds {len(sources):,}: nothing was imported. Export the sessions in "
                f"parts of at most {most} (`journal export -s ID ...`, or export_sessions "
                "with session_ids) and import each part, or import the archive into a "
                "local store (SPEC 16.5)"
            )
        unknown = sorted(set(renames) - set(sources))
        if unknown:
            raise InvalidArgument(
                f"rename names sessions the archive does not hold: {unknown[:5]!r}"
            )
        targets = [renames.get(session_id, session_id) for session_id in sources]
        if len(set(targets)) != len(targets):
            raise InvalidArgument("rename gives two sessions the same id")
        taken = [target for target in targets if engine.session(target) is not None]
        if taken:
            raise SessionExists.imported_over(taken)
        if spool is not None:
            spool.seek(0)
            second: IO[bytes] = spool
        else:
            source.seek(start)
            second = source
        halves = _Halves(progress, archive_bytes, 1)
        windows = StagingWindows(engine.retention_policy().max_history_bytes, data_bytes)
        rows = _stage_and_commit(engine, second, limits, header, targets, sha256, halves, windows)
    imported = [
        ImportedSession(source_id, row.session_id, count)
        for (source_id, count), row in zip(counts, rows, strict=True)
    ]
    return ImportReport(
        imported,
        sum(count for _, count in counts),
        archive_bytes,
        header.store_id,
        header.exported_at_ms,
    )


def _check_rename(rename: Mapping[str, str] | None) -> dict[str, str]:
    if rename is None:
        return {}
    if not isinstance(rename, Mapping):
        raise InvalidArgument("rename must map archive session ids to new ids")
    result: dict[str, str] = {}
    for old, new in rename.items():
        old = check_name("the session id to rename", old)
        result[old] = check_name(f"the new id for {old!r}", new)
    return result


def archive_limits(limits: ArchiveLimits | None) -> ArchiveLimits:
    """A caller's `limits` (None: the defaults), or `InvalidArgument`."""
    if limits is None:
        return ArchiveLimits()
    if not isinstance(limits, ArchiveLimits):
        raise InvalidArgument("limits must be an ArchiveLimits or None")
    return limits


def open_source(src: Destination, stack: contextlib.ExitStack) -> IO[bytes]:
    """The archive to read at `src` (a path, opened on `stack`, or a binary file
    object), or `InvalidArgument`."""
    if isinstance(src, (str, os.PathLike)):
        path = user_path("src", src)
        try:
            return stack.enter_context(open(path, "rb"))
        except FileNotFoundError:
            raise InvalidArgument(f"no archive at {path!r}") from None
        except IsADirectoryError:
            raise InvalidArgument(f"{path!r} is a directory, not an archive") from None
        except OSError as e:  # permissions, a name too long, ...
            raise InvalidArgument(f"cannot read {path!r}: {e.strerror or e}") from None
    if not callable(getattr(src, "read", None)) or isinstance(src, io.TextIOBase):
        raise InvalidArgument("src must be a path or a binary file object opened for reading")
    _check_opened_for("src", src, "readable", "reading", "rb")
    return src


def _check_opened_for(what: str, stream: object, able: str, doing: str, mode: str) -> None:
    """`InvalidArgument` for a file object that says it is closed or not opened for
    `doing` (its `readable()`/`writable()`): not the bare `io.UnsupportedOperation` its
    first read or write would raise. An object without the method is taken as it is."""
    check = getattr(stream, able, None)
    if not callable(check):
        return
    try:
        usable = check()
    except ValueError:  # (closed: "I/O operation on closed file")
        raise InvalidArgument(f"{what} is a closed file object: pass an open one") from None
    if usable is False:
        raise InvalidArgument(
            f"{what} is a file object not opened for {doing}: open it with mode {mode!r}"
        )


def source_position(source: IO[bytes]) -> int | None:
    """Where a seekable source stands (an archive is read from there), None when it
    cannot seek (a pipe)."""
    try:
        return source.tell() if source.seekable() else None
    except (AttributeError, OSError, ValueError):
        return None


def source_size(source: IO[bytes], start: int) -> int:
    """The archive's size when the source is a regular file (0 when unknown)."""
    try:
        return max(0, os.fstat(source.fileno()).st_size - start)
    except (AttributeError, OSError, ValueError):
        return 0


class _Halves:
    """Import progress in archive bytes: the check pass is the first half of `2 * size`
    (`size` 0 while unknown, reading a stream), the write pass the second."""

    def __init__(self, progress: Progress | None, size: int, half: int) -> None:
        self._progress = progress
        self._size = size
        self._half = half

    def __call__(self, done: int) -> None:
        if self._progress is not None:
            self._progress(self._half * self._size + done, 2 * self._size)

    def finished(self) -> None:
        if self._progress is not None:
            self._progress(2 * self._size, 2 * self._size)


def _check_archive(
    source: IO[bytes], limits: ArchiveLimits, spool: IO[bytes] | None, progress: _Halves
) -> tuple[ArchiveHeader, list[tuple[str, int]], array[int], str, int]:
    """The first pass: read everything, check everything, write nothing; also the data
    bytes of each session's events (`StagingWindows`)."""
    reader = ArchiveReader(source, limits, copy=spool)
    data_bytes = array("q")  # (8 bytes a session)
    for section in reader.sections():
        data = 0
        for batch in section.batches:
            data += sum(len(event.data) for event in batch)
            progress(reader.archive_bytes)
        data_bytes.append(data)
    return reader.header, reader.counts, data_bytes, reader.sha256, reader.archive_bytes


def _stage_and_commit(
    engine: Engine,
    source: IO[bytes],
    limits: ArchiveLimits,
    header: ArchiveHeader,
    targets: list[str],
    sha256: str,
    progress: _Halves,
    windows: StagingWindows,
) -> list[SessionRow]:
    """The second pass: stage every session, then commit them all in one operation.

    A session whose events fit in one staging operation waits in a group that is staged
    in one operation (one commit for many small sessions); a larger one is staged on its
    own, its events in steps. Either way the plan keeps the archive's order."""
    reader = ArchiveReader(source, limits)
    if reader.header != header:
        raise ArchiveInvalid("changed", "the archive changed while it was imported")
    staged: list[int] = []
    plan: list[ImportTarget] = []
    group = _Group()
    # Whether a staging operation holds several steps (else each is one: SPEC 12.3).
    joins = engine.joins_staging_steps
    committing = False

    def stage_group() -> None:
        if group.sessions:
            rows = engine.submit(
                StageSessions(group.sessions, header.store_id, header.exported_at_ms)
            )
            staged.extend(row.incarnation for row in rows)
            for row, (index, meta) in zip(rows, group.targets, strict=True):
                plan.append(ImportTarget(row.incarnation, targets[index], *_state_of(meta)))
            group.clear()
            progress(reader.archive_bytes)

    def stage_events(
        row: SessionRow | None,
        index: int,
        section: SessionSection,
        events: list[ArchiveEvent],
        steps: list[int],
    ) -> SessionRow:
        """Stage `events` of session `index` (its row first when not staged yet)."""
        if row is None:
            stage_group()  # (first: the plan keeps the archive's order)
            alone = StagedSession(
                section.session, section.snapshot, [], section.checkpoint, targets[index]
            )
            (row,) = engine.submit(StageSessions([alone], header.store_id, header.exported_at_ms))
            staged.append(row.incarnation)
        engine.submit(StageEvents(row.incarnation, events, tuple(steps)))
        progress(reader.archive_bytes)
        return row

    try:
        for index, section in enumerate(reader.sections()):
            meta = section.session
            if index >= len(targets):
                raise ArchiveInvalid("changed", "the archive changed while it was imported")
            row: SessionRow | None = None  # staged on its own (too large for a group)
            pending: list[ArchiveEvent] = []
            steps: list[int] = []  # (where the pending events' steps after the first begin)
            size = step_size = 0  # (`step_size`: the data of the step being built)
            # The events after a checkpoint begin a batch of their own: history windows
            # trim whole batches, and one holding events on both sides of it would take
            # the events after it (and so the checkpoint) before the source's trims do.
            after = 0 if section.checkpoint is None else section.checkpoint.through_ordinal + 1
            windows.begin(index, meta)
            for batch in section.batches:
                for event in batch:
                    weight = event_bytes(event)  # (request ids too: up to 1 MiB each)
                    building = len(pending) - (steps[-1] if steps else 0)  # (its events)
                    full = bool(building) and (
                        step_size + weight > _STAGE_BYTES or building == _STAGE_EVENTS
                    )
                    fills = bool(pending) and (
                        size + weight > _STAGE_BYTES or len(pending) == _STAGE_EVENTS
                    )
                    if windows.ends_before(
                        event, bool(pending), full or (bool(pending) and event.ordinal == after)
                    ):
                        if joins and not fills:
                            # (A step of its own within the operation: SPEC 12.3.)
                            steps.append(len(pending))
                        else:
                            row = stage_events(row, index, section, pending, steps)
                            pending, steps, size = [], [], 0
                        step_size = 0
                    elif fills:
                        # (It ends where the step being built began, one not full after
                        # another, which begins the next whole: not cut in two, SPEC 12.3.)
                        at = steps[-1]
                        row = stage_events(row, index, section, pending[:at], steps[:-1])
                        pending, steps, size = pending[at:], [], step_size
                    pending.append(event)
                    size += weight
                    step_size += weight
            if row is None:
                # What else the group's frame holds: its snapshot, checkpoint and metadata
                # (a thousand sessions must not make a frame of gigabytes).
                size += len(section.snapshot.data) if section.snapshot is not None else 0
                size += len(section.checkpoint.data) if section.checkpoint is not None else 0
                size += metadata_bytes(meta.mode, meta.context_id, meta.tags, meta.extensions)
                # (and its unsettled turn's request id, up to 1 MiB of characters in an
                # archive: uncounted, 200 empty sessions with such an id, 22 KB of archive,
                # were staged in one frame of 200 MB, SPEC 12.3)
                size += len((meta.turn_request_id or "").encode("utf-8", "surrogatepass"))
                if not group.fits(size, len(pending)):
                    stage_group()
                staged_session = StagedSession(
                    meta,
                    section.snapshot,
                    pending,
                    section.checkpoint,
                    targets[index],
                    tuple(steps),
                )
                group.add(staged_session, index, size)
                continue
            if pending:
                stage_events(row, index, section, pending, steps)
            plan.append(ImportTarget(row.incarnation, targets[index], *_state_of(meta)))
        stage_group()
        if reader.sha256 != sha256 or len(plan) != len(targets):
            raise ArchiveInvalid("changed", "the archive changed while it was imported")
        committing = True
        rows = engine.submit(CommitImport(plan))
    except BaseException as error:
        rolled_back = None
        if staged:
            with contextlib.suppress(Exception):
                rolled_back = engine.submit(AbortImport(staged))
        if committing and not isinstance(error, Exception):
            # A Ctrl+C (or a SIGTERM handler's exit) as the import committed: the commit
            # went through when nothing was left staged (it held the interrupt until it
            # was done); not known when the rollback failed too (SPEC 12.3).
            if rolled_back == 0:
                error.add_note(IMPORT_COMMITTED)
            elif rolled_back is None:
                error.add_note(IMPORT_UNKNOWN)
        raise
    try:
        _expire_past_deadlines(engine, rows)
        progress.finished()  # (a Ctrl+C may land as the caller's report runs)
    except BaseException as error:
        error.add_note(IMPORT_COMMITTED)
        raise
    return rows


def _expire_past_deadlines(engine: Engine, rows: list[SessionRow]) -> None:
    """Expire the imported sessions whose deadline has passed, before the import returns
    (SPEC 12.3: at once). The importer's expiry timer learns of the deadline from the
    commit, but a process that closes right after, as `journal import` does, closed first:
    until 2026-12-05 such a session stayed open past its deadline until another writer's
    commit or its 30 s re-read. A failure here is logged and left to them: the import
    has committed."""
    now = int(time.time() * 1000)
    if not any((due := row.deadline()) is not None and due <= now for row in rows):
        return
    try:
        engine.submit(Expire())
    except JournalError:
        _log.warning(
            "the imported sessions past their deadline were not expired yet: "
            "the next commit of a writer expires them",
            exc_info=True,
        )


class _Group:
    """Small sessions waiting to be staged together (`StageSessions`)."""

    def __init__(self) -> None:
        self.sessions: list[StagedSession] = []
        self.targets: list[tuple[int, ArchiveSession]] = []  # (archive index, metadata)
        self._bytes = 0
        self._events = 0

    def fits(self, data_bytes: int, events: int) -> bool:
        return (
            len(self.sessions) < _STAGE_SESSIONS
            and self._bytes + data_bytes <= _STAGE_BYTES
            and self._events + events <= _STAGE_EVENTS
        )

    def add(self, session: StagedSession, index: int, data_bytes: int) -> None:
        self.sessions.append(session)
        self.targets.append((index, session.session))
        self._bytes += data_bytes
        self._events += len(session.events)

    def clear(self) -> None:
        self.sessions, self.targets = [], []
        self._bytes = self._events = 0


def _state_of(meta: ArchiveSession) -> tuple[int, int]:
    state = SessionState(meta.state)
    if state is SessionState.SUSPENDED:
        return state.wire, meta.suspended_at_ms or meta.created_at_ms
    if state.terminal:
        return state.wire, meta.ended_at_ms or meta.created_at_ms
    return state.wire, 0
