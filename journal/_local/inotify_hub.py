"""The process's one inotify instance, shared by the change sources of all its journals
(`inotify.DirectoryChanges`), and the daemon thread that reads its events and wakes the
change sources watching the directories they name.

A user has 128 inotify instances by default (`fs.inotify.max_user_instances`), shared by
all its processes. Until 2026-12-06 each journal with followers took one, so a process
with more such journals (one per tenant) had the rest poll their store every 2 ms: 200
journals with an idle follower each took 110% of a core, 300 took 121% (the 172 past the
limit polling). One instance per process leaves only the user's watches as a bound
(`fs.inotify.max_user_watches`, 8,192 or more): one per watched directory.

Each change source (`Member`) has an eventfd of its own, which its waiter thread polls.
The thread adds `CHANGED` to it for each batch of events in a directory the member
watches (`interrupt` adds 1: a wait tells the two apart by the sum it reads). inotify
gives the same watch descriptor for a directory watched twice (two journals on one store:
a read-only one beside a writer), so a watch is shared: its members are listed under its
descriptor and it is removed only when the last one leaves. When the directory goes
(replaced, deleted: `IN_IGNORED`), every member watching it is woken and adds its watch
again at its next wait (polling meanwhile).

Everything shared (the hub, its watches, its members) changes under `_HUBS.lock`, and
the thread writes to a member's eventfd only under it: a member leaves under it before
its eventfd is closed, so no write reaches a closed (or reused) descriptor. The thread
alone closes the hub's descriptors, when the last member left: the hub is retired then
(a member joining later opens another), and the last member's close joins the thread, so
a journal's close leaves no thread and no descriptor of it behind. `fork()` takes the
lock first, so the child inherits no half-made change; the child closes its copies of
the descriptors of every hub not closed yet (a retired one's too) and starts afresh
(its copies are the parent's instances: a read there would take the parent's events, a
watch removed there the parent's watch).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import struct
import sys
import threading
from collections.abc import Sequence
from typing import Final

from ..engine import start_thread

__all__ = ["CHANGED", "Member", "available", "join", "leave", "rewatch"]

# Added to a member's eventfd for a change (an interrupt adds 1).
CHANGED: Final = 1 << 32

_IN_MODIFY: Final = 0x002
_IN_MOVED_TO: Final = 0x080
_IN_CREATE: Final = 0x100
_IN_DELETE: Final = 0x200
_IN_DELETE_SELF: Final = 0x400
_IN_MOVE_SELF: Final = 0x800
_IN_Q_OVERFLOW: Final = 0x4000
_IN_IGNORED: Final = 0x8000
_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = os.O_CLOEXEC
# Writes, and files or directories appearing, going or being replaced. Not IN_ACCESS,
# IN_OPEN or IN_CLOSE_*: followers' own reads must not wake the waiter.
_MASK: Final = _IN_MODIFY | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF
_EVENT: Final = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)
_READ_BYTES: Final = 65536  # (at least 4,096 events a read)


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC: Final = _libc()  # loaded once (a deliberate cache: the C library of this process)


def available() -> bool:
    """Whether this system has inotify (Linux) and eventfd (else `join` refuses)."""
    return _LIBC is not None and hasattr(os, "eventfd")


class Member:
    """One change source's part of the hub: its eventfd (`wake`, which the change source
    owns and closes after `leave`) and the watch descriptor of each directory it watches
    now (changed under the hub's lock only)."""

    __slots__ = ("hub", "wake", "watched")

    def __init__(self, hub: _Hub, wake: int) -> None:
        self.hub = hub
        self.wake = wake
        self.watched: dict[bytes, int] = {}


class _Hub:
    """One inotify instance, the eventfd that wakes its thread to look whether any
    member is left (`stop`), and what watches whom (under `_HUBS.lock`)."""

    def __init__(self, libc: ctypes.CDLL, fd: int, stop: int) -> None:
        self.libc = libc
        self.fd = fd
        self.stop = stop
        self.members: set[Member] = set()
        self.watchers: dict[int, list[Member]] = {}  # wd -> its members (once per directory)
        self.thread: threading.Thread | None = None  # (its dispatch thread, once made)
        # Its descriptors are closed, or to be closed by its thread: nobody joins it.
        self.gone = False

    def close_descriptors(self) -> None:
        """(Its thread, or whoever knows no thread uses them: idempotent; under the lock.)"""
        self.gone = True
        _HUBS.unclosed.discard(self)
        for fd in (self.fd, self.stop):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = self.stop = -1

    def deliver(self, data: bytes) -> None:
        """Wake the members the events in `data` concern (under the lock)."""
        woken: set[Member] = set()
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size + length
            if mask & _IN_Q_OVERFLOW:  # (events were lost: everyone looks)
                woken.update(self.members)
                continue
            members = self.watchers.get(wd)
            if members is None:
                continue  # (a watch removed since, or its IN_IGNORED)
            woken.update(members)
            if mask & _IN_IGNORED:
                # The directory went (renamed or deleted): its members watch the path again.
                del self.watchers[wd]
                for member in members:
                    member.watched = {d: w for d, w in member.watched.items() if w != wd}
        for member in woken:
            # (EAGAIN: the sum is near its limit, already far past CHANGED.)
            with contextlib.suppress(OSError):
                os.eventfd_write(member.wake, CHANGED)

    def retire_if_unused(self) -> bool:
        """After its thread read `stop` (under the lock): whether it has no member left,
        closed then, and no longer the process's hub."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.stop)
        if self.members and not self.gone:
            return False
        _HUBS.forget(self)
        self.close_descriptors()
        return True


def _dispatch(hub: _Hub) -> None:
    """The hub's thread: read its events, wake whom they concern; end when no member is
    left. (Only this thread closes the hub's descriptors, so it may read outside the
    lock.)"""
    poller = select.poll()
    poller.register(hub.fd, select.POLLIN)
    poller.register(hub.stop, select.POLLIN)
    try:
        while True:
            ready = poller.poll()
            data = b""
            if any(fd == hub.fd for fd, _ in ready):
                with contextlib.suppress(BlockingIOError):
                    data = os.read(hub.fd, _READ_BYTES)
            with _HUBS.lock:
                if data:
                    hub.deliver(data)
                if (hub.gone or any(fd == hub.stop for fd, _ in ready)) and (
                    hub.retire_if_unused()
                ):
                    return
    finally:
        # (Ended by a failure: its members are woken and, their watches gone, poll.)
        with _HUBS.lock:
            if not hub.gone:
                _HUBS.forget(hub)
                for member in hub.members:
                    member.watched.clear()
                    with contextlib.suppress(OSError):
                        os.eventfd_write(member.wake, CHANGED)
                hub.close_descriptors()


class _Hubs:
    """The process's hub (None until a change source joins, and after the last left),
    and the lock everything shared changes under; safe across `fork()`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current: _Hub | None = None
        # Every hub whose descriptors are open: the current one, and those retired whose
        # thread has not closed them yet (a child closes its copies of all of them).
        self.unclosed: set[_Hub] = set()
        os.register_at_fork(
            before=self._before, after_in_parent=self._parent, after_in_child=self._child
        )

    def _before(self) -> None:
        self.lock.acquire()

    def _parent(self) -> None:
        self.lock.release()

    def forget(self, hub: _Hub) -> None:
        if self.current is hub:
            self.current = None

    def _child(self) -> None:
        # This thread took the lock before the fork; the hubs' threads are not here. The
        # child's copies of their descriptors are the parent's instances: closed, never
        # used. (Retired ones too: until 2026-12-06 only the current one, and a child
        # forked as the last journal's close retired it kept a copy of that instance.)
        self.current = None
        for hub in list(self.unclosed):
            hub.close_descriptors()
        self.lock = threading.Lock()


# The process's inotify instance (a deliberate module-level singleton: one per process).
_HUBS: Final = _Hubs()


def join() -> Member | tuple[str, int]:
    """A new member of the process's hub (opened now if there is none), with an eventfd
    of its own; else what is missing and the error number ("instance": no inotify
    instance left, "descriptor": no descriptor left for an eventfd)."""
    libc = _LIBC
    if libc is None or not hasattr(os, "eventfd"):
        return "instance", errno.ENOSYS
    with _HUBS.lock:
        hub = _HUBS.current
        if hub is None:
            made = _open_hub(libc)
            if isinstance(made, tuple):
                return made
            hub = _HUBS.current = made
        try:
            wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError as error:
            if not hub.members:
                os.eventfd_write(hub.stop, 1)  # (its thread ends)
            return "descriptor", error.errno or errno.EMFILE
        member = Member(hub, wake)
        hub.members.add(member)
        return member


def _open_hub(libc: ctypes.CDLL) -> _Hub | tuple[str, int]:
    """A new hub and its thread (under the lock)."""
    fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        return "instance", ctypes.get_errno()
    try:
        stop = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    except OSError as error:
        os.close(fd)
        return "descriptor", error.errno or errno.EMFILE
    hub = _Hub(libc, fd, stop)
    _HUBS.unclosed.add(hub)
    thread = threading.Thread(target=_dispatch, args=(hub,), name="journal-inotify", daemon=True)
    hub.thread = thread
    try:
        start_thread(thread)
    except RuntimeError:  # (no thread left: it never began)
        hub.close_descriptors()
        raise
    except BaseException:
        # A Ctrl+C in a start from the main thread: it may have begun, and then closes
        # the descriptors itself (if it did not, they stay open: two descriptors).
        hub.gone = True
        os.eventfd_write(stop, 1)
        raise
    return hub


def rewatch(member: Member, directories: Sequence[bytes]) -> int | None:
    """Add the member's watches that are missing: None when every directory is watched,
    else the error number of the first that could not be (ENOENT: not there now)."""
    with _HUBS.lock:
        hub = member.hub
        if hub.gone:
            return errno.EBADF  # (its thread failed: poll)
        for directory in directories:
            if directory in member.watched:
                continue
            wd = hub.libc.inotify_add_watch(hub.fd, directory, _MASK)
            if wd < 0:
                return ctypes.get_errno()
            member.watched[directory] = wd
            hub.watchers.setdefault(wd, []).append(member)
        return None


def leave(member: Member) -> threading.Thread | None:
    """The member's change source closes: its watches are given up (each removed when its
    last member left), and the hub's thread ends if it was the last member: the hub is
    then no longer the process's (a later `join` opens another), and that thread is
    returned, for the caller to join once it closed its eventfd. Its eventfd is never
    written to after this."""
    with _HUBS.lock:
        hub = member.hub
        hub.members.discard(member)
        if hub.gone:
            return None
        for wd in member.watched.values():
            members = hub.watchers.get(wd)
            if members is None:
                continue  # (already gone: its IN_IGNORED came)
            members.remove(member)
            if not members:
                del hub.watchers[wd]
                hub.libc.inotify_rm_watch(hub.fd, wd)  # (EINVAL: it went meanwhile)
        member.watched.clear()
        if hub.members:
            return None
        # (Retired now, not when its thread looks: nobody joins it, so that thread ends
        # and the journal's close can wait for it. Until 2026-12-06 a journal joining
        # before the thread looked kept it, and a close returned with the thread and its
        # two descriptors still there: a leak check after `Journal.close()` saw them.)
        _HUBS.forget(hub)
        os.eventfd_write(hub.stop, 1)
        return hub.thread
