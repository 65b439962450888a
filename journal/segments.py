"""Segment files: the append-only, rotating, checksummed log that is the store's truth.

Layout of a segments directory (names are the segment's base position, 20 digits):

    00000000000000000001.seg      sealed segment, plain
    00000000000000000001.idx      its sidecar index (written once, when sealed)
    00000000000000004001.seg.zst  sealed segment, zstd in independently decodable blocks
    00000000000000009001.seg      the active segment (always the highest base, always plain)

Byte formats are in SPEC.md ("Segment files"). The rules this module enforces:

- A frame (one committed batch) is trusted only after its whole body is read and its CRC32
  verifies. Damage anywhere a committed frame must be raises `JournalCorrupt` naming the
  segment file and byte offset; the only exception is the unfinished tail of the active
  segment, which is "not yet written" (a reader) or a torn write to cut off (recovery).
- A bad frame at the active tail is told apart from damage in the middle by looking for any
  valid frame after it (frames start with a magic, so the search is a `bytes.find`): a torn
  write is always the last thing in the file, so if a valid later frame exists the bad one
  was committed and is corrupt.
- The active segment is preallocated with real zeros a few MiB ahead of the write offset, so
  most `fdatasync` calls do not have to write the inode (measured: 0.16 ms vs 0.25 ms per
  58 KB batch on this class of disk). An all-zero frame header is the end of the data.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import msgspec
import zstandard

from .errors import JournalCorrupt, StoreIncompatible
from .records import EventAppended, Record, SnapshotTaken, decode_frame_body

__all__ = [
    "COMPRESSED_SUFFIX",
    "DEFAULT_SEGMENT_BYTES",
    "FRAME_HEADER_SIZE",
    "SEGMENT_HEADER_SIZE",
    "SEGMENT_SUFFIX",
    "SIDECAR_SUFFIX",
    "FrameInfo",
    "ReaderCache",
    "SegmentHeader",
    "SegmentLog",
    "SegmentReader",
    "SegmentSummary",
    "SegmentWriter",
    "segment_name",
]

FORMAT_VERSION: Final = 1
SUMMARY_FORMAT: Final = 2
DEFAULT_SEGMENT_BYTES: Final = 64 << 20
SEGMENT_SUFFIX: Final = ".seg"
COMPRESSED_SUFFIX: Final = ".seg.zst"
SIDECAR_SUFFIX: Final = ".idx"

SEGMENT_MAGIC: Final = b"SJSEG\x00\r\n"
FLAG_COMPRESSED: Final = 1
FLAG_COMPACTED: Final = 2  # some frames were dropped: block ranges have gaps
# magic, version, flags, store id, base position, created_at_ms, crc32 of the preceding bytes
_SEGMENT_HEADER: Final = struct.Struct(">8sHH16sQQI")
SEGMENT_HEADER_SIZE: Final = 64

FRAME_MAGIC: Final = b"SJFR"
# magic, body length, crc32, first position, record count
_FRAME_HEADER: Final = struct.Struct(">4sIIQI")
FRAME_HEADER_SIZE: Final = _FRAME_HEADER.size
_FRAME_ZERO: Final = bytes(FRAME_HEADER_SIZE)
# The CRC covers body length, first position and count (header bytes 4..8 and 12..24) and body.
_CRC_FIELDS: Final = struct.Struct(">IQI")
MAX_FRAME_BODY: Final = 1 << 30

BLOCK_MAGIC: Final = b"SJBK"
# magic, uncompressed offset, uncompressed length, compressed length, crc32 of compressed bytes
_BLOCK_HEADER: Final = struct.Struct(">4sQIII")
BLOCK_TARGET_BYTES: Final = 1 << 20
MAX_BLOCK_BYTES: Final = MAX_FRAME_BODY + FRAME_HEADER_SIZE

SIDECAR_MAGIC: Final = b"SJIDX\x00\r\n"
FOOTER_MAGIC: Final = b"SJBT"
# footer: magic, table length, crc32 of the table; then the table (msgpack list of blocks);
# then the trailer: u64 file offset of the footer
_FOOTER_HEADER: Final = struct.Struct(">4sII")
_FOOTER_TRAILER: Final = struct.Struct(">Q")
_SIDECAR_HEADER: Final = struct.Struct(">8sI")

_READ_CHUNK: Final = 1 << 20
_DECOMPRESSOR: Final = zstandard.ZstdDecompressor()
_PREALLOCATE_BYTES: Final = 4 << 20
_ZEROS: Final = bytes(1 << 20)


def segment_name(base_position: int, *, compressed: bool = False) -> str:
    """The file name of the segment whose first position is `base_position`."""
    return f"{base_position:020d}{COMPRESSED_SUFFIX if compressed else SEGMENT_SUFFIX}"


def _sidecar_name(base_position: int) -> str:
    return f"{base_position:020d}{SIDECAR_SUFFIX}"


def _block_index(blocks: Sequence[tuple[int, int, int, int]], offset: int) -> int:
    """Index of the last block starting at or before `offset` (-1 if none)."""
    return bisect.bisect_right(blocks, offset, key=lambda block: block[0]) - 1


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(directory: str) -> None:
    # A created, renamed or deleted file can vanish after a power cut unless its directory
    # entry is synced too.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentHeader(NamedTuple):
    """The fixed 64-byte header that opens every segment file."""

    version: int
    flags: int
    store_id: bytes
    base_position: int
    created_at_ms: int

    def encode(self) -> bytes:
        head = _SEGMENT_HEADER.pack(
            SEGMENT_MAGIC,
            self.version,
            self.flags,
            self.store_id,
            self.base_position,
            self.created_at_ms,
            0,
        )[:-4]
        crc = zlib.crc32(head)
        return (head + struct.pack(">I", crc)).ljust(SEGMENT_HEADER_SIZE, b"\0")

    @classmethod
    def decode(cls, raw: bytes, name: str) -> SegmentHeader:
        if len(raw) < SEGMENT_HEADER_SIZE:
            raise JournalCorrupt(name, 0, "segment header is truncated")
        magic, version, flags, store_id, base, created, crc = _SEGMENT_HEADER.unpack_from(raw)
        if magic != SEGMENT_MAGIC:
            raise JournalCorrupt(name, 0, "not a segment file (bad magic)")
        if zlib.crc32(raw[: _SEGMENT_HEADER.size - 4]) != crc:
            raise JournalCorrupt(name, 0, "segment header checksum mismatch")
        if raw[_SEGMENT_HEADER.size : SEGMENT_HEADER_SIZE].strip(b"\0"):
            raise JournalCorrupt(name, _SEGMENT_HEADER.size, "segment header padding is damaged")
        if version != FORMAT_VERSION:
            raise StoreIncompatible(
                f"segment {name} has format version {version}; this code reads version "
                f"{FORMAT_VERSION}: upgrade session-journal to open this store"
            )
        return cls(version, flags, store_id, base, created)


@dataclass(frozen=True, slots=True)
class FrameInfo:
    """Where one frame lies: segment base, byte offset (uncompressed), positions it holds."""

    segment: int
    offset: int
    first_position: int
    count: int
    body_length: int

    @property
    def end_offset(self) -> int:
        return self.offset + FRAME_HEADER_SIZE + self.body_length

    @property
    def last_position(self) -> int:
        return self.first_position + self.count - 1


def encode_frame(body: bytes, first_position: int, count: int) -> bytes:
    """Frame header + body, ready to write."""
    if len(body) > MAX_FRAME_BODY:
        raise ValueError(f"frame body of {len(body)} bytes exceeds the {MAX_FRAME_BODY} limit")
    crc = zlib.crc32(body, zlib.crc32(_CRC_FIELDS.pack(len(body), first_position, count)))
    return _FRAME_HEADER.pack(FRAME_MAGIC, len(body), crc, first_position, count) + body


class _Bad(Exception):
    """Internal: the bytes at an offset are not a valid frame (why in args[0])."""


def _check_frame(buf: bytes | memoryview, at: int) -> tuple[int, int, int] | None:
    """Validate the frame at `buf[at:]`; return (body_length, first_position, count).

    Returns None when the buffer ends before the frame does (incomplete), raises `_Bad`
    when the bytes there are not a frame. An all-zero header is reported as `_Bad("zero")`.
    """
    if len(buf) - at < FRAME_HEADER_SIZE:
        return None
    magic, length, crc, first, count = _FRAME_HEADER.unpack_from(buf, at)
    if magic != FRAME_MAGIC:
        if bytes(buf[at : at + FRAME_HEADER_SIZE]) == _FRAME_ZERO:
            raise _Bad("zero")
        raise _Bad("bad frame magic")
    if length > MAX_FRAME_BODY or count == 0:
        raise _Bad("implausible frame header")
    end = at + FRAME_HEADER_SIZE + length
    if len(buf) < end:
        return None
    body = buf[at + FRAME_HEADER_SIZE : end]
    if zlib.crc32(body, zlib.crc32(_CRC_FIELDS.pack(length, first, count))) != crc:
        raise _Bad("frame checksum mismatch")
    return length, first, count


def _valid_frame_after(buf: bytes, start: int, after_position: int) -> bool:
    """True when some valid frame holding positions above `after_position` starts in buf."""
    at = buf.find(FRAME_MAGIC, start)
    while at != -1:
        try:
            checked = _check_frame(buf, at)
        except _Bad:
            checked = None
        if checked is not None and checked[1] > after_position:
            return True
        at = buf.find(FRAME_MAGIC, at + 1)
    return False


class FrameDigest(NamedTuple):
    """What a frame holds, for its segment's sidecar: per-session ordinal ranges, runs of
    consecutive events of one session (index in the frame, incarnation, first ordinal,
    count, data bytes, time) and the other records (index, encoded record)."""

    sessions: dict[int, tuple[int, int]]
    event_runs: list[tuple[int, int, int, int, int, int]]
    others: list[tuple[int, bytes]]


_digest_encoder: Final = msgspec.msgpack.Encoder()


def encode_other(record: Record) -> bytes:
    """A non-event record as the sidecar keeps it (a snapshot without its data)."""
    if isinstance(record, SnapshotTaken):
        record = msgspec.structs.replace(record, data=b"")
    return _digest_encoder.encode(record)


def digest_records(records: Sequence[Record]) -> FrameDigest:
    sessions: dict[int, tuple[int, int]] = {}
    runs: list[tuple[int, int, int, int, int, int]] = []
    others: list[tuple[int, bytes]] = []
    for index, record in enumerate(records):
        if type(record) is EventAppended:
            assert isinstance(record, EventAppended)
            seen = sessions.get(record.incarnation)
            sessions[record.incarnation] = (seen[0] if seen else record.ordinal, record.ordinal)
            if runs:
                start, incarnation, first, count, size, at = runs[-1]
                if (
                    start + count == index
                    and incarnation == record.incarnation
                    and first + count == record.ordinal
                ):
                    runs[-1] = (start, incarnation, first, count + 1, size + len(record.data), at)
                    continue
            runs.append(
                (
                    index,
                    record.incarnation,
                    record.ordinal,
                    1,
                    len(record.data),
                    record.timestamp_ms,
                )
            )
        else:
            others.append((index, encode_other(record)))
    return FrameDigest(sessions, runs, others)


class SegmentSummary(msgspec.Struct, array_like=True):
    """A sealed segment's sidecar index: frames, per-session ordinal runs, zstd blocks.

    `sessions` maps an incarnation to one (first_ordinal, last_ordinal, frame_offset) entry
    per frame holding that session's events, so a resume seeks straight to its frame.
    `blocks` is empty for a plain segment; otherwise (uncompressed offset, uncompressed
    length, file offset, compressed length) per zstd block. Format 2 adds `event_runs` and
    `others`, from which a read-only reader projects the segment without reading it.
    """

    format: int
    base_position: int
    last_position: int
    data_end: int
    frames: list[tuple[int, int, int]]
    sessions: dict[int, list[tuple[int, int, int]]]
    blocks: list[tuple[int, int, int, int]] = []
    # Format 2: enough to project the segment into a view without reading it. Event runs
    # are (position, incarnation, first ordinal, count, frame offset, data bytes, time);
    # other records are (position, frame offset, msgpack record; snapshot data left out).
    event_runs: list[tuple[int, int, int, int, int, int, int]] = []
    others: list[tuple[int, int, bytes]] = []

    def frame_at_or_before(self, position: int) -> int:
        """Offset of the frame that holds `position` (or the last one before it)."""
        at = bisect.bisect_right(self.frames, position, key=lambda frame: frame[1])
        return self.frames[at - 1][0] if at else SEGMENT_HEADER_SIZE


_summary_encoder: Final = msgspec.msgpack.Encoder()
_summary_decoder: Final = msgspec.msgpack.Decoder(SegmentSummary)


def write_summary(directory: str, summary: SegmentSummary) -> None:
    """Write a sidecar atomically (temp file, fsync, rename, fsync directory)."""
    body = _summary_encoder.encode(summary)
    final = os.path.join(directory, _sidecar_name(summary.base_position))
    temporary = final + ".tmp"
    with open(temporary, "wb") as out:
        out.write(_SIDECAR_HEADER.pack(SIDECAR_MAGIC, zlib.crc32(body)))
        out.write(body)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, final)
    _fsync_dir(directory)


def read_summary(directory: str, base_position: int) -> SegmentSummary | None:
    """The sidecar of a sealed segment, or None when it is missing or does not verify."""
    try:
        with open(os.path.join(directory, _sidecar_name(base_position)), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    if len(raw) < _SIDECAR_HEADER.size:
        return None
    magic, crc = _SIDECAR_HEADER.unpack_from(raw)
    body = memoryview(raw)[_SIDECAR_HEADER.size :]
    if magic != SIDECAR_MAGIC or zlib.crc32(body) != crc:
        return None
    try:
        summary = _summary_decoder.decode(body)
    except msgspec.DecodeError:
        return None
    return summary if summary.base_position == base_position else None


class SegmentReader:
    """Reads verified frames from one segment file, plain or compressed.

    A reader holds the file open: a segment compressed or deleted while it reads keeps
    reading the version it opened (POSIX unlink semantics).
    """

    def __init__(self, directory: str, base_position: int) -> None:
        self.directory = directory
        self.base_position = base_position
        plain = os.path.join(directory, segment_name(base_position))
        packed = os.path.join(directory, segment_name(base_position, compressed=True))
        try:
            self._fd = os.open(plain, os.O_RDONLY)
            self.name = segment_name(base_position)
        except FileNotFoundError:
            self._fd = os.open(packed, os.O_RDONLY)
            self.name = segment_name(base_position, compressed=True)
        try:
            raw = os.pread(self._fd, SEGMENT_HEADER_SIZE, 0)
            self.header = SegmentHeader.decode(raw, self.name)
        except BaseException:
            os.close(self._fd)
            raise
        if self.header.base_position != base_position:
            os.close(self._fd)
            raise JournalCorrupt(self.name, 0, "segment header names another base position")
        self.compressed = bool(self.header.flags & FLAG_COMPRESSED)
        self._blocks: list[tuple[int, int, int, int]] | None = None
        # Set when `frames(tail=True)` stopped at a torn (non-zero, invalid) tail.
        self.torn_at: int | None = None
        # read_frame's cache: one chunk of the plain file or one decompressed block.
        self._chunk = b""
        self._chunk_start = 0
        self._trusted_end = 0
        self._last_end = -1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def file_size(self) -> int:
        return os.fstat(self._fd).st_size

    def unlinked(self) -> bool:
        """Whether the file this reader holds was deleted or replaced (compaction) since."""
        return os.fstat(self._fd).st_nlink == 0

    def frames(
        self,
        start_offset: int = SEGMENT_HEADER_SIZE,
        *,
        committed_end: int | None = None,
        tail: bool = False,
    ) -> Iterator[tuple[FrameInfo, memoryview]]:
        """Yield (info, body) for each frame from `start_offset` (a frame boundary).

        `committed_end`: frames before this offset are known committed, so any damage there
        is corruption. `tail=True` marks the active segment: past `committed_end`, an
        incomplete frame, zeros, or a bad frame with no valid frame after it end the
        iteration quietly ("not yet written"). Everything else raises `JournalCorrupt`.
        """
        if self.compressed:
            yield from self._compressed_frames(start_offset)
        else:
            yield from self._plain_frames(start_offset, committed_end, tail)

    def _plain_frames(
        self, start_offset: int, committed_end: int | None, tail: bool
    ) -> Iterator[tuple[FrameInfo, memoryview]]:
        buf = b""
        buf_start = start_offset
        at = 0
        last_position = self.base_position - 1
        eof = False
        while True:
            try:
                checked = _check_frame(buf, at)
            except _Bad as bad:
                offset = buf_start + at
                if self._unfinished_tail(offset, committed_end, tail, last_position):
                    if str(bad) != "zero":
                        self.torn_at = offset
                    return
                if tail and self._written_meanwhile(offset):
                    # A concurrent writer finished this frame after our chunk was read
                    # (and then wrote more): read on from here.
                    yield from self._plain_frames(offset, committed_end, tail)
                    return
                raise JournalCorrupt(self.name, offset, str(bad)) from None
            if checked is None:
                if eof:
                    offset = buf_start + at
                    if at == len(buf):
                        if committed_end is not None and offset < committed_end:
                            raise JournalCorrupt(self.name, offset, "segment ends early")
                        return
                    if self._unfinished_tail(offset, committed_end, tail, last_position):
                        self.torn_at = offset
                        return
                    if tail and self._written_meanwhile(offset):
                        yield from self._plain_frames(offset, committed_end, tail)
                        return
                    raise JournalCorrupt(self.name, offset, "frame is cut short")
                # Keep the unread part and read more; large frames get one exact read.
                want = _READ_CHUNK
                if len(buf) - at >= FRAME_HEADER_SIZE:
                    length = _FRAME_HEADER.unpack_from(buf, at)[1]
                    want = max(want, FRAME_HEADER_SIZE + length - (len(buf) - at))
                more = os.pread(self._fd, want, buf_start + len(buf))
                if len(more) < want:
                    eof = True
                buf = buf[at:] + more
                buf_start += at
                at = 0
                continue
            length, first, count = checked
            info = FrameInfo(self.base_position, buf_start + at, first, count, length)
            body_start = at + FRAME_HEADER_SIZE
            last_position = first + count - 1
            yield info, memoryview(buf)[body_start : body_start + length]
            at = body_start + length

    def read_frame(
        self, offset: int, committed_end: int | None = None
    ) -> tuple[FrameInfo, memoryview]:
        """The committed frame at `offset`; any damage there raises `JournalCorrupt`.

        `committed_end` (for the active segment) is where committed data ends now: bytes
        read ahead past it are not trusted later, because the frame there may still be cut
        off and rewritten. Sequential calls (each at the end of the previous frame) read
        ahead in 1 MiB chunks; a jump reads 64 KiB (or the frame's exact size).
        """
        checked = None
        at = 0
        for fresh in (False, True):
            at = offset - self._chunk_start
            if fresh or not (at >= 0 and offset + FRAME_HEADER_SIZE <= self._trusted_end):
                self._fill(offset, FRAME_HEADER_SIZE, committed_end)
                at = offset - self._chunk_start
            try:
                checked = _check_frame(self._chunk, at)
                if checked is None:
                    length = _FRAME_HEADER.unpack_from(self._chunk, at)[1]
                    self._fill(offset, FRAME_HEADER_SIZE + length, committed_end)
                    at = offset - self._chunk_start
                    checked = _check_frame(self._chunk, at)
            except (_Bad, struct.error) as bad:
                if fresh:
                    raise JournalCorrupt(self.name, offset, str(bad)) from None
                continue
            if checked is None:
                if fresh:
                    break
                continue
            if offset + FRAME_HEADER_SIZE + checked[0] > self._trusted_end and not fresh:
                # Cached bytes read before this frame was committed: read it again.
                checked = None
                continue
            break
        if checked is None:
            raise JournalCorrupt(self.name, offset, "frame is cut short")
        length, first, count = checked
        self._last_end = offset + FRAME_HEADER_SIZE + length
        body_start = at + FRAME_HEADER_SIZE
        info = FrameInfo(self.base_position, offset, first, count, length)
        return info, memoryview(self._chunk)[body_start : body_start + length]

    def _fill(self, offset: int, needed: int, committed_end: int | None = None) -> None:
        if self.compressed:
            block = self._block_containing(offset)
            if block is None:
                raise JournalCorrupt(self.name, offset, "no compressed block holds this offset")
            self._chunk = self._decompress(*block)
            self._chunk_start = block[0]
            self._trusted_end = block[0] + len(self._chunk)
            return
        size = _READ_CHUNK if offset == self._last_end else 64 << 10
        self._chunk = os.pread(self._fd, max(size, needed), offset)
        self._chunk_start = offset
        end = offset + len(self._chunk)
        self._trusted_end = end if committed_end is None else min(end, committed_end)

    def _block_containing(self, offset: int) -> tuple[int, int, int, int] | None:
        blocks = self.block_table()
        at = _block_index(blocks, offset)
        if at < 0:
            return None
        block = blocks[at]
        return block if offset < block[0] + block[1] else None

    def _unfinished_tail(
        self, offset: int, committed_end: int | None, tail: bool, last_position: int
    ) -> bool:
        """Whether bad bytes at `offset` are the not-yet-written tail rather than damage."""
        if not tail or (committed_end is not None and offset < committed_end):
            return False
        return not self._data_after(offset, last_position)

    def _written_meanwhile(self, offset: int) -> bool:
        """Whether a valid frame is at `offset` now. Called after a valid frame was found
        beyond it: one writer writes frames in order, so if the later one is visible and
        this one still is not valid, this one is damaged, not unfinished."""
        header = os.pread(self._fd, FRAME_HEADER_SIZE, offset)
        if len(header) < FRAME_HEADER_SIZE or header[:4] != FRAME_MAGIC:
            return False
        length = _FRAME_HEADER.unpack(header)[1]
        if length > MAX_FRAME_BODY:
            return False
        raw = header + os.pread(self._fd, length, offset + FRAME_HEADER_SIZE)
        try:
            return _check_frame(raw, 0) is not None
        except _Bad:
            return False

    def _data_after(self, offset: int, last_position: int) -> bool:
        """Whether a valid frame exists after `offset` (so damage there is not a torn tail)."""
        size = self.file_size()
        rest = os.pread(self._fd, max(0, size - offset - 1), offset + 1)
        return _valid_frame_after(rest, 0, last_position)

    def block_table(self) -> list[tuple[int, int, int, int]]:
        """(uncompressed offset, uncompressed length, file offset, compressed length),
        from the file's own footer (so it always matches this very file)."""
        if self._blocks is None:
            self._blocks = self._footer_blocks()
        return self._blocks

    def _footer_blocks(self) -> list[tuple[int, int, int, int]]:
        size = self.file_size()
        trailer_at = size - _FOOTER_TRAILER.size
        if trailer_at < SEGMENT_HEADER_SIZE + _FOOTER_HEADER.size:
            raise JournalCorrupt(self.name, max(trailer_at, 0), "block table footer is missing")
        (footer_at,) = _FOOTER_TRAILER.unpack(os.pread(self._fd, _FOOTER_TRAILER.size, trailer_at))
        if not SEGMENT_HEADER_SIZE <= footer_at <= trailer_at - _FOOTER_HEADER.size:
            raise JournalCorrupt(self.name, trailer_at, "block table footer offset is damaged")
        raw = os.pread(self._fd, trailer_at - footer_at, footer_at)
        magic, length, crc = _FOOTER_HEADER.unpack_from(raw)
        table = raw[_FOOTER_HEADER.size :]
        if magic != FOOTER_MAGIC or len(table) != length or zlib.crc32(table) != crc:
            raise JournalCorrupt(self.name, footer_at, "block table footer does not verify")
        try:
            blocks = msgspec.msgpack.decode(table, type=list[tuple[int, int, int, int]])
        except msgspec.DecodeError:
            raise JournalCorrupt(self.name, footer_at, "block table is undecodable") from None
        return blocks

    def _decompress(self, uoffset: int, ulength: int, coffset: int, clength: int) -> bytes:
        raw = os.pread(self._fd, _BLOCK_HEADER.size + clength, coffset)
        if len(raw) != _BLOCK_HEADER.size + clength:
            raise JournalCorrupt(self.name, coffset, "compressed block is cut short")
        magic, u2, l2, c2, crc = _BLOCK_HEADER.unpack_from(raw)
        payload = memoryview(raw)[_BLOCK_HEADER.size :]
        if (magic, u2, l2, c2) != (BLOCK_MAGIC, uoffset, ulength, clength) or zlib.crc32(
            payload
        ) != crc:
            raise JournalCorrupt(self.name, coffset, "compressed block header or checksum mismatch")
        if ulength > MAX_BLOCK_BYTES:
            raise JournalCorrupt(self.name, coffset, "compressed block claims to be huge")
        try:
            # The output cap keeps a damaged or hostile block from expanding without bound.
            block = _DECOMPRESSOR.decompress(payload, max_output_size=ulength)
        except zstandard.ZstdError as e:
            raise JournalCorrupt(self.name, coffset, f"zstd: {e}") from None
        if len(block) != ulength:
            raise JournalCorrupt(self.name, coffset, "compressed block has the wrong size")
        return block

    def _compressed_frames(self, start_offset: int) -> Iterator[tuple[FrameInfo, memoryview]]:
        blocks = self.block_table()
        for uoffset, ulength, coffset, clength in blocks[
            max(_block_index(blocks, start_offset), 0) :
        ]:
            block = self._decompress(uoffset, ulength, coffset, clength)
            at = 0
            while at < ulength:
                offset = uoffset + at
                try:
                    checked = _check_frame(block, at)
                except _Bad as bad:
                    raise JournalCorrupt(self.name, offset, str(bad)) from None
                if checked is None:
                    raise JournalCorrupt(self.name, offset, "frame is cut short in its block")
                length, first, count = checked
                body_start = at + FRAME_HEADER_SIZE
                if offset >= start_offset:
                    info = FrameInfo(self.base_position, offset, first, count, length)
                    yield info, memoryview(block)[body_start : body_start + length]
                at = body_start + length


class ReaderCache:
    """The segment readers one reader of pages keeps open: a single `read()`, or a
    follower across all its pages (so read-ahead survives from page to page).

    Context-managed: leaving it closes every reader. A page is bracketed by
    `begin_page()`, which drops readers whose file was deleted or replaced meanwhile
    (retention, compaction: their disk space is freed), and `end_page()`, which closes
    the readers that page did not use (segments behind the reader's position)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._readers: dict[int, SegmentReader] = {}
        self._used: set[int] = set()

    def __enter__(self) -> ReaderCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self._readers)

    def get(self, segment: int) -> SegmentReader:
        """The open reader of `segment` (opened now if needed)."""
        self._used.add(segment)
        reader = self._readers.get(segment)
        if reader is None:
            reader = self._readers[segment] = SegmentReader(self.directory, segment)
        return reader

    def begin_page(self) -> None:
        self._used.clear()
        for segment, reader in list(self._readers.items()):
            if reader.unlinked():
                reader.close()
                del self._readers[segment]

    def end_page(self) -> None:
        for segment in [s for s in self._readers if s not in self._used]:
            self._readers.pop(segment).close()

    def close(self) -> None:
        readers, self._readers = self._readers, {}
        for reader in readers.values():
            reader.close()


class _SummaryBuilder:
    """Accumulates a segment's sidecar frame by frame."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, int, int]] = []
        self.sessions: dict[int, list[tuple[int, int, int]]] = {}
        self.event_runs: list[tuple[int, int, int, int, int, int, int]] = []
        self.others: list[tuple[int, int, bytes]] = []

    def add(self, offset: int, first_position: int, count: int, digest: FrameDigest) -> None:
        self.frames.append((offset, first_position, count))
        for incarnation, (first, last) in digest.sessions.items():
            self.sessions.setdefault(incarnation, []).append((first, last, offset))
        for index, incarnation, first, n, size, at in digest.event_runs:
            self.event_runs.append(
                (first_position + index, incarnation, first, n, offset, size, at)
            )
        for index, encoded in digest.others:
            self.others.append((first_position + index, offset, encoded))

    def build(self, base: int, last_position: int, data_end: int) -> SegmentSummary:
        return SegmentSummary(
            SUMMARY_FORMAT,
            base,
            last_position,
            data_end,
            list(self.frames),
            {k: list(v) for k, v in self.sessions.items()},
            [],
            list(self.event_runs),
            list(self.others),
        )


class SegmentWriter:
    """The active segment: appends frames at the end and syncs them.

    Not thread-safe and not process-safe by itself: the caller serialises writers (the
    journal holds its cross-process write lock around every append).
    """

    def __init__(
        self,
        directory: str,
        base_position: int,
        *,
        sync: bool = True,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    ) -> None:
        self.directory = directory
        self.base_position = base_position
        self.name = segment_name(base_position)
        self.sync_enabled = sync
        self.segment_bytes = segment_bytes
        self._fd = os.open(os.path.join(directory, self.name), os.O_RDWR)
        self.end_offset = SEGMENT_HEADER_SIZE
        self.next_position = base_position
        self.frame_count = 0
        self._allocated = os.fstat(self._fd).st_size
        # The sidecar, built as frames are appended so sealing needs no rescan. None when
        # this writer did not see every frame of the segment (then sealing scans it).
        self._summary_valid = False
        self._summary = _SummaryBuilder()

    @classmethod
    def create(
        cls,
        directory: str,
        store_id: bytes,
        base_position: int,
        *,
        sync: bool = True,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    ) -> SegmentWriter:
        """Create a new, empty active segment (file and directory entry synced)."""
        header = SegmentHeader(FORMAT_VERSION, 0, store_id, base_position, int(time.time() * 1000))
        path = os.path.join(directory, segment_name(base_position))
        # Born complete: the header is written and synced under a temporary name, then
        # renamed, so a crash never leaves a segment without its header.
        temporary = f"{path}.{os.getpid()}.tmp"
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, header.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if os.path.exists(path):
            os.unlink(temporary)
            raise FileExistsError(f"segment {segment_name(base_position)} already exists")
        os.rename(temporary, path)
        _fsync_dir(directory)
        writer = cls(directory, base_position, sync=sync, segment_bytes=segment_bytes)
        writer._summary_valid = True
        return writer

    def recover(self, store_id: bytes | None = None) -> list[FrameInfo]:
        """Find the committed frames, cut off a torn tail, and position for appends.

        Returns every valid frame in the segment. Damage followed by valid frames raises
        `JournalCorrupt` (committed data must never be cut off).
        """
        with SegmentReader(self.directory, self.base_position) as reader:
            if store_id is not None and reader.header.store_id != store_id:
                raise StoreIncompatible(
                    f"segment {self.name} belongs to another store; "
                    "do not mix segment files of different stores"
                )
            frames = [info for info, _ in reader.frames(tail=True)]
        end = frames[-1].end_offset if frames else SEGMENT_HEADER_SIZE
        self.end_offset = end
        self.next_position = frames[-1].last_position + 1 if frames else self.base_position
        self.frame_count = len(frames)
        size = os.fstat(self._fd).st_size
        if size > end:
            tail = os.pread(self._fd, size - end, end)
            if tail.strip(b"\0"):
                # A torn write: clear it so no later reader mistakes it for data.
                os.ftruncate(self._fd, end)
                os.fsync(self._fd)
                self._allocated = end
            else:
                self._allocated = size
        return frames

    def attach(self, end_offset: int, next_position: int) -> None:
        """Continue after the committed frames ending at `end_offset` (known from the view).

        Bytes past `end_offset` that are not zeros are a crashed writer's torn frame: they
        are cut off (the caller holds the write lock, so nobody is writing them now).
        """
        if (end_offset, next_position) != (self.end_offset, self.next_position):
            self._summary_valid = False
        self.end_offset = end_offset
        self.next_position = next_position
        self.frame_count = 1 if end_offset > SEGMENT_HEADER_SIZE else 0
        size = os.fstat(self._fd).st_size
        self._allocated = size
        if size > end_offset:
            probe = os.pread(self._fd, FRAME_HEADER_SIZE, end_offset)
            if probe.strip(b"\0"):
                os.ftruncate(self._fd, end_offset)
                os.fsync(self._fd)
                self._allocated = end_offset

    def append(
        self,
        body: bytes,
        first_position: int,
        count: int,
        digest: FrameDigest | None = None,
    ) -> FrameInfo:
        """Write one frame at the end; durable after `sync()` (or now if sync is on).

        `digest` (what the frame holds) feeds the sidecar kept in memory; without it the
        segment is rescanned when sealed.
        """
        if first_position != self.next_position:
            raise ValueError(
                f"frame starts at position {first_position}, expected {self.next_position}"
            )
        frame = encode_frame(body, first_position, count)
        offset = self.end_offset
        end = offset + len(frame)
        if end > self._allocated:
            self._preallocate(end)
        written = os.pwrite(self._fd, frame, offset)
        if written != len(frame):
            raise OSError(f"short write to {self.name}: {written} of {len(frame)} bytes")
        self.end_offset = end
        self.next_position = first_position + count
        self.frame_count += 1
        if digest is None:
            self._summary_valid = False
        elif self._summary_valid:
            self._summary.add(offset, first_position, count, digest)
        if self.sync_enabled:
            os.fdatasync(self._fd)
        return FrameInfo(self.base_position, offset, first_position, count, len(body))

    def summary(self) -> SegmentSummary | None:
        """The sidecar of this segment as written so far, if this writer saw every frame."""
        if not self._summary_valid:
            return None
        return self._summary.build(self.base_position, self.next_position - 1, self.end_offset)

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def fileno(self) -> int:
        return self._fd

    def _preallocate(self, needed: int) -> None:
        # Never past what the segment may still hold: a small-segment store must not carry
        # megabytes of zeros per active segment (a frame larger than the rest still fits).
        target = max(needed, min(needed + _PREALLOCATE_BYTES, self.segment_bytes))
        # Never below the real size: another process may have written up to it.
        at = max(self._allocated, os.fstat(self._fd).st_size, self.end_offset)
        while at < target:
            n = min(len(_ZEROS), target - at)
            os.pwrite(self._fd, _ZEROS[:n], at)
            at += n
        self._allocated = target

    def finish(self) -> None:
        """Cut the preallocated zeros and sync: the segment is about to be sealed."""
        os.ftruncate(self._fd, self.end_offset)
        os.fsync(self._fd)
        self._allocated = self.end_offset

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def summarize_segment(directory: str, base_position: int) -> SegmentSummary:
    """Scan a sealed segment and build its sidecar index (verifying every frame)."""
    builder = _SummaryBuilder()
    last_position = base_position - 1
    data_end = SEGMENT_HEADER_SIZE
    with SegmentReader(directory, base_position) as reader:
        for info, body in reader.frames():
            builder.add(
                info.offset, info.first_position, info.count, _digest(reader.name, info, body)
            )
            last_position = info.last_position
            data_end = info.end_offset
        blocks = reader.block_table() if reader.compressed else []
    summary = builder.build(base_position, last_position, data_end)
    summary.blocks = blocks
    return summary


def compress_segment(
    directory: str,
    base_position: int,
    *,
    level: int = 3,
    keep: Callable[[FrameInfo], bool] | None = None,
    publish: bool = True,
) -> tuple[str, SegmentSummary]:
    """Write a compressed copy of a sealed segment; returns its path and its sidecar.

    Blocks hold whole frames that are contiguous in the original (about 1 MiB of them, or
    one larger frame), each an independent zstd frame behind a checksummed block header,
    so a read decompresses only its blocks. Frames keep their original (uncompressed)
    offsets, so every index entry stays valid. `keep` selects the frames to copy (the
    others are dropped: compaction); a dropped frame leaves a gap no block covers. A footer
    holds the block table. With `publish`, the copy is renamed to `<base>.seg.zst` (the
    plain file is left for the caller to remove); otherwise the temporary path is returned.
    """
    blocks: list[tuple[int, int, int, int]] = []
    builder = _SummaryBuilder()
    final = os.path.join(directory, segment_name(base_position, compressed=True))
    temporary = f"{final}.{os.getpid()}.tmp"
    compressor = zstandard.ZstdCompressor(level=level)
    data_end = SEGMENT_HEADER_SIZE
    last_position = base_position - 1
    with SegmentReader(directory, base_position) as reader, open(temporary, "wb") as out:
        flags = reader.header.flags | FLAG_COMPRESSED | (FLAG_COMPACTED if keep else 0)
        out.write(reader.header._replace(flags=flags).encode())
        file_offset = SEGMENT_HEADER_SIZE
        pending: list[bytes] = []
        pending_start = SEGMENT_HEADER_SIZE
        pending_end = SEGMENT_HEADER_SIZE
        pending_size = 0

        def flush() -> None:
            nonlocal file_offset, pending, pending_size
            raw = b"".join(pending)
            packed = compressor.compress(raw)
            out.write(
                _BLOCK_HEADER.pack(
                    BLOCK_MAGIC, pending_start, len(raw), len(packed), zlib.crc32(packed)
                )
            )
            out.write(packed)
            blocks.append((pending_start, len(raw), file_offset, len(packed)))
            file_offset += _BLOCK_HEADER.size + len(packed)
            pending = []
            pending_size = 0

        for info, body in reader.frames():
            if keep is not None and not keep(info):
                continue
            size = FRAME_HEADER_SIZE + info.body_length
            if pending and (pending_size + size > BLOCK_TARGET_BYTES or info.offset != pending_end):
                flush()
            if not pending:
                pending_start = info.offset
            pending.append(encode_frame(bytes(body), info.first_position, info.count))
            pending_size += size
            pending_end = info.end_offset
            builder.add(
                info.offset, info.first_position, info.count, _digest(reader.name, info, body)
            )
            data_end = info.end_offset
            last_position = info.last_position
        if pending:
            flush()
        table = _summary_encoder.encode(blocks)
        footer_at = file_offset
        out.write(_FOOTER_HEADER.pack(FOOTER_MAGIC, len(table), zlib.crc32(table)))
        out.write(table)
        out.write(_FOOTER_TRAILER.pack(footer_at))
        out.flush()
        os.fsync(out.fileno())
    summary = builder.build(base_position, last_position, data_end)
    summary.blocks = blocks
    if not publish:
        return temporary, summary
    os.replace(temporary, final)
    _fsync_dir(directory)
    return final, summary


def _digest(name: str, info: FrameInfo, body: memoryview) -> FrameDigest:
    try:
        records = decode_frame_body(body)
    except msgspec.DecodeError as e:
        raise JournalCorrupt(name, info.offset, f"undecodable frame: {e}") from None
    return digest_records(records)


@dataclass
class _Segment:
    base_position: int
    compressed: bool


class SegmentLog:
    """The segments directory: ordered segments, the active writer, rotation and sealing.

    Positions are store-wide and dense: each frame's first position is the previous frame's
    last position + 1, across segment boundaries.
    """

    def __init__(
        self,
        directory: str,
        store_id: bytes,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        sync: bool = True,
        compress_sealed: bool = False,
    ) -> None:
        if segment_bytes < 4096:
            raise ValueError("segment_bytes must be at least 4096")
        self.directory = directory
        self.store_id = store_id
        self.segment_bytes = segment_bytes
        self.sync = sync
        self.compress_sealed = compress_sealed
        self._writer: SegmentWriter | None = None

    # -- discovery ---------------------------------------------------------------------

    def segments(self) -> list[_Segment]:
        """Every segment in base order (a base present in both forms counts once)."""
        found: dict[int, bool] = {}
        for name in os.listdir(self.directory):
            if name.endswith(COMPRESSED_SUFFIX) and name[:20].isdigit() and len(name) == 28:
                found[int(name[:20])] = True
            elif name.endswith(SEGMENT_SUFFIX) and name[:20].isdigit() and len(name) == 24:
                found.setdefault(int(name[:20]), False)
        return [_Segment(base, found[base]) for base in sorted(found)]

    def bases(self) -> list[int]:
        return [s.base_position for s in self.segments()]

    @contextlib.contextmanager
    def files_lock(self) -> Iterator[None]:
        """Serialises replacing and deleting sealed segment files across processes.

        Deletion happens after the writer's transaction commits (outside the LMDB lock),
        a compaction swap under it: this flock keeps the two from interleaving."""
        fd = os.open(os.path.join(self.directory, ".files.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def finish_interrupted(self) -> None:
        """Clean up after a writer that crashed mid-seal or mid-write (caller holds the
        write lock): delete temporary files of processes that are gone, a plain segment
        beside its complete `.zst` (a `.zst` is only renamed into place once complete),
        and write missing sidecars of sealed segments."""
        for name in os.listdir(self.directory):
            if not name.endswith(".tmp"):
                continue
            parts = name.split(".")
            pid = int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None
            if pid is not None and _process_alive(pid):
                continue  # a live writer (e.g. a compaction) is still producing it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, name))
        segments = self.segments()
        for s in segments:
            plain = os.path.join(self.directory, segment_name(s.base_position))
            if s.compressed and os.path.exists(plain):
                os.unlink(plain)
        for s in segments[:-1]:
            if read_summary(self.directory, s.base_position) is None:
                write_summary(self.directory, summarize_segment(self.directory, s.base_position))
        _fsync_dir(self.directory)

    def moved_past(self, segment: int, end_offset: int, next_position: int, fd: int = -1) -> bool:
        """Whether frames or segments exist past `end_offset` of `segment` (a 24-byte probe
        of that segment, through `fd` when the caller has it open)."""
        own = fd < 0
        if own:
            try:
                fd = os.open(os.path.join(self.directory, segment_name(segment)), os.O_RDONLY)
            except FileNotFoundError:
                return True  # sealed and compressed since: a newer segment exists
        try:
            probe = os.pread(fd, FRAME_HEADER_SIZE, end_offset)
        finally:
            if own:
                os.close(fd)
        if probe.strip(b"\0"):
            return True
        if len(probe) == FRAME_HEADER_SIZE:
            # Preallocated zeros follow: nobody appended, and nobody sealed this segment
            # (sealing truncates the zeros first).
            return False
        return os.path.exists(os.path.join(self.directory, segment_name(next_position)))

    def discard_unborn_tail(self) -> None:
        """Delete a newest plain segment shorter than its header: a creation interrupted
        by a crash (stores written before segments were born by rename). Caller holds the
        write lock."""
        segments = self.segments()
        if not segments or segments[-1].compressed:
            return
        path = os.path.join(self.directory, segment_name(segments[-1].base_position))
        if os.path.getsize(path) < SEGMENT_HEADER_SIZE:
            os.unlink(path)
            _fsync_dir(self.directory)

    # -- writing -----------------------------------------------------------------------

    def open_writer(self) -> list[FrameInfo]:
        """Open (or create) the active segment, recover its tail, finish interrupted seals.

        Returns the frames of the active segment (the part a crash may have left unindexed).
        """
        os.makedirs(self.directory, exist_ok=True)
        self.discard_unborn_tail()
        self.finish_interrupted()
        segments = self.segments()
        if not segments:
            self._writer = SegmentWriter.create(
                self.directory, self.store_id, 1, sync=self.sync, segment_bytes=self.segment_bytes
            )
            return []
        active = segments[-1]
        if active.compressed:
            # Sealed and compressed, but the next segment was never created: start it.
            summary = read_summary(self.directory, active.base_position) or summarize_segment(
                self.directory, active.base_position
            )
            self._writer = SegmentWriter.create(
                self.directory,
                self.store_id,
                summary.last_position + 1,
                sync=self.sync,
                segment_bytes=self.segment_bytes,
            )
            return []
        self._writer = SegmentWriter(
            self.directory, active.base_position, sync=self.sync, segment_bytes=self.segment_bytes
        )
        return self._writer.recover(self.store_id)

    def start_first_segment(self) -> None:
        """Create the first segment of an empty log (caller holds the write lock)."""
        os.makedirs(self.directory, exist_ok=True)
        self.close()
        self._writer = SegmentWriter.create(
            self.directory, self.store_id, 1, sync=self.sync, segment_bytes=self.segment_bytes
        )

    def writer_at(self, segment: int, end_offset: int, next_position: int) -> bool:
        """Whether this process's writer sits exactly at the given end of the log and
        nobody (another process, a crashed writer) wrote or rotated past it since."""
        writer = self._writer
        return (
            writer is not None
            and writer.base_position == segment
            and writer.end_offset == end_offset
            and writer.next_position == next_position
            and not self.moved_past(segment, end_offset, next_position, writer.fileno())
        )

    def attach_writer(self, segment: int, end_offset: int, next_position: int) -> None:
        """Position the writer after the committed frames ending at `end_offset` of
        `segment` (known from the view), opening that segment if it is not the open one."""
        writer = self._writer
        if writer is None or writer.base_position != segment:
            if writer is not None:
                writer.close()
            self._writer = writer = SegmentWriter(
                self.directory, segment, sync=self.sync, segment_bytes=self.segment_bytes
            )
        writer.attach(end_offset, next_position)

    @property
    def writer(self) -> SegmentWriter:
        if self._writer is None:
            raise RuntimeError("the segment log is not open for writing; call open_writer()")
        return self._writer

    @property
    def next_position(self) -> int:
        return self.writer.next_position

    def append(self, body: bytes, count: int, digest: FrameDigest | None = None) -> FrameInfo:
        """Append one frame of `count` records, rotating first if the segment is full."""
        writer = self.writer
        if (
            writer.frame_count
            and writer.end_offset + FRAME_HEADER_SIZE + len(body) > self.segment_bytes
        ):
            self.rotate()
            writer = self.writer
        return writer.append(body, writer.next_position, count, digest)

    def rotate(self) -> int:
        """Seal the active segment and start a new one; returns the sealed segment's base."""
        writer = self.writer
        sealed = writer.base_position
        writer.finish()
        next_position = writer.next_position
        known = writer.summary()
        writer.close()
        self._writer = SegmentWriter.create(
            self.directory,
            self.store_id,
            next_position,
            sync=self.sync,
            segment_bytes=self.segment_bytes,
        )
        self.seal(sealed, known)
        return sealed

    def seal(self, base_position: int, known: SegmentSummary | None = None) -> SegmentSummary:
        """Write the sidecar of a sealed segment (compressing it first if configured).

        `known` is the writer's in-memory summary; without it the segment is scanned.
        """
        summary = known if known is not None else summarize_segment(self.directory, base_position)
        if self.compress_sealed:
            _, compressed = compress_segment(self.directory, base_position)
            summary.blocks = compressed.blocks
        write_summary(self.directory, summary)
        if self.compress_sealed:
            os.unlink(os.path.join(self.directory, segment_name(base_position)))
            _fsync_dir(self.directory)
        return summary

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # -- reading -----------------------------------------------------------------------

    def summary(self, base_position: int) -> SegmentSummary | None:
        return read_summary(self.directory, base_position)

    def frames(
        self, from_position: int = 1, *, bases: Sequence[int] | None = None
    ) -> Iterator[tuple[FrameInfo, memoryview]]:
        """Every frame holding positions >= `from_position`, in order, across segments.

        The highest segment is read as the active one (its unfinished tail ends the
        iteration); every other segment must verify completely.
        """
        all_bases = list(bases) if bases is not None else self.bases()
        start = 0
        for i, base in enumerate(all_bases):
            if base <= from_position:
                start = i
        for i in range(start, len(all_bases)):
            base = all_bases[i]
            active = i == len(all_bases) - 1
            offset = SEGMENT_HEADER_SIZE
            if not active and base <= from_position:
                summary = read_summary(self.directory, base)
                if summary is not None:
                    offset = summary.frame_at_or_before(from_position)
            with SegmentReader(self.directory, base) as reader:
                for info, body in reader.frames(offset, tail=active):
                    if info.last_position >= from_position:
                        yield info, body
