"""The JetStream engine's change source for the shared waiter (`waiter.Notifier`): a core
subscription to every session's row subject (SPEC 16)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from .client import Connection
from .layout import Subjects

__all__ = ["RowChanges"]


class RowChanges:
    """The waiter's change source: a core subscription to every session's row subject
    (every commit writes a row). A message may arrive a moment before the stream has
    stored it, so for a short while after one the waiter is told to look again. An
    `interrupt` (a follower's new stop to check) ends a wait as no change: until
    2026-12-05 it was taken for a message, and each such wait cost a head read and the
    looks again after it, about 20 requests to the server (a review)."""

    _RECHECK_S: Final = 0.05

    def __init__(
        self, conn: Connection, subjects: Subjects, point: Callable[[str, object], None]
    ) -> None:
        self._event = threading.Event()
        # Row messages: counted on the connection's loop, seen by the waiter's thread
        # (each writes its own: none is lost between the two).
        self._messages = self._seen = 0
        self._recheck_until = 0.0
        self._conn = conn

        async def on_row(_msg: Any) -> None:
            self._messages += 1
            self._event.set()

        point("changes.subscribe", None)  # (on the waiter's thread)
        self._sub = self._conn.call(self._conn.nc.subscribe(subjects.rows, cb=on_row))

    def wait(self, timeout: float) -> bool:
        now = time.monotonic()
        if now < self._recheck_until:
            self._event.wait(min(timeout, 0.002))
            self._event.clear()
            self._seen = self._messages
            return True
        self._event.wait(timeout)
        self._event.clear()
        # (After the clear: a message from now on sets the event again, and is seen by
        # the next wait if not by this one.)
        messages = self._messages
        message = messages != self._seen
        self._seen = messages
        if message:
            self._recheck_until = time.monotonic() + self._RECHECK_S
        return message

    def interrupt(self) -> None:
        self._event.set()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.call(self._sub.unsubscribe(), 5)
