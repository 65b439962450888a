"""Group commit: the leader/follower queue in front of the local engine's commit.

The first queued request leads: it takes the queue as one batch and commits it with one
frame, one fsync and one LMDB transaction. The others sleep on a raw lock of their own (no
thundering herd, and the cheapest wake-up there is) until their batch is done, or until the
finishing leader hands leadership to the oldest waiting request.

A leader whose previous batch was larger than what it found waits briefly for stragglers:
the callers that batch woke are on their way back with their next request, and one fsync
can carry them all (SPEC section 7.1). It waits only while they keep coming, one short step
at a time, and never longer than `GATHER_S`; a lone caller never waits.

A signal handler's exception (KeyboardInterrupt, or a SIGTERM handler's SystemExit) lands
between two bytecodes of the main thread, and only there. So while the main thread is in
the queue (waiting, leading, committing) every handler that is Python code is held: it is
swapped for one that notes the signal, and the handlers it replaced run once the request
is done (`_holding_signals`); a second one of a signal held meanwhile runs them at once.
A caller may submit `here` instead, unheld (an operation that runs a callback of the
caller's in the commit). For such callers, and for handlers a second signal runs at
once, the queue's mutex is a raw lock (`with` on it cannot be split from its release, as
a Condition's Python-level methods can), the leader gathers on a raw lock of its own with
the mutex released, a waiting caller interrupted gives up its place, and a request that a
leader took but did not get to commit goes back to the front of the queue for the next
leader instead of being woken without a result.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # (signal's C module: no stubs)
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Final

from ..errors import JournalClosed, Unsupported
from .files import FileOps
from .planner import Request

__all__ = ["GATHER_S", "GATHER_STEP_S", "CommitQueue"]

GATHER_S: Final = 0.0002
GATHER_STEP_S: Final = 0.0001

_Handler = Callable[[int, FrameType | None], object]
# Every signal a Python handler can be set for (not SIGKILL or SIGSTOP), as ints.
_SIGNALS: Final = tuple(
    sorted(
        int(signum)
        for signum in signal.valid_signals()
        if signum not in {getattr(signal, name, None) for name in ("SIGKILL", "SIGSTOP")}
    )
)
# The last scan (`_holding_signals`; only the main thread scans): the handler of each of
# `_SIGNALS`, then each signal whose handler is Python code with its place among them.
_scan: tuple[list[object], tuple[tuple[int, int], ...]] = ([], ())


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
        self._lock = threading.Lock()
        self._closers: list[threading.Lock] = []  # held locks of `close` calls waiting
        self._arrival = threading.Lock()  # held while no request arrived during a gather
        self._arrival.acquire()
        self._queue: list[Request] = []
        self._leading = False
        self._gathering = False
        self._last_batch = 0  # requests in the previous batch (how many to gather)
        self._handed: Request | None = None  # the successor a finishing leader woke
        self._main_inside = False  # the main thread is in `submit`
        self.closed = False

    def submit(self, request: Request, *, here: bool = False) -> None:
        """Queue `request` and return once it was committed (or failed: `request.error`).
        From the main thread (unless `here`) signal handlers are held meanwhile."""
        if threading.get_ident() != threading.main_thread().ident:
            self._submit(request)
            return
        if self._main_inside:
            # A signal handler's write while the main thread is in the queue: it would
            # wait for a batch only that thread can finish.
            raise Unsupported(
                "a write from a signal handler while the main thread is already writing "
                "to this journal would wait for itself: set a flag in the handler and "
                "write after it returns, or write from another thread"
            )
        if here:
            self._submit_main(request)
        else:
            # (Held handlers run after `_submit_main` returns: the main thread is out of
            # the queue then, and they may write.)
            _holding_signals(self._submit_main, request)

    def _submit_main(self, request: Request) -> None:
        try:
            self._main_inside = True
            self._submit(request)
        finally:
            self._main_inside = False

    def _submit(self, request: Request) -> None:
        wake = None
        with self._lock:
            if self.closed:
                raise JournalClosed.already()
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
                if self._gathering and self._arrival.locked():
                    self._arrival.release()
        if wake is not None:
            try:
                wake.acquire()
            except BaseException:
                self._abandon(request)  # (KeyboardInterrupt in a waiting thread)
                raise
        if not request.done:
            self._lead(request)

    @contextlib.contextmanager
    def leading(self) -> Iterator[None]:
        """Hold leadership (no batch runs meanwhile): the commit made while opening."""
        with self._lock:
            self._leading = True
        try:
            yield
        finally:
            with self._lock:
                self._leading = False
                self._release_closers()

    def close(self) -> bool:
        """Wait for a batch in flight, then refuse new requests; False if closed already.
        (It waits on a raw lock of its own, as followers do: `Condition.wait` is not safe
        against a KeyboardInterrupt.)"""
        while True:
            with self._lock:
                if self.closed:
                    return False
                if not self._leading:
                    self.closed = True
                    return True
                waiter = threading.Lock()
                waiter.acquire()
                self._closers.append(waiter)
            waiter.acquire()  # released when leadership ends; then look again

    def _release_closers(self) -> None:
        """Wake the `close` calls waiting (the caller holds the mutex)."""
        closers, self._closers = self._closers, []
        for waiter in closers:
            waiter.release()

    def _abandon(self, request: Request) -> None:
        """A waiting caller gave up (interrupted): take its request out of the queue, and
        pass leadership on if it was just handed to it, so nobody waits for it."""
        with self._lock:
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
            with self._lock:
                self._handed = None
                batch, self._queue = self._queue, []
                gather = self._gathering = self._last_batch > len(batch)
            if gather:
                self._gather(batch)
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
            # the woken callers return). Requests this leader was interrupted before
            # committing (every committed one has a result or an error) go back to the
            # front of the queue: the next leader commits them.
            with self._lock:
                if not woken:
                    left = [r for r in batch if r is not request and _uncommitted(r)]
                    if left:
                        batch = [r for r in batch if r not in left]
                        self._queue[:0] = left
                for r in batch:
                    r.done = True
                successor = self._pick_successor()
            _hand_over(successor)
            if not woken:
                self._wake(batch, request)

    def _pick_successor(self) -> Request | None:
        """The oldest waiting request, which leads next (the caller holds the mutex);
        with none, leadership ends here."""
        successor = self._handed = self._queue[0] if self._queue else None
        if successor is None:
            self._leading = False
            self._release_closers()
        return successor

    def _gather(self, batch: list[Request]) -> None:
        """Wait briefly for stragglers (`_gathering` set, the mutex not held; arrivals
        release `_arrival`). Stops when a short wait brings nobody, when the previous
        batch's size is reached, or after `GATHER_S`."""
        deadline = time.monotonic() + GATHER_S
        try:
            while True:
                with self._lock:
                    taken, self._queue = self._queue, []
                    batch += taken
                if len(batch) >= self._last_batch:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._arrival.acquire(True, min(remaining, GATHER_STEP_S)):
                    return
        finally:
            with self._lock:
                self._gathering = False
                self._arrival.acquire(False)  # (held again: no arrival pending)
                taken, self._queue = self._queue, []
                batch += taken

    def _wake(self, batch: list[Request], leader: Request) -> None:
        with self._lock:
            for r in batch:
                r.done = True
        for r in batch:
            wake, r.wake = r.wake, None  # (so that waking twice wakes nobody twice)
            if wake is not None and r is not leader:
                wake.release()


def _holding_signals(submit: Callable[[Request], None], request: Request) -> None:
    """`submit(request)` in the main thread with every Python signal handler held back:
    each signal that comes meanwhile runs the handler it replaced once the request is done
    (committed or failed), in the order they came, so no handler's exception lands inside
    the queue or a commit. A second one of a signal already held puts every handler back
    and runs what is held at once (a way out of a wait that does not end: Ctrl-C twice).
    Handlers that are not Python code (None: not set from Python; SIG_DFL, SIG_IGN) are
    left alone. Only the main thread sets handlers, so the scan made here stays true for
    the request, except where a held handler run early sets one.

    Swapped with `_signal.signal`, whose C code runs no Python after the swap
    (`signal.signal`'s wrapper does). A handler not yet swapped may still raise between
    two swaps (the request is then not made), and one put back between two put-backs:
    either way every handler still swapped is put back (`_release`, which puts back
    again) and every held one runs. (Python code cannot make the step from the last
    put-back to the held handlers atomic: a second signal whose handler is back and
    raises just then skips them; SPEC 7.1.)"""
    handlers = list(map(_signal.getsignal, _SIGNALS))
    if handlers != _scan[0]:
        _rescan(handlers)
    swapped = _scan[1]
    if not swapped:
        submit(request)
        return
    held: list[int] = []  # the signals held and not run yet, as they came

    def hold(signum: int, frame: FrameType | None) -> None:
        again = signum in held
        held.append(signum)  # (not the frame: it would be kept until the request ends)
        if again:
            # (`hold` is the handler in place: named so, the closure would hold itself,
            # a reference cycle for the collector at each request.)
            _release(swapped, handlers, _signal.getsignal(signum), held)

    holding = (swapped, handlers, hold)
    try:
        _in_flight.append(holding)  # (for a child forked meanwhile: `_forked`)
        for signum, _ in swapped:
            _signal.signal(signum, hold)
        submit(request)
    finally:
        back = False
        try:
            _put_back(swapped, handlers, hold)
            back = True
        finally:
            if _in_flight and _in_flight[-1] is holding:
                _in_flight.pop()
            if held or not back:
                _release(swapped, handlers, hold, held)


# The holding of the request the main thread is making (at most one: a held handler that
# writes runs after its request's holding was taken off).
_in_flight: list[tuple[tuple[tuple[int, int], ...], list[object], _Handler]] = []


def _forked() -> None:
    """In a child forked while the main thread was in the queue (by another thread): put
    back the handlers it held. The signals held were the parent's, and the child has no
    request of the main thread's to wait for."""
    while _in_flight:
        swapped, handlers, hold = _in_flight.pop()
        _put_back(swapped, handlers, hold)


os.register_at_fork(after_in_child=_forked)


def _rescan(handlers: list[object]) -> None:
    """Note which of `handlers` (one for each of `_SIGNALS`) are Python code."""
    global _scan
    _scan = (
        handlers,
        tuple((_SIGNALS[at], at) for at, handler in enumerate(handlers) if callable(handler)),
    )


def _release(
    swapped: tuple[tuple[int, int], ...],
    handlers: list[object],
    hold: _Handler,
    held: list[int],
) -> None:
    """Put back every handler still swapped for `hold`, then run the held signals. (Put
    back twice: one put back can raise before the rest are; each step is in the
    `finally` of the one before.)"""
    try:
        _put_back(swapped, handlers, hold)
    finally:
        try:
            _put_back(swapped, handlers, hold)
        finally:
            _run_held(held)


def _put_back(swapped: tuple[tuple[int, int], ...], handlers: list[object], hold: _Handler) -> None:
    for signum, at in swapped:
        if _signal.getsignal(signum) is hold:
            _signal.signal(signum, handlers[at])


def _run_held(held: list[int]) -> None:
    """Run each held signal once, in the order they came, with the handler in place when
    it runs (put back by now), as unheld signals are: a handler run before may have
    installed another for it, or ignored it. When one raises, the others still run (as
    they would unheld: CPython runs the other pending handlers at its next check), and
    the last exception raised propagates."""
    while held:
        signum = held.pop(0)
        handler = _signal.getsignal(signum)
        try:
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                _signal.raise_signal(signum)  # (the default action)
        except BaseException:
            _run_held(held)
            raise


def _uncommitted(request: Request) -> bool:
    return request.result is None and request.error is None


def _hand_over(successor: Request | None) -> None:
    """Wake the request picked to lead next (outside the queue's lock)."""
    if successor is None:
        return
    wake, successor.wake = successor.wake, None
    if wake is not None:
        wake.release()
