"""The one shared waiter per journal (`Notifier`): every follower of a journal sleeps on
it, and one daemon thread per journal watches the engine's committed head for all of
them, so the idle cost of following is one loop however many followers wait.

Commits made by this process wake their followers at once (`publish`). Commits made by
other processes are seen by the waiter thread: it reads the committed head when the
engine's change source (`ChangeSource`, inotify for the local engine) reports a write,
or, with no change source, by polling the head every `IDLE_POLL_S` (`FAST_POLL_S` for a
while after the head moved). The thread starts when the first follower waits and ends
when nobody has waited for `LINGER_S`, or when the journal closes.

A follower of a session waits with its session's incarnation as its key, and a commit
wakes only the followers of the keys it touched (`publish` is given them; the thread
asks the engine, `read_changes`), or every follower when which keys is not known.

Measured costs and latencies are in SPEC section 7.6.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Collection
from typing import Any, Final, Protocol

from .engine import Flag, start_thread
from .follower_waits import Registered, Waits, any_set, wake, wake_loops
from .forking import ForkPause
from .stop_checks import STOP_CHECK_S, stop_checks

__all__ = ["ChangeSource", "HeadUnknown", "Notifier"]

_log: Final = logging.getLogger("journal")

# Polling (no change source): the period while idle and right after the head moved.
IDLE_POLL_S: Final = 0.002
FAST_POLL_S: Final = 0.0005
FAST_WINDOW_S: Final = 0.05
# With a change source: how often the head is read regardless of events (a safety net
# for a missed event). Followers' `stop` events are checked by the process's stop checks
# (`stop_checks`), every STOP_CHECK_S while any follower waits with one.
SAFETY_POLL_S: Final = 1.0
# After a commit of this process, how long the thread waits before it reads the head.
DEFER_S: Final = 0.001
# After a change the head read did not show (the change source reported a write, the head
# had not moved), the thread looks again this soon, then twice as late each time up to
# RECHECK_MAX_S: another process's LMDB commit is seen by readers only once it stores the
# transaction's id in the lock file's shared memory, after the `pwrite` of the meta page
# that inotify reports, and no event follows that store (until 2026-12-05 a read in
# between left 10-14% of another process's commits to the next commit, or to the 1 s
# safety look: a trial).
# A change within RECHECK_OWN_S of a commit of this process is most likely that commit
# (published, its followers woken): one look again only, RECHECK_MAX_S later, in case
# another process committed right after it (reads doubled with 50 commits a second of
# this process otherwise; with no look again, such a commit of another process, 1-4 ms
# after one of this process, reached its followers only at the next commit or the 1 s
# look: 2-3 of 150 with 0.5-ms look, 26 of 150 with none; a review).
# Only for an engine whose head reads may lag its change source (`lagging_reads`: the
# local engine): JetStream's change source looks again itself (`row_changes.RowChanges`), and its
# head reads are requests to the server (these looks again doubled them: a review).
RECHECK_FIRST_S: Final = 0.001
RECHECK_MAX_S: Final = 0.032
RECHECK_OWN_S: Final = 0.005
# Up to this many waiting followers, the thread wakes them all for a commit of another
# process rather than read which sessions it touched (`read_changes`).
FEW_FOLLOWERS: Final = 2
# The longest a wait of the main thread sleeps at once: a signal the kernel delivered to
# another thread runs its Python handler only once the main thread wakes.
MAIN_SLICE_S: Final = 0.05
# How long the thread stays after the last follower stopped waiting (a follower that
# delivers a page and waits again must not start a thread per page).
LINGER_S: Final = 1.0
# How many sessions' last commits the waiter remembers (`publish` with keys), about 110
# bytes each, evicted sessions' included: past that it forgets the older half, and every
# keyed follower looks once. (65,536, all forgotten when full, until 2026-12-05: 7 MB.)
TOUCHED_MAX: Final = 16384


class HeadUnknown(Exception):
    """Raised by an engine's head read (`read_head`, `read_changes`) when the head cannot
    be known for now and that passes by itself (servers that do not answer): unlike any
    other failure, its followers are not told to look (their own reads would raise), they
    wait on, and the thread looks again at its next step."""


class ChangeSource(Protocol):
    """What tells the waiter thread that the committed head may have moved."""

    def wait(self, timeout: float) -> bool:
        """Block until something may have changed (True) or `timeout` ends (False)."""

    def interrupt(self) -> None:
        """End a `wait` in progress now (called from another thread; that wait need not
        return True: the waiter looks again only when it does)."""

    def close(self) -> None: ...


class Notifier:
    """The shared waiter (see the module docstring). `read_head` returns the engine's
    committed next position; `changes` opens the engine's change source when the thread
    starts (None, or a factory returning None: poll); `read_changes`, when given, is what
    the thread reads instead of `read_head`: the head and the keys of the commits since
    its previous call (None: not known), so it wakes only their followers. `rewinds`:
    the head can go back (`rewind`), and a head read is never behind a commit published
    before it (the local engine; JetStream's stream info may lag this process's
    commits, and its sequences never go back). `lagging_reads`: a head read right after
    the change source reported a commit may not show it yet (the local engine: LMDB), so
    the thread looks again soon after a change the head did not show (`RECHECK_*`)."""

    def __init__(
        self,
        read_head: Callable[[], int],
        changes: Callable[[], ChangeSource | None] | None = None,
        read_changes: Callable[[], tuple[int, Collection[int] | None]] | None = None,
        rewinds: bool = False,
        lagging_reads: bool = False,
    ) -> None:
        # Entered as `with self._lock`, the C lock's own `__enter__`: `with` a condition
        # over it runs `Condition.__enter__`, Python code, and a Ctrl+C whose handler
        # raised right after it acquired the lock left the lock held by the main thread
        # for good (the waiter thread then stopped, and `close()` waited 5 s for it: a
        # review).
        self._lock = threading.RLock()
        self._waits = Waits(self._lock)  # (who waits now, and how each is woken)
        self._head = 0  # the highest committed next position known
        # Keyed followers (`wait(key=...)`: a session's incarnation) are woken only by a
        # commit known to touch their key (`publish` with keys), or by one whose keys are
        # not known: the head up to which that is so (other processes' commits, seen by
        # the thread; a gap before a commit of this process).
        self._unknown = 0
        self._touched: dict[int, int] = {}  # key -> the head after its last known commit
        # Bumped when the thread could not read the head: every waiter looks again (its
        # own read then raises what is wrong).
        self._epoch = 0
        self._read_head = read_head
        # Read by the thread instead of `read_head` when given: the head, and the keys of
        # the commits since its previous call (None: not known).
        self._read_changes = read_changes
        self._changes = changes
        self._polls = 0  # head reads by the waiter thread (`polls`)
        # The highest head a follower read before it waited: one the thread then finds
        # past the head (read twice) means the head went back (`rewind`).
        self._seen_max = 0
        self._rewinds = rewinds
        self._last_move = 0.0
        self._last_publish = 0.0
        self._last_look = 0.0
        # Whether the change source reported something (or none: poll every time).
        self._changed = True
        # The wait before the next look after a change the head did not show (0: none),
        # when that look is due, and whether the look to come is that one (not a change
        # source's event).
        self._recheck = 0.0
        self._recheck_at = 0.0
        self._recheck_due = False
        self._lagging_reads = lagging_reads
        self._thread: threading.Thread | None = None
        self._source: ChangeSource | None = None
        self._wanted = Flag()  # a follower waits again (ends the lingering)
        self._nap = Flag()  # interrupts a poll period
        self._closed = False
        self._pid = os.getpid()
        # Held while the thread reads the head, and by fork() (see `_pause_for_fork`): a
        # child never inherits the store's LMDB environment mid-transaction.
        self.busy = threading.Lock()
        _NOTIFIERS.add(self)

    @property
    def waiting(self) -> int:
        """How many followers wait now (sync and asyncio)."""
        return self._waits.waiting

    @property
    def polls(self) -> int:
        """How many times the waiter thread read the head so far."""
        return self._polls

    def registrations(self) -> tuple[int, int, int]:
        """(stop events, event loops, keys) the waiter keeps for the followers waiting
        now: all 0 when none waits, as nothing is kept past a wait."""
        with self._lock:
            return self._waits.counts()

    # -- followers -------------------------------------------------------------------------

    def publish(
        self, next_position: int, keys: Collection[int] | None = None, first: int = 0
    ) -> None:
        """The head moved to `next_position` (a commit of this process, whose first
        position is `first`, touching the sessions `keys`; None: not known): wake the
        followers it concerns (those with no key, those of `keys`; everyone when the keys
        are not known, or when commits this waiter did not hear of came before `first`)."""
        with self._lock:
            if keys is None:
                self._unknown = max(self._unknown, next_position)
                unknown = True
            else:
                unknown = first > self._head  # (commits before it not heard of)
                if unknown:
                    self._unknown = max(self._unknown, first)
                unknown = self._touch(keys, next_position) or unknown
            if next_position > self._head:
                self._head = next_position
            self._last_move = self._last_publish = time.monotonic()
            if not self._waits.waiting:
                # Every follower counts itself here, under this lock, before it sleeps
                # (`_enter`): none waits, so there is nobody to wake (the usual commit).
                return
            if unknown or keys is None:
                self._waits.notify_all()
                loops = self._waits.futures_to_wake()
            else:
                self._waits.notify_keys(keys)
                loops = self._waits.futures_to_wake(self.moved)
        wake_loops(loops)

    def rewind(self, head: int) -> None:
        """The committed head went back to `head` (a hole in the log accepted by
        `verify(fix=True)`, SPEC 9): forget what was known past it, and wake every
        follower to look again (one that delivered past the new end raises
        `CursorFuture`; the others wait for the commits that take those positions again,
        which would not have woken them)."""
        with self._lock:
            self._head = self._unknown = self._seen_max = head
            self._touched.clear()
            self._epoch += 1
            self._waits.notify_all()
            loops = self._waits.futures_to_wake()
        wake_loops(loops)

    def _touch(self, keys: Collection[int], head: int) -> bool:
        """Record that commits up to `head` touched `keys` (under the lock); True when the
        record overflowed and its older half was forgotten (every keyed follower looks
        then): the commits up to the highest head forgotten count as unknown, so a
        follower of a forgotten key that read the head before it still looks."""
        touched = self._touched
        for key in keys:
            if touched.get(key, 0) < head:
                touched[key] = head
        if len(touched) <= TOUCHED_MAX:
            return False
        cut = sorted(touched.values())[len(touched) // 2]
        self._touched = {key: at for key, at in touched.items() if at > cut}
        self._unknown = max(self._unknown, cut)
        return True

    def moved(self, key: int | None, seen: int) -> bool:
        """Whether a follower of `key` (None: of any change) that read the head `seen`
        has something new to look at (a commit after `seen` that may concern it)."""
        if key is None:
            return self._head > seen
        return self._unknown > seen or self._touched.get(key, 0) > seen

    def unmoved(self, key: int | None, seen: int) -> int | None:
        """None when `moved(key, seen)`; else the head now, which such a follower may
        take as seen (nothing up to it concerns it)."""
        with self._lock:
            return None if self.moved(key, seen) else max(self._head, seen)

    def recheck(self) -> None:
        """Wake every waiter to look again now (`wait` returns True): something besides
        the head changed for one of them (a subscription was added to the delivery thread,
        or the journal is closing it)."""
        with self._lock:
            self._epoch += 1
            self._waits.notify_all()
            loops = self._waits.futures_to_wake()
        wake_loops(loops)

    @property
    def epoch(self) -> int:
        """Bumped by `recheck` (and when the thread could not read the head)."""
        return self._epoch

    def wait(
        self,
        seen: int,
        stop: threading.Event | None,
        timeout: float | None = None,
        epoch: int | None = None,
        key: int | None = None,
        followers: int = 1,
    ) -> bool:
        """Block until the head passes `seen` (True), `stop` is set or `timeout` ends.
        With `epoch` (read before deciding to wait), a `recheck` since then also returns
        True, so a wake-up that came before the wait began is not lost. With `key` (the
        follower's session incarnation) only a commit that may concern it counts
        (`moved`). `followers`: how many followers this wait stands for (the delivery
        thread's subscriptions)."""
        if os.getpid() != self._pid:
            return True  # a forked child: look again (its reads refuse the parent's journal)
        deadline = None if timeout is None else time.monotonic() + timeout
        # (Signal handlers run in the main thread only, and only once it wakes: one
        # delivered to another thread of the process, which Linux does when the main
        # thread has a signal pending already, waited for the follower's next commit.)
        most = MAIN_SLICE_S if threading.current_thread() is threading.main_thread() else None
        registered = Registered()
        with self._lock:
            if self.moved(key, seen):
                return True
            if seen > self._seen_max:
                self._seen_max = seen
            if epoch is None:
                epoch = self._epoch
            elif epoch != self._epoch:
                return True
            try:
                cv = self._enter(registered, stop, followers, key)
                self._start()
                while True:
                    if self.moved(key, seen) or self._epoch != epoch:
                        return True
                    if stop is not None and stop.is_set():
                        return False
                    if deadline is None:
                        _sleep(cv, self._lock, most)
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    _sleep(cv, self._lock, remaining if most is None else min(remaining, most))
            finally:
                try:
                    self._waits.leave(registered)
                except BaseException:  # (a Ctrl+C at its start: nothing was undone)
                    self._waits.leave(registered)
                    raise

    async def await_change(
        self,
        seen: int,
        timeout: float | None = None,
        epoch: int | None = None,
        key: int | None = None,
    ) -> None:
        """The asyncio twin of `wait` (without `stop`: cancel the task instead).

        Waits on a plain future woken by `publish`, by the waiter thread or by a timer:
        unlike `asyncio.wait_for`, awaiting a future never swallows a cancellation that
        races with the wake-up (seen under load with Python 3.11)."""
        import asyncio

        if os.getpid() != self._pid:
            return
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            waiter = loop.create_future()
            registered = Registered()
            timer = None
            try:
                with self._lock:
                    if self.moved(key, seen):
                        return
                    if seen > self._seen_max:
                        self._seen_max = seen
                    if epoch is None:
                        epoch = self._epoch
                    elif epoch != self._epoch:
                        return  # (a `recheck` since the caller read `epoch`)
                    self._waits.add_future(loop, waiter, key, seen, registered)
                    self._enter(registered, None)
                    self._start()
                if deadline is not None:
                    timer = loop.call_at(loop.time() + deadline - time.monotonic(), wake, waiter)
                await waiter
            finally:
                if timer is not None:
                    timer.cancel()
                with self._lock:
                    self._waits.drop_future(loop, waiter)
                    try:
                        self._waits.leave(registered)
                    except BaseException:  # (a Ctrl+C at its start: nothing was undone)
                        self._waits.leave(registered)
                        raise
            with self._lock:
                if self.moved(key, seen) or self._epoch != epoch:
                    return
            if deadline is not None and time.monotonic() >= deadline:
                return

    def _enter(
        self, registered: Registered, stop: Any, followers: int = 1, key: int | None = None
    ) -> threading.Condition:
        """A follower starts waiting (under the lock, `Waits.enter`): the condition it
        sleeps on; the thread is wanted from now on."""
        condition = self._waits.enter(registered, stop, followers, key, self._want_stops)
        self._wanted.set()
        return condition

    def _want_stops(self) -> None:
        stop_checks().want(self)  # (checked from now on, every STOP_CHECK_S)

    def _start(self) -> None:
        """Start the thread if none runs (under the condition; last, so a signal that
        interrupts `start` leaves every count right)."""
        if self._thread is None and not self._closed:
            thread = self._thread = threading.Thread(
                target=self._run, name="journal-waiter", daemon=True
            )
            try:
                start_thread(thread)
            except BaseException:
                # Not started (no thread left, a Ctrl+C before it began), or started and
                # not told so (a Ctrl+C in its wait for that): forgotten, so the next
                # wait starts one; one that began takes the place itself, if still free
                # (`_run`). Until 2026-12-05 the thread never started stayed recorded as
                # running, and no wait started one again: the journal's followers never
                # saw another process's commit (a review).
                self._thread = None
                raise

    # -- the waiter thread -----------------------------------------------------------------

    def close(self) -> None:
        """End the thread and wait for it (the journal is closing). Idempotent."""
        with self._lock:
            self._closed = True
            thread = self._thread
            source = self._source
        try:
            self._wanted.set()
            self._nap.set()
            if source is not None:
                source.interrupt()
            with self.busy:
                pass  # a head read in flight ends before the engine closes what it reads
            if thread is not None and thread is not threading.current_thread():
                # (Not started: a signal interrupted `start`; it ends at its first step.)
                with contextlib.suppress(RuntimeError):
                    thread.join(5)
        finally:
            # (The last journal's close ends the checks' thread; also after a Ctrl+C in
            # the waits above, whose journal's close is then over.)
            stop_checks().drop(self)

    def _run(self) -> None:
        with self._lock:
            # (Its `start` was interrupted after it began: the place is taken if still
            # free, else this thread ends; `_start` holds this lock until then.)
            if self._thread is None and not self._closed:
                self._thread = threading.current_thread()
            if self._thread is not threading.current_thread():
                return
        source: ChangeSource | None = None
        try:
            if self._changes is not None:
                try:
                    source = self._changes()
                except Exception:  # (OSError, a client's own errors, a close meanwhile)
                    _log.debug("the change source failed; polling instead", exc_info=True)
                    source = None  # poll instead
            with self._lock:
                self._source = source
            # First look after the watch exists: what was committed before it is not
            # reported.
            self._changed = True
            while True:
                try:
                    if not self._step(source):
                        return
                except OSError:
                    if source is None:
                        raise
                    # The change source failed (only its wait raises): poll from now on.
                    with self._lock:
                        self._source = None
                    source.close()
                    source = None
        finally:
            with self._lock:
                if self._source is source:
                    self._source = None
                if self._thread is threading.current_thread():
                    self._thread = None
            if source is not None:
                source.close()

    def _step(self, source: ChangeSource | None) -> bool:
        """Read the head once, wake whom it concerns, then sleep until the next look;
        False when the thread should end."""
        with self._lock:
            if self._closed:
                return False
            if self._waits.has_futures():
                self._waits.forget_closed_loops()
            if self._waits.waiting == 0:
                self._wanted.clear()
                idle = True
            else:
                idle = False
            stops = self._waits.stop_events()
        if idle:
            # Nobody waits: linger without reading anything, then end unless one came.
            self._wanted.wait(LINGER_S)
            with self._lock:
                if self._closed or self._waits.waiting == 0:
                    self._thread = None
                    return False
            self._changed = True
            return True
        now = time.monotonic()
        if source is not None and self._changed and now - self._last_publish < DEFER_S:
            # Most likely this process's own commit, whose followers were just woken: read
            # after they had the interpreter (measured: reading at once added 0.2 ms to the
            # in-process p50); a commit of another process is seen DEFER_S later at most.
            self._nap.wait(DEFER_S)
            now = time.monotonic()
        # (Less a stop check of slack: a wait of SAFETY_POLL_S may end a little early.)
        if self._changed or now - self._last_look >= SAFETY_POLL_S - STOP_CHECK_S:
            self._last_look = now
            self._plan_recheck(self._look(stops))
        else:
            self._check(stops)  # a stop check: the head did not move (no event came)
        if source is not None:
            timeout = SAFETY_POLL_S  # (stops: the process's stop checks look at them)
            if self._recheck:
                timeout = min(timeout, max(0.0, self._recheck_at - time.monotonic()))
            event = source.wait(timeout)
            # (Not due when an `interrupt` ended the wait early, a new follower's stop:
            # until 2026-12-05 it was, and a few of them used up the looks again within
            # a millisecond; a review. Half a look early is due: `poll` counts in ms.)
            self._recheck_due = (
                not event
                and self._recheck > 0
                and time.monotonic() >= self._recheck_at - RECHECK_FIRST_S / 2
            )
            self._changed = event or self._recheck_due
        else:
            recent = time.monotonic() - self._last_move < FAST_WINDOW_S
            self._nap.wait(FAST_POLL_S if recent else IDLE_POLL_S)
            self._changed = True
        return True

    def _plan_recheck(self, moved: bool) -> None:
        """After a look: when to look again though no change is reported (`_recheck`,
        0: not before one is), for a change the head did not show yet (RECHECK_*)."""
        if moved or not self._changed or not self._lagging_reads:
            self._recheck = 0.0
        elif self._recheck_due:  # (looked again, nothing yet: again, twice as late)
            self._recheck *= 2
            if self._recheck > RECHECK_MAX_S:
                self._recheck = 0.0
        elif time.monotonic() - self._last_publish >= RECHECK_OWN_S:
            # An event the head did not show: look again soon. (Counted from each such
            # event, not doubled by it: a commit's writes are several events, which used
            # up the looks again within microseconds.)
            self._recheck = RECHECK_FIRST_S
        elif not self._recheck:
            # Most likely this process's own commit, published already: look once more,
            # a little later, for another process's commit right after it.
            self._recheck = RECHECK_MAX_S
        self._recheck_at = time.monotonic() + self._recheck

    def wake_stopped(self) -> bool:
        """Wake the waiting followers if a stop of one of them is set (the process's
        stop checks, every STOP_CHECK_S); False when none waits with a stop."""
        with self._lock:
            stops = self._waits.stop_events()
            if self._closed or not stops:
                return False
        self._check(stops)
        return True

    def _check(self, stops: list[Any]) -> None:
        if any_set(stops):
            with self._lock:
                self._waits.notify_all()

    def _read(self) -> tuple[int, Collection[int] | None]:
        """The head, and the sessions the commits since the previous read touched."""
        if self._read_changes is None or self._waits.followers <= FEW_FOLLOWERS:
            # (Waking so few costs less than finding whom: their next event comes
            # sooner. The engine's next read of changes covers these commits too.)
            return self._read_head(), None
        return self._read_changes()

    def _look(self, stops: list[Any]) -> bool:
        """Read the head and wake whom its move concerns; False when it read the head
        and found it where it was."""
        failed = rewound = unknown = False
        keys: Collection[int] | None = None
        with self.busy:
            if self._closed:
                return True
            try:
                head, keys = self._read()
                if self._rewinds and head < max(self._head, self._seen_max):
                    # Behind what was known: a commit during the read, or the head went
                    # back (another process accepted a hole in the log): read it again,
                    # against what was known before this read began (a head read is never
                    # behind that; commits published during it may be ahead of it).
                    known = max(self._head, self._seen_max)
                    head, more = self._read()
                    keys = None if keys is None or more is None else {*keys, *more}
                    rewound = head < known
            except HeadUnknown:
                unknown = True
            except Exception:  # the waiters' own reads raise it (or find it gone)
                failed = True
                head = 0
            self._polls += 1
        if unknown:  # (an outage: nothing to tell the followers; their stops still count)
            self._check(stops)
            return True
        if rewound:
            self.rewind(head)
            return True
        stopped = any_set(stops)
        with self._lock:
            moved = head > self._head
            if moved:
                # Commits this process did not publish (another process's; or its own,
                # read before their `publish`): their sessions' followers look, or every
                # follower when which sessions is not known.
                self._last_move = time.monotonic()
                if keys is None or self._touch(keys, head):
                    keys = None  # (not known, or forgotten: everyone looks)
                    self._unknown = max(self._unknown, head)
                self._head = head
            if failed:
                self._epoch += 1
            if not (moved or failed or stopped):
                return False
            if keys is not None and moved and not (failed or stopped):
                self._waits.notify_keys(keys)
                loops = self._waits.futures_to_wake(self.moved)
            else:
                self._waits.notify_all()
                loops = self._waits.futures_to_wake() if moved or failed else []
        wake_loops(loops)
        return moved or failed


def _sleep(cv: threading.Condition, lock: Any, timeout: float | None) -> None:
    """`cv.wait(timeout)` with `lock`, its lock, held once: held again however the wait
    ends. `Condition.wait` releases it in Python code before its `try`, and a signal
    handler that raised between the two (a Ctrl+C in a watch) left it released: the
    caller's `with` then raised RuntimeError("cannot release un-acquired lock") in place
    of the KeyboardInterrupt (a review)."""
    try:
        cv.wait(timeout)
    except BaseException:
        if not lock._is_owned():
            lock.acquire()
        raise


def _close_source_in_child(notifier: Notifier) -> None:
    source = notifier._source  # the parent's thread is not here: nobody else uses it
    if source is not None:
        with contextlib.suppress(OSError):
            source.close()


# Every notifier of this process: fork() waits until no waiter thread reads its store, so
# the child's copy of the environment is idle; the child closes its copies of the change
# sources' files.
_NOTIFIERS: Final[ForkPause[Notifier]] = ForkPause(_close_source_in_child)
