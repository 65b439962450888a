"""The active segment's writer: appends frames, syncs them, keeps zeros ahead of them.

The active segment is preallocated with real zeros ahead of its last frame, so most syncs
do not have to write the inode (measured: 0.16 ms vs 0.25 ms per 58 KB batch on this
class of disk); a large segment's zeros are written ahead by the zero-filler thread
(`zerofill.py`), a small one's by its first append. An all-zero frame header is the end of
the data; sealing cuts the zeros (SPEC.md 3.2, 3.4).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Iterator
from typing import Final

from .cut_tails import cut_tail_end, cut_tails_beside, keep_cut_tail
from .files import (
    DEFAULT_FILE_OPS,
    DEFAULT_PERMISSIONS,
    FileOps,
    Permissions,
    discarded_on_failure,
    fsync_dir,
)
from .frames import (
    DEFAULT_SEGMENT_BYTES,
    FORMAT_VERSION,
    FRAME_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    FrameInfo,
    SegmentHeader,
    seal_frame,
    segment_name,
)
from .os_marks import mark_os_writer
from .segments import LogHole, SegmentReader, open_segment
from .sidecar import FrameDigest, SegmentSummary, SummaryBuilder
from .zerofill import (
    AHEAD_BYTES,
    INLINE_BYTES,
    STEP_BYTES,
    ZeroFiller,
    extension_lock,
    zeros_fit,
)

_log: Final = logging.getLogger("journal")

__all__ = ["SegmentWriter", "data_end"]

# Written from a piece at a time through a memoryview: a slice of the bytes is a copy, a
# transient buffer of up to 1 MiB in whichever thread made the segment (section 8,
# "Writer memory").
_ZEROS: Final = memoryview(bytes(1 << 20))


class SegmentWriter:
    """The active segment: appends frames at the end and syncs them.

    Not thread-safe and not process-safe by itself: the caller serialises writers (the
    journal holds its cross-process write lock around every append). Zero-fillers (this
    process's `filler` and other processes') may grow the file meanwhile, never over a
    frame: see `zerofill.py` for the extension lock.
    """

    def __init__(
        self,
        directory: str,
        base_position: int,
        *,
        sync: bool = True,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        ops: FileOps = DEFAULT_FILE_OPS,
        filler: ZeroFiller | None = None,
        permissions: Permissions = DEFAULT_PERMISSIONS,
        cut_tails: str | None = None,
    ) -> None:
        self.directory = directory
        self.base_position = base_position
        self._ops = ops
        self._permissions = permissions
        # Where bytes cut off after the last whole frame are kept first (`cut_tails.py`).
        self._cut_tails = cut_tails_beside(directory) if cut_tails is None else cut_tails
        self.name = segment_name(base_position)
        self.sync_enabled = sync
        # Whether this segment's mark is known durable, or needs none: a writer with
        # durability "os" makes it before its first frame here (`os_marks.py`).
        self._marked = sync
        self.segment_bytes = segment_bytes
        self._fd = open_segment(os.path.join(directory, self.name), os.O_RDWR)
        self.end_offset = SEGMENT_HEADER_SIZE
        self.next_position = base_position
        self.frame_count = 0
        self._reached = SEGMENT_HEADER_SIZE  # a frame end known to be reached (`attach`)
        # The file's size as last seen (at least the data end): past it lie no zeros.
        self._allocated = os.fstat(self._fd).st_size
        # A segment small enough for one inline step is preallocated whole at birth; a
        # larger one's zeros after its first `INLINE_BYTES` are the filler's.
        self._filler = filler if segment_bytes > INLINE_BYTES else None
        self._asked = self._allocated  # (zeros already there count as asked for)
        # The sidecar, built as frames are appended so sealing needs no rescan. None when
        # this writer did not see every frame of the segment (then sealing scans it).
        self._summary_valid = False
        self._summary = SummaryBuilder()

    @classmethod
    def create(
        cls,
        directory: str,
        store_id: bytes,
        base_position: int,
        *,
        sync: bool = True,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        ops: FileOps = DEFAULT_FILE_OPS,
        permissions: Permissions = DEFAULT_PERMISSIONS,
        filler: ZeroFiller | None = None,
        cut_tails: str | None = None,
    ) -> SegmentWriter:
        """Create a new, empty active segment (file and directory entry synced), born with
        its first zeros: the whole segment, or `INLINE_BYTES` (the filler adds more once
        the frames have used a step of them)."""
        header = SegmentHeader(FORMAT_VERSION, 0, store_id, base_position, int(time.time() * 1000))
        path = os.path.join(directory, segment_name(base_position))
        # Born complete: the header is written and synced under a temporary name, then
        # renamed, so a crash never leaves a segment without its header.
        temporary = f"{path}.{os.getpid()}.tmp"
        fd = permissions.create_file(temporary, os.O_RDWR | os.O_TRUNC)
        with discarded_on_failure(temporary, ops):
            try:
                os.write(fd, header.encode())
                born = min(segment_bytes, INLINE_BYTES)
                if not zeros_fit(ops, fd, born):
                    born = 0  # a disk near full: the frames grow the file
                try:
                    while os.fstat(fd).st_size < born:
                        size = os.fstat(fd).st_size
                        os.pwrite(fd, _ZEROS[: min(len(_ZEROS), born - size)], size)
                except OSError as e:
                    # A file size limit (`ulimit -f`) below the zeros: none of them stay,
                    # the frames grow the file as on a disk near full (and a frame past
                    # the limit fails with EFBIG). Until 2026-12-07 every new segment,
                    # the first one of `journal init` too, failed under a limit below
                    # `INLINE_BYTES` (an operator trial).
                    if e.errno != errno.EFBIG:
                        raise
                    ops.ftruncate(fd, SEGMENT_HEADER_SIZE)
                ops.fsync(fd)
            finally:
                os.close(fd)
            if os.path.exists(path):
                raise FileExistsError(f"segment {segment_name(base_position)} already exists")
            ops.rename(temporary, path)
        fsync_dir(directory, ops)
        writer = cls(
            directory,
            base_position,
            sync=sync,
            segment_bytes=segment_bytes,
            ops=ops,
            filler=filler,
            permissions=permissions,
            cut_tails=cut_tails,
        )
        writer._summary_valid = True
        return writer

    def attach(self, end_offset: int, next_position: int, *, keep_cut: bool = True) -> None:
        """Continue after the committed frames ending at `end_offset` (known from the view).

        Bytes past `end_offset` that are not zeros are a crashed writer's torn frame: they
        are cut off (the caller holds the write lock, so nobody is writing them now), after
        a copy is kept (`_cut_tail`). `keep_cut=False` only for this process's own frame
        that its transaction refused (`SegmentLog.undo_append`): no caller was told of it.
        """
        size = os.fstat(self._fd).st_size
        # Committed frames the view indexes must be there (the file cut, or holding zeros
        # where they belong, is a hole): appending after a hole would acknowledge events
        # a rebuild could never recover.
        start = self._reached if self._reached <= end_offset else SEGMENT_HEADER_SIZE
        reached = data_end(
            self.directory, self.base_position, end_offset, size, self._ops, self._fd, start
        )
        if reached < end_offset:
            raise LogHole(self.name, reached, end_offset)
        self._reached = end_offset
        if (end_offset, next_position) != (self.end_offset, self.next_position):
            self._summary_valid = False
        self.end_offset = end_offset
        self.next_position = next_position
        self.frame_count = 1 if end_offset > SEGMENT_HEADER_SIZE else 0
        self._allocated = size
        if size > end_offset:
            probe = self._ops.pread(self._fd, FRAME_HEADER_SIZE, end_offset)
            if not probe.strip(b"\0"):
                pass  # (zeros: the end of the data)
            elif keep_cut:
                # Not provably uncommitted, though the view says where commits end: a
                # view rebuilt from the log (index/ lost, or discarded after a reboot)
                # knows no more than the log, and one restored from an older copy of the
                # store than its segments ends before frames acknowledged since (SPEC 3.3).
                self._allocated = self._cut_tail(end_offset, size)
            else:
                self._ops.ftruncate(self._fd, end_offset)
                self._ops.fsync(self._fd)
                self._allocated = end_offset
        self._asked = self._allocated
        self._ask_filler()

    def _cut_tail(self, end: int, size: int) -> int:
        """Cut the non-zero bytes after the last whole frame (ending at `end`) off the
        file (`size` bytes long), and return its new size; a copy of them is kept first.

        A torn write, most likely; but without a view that knew it committed, a last frame
        damaged on disk looks the same (SPEC 3.3), so nothing is cut until the copy is
        durable: a copy that cannot be kept (a full disk) fails the open, or the commit,
        with nothing cut."""
        stop = cut_tail_end(self._fd, self.name, end, size, self._ops)
        if stop == end:
            return size
        path = os.path.join(self.directory, self.name)
        try:
            kept = keep_cut_tail(
                self._fd, self.name, end, stop, self._cut_tails, self._ops, self._permissions
            )
        except OSError as e:
            raise OSError(
                e.errno,
                f"{e.strerror or e}, while keeping a copy of the {stop - end} bytes after the "
                f"last whole frame of {path} (offset {end}) in {self._cut_tails} before "
                "cutting them off (nothing was cut)",
                e.filename,
            ) from e
        _log.warning(
            "%s: cut off %d bytes after its last whole frame (offset %d), kept in %s: the "
            "write a crash interrupted; without the index, damage to the last frame looks "
            "the same (inspect the copy, then delete it)",
            path,
            stop - end,
            end,
            kept,
        )
        self._ops.ftruncate(self._fd, end)
        self._ops.fsync(self._fd)
        return end

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
        frame = bytearray(FRAME_HEADER_SIZE)
        frame += body
        return self.append_frame(frame, first_position, count, digest)

    def append_frame(
        self,
        frame: bytearray,
        first_position: int,
        count: int,
        digest: FrameDigest | None = None,
    ) -> FrameInfo:
        """`append` of a frame whose body already follows `FRAME_HEADER_SIZE` bytes of
        room in `frame` (the header is filled in there: `seal_frame`)."""
        if first_position != self.next_position:
            raise ValueError(
                f"frame starts at position {first_position}, expected {self.next_position}"
            )
        if not self._marked:
            mark_os_writer(self.directory, self.base_position, self._ops, self._permissions)
            self._marked = True
        seal_frame(frame, first_position, count)
        offset = self.end_offset
        end = offset + len(frame)
        # The real size, not `_allocated`: a filler may have grown the file, and another
        # process's writer may have cut it back to our end (a torn tail it found).
        self._allocated = os.fstat(self._fd).st_size
        if end <= self._allocated:
            # Below the size: no filler writes there (they write only at the size).
            self._write(frame, offset)
        else:
            with extension_lock(self._fd):
                self._preallocate(end)
                self._write(frame, offset)
        self.end_offset = self._reached = end
        self.next_position = first_position + count
        self.frame_count += 1
        if digest is None:
            self._summary_valid = False
        elif self._summary_valid:
            self._summary.add(offset, first_position, count, digest)
        self._ask_filler()
        return FrameInfo(
            self.base_position, offset, first_position, count, len(frame) - FRAME_HEADER_SIZE
        )

    def summary(self) -> SegmentSummary | None:
        """The sidecar of this segment as written so far, if this writer saw every frame."""
        if not self._summary_valid:
            return None
        return self._summary.build(self.base_position, self.next_position - 1, self.end_offset)

    def sync(self) -> None:
        self._ops.fdatasync(self._fd)

    def fileno(self) -> int:
        return self._fd

    def _write(self, frame: bytearray, offset: int) -> None:
        """Write (and, with sync on, make durable) one frame. A failed synced write is a
        failed sync: the caller cuts the frame off and a later append writes it afresh.

        A short count is what Linux returns when a write meets the end of the free space:
        the rest is written (synced alike), and that write reports the OS error (ENOSPC)
        with its number; a write that writes nothing and reports no error fails too."""
        written = 0
        while written < len(frame):
            rest = frame if written == 0 else frame[written:]
            if self.sync_enabled:
                count = self._ops.pwrite_synced(self._fd, rest, offset + written)
            else:
                count = self._ops.pwrite(self._fd, rest, offset + written)
            if count <= 0:
                raise OSError(
                    f"writing a frame to {self.name} at offset {offset}: the system wrote "
                    f"none of its last {len(rest)} of {len(frame)} bytes and reported no error"
                )
            written += count

    def _preallocate(self, needed: int) -> None:
        """Zeros up to past `needed` (caller holds the extension lock). While the filler
        works, none: the frame grows the file and the filler writes the zeros after it."""
        if self._filler is not None and self._filler.working:
            self._asked = 0  # (ask again from the new end)
            return
        # Never past what the segment may still hold: a small-segment store must not carry
        # megabytes of zeros per active segment (a frame larger than the rest still fits).
        target = max(needed, min(needed + INLINE_BYTES, self.segment_bytes))
        # Never below the real size: another process may have written up to it.
        start = at = max(os.fstat(self._fd).st_size, self.end_offset)
        if not zeros_fit(self._ops, self._fd, target - at):
            return  # a disk near full: no zeros, the frame grows the file
        try:
            while at < target:
                n = min(len(_ZEROS), target - at)
                self._ops.pwrite(self._fd, _ZEROS[:n], at)
                at += n
        except OSError as e:
            # None of them stays (this writer holds the extension lock and the write
            # transaction: nothing else wrote there); a full disk leaves the frame to
            # grow the file, and fail if it does not fit.
            with contextlib.suppress(OSError):
                self._ops.ftruncate(self._fd, start)
            if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # (EFBIG: `ulimit -f`)
                raise
            return
        self._allocated = target

    def _ask_filler(self) -> None:
        """Ask the filler for zeros `AHEAD_BYTES` past the end, a step at a time."""
        if self._filler is None:
            return
        wanted = min(self.end_offset + AHEAD_BYTES, self.segment_bytes)
        last = wanted == self.segment_bytes  # (the last, short step)
        if wanted >= self._asked + STEP_BYTES or (last and wanted > self._asked):
            self._asked = wanted
            self._filler.want(self.directory, self.base_position, wanted)

    @contextlib.contextmanager
    def extension_locked(self) -> Iterator[None]:
        """Hold the segment's extension lock (no filler grows it meanwhile): a rotation
        holds it from `finish` until the next segment exists."""
        with extension_lock(self._fd):
            yield

    def finish(self) -> None:
        """Cut the preallocated zeros and sync: the segment is about to be sealed (caller
        holds `extension_locked` until the next segment exists)."""
        self._ops.ftruncate(self._fd, self.end_offset)
        self._ops.fsync(self._fd)
        self._allocated = self.end_offset

    def close(self) -> None:
        # (Taken before it is closed: a close cut short by an interrupt after `os.close`
        # and asked again, as the transactions' gate does, closes no number twice.)
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def data_end(
    directory: str,
    base: int,
    end_offset: int,
    size: int,
    ops: FileOps,
    fd: int,
    start: int = SEGMENT_HEADER_SIZE,
) -> int:
    """Where the frames of segment `base` (open as `fd`, `size` bytes long) end, if
    before `end_offset` (else `end_offset`); `start` is a frame end known to be reached.
    A file shorter than `end_offset` was cut. A copy of a store whose index was copied
    after its segments holds preallocated zeros where the index's last frames should be:
    the file is long enough, and the header at `end_offset` is zeros, as at every end.
    The last bytes before `end_offset` tell (one read): only where they are zeros too,
    which a frame's data may also be (a checkpoint padded with zeros), are the frames
    read, from `start`, to find where they end."""
    if size < end_offset:
        return size
    if start >= end_offset:
        return end_offset
    if ops.pread(fd, FRAME_HEADER_SIZE, end_offset - FRAME_HEADER_SIZE).strip(b"\0"):
        return end_offset
    reached = start
    with SegmentReader(directory, base, ops) as reader:
        for info, _body in reader.frames(start, tail=True):
            reached = info.end_offset
            if reached >= end_offset:
                return end_offset
    return reached
