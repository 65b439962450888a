"""An owner's one turn at a time, and the waits for a turn's block that runs in another
thread: an owner's release waits for its block, a journal's close for the blocks of all
its owners (SPEC.md section 7.8), each to record the turn's result before the lease goes.
"""

from __future__ import annotations

import sys
import threading
from typing import Protocol

from .engine import interrupt_as_itself
from .errors import InvalidArgument

__all__ = ["Slotted", "TurnSlot", "must_not_wait"]


class Slotted(Protocol):
    """What a slot holds: a turn, known by its request id."""

    @property
    def request_id(self) -> str: ...


def must_not_wait() -> bool:
    """Whether a release or a close called here lets go at once rather than wait for a
    turn's block running in another thread, since that wait could last for good:

    - on a thread running an asyncio event loop (a call from a coroutine): the block (in
      a worker thread) may wait for the loop (`run_coroutine_threadsafe(...).result()`);
    - in the main thread once it has ended, at interpreter exit (an `atexit` function, a
      finalizer run then): Python has joined every non-daemon thread by then, so the
      blocks still running are in daemon threads, which Python does not wait for either
      (one may wait for work from the ended main thread, for good). A close from another
      thread meanwhile (a non-daemon thread Python is joining) waits as always."""
    main = threading.main_thread()
    if threading.get_ident() == main.ident and not main.is_alive():
        return True
    if "asyncio" not in sys.modules:  # (no loop runs before asyncio is imported)
        return False
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class TurnSlot:
    """An owner's one turn at a time. A turn made by `Owner.turn()` and not started yet
    is replaced by the next one made (nothing was written for it; entering it then
    raises); a started turn holds the slot until its block ends, since it must get its
    result before the owner's next turn_started. Each Turn is given its owner's slot
    when made, so neither reaches into the other."""

    def __init__(self) -> None:
        # (Notified when a turn ends. Reentrant: a signal handler that closes the journal
        # runs between any two steps of its thread, also in `start` or `free` here, and
        # the close's `wait_ended` took the lock again: it waited for itself for good.)
        self._lock = threading.Condition(threading.RLock())
        self._made: Slotted | None = None
        self._started: Slotted | None = None
        self._thread: int | None = None  # (the thread whose block runs `_started`)

    def claim(self, turn: Slotted) -> None:
        """Hold the slot for `turn`, just made; `InvalidArgument` while a turn is open."""
        with self._lock:
            if self._started is not None:
                raise InvalidArgument(
                    f"turn {self._started.request_id!r} is still open: one turn at a time "
                    "per owner; leave its `with` block first"
                )
            self._made = turn

    def start(self, turn: Slotted) -> None:
        """`turn`'s block begins: the slot holds it until `free`; `InvalidArgument` when
        another turn was made since (or one is open)."""
        with self._lock:
            if self._made is not turn:
                now = self._started or self._made
                raise InvalidArgument(
                    f"turn {turn.request_id!r} was replaced before it started: the owner "
                    f"made turn {now.request_id if now else None!r} after it (one turn at a "
                    "time per owner; a turn made and not started is replaced by the next)"
                )
            # (The thread first: a signal handler's close between the two, in this
            # thread, sees either no turn started or this thread's.)
            self._thread = threading.get_ident()
            self._made = None
            self._started = turn

    def free(self, turn: Slotted) -> None:
        """`turn` has ended (or failed to start): the owner's next turn may be made."""
        with self._lock:
            if self._started is turn:
                self._started = None  # (first: as in `start`)
                self._thread = None
                self._lock.notify_all()

    def wait_ended(self) -> None:
        """Until no turn's block runs in another thread (a release or a close from there
        waits for it); at once when it runs in this one, which would wait for itself."""
        with interrupt_as_itself(), self._lock:  # (a Ctrl+C as the wait lets go: a review)
            self._lock.wait_for(
                lambda: self._started is None or self._thread == threading.get_ident()
            )
