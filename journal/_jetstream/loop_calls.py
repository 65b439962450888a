"""One coroutine run on a connection's event loop for another thread, which waits for its
outcome on a plain lock (`Connection.call`, and the waits of the connection's close).

`concurrent.futures.Future.result` (what `asyncio.run_coroutine_threadsafe` hands back)
waits in `threading.Condition.wait`: Python code of threading.py that takes and gives
back the future's condition, an RLock, in the waiting thread. A KeyboardInterrupt (a
Ctrl+C, a SIGTERM handler's exception) right after `Condition.__enter__` took it, or at
the start of `Condition.__exit__`, left it held by that thread for good; the loop's
thread, which takes it to hand over the outcome, then blocked for good (the journal's
close waited 15 s for the loop and left its thread). One landing between
`_release_save` and the `try` of `Condition.wait` raised "cannot release un-acquired
lock" in place of the KeyboardInterrupt.

Here the waiting thread takes only a lock of its own (`Lock.acquire`, one C call) and
reads what the loop's thread set before releasing it; the rest (starting the task,
cancelling it, reading its outcome) runs on the loop's thread, where no signal handler
runs. The loop's thread releases a call it will no longer run as it ends (`end`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["LoopCall"]

T = TypeVar("T")


class LoopCall(Generic[T]):
    """`coro` run as a task of the loop that runs `start`, and waited for by `wait`."""

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self._coro = coro
        self._released = threading.Lock()  # (held until the call ended)
        self._released.acquire()
        self._task: asyncio.Task[T] | None = None
        self._cancelled = False
        # The outcome, set on the loop's thread before the lock is released: `_answered`
        # with `_value` or `_error`; neither once cancelled or ended without an answer.
        self._answered = False
        self._value: T | None = None
        self._error: BaseException | None = None

    # -- on the loop's thread --------------------------------------------------------------

    def start(self) -> None:
        if self._cancelled:
            self.end()
            return
        self._task = asyncio.get_running_loop().create_task(self._coro)
        self._task.add_done_callback(self._finished)

    def cancel(self) -> None:
        """Cancel the task (or, not started yet, never start it)."""
        self._cancelled = True
        if self._task is not None:
            self._task.cancel()

    def _finished(self, task: asyncio.Task[T]) -> None:
        if not task.cancelled():
            error = task.exception()
            if error is None:
                self._value = task.result()
            else:
                self._error = error
            self._answered = True
        self._release()

    # -- any thread ------------------------------------------------------------------------

    def end(self) -> None:
        """Release the waiting thread with no answer: the loop will not run the call (it is
        closed; called on its thread as it ends, or by any thread once it did)."""
        if self._task is None:
            self._coro.close()  # (never started: not left for the collector to warn of)
        self._release()

    def _release(self) -> None:
        with contextlib.suppress(RuntimeError):  # (released already: `end` after the end)
            self._released.release()

    # -- the waiting thread ----------------------------------------------------------------

    def wait(self, timeout: float | None) -> T:
        """The coroutine's result, or its exception raised; `concurrent.futures`'
        `TimeoutError` after `timeout` seconds (None: no limit), its `CancelledError` when
        cancelled or ended without an answer."""
        if not self._released.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            raise concurrent.futures.TimeoutError
        if not self._answered:
            raise concurrent.futures.CancelledError
        error, self._error = self._error, None  # (no cycle through its traceback)
        if error is not None:
            raise error
        return self._value  # type: ignore[return-value]  # (answered: a T)
