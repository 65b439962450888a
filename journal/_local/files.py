"""File helpers of the local engine and its named fault points.

Every write, sync, read, rename and delete the engine makes on the store's files goes
through one `FileOps` object, and the places where a crash, a race or a failure matters
call `FileOps.point(name)` with a name from `FAULT_POINTS`. Tests (and the hardening
work) pass a subclass to `Journal.open(..., file_ops=...)` that pauses or raises there:
moving code keeps the seam armed, unlike patching a module global by name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_FILE_MODE",
    "DEFAULT_FILE_OPS",
    "DEFAULT_PERMISSIONS",
    "FAULT_POINTS",
    "FileOps",
    "NotRegularFile",
    "Permissions",
    "check_regular",
    "discarded_on_failure",
    "fsync_dir",
    "open_regular",
    "write_again",
    "write_atomic",
]

# What a store creates unless told otherwise: owner-only (SPEC.md "Private files").
DEFAULT_FILE_MODE: Final = 0o600

# Name -> where it fires (SPEC.md "Fault points" lists the same).
FAULT_POINTS: Final = {
    "commit.queued": "a request joined the commit queue (before it waits or leads)",
    "commit.batch_taken": "the leader took its batch (before it plans it)",
    "commit.view_flush": "the frame is written and synced; the view update starts",
    "commit.view_commit": "the batch is planned and its view updated; LMDB commits next",
    "commit.refused": "a commit failed after writing its frame; the cut's write lock is next",
    "plan.operation": "one operation is about to be planned inside the batch",
    "segments.read": "a scan of a sealed plain segment read its next chunk (before use)",
    "segments.tail_read": "a scan of the active segment read its next chunk (before use)",
    "segments.keep_tail": "a writer keeps a copy of the bytes it cuts after the last frame",
    "segments.mark_os": 'an "os" writer makes (or syncs) its mark before its first frame',
    "open.sidecar_check": "a writable open checks a sealed segment's sidecar (detail: its base)",
    "open.view_behind": "a read-only open found the store's view behind the log (detail: its head)",
    "projection.segment": "a projection opens the next segment it listed (detail: its base)",
    "retention.read_sidecar": "a retention pass reads a sealed segment's sidecar",
    "retention.read_frame": "an age window reads a frame an import staged, for its events' "
    "commit times (detail: (segment base, frame offset))",
    "retention.rows": "a retention pass chose the session rows it reads (detail: how many)",
    "retention.delete": "a committed retention pass is about to delete dead segments' files",
    "retention.deleted": "a committed retention pass deleted dead segments' files",
    "compaction.live_frames": "compaction computed a segment's live frames (no lock held)",
    "compaction.rewritten": "compaction wrote its copy (before the swap under the lock)",
    "compaction.replaced": "the swap renamed the copy into place (segment files lock held)",
    "compaction.sealed": "compact() sealed the active segment; its commit moves the view's head",
    "zerofill.start": "the zero-filler's thread is about to start (none is recorded yet)",
    "zerofill.step": "the zero-filler holds a segment's extension lock; its step comes next",
    "zerofill.filled": "the zero-filler wrote (and synced) a step of zeros, lock released",
    "sessions.list": "a listing of sessions reads its next page of rows (detail: the id "
    "it reads after, None for the first page)",
    "lease.released": "a lease's release is recorded (or failed); its lock is dropped next",
    "lease.unlinked": "a lease's holder removed its lock file; it still holds the lock",
    "store.create": "an open creating the store made a directory or store.json's temporary",
    "store.missing": "an open found no store.json (detail: the store's path); it looks for "
    "segment files there next",
}

# What `fill_zeros` writes from (read-only, shared), a piece at a time.
_FILL_CHUNK: Final = 64 << 10
_ZEROS: Final = bytes(_FILL_CHUNK)
# 0 where the platform has no RWF_DSYNC: `pwrite_synced` then writes and `fdatasync`s.
_RWF_DSYNC: Final[int] = getattr(os, "RWF_DSYNC", 0)


class FileOps:
    """The local engine's file operations (`os` by default) and its fault points."""

    def point(self, name: str, detail: object = None) -> None:
        """Called at the named place; does nothing unless a test overrides it."""

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        return os.pread(fd, length, offset)

    def pread_into(self, fd: int, buffer: bytearray | memoryview, offset: int) -> int:
        """Read up to `len(buffer)` bytes at `offset` into `buffer`; returns how many.

        The read path's chunk read (one reused buffer instead of a fresh object per
        chunk). A subclass that overrides `pread` gets its `pread` called here too, so a
        test's faults and checks on reads stay armed without overriding this as well."""
        if type(self).pread is not FileOps.pread:
            data = self.pread(fd, len(buffer), offset)
            buffer[: len(data)] = data
            return len(data)
        return os.preadv(fd, (buffer,), offset)

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def pwrite_synced(self, fd: int, data: bytes | bytearray, offset: int) -> int:
        """Write `data` at `offset` and make that range durable (with the file size it
        needs) in one call: `pwrite` then a sync of that range only (`RWF_DSYNC`). A
        failure counts as a failed sync: what was written may never reach the disk."""
        return _pwrite_synced(fd, data, offset)

    def fill_zeros(self, fd: int, offset: int, length: int, *, sync: bool) -> None:
        """Write `length` zero bytes at `offset` (the zero-filler's step), and make that
        range durable when `sync`.

        In writes of `_FILL_CHUNK` bytes, then one `fdatasync`: a buffered write holds the
        file's inode lock while it copies, and a writer appending a frame to the same file
        waits for it (spinning, on Linux), so one 1 MiB write could stall a commit for as
        long as the copy took (section 15)."""
        view = memoryview(_ZEROS)
        end = offset + length
        while offset < end:
            offset += os.pwrite(fd, view[: min(_FILL_CHUNK, end - offset)], offset)
        if sync:
            os.fdatasync(fd)

    def free_bytes(self, fd: int) -> int:
        """The bytes an unprivileged writer may still use on the file system of `fd`."""
        stat = os.fstatvfs(fd)
        return stat.f_bavail * stat.f_frsize

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def replace(self, source: str, destination: str) -> None:
        os.replace(source, destination)

    def rename(self, source: str, destination: str) -> None:
        os.rename(source, destination)

    def unlink(self, path: str) -> None:
        os.unlink(path)


DEFAULT_FILE_OPS: Final = FileOps()


class NotRegularFile(OSError):
    """A file of the store that is something else: a FIFO, a device, a socket or a
    directory (a mistaken `mkfifo`, a hostile swap). Opening a FIFO blocks until a writer
    appears, that is for ever; so no file of the store is opened without `open_regular`.
    An `OSError`, so every path that reports the disk's errors reports this one too
    (naming the file); readers of the log make it `JournalCorrupt` where a damaged file
    would be."""

    def __init__(self, path: str, mode: int) -> None:
        self.kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
        super().__init__(f"{path} is {self.kind}, not a regular file")
        self.path = path


_KINDS: Final = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link to a missing file",
}


def open_regular(path: str, flags: int) -> int:
    """`os.open(path, flags)` for a file of the store: `NotRegularFile` unless it is a
    regular file. Opened with O_NONBLOCK, which changes nothing for a regular file (Linux
    ignores it there) but makes the open of a FIFO return at once instead of waiting for
    its other end (for writing without a reader it fails with ENXIO: asked here too)."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENXIO:
            check_regular(path)
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_regular(path: str) -> None:
    """`NotRegularFile` when `path` exists and is not a regular file (for files another
    library opens: LMDB's); a missing file passes."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):  # (LMDB would create its target, or fail to)
            raise NotRegularFile(path, stat.S_IFLNK) from None
        return
    if not stat.S_ISREG(mode):
        raise NotRegularFile(path, mode)


def _pwrite_synced(fd: int, data: bytes | bytearray | memoryview, offset: int) -> int:
    if not _RWF_DSYNC:
        written = os.pwrite(fd, data, offset)
        os.fdatasync(fd)
        return written
    return os.pwritev(fd, [data], offset, _RWF_DSYNC)


@dataclass(frozen=True, slots=True)
class Permissions:
    """The permission bits of everything a store creates: files get `file` exactly (the
    umask does not narrow it, so every process writing a store creates what the store
    says), directories `directory`. Existing files and directories are never changed."""

    file: int = DEFAULT_FILE_MODE

    @property
    def directory(self) -> int:
        """The file mode plus a search (x) bit wherever it has a read bit: 0o640 -> 0o750."""
        return self.file | (self.file & 0o444) >> 2

    def create_file(self, path: str, flags: int) -> int:
        """Open `path` with `flags | O_CREAT` and give it the file mode. Only for files the
        caller owns by name (temporary files, or with O_EXCL)."""
        fd = os.open(path, flags | os.O_CREAT, self.file)
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != self.file:
                os.fchmod(fd, self.file)  # the umask narrowed it
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_or_create(self, path: str, flags: int) -> int:
        """Open `path`, creating it with the file mode when missing (lock files): an
        existing file keeps its mode."""
        while True:
            try:
                return self.create_file(path, flags | os.O_EXCL)
            except FileExistsError:
                pass
            try:
                return open_regular(path, flags)
            except FileNotFoundError:
                if os.path.islink(path):
                    # O_EXCL refuses the name and the open finds nothing behind it: a
                    # dangling symbolic link, which no retry creates (it spun for ever).
                    raise NotRegularFile(path, stat.S_IFLNK) from None
                continue  # deleted between the two opens: create it after all

    def make_dirs(self, path: str) -> None:
        """Create the directory `path` with the directory mode; an existing one keeps its
        mode. Missing parents (above a store) are made as `mkdir -p` makes them (the
        umask's mode). A setgid bit inherited from the parent is kept, so new directories
        of a group-shared store stay in its group."""
        try:
            os.mkdir(path, self.directory)
        except FileExistsError:
            return
        except FileNotFoundError:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            try:
                os.mkdir(path, self.directory)
            except FileExistsError:
                return
        mode = os.stat(path).st_mode
        if stat.S_IMODE(mode) & 0o777 != self.directory:
            os.chmod(path, self.directory | (mode & stat.S_ISGID))

    def fix_created(self, path: str) -> None:
        """Give a file that a library created (LMDB's) the file mode."""
        if stat.S_IMODE(os.stat(path).st_mode) != self.file:
            os.chmod(path, self.file)


DEFAULT_PERMISSIONS: Final = Permissions()


def fsync_dir(directory: str, ops: FileOps = DEFAULT_FILE_OPS) -> None:
    """Sync a directory: a created, renamed or deleted file can vanish after a power cut
    unless its directory entry is synced too."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ops.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: str,
    data: bytes,
    ops: FileOps = DEFAULT_FILE_OPS,
    permissions: Permissions = DEFAULT_PERMISSIONS,
) -> None:
    """Write `data` to `path` so a crash leaves the old file or the new one, never a mix:
    a temporary file (named after this process), fsync, rename, fsync of the directory.
    The new file has the file mode of `permissions`."""
    temporary = f"{path}.{os.getpid()}.tmp"
    fd = permissions.create_file(temporary, os.O_WRONLY | os.O_TRUNC)
    with discarded_on_failure(temporary, ops):
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            ops.fsync(fd)
        finally:
            os.close(fd)
        ops.replace(temporary, path)
    fsync_dir(os.path.dirname(path) or ".", ops)


@contextlib.contextmanager
def discarded_on_failure(temporary: str, ops: FileOps = DEFAULT_FILE_OPS) -> Iterator[None]:
    """Delete the temporary file `temporary` if the block raises, best effort (the
    block's own error is the one raised). A temporary file named after this process is
    skipped by the clean-up at the next writer open while this process lives (SPEC.md 3),
    so the failing call is the only one that deletes it."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            ops.unlink(temporary)
        raise


# The reads and writes in which `write_again` writes a file's bytes again.
_REWRITE_CHUNK: Final = 1 << 20


def write_again(ops: FileOps, fd: int, offset: int, stop: int) -> None:
    """Write the bytes of a file (a segment) from `offset` to `stop` again, as they read:
    pages a failed writeback marked clean become dirty again, and the next sync writes
    them (SPEC 14.4)."""
    while offset < stop:
        data = ops.pread(fd, min(_REWRITE_CHUNK, stop - offset), offset)
        if not data:
            break
        written = 0
        while written < len(data):
            count = ops.pwrite(fd, data[written:], offset + written)
            if count <= 0:
                raise OSError(errno.EIO, "a write of a segment wrote nothing")
            written += count
        offset += len(data)
