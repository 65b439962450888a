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
- An all-zero frame header is the end of the data (the active segment is preallocated with
  zeros ahead of its last frame; `writer.py` writes them).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

import msgspec
import zstandard

from ..errors import JournalCorrupt
from ..records import decode_frame_body
from .files import (
    DEFAULT_FILE_OPS,
    FileOps,
    NotRegularFile,
    open_regular,
)
from .frames import (
    BLOCK_HEADER,
    BLOCK_MAGIC,
    FLAG_COMPRESSED,
    FOOTER_HEADER,
    FOOTER_MAGIC,
    FOOTER_TRAILER,
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    FRAME_MAGIC,
    MAX_BLOCK_BYTES,
    MAX_FRAME_BODY,
    SEGMENT_HEADER_SIZE,
    BadFrame,
    FrameInfo,
    SegmentHeader,
    block_index,
    block_table_problem,
    check_frame,
    decompress_block,
    segment_name,
    valid_frame_after,
)
from .os_marks import os_wrote
from .sidecar import FrameDigest, SegmentSummary, SummaryBuilder, digest_records

__all__ = [
    "DURABLE_CUT",
    "ActiveDamage",
    "KnownZeros",
    "LogHole",
    "SegmentReader",
    "active_frames",
    "frame_records",
    "open_segment",
    "summarize_segment",
]

_READ_CHUNK: Final = 1 << 20
_FIRST_CHUNK: Final = 64 << 10  # a scan's first read (`_plain_frames`), doubled up to a chunk
_ZEROS: Final = bytes(_READ_CHUNK)  # what the zeros after the active segment's data look like
# The smallest read buffer a segment reader keeps (it grows, by powers of two, to
# `_READ_CHUNK` as its reads need).
_MIN_BUFFER: Final = 4096
# A larger one (or chunk) is dropped when its reader's follower reaches the head (`rest`).
_MIN_KEPT: Final = 16 << 10


class LogHole(JournalCorrupt):
    """Committed frames the view indexes were cut off the end of the active segment: no
    writer may append after the hole (a rebuild could never recover those appends);
    `verify(fix=True)` accepts the loss."""

    def __init__(self, segment: str, size: int, end_offset: int) -> None:
        super().__init__(
            segment,
            size,
            f"the index records committed frames up to byte {end_offset}, but the segment "
            f"ends at byte {size}: frames were cut off; the store refuses writes until "
            "`journal verify --fix` accepts the loss (it rebuilds the index from what the "
            "log still holds and reports how many events are dropped)",
        )
        self.end_offset = end_offset


# What cuts the log at damage in an active segment that only "fsync" writers wrote.
DURABLE_CUT: Final = (
    "`journal verify --fix --cut-durable` (Journal.verify(fix=True)) cuts the log at the "
    'damage all the same (Journal.open(path, repair="cut-durable") opens the store for '
    "it): the events after it leave the log"
)


class ActiveDamage(JournalCorrupt):
    """Damage in the active segment that no view says was committed (its frames are past
    the view's head, or there is no view), with a valid frame after it: no torn write,
    which is always the last thing in the file, but what a power cut does to a store
    written with durability "os" (nothing synced: the disk kept a later write and lost an
    earlier one), or media damage. Every open refuses it; `verify(fix=True)` on a journal
    opened with `repair=True` cuts the segment there, keeping a copy (SPEC 3.3), if a
    writer with durability "os" wrote it (`unsynced`: its mark, `os_marks.py`); else only
    with `repair="cut-durable"`."""

    def __init__(self, base: int, offset: int, detail: str, *, unsynced: bool = True) -> None:
        self.base = base  # (the active segment's)
        if unsynced:
            why = (
                'what a power cut does to a store written with durability "os", which syncs '
                "nothing; or damage to the disk"
            )
            way = (
                "`journal verify --fix` (Journal.verify(fix=True)) cuts the log at the "
                "damage, keeping a copy of everything from there on in the store's "
                "cut-tails/ directory (Journal.open(path, repair=True) opens the store for "
                "it); or restore the segment from a backup"
            )
        else:
            why = (
                'which only writers with durability "fsync" wrote: its frames were synced '
                "as they were committed, so this is damage to the disk, and the frames "
                "after it were acknowledged and durable"
            )
            way = f"restore the segment from a backup; if there is none, {DURABLE_CUT}"
        super().__init__(
            segment_name(base),
            offset,
            f"{detail}, with whole frames after it in the active segment ({why})",
            way=way,
        )


def active_frames(
    frames: Iterator[tuple[FrameInfo, memoryview]], base: int, directory: str
) -> Iterator[tuple[FrameInfo, memoryview]]:
    """The frames of the active segment `base` (of the segments directory `directory`)
    read past the view's head (`frames`), damage found there raised as `ActiveDamage`."""
    try:
        yield from frames
    except JournalCorrupt as e:
        if type(e) is not JournalCorrupt or e.offset < SEGMENT_HEADER_SIZE:
            raise
        unsynced = os_wrote(directory, base)
        raise ActiveDamage(base, e.offset, e.detail, unsynced=unsynced) from None


def _bad_frame(
    name: str, offset: int, bad: BadFrame | struct.error, committed: bool
) -> JournalCorrupt:
    """The error of bytes that are not a frame at `offset` of segment `name`, `committed`
    when the store's view says a committed frame is there. Zeros there are what a copy of
    the store taken while a writer ran shows (its index/ copied after its segments, newer
    than they are): the message says what such a copy needs, where an operator restoring
    that very backup was told only "zero; ... restore the segment from a backup" (an
    operator trial, until 2026-12-05)."""
    detail = str(bad)
    if detail == "zero" and committed:
        detail = (
            "zero where the store's view indexes a committed frame; if this store is a "
            "copy taken while a writer ran, its index/ is newer than its segments: delete "
            "the copy's index/ (it is rebuilt from the log)"
        )
    return JournalCorrupt(name, offset, detail)


def open_segment(path: str, flags: int) -> int:
    """`files.open_regular` of a segment file: one that is no file (a FIFO, ...) is damage,
    `JournalCorrupt` naming it (SPEC 14.1)."""
    try:
        return open_regular(path, flags)
    except NotRegularFile as e:
        name = os.path.basename(path)
        raise JournalCorrupt(name, 0, f"the segment is {e.kind}, not a file") from e
    except FileNotFoundError:
        if os.path.islink(path):  # (named for itself, not as if the file were missing)
            name = os.path.basename(path)
            raise JournalCorrupt(
                name, 0, "the segment is a symbolic link to a missing file"
            ) from None
        raise


class KnownZeros:
    """Where the writer's catch-up last found the active segment to hold only zeros (its
    preallocated end): segment `base`, bytes `start` to `end`. Only the holder of the
    store's write lock may keep one: frames are written at the head by that holder alone,
    so bytes the last catch-up found zero past the head are zero still (fillers only add
    zeros at the size), and the next catch-up compares only the bytes added since instead
    of the whole preallocated end again (SPEC 3.3)."""

    __slots__ = ("base", "end", "start")

    def __init__(self) -> None:
        self.base = self.start = self.end = -1


class SegmentReader:
    """Reads verified frames from one segment file, plain or compressed.

    A reader holds the file open: a segment compressed or deleted while it reads keeps
    reading the version it opened (POSIX unlink semantics).
    """

    def __init__(
        self,
        directory: str,
        base_position: int,
        ops: FileOps = DEFAULT_FILE_OPS,
        known_zeros: KnownZeros | None = None,
    ) -> None:
        self.directory = directory
        self.base_position = base_position
        self._ops = ops
        self._known_zeros = known_zeros
        plain = os.path.join(directory, segment_name(base_position))
        packed = os.path.join(directory, segment_name(base_position, compressed=True))
        try:
            self._fd = open_segment(plain, os.O_RDONLY)
            self.name = segment_name(base_position)
        except FileNotFoundError:
            self._fd = open_segment(packed, os.O_RDONLY)
            self.name = segment_name(base_position, compressed=True)
        try:
            raw = self._ops.pread(self._fd, SEGMENT_HEADER_SIZE, 0)
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
        self._chunk: bytes | memoryview = b""
        # The chunk buffer of a plain file, reused from chunk to chunk (a fresh megabyte
        # per chunk, allocated and freed a hundred times a second, cost a quarter of a
        # replay); see `_fill`.
        self._buffer: bytearray | None = None
        self._chunk_start = 0
        self._trusted_end = 0
        self._last_end = -1
        # How much a read in order reads ahead (`set_pages`).
        self._read_ahead = _READ_CHUNK

    def close(self) -> None:
        # (Taken before it is closed: a close cut short by an interrupt after `os.close`
        # and asked again, as the transactions' gate does, closes no number twice.)
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def set_pages(self, page_bytes: int) -> None:
        """Read ahead for pages of `page_bytes`: twice that (at least 64 KiB, at most
        1 MiB). A follower of small pages whose reader is let go between pages (`ReaderCache.
        pause`) read a megabyte of which a page used 64 KiB: its catch-up took a third
        longer."""
        self._read_ahead = _buffer_size(max(2 * page_bytes, 64 << 10))

    @property
    def last_end(self) -> int:
        """Where the last frame read ended (-1: none read)."""
        return self._last_end

    def read_on_from(self, end: int) -> None:
        """A read at `end` is in order (as if the frame before it was read here): it
        reads ahead. For a reader opened again where a closed one stopped."""
        self._last_end = end

    def rest(self) -> None:
        """Drop a read buffer or chunk over 16 KiB (the reader's follower reached the head
        and may wait there long; its next read fills a buffer as large as it needs). The
        chunk is not always in the buffer: a compressed segment's is its decompressed
        block, a frame over 1 MiB gets a buffer of its own."""
        buffer = self._buffer
        if buffer is not None and len(buffer) > _MIN_KEPT:
            self._buffer = None
        elif len(self._chunk) <= _MIN_KEPT:
            return
        self._chunk = b""
        self._chunk_start = self._trusted_end = 0

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
        chunk = _FIRST_CHUNK
        while True:
            try:
                checked = check_frame(buf, at)
            except BadFrame as bad:
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
                committed = committed_end is not None and offset < committed_end
                raise _bad_frame(self.name, offset, bad, committed) from None
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
                # Keep the unread part and read more; large frames get one exact read,
                # never past what the file holds (a damaged length must not allocate it).
                # Chunks start small and double: a catch-up at the head mostly finds a
                # frame or two before the preallocated zeros, not a megabyte of data.
                want = chunk
                chunk = min(2 * chunk, _READ_CHUNK)
                read_at = buf_start + len(buf)
                if len(buf) - at >= FRAME_HEADER_SIZE:
                    length = FRAME_HEADER.unpack_from(buf, at)[1]
                    want = max(want, FRAME_HEADER_SIZE + length - (len(buf) - at))
                    want = min(want, max(_READ_CHUNK, self.file_size() - read_at))
                more = self._ops.pread(self._fd, want, read_at)
                self._ops.point("segments.tail_read" if tail else "segments.read")
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

        The body is a view of the reader's chunk buffer, valid until the next read on
        this reader: decode it (or copy it) before reading on.
        """
        checked = None
        at = 0
        for fresh in (False, True):
            at = offset - self._chunk_start
            if fresh or not (at >= 0 and offset + FRAME_HEADER_SIZE <= self._trusted_end):
                self._fill(offset, FRAME_HEADER_SIZE, committed_end)
                at = offset - self._chunk_start
            try:
                checked = check_frame(self._chunk, at)
                if checked is None and len(self._chunk) - at >= FRAME_HEADER_SIZE:
                    # (Fewer bytes than a header: the file ends there, "cut short" below.)
                    length = FRAME_HEADER.unpack_from(self._chunk, at)[1]
                    self._fill(offset, FRAME_HEADER_SIZE + length, committed_end)
                    at = offset - self._chunk_start
                    checked = check_frame(self._chunk, at)
            except (BadFrame, struct.error) as bad:
                if fresh:
                    raise _bad_frame(self.name, offset, bad, True) from None  # (indexed)
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

    def read_records(
        self,
        offset: int,
        committed_end: int | None,
        decode: Callable[[memoryview], list[RecordT]],
    ) -> tuple[int, int, list[RecordT]]:
        """(first position, body length, records) of the committed frame at `offset`:
        `read_frame` and `frame_records` in one call, for the page reader (one call per
        frame of a replay). The usual case, a frame wholly inside the trusted bytes of the
        chunk read before, is checked (`check_frame`: header, CRC) and decoded here; any
        other (a frame past the chunk, damage, stale bytes) goes through `read_frame`."""
        at = offset - self._chunk_start
        chunk = self._chunk
        if at >= 0 and offset + FRAME_HEADER_SIZE <= self._trusted_end:
            try:
                checked = check_frame(chunk, at)
            except (BadFrame, struct.error):
                checked = None  # `read_frame` reads it again before calling it damage
            if checked is not None:
                length, first, count = checked
                end = offset + FRAME_HEADER_SIZE + length
                if end <= self._trusted_end:
                    self._last_end = end
                    start = at + FRAME_HEADER_SIZE
                    body = memoryview(chunk)[start : start + length]
                    return first, length, _records(self.name, offset, count, body, decode)
        info, body = self.read_frame(offset, committed_end)
        records = _records(self.name, offset, info.count, body, decode)
        return info.first_position, info.body_length, records

    def _fill(self, offset: int, needed: int, committed_end: int | None = None) -> None:
        if self.compressed:
            block = self._block_containing(offset)
            if block is None:
                raise JournalCorrupt(self.name, offset, "no compressed block holds this offset")
            self._chunk = self._decompress(*block)
            self._chunk_start = block[0]
            self._trusted_end = block[0] + len(self._chunk)
            return
        size = self._read_ahead if offset == self._last_end else 64 << 10
        if committed_end is not None:
            # Bytes past the committed end would not be trusted anyway: a follower at the
            # head reads what was just committed, not a megabyte of preallocated zeros.
            size = min(size, committed_end - offset)
        if needed > size:
            # Never past what the file holds: a damaged length must not allocate it.
            needed = min(needed, max(self.file_size() - offset, 0))
        want = max(size, needed, 0)
        if want > _READ_CHUNK:
            buffer = bytearray(want)  # one large frame: not kept for the next chunk
        elif self._buffer is not None and len(self._buffer) >= want:
            # Reused: the body `read_frame` returned last is a view of this buffer, which
            # is why its bytes are only valid until the next read on this reader.
            buffer = self._buffer
        else:
            # As large as the reads need so far (a power of two, at least a page, at most
            # `_READ_CHUNK`): a replay's chunks make it 1 MiB at once, while a follower at
            # the head, reading what was just committed, keeps a small one.
            buffer = self._buffer = bytearray(_buffer_size(want))
        window = memoryview(buffer)[:want]
        got = self._ops.pread_into(self._fd, window, offset)
        self._chunk = window[:got]
        self._chunk_start = offset
        end = offset + got
        self._trusted_end = end if committed_end is None else min(end, committed_end)

    def _block_containing(self, offset: int) -> tuple[int, int, int, int] | None:
        blocks = self.block_table()
        at = block_index(blocks, offset)
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
        header = self._ops.pread(self._fd, FRAME_HEADER_SIZE, offset)
        if len(header) < FRAME_HEADER_SIZE or header[:4] != FRAME_MAGIC:
            return False
        length = FRAME_HEADER.unpack(header)[1]
        if length > min(MAX_FRAME_BODY, self.file_size() - offset - FRAME_HEADER_SIZE):
            return False
        raw = header + self._ops.pread(self._fd, length, offset + FRAME_HEADER_SIZE)
        try:
            return check_frame(raw, 0) is not None
        except BadFrame:
            return False

    def next_frame_after(self, offset: int, last_position: int) -> int | None:
        """Where the first valid frame after damage reported at `offset` starts, or None:
        how `verify` reads on past a damaged frame. `last_position` is the last position
        of the frames read before it: a frame found must start past it (a whole frame
        stored in an event's data is not one). A compressed segment goes on at the block
        after the damaged one (`offset` is a block's file offset when the block itself is
        damaged, a frame's offset in the segment's data when a frame in it is); a plain
        one at the next frame magic whose header and checksum hold."""
        if self.compressed:
            try:
                blocks = self.block_table()
            except JournalCorrupt:
                return None  # (its block table is damaged: nothing says where blocks are)
            damaged = next((i for i, block in enumerate(blocks) if block[2] == offset), None)
            if damaged is None:
                damaged = block_index(blocks, offset)
            return blocks[damaged + 1][0] if damaged + 1 < len(blocks) else None
        size = self.file_size()
        at = offset + 1
        while at < size:
            chunk = self._ops.pread(self._fd, min(_READ_CHUNK, size - at), at)
            found = chunk.find(FRAME_MAGIC)
            while found >= 0:
                if self._frame_past(at + found, last_position):
                    return at + found
                found = chunk.find(FRAME_MAGIC, found + 1)
            if len(chunk) < len(FRAME_MAGIC):
                break
            at += len(chunk) - (len(FRAME_MAGIC) - 1)  # (a magic across two chunks)
        return None

    def _frame_past(self, offset: int, last_position: int) -> bool:
        """Whether a valid frame starting past `last_position` is at `offset`."""
        header = self._ops.pread(self._fd, FRAME_HEADER_SIZE, offset)
        if len(header) < FRAME_HEADER_SIZE or FRAME_HEADER.unpack(header)[3] <= last_position:
            return False
        return self._written_meanwhile(offset)

    def _data_after(self, offset: int, last_position: int) -> bool:
        """Whether a valid frame exists after `offset` (so damage there is not a torn tail)."""
        size = self.file_size()
        start = offset + 1
        known = self._known_zeros
        if (
            known is not None
            and known.base == self.base_position
            and known.start <= start <= known.end
        ):
            start, checked_from = known.start, min(known.end, size)
        else:
            checked_from = start
        if self._zeros_after(checked_from, size):
            # The usual end of the active segment: its preallocated zeros. Comparing them
            # takes microseconds a megabyte; the search below took milliseconds (at every
            # open of a writer: catching up stops there).
            if known is not None:
                known.base, known.start, known.end = self.base_position, start, size
            return False
        rest = self._ops.pread(self._fd, max(0, size - offset - 1), offset + 1)
        return valid_frame_after(rest, 0, last_position)

    def _zeros_after(self, offset: int, size: int) -> bool:
        """Whether the file holds only zero bytes from `offset` to `size`."""
        buffer = bytearray(min(_READ_CHUNK, max(size - offset, 0)))
        while offset < size:
            window = memoryview(buffer)[: min(len(buffer), size - offset)]
            got = self._ops.pread_into(self._fd, window, offset)
            if got == 0:
                return True  # the file shrank meanwhile: nothing more after
            # (bytearray == bytes is a memcmp; comparing memoryviews is not.)
            if (buffer if got == len(buffer) else buffer[:got]) != _ZEROS[:got]:
                return False
            offset += got
        return True

    def block_table(self) -> list[tuple[int, int, int, int]]:
        """(uncompressed offset, uncompressed length, file offset, compressed length),
        from the file's own footer (so it always matches this very file)."""
        if self._blocks is None:
            self._blocks = self._footer_blocks()
        return self._blocks

    def _footer_blocks(self) -> list[tuple[int, int, int, int]]:
        size = self.file_size()
        trailer_at = size - FOOTER_TRAILER.size
        if trailer_at < SEGMENT_HEADER_SIZE + FOOTER_HEADER.size:
            raise JournalCorrupt(self.name, max(trailer_at, 0), "block table footer is missing")
        trailer = self._ops.pread(self._fd, FOOTER_TRAILER.size, trailer_at)
        (footer_at,) = FOOTER_TRAILER.unpack(trailer)
        if not SEGMENT_HEADER_SIZE <= footer_at <= trailer_at - FOOTER_HEADER.size:
            raise JournalCorrupt(self.name, trailer_at, "block table footer offset is damaged")
        raw = self._ops.pread(self._fd, trailer_at - footer_at, footer_at)
        magic, length, crc = FOOTER_HEADER.unpack_from(raw)
        table = raw[FOOTER_HEADER.size :]
        if magic != FOOTER_MAGIC or len(table) != length or zlib.crc32(table) != crc:
            raise JournalCorrupt(self.name, footer_at, "block table footer does not verify")
        try:
            blocks = msgspec.msgpack.decode(table, type=list[tuple[int, int, int, int]])
        except msgspec.DecodeError:
            raise JournalCorrupt(self.name, footer_at, "block table is undecodable") from None
        problem = block_table_problem(blocks, footer_at)
        if problem:
            raise JournalCorrupt(self.name, footer_at, f"block table is damaged: {problem}")
        return blocks

    def _decompress(self, uoffset: int, ulength: int, coffset: int, clength: int) -> bytes:
        raw = self._ops.pread(self._fd, BLOCK_HEADER.size + clength, coffset)
        if len(raw) != BLOCK_HEADER.size + clength:
            raise JournalCorrupt(self.name, coffset, "compressed block is cut short")
        magic, u2, l2, c2, crc = BLOCK_HEADER.unpack_from(raw)
        payload = memoryview(raw)[BLOCK_HEADER.size :]
        if (magic, u2, l2, c2) != (BLOCK_MAGIC, uoffset, ulength, clength) or zlib.crc32(
            payload
        ) != crc:
            raise JournalCorrupt(self.name, coffset, "compressed block header or checksum mismatch")
        if ulength > MAX_BLOCK_BYTES:
            raise JournalCorrupt(self.name, coffset, "compressed block claims to be huge")
        try:
            block = decompress_block(payload, ulength)
        except zstandard.ZstdError as e:
            raise JournalCorrupt(self.name, coffset, f"zstd: {e}") from None
        if len(block) != ulength:
            raise JournalCorrupt(self.name, coffset, "compressed block has the wrong size")
        return block

    def _compressed_frames(self, start_offset: int) -> Iterator[tuple[FrameInfo, memoryview]]:
        blocks = self.block_table()
        for uoffset, ulength, coffset, clength in blocks[
            max(block_index(blocks, start_offset), 0) :
        ]:
            block = self._decompress(uoffset, ulength, coffset, clength)
            at = 0
            while at < ulength:
                offset = uoffset + at
                try:
                    checked = check_frame(block, at)
                except BadFrame as bad:
                    raise JournalCorrupt(self.name, offset, str(bad)) from None
                if checked is None:
                    raise JournalCorrupt(self.name, offset, "frame is cut short in its block")
                length, first, count = checked
                body_start = at + FRAME_HEADER_SIZE
                if offset >= start_offset:
                    info = FrameInfo(self.base_position, offset, first, count, length)
                    yield info, memoryview(block)[body_start : body_start + length]
                at = body_start + length


def summarize_segment(
    directory: str,
    base_position: int,
    ops: FileOps = DEFAULT_FILE_OPS,
    *,
    committed_end: int | None = None,
) -> SegmentSummary:
    """Scan a sealed segment and build its sidecar index (verifying every frame); with
    `committed_end` (past the header), the active segment's frames up to that offset."""
    builder = SummaryBuilder()
    last_position = base_position - 1
    data_end = SEGMENT_HEADER_SIZE
    with SegmentReader(directory, base_position, ops) as reader:
        tail = committed_end is not None
        for info, body in reader.frames(committed_end=committed_end, tail=tail):
            builder.add(
                info.offset, info.first_position, info.count, _digest(reader.name, info, body)
            )
            last_position = info.last_position
            data_end = info.end_offset
            if committed_end is not None and data_end >= committed_end:
                break  # (never reads on into a frame a writer may be writing)
        blocks = reader.block_table() if reader.compressed else []
    summary = builder.build(base_position, last_position, data_end)
    summary.blocks = blocks
    return summary


RecordT = TypeVar("RecordT")


def frame_records(
    name: str,
    info: FrameInfo,
    body: memoryview,
    decode: Callable[[memoryview], list[RecordT]],
) -> list[RecordT]:
    """The records of a frame whose checksum verified, decoded by `decode`.

    `JournalCorrupt` (segment `name`, the frame's offset) when the body does not decode
    or does not hold the `count` records its header claims: every reader of frame bodies
    decodes through here, so a checksummed but malformed body never escapes as a decoder
    error or as positions without records.
    """
    return _records(name, info.offset, info.count, body, decode)


def _records(
    name: str,
    offset: int,
    count: int,
    body: memoryview,
    decode: Callable[[memoryview], list[RecordT]],
) -> list[RecordT]:
    """`frame_records` of the frame at `offset` claiming `count` records."""
    try:
        records = decode(body)
    except msgspec.DecodeError as e:
        raise JournalCorrupt(name, offset, f"undecodable frame: {e}") from None
    if len(records) != count:
        raise JournalCorrupt(
            name, offset, f"frame header says {count} records, its body holds {len(records)}"
        )
    return records


def _digest(name: str, info: FrameInfo, body: memoryview) -> FrameDigest:
    return digest_records(frame_records(name, info, body, decode_frame_body))


def _buffer_size(want: int) -> int:
    """The read buffer kept for a read of `want` bytes (at most `_READ_CHUNK`)."""
    return min(max(_MIN_BUFFER, 1 << (want - 1).bit_length()), _READ_CHUNK)
