"""The portable archive format: records and the checking reader (the streaming writer:
`archive_writer.py`).

An archive is a sequence of independent zstd frames whose concatenated content is a
sequence of records, each a big-endian u32 length and a msgpack-encoded tagged record:
one `ArchiveHeader`, then per session an `ArchiveSession`, its `ArchiveSnapshot` if it has
one, its `ArchiveCheckpoint` if it has one (version 2), and `ArchiveEvents` batches in
ordinal order, then one `ArchiveFooter` holding the counts and the SHA-256 of the content
before it. The byte layout is in SPEC.md
("Archives"). Engine-neutral: the facade's export and import drive it.

Reading is defensive: archives may come from strangers. Every size is bounded before it
is allocated (`ArchiveLimits`), and every problem is an `ArchiveInvalid` with a `reason`
from `ARCHIVE_REASONS`, never another exception.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Iterator
from typing import IO, Annotated, Final, cast

import msgspec
import zstandard

from .archive_fields import check_checkpoint, check_event, check_session, check_snapshot
from .arguments import (
    MAX_BATCH_BYTES,
    MAX_BATCH_EVENTS,
    MAX_EVENT_BYTES,
    MAX_METADATA_BYTES,
    MAX_NAME_LENGTH,
    MAX_SETTING,
)
from .errors import ArchiveInvalid, InvalidArgument
from .records import TURN_EVENT_TYPES, TURN_STARTED, SessionStaged

__all__ = [
    "ARCHIVE_FORMAT",
    "ARCHIVE_REASONS",
    "ARCHIVE_VERSION",
    "ARCHIVE_VERSIONS",
    "END_MAGIC",
    "END_MARK",
    "END_MARKER",
    "ENTRIES",
    "RECORD_LENGTH",
    "ArchiveCheckpoint",
    "ArchiveCounts",
    "ArchiveEvent",
    "ArchiveEvents",
    "ArchiveFooter",
    "ArchiveHeader",
    "ArchiveLimits",
    "ArchiveReader",
    "ArchiveRecord",
    "ArchiveSession",
    "ArchiveSnapshot",
    "SessionSection",
]

ARCHIVE_FORMAT: Final = "session-journal-archive"
# The newest format version (2: with checkpoints), and the versions this library reads.
# An archive without checkpoints is written as version 1, which older releases read.
ARCHIVE_VERSION: Final = 2
ARCHIVE_VERSIONS: Final = (1, 2)

# Why an archive was refused (`ArchiveInvalid.reason`).
ARCHIVE_REASONS: Final = frozenset(
    {
        "not_an_archive",  # not zstd, or no archive header first
        "unsupported_version",  # a format version this code cannot read
        "truncated",  # ends before its footer
        "corrupt",  # zstd or msgpack damage, a record of the wrong shape
        "checksum_mismatch",  # the footer's SHA-256 is not that of the content
        "count_mismatch",  # header or footer counts differ from what the archive holds
        "out_of_order",  # records out of place, ordinals not dense and increasing
        "duplicate_session",  # a session id twice
        "invalid_field",  # a value no store could hold (bad id, state, ordinal range)
        "too_large",  # a field, record or the whole content over its limit
        "changed",  # the file changed between the check and the import
    }
)

_ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
RECORD_LENGTH: Final = struct.Struct(">I")
# The end marker: a zstd skippable frame (magic, size 16) holding b"SJAREND\0" and the
# archive's length before it, so a file cut anywhere (even inside the last frame's zstd
# checksum, which decoders do not insist on) is told from a whole one.
END_MARKER: Final = struct.Struct("<II8sQ")
END_MAGIC: Final = 0x184D2A5E
END_MARK: Final = b"SJAREND\x00"
_STORE_ID: Final = re.compile(r"[0-9a-f]{32}")
_MAX_WINDOW_BYTES: Final = 1 << 31


class ArchiveLimits(msgspec.Struct, frozen=True):
    """What a reader accepts. `max_content_bytes` caps the total decompressed content
    (a decompression bomb stops there); `max_window_bytes` caps the zstd window (the
    memory one frame may need); `max_record_bytes` caps one record (the largest is a
    snapshot of up to 64 MiB); `max_sessions` caps the number of sessions (an import
    holds a few KB per session until its commit); `max_metadata_bytes` caps the
    sessions' metadata and unsettled turns' request ids together (an import's commit
    holds each session's, a listing each request id). Raise them with
    `import_sessions(..., limits=...)` or `journal import --max-bytes`, `--max-sessions`,
    `--max-metadata-bytes`."""

    max_content_bytes: int = 16 << 30
    max_window_bytes: int = 1 << 23
    max_record_bytes: int = MAX_BATCH_BYTES + (1 << 20)
    max_sessions: int = 100_000
    max_metadata_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        for name, most, bound in (
            ("max_content_bytes", MAX_SETTING, "of at most 2**62"),
            ("max_window_bytes", _MAX_WINDOW_BYTES, "of at most 2**31 (zstd's largest window)"),
            ("max_record_bytes", MAX_SETTING, "of at most 2**62"),
            ("max_sessions", MAX_SETTING, "of at most 2**62"),
            ("max_metadata_bytes", MAX_SETTING, "of at most 2**62"),
        ):
            value = getattr(self, name)
            if value.__class__ is not int or not 0 < value <= most:
                raise InvalidArgument(
                    f"ArchiveLimits.{name} must be a positive int {bound}, got {value!r}"
                )

    @property
    def max_archive_bytes(self) -> int:
        """The most compressed bytes an archive of `max_content_bytes` can need (zstd
        adds at most a few bytes per 128 KiB block and per frame): anything longer is
        padding (skippable or empty frames) and refused."""
        return self.max_content_bytes + self.max_content_bytes // 64 + (1 << 20)


class _ArchiveRecord(msgspec.Struct, array_like=True, frozen=True, tag_field="kind"):
    """Shared encoding: an integer tag first, then the fields in order."""


# Decoded sizes are bounded before anything is allocated (msgspec checks a container's
# length before decoding its items), so one record never costs much more than its bytes.
_Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_LENGTH)]
_Short = Annotated[str, msgspec.Meta(max_length=64)]
_Text = Annotated[str, msgspec.Meta(max_length=MAX_METADATA_BYTES)]
ENTRIES = 10_000  # tags, extensions, events per record, counts per record


class ArchiveHeader(_ArchiveRecord, tag=1, frozen=True):
    format: _Short
    version: int
    library_version: _Short
    exported_at_ms: int
    store_id: _Short
    session_count: int


class ArchiveSession(_ArchiveRecord, tag=2, frozen=True):
    """A session's metadata; its retained events are `[first_ordinal, last_ordinal]`
    (all of them follow, in order), `turn_request_id` an unsettled turn's request id."""

    session_id: _Name
    mode: _Name
    context_id: _Text | None
    tags: Annotated[dict[_Text, _Text], msgspec.Meta(max_length=ENTRIES)]
    extensions: Annotated[dict[_Text, bytes], msgspec.Meta(max_length=ENTRIES)]
    state: _Short
    created_at_ms: int
    suspended_at_ms: int | None
    ended_at_ms: int | None
    first_ordinal: int
    last_ordinal: int
    ttl_ms: int | None
    max_suspend_ms: int
    max_history_bytes: int | None
    max_history_age_ms: int | None
    turn_request_id: _Text | None

    def staged(
        self,
        staging_id: str,
        source_store: str,
        exported_at_ms: int,
        importer: tuple[int, int, str],
        boot_id: str,
    ) -> SessionStaged:
        """The record that stages this session under `staging_id`, imported from
        `source_store` by the process `importer` (pid, start time, host) of boot
        `boot_id`."""
        pid, start_time, host = importer
        return SessionStaged(
            staging_id=staging_id,
            session_id=self.session_id,
            created_at_ms=self.created_at_ms,
            mode=self.mode,
            context_id=self.context_id,
            tags=self.tags,
            extensions=self.extensions,
            ttl_ms=self.ttl_ms,
            max_suspend_ms=self.max_suspend_ms,
            max_history_bytes=self.max_history_bytes,
            max_history_age_ms=self.max_history_age_ms,
            source_store=source_store,
            exported_at_ms=exported_at_ms,
            pid=pid,
            start_time=start_time,
            host=host,
            boot_id=boot_id,
            turn_request_id=self.turn_request_id,
        )


class ArchiveSnapshot(_ArchiveRecord, tag=3, frozen=True):
    through_ordinal: int
    data: bytes


class ArchiveCheckpoint(_ArchiveRecord, tag=7, frozen=True):
    """A session's checkpoint (version 2): data standing for its events up to
    `through_ordinal`, which lies in `[first_ordinal - 1, last_ordinal]`."""

    through_ordinal: int
    data: bytes


class ArchiveEvent(msgspec.Struct, array_like=True, frozen=True):
    ordinal: int
    type: _Name
    timestamp_ms: int
    request_id: _Text | None
    data: bytes


class ArchiveEvents(_ArchiveRecord, tag=4, frozen=True):
    events: Annotated[list[ArchiveEvent], msgspec.Meta(max_length=ENTRIES)]


class ArchiveCounts(_ArchiveRecord, tag=6, frozen=True):
    """Per-session event counts, in archive order (up to 10,000 sessions per record)."""

    sessions: Annotated[list[tuple[_Name, int]], msgspec.Meta(max_length=ENTRIES)]


class ArchiveFooter(_ArchiveRecord, tag=5, frozen=True):
    """Totals, and the SHA-256 of every content byte before this record's length prefix
    (the `ArchiveCounts` records included)."""

    session_count: int
    event_count: int
    sha256: bytes


ArchiveRecord = (
    ArchiveHeader
    | ArchiveSession
    | ArchiveSnapshot
    | ArchiveCheckpoint
    | ArchiveEvents
    | ArchiveCounts
    | ArchiveFooter
)
_decoder: Final = msgspec.msgpack.Decoder(ArchiveRecord)


class _Versioned(msgspec.Struct, array_like=True, frozen=True):
    """What every version's header begins with (later fields are skipped): a header
    that is not the shape this library reads is told by these alone."""

    kind: int
    format: str
    version: int


_version_decoder: Final = msgspec.msgpack.Decoder(_Versioned)


class SessionSection(msgspec.Struct):
    """One session as the reader hands it out: metadata, snapshot, a batch iterator
    that must be consumed before the next section is asked for, checkpoint, and the
    content offset of its `ArchiveSession` record (its records end where the next
    section's begin, the last one's at the reader's `sessions_end`)."""

    session: ArchiveSession
    snapshot: ArchiveSnapshot | None
    batches: Iterator[list[ArchiveEvent]]
    checkpoint: ArchiveCheckpoint | None = None
    offset: int = 0


class _Counting:
    """Wraps the source file: counts the compressed bytes read (and may copy them).

    The only reader of the caller's file: its `read` may answer with any bytes-like
    object, and with more than asked (the rest is handed out by the next reads)."""

    def __init__(self, source: IO[bytes], copy: IO[bytes] | None, limit: int) -> None:
        self._source = source
        self._copy = copy
        self._limit = limit
        self.over_limit = False  # stopped at `limit` (reads then see the end)
        self.read_bytes = 0
        self.tail = b""  # the last bytes read (the end marker, at the end)
        self._ahead = b""  # what the source returned beyond the size asked

    def read(self, size: int = -1) -> bytes:
        if self.over_limit:
            return b""
        room = self._limit - self.read_bytes
        asked = room + 1 if size < 0 or size > room else size
        data = self._ahead or _bytes_read(self._source.read(asked))
        if len(data) > asked:
            data, self._ahead = data[:asked], data[asked:]
        else:
            self._ahead = b""
        if len(data) > room:
            self.over_limit = True
            return b""
        self.read_bytes += len(data)
        self.tail = (self.tail + data[-END_MARKER.size :])[-END_MARKER.size :]
        if self._copy is not None:
            self._copy.write(data)
        return data


# (What a cut archive's message says to do: the archive itself cannot be mended.)
_CUT_ADVICE: Final = "copy the whole archive again, or export it again"


class ArchiveReader:
    """Reads and checks an archive in one streaming pass (see `ArchiveLimits`).

    `sections()` yields the header's sessions in order; reading through to the end (the
    generator's normal exit) has checked the footer, the counts and the checksum. Any
    problem raises `ArchiveInvalid` at the point it is found, with the content offset.
    """

    def __init__(
        self, source: IO[bytes], limits: ArchiveLimits, copy: IO[bytes] | None = None
    ) -> None:
        self._limits = limits
        self._raw = _Counting(source, copy, limits.max_archive_bytes)
        magic = b""
        while len(magic) < 4 and (more := self._raw.read(4 - len(magic))):
            magic += more  # (a pipe may answer short)
        if magic != _ZSTD_MAGIC:
            detail = "the file does not start with a zstd frame (not a session-journal archive)"
            if not magic:
                detail = (
                    "the file is empty (0 bytes): no archive was written to it, or its "
                    f"copy was cut; {_CUT_ADVICE}"
                )
            elif _ZSTD_MAGIC.startswith(magic):
                detail = (
                    f"the file ends after {len(magic)} bytes, inside the zstd frame's first "
                    f"bytes: it was cut short; {_CUT_ADVICE}"
                )
            elif magic.lstrip()[:1] == b"{":
                detail = (
                    "this looks like the readable NDJSON form (`journal export --format "
                    "ndjson`), which is for people and tools: import an archive written "
                    "in the default format"
                )
            raise ArchiveInvalid("not_an_archive", detail)
        self._magic = magic
        decompressor = zstandard.ZstdDecompressor(max_window_size=limits.max_window_bytes)
        self._stream = decompressor.stream_reader(
            cast(IO[bytes], _Prefixed(magic, self._raw)), read_across_frames=True, closefd=False
        )
        self._offset = 0
        self._first_length = 0
        self._hash = hashlib.sha256()
        self._types: set[str] = set()  # event types already checked (bounded)
        self.header: ArchiveHeader = self._read_header()
        self.counts: list[tuple[str, int]] = []
        self.events = 0
        self.sessions_end = 0  # where the sessions' records end (set by `sections()`)
        self.footer: ArchiveFooter | None = None

    @property
    def archive_bytes(self) -> int:
        return self._raw.read_bytes

    @property
    def content_bytes(self) -> int:
        return self._offset

    # -- records -----------------------------------------------------------------------

    def _read_exact(self, size: int) -> bytes:
        chunks: list[bytes] = []
        wanted = size
        while wanted:
            try:
                chunk = self._stream.read(wanted)
            except zstandard.ZstdError as e:
                reason = "too_large" if "memory" in str(e) or "window" in str(e) else "corrupt"
                raise ArchiveInvalid(reason, f"zstd: {e}", offset=self._offset) from None
            if not chunk:
                break
            chunks.append(chunk)
            wanted -= len(chunk)
        data = b"".join(chunks)
        self._check_size()
        if len(data) < size:
            raise ArchiveInvalid(
                "truncated",
                f"the file ends after {self._raw.read_bytes} bytes, before the archive's "
                f"footer: it was cut short; {_CUT_ADVICE}",
                offset=self._offset,
            )
        return data

    def _check_size(self) -> None:
        if self._raw.over_limit:
            raise ArchiveInvalid(
                "too_large",
                f"the archive is over {self._limits.max_archive_bytes} bytes, more than "
                f"{self._limits.max_content_bytes} bytes of content can take",
                offset=self._offset,
            )

    def _next(self, *, hashed: bool = True) -> tuple[ArchiveRecord, int]:
        at = self._offset
        limits = self._limits
        prefix = self._read_exact(RECORD_LENGTH.size)
        (size,) = RECORD_LENGTH.unpack(prefix)
        if at == 0:
            self._first_length = size
        if size > limits.max_record_bytes:
            raise ArchiveInvalid(
                "too_large",
                f"a record of {size} bytes exceeds the limit of {limits.max_record_bytes}",
                offset=at,
            )
        if at + RECORD_LENGTH.size + size > limits.max_content_bytes:
            raise ArchiveInvalid(
                "too_large",
                f"the content exceeds the limit of {limits.max_content_bytes} bytes "
                "(raise it with limits=ArchiveLimits(max_content_bytes=...) or --max-bytes)",
                offset=at,
            )
        body = self._read_exact(size)
        self._offset = at + RECORD_LENGTH.size + size
        try:
            record = _decoder.decode(body)
        except msgspec.ValidationError as e:
            if at == 0:  # another version's header may hold other fields
                _check_version(body)
            reason = "too_large" if "length <=" in str(e) else "corrupt"
            raise ArchiveInvalid(reason, f"a record has the wrong shape: {e}", offset=at) from None
        except msgspec.DecodeError as e:
            raise ArchiveInvalid("corrupt", f"a record does not decode: {e}", offset=at) from None
        if hashed and not isinstance(record, ArchiveFooter):
            self._hash.update(prefix)
            self._hash.update(body)
        return record, at

    def _read_header(self) -> ArchiveHeader:
        try:
            record, at = self._next()
        except ArchiveInvalid as e:
            # Another kind of zstd file: its first bytes are no archive header.
            other = e.detail.startswith("a record does not decode") or (
                e.detail.startswith("a record of")
                and self._first_length > ArchiveLimits().max_record_bytes
            )
            if other:
                raise ArchiveInvalid("not_an_archive", e.detail) from None
            raise
        if not isinstance(record, ArchiveHeader) or record.format != ARCHIVE_FORMAT:
            raise ArchiveInvalid("not_an_archive", "the first record is not an archive header")
        if record.version not in ARCHIVE_VERSIONS:
            raise _unsupported(record.version, f"({record.library_version!r}) ")
        if not 0 <= record.session_count < MAX_SETTING:
            raise ArchiveInvalid("invalid_field", "a session count out of range", offset=at)
        if record.session_count > self._limits.max_sessions:
            raise _too_many(f"declares {record.session_count} sessions", self._limits, at)
        if not 0 <= record.exported_at_ms < MAX_SETTING:
            raise ArchiveInvalid("invalid_field", "an export time out of range", offset=at)
        if not _STORE_ID.fullmatch(record.store_id):
            raise ArchiveInvalid(
                "invalid_field", "the source store id is not 32 hex digits", offset=at
            )
        return record

    # -- sections ----------------------------------------------------------------------

    def sections(self) -> Iterator[SessionSection]:
        seen: set[str] = set()
        held = 0  # metadata and turn request ids: what an import's commit holds
        record, at = self._next()
        while not isinstance(record, (ArchiveFooter, ArchiveCounts)):
            if not isinstance(record, ArchiveSession):
                raise ArchiveInvalid(
                    "out_of_order", f"a {type(record).__name__} outside a session", offset=at
                )
            held += check_session(record, at)
            if held > self._limits.max_metadata_bytes:
                raise ArchiveInvalid(
                    "too_large",
                    f"the sessions' metadata and unsettled turns' request ids come to more "
                    f"than the limit of {self._limits.max_metadata_bytes} bytes, which an "
                    "import holds until its commit (raise it with "
                    "limits=ArchiveLimits(max_metadata_bytes=...) or --max-metadata-bytes)",
                    offset=at,
                )
            if record.session_id in seen:
                raise ArchiveInvalid(
                    "duplicate_session", f"session {record.session_id!r} twice", offset=at
                )
            seen.add(record.session_id)
            if len(seen) > self._limits.max_sessions:  # (more than its header said)
                raise _too_many(f"holds more than {len(seen) - 1} sessions", self._limits, at)
            snapshot: ArchiveSnapshot | None = None
            following, next_at = self._next()
            if isinstance(following, ArchiveSnapshot):
                snapshot = following
                check_snapshot(record, snapshot, next_at)
                following, next_at = self._next()
            checkpoint: ArchiveCheckpoint | None = None
            if isinstance(following, ArchiveCheckpoint):
                checkpoint = following
                check_checkpoint(record, checkpoint, self.header.version, next_at)
                following, next_at = self._next()
            box: list[tuple[ArchiveRecord, int]] = [(following, next_at)]
            batches = self._events(record, box)
            section = SessionSection(record, snapshot, batches, checkpoint, offset=at)
            yield section
            for _ in section.batches:  # the consumer may stop early: drain (and check)
                pass
            record, at = box[0]
        self.sessions_end = at
        compared = 0
        while isinstance(record, ArchiveCounts):
            chunk = record.sessions
            if [tuple(item) for item in chunk] != self.counts[compared : compared + len(chunk)]:
                raise ArchiveInvalid(
                    "count_mismatch",
                    "the footer's per-session counts differ from the sessions' events",
                    offset=at,
                )
            compared += len(chunk)
            record, at = self._next()
        if compared != len(self.counts):
            raise ArchiveInvalid(
                "count_mismatch",
                f"the footer counts {compared} sessions; the archive holds {len(self.counts)}",
                offset=at,
            )
        if not isinstance(record, ArchiveFooter):
            raise ArchiveInvalid(
                "out_of_order", f"a {type(record).__name__} after the counts", offset=at
            )
        self._finish(record, at)

    def _events(
        self, session: ArchiveSession, box: list[tuple[ArchiveRecord, int]]
    ) -> Iterator[list[ArchiveEvent]]:
        expected = session.first_ordinal
        count = 0
        turn = session.turn_request_id  # the unsettled turn, as the events leave it
        record, at = box[0]
        while isinstance(record, ArchiveEvents):
            events = record.events
            if not events or len(events) > MAX_BATCH_EVENTS:
                raise ArchiveInvalid(
                    "invalid_field",
                    f"an event batch of {len(events)} events (1 to {MAX_BATCH_EVENTS})",
                    offset=at,
                )
            known = self._types
            for event in events:
                if event.ordinal != expected:
                    raise ArchiveInvalid(
                        "out_of_order",
                        f"session {session.session_id!r}: event ordinal {event.ordinal} where "
                        f"{expected} was due",
                        offset=at,
                    )
                if (
                    event.type not in known
                    or len(event.data) > MAX_EVENT_BYTES
                    or not 0 <= event.timestamp_ms < MAX_SETTING
                ):
                    # The precise checks (the fast ones above let only sure cases through).
                    check_event(event, at)
                    if len(known) < 4096:
                        known.add(event.type)
                if event.type in TURN_EVENT_TYPES:  # as the projection follows turns
                    if event.type == TURN_STARTED:
                        turn = event.request_id
                    elif event.request_id == turn:
                        turn = None
                expected += 1
            if expected - 1 > session.last_ordinal:
                raise ArchiveInvalid(
                    "count_mismatch",
                    f"session {session.session_id!r} has events after its last ordinal "
                    f"{session.last_ordinal}",
                    offset=at,
                )
            count += len(events)
            yield events
            record, at = self._next()
            box[0] = (record, at)
        if isinstance(record, (ArchiveSnapshot, ArchiveCheckpoint)):
            kind = "snapshot" if isinstance(record, ArchiveSnapshot) else "checkpoint"
            raise ArchiveInvalid(
                "out_of_order",
                f"session {session.session_id[:80]!r}: a {kind} out of place (a session's "
                "records are at most one snapshot, at most one checkpoint, then its events)",
                offset=at,
            )
        if expected - 1 != session.last_ordinal:
            raise ArchiveInvalid(
                "count_mismatch",
                f"session {session.session_id!r} ends at ordinal {expected - 1}, its "
                f"metadata says {session.last_ordinal}",
                offset=at,
            )
        if turn != session.turn_request_id:
            raise ArchiveInvalid(
                "invalid_field",
                f"session {session.session_id!r}: its unsettled turn is "
                f"{session.turn_request_id!r}, its turn events leave {turn!r}",
                offset=at,
            )
        self.counts.append((session.session_id, count))
        self.events += count

    def _finish(self, footer: ArchiveRecord, at: int) -> None:
        assert isinstance(footer, ArchiveFooter)
        if self._hash.digest() != footer.sha256:
            raise ArchiveInvalid(
                "checksum_mismatch",
                "the content's SHA-256 is not the one the footer records",
                offset=at,
            )
        if (
            footer.session_count != len(self.counts)
            or self.header.session_count != len(self.counts)
            or footer.event_count != self.events
        ):
            raise ArchiveInvalid(
                "count_mismatch",
                f"the archive holds {len(self.counts)} sessions and {self.events} events; "
                f"its header says {self.header.session_count} sessions, its footer "
                f"{footer.session_count} sessions and {footer.event_count} events",
                offset=at,
            )
        trailing = self._read_trailing()
        if trailing:
            raise ArchiveInvalid("corrupt", "bytes after the footer", offset=self._offset)
        while self._raw.read(1 << 16):
            pass
        self._check_size()
        expected = END_MARKER.pack(END_MAGIC, 16, END_MARK, self._raw.read_bytes - END_MARKER.size)
        if self._raw.tail != expected:
            raise ArchiveInvalid(
                "truncated",
                f"the archive's end marker is missing or wrong: the file, "
                f"{self._raw.read_bytes} bytes, was cut short (or has bytes after its end); "
                f"{_CUT_ADVICE}",
                offset=self._offset,
            )
        self.footer = footer

    def _read_trailing(self) -> bool:
        try:
            return bool(self._stream.read(1))
        except zstandard.ZstdError:
            return True

    @property
    def sha256(self) -> str:
        return "" if self.footer is None else self.footer.sha256.hex()


def _check_version(header: bytes) -> None:
    """Raise `unsupported_version` when `header` (a first record that is not version
    1's header) is an archive header of another version."""
    try:
        versioned = _version_decoder.decode(header)
    except msgspec.DecodeError:
        return
    header_of = (versioned.kind, versioned.format) == (1, ARCHIVE_FORMAT)
    if header_of and versioned.version not in ARCHIVE_VERSIONS:
        raise _unsupported(versioned.version, "")


def _too_many(holds: str, limits: ArchiveLimits, at: int) -> ArchiveInvalid:
    return ArchiveInvalid(
        "too_large",
        f"the archive {holds}, over the limit of {limits.max_sessions} (raise it with "
        "limits=ArchiveLimits(max_sessions=...) or --max-sessions)",
        offset=at,
    )


def _unsupported(version: int, writer: str) -> ArchiveInvalid:
    return ArchiveInvalid(
        "unsupported_version",
        f"archive format version {version}; this library reads versions "
        f"{' and '.join(map(str, ARCHIVE_VERSIONS))}: import it with the library version "
        "that wrote it "
        f"{writer}or a newer one",
    )


def _bytes_read(data: object) -> bytes:
    """What the archive's source returned from `read`, as bytes (SPEC 12.3)."""
    if type(data) is bytes:
        return data
    if data is None:  # (io.RawIOBase: no data yet, and not the end of the file)
        raise InvalidArgument(
            "the archive stream returned no data without end of file: it is non-blocking; "
            "pass a blocking binary file"
        )
    if isinstance(data, str):
        raise InvalidArgument("the archive stream returned str: open the archive in binary mode")
    try:
        return bytes(memoryview(data))  # type: ignore[arg-type]
    except (TypeError, ValueError, BufferError):
        raise InvalidArgument(
            f"the archive stream's read() returned {type(data).__name__}, not bytes: "
            "pass a binary file object"
        ) from None


class _Prefixed:
    """A file that reads `prefix` first (the magic already consumed), then `rest`."""

    def __init__(self, prefix: bytes, rest: _Counting) -> None:
        self._prefix = prefix
        self._rest = rest

    def read(self, size: int = -1) -> bytes:
        if self._prefix:
            head, self._prefix = self._prefix, b""
            if size < 0:
                return head + self._rest.read()
            if size <= len(head):
                head, self._prefix = head[:size], head[size:]
                return head
            return head + self._rest.read(size - len(head))
        return self._rest.read(size)
