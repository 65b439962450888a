"""`journal export` and `journal import`: sessions to and from portable archives."""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import itertools
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from typing import IO, Any, Final, cast

import click
import msgspec

import journal
from journal.archive import ArchiveLimits, ArchiveReader

from .destinations import check_writable
from .interrupts import CtrlC, ctrl_c_noted, said_if_interrupted
from .json_data import embedded
from .maintenance import progress_bar
from .output import (
    CommandFailed,
    NumberOption,
    Output,
    Settings,
    WholeNumber,
    pass_settings,
    require_stream,
    silence_stdout,
)
from .rendering import id_column, listing_parts, plural, shown

# Names of this process's stdout, which `export -o` takes as `-` (until 2026-12-05 they
# were refused: "No such file or directory (in '/proc/PID/fd')", or "exists").
_STDOUT_NAMES: Final = frozenset({"/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"})


@click.command("export")
@click.option(
    "-s",
    "--session",
    "session_ids",
    multiple=True,
    metavar="ID",
    help="A session to export (repeat for several).",
)
@click.option("--all", "export_all", is_flag=True, help="Export every session of the store.")
@click.option(
    "-o",
    "--output",
    "dest",
    required=True,
    metavar="FILE",
    help="Archive file to write (`-` for stdout). Written to a temporary file and renamed.",
)
@click.option(
    "--format",
    "archive_format",
    type=click.Choice(["archive", "ndjson"]),
    default="archive",
    show_default=True,
    help="`archive`: the binary form `journal import` reads; `ndjson`: one JSON object "
    "per record, for people and other tools.",
)
@click.option("--force", is_flag=True, help="Replace FILE if it exists.")
@pass_settings
def export(
    settings: Settings,
    session_ids: tuple[str, ...],
    export_all: bool,
    dest: str,
    archive_format: str,
    force: bool,
) -> None:
    """Write sessions to a portable archive (zstd, checksummed; format in SPEC.md).

    Each session is exported up to the events it had when its export began; writers may
    keep appending meanwhile. An existing FILE is kept unless --force.
    """
    # (Until 2026-12-05 a failure's JSON error record went into the archive stream, and
    # `import` then took the file for the NDJSON form: found by a CLI scripting trial;
    # set before the checks, whose usage errors went there until 2026-12-05.)
    settings.output.stdout_is_data = dest == "-" or dest in _STDOUT_NAMES
    if session_ids and export_all:
        raise click.UsageError("pass -s ID (repeatable) or --all, not both")
    if not session_ids and not export_all:
        raise click.UsageError("name the sessions with -s ID (repeatable), or pass --all")
    if not dest:
        raise click.BadParameter(
            "'' names no file: give a FILE, or - for stdout", param_hint="'-o' / '--output'"
        )
    ids = None if export_all else list(session_ids)
    output = settings.output
    if dest in _STDOUT_NAMES:
        dest = "-"  # (its /proc link names a pipe or a file the process holds open)
    elif dest != "-" and os.path.isdir(dest):
        raise click.BadParameter(
            f"{dest!r} is a directory: give the path of a file in it",
            param_hint="'-o' / '--output'",
        )
    if dest == "-":
        require_stream("stdout", "pass -o FILE, or give the command a stdout to write to")
    if dest == "-" and archive_format == "archive" and sys.stdout.isatty():
        raise click.UsageError(
            "refusing to write a binary archive to a terminal: use -o FILE, or pipe it"
        )
    if dest != "-" and not force and os.path.isfile(dest):
        raise CommandFailed(
            f"{dest!r} exists: pass --force to replace it", "FILE_EXISTS", "ALREADY_EXISTS"
        )
    if dest != "-":
        check_writable(dest)  # (exit 9: a place this user may not write, or read-only)
    before = _file_identity(dest)
    written = False  # (the whole archive was: a Ctrl+C then came after)

    def said(_: KeyboardInterrupt) -> str:
        return _export_interrupted(dest, archive_format, before, written)

    try:
        with (
            said_if_interrupted(said),
            ctrl_c_noted() as ctrl_c,
            settings.open(write=False) as store,
        ):
            if archive_format == "ndjson":
                report = _export_ndjson(store, ids, dest, output, ctrl_c)
            elif dest == "-":
                with progress_bar("exporting", output.format == "text") as bar:
                    report = store.export_sessions(
                        ids, sys.stdout.buffer, progress=ctrl_c.progress(bar)
                    )
                sys.stdout.buffer.flush()
            else:
                with progress_bar("exporting", output.format == "text") as bar:
                    report = store.export_sessions(ids, dest, progress=ctrl_c.progress(bar))
            written = True
            ctrl_c.check()
    except BrokenPipeError:
        if archive_format == "ndjson":
            raise  # the readable form: `| head` is a normal way to end (exit 0)
        # Unlike `watch | head`, a reader that leaves early got a useless half archive.
        silence_stdout()
        raise CommandFailed(
            "the reader of stdout went away before the archive was complete",
            "BROKEN_PIPE",
        ) from None
    except OSError as e:  # (the store's own failures are JournalErrors: this is FILE's)
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        raise CommandFailed(
            f"cannot write the archive to {'stdout' if dest == '-' else repr(dest)}: "
            f"{e.strerror or e}; "
            + ("free space there, or export to another disk" if full else "check that path"),
            "OS_ERROR",
            "UNAVAILABLE",
        ) from None
    if dest == "-":
        return  # stdout carries the archive itself
    # (Reading a large archive back for its digest takes a while: a Ctrl+C then is said too.)
    with said_if_interrupted(said):
        _say_exported(dest, archive_format, report, output)


def _say_exported(
    dest: str, archive_format: str, report: journal.ExportReport, output: Output
) -> None:
    """Print what an export to FILE wrote: its size and both digests."""
    size = os.path.getsize(dest) if os.path.isfile(dest) else report.archive_bytes
    file_sha256 = _file_sha256(dest)
    text = (
        f"exported {plural(len(report.sessions), 'session')}, "
        f"{plural(report.events, 'event')} to {dest} ({size:,} bytes)"
    )
    # Whole digests: people compare them with what sha256sum prints. The file's is what
    # they compare; the content's (the archive's footer) is what `import --list` prints.
    if file_sha256 is not None:
        text += f"\nfile sha256     {file_sha256}  (as sha256sum prints it)"
    where = (
        "its footer record holds it"
        if archive_format == "ndjson"
        else "`journal import --list` prints it"
    )
    text += f"\ncontent sha256  {report.sha256}  (as {where})"
    output.emit(
        {
            "path": dest,
            "sessions": len(report.sessions),
            "events": report.events,
            "bytes": size,
            "file_sha256": file_sha256,
            "content_sha256": report.sha256,
        },
        text,
    )


def _file_identity(dest: str) -> tuple[int, int] | None:
    """(device, inode) of the regular file at `dest` (a symlink followed, as the export
    follows it), or None: no file there yet, stdout, or a FIFO or a device (written
    through, not replaced)."""
    try:
        found = os.stat(dest) if dest != "-" else None
    except OSError:
        return None
    if found is None or not stat.S_ISREG(found.st_mode):
        return None
    return found.st_dev, found.st_ino


def _export_interrupted(
    dest: str, archive_format: str, before: tuple[int, int] | None, written: bool
) -> str:
    """What an interrupted export left at `dest` (SPEC 12): a regular file is replaced
    whole by a rename, or not at all (the temporary file is removed), so its identity
    tells whether the new archive is there; stdout, a FIFO or a device got what was
    written before the Ctrl+C."""
    if dest == "-" or _written_through(dest):
        where = "stdout" if dest == "-" else dest
        if written:
            return f"interrupted after the whole archive was written to {where}"
        if archive_format == "ndjson":
            return (
                f"interrupted: the NDJSON written to {where} is incomplete (it lacks the "
                "footer record, and may be empty); export again"
            )
        return (
            f"interrupted: the archive written to {where} is incomplete (`journal import` "
            "refuses it); export again"
        )
    now = _file_identity(dest)
    if now is not None and now != before:
        return f"interrupted after the archive was written: {dest} holds it whole"
    if before is None:
        return (
            f"interrupted: no archive was written ({dest} was not created; the partial "
            "copy was removed)"
        )
    return (
        f"interrupted: {dest} was left as it was (the new archive was not complete; its "
        "partial copy was removed)"
    )


def _written_through(dest: str) -> bool:
    """Whether the export writes through `dest` (a FIFO, a device) instead of replacing it."""
    try:
        return not stat.S_ISREG(os.stat(dest).st_mode)
    except OSError:
        return False  # (none yet: a file is made)


def _file_sha256(path: str) -> str | None:
    """The SHA-256 (hex) of the file just written at `path`, as sha256sum prints it;
    None for a path that is not a regular file (a FIFO or a device: written through,
    nothing to read back)."""
    try:
        # Not opened unless regular (opening a device may act: a tape rewinds), and then
        # with O_NONBLOCK: a FIFO's open for reading (one put there since) would wait for a
        # writer for good; a regular file reads as it would without.
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # (gone or unreadable since: the export itself succeeded)
    with open(fd, "rb") as file:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return hashlib.file_digest(file, "sha256").hexdigest()
        except OSError:
            return None


def _export_ndjson(
    store: journal.Journal, ids: list[str] | None, dest: str, output: Output, ctrl_c: CtrlC
) -> journal.ExportReport:
    """The readable form: the binary archive, read back as one JSON object per record."""
    from journal.export_files import write_file  # (only where used)

    with tempfile.TemporaryFile(prefix="journal-export-") as binary:
        with progress_bar("exporting", output.format == "text" and dest != "-") as bar:
            report = store.export_sessions(ids, binary, progress=ctrl_c.progress(bar))
        binary.seek(0)
        if dest == "-":
            _write_ndjson(binary, sys.stdout.buffer)
            sys.stdout.buffer.flush()
            return report
        write_file(dest, lambda out: _write_ndjson(binary, out))
    return report


def _write_ndjson(binary: IO[bytes], out: IO[bytes]) -> None:
    """One UTF-8 JSON line per record, data as stored (`embedded`)."""
    for record in _ndjson_records(binary):
        out.write(_NDJSON.encode(record) + b"\n")


_NDJSON = msgspec.json.Encoder()


def _ndjson_records(binary: IO[bytes]) -> Iterator[dict[str, Any]]:
    # Our own archive, just written: no limit of the import side applies.
    limits = ArchiveLimits(
        max_content_bytes=1 << 62,
        max_record_bytes=1 << 40,
        max_sessions=1 << 62,
        max_metadata_bytes=1 << 62,
    )
    reader = ArchiveReader(binary, limits)
    header = reader.header
    yield {
        "record": "header",
        "format": header.format,
        "version": header.version,
        "library_version": header.library_version,
        "exported_at_ms": header.exported_at_ms,
        "store_id": header.store_id,
        "session_count": header.session_count,
    }
    for section in reader.sections():
        meta = section.session
        yield {
            "record": "session",
            "session_id": meta.session_id,
            "mode": meta.mode,
            "context_id": meta.context_id,
            "tags": meta.tags,
            "extensions": {k: embedded(v) for k, v in meta.extensions.items()},
            "state": meta.state,
            "created_at_ms": meta.created_at_ms,
            "suspended_at_ms": meta.suspended_at_ms,
            "ended_at_ms": meta.ended_at_ms,
            "first_ordinal": meta.first_ordinal,
            "last_ordinal": meta.last_ordinal,
            "ttl_ms": meta.ttl_ms,
            "max_suspend_ms": meta.max_suspend_ms,
            "max_history_bytes": meta.max_history_bytes,
            "max_history_age_ms": meta.max_history_age_ms,
            "turn_request_id": meta.turn_request_id,
        }
        if section.snapshot is not None:
            yield {
                "record": "snapshot",
                "session_id": meta.session_id,
                "through_ordinal": section.snapshot.through_ordinal,
                "data": embedded(section.snapshot.data),
            }
        if section.checkpoint is not None:  # (archive version 2)
            yield {
                "record": "checkpoint",
                "session_id": meta.session_id,
                "through_ordinal": section.checkpoint.through_ordinal,
                "data": embedded(section.checkpoint.data),
            }
        for batch in section.batches:
            for event in batch:
                yield {
                    "record": "event",
                    "session_id": meta.session_id,
                    "ordinal": event.ordinal,
                    "type": event.type,
                    "timestamp_ms": event.timestamp_ms,
                    "request_id": event.request_id,
                    "data": embedded(event.data),
                }
    yield {
        "record": "footer",
        "sessions": dict(reader.counts),
        "session_count": len(reader.counts),
        "event_count": reader.events,
        "sha256": reader.sha256,
    }


@click.command("import", short_help="Import every session of an archive, or --list what it holds.")
@click.argument("archive", metavar="FILE")
@click.option(
    "--list",
    "list_only",
    is_flag=True,
    help="Import nothing: check the whole archive and list what it holds (no store is "
    "opened; a damaged archive fails as the import would).",
)
@click.option(
    "--as",
    "new_id",
    default=None,
    metavar="NEW_ID",
    help="Import a one-session archive under this id instead of its own.",
)
@click.option(
    "--rename",
    "renames",
    multiple=True,
    metavar="OLD=NEW",
    help="Import session OLD of the archive as NEW (repeatable).",
)
@click.option(
    "--max-bytes",
    cls=NumberOption,
    type=WholeNumber(1, 1 << 62),  # (ArchiveLimits: at most 2**62)
    metavar="N",
    default=ArchiveLimits().max_content_bytes,
    show_default=True,
    help="Refuse archives whose decompressed content is larger (decompression bombs).",
)
@click.option(
    "--max-record-bytes",
    cls=NumberOption,
    type=WholeNumber(1, 1 << 62),  # (ArchiveLimits: at most 2**62)
    metavar="N",
    default=ArchiveLimits().max_record_bytes,
    show_default=True,
    help="Refuse records larger than this (the largest legitimate one is a 64 MiB snapshot).",
)
@click.option(
    "--max-sessions",
    cls=NumberOption,
    type=WholeNumber(1, 1 << 62),  # (ArchiveLimits: at most 2**62)
    metavar="N",
    default=ArchiveLimits().max_sessions,
    show_default=True,
    help="Refuse archives of more sessions (an import holds a few KB per session until "
    "its commit).",
)
@click.option(
    "--max-metadata-bytes",
    cls=NumberOption,
    type=WholeNumber(1, 1 << 62),  # (ArchiveLimits: at most 2**62)
    metavar="N",
    default=ArchiveLimits().max_metadata_bytes,
    show_default=True,
    help="Refuse archives whose sessions' metadata and open turns' request ids come to "
    "more (an import holds them until its commit).",
)
@pass_settings
def import_(
    settings: Settings,
    archive: str,
    list_only: bool,
    new_id: str | None,
    renames: tuple[str, ...],
    max_bytes: int,
    max_record_bytes: int,
    max_sessions: int,
    max_metadata_bytes: int,
) -> None:
    """Import every session of an archive (FILE, or `-` for stdin), or none.

    The archive is checked whole before anything is written (exit 4 with a reason when
    it is invalid); its sessions then appear together, as new sessions of this store.
    With --list, nothing is imported and no store is opened: the archive is checked the
    same way, then its header and one line per session are printed.
    """
    limits = ArchiveLimits(
        max_content_bytes=max_bytes,
        max_record_bytes=max_record_bytes,
        max_sessions=max_sessions,
        max_metadata_bytes=max_metadata_bytes,
    )
    if list_only:
        if new_id is not None or renames:
            raise click.UsageError("--list imports nothing: pass it without --as and --rename")
        with (
            said_if_interrupted(lambda _: "interrupted: the archive was not checked whole"),
            ctrl_c_noted() as ctrl_c,
            contextlib.ExitStack() as stack,
            progress_bar("checking", settings.output.format == "text") as bar,
        ):
            # (The file's digest is taken as the one pass reads it: stdin or a FIFO cannot
            # be read again, and a file need not be.)
            read = _Digesting(_archive_source(archive, stack))
            contents = journal.read_archive_contents(
                cast(IO[bytes], read), limits, progress=ctrl_c.progress(bar)
            )
            ctrl_c.check()
        _list_contents(settings.output, contents, read.hexdigest())
        return
    output = settings.output
    rename: dict[str, str] | None = None
    if renames:
        if new_id is not None:
            raise click.UsageError("pass --as NEW_ID or --rename OLD=NEW, not both")
        rename = {}
        for item in renames:
            old, sep, new = item.partition("=")
            if not sep or not old or not new:
                raise click.UsageError(f"--rename {item!r} is not OLD=NEW")
            if "=" in new:  # ids may hold "=": resolved against the archive's ids below
                continue
            if old in rename:
                # (as a NEW id given twice is: the library refuses that rename)
                raise journal.InvalidArgument(
                    f"--rename names session {old!r} twice ({old}={rename[old]} and "
                    f"{item}): give each OLD once"
                )
            rename[old] = new
    report: journal.ImportReport | None = None

    def said(interrupt: KeyboardInterrupt) -> str:
        return _import_interrupted(interrupt, imported=report is not None)

    # (Said from the first read on: with --as or a split --rename, stdin is copied, or
    # the archive read once for its ids, before the import itself.)
    with said_if_interrupted(said), ctrl_c_noted() as ctrl_c, contextlib.ExitStack() as stack:
        source = _archive_source(archive, stack)
        split = [item for item in renames if item.count("=") > 1]
        if new_id is not None or split:
            if not source.seekable():  # a pipe: keep a copy to read it twice
                spool = stack.enter_context(tempfile.TemporaryFile(prefix="journal-import-"))
                _copy_bounded(source, spool, limits)
                source = spool
            if new_id is not None:
                rename = {_only_session(source, limits): new_id}
            else:
                rename = _split_renames(split, _session_ids(source, limits), rename or {})
            source.seek(0)
        with (
            settings.open() as store,
            progress_bar("importing", output.format == "text") as bar,
        ):
            # (No Ctrl+C is raised at the report of all done: it comes after the
            # commit, and an interrupted import has imported nothing.)
            report = store.import_sessions(
                source,
                rename=rename,
                progress=ctrl_c.progress(bar, final_is_done=True),
                limits=limits,
            )
    for done in report.sessions:
        output.emit(
            {"source_id": done.source_id, "session_id": done.session_id, "events": done.events},
            f"imported {shown(done.source_id)}"
            + (f" as {shown(done.session_id)}" if done.session_id != done.source_id else "")
            + f" ({plural(done.events, 'event')})",
        )
    output.emit(
        {
            "sessions": len(report.sessions),
            "events": report.events,
            "source_store_id": report.source_store_id,
        },
        f"imported {plural(len(report.sessions), 'session')}, "
        f"{plural(report.events, 'event')} from store "
        f"{report.source_store_id}",
    )
    if ctrl_c.came:  # (its raise was lost, or it came after the last report before the commit)
        click.echo(
            "journal: Ctrl+C came as the sessions were imported; they were imported (above)",
            err=True,
        )


def _import_interrupted(interrupt: KeyboardInterrupt, imported: bool) -> str:
    """What an interrupted import did, by the notes the library put on the interrupt."""
    notes = getattr(interrupt, "__notes__", ())
    if imported or notes:  # (else the import never began: nothing noted, nothing to load)
        from journal.transfer import IMPORT_COMMITTED, IMPORT_UNKNOWN

        if imported or IMPORT_COMMITTED in notes:
            return (
                "interrupted after the commit: the sessions were imported (`journal sessions "
                "list` shows them)"
            )
        if IMPORT_UNKNOWN in notes:
            return (
                "interrupted as the sessions were committed, and the rollback failed: whether "
                "they were imported is not known (`journal sessions list` shows them if they "
                "were)"
            )
    return "interrupted: nothing was imported (`journal compact` reclaims what was staged)"


def _archive_source(archive: str, stack: contextlib.ExitStack) -> IO[bytes]:
    """The archive FILE, or stdin for `-` (refused when closed or a terminal)."""
    if archive == "-":
        require_stream("stdin", "give the archive FILE, or pipe the archive in")
        if sys.stdin.isatty():
            raise click.UsageError(
                "refusing to read an archive from a terminal: give FILE, or pipe it in"
            )
        return sys.stdin.buffer
    return _open_archive(archive, stack)


class _Digesting:
    """A binary source read through, taking the SHA-256 of the bytes read: the reader of
    an archive reads it to its end (and refuses it otherwise), so after a listing the
    digest is the file's from where it stood, as `sha256sum` prints it."""

    def __init__(self, source: IO[bytes]) -> None:
        self._source = source
        self._digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._source.read(size)
        self._digest.update(data)
        return data

    # (Where it stands and its size: for the progress bar.)
    def seekable(self) -> bool:
        return self._source.seekable()

    def tell(self) -> int:
        return self._source.tell()

    def fileno(self) -> int:
        return self._source.fileno()

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def _list_contents(output: Output, contents: journal.ArchiveContents, file_sha256: str) -> None:
    """`import --list`: a header line, then one line per session (SPEC 12.4)."""
    exported = datetime.datetime.fromtimestamp(contents.exported_at_ms / 1000, datetime.UTC)
    output.emit(
        {
            "record": "header",
            "version": contents.version,
            "library_version": contents.library_version,
            "source_store_id": contents.source_store_id,
            "exported_at_ms": contents.exported_at_ms,
            "sessions": len(contents.sessions),
            "events": contents.events,
            "archive_bytes": contents.archive_bytes,
            "content_bytes": contents.content_bytes,
            "sha256": contents.sha256,
            "file_sha256": file_sha256,
        },
        f"archive version {contents.version}, intact: "
        f"{plural(len(contents.sessions), 'session')}, {plural(contents.events, 'event')}, "
        f"{contents.archive_bytes:,} bytes (file sha256 {file_sha256}, as sha256sum prints "
        f"it; {contents.content_bytes:,} decompressed; content sha256 {contents.sha256}), "
        f"exported from store {contents.source_store_id} "
        f"at {exported:%Y-%m-%d %H:%M:%S} UTC by session-journal "
        f"{shown(contents.library_version)}",
    )
    width = id_column(session.session_id for session in contents.sessions)
    for session in contents.sessions:
        output.emit(
            {
                "record": "session",
                "session_id": session.session_id,
                "state": session.state.value,
                "mode": session.mode,
                "created_at_ms": session.created_at_ms,
                "ended_at_ms": session.ended_at_ms,
                "first_ordinal": session.first_ordinal,
                "last_ordinal": session.last_ordinal,
                "events": session.events,
                "snapshot_ordinal": session.snapshot_ordinal,
                "checkpoint_ordinal": session.checkpoint_ordinal,
                "open_turn": session.open_turn,
                "content_bytes": session.content_bytes,
            },
            _archived_text(session, width),
        )


def _archived_text(session: journal.ArchivedSession, id_width: int) -> str:
    """One listing line, as `sessions list` prints a session of a store."""
    parts = listing_parts(
        session.session_id,
        session.state,
        session.events,
        session.first_ordinal,
        session.last_ordinal,
        id_width,
    )
    if session.snapshot_ordinal is not None:
        parts.append(f"snapshot=#{session.snapshot_ordinal}")
    if session.checkpoint_ordinal is not None:
        parts.append(f"checkpoint=#{session.checkpoint_ordinal}")
    if session.mode:
        parts.append(f"mode={shown(session.mode)}")
    if session.open_turn is not None:
        parts.append(f"open-turn={shown(session.open_turn)}")
    parts.append(f"{session.content_bytes:,} bytes")
    return "  ".join(parts)


def _open_archive(path: str, stack: contextlib.ExitStack) -> IO[bytes]:
    try:
        return stack.enter_context(open(path, "rb"))
    except FileNotFoundError:
        raise CommandFailed(f"no archive at {path!r}", "ARCHIVE_NOT_FOUND", "NOT_FOUND") from None
    except IsADirectoryError:
        raise click.UsageError(f"{path!r} is a directory: give the archive file") from None
    except OSError as e:
        raise CommandFailed(
            f"cannot read the archive {path!r}: {e.strerror or e}", "OS_ERROR", "UNAVAILABLE"
        ) from None


def _copy_bounded(source: IO[bytes], spool: IO[bytes], limits: ArchiveLimits) -> None:
    """Copy a stream, refused at once when it is not zstd, and as soon as it is longer
    than an archive within `limits` can be."""
    first = source.read(4)
    # (Shorter: empty or cut short, which the reader of the copy says as for a file.)
    if len(first) == 4 and first != b"\x28\xb5\x2f\xfd":
        raise journal.ArchiveInvalid("not_an_archive", "the input does not start with a zstd frame")
    spool.write(first)
    copied = len(first)
    while chunk := source.read(1 << 20):
        copied += len(chunk)
        if copied > limits.max_archive_bytes:
            raise journal.ArchiveInvalid(
                "too_large", f"the input is over {limits.max_archive_bytes} bytes"
            )
        spool.write(chunk)
    spool.seek(0)


def _session_ids(source: IO[bytes], limits: ArchiveLimits) -> set[str]:
    """The ids of the archive's sessions (one reading pass; the import checks it all)."""
    start = source.tell()
    ids = {section.session.session_id for section in ArchiveReader(source, limits).sections()}
    source.seek(start)
    return ids


def _split_renames(items: list[str], ids: set[str], rename: dict[str, str]) -> dict[str, str]:
    """`rename` with each OLD=NEW of `items` (more than one "=") split where OLD names a
    session of the archive (ids may hold "="; no such split: at the first "=")."""
    for item in items:
        splits = [i for i, c in enumerate(item) if c == "=" and 0 < i < len(item) - 1]
        named = [i for i in splits if item[:i] in ids]
        if len(named) > 1:
            choices = " or ".join(f"{item[:i]!r} -> {item[i + 1 :]!r}" for i in named)
            raise click.UsageError(f"--rename {item!r} is ambiguous: {choices}")
        at = named[0] if named else splits[0]
        old, new = item[:at], item[at + 1 :]
        if old in rename:
            raise journal.InvalidArgument(
                f"--rename names session {old!r} twice ({old}={rename[old]} and {item}): "
                "give each OLD once"
            )
        rename[old] = new
    return rename


def _only_session(source: IO[bytes], limits: ArchiveLimits) -> str:
    reader = ArchiveReader(source, limits)
    count = reader.header.session_count
    if count == 0:
        raise click.UsageError("--as NEW_ID: this archive holds no session, nothing to import")
    if count != 1:  # (the first ids, read as the import would read them)
        ids = [shown(s.session.session_id) for s in itertools.islice(reader.sections(), 3)]
        raise click.UsageError(
            f"--as NEW_ID imports the session of a one-session archive, and this one holds "
            f"{count} sessions ({', '.join(ids)}{', ...' if count > 3 else ''}): import them "
            "all (leave --as out; --rename OLD=NEW gives one of them another id), or "
            "export the one session alone (`journal export -s ID`) and import that"
        )
    for section in reader.sections():
        return section.session.session_id
    raise journal.ArchiveInvalid("count_mismatch", "the archive holds no session")
