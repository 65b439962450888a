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

The watches of every journal of the process are in one inotify instance, whose thread
wakes each journal's change source through an eventfd of its own (`inotify_hub`). `open`
returns None where inotify is missing or refused (not Linux, no descriptors, instance or
watches left), and the waiter polls instead (a warning on the `journal` logger says so,
once per process and error).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import threading
from collections.abc import Sequence
from typing import Final

from .inotify_hub import CHANGED, Member, available, join, leave, rewatch

__all__ = ["MISSING_POLL_S", "DirectoryChanges"]

# How often the head is read while a watched directory is missing.
MISSING_POLL_S: Final = 0.002

_log: Final = logging.getLogger("journal")

# The errors `_say_polling` has logged (a deliberate module-level set: once per process).
_SAID: Final[set[int]] = set()


def _say_polling(number: int, what: str) -> None:
    """Log, once per process and error, that a journal polls for want of inotify: silent,
    200 tenant journals with a follower each took 110% of a core while idle, the 72 past
    the user's 128 inotify instances polling every 2 ms (when each journal took one)."""
    if number in _SAID:
        return
    _SAID.add(number)
    if number == errno.EMFILE and what == "instance":
        limits = (
            "the user's inotify instances are used up (fs.inotify.max_user_instances = "
            f"{_limit('max_user_instances')}, shared by all its processes; a process "
            "takes one while any of its journals has followers), or this process's "
            "descriptors (ulimit -n)"
        )
    elif number == errno.EMFILE:
        limits = "this process's descriptors are used up (ulimit -n)"
    elif number == errno.ENOSPC:
        limits = (
            "the user's inotify watches are used up (fs.inotify.max_user_watches = "
            f"{_limit('max_user_watches')}; one per store directory followed)"
        )
    else:
        limits = os.strerror(number)
    _log.warning(
        "no inotify %s for a journal's followers: %s. Such journals poll their store every "
        "2 ms instead (a few percent of a core each while idle): raise the limit (sysctl "
        "fs.inotify.max_user_instances, fs.inotify.max_user_watches, ulimit -n), or open "
        "fewer journals. Said once per process.",
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
    """A journal's watches on `directories`, in the process's inotify instance, and the
    eventfd its waiter thread sleeps on (woken by that instance's thread, or by an
    `interrupt`).

    `wait(timeout)` returns True when something may have changed (an event came, or a
    watch is missing: look at the head again), False after `timeout` or an `interrupt()`
    (any thread), which ends a wait now; `close()` gives up the watches (each shared with
    the process's other journals watching the same directory) and the eventfd."""

    def __init__(self, member: Member, directories: Sequence[str]):
        self._member = member
        self._wake = member.wake
        self._directories = [os.fsencode(d) for d in directories]
        self._poller = select.poll()
        self._poller.register(self._wake, select.POLLIN)
        self._pid = os.getpid()
        # `interrupt` (any thread) writes to the eventfd only while it is open.
        self._closing = threading.Lock()
        self.closed = False

    @classmethod
    def open(cls, directories: Sequence[str]) -> DirectoryChanges | None:
        """Watch `directories` (None: no inotify here, or no instance, watch or
        descriptor left)."""
        if not available():
            return None
        member = join()
        if isinstance(member, tuple):
            _say_polling(member[1], member[0])
            return None
        changes = cls(member, directories)
        if changes._rewatch() == errno.ENOSPC:
            changes.close()
            return None
        return changes

    def _rewatch(self) -> int | None:
        """Add the watches that are missing: None when every directory is watched, else
        the error number of one that could not be."""
        number = rewatch(self._member, self._directories)
        if number == errno.ENOSPC:
            _say_polling(number, "watch")
        return number

    def wait(self, timeout: float) -> bool:
        watched = self._rewatch() is None
        if not watched:
            # A directory was replaced (and is not back yet) or cannot be watched: poll.
            timeout = min(timeout, MISSING_POLL_S)
        changed = False
        if self._poller.poll(max(0, round(timeout * 1000))):
            with contextlib.suppress(BlockingIOError):
                changed = os.eventfd_read(self._wake) >= CHANGED
        # (An `interrupt` alone is no change: the waiter sets its next wait by it, a new
        # follower's stop to check. Taken for one, it cost a head read, and from
        # 2026-12-05 the looks again after a change the head did not show: a sync watch
        # with a stop read the head 6 times per commit of another process, not 2-3;
        # a review.)
        return changed or not watched

    def interrupt(self) -> None:
        if os.getpid() != self._pid:
            return  # (a forked child: the eventfd is the parent's waiter's too)
        with self._closing:
            if not self.closed:
                with contextlib.suppress(OSError):
                    os.eventfd_write(self._wake, 1)

    def close(self) -> None:
        if os.getpid() != self._pid:
            # A forked child's copy: the watches are the parent's, the lock may have been
            # held by a thread that is not here.
            if not self.closed:
                self.closed = True
                os.close(self._wake)
            return
        with self._closing:
            if self.closed:
                return
            self.closed = True
        hub_thread = leave(self._member)  # (no event is delivered to the eventfd after this)
        os.close(self._wake)
        if hub_thread is not None and hub_thread is not threading.current_thread():
            # The last journal's close returns once the instance is closed (the thread
            # takes no lock this thread holds; a thread never started ends at once).
            with contextlib.suppress(RuntimeError):
                hub_thread.join()
