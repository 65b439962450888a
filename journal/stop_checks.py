"""The `stop` events of waiting followers, checked for every journal of the process by one
thread (`journal-stops`), every `STOP_CHECK_S` while any follower waits with one.

A `threading.Event` tells nobody when it is set, so a follower's `stop` is looked at.
Until 2026-12-06 each journal's waiter thread did it, waking every 50 ms while one of
its followers waited with a stop: 300 journals of one process with such a follower each
(a journal per tenant) took 18-19% of a core while idle, for 6,000 wake-ups a second.
Now one thread looks at them all, and a journal's waiter thread sleeps until a change
(or its one-second safety look); the checks wake the followers of a journal whose
waiting followers' stop is set, as the waiter thread did (`Notifier.wake_stopped`)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from typing import Final, Protocol

from .engine import Flag, start_thread

__all__ = ["STOP_CHECK_S", "StopChecks", "stop_checks"]

# How often the stops are checked while any follower waits with one (a set stop is seen
# within this, plus the time its follower takes to run).
STOP_CHECK_S: Final = 0.05
# While no follower waits with a stop, how often the thread looks whether its journals
# are still there (one dropped without `close()`: garbage).
IDLE_S: Final = 1.0


class Stoppable(Protocol):
    def wake_stopped(self) -> bool:
        """Wake the waiting followers if a stop of theirs is set; False when none of
        them waits with a stop."""
        ...


class StopChecks:
    """The checks (one per process: `stop_checks()`)."""

    def __init__(self) -> None:
        # (A raw lock, raw-lock flags and a dict of weak references: nothing a Ctrl+C in
        # the main thread's `want` or `drop` could leave half done or held, as it could
        # a `threading.Event`'s or a `WeakSet`'s Python code: `Flag`.)
        self._lock = threading.Lock()
        self._members: dict[int, weakref.ref[Stoppable]] = {}
        self._wanted = Flag()  # a journal wants checks, or the last one went
        self._emptied = Flag()  # the last journal went (ends a busy wait)
        self._thread: threading.Thread | None = None
        self._checks = 0

    @property
    def checks(self) -> int:
        """How many rounds of checks the thread made so far."""
        return self._checks

    def want(self, member: Stoppable) -> None:
        """`member` has a follower waiting with a stop (called after it registered it):
        check it from now on (until `drop`), starting the thread if none runs."""
        with self._lock:
            self._members[id(member)] = weakref.ref(member)
            self._wanted.set()
            if self._thread is None:
                thread = self._thread = threading.Thread(
                    target=self._run, name="journal-stops", daemon=True
                )
                try:
                    start_thread(thread)
                except BaseException:
                    # (Not started, or started and not told so: forgotten, so the next
                    # `want` starts one; one that began takes the place itself if free.)
                    self._thread = None
                    raise

    def drop(self, member: Stoppable) -> None:
        """`member` closes: no more checks of it; the thread ends with the last one
        (waited for: a journal's close returns with no thread of its own left), unless
        another journal wants checks before it ended (it goes on for that one)."""
        with self._lock:
            self._members.pop(id(member), None)
            if self._members:
                return
            thread = self._thread
            self._wanted.set()
            self._emptied.set()
        if thread is None or thread is threading.current_thread():
            return
        # (In slices: a `want` meanwhile keeps the thread, and a close waited for it to
        # end all the same, 5 s; a review.)
        deadline = time.monotonic() + 5
        with contextlib.suppress(RuntimeError):  # (not started: it ends at once)
            while thread.is_alive() and time.monotonic() < deadline:
                thread.join(STOP_CHECK_S)
                with self._lock:
                    if self._members and self._thread is thread:
                        return

    def _run(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.current_thread()
            if self._thread is not threading.current_thread():
                return
        try:
            while self._round():
                pass
        finally:
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None

    def _round(self) -> bool:
        """One round of checks, then the wait before the next; False when the thread
        should end (no journal left to check)."""
        self._wanted.clear()  # (before the look: a `want` or `drop` after it is not missed)
        self._emptied.clear()
        with self._lock:
            members = list(self._members.items())
        busy = False
        for key, ref in members:
            member = ref()
            if member is None:  # (garbage: its journal was never closed)
                with self._lock:
                    if self._members.get(key) is ref:
                        del self._members[key]
                continue
            busy = member.wake_stopped() or busy
            del member
        self._checks += 1
        if busy:
            # (Not cut short by a `want`: a follower waiting page by page with a stop
            # registers it again for each page, and its wait checks it first itself.)
            self._emptied.wait(STOP_CHECK_S)
            return True
        with self._lock:
            if not self._members:
                self._thread = None
                return False
        self._wanted.wait(IDLE_S)
        return True

    def after_fork_in_child(self) -> None:
        """In a child after fork(): the parent's thread is not here, its lock may have
        been held by it."""
        self._lock = threading.Lock()
        self._wanted = Flag()
        self._emptied = Flag()
        self._thread = None
        self._members = {}


_CHECKS: Final = StopChecks()
os.register_at_fork(after_in_child=_CHECKS.after_fork_in_child)


def stop_checks() -> StopChecks:
    """The process's stop checks."""
    return _CHECKS
