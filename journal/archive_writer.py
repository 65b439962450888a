"""The streaming writer of archives (the format and its reader: `archive.py`): records
in independent zstd frames of about 1 MiB of content each, the footer with the counts
and the content's SHA-256, and the end marker; and the batching of events into
`ArchiveEvents` records."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import IO, Final

import msgspec
import zstandard

from .archive import (
    END_MAGIC,
    END_MARK,
    END_MARKER,
    ENTRIES,
    RECORD_LENGTH,
    ArchiveCheckpoint,
    ArchiveCounts,
    ArchiveEvent,
    ArchiveEvents,
    ArchiveFooter,
    ArchiveHeader,
    ArchiveRecord,
    ArchiveSession,
    ArchiveSnapshot,
)

__all__ = ["ArchiveWriter", "event_batches", "event_bytes"]

_FRAME_CONTENT: Final = 1 << 20  # content per zstd frame written
_BATCH_BYTES: Final = 1 << 20  # event bytes per ArchiveEvents record written
_BATCH_EVENTS: Final = 1000
_COMPRESSION_LEVEL: Final = 3
_encoder: Final = msgspec.msgpack.Encoder()


class ArchiveWriter:
    """Writes records to a binary file, one independent zstd frame per ~1 MiB of
    content; `finish` writes the footer and flushes the last frame."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._compressor = zstandard.ZstdCompressor(level=_COMPRESSION_LEVEL, write_checksum=True)
        self._pending = bytearray()
        self._hash = hashlib.sha256()
        self.content_bytes = 0
        self.archive_bytes = 0
        self._sessions: list[tuple[str, int]] = []
        self._events = 0
        self._version = 0

    def header(self, header: ArchiveHeader) -> None:
        self._version = header.version
        self._write(header)

    def session(
        self,
        session: ArchiveSession,
        snapshot: ArchiveSnapshot | None,
        checkpoint: ArchiveCheckpoint | None = None,
    ) -> None:
        """A session's records before its events; a checkpoint needs version 2."""
        if checkpoint is not None and self._version < 2:
            raise ValueError("a version 1 archive cannot carry a checkpoint")
        self._sessions.append((session.session_id, 0))
        self._write(session)
        if snapshot is not None:
            self._write(snapshot)
        if checkpoint is not None:
            self._write(checkpoint)

    def events(self, events: list[ArchiveEvent]) -> None:
        session_id, count = self._sessions[-1]
        self._sessions[-1] = (session_id, count + len(events))
        self._events += len(events)
        self._write(ArchiveEvents(events))

    def finish(self) -> tuple[int, str]:
        """Write the footer; (event count, SHA-256 hex of the content before it)."""
        for i in range(0, len(self._sessions), ENTRIES):
            self._write(ArchiveCounts(self._sessions[i : i + ENTRIES]))
        digest = self._hash.digest()
        footer = ArchiveFooter(len(self._sessions), self._events, digest)
        body = _encoder.encode(footer)
        self._pending += RECORD_LENGTH.pack(len(body)) + body
        self.content_bytes += RECORD_LENGTH.size + len(body)
        self._flush()
        self._out.write(END_MARKER.pack(END_MAGIC, 16, END_MARK, self.archive_bytes))
        self.archive_bytes += END_MARKER.size
        return self._events, digest.hex()

    @property
    def counts(self) -> dict[str, int]:
        return dict(self._sessions)

    def _write(self, record: ArchiveRecord) -> None:
        body = _encoder.encode(record)
        prefix = RECORD_LENGTH.pack(len(body))
        self._hash.update(prefix)
        self._hash.update(body)
        self._pending += prefix
        self._pending += body
        self.content_bytes += len(prefix) + len(body)
        if len(self._pending) >= _FRAME_CONTENT:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            frame = self._compressor.compress(bytes(self._pending))
            self._out.write(frame)
            self.archive_bytes += len(frame)
            self._pending.clear()


def event_bytes(event: ArchiveEvent) -> int:
    """What an event weighs in a record or a frame: its data, type and request id (up to
    1 MiB in archives: counting the data alone let 1,000 such events make one record of
    a GB)."""
    size = len(event.data) + _text_bytes(event.type)
    return size if event.request_id is None else size + _text_bytes(event.request_id)


def _text_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def event_batches(events: Iterator[ArchiveEvent]) -> Iterator[list[ArchiveEvent]]:
    """Group events into batches of about 1 MiB (data, types and request ids; at most
    1,000 events)."""
    batch: list[ArchiveEvent] = []
    size = 0
    for event in events:
        batch.append(event)
        size += event_bytes(event)
        if size >= _BATCH_BYTES or len(batch) >= _BATCH_EVENTS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
