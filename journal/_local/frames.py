"""Segment file formats: the segment header, frames (one committed batch each), and the
zstd block and footer layout of compressed segments. Pure encoding, decoding (a zstd
block, the frame check's CRC32) and checking; reading and writing files is `segments`.
Byte formats are in SPEC.md ("Segment files").
"""

from __future__ import annotations

import bisect
import struct
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import zstandard

from ..checksums import fast_crc32
from ..errors import JournalCorrupt, StoreIncompatible

# Frame bodies, when written (`encode_frame`) and checked (`check_frame`), and sidecars
# (one per sealed segment, checked at every writer's open); everything else (headers,
# blocks, view values: small inputs) uses zlib.
frame_crc32: Final = fast_crc32()

__all__ = [
    "BLOCK_HEADER",
    "BLOCK_MAGIC",
    "BLOCK_TARGET_BYTES",
    "COMPRESSED_SUFFIX",
    "DEFAULT_SEGMENT_BYTES",
    "FLAG_COMPACTED",
    "FLAG_COMPRESSED",
    "FOOTER_HEADER",
    "FOOTER_MAGIC",
    "FOOTER_TRAILER",
    "FORMAT_VERSION",
    "FRAME_HEADER",
    "FRAME_HEADER_SIZE",
    "FRAME_MAGIC",
    "MAX_BLOCK_BYTES",
    "MAX_FRAME_BODY",
    "SEGMENT_HEADER_SIZE",
    "SEGMENT_SUFFIX",
    "SIDECAR_SUFFIX",
    "BadFrame",
    "FrameInfo",
    "SegmentHeader",
    "block_index",
    "block_table_problem",
    "check_frame",
    "decompress_block",
    "encode_frame",
    "fast_crc32",
    "frame_crc32",
    "seal_frame",
    "segment_name",
    "sidecar_name",
    "valid_frame_after",
]

FORMAT_VERSION: Final = 1
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
FRAME_HEADER: Final = struct.Struct(">4sIIQI")
FRAME_HEADER_SIZE: Final = FRAME_HEADER.size
_FRAME_ZERO: Final = bytes(FRAME_HEADER_SIZE)
# The CRC covers body length, first position and count (header bytes 4..8 and 12..24) and body.
_CRC_FIELDS: Final = struct.Struct(">IQI")
MAX_FRAME_BODY: Final = 1 << 30

BLOCK_MAGIC: Final = b"SJBK"
# magic, uncompressed offset, uncompressed length, compressed length, crc32 of compressed bytes
BLOCK_HEADER: Final = struct.Struct(">4sQIII")
BLOCK_TARGET_BYTES: Final = 1 << 20
MAX_BLOCK_BYTES: Final = MAX_FRAME_BODY + FRAME_HEADER_SIZE

FOOTER_MAGIC: Final = b"SJBT"
# footer: magic, table length, crc32 of the table; then the table (msgpack list of blocks);
# then the trailer: u64 file offset of the footer
FOOTER_HEADER: Final = struct.Struct(">4sII")
FOOTER_TRAILER: Final = struct.Struct(">Q")


# One decompression context per thread: python-zstandard does not allow one instance to
# be used by several threads at once (it releases the GIL while it works).
_DECOMPRESSORS: Final = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    decompressor: zstandard.ZstdDecompressor | None = getattr(_DECOMPRESSORS, "d", None)
    if decompressor is None:
        decompressor = _DECOMPRESSORS.d = zstandard.ZstdDecompressor()
    return decompressor


# Blocks up to this size are decompressed in one call, whose output buffer is allocated
# up front at the block's claimed size; larger ones (a single large frame) are streamed,
# so a damaged block claiming a huge size fails before that much memory is taken.
_ONE_SHOT_BLOCK_BYTES: Final = 2 * BLOCK_TARGET_BYTES


def decompress_block(payload: memoryview, ulength: int) -> bytes:
    """The block's bytes: at most `ulength + 1` of them (the caller checks the size)."""
    if ulength <= _ONE_SHOT_BLOCK_BYTES:
        return _decompressor().decompress(payload, max_output_size=ulength)
    parts: list[bytes] = []
    produced = 0
    with _decompressor().stream_reader(payload) as stream:
        while produced <= ulength:
            part = stream.read(min(BLOCK_TARGET_BYTES, ulength + 1 - produced))
            if not part:
                break
            parts.append(part)
            produced += len(part)
    return b"".join(parts)


def segment_name(base_position: int, *, compressed: bool = False) -> str:
    """The file name of the segment whose first position is `base_position`."""
    return f"{base_position:020d}{COMPRESSED_SUFFIX if compressed else SEGMENT_SUFFIX}"


def sidecar_name(base_position: int) -> str:
    return f"{base_position:020d}{SIDECAR_SUFFIX}"


def block_index(blocks: Sequence[tuple[int, int, int, int]], offset: int) -> int:
    """Index of the last block starting at or before `offset` (-1 if none)."""
    return bisect.bisect_right(blocks, offset, key=lambda block: block[0]) - 1


def block_table_problem(blocks: list[tuple[int, int, int, int]], footer_at: int) -> str:
    """What is wrong with a decoded block table ("" if nothing): every block must lie
    between the header and the footer, in file order, and cover increasing, disjoint
    uncompressed ranges of at most `MAX_BLOCK_BYTES`, so no read trusts a length the file
    cannot hold."""
    uncompressed_end = SEGMENT_HEADER_SIZE
    file_end = SEGMENT_HEADER_SIZE
    for uoffset, ulength, coffset, clength in blocks:
        if uoffset < uncompressed_end or not 0 < ulength <= MAX_BLOCK_BYTES:
            return f"uncompressed range {uoffset}+{ulength} is out of order or implausible"
        if coffset < file_end or clength < 0 or coffset + BLOCK_HEADER.size + clength > footer_at:
            return f"block at byte {coffset} ({clength} bytes) lies outside the block area"
        uncompressed_end = uoffset + ulength
        file_end = coffset + BLOCK_HEADER.size + clength
    return ""


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
    crc = _frame_crc(body, len(body), first_position, count)
    return FRAME_HEADER.pack(FRAME_MAGIC, len(body), crc, first_position, count) + body


def seal_frame(frame: bytearray, first_position: int, count: int) -> None:
    """Fill in the header of the frame in `frame`: its body follows `FRAME_HEADER_SIZE`
    bytes of room (the writer encodes records straight after them, so the body is never
    copied to put a header in front of it)."""
    length = len(frame) - FRAME_HEADER_SIZE
    if length > MAX_FRAME_BODY:
        raise ValueError(f"frame body of {length} bytes exceeds the {MAX_FRAME_BODY} limit")
    # (The view is released at once: the writer's next encode resizes the buffer.)
    with memoryview(frame)[FRAME_HEADER_SIZE:] as body:
        crc = _frame_crc(body, length, first_position, count)
    FRAME_HEADER.pack_into(frame, 0, FRAME_MAGIC, length, crc, first_position, count)


class BadFrame(Exception):
    """Internal: the bytes at an offset are not a valid frame (why in args[0])."""


def check_frame(buf: bytes | memoryview, at: int) -> tuple[int, int, int] | None:
    """Validate the frame at `buf[at:]`; return (body_length, first_position, count).

    Returns None when the buffer ends before the frame does (incomplete), raises `BadFrame`
    when the bytes there are not a frame. An all-zero header is reported as `BadFrame("zero")`.
    """
    if len(buf) - at < FRAME_HEADER_SIZE:
        return None
    magic, length, crc, first, count = FRAME_HEADER.unpack_from(buf, at)
    if magic != FRAME_MAGIC:
        if bytes(buf[at : at + FRAME_HEADER_SIZE]) == _FRAME_ZERO:
            raise BadFrame("zero")
        raise BadFrame("bad frame magic")
    if length > MAX_FRAME_BODY or count == 0 or first + count > _POSITION_LIMIT:
        raise BadFrame("implausible frame header")
    end = at + FRAME_HEADER_SIZE + length
    if len(buf) < end:
        return None
    if not _crc_matches(buf, at, length, first, count, crc):
        raise BadFrame("frame checksum mismatch")
    return length, first, count


# Positions stay below 2^63 (the sidecar and the view keep them as signed 64-bit values):
# a frame claiming more is damage, whatever its checksum says.
_POSITION_LIMIT: Final = 1 << 63


def _crc_matches(
    buf: bytes | memoryview, at: int, length: int, first: int, count: int, crc: int
) -> bool:
    # A view, not a slice: checking a frame never copies its body.
    body = memoryview(buf)[at + FRAME_HEADER_SIZE : at + FRAME_HEADER_SIZE + length]
    return _frame_crc(body, length, first, count) == crc


def _frame_crc(body: bytes | memoryview, length: int, first: int, count: int) -> int:
    """A frame's CRC32: over its length, first position and count fields, then its body."""
    return frame_crc32(body, frame_crc32(_CRC_FIELDS.pack(length, first, count), 0))


# How many body bytes `valid_frame_after` checksums at most, per byte of its buffer (plus
# a constant): frame-like bytes whose claimed bodies overlap would otherwise make the
# search quadratic (a 4 MiB tail of such bytes took minutes).
_SEARCH_CRC_BUDGET_PER_BYTE: Final = 8
_SEARCH_CRC_BUDGET_BASE: Final = 64 << 20


def valid_frame_after(buf: bytes, start: int, after_position: int) -> bool:
    """True when some valid frame holding positions above `after_position` starts in buf.

    Also True when the bytes hold so many frame-like candidates that checking them all
    would exceed a checksum budget linear in the buffer: such bytes are damage, never a
    torn write (which is one unfinished frame followed by zeros), so the caller reports
    corruption instead of cutting them off.
    """
    budget = _SEARCH_CRC_BUDGET_BASE + _SEARCH_CRC_BUDGET_PER_BYTE * len(buf)
    at = buf.find(FRAME_MAGIC, start)
    while at != -1:
        if len(buf) - at >= FRAME_HEADER_SIZE:
            _, length, crc, first, count = FRAME_HEADER.unpack_from(buf, at)
            end = at + FRAME_HEADER_SIZE + length
            if first > after_position and count and length <= MAX_FRAME_BODY and end <= len(buf):
                budget -= length
                if budget < 0:
                    return True
                if _crc_matches(buf, at, length, first, count, crc):
                    return True
        at = buf.find(FRAME_MAGIC, at + 1)
    return False
