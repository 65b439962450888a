"""Opening an LMDB environment so that a hostile file or a full disk is an error, never a
hang or a signal: its two files are checked to be regular files, and its lock file is
allocated on disk before LMDB maps it (SPEC.md "Failure handling: I/O faults").

LMDB sizes `lock.mdb` with `ftruncate`, which makes a sparse file, and writes its header
and reader table through a shared mapping: a page of it the file system cannot back (a
full disk or a spent quota) is SIGBUS when LMDB first writes to it, at the open or when a
reader slot lands on a page never touched before, which no handler can turn into an
error. Allocated here first with `posix_fallocate`, every page LMDB can touch is backed,
and a full disk is ENOSPC from the allocation. LMDB keeps a lock file at least as large
as it needs (it then has more reader slots): the allocation never shrinks one.

The data file is not written through a mapping (no environment is opened with
`writemap`): LMDB writes it with `pwrite`, whose ENOSPC comes back as an `lmdb.Error`
(`failures.os_error_of`); only a data file shorter than its meta pages can make its read
mapping fault, which `lmdbfile` checks before a view is opened.

It also keeps the registry of the environments this process has open, so that a second
open of one is refused before any of its files is opened (and closed, which would drop the
process's locks on it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from typing import Final

import lmdb

from .files import NotRegularFile, Permissions, check_regular, open_regular

__all__ = [
    "MAX_READERS",
    "OPENING",
    "check_files",
    "lock_file_bytes",
    "prepare_environment",
    "refuse_if_open_here",
    "register_open",
    "unregister_open",
]

# The reader slots of the store's view (SPEC 7.2).
MAX_READERS: Final = 1024
# LMDB 0.9's lock file: a header (`MDB_txninfo`, 192 bytes on 64-bit Linux, which holds
# the first reader slot) and one 64-byte `MDB_reader` per further slot (measured with
# py-lmdb 3.0.0: 1024 readers make 65,664 bytes; 126, its default, 8,192).
_LOCK_HEADER_BYTES: Final = 192
_READER_SLOT_BYTES: Final = 64
# What keeps the allocation from running (the file system has no fallocate): LMDB's own
# sparse file then, as before.
_NOT_SUPPORTED: Final = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


def lock_file_bytes(max_readers: int) -> int:
    """The size LMDB gives a new lock file for `max_readers` reader slots."""
    return (max_readers - 1) * _READER_SLOT_BYTES + _LOCK_HEADER_BYTES


def check_files(path: str) -> None:
    """`files.NotRegularFile` unless LMDB's files in the directory `path` are regular
    files (or missing): its open of a FIFO would wait for a writer for ever."""
    for name in ("data.mdb", "lock.mdb"):
        check_regular(os.path.join(path, name))


def prepare_environment(path: str, max_readers: int, permissions: Permissions | None) -> None:
    """Make the directory `path` safe for `lmdb.open(path, max_readers=max_readers)`: its
    files are regular files (else `files.NotRegularFile`: LMDB's open of a FIFO would wait
    for a writer for ever) and its lock file is allocated (an `OSError` such as ENOSPC
    when the disk cannot hold it). `permissions`: the lock file is created with its mode
    when missing; None creates nothing (a read-only reader leaves that to LMDB)."""
    check_files(path)
    _allocate_lock_file(os.path.join(path, "lock.mdb"), max_readers, permissions)


def _allocate_lock_file(path: str, max_readers: int, permissions: Permissions | None) -> None:
    flags = os.O_RDWR | os.O_CLOEXEC
    try:
        fd = (
            open_regular(path, flags)
            if permissions is None
            else permissions.open_or_create(path, flags)
        )
    except NotRegularFile:
        raise
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        # Missing (a reader creates nothing), or not this user's to write: LMDB opens it
        # (or refuses) itself, as it did before this step.
        return
    try:
        size = max(os.fstat(fd).st_size, lock_file_bytes(max_readers))
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno not in _NOT_SUPPORTED:
                raise OSError(
                    e.errno, f"{e.strerror} (allocating the view's lock file)", path
                ) from e
    finally:
        os.close(fd)


# The files (device, inode of `data.mdb` and `lock.mdb`) of every environment this
# process has open, with the pid that opened it (a forked child's copies are not its own)
# and whether it opened it read-only (which the refusal of a second open says).
# LMDB's locks are POSIX fcntl locks, which a process loses on *any* close of a descriptor
# of the file: a second open of an environment this process has open, which py-lmdb
# refuses only after `prepare_environment` opened and closed the lock file, released the
# locks of the first. Then the next process to open the view took it for unused and
# reinitialized its lock file, wiping the reader table (a long read, such as `verify()`,
# of this process then read pages the writer reused: `lmdb.BadDbiError` escaped it) and
# the writer mutex. A read-only journal opened beside a writable one in one process did
# that, found by a long-running trial.
_OPEN_FILES: dict[tuple[int, int], tuple[int, bool]] = {}
# Held by a thread from its check that an environment is not open here until it has
# registered the one it opened (`View`), so two threads of one process opening the store
# cannot both pass the check: the second's open would close the first's lock file.
OPENING: Final = threading.RLock()


def _environment_files(path: str) -> list[tuple[int, int]]:
    found = []
    for name in ("data.mdb", "lock.mdb"):
        with contextlib.suppress(OSError):
            st = os.stat(os.path.join(path, name))
            found.append((st.st_dev, st.st_ino))
    return found


def refuse_if_open_here(path: str) -> None:
    """`lmdb.Error` ("already open", as py-lmdb says it; "read-only" added when it was
    opened so) when this process has the environment at `path` open, before any of its
    files is opened."""
    pid = os.getpid()
    with OPENING:
        for key in _environment_files(path):
            opener, readonly = _OPEN_FILES.get(key, (0, False))
            if opener == pid:
                how = " (read-only)." if readonly else "."
                raise lmdb.Error(f"The environment {path!r} is already open in this process{how}")


def register_open(path: str, readonly: bool) -> list[tuple[int, int]]:
    keys = _environment_files(path)
    with OPENING:
        for key in keys:
            _OPEN_FILES[key] = (os.getpid(), readonly)
    return keys


def unregister_open(keys: list[tuple[int, int]]) -> None:
    pid = os.getpid()
    with OPENING:
        for key in keys:
            if _OPEN_FILES.get(key, (0, False))[0] == pid:
                del _OPEN_FILES[key]
