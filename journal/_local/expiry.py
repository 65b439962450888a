"""Expiry on time: while a writable journal is open, one daemon thread sleeps until the
nearest session deadline (TTL or suspension cap) and submits an expiry pass then.

Every commit batch also expires what is due before planning its requests (the planner's
`expire_due`), so a session past its deadline never takes an append, whether or not this
thread has run yet. The thread re-reads the nearest deadline at least every `poll_s`
seconds, so deadlines that other processes' writers set are kept too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from ..errors import JournalClosed

__all__ = ["ExpiryTimer"]

_log = logging.getLogger("journal")
_POLL_S: Final = 30.0


class ExpiryTimer:
    """The thread (see the module docstring); `nearer` tells it of a new deadline,
    `stop` ends it."""

    def __init__(
        self,
        next_deadline: Callable[[], int | None],
        expire: Callable[[], object],
        poll_s: float = _POLL_S,
    ) -> None:
        self._next_deadline = next_deadline
        self._expire = expire
        self._poll_s = poll_s
        self._cv = threading.Condition()
        self._stopped = False
        self._changed = False
        self._target: int | None = None
        self._thread = threading.Thread(target=self._run, name="journal-expiry", daemon=True)
        self._thread.start()

    def nearer(self, due_ms: int) -> None:
        """A deadline at `due_ms` was just committed: wake up earlier if it is sooner."""
        with self._cv:
            if self._target is None or due_ms < self._target:
                self._changed = True
                self._cv.notify()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while True:
            with self._cv:
                if self._stopped:
                    return
                self._changed = False
            try:
                due = self._next_deadline()
                now = int(time.time() * 1000)
                if due is not None and due <= now:
                    self._expire()
                    continue
            except JournalClosed:
                return
            except Exception:  # logged, retried at the next poll: expiry must not die
                _log.exception("the expiry pass failed; retrying in %.0f s", self._poll_s)
                due, now = None, 0
            timeout = self._poll_s if due is None else min(self._poll_s, (due - now) / 1000)
            with self._cv:
                self._target = due
                if not self._stopped and not self._changed:
                    self._cv.wait(timeout)
                self._target = None
