"""Change notification for the shared waiter (Linux): an inotify watch on the directory
whose files a commit writes last, so the waiter thread sleeps until another process
commits instead of polling the head.

A commit of the local engine ends with LMDB writing the view's meta page (`pwrite` on
`index/data.mdb`; the view is not opened with `writemap`, so every write is a write
call that inotify reports). inotify queues the event after the write returns; a write
made after a head read queues another event. A head read right after the event may still
miss the commit (LMDB publishes the transaction id in its lock file's shared memory after
that write): the waiter looks again soon after a change that did not show (`waiter`).
A read-only journal with a private view projects the segments itself, so it watches
`segments/` (frame writes, new segments) instead.

Standard library only (`ctypes` for `inotify_init1` and `inotify_add_watch`); `open`
returns None where inotify is missing or refused (not Linux, no descriptors or watches
left), and the waiter polls instead (a warning on the `journal` logger says so, once per
process: the user's inotify instances, 128 by default, are shared by all its processes).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import struct
import sys
from collections.abc import Sequence
from typing import Final

__all__ = ["MISSING_POLL_S", "DirectoryChanges"]

# How often the head is read while a watched directory is missing.
MISSING_POLL_S: Final = 0.002

_IN_MODIFY: Final = 0x002
_IN_MOVED_TO: Final = 0x080
_IN_CREATE: Final = 0x100
_IN_DELETE: Final = 0x200
_IN_DELETE_SELF: Final = 0x400
_IN_MOVE_SELF: Final = 0x800
_IN_IGNORED: Final = 0x8000
_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = os.O_CLOEXEC
# Writes, and files or directories appearing, going or being replaced. Not IN_ACCESS,
# IN_OPEN or IN_CLOSE_*: followers' own reads must not wake the waiter.
_MASK: Final = _IN_MODIFY | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF
_EVENT: Final = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC: Final = _libc()  # loaded once (a deliberate cache: the C library of this process)

_log: Final = logging.getLogger("journal")

# The errors `_say_polling` has logged (a deliberate module-level set: once per process).
_SAID: Final[set[int]] = set()


def _say_polling(number: int, what: str) -> None:
    """Log, once per process and error, that a journal polls for want of inotify: silent,
    200 tenant journals with a follower each took 110% of a core while idle, the 72 past
    the user's 128 inotify instances polling every 2 ms (helper trial h24e)."""
    if number in _SAID:
        return
    _SAID.add(number)
    if number == errno.EMFILE:
        limits = (
            "the user's inotify instances are used up (fs.inotify.max_user_instances = "
            f"{_limit('max_user_instances')}, shared by all its processes; a journal "
            "takes one while anything follows it), or this process's descriptors (ulimit -n)"
        )
    elif number == errno.ENOSPC:
        limits = (
            "the user's inotify watches are used up (fs.inotify.max_user_watches = "
            f"{_limit('max_user_watches')})"
        )
    else:
        limits = os.strerror(number)
    _log.warning(
        "no inotify %s for a journal's followers: %s. Such journals poll their store every "
        "2 ms instead (a few percent of a core each while idle): raise the limit (sysctl "
        "fs.inotify.max_user_instances, fs.inotify.max_user_watches), or open fewer "
        "journals. Said once per process.",
        what,
        limits,
    )


def _limit(name: str) -> str:
    try:
        with open(f"/proc/sys/fs/inotify/{name}") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


class DirectoryChanges:
    """An inotify descriptor watching `directories`, and an eventfd to interrupt a wait.

    `wait(timeout)` returns True when something may have changed (an event was read, or
    a watch is missing: look at the head again), False after `timeout` or an
    `interrupt()` (any thread), which ends a wait now; `close()` releases both
    descriptors."""

    def __init__(self, libc: ctypes.CDLL, fd: int, wake: int, directories: Sequence[str]):
        self._libc = libc
        self._fd = fd
        self._wake = wake
        self._directories = [os.fsencode(d) for d in directories]
        self._watches: dict[int, bytes] = {}
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)
        self._poller.register(wake, select.POLLIN)
        self._exhausted = False  # the last add_watch failed for want of watches (ENOSPC)
        self.closed = False

    @classmethod
    def open(cls, directories: Sequence[str]) -> DirectoryChanges | None:
        """Watch `directories` (None: no inotify here, or no instance or watch left)."""
        libc = _LIBC
        if libc is None:
            return None
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            _say_polling(ctypes.get_errno(), "instance")
            return None
        try:
            wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except (OSError, AttributeError):
            os.close(fd)
            return None
        changes = cls(libc, fd, wake, directories)
        if not changes._rewatch() and changes._exhausted:
            changes.close()
            return None
        return changes

    def _rewatch(self) -> bool:
        """Add the watches that are missing; whether every directory is watched."""
        watched = set(self._watches.values())
        for directory in self._directories:
            if directory in watched:
                continue
            wd = self._libc.inotify_add_watch(self._fd, directory, _MASK)
            if wd < 0:
                number = ctypes.get_errno()
                self._exhausted = number == errno.ENOSPC
                if self._exhausted:
                    _say_polling(number, "watch")
                return False
            self._watches[wd] = directory
        return True

    def wait(self, timeout: float) -> bool:
        watched = self._rewatch()
        if not watched:
            # A directory was replaced (and is not back yet) or cannot be watched: poll.
            timeout = min(timeout, MISSING_POLL_S)
        ready = self._poller.poll(max(0, round(timeout * 1000)))
        if ready:
            self._drain()
        # (An `interrupt` alone is no change: the waiter sets its next wait by it, a new
        # follower's stop to check. Taken for one, it cost a head read, and from
        # 2026-12-05 the looks again after a change the head did not show: a sync watch
        # with a stop read the head 6 times per commit of another process, not 2-3;
        # review h20h.)
        return any(fd == self._fd for fd, _ in ready) or not watched

    def _drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._wake)
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                if mask & _IN_IGNORED:
                    # The directory went (renamed or deleted): watch the path again.
                    self._watches.pop(wd, None)

    def interrupt(self) -> None:
        with contextlib.suppress(OSError):
            os.eventfd_write(self._wake, 1)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        os.close(self._fd)
        os.close(self._wake)
