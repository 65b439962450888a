"""File helpers of the local engine and its named fault points.

Every write, sync, read, rename and delete the engine makes on the store's files goes
through one `FileOps` object, and the places where a crash, a race or a failure matters
call `FileOps.point(name)` with a name from `FAULT_POINTS`. Tests (and the hardening
work) pass a subclass to `Journal.open(..., file_ops=...)` that pauses or raises there:
moving code keeps the seam armed, unlike patching a module global by name.
"""

from __future__ import annotations

import os
from typing import Final

__all__ = ["DEFAULT_FILE_OPS", "FAULT_POINTS", "FileOps", "fsync_dir", "write_atomic"]

# Name -> where it fires (SPEC.md "Fault points" lists the same).
FAULT_POINTS: Final = {
    "commit.queued": "a request joined the commit queue (before it waits or leads)",
    "commit.batch_taken": "the leader took its batch (before it plans it)",
    "commit.view_flush": "the frame is written and synced; the view update starts",
    "plan.operation": "one operation is about to be planned inside the batch",
    "segments.read": "a scan of a sealed plain segment read its next chunk (before use)",
    "segments.tail_read": "a scan of the active segment read its next chunk (before use)",
    "retention.read_sidecar": "a retention pass reads a sealed segment's sidecar",
    "retention.delete": "a committed retention pass is about to delete dead segments' files",
    "retention.deleted": "a committed retention pass deleted dead segments' files",
    "compaction.live_frames": "compaction computed a segment's live frames (no lock held)",
    "compaction.rewritten": "compaction wrote its copy (before the swap under the lock)",
    "compaction.replaced": "the swap renamed the copy into place (segment files lock held)",
}


class FileOps:
    """The local engine's file operations (`os` by default) and its fault points."""

    def point(self, name: str, detail: object = None) -> None:
        """Called at the named place; does nothing unless a test overrides it."""

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        return os.pread(fd, length, offset)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        return os.pwrite(fd, data, offset)

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


def fsync_dir(directory: str, ops: FileOps = DEFAULT_FILE_OPS) -> None:
    """Sync a directory: a created, renamed or deleted file can vanish after a power cut
    unless its directory entry is synced too."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ops.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: str, data: bytes, ops: FileOps = DEFAULT_FILE_OPS, *, mode: int = 0o644
) -> None:
    """Write `data` to `path` so a crash leaves the old file or the new one, never a mix:
    a temporary file (named after this process), fsync, rename, fsync of the directory."""
    temporary = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        ops.fsync(fd)
    finally:
        os.close(fd)
    ops.replace(temporary, path)
    fsync_dir(os.path.dirname(path) or ".", ops)
