"""Following: the one follow loop behind `replay`, `watch`, `awatch`, `watch_sessions`
and `awatch_sessions` (every follower of a journal waits on its one shared waiter,
`waiter.Notifier`).

A follow loop is a *pager* (one page step: what to deliver now, and whether to wait for
the head to move or to stop) driven either synchronously (`follow`) or by asyncio
(`afollow`); the two drivers share every decision the pager makes.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from itertools import chain
from typing import Any, Final, Generic, Protocol, TypeVar

import msgspec

from .engine import READ_SCOPE, Flag, ReadScope
from .errors import JournalClosed
from .models import Event, LifecycleEvent
from .sessions import SessionRow
from .waiter import Notifier

__all__ = [
    "EventPager",
    "LifecyclePager",
    "ReadThreads",
    "Stream",
    "afollow",
    "follow",
    "off_loop",
]

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


class Pager(Protocol[ItemT]):
    """One page step: (items to deliver, the committed head to wait past before the next
    step or None to step again at once, whether the follow is over). `wait_timeout` is
    the longest such a wait may last (None: until the head moves); `wait_key` the key of
    the commits that concern the pager (its session's incarnation; None: every commit),
    so the shared waiter wakes it only for those (`Notifier.wait`)."""

    wait_timeout: float | None
    wait_key: int | None

    def step(self) -> tuple[list[ItemT], int | None, bool]: ...


# (events, has_more, terminal, committed next position, the session's row) after an
# ordinal, from one snapshot
EventPage = tuple[list[Event], bool, bool, int, SessionRow]

# Called when a live follower has delivered everything and the session's last turn is
# unsettled: (row, terminal, last event delivered or None, the row of a previous check
# that found the owner gone or None) -> raises `OutcomeUnknown` when the outcome is
# unknown; returns None when the turn's owner is alive (or may be), or the row to check
# again after OWNER_RECHECK_S when it seems gone at a first look.
UnsettledCheck = Callable[[SessionRow, bool, Event | None, SessionRow | None], SessionRow | None]

# Registers a live follower that waits for the unsettled turn of a (fresh) row with the
# journal's shared owner checks (`owner_watch.OwnerWatch.watch`): they wake it when the
# owner seems gone; the registration lasts while the returned object is held.
WatchOwner = Callable[[SessionRow], object]

# How long after an owner first seemed gone a follower looks again, before it raises
# `OutcomeUnknown` (a wait of the follower: an asyncio follower's loop goes on).
OWNER_RECHECK_S: Final = 0.005


class EventPager:
    """A session's events after an ordinal: pages while more are retained; then, when
    `live`, waits for new ones until the session is terminal and drained. A live pager
    with `unsettled` never ends normally while the session's last turn is unsettled: it
    raises `OutcomeUnknown` once that turn's owner is gone or the session ended."""

    def __init__(
        self,
        read_page: Callable[[int, int], EventPage],
        after: int,
        live: bool,
        unsettled: tuple[UnsettledCheck, WatchOwner] | None,
        page_bytes: tuple[int, int],
    ) -> None:
        self._read_page = read_page
        # The page's bound (`read_page(after, max_bytes)`): the first's, then the rest's.
        self._page_bytes, self._later_bytes = page_bytes
        self.after = after
        self._live = live
        self._unsettled = unsettled
        self.last: Event | None = None
        self.wait_timeout: float | None = None
        self.wait_key: int | None = None
        # The row of the last owner check when it found the owner gone (SPEC 7.8).
        self._suspect: SessionRow | None = None
        # The registration with the shared owner checks while it waits for an owner.
        self._watching: object = None
        # Whether a pager that is not `live` delivered every event (not cut short).
        self.finished = False

    def step(self) -> tuple[list[Event], int | None, bool]:
        self._watching = None
        events, has_more, terminal, seen, row = self._read_page(self.after, self._page_bytes)
        self._page_bytes = self._later_bytes
        self.wait_timeout = None
        self.wait_key = row.incarnation
        if events:
            last = events[-1]
            self.after = last.ordinal
            # Kept for its cursor (an `OutcomeUnknown`'s), without its data: a follower
            # waiting after a 2 MB event held those 2 MB.
            self.last = msgspec.structs.replace(last, data=b"") if last.data else last
        if has_more:
            return events, None, False
        if not self._live:
            self.finished = True
            return events, None, True
        if events:
            # One more page after the last events: a session ends (or a turn is judged)
            # only once drained.
            return events, None, False
        if self._unsettled is not None and row.turn_request_id is not None:
            check, watch_owner = self._unsettled
            self._suspect = check(row, terminal, self.last, self._suspect)
            if self._suspect is None:
                # Its owner is alive (or may be): wait for the head to move, or for the
                # journal's owner checks to find the owner gone.
                self._watching = watch_owner(row)
            else:
                self.wait_timeout = OWNER_RECHECK_S  # it seems gone: look again soon
        else:
            self._suspect = None
        if terminal:
            return [], None, True
        return [], seen, False


class LifecyclePager:
    """Lifecycle changes after a feed position, after an optional startup snapshot (one
    CREATED per session, all from one read snapshot, delivered a page at a time)."""

    def __init__(
        self,
        read_feed: Callable[[int], tuple[list[LifecycleEvent], int, int]],
        after: int,
        snapshot: Callable[[], tuple[Iterator[list[LifecycleEvent]], int]] | None,
    ) -> None:
        self._read_feed = read_feed
        self.after = after
        self._snapshot = snapshot
        self._snapshot_pages: Iterator[list[LifecycleEvent]] | None = None
        self.wait_timeout: float | None = None
        self.wait_key: int | None = None  # (every commit may change the lifecycle)

    def step(self) -> tuple[list[LifecycleEvent], int | None, bool]:
        if self._snapshot is not None:
            self._snapshot_pages, self.after = self._snapshot()
            self._snapshot = None
        if self._snapshot_pages is not None:
            page = next(self._snapshot_pages, None)
            if page is not None:
                return page, None, False
            self._snapshot_pages = None  # (releases the snapshot's rows)
        events, self.after, seen = self._read_feed(self.after)
        return events, None if events else seen, False


class Stream(Generic[ItemT]):
    """What `replay`, `watch` and `watch_sessions` return: an iterator of items that can
    be closed (or used as a context manager) to stop following at once and release what
    it holds. Iterating it in a `for` loop runs at C speed (pages are flattened by
    `itertools.chain`).

    `pages(halted)` makes the page generator, which ends once `halted()` is True;
    `wake()` ends a wait of it in progress (`close` from another thread). (Nothing the
    generator holds refers back to the stream: a stream dropped without `close()` is
    freed, and its files closed, at once, not by the cyclic garbage collector.)"""

    __slots__ = ("_halted", "_inside", "_items", "_pages", "_reading", "_wake")

    def __init__(
        self,
        pages: Callable[[Callable[[], bool]], Generator[list[ItemT], None, None]],
        wake: Callable[[], None],
    ) -> None:
        # (Not a `threading.Event`: its `set` takes a lock in Python code, which a Ctrl+C
        # in `close` left held, and the next `close` hung: review h21b.)
        self._halted = Flag()
        # Held while a thread runs the page generator (reads a page, or waits).
        self._inside = threading.Lock()
        # The read scope of the step in progress ([None]: none): `close` cuts its read.
        self._reading: list[ReadScope | None] = [None]
        self._wake = wake
        self._pages = pages(self._halted.is_set)
        self._items = chain.from_iterable(_one_at_a_time(self._pages, self._inside, self._reading))

    def __iter__(self) -> Iterator[ItemT]:
        return self._items

    def __next__(self) -> ItemT:
        return next(self._items)

    def close(self) -> None:
        """Stop: the next `next()` raises StopIteration; files and waits are released.
        Called while another thread iterates the stream (blocked in a watch, say), it
        returns at once and that thread's loop ends after the page it is delivering; a
        wait ends at once, and that thread releases what the stream holds."""
        self._halted.set()
        if self._inside.acquire(blocking=False):
            try:
                self._pages.close()  # (nobody runs it: its cleanup runs here, now)
            finally:
                self._inside.release()
        else:
            # Another thread runs it: it ends at its next step, there; a read in progress
            # (it may wait 30 s on the network) is cut.
            scope = self._reading[0]
            if scope is not None:
                scope.cancel()
            self._wake()

    def __enter__(self) -> Stream[ItemT]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _one_at_a_time(
    pages: Generator[list[ItemT], None, None],
    inside: threading.Lock,
    reading: list[ReadScope | None],
) -> Iterator[list[ItemT]]:
    """`pages`, run under `inside` (`Stream.close` closes it only when nobody runs it),
    each step in a read scope kept in `reading` (`Stream.close` cancels it)."""
    while True:
        with inside:
            scope = reading[0] = ReadScope()
            token = READ_SCOPE.set(scope)
            try:
                page = next(pages, None)
            finally:
                READ_SCOPE.reset(token)
                reading[0] = None
        if page is None:
            return
        yield page
        del page  # (freed before the next page is read: see `follow`)


def follow(
    pager: Pager[ItemT],
    waiter: Notifier,
    stop: threading.Event | None,
    closed: Callable[[], bool],
) -> Generator[list[ItemT], None, None]:
    """Drive `pager` synchronously: pages as they come; ends when the pager is done,
    `stop` is set, or `closed()` (the journal is closed, or the stream)."""
    while True:
        # Read before `closed()`: a close whose wake-up comes after this point makes the
        # wait below return at once instead of sleeping until the next commit.
        epoch = waiter.epoch
        if closed() or (stop is not None and stop.is_set()):
            return
        scope = READ_SCOPE.get()
        if scope is not None and stop is not None:
            scope.stop_with(stop)  # (a read asked again in an outage ends once stopped)
        try:
            items, wait_past, done = pager.step()
        except (JournalClosed, concurrent.futures.CancelledError):
            # Closed (the journal or the stream) or stopped by another thread while the
            # page was read: the read was cut, and the follow ends.
            if closed() or (stop is not None and stop.is_set()):
                return
            raise
        if items:
            yield items
            # Drop the delivered page before reading the next: its events are freed now,
            # and the next page's are allocated in the memory they leave, still in cache
            # (held through the next read, two pages' objects outgrow the L2 cache).
            del items
        if done:
            return
        if wait_past is not None:
            waiter.wait(wait_past, stop, pager.wait_timeout, epoch, pager.wait_key)


# How many threads a journal's `ReadThreads` may run at once.
READ_THREADS: Final = 64


class ReadThreads:
    """The worker threads that run a journal's asyncio followers' reads when its engine's
    reads block (wait on the network): the journal's own, not the loop's default
    executor, which the application's `to_thread`, `run_in_executor(None, ...)` and
    `getaddrinfo` share (a read may wait 30 s in an outage). Started on first use; `close`
    (the journal closes) lets them end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: Any = None  # a ThreadPoolExecutor, from the first read
        self._closed = False

    async def run(self, call: Callable[..., ResultT], *args: Any) -> ResultT:
        """`call(*args)` in one of the threads; a task cancelled meanwhile cancels the read
        too (its `READ_SCOPE`): it is not asked again, and its request in flight is cut."""
        import asyncio
        import contextvars

        scope = ReadScope()

        def run() -> ResultT:
            READ_SCOPE.set(scope)  # (in the copied context this thread runs in)
            return call(*args)

        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        with self._lock:  # (no submission after `close`)
            if self._closed:
                raise JournalClosed.already()
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(READ_THREADS, "journal-aread")
            future = loop.run_in_executor(self._pool, context.run, run)
        try:
            result: ResultT = await future
        except asyncio.CancelledError:
            scope.cancel()
            raise
        return result

    def close(self) -> None:
        """No reads after this; the threads end once their reads did (not waited for)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)


async def off_loop(
    threads: ReadThreads | None, call: Callable[..., ResultT], *args: Any
) -> ResultT:
    """`call(*args)`: in one of `threads` (given for an engine whose reads wait on the
    network), so the caller's event loop goes on meanwhile; else right here."""
    if threads is None:
        return call(*args)
    return await threads.run(call, *args)


async def afollow(
    pager: Pager[ItemT],
    waiter: Notifier,
    closed: Callable[[], bool],
    threads: ReadThreads | None,
) -> AsyncIterator[ItemT]:
    """Drive `pager` from asyncio (cancel the task to stop); items one by one. With
    `threads` (the engine's reads wait on the network) each step runs in one of them, so
    the caller's loop goes on meanwhile. Without them each step reads on the loop, and
    the follower yields to the loop once per page (`asyncio.sleep(0)`): a catch-up of a
    long backlog whose consumer does not suspend (socket writes the kernel takes at
    once) otherwise held the loop until it reached the head, so the loop's other tasks,
    a cancellation and `asyncio.timeout` waited that long (SPEC 7.6)."""
    import asyncio

    while not closed():
        epoch = waiter.epoch  # (before the step: a `recheck` during it is not lost)
        try:
            items, wait_past, done = await off_loop(threads, pager.step)
        except JournalClosed:
            if closed():  # (closed while the page was read: the watch ends)
                return
            raise
        for item in items:
            yield item
            del item  # (the last one is not held while the follower waits)
        del items  # (as in `follow`: freed before the next page is read)
        if done:
            return
        if wait_past is not None:
            await waiter.await_change(wait_past, pager.wait_timeout, epoch, pager.wait_key)
        elif threads is None:
            await asyncio.sleep(0)  # (the next page is read at once: let the loop run)
