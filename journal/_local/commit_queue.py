"""Group commit: the leader/follower queue in front of the local engine's commit.

The first queued request leads: it takes the queue as one batch and commits it with one
frame, one fsync and one LMDB transaction. The others sleep on a raw lock of their own (no
thundering herd, and the cheapest wake-up there is) until their batch is done, or until the
finishing leader hands leadership to the oldest waiting request.

A leader whose previous batch was larger than what it found waits briefly for stragglers:
the callers that batch woke are on their way back with their next request, and one fsync
can carry them all (SPEC section 7.1). It waits only while they keep coming, one short step
at a time, and never longer than `GATHER_S`; a lone caller never waits.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Final

from ..errors import JournalClosed
from .files import FileOps
from .planner import Request

__all__ = ["GATHER_S", "GATHER_STEP_S", "CommitQueue"]

GATHER_S: Final = 0.0002
GATHER_STEP_S: Final = 0.0001


class CommitQueue:
    """Serialises commits of one engine and batches the requests that queue meanwhile.

    `commit(batch, taken)` commits a batch (`taken`: a batch taken from the queue, as
    opposed to a follow-up); `follow_up()` returns a request to commit by the same leader
    after its batch's callers were woken (a retention pass a seal made due), or None.
    """

    def __init__(
        self,
        commit: Callable[[list[Request], bool], None],
        follow_up: Callable[[], Request | None],
        ops: FileOps,
    ) -> None:
        self._commit = commit
        self._follow_up = follow_up
        self._ops = ops
        self._cv = threading.Condition()
        self._queue: list[Request] = []
        self._leading = False
        self._gathering = False
        self._last_batch = 0  # requests in the previous batch (how many to gather)
        self._handed: Request | None = None  # the successor a finishing leader woke
        self.closed = False

    def submit(self, request: Request) -> None:
        """Queue `request` and return once it was committed (or failed: `request.error`)."""
        with self._cv:
            if self.closed:
                raise JournalClosed("this journal is closed; open it again with Journal.open()")
            self._queue.append(request)
            try:
                # Called with the queue locked: nobody can have taken the request yet.
                self._ops.point("commit.queued", len(self._queue))
            except BaseException:
                self._queue.pop()
                raise
            if not self._leading:
                self._leading = True
            else:
                request.wake = wake = threading.Lock()
                wake.acquire()
                if self._gathering:
                    self._cv.notify()
        if request.wake is not None:
            try:
                request.wake.acquire()
            except BaseException:
                self._abandon(request)  # (KeyboardInterrupt in a waiting thread)
                raise
        if not request.done:
            self._lead(request)

    @contextlib.contextmanager
    def leading(self) -> Iterator[None]:
        """Hold leadership (no batch runs meanwhile): the commit made while opening."""
        with self._cv:
            self._leading = True
        try:
            yield
        finally:
            with self._cv:
                self._leading = False
                self._cv.notify_all()

    def close(self) -> bool:
        """Wait for a batch in flight, then refuse new requests; False if closed already."""
        with self._cv:
            if self.closed:
                return False
            while self._leading:
                self._cv.wait()
            self.closed = True
            return True

    def _abandon(self, request: Request) -> None:
        """A waiting caller gave up (interrupted): take its request out of the queue, and
        pass leadership on if it was just handed to it, so nobody waits for it."""
        with self._cv:
            if request in self._queue:
                self._queue.remove(request)
            if self._handed is not request:
                return
            successor = self._pick_successor()
        _hand_over(successor)

    def _lead(self, request: Request) -> None:
        batch = [request]
        woken = False
        try:
            with self._cv:
                self._handed = None
                batch, self._queue = self._queue, []
                if self._last_batch > len(batch):
                    try:
                        self._gather(batch)
                    except BaseException:
                        # Interrupted while gathering (KeyboardInterrupt): the others go
                        # back to the front of the queue for the next leader.
                        self._queue[:0] = [r for r in batch if r is not request]
                        batch = [request]
                        raise
            self._last_batch = len(batch)
            self._commit(batch, True)
            follow_up = self._follow_up()
            if follow_up is not None:
                # The batch's callers go first; the follow-up commits in this (still
                # leading) thread.
                self._wake(batch, request)
                woken = True
                self._commit([follow_up], False)
        finally:
            # The usual order: pick the successor while the batch is marked done, then
            # wake everyone (the successor first of all, so the next commit starts while
            # the woken callers return).
            with self._cv:
                for r in batch:
                    r.done = True
                successor = self._pick_successor()
            _hand_over(successor)
            if not woken:
                self._wake(batch, request)

    def _pick_successor(self) -> Request | None:
        """The oldest waiting request, which leads next (the caller holds `_cv`); with
        none, leadership ends here."""
        successor = self._handed = self._queue[0] if self._queue else None
        if successor is None:
            self._leading = False
            self._cv.notify_all()
        return successor

    def _gather(self, batch: list[Request]) -> None:
        """Wait briefly for stragglers (the caller holds `_cv`). Stops when a short wait
        brings nobody, when the previous batch's size is reached, or after `GATHER_S`."""
        deadline = time.monotonic() + GATHER_S
        self._gathering = True
        try:
            while len(batch) < self._last_batch:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._cv.wait(min(remaining, GATHER_STEP_S)):
                    break
                batch += self._queue
                self._queue = []
        finally:
            self._gathering = False
        batch += self._queue
        self._queue = []

    def _wake(self, batch: list[Request], leader: Request) -> None:
        with self._cv:
            for r in batch:
                r.done = True
        for r in batch:
            if r.wake is not None and r is not leader:
                r.wake.release()


def _hand_over(successor: Request | None) -> None:
    """Wake the request picked to lead next (outside the queue's lock)."""
    if successor is not None and successor.wake is not None:
        successor.wake.release()
