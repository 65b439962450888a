"""Copies of the bytes a writer cuts off after the active segment's last whole frame.

A writer cuts non-zero bytes after the last whole frame off as a crash's torn write. A
last frame damaged on disk looks the same when no view knows it committed (SPEC 3.3), so
the bytes are kept first, in the store's `cut-tails/` directory, and the cut is made only
once the copy is durable: no cut destroys what may have been an acknowledged event.
"""

from __future__ import annotations

import errno
import os
from typing import Final

from ..errors import JournalCorrupt
from ..models import VerifyProblem
from .files import FileOps, Permissions, discarded_on_failure, fsync_dir, open_regular
from .frames import MAX_BLOCK_BYTES, segment_name
from .os_marks import mark_name, os_wrote
from .segments import DURABLE_CUT, SegmentReader, open_segment

__all__ = [
    "CUT_TAILS_DIRECTORY",
    "cut_at_damage",
    "cut_tail_end",
    "cut_tails_beside",
    "keep_cut_tail",
]

# In the store's directory, beside `segments/` (SPEC 7, the store's layout).
CUT_TAILS_DIRECTORY: Final = "cut-tails"

_CHUNK: Final = 1 << 20


def cut_tails_beside(segments: str) -> str:
    """The directory of kept tails of the store whose `segments/` is `segments`."""
    return os.path.join(os.path.dirname(os.path.abspath(segments)), CUT_TAILS_DIRECTORY)


def cut_tail_end(fd: int, segment: str, start: int, size: int, ops: FileOps) -> int:
    """Where the non-zero bytes of the segment file `fd` (named `segment`, `size` bytes
    long) after offset `start` end: `start` when there are none.

    One frame is written at a time, so a torn write is at most one frame (`MAX_BLOCK_BYTES`)
    followed by zeros: non-zero bytes further on are no torn write, and `JournalCorrupt`
    (nothing is cut)."""
    end = _data_end(fd, start, size, ops)
    if end - start > MAX_BLOCK_BYTES:
        raise JournalCorrupt(
            segment,
            start,
            f"{end - start} bytes after the last whole frame are not zeros, more than any "
            "one interrupted write leaves (a frame is at most "
            f"{MAX_BLOCK_BYTES} bytes): damage, not a torn write; nothing was cut",
        )
    return end


def _data_end(fd: int, start: int, size: int, ops: FileOps) -> int:
    """Where the non-zero bytes of `fd` (`size` bytes long) after `start` end (`start`:
    none)."""
    end = at = start
    while at < size:
        at = _next_data(fd, at, size)
        if at >= size:
            break
        chunk = ops.pread(fd, min(_CHUNK, size - at), at)
        if not chunk:
            break  # (cut shorter meanwhile: nothing is there)
        data = len(chunk.rstrip(b"\0"))
        if data:
            end = at + data
        at += len(chunk)
    return end


def cut_at_damage(
    directory: str,
    base: int,
    offset: int,
    ops: FileOps,
    permissions: Permissions,
    *,
    cut_durable: bool = False,
) -> VerifyProblem:
    """Cut the active segment `base` of the segments directory `directory` at the damage
    at `offset` (`ActiveDamage`: no view says the frames there committed), keeping a copy
    of every byte from there to the end of its data in `cut-tails/` first; what was done,
    as `verify(fix=True)` reports it. The caller holds the write lock.

    A segment that no writer with durability "os" wrote (no mark: `os_marks.py`) held
    only synced frames: the ones after the damage were acknowledged and durable, and the
    damage is the disk's. Those are cut only with `cut_durable` (`repair="cut-durable"`);
    otherwise `JournalCorrupt` says so, and nothing is cut."""
    name = segment_name(base)
    unsynced = os_wrote(directory, base)
    frames = _whole_frames(directory, base, offset, ops)
    if not unsynced and not cut_durable:
        raise JournalCorrupt(
            name,
            offset,
            f"damage with {frames} whole frame(s) after it in the active segment, which no "
            f'writer with durability "os" wrote (there is no {mark_name(base)} beside it): '
            "every frame of it was synced as it was committed, so those after the damage "
            "were acknowledged and durable, and no power cut explains it; this is damage "
            "to the disk (media damage, found after a reboot); nothing was cut",
            way="restore the segment from a backup; if there is none, "
            f"{DURABLE_CUT}, with a copy of them kept in cut-tails/ (a store written with "
            'durability "os" by a version from before 2026-12-07, which left no such mark, '
            "needs the same)",
        )
    fd = open_segment(os.path.join(directory, name), os.O_RDWR)
    try:
        end = _data_end(fd, offset, os.fstat(fd).st_size, ops)
        kept = keep_cut_tail(fd, name, offset, end, cut_tails_beside(directory), ops, permissions)
        ops.ftruncate(fd, offset)
        ops.fsync(fd)
    finally:
        os.close(fd)
    if unsynced:
        why = (
            'A writer with durability "os" wrote this segment: this is what a power cut '
            "does to it (nothing synced: the disk kept later writes and lost an earlier "
            "one), or damage to the disk. No view of this boot indexed those frames; an "
            '"os" writer acknowledges appends before they are durable, and never promised '
            'them through a power cut. If a writer with durability "fsync" appended after '
            "the damage, its events are among them too: take them from the copy"
        )
    else:
        why = (
            'No writer with durability "os" marked this segment: "fsync" writers alone '
            "wrote it, so those frames were acknowledged and durable, and this is damage "
            'to the disk (unless an "os" writer of a version from before 2026-12-07, which '
            "left no mark, wrote it: then a power cut); cut as asked (--cut-durable, "
            'repair="cut-durable"): restore the segment from a backup, or take their '
            "events from the copy"
        )
    return VerifyProblem(
        name,
        offset,
        f"damage at byte {offset} of the active segment, with whole frames after it: the "
        f"segment was cut there, and bytes {offset} to {end} ({frames} whole frame(s) "
        f"after the damage: their events are not in the log now) are kept in {kept}. "
        f"{why}. Inspect the copy, then delete it",
    )


def _whole_frames(directory: str, base: int, offset: int, ops: FileOps) -> int:
    """How many whole, valid frames segment `base` holds after the damage at `offset`."""
    count = 0
    with SegmentReader(directory, base, ops) as reader:
        at = reader.next_frame_after(offset, base - 1)
        while at is not None:
            try:
                for _ in reader.frames(at, tail=True):
                    count += 1
                return count
            except JournalCorrupt as e:
                restart = reader.next_frame_after(e.offset, base - 1)
                at = restart if restart is not None and restart > at else None
    return count


def _next_data(fd: int, at: int, size: int) -> int:
    """Where data follows `at` in `fd` (`size` when none): a hole (a crash during a
    zero fill may leave one) reads as zeros and is skipped unread."""
    try:
        return os.lseek(fd, at, os.SEEK_DATA)
    except OSError as e:
        if e.errno == errno.ENXIO:
            return size  # (only a hole up to the end)
        return at  # (a file system without SEEK_DATA: read it)


def keep_cut_tail(
    fd: int,
    segment: str,
    start: int,
    end: int,
    directory: str,
    ops: FileOps,
    permissions: Permissions,
) -> str:
    """Keep bytes `start`..`end` of the segment file `fd` (named `segment`) in
    `directory`, durably, before they are cut; returns the copy's path.

    Named after the segment and the offset; an identical copy kept before (a cut that
    failed after its copy was made) is that copy, a different one with the same name (the
    segment was cut at the same offset again after another crash) keeps its name and this
    one takes the next free `-N`. Written as a temporary file, synced, renamed; then the
    directory and the store's are synced (for an identical copy found there too). The
    caller holds the write lock, so no other process keeps a tail of this segment
    meanwhile and the temporary name needs no process id."""
    if not os.path.isdir(directory):
        permissions.make_dirs(directory)
    number = 1
    while True:
        suffix = "" if number == 1 else f"-{number}"
        path = os.path.join(directory, f"{segment}-{start}{suffix}.tail")
        same = _same_bytes(path, fd, start, end, ops)
        if same is None:
            break
        if same:
            # (Renamed into place by a keep that failed, or was killed, before it synced
            # the entries: synced now, before the cut.)
            _sync_entries(directory, ops)
            return path
        number += 1
    ops.point("segments.keep_tail", path)
    temporary = f"{path}.tmp"
    copy = permissions.create_file(temporary, os.O_WRONLY | os.O_TRUNC)
    with discarded_on_failure(temporary, ops):
        try:
            at = start
            while at < end:
                chunk = ops.pread(fd, min(_CHUNK, end - at), at)
                if not chunk:
                    raise OSError(f"{segment} ended at offset {at} while its tail was copied")
                written = 0
                while written < len(chunk):
                    count = ops.pwrite(copy, chunk[written:], at - start + written)
                    if count <= 0:
                        raise OSError(f"writing {temporary} wrote nothing and reported no error")
                    written += count
                at += len(chunk)
            ops.fsync(copy)
        finally:
            os.close(copy)
        ops.rename(temporary, path)
    _sync_entries(directory, ops)
    return path


def _sync_entries(directory: str, ops: FileOps) -> None:
    """Make the copies' directory entries durable, and `directory`'s own in the store's
    directory: every time, since a keep that failed after making `directory` (or renaming
    a copy) may have synced neither, and the next keep finds them there."""
    fsync_dir(directory, ops)
    fsync_dir(os.path.dirname(os.path.abspath(directory)), ops)


def _same_bytes(path: str, fd: int, start: int, end: int, ops: FileOps) -> bool | None:
    """Whether the file `path` holds exactly bytes `start`..`end` of `fd` (None: no such
    file)."""
    try:
        kept = open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        if os.fstat(kept).st_size != end - start:
            return False
        at = start
        while at < end:
            length = min(_CHUNK, end - at)
            if os.pread(kept, length, at - start) != ops.pread(fd, length, at):
                return False
            at += length
        return True
    finally:
        os.close(kept)
