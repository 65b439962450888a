"""A simulated disk for the I/O fault and power-cut tests, through the `FileOps` seam.

`SimulatedDisk` performs every operation on the real files and keeps, beside them, what a
power cut would leave: each file's content as of its last successful sync (by inode) and
each directory's entries as of its last sync. Faults make chosen operations fail with an
OS error; a failed sync behaves as Linux does: the data written since the last sync is
dropped from what can ever reach the disk (its pages are marked clean), so it is lost
unless it is written again. `power_cut()` rewrites the store's files to what the disk
holds: unsynced directory entries vanish, files go back to their synced content (plus,
at random, of each write made after it: nothing, all of it or its start, a torn write,
inside the synced size as past it: as a disk may persist some pages), and the
view (`index/`) is dropped, as a reboot discards it.

A synced write (`pwrite_synced`, RWF_DSYNC) is a `pwrite` then a sync of that range only
(the file's size included); it fails as either does. The zero-filler's steps
(`fill_zeros`) are their own operation, "fill", so faults aimed at the writer's writes and
syncs never strike the background thread instead. Operations are serialised by a lock:
the zero-filler calls in from its own thread.
"""

from __future__ import annotations

import errno as errnos
import functools
import os
import random
import shutil
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from journal._local.files import FileOps

__all__ = ["SimulatedDisk"]


@dataclass
class _File:
    synced: bytes = b""
    unsynced: list[tuple[int, int]] = field(default_factory=list)
    lost: list[tuple[int, int]] = field(default_factory=list)


def _minus(ranges: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    kept = []
    for a, b in ranges:
        if b <= start or a >= end:
            kept.append((a, b))
            continue
        if a < start:
            kept.append((a, start))
        if b > end:
            kept.append((end, b))
    return kept


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _locked(method: _Method) -> _Method:
    @functools.wraps(method)
    def locked(self: SimulatedDisk, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return cast(_Method, locked)


def _inode(path: str) -> int | None:
    """The inode of the file `path` names (None: none, or a directory)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return None if stat.S_ISDIR(st.st_mode) else st.st_ino


def _path_of(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


class SimulatedDisk(FileOps):
    """File operations on the real files that also track what has been synced."""

    def __init__(self, root: str, rng: random.Random) -> None:
        self.root = root
        self.rng = rng
        self.calls = 0
        self.cut_at: int | None = None  # the call at which the power goes
        self.dead = False
        # operation name -> (errno, how many more calls fail)
        self.faults: dict[str, tuple[int, int]] = {}
        # (operation, errno) faults that strike in this order: each at the next call of
        # its operation once the ones before it struck (errno 0: that call goes through)
        self.sequence: list[tuple[str, int]] = []
        self.refused: list[str] = []  # paths whose unlink failed
        # Files are known by (inode, generation): an inode number is reused once its file
        # is gone, and the new file must not inherit the old one's synced content or the
        # ranges a failed sync lost (it did: a compressed copy written after a deleted
        # segment's inode came back read as damaged).
        self._files: dict[tuple[int, int], _File] = {}
        self._generations: dict[int, int] = {}
        self._listings: dict[str, dict[str, tuple[int, int]]] = {}
        self._lock = threading.RLock()

    # -- setup -----------------------------------------------------------------------------

    @_locked
    def settle(self) -> None:
        """Take everything under the root as on disk (the starting point of a test)."""
        self._files.clear()
        self._listings.clear()
        for directory, dirs, files in os.walk(self.root):
            self._listings[directory] = {
                name: self._key(os.lstat(os.path.join(directory, name)).st_ino)
                for name in dirs + files
            }
            for name in files:
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    self._files[self._key(os.fstat(f.fileno()).st_ino)] = _File(f.read())

    def fail(self, operation: str, errno: int, times: int = 1) -> None:
        self.faults[operation] = (errno, times)

    # -- the seam --------------------------------------------------------------------------

    def _enter(self, operation: str) -> None:
        self.calls += 1
        if self.cut_at is not None and self.calls >= self.cut_at:
            self.dead = True
        if self.dead:
            raise OSError(errnos.EIO, "the power is off")
        if self.sequence and self.sequence[0][0] == operation:
            code = self.sequence.pop(0)[1]
            if code:  # (0: this one goes through, the sequence's next entry waits)
                raise OSError(code, os.strerror(code))
        fault = self.faults.get(operation)
        if fault is not None and fault[1] > 0:
            self.faults[operation] = (fault[0], fault[1] - 1)
            raise OSError(fault[0], os.strerror(fault[0]))

    def _key(self, inode: int) -> tuple[int, int]:
        return inode, self._generations.get(inode, 0)

    def _file(self, fd: int) -> _File:
        return self._files.setdefault(self._key(os.fstat(fd).st_ino), _File())

    @_locked
    def pread(self, fd: int, length: int, offset: int) -> bytes:
        self._enter("pread")
        return super().pread(fd, length, offset)

    @_locked
    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._enter("pwrite")
        written = super().pwrite(fd, data, offset)
        tracked = self._file(fd)
        tracked.unsynced.append((offset, offset + written))
        tracked.lost = _minus(tracked.lost, offset, offset + written)
        return written

    @_locked
    def ftruncate(self, fd: int, length: int) -> None:
        self._enter("ftruncate")
        super().ftruncate(fd, length)
        tracked = self._file(fd)
        tracked.lost = _minus(tracked.lost, length, 1 << 62)
        tracked.unsynced.append((length, length))

    @_locked
    def pwrite_synced(self, fd: int, data: bytes, offset: int) -> int:
        written = self.pwrite(fd, data, offset)
        self._sync_range(fd, offset, offset + written, "fdatasync")
        return written

    @_locked
    def fill_zeros(self, fd: int, offset: int, length: int, *, sync: bool) -> None:
        self._enter("fill")
        data = bytes(length)
        written = 0
        while written < length:
            written += os.pwrite(fd, data[written:], offset + written)
        tracked = self._file(fd)
        tracked.unsynced.append((offset, offset + length))
        tracked.lost = _minus(tracked.lost, offset, offset + length)
        if sync:
            self._sync_range(fd, offset, offset + length, "fill")

    def _sync_range(self, fd: int, start: int, end: int, operation: str) -> None:
        """Sync of the range [start, end) and of the file's size (RWF_DSYNC)."""
        tracked = self._file(fd)
        try:
            self._enter(operation)
        except OSError:
            if not self.dead:
                tracked.lost.append((start, end))
                tracked.unsynced = _minus(tracked.unsynced, start, end)
            raise
        with open(f"/proc/self/fd/{fd}", "rb") as f:
            f.seek(start)
            written = f.read(end - start)
            size = os.fstat(f.fileno()).st_size
        content = bytearray(tracked.synced[:size].ljust(size, b"\0"))
        content[start : start + len(written)] = written
        tracked.synced = bytes(content)
        tracked.unsynced = _minus(tracked.unsynced, start, end)

    def fsync(self, fd: int) -> None:
        self._sync(fd, "fsync")

    def fdatasync(self, fd: int) -> None:
        self._sync(fd, "fdatasync")

    @_locked
    def _sync(self, fd: int, operation: str) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            self._enter(operation)
            directory = _path_of(fd)
            self._listings[directory] = {
                name: self._key(os.lstat(os.path.join(directory, name)).st_ino)
                for name in os.listdir(directory)
            }
            return
        tracked = self._file(fd)
        try:
            self._enter(operation)
        except OSError:
            if not self.dead:
                # Linux after a failed writeback: the pages are clean, the data is not on
                # disk, and no later sync writes it.
                tracked.lost.extend(r for r in tracked.unsynced if r[1] > r[0])
                tracked.unsynced.clear()
            raise
        with open(f"/proc/self/fd/{fd}", "rb") as f:
            content = bytearray(f.read())
        for start, end in tracked.lost:
            if start >= len(content):
                continue
            old = tracked.synced[start:end].ljust(end - start, b"\0")
            content[start:end] = old[: len(content[start:end])]
        tracked.synced = bytes(content)
        tracked.unsynced.clear()

    @_locked
    def replace(self, source: str, destination: str) -> None:
        self._enter("replace")
        gone = _inode(destination)
        super().replace(source, destination)
        if gone is not None and gone != _inode(destination):
            self._generations[gone] = self._generations.get(gone, 0) + 1

    @_locked
    def rename(self, source: str, destination: str) -> None:
        self._enter("rename")
        gone = _inode(destination)
        super().rename(source, destination)
        if gone is not None and gone != _inode(destination):
            self._generations[gone] = self._generations.get(gone, 0) + 1

    @_locked
    def unlink(self, path: str) -> None:
        try:
            self._enter("unlink")
        except OSError:
            self.refused.append(path)
            raise
        st = os.lstat(path)
        super().unlink(path)
        if st.st_nlink <= 1:
            self._generations[st.st_ino] = self._generations.get(st.st_ino, 0) + 1

    # -- the power cut ---------------------------------------------------------------------

    @_locked
    def power_cut(self) -> None:
        """Leave only what the disk holds (call after the journal was abandoned)."""
        self.dead = True
        shutil.rmtree(os.path.join(self.root, "index"), ignore_errors=True)
        for directory in sorted(self._listings, key=len):
            if not os.path.isdir(directory) or os.path.basename(directory) == "index":
                continue
            listing = self._listings[directory]
            for name in os.listdir(directory):
                path = os.path.join(directory, name)
                if name not in listing and name != "index":
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path)
                    else:
                        os.unlink(path)
            for name, inode in listing.items():
                path = os.path.join(directory, name)
                tracked = self._files.get(inode)
                if path in self._listings or name == "index" or os.path.isdir(path):
                    continue  # a directory: handled as its own listing
                self._restore(path, inode, tracked)

    def _restore(self, path: str, inode: tuple[int, int], tracked: _File | None) -> None:
        content = bytearray(tracked.synced if tracked is not None else b"")
        try:
            current_stat = os.lstat(path)
        except FileNotFoundError:
            current_stat = None
        found = None if current_stat is None else self._key(current_stat.st_ino)
        if found == inode and tracked is not None:
            with open(path, "rb") as f:
                current = f.read()
            # Some of what was written after the last sync may have reached the disk: of
            # each write, nothing, all of it or its start (a torn write), inside the
            # synced size as past it. (What a failed sync dropped is in no such range.)
            for start, end in tracked.unsynced:
                end = min(end, len(current))
                if end <= start:
                    continue
                kept = self.rng.choice((0, end - start, self.rng.randrange(end - start + 1)))
                if len(content) < start:
                    content.extend(bytes(start - len(content)))
                content[start : start + kept] = current[start : start + kept]
        with open(path, "wb") as f:
            f.write(content)
