"""Expiry on time: while a writable journal is open, one daemon thread sleeps until the
nearest session deadline (TTL or suspension cap) and submits an expiry pass then. The
same thread does the maintenance a commit asks for (`poke`: the engine's `maintain`),
work that must not hold up the caller whose commit found it due.

Every commit batch also expires what is due before planning its requests (the planner's
`expire_due`), so a session past its deadline never takes an append, whether or not this
thread has run yet. The thread re-reads the nearest deadline at least every `poll_s`
seconds, so deadlines that other processes' writers set are kept too.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Final, Protocol

from ..errors import JournalClosed
from ..forking import ForkPause

__all__ = ["ExpiryTimer", "wait_while_held"]

_log = logging.getLogger("journal")
_POLL_S: Final = 30.0
_HELD_STEP_S: Final = 0.005


def wait_while_held(lock: threading.Lock, timeout_s: float) -> None:
    """Until `lock` is free (at most `timeout_s`), without taking it: a close waits so for
    a pass in flight. (`acquire` then `release` left it held for good when a Ctrl+C
    landed between the two: the thread, and a fork, waited for it forever; a review.)"""
    deadline = time.monotonic() + timeout_s
    while lock.locked() and time.monotonic() < deadline:
        time.sleep(_HELD_STEP_S)


class _Expiring(Protocol):
    def next_deadline(self) -> int | None: ...

    def expire_now(self) -> None: ...

    def maintain(self) -> None: ...


class ExpiryTimer:
    """The thread (see the module docstring); `nearer` tells it of a new deadline,
    `stop` ends it. It holds its engine weakly: a journal dropped without `close()` is
    still freed (and the thread ends)."""

    def __init__(self, engine: _Expiring, poll_s: float = _POLL_S) -> None:
        self._engine = weakref.ref(engine)
        # Held while the thread uses the store, and by fork() (see `_pause_for_fork`):
        # a child never inherits the store's LMDB environment mid-transaction.
        self.busy = threading.Lock()
        _TIMERS.add(self)
        self._poll_s = poll_s
        # (Entered as `with self._lock`, the C lock's own `__enter__`: a Ctrl+C in
        # `Condition.__enter__`, Python code, right after it acquired the lock left it held
        # by the closing thread, and this thread waiting for it for good; a review.)
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        self._stopped = False
        self._changed = False
        self._work = False  # maintenance asked for (`poke`)
        self._target: int | None = None
        self._thread = threading.Thread(target=self._run, name="journal-expiry", daemon=True)
        self._thread.start()

    def nearer(self, due_ms: int) -> None:
        """A deadline at `due_ms` was just committed: wake up earlier if it is sooner."""
        with self._lock:
            if self._target is None or due_ms < self._target:
                self._changed = True
                self._cv.notify()

    def poke(self) -> None:
        """Maintenance is due: run the engine's `maintain` soon."""
        with self._lock:
            self._work = self._changed = True
            self._cv.notify()

    def stop(self) -> None:
        """End the thread (without waiting for it: a pass in flight ends on its own)."""
        with self._lock:
            self._stopped = True
            self._cv.notify()

    def _run(self) -> None:
        stuck: int | None = None  # a deadline an expiry pass did not remove
        while True:
            with self._lock:
                if self._stopped:
                    return
                self._changed = False
                work, self._work = self._work, False
            engine = self._engine()
            if engine is None:
                return
            try:
                if work:
                    # (Not under `busy`: a compaction may take a while, and fork() and
                    # close() need not wait for it; fork() waits for its transactions.)
                    engine.maintain()
                with self.busy:
                    if self._stopped:
                        # close() passed this lock during the maintenance above: the
                        # environment may be closed already (it does not wait for that).
                        return
                    due = engine.next_deadline()
                    now = int(time.time() * 1000)
                    if due is not None and due <= now and due != stuck:
                        engine.expire_now()
                        after = engine.next_deadline()
                        stuck = due if after == due else None
                        continue
            except JournalClosed:
                return
            except Exception:  # logged, retried at the next poll: expiry must not die
                _log.exception(
                    "the expiry or maintenance pass failed; retrying in %.0f s", self._poll_s
                )
                due, now = None, 0
            finally:
                del engine  # held only while it is used
            if due is not None and due <= now:
                due = None  # stuck (nothing to expire there): poll instead of spinning
            timeout = self._poll_s if due is None else min(self._poll_s, (due - now) / 1000)
            with self._lock:
                self._target = due
                if not self._stopped and not self._changed:
                    self._cv.wait(timeout)
                self._target = None


# Every timer of this process: fork() waits until none is using its store, so the child's
# copy of the environment is idle.
_TIMERS: Final[ForkPause[ExpiryTimer]] = ForkPause()
