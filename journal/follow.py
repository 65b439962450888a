"""Following: the one follow loop behind `replay`, `watch`, `awatch`, `watch_sessions`
and `awatch_sessions` (every follower of a journal waits on its one shared waiter,
`waiter.Notifier`).

A follow loop is a *pager* (one page step: what to deliver now, and whether to wait for
the head to move or to stop) driven either synchronously (`follow`) or by asyncio
(`afollow`); the two drivers share every decision the pager makes.
"""

from __future__ import annotations

# (asyncio is imported by the coroutines below, which only run once it is: a process that
# never follows from asyncio, such as the `journal` command, does not pay for its import,
# about a tenth of the command's start-up with the ssl and subprocess modules it brings.)
import concurrent.futures
import threading
import time
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Generator,
    Iterator,
)
from itertools import chain, islice
from typing import Any, Final, Generic, Protocol, TypeVar

from .engine import READ_SCOPE, Flag, ReadScope
from .errors import JournalClosed
from .models import Event, LifecycleEvent
from .sessions import SessionRow
from .waiter import Notifier

__all__ = [
    "AsyncFollow",
    "EventPager",
    "LifecyclePager",
    "PendingRead",
    "ReadThreads",
    "Resume",
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
UnsettledCheck = Callable[[SessionRow, bool, str | None, SessionRow | None], SessionRow | None]

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
        # The last event delivered by a live pager, until it has delivered everything;
        # then its cursor, when an unsettled turn may be judged (`_caught_up`).
        self._last: Event | None = None
        self.last_cursor: str | None = None
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
            if self._unsettled is not None and self._live:
                self._last = last
        if has_more:
            return events, None, False
        if not self._live:
            self.finished = True
            return events, None, True
        if events:
            # One more page after the last events: a session ends (or a turn is judged)
            # only once drained.
            return events, None, False
        if self._last is not None:
            # Its cursor (an `OutcomeUnknown`'s), signed once the follower has delivered
            # everything, before it waits: not the event (a follower waiting after a 2 MB
            # event held those 2 MB), and not every page's (the cursor marks the event's
            # data: a CRC-32 of 4 MB each page doubled a replay of such events).
            self.last_cursor, self._last = self._last.cursor, None
        if self._unsettled is not None and row.turn_request_id is not None:
            check, watch_owner = self._unsettled
            self._suspect = check(row, terminal, self.last_cursor, self._suspect)
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
            # Its pages read the feed as they go (their cursors' anchor, the last one's
            # cursor), in a generator that a cut read would end, and the rest of the
            # snapshot with it: the next step went on after the snapshot's point, its
            # sessions lost (an `awatch_sessions` step cancelled by a timeout: a
            # review). Those reads are not cut: a cancelled step's page is kept for the
            # next step (`PendingRead`), or a follow cancelled for good drops it.
            token = READ_SCOPE.set(None)
            try:
                page = next(self._snapshot_pages, None)
            finally:
                READ_SCOPE.reset(token)
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
    `wake()` ends a wait of it in progress (`close` from another thread); `stopped()`,
    once True, ends the stream in the middle of a page (a watch's `stop` set, its journal
    closing: the page generator ends there too). A page is delivered in slices sized to
    take about `SLICE_S` of the consumer's time each (`_one_at_a_time`): the stream looks
    at `halted()` and `stopped()` between them. (Nothing the generator holds refers back to
    the stream: a stream dropped without `close()` is freed, and its files closed, at
    once, not by the cyclic garbage collector.)"""

    __slots__ = ("_delivering", "_halted", "_inside", "_items", "_pages", "_reading", "_wake")

    def __init__(
        self,
        pages: Callable[[Callable[[], bool]], Generator[list[ItemT], None, None]],
        wake: Callable[[], None],
        stopped: Callable[[], bool] | None = None,
    ) -> None:
        # (Not a `threading.Event`: its `set` takes a lock in Python code, which a Ctrl+C
        # in `close` left held, and the next `close` hung: a review.)
        self._halted = Flag()
        # Held while a thread runs the page generator (reads a page, or waits).
        self._inside = threading.Lock()
        # The read scope of the step in progress ([None]: none): `close` cuts its read.
        self._reading: list[ReadScope | None] = [None]
        # The page being delivered ([] between pages): `close` empties it.
        self._delivering: list[list[ItemT]] = []
        self._wake = wake
        self._pages = pages(self._halted.is_set)
        halted = self._halted.is_set
        ended = halted if stopped is None else lambda: halted() or stopped()
        self._items = chain.from_iterable(
            _one_at_a_time(self._pages, self._inside, self._reading, self._delivering, ended)
        )

    def __iter__(self) -> Iterator[ItemT]:
        return self._items

    def __next__(self) -> ItemT:
        return next(self._items)

    def close(self) -> None:
        """Stop: the next `next()` raises StopIteration; files and waits are released.
        Called while another thread iterates the stream (blocked in a watch, say), it
        returns at once and that thread's loop ends after the item it is handling; a
        wait ends at once, and that thread releases what the stream holds."""
        self._halted.set()
        for page in list(self._delivering):
            # (The rest of the page in delivery: the iterator of its slice in the `for`
            # loop that iterates the stream, in C, ends at its next step.)
            page.clear()
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


# A page is delivered in slices that take about this much of the consumer's time each
# (between SLICE_S / 2 and 2 x SLICE_S, or a single item, or `_MOST_SLICE` items): a
# stream ends at most about that long after its stop is set, not a whole page later (a
# default page holds about 10,000 small events: 2 s for a consumer taking 0.2 ms an
# event, until 2026-12-07).
SLICE_S: Final = 0.005
# The first slice's items; then doubled while the consumer keeps up, or cut to its pace.
_FIRST_SLICE: Final = 16
# The most items a slice holds: a slice's pace is learnt only once it is over, so a
# consumer that slows down after a fast catch-up (whose slices grew) goes on at its new
# pace for the slice in delivery. Up to 2**20 items, that slice was a whole page (20,000
# events at 0.5 ms each: 10 s after the stop); 256 items cost no more than 1% of a replay.
_MOST_SLICE: Final = 256


def _one_at_a_time(
    pages: Generator[list[ItemT], None, None],
    inside: threading.Lock,
    reading: list[ReadScope | None],
    delivering: list[list[ItemT]],
    ended: Callable[[], bool],
) -> Iterator[Iterator[ItemT]]:
    """`pages`, run under `inside` (`Stream.close` closes it only when nobody runs it),
    each step in a read scope kept in `reading` (`Stream.close` cancels it), each page
    kept in `delivering` while delivered in slices (`Stream.close` empties it), up to
    the first slice before which `ended()` (the page generator is then closed: it ends as
    it would have at its next step)."""
    clock = time.monotonic
    size = _FIRST_SLICE
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
        # (Slices of one iterator of the page, not copies of its parts: a copy took
        # a pass over every event more, out of the cache.)
        items, at, count = iter(page), 0, len(page)
        delivering.append(page)
        while at < count:
            # (Before the first slice too: a close from another thread while this one
            # read the page found no page in delivery to empty.)
            if ended():
                delivering.clear()
                del page, items
                with inside:
                    pages.close()
                return
            at += size
            began = clock()
            yield islice(items, size)
            spent = clock() - began
            if spent < SLICE_S / 2:
                if at <= count:  # (a whole slice: not the short end of a page)
                    size = min(2 * size, _MOST_SLICE)
            elif spent > 2 * SLICE_S:
                size = max(1, int(size * SLICE_S / spent))
        delivering.clear()
        del page, items  # (freed before the next page is read: see `follow`)


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

    async def run(
        self, call: Callable[..., ResultT], *args: Any, pending: PendingRead | None = None
    ) -> ResultT:
        """`call(*args)` in one of the threads; a task cancelled meanwhile cancels the read
        too (its `READ_SCOPE`): it is not asked again, and its request in flight is cut.
        The read may have finished before it was cut: with `pending`, it is kept there
        for the follower's next step (`PendingRead.settle`)."""
        import asyncio
        import contextvars

        scope = ReadScope()

        def run() -> ResultT:
            READ_SCOPE.set(scope)  # (in the copied context this thread runs in)
            return call(*args)

        context = contextvars.copy_context()
        with self._lock:  # (no submission after `close`)
            if self._closed:
                raise JournalClosed.already()
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(READ_THREADS, "journal-aread")
            submitted = self._pool.submit(context.run, run)
        try:
            result: ResultT = await asyncio.wrap_future(submitted)
        except asyncio.CancelledError:
            scope.cancel()
            if pending is not None:
                pending.future = submitted
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
    threads: ReadThreads | None,
    call: Callable[..., ResultT],
    *args: Any,
    pending: PendingRead | None = None,
) -> ResultT:
    """`call(*args)`: in one of `threads` (given for an engine whose reads wait on the
    network), so the caller's event loop goes on meanwhile; else right here."""
    if threads is None:
        return call(*args)
    return await threads.run(call, *args, pending=pending)


class PendingRead:
    """The page read in a worker thread of an asyncio follower's step that was cancelled
    (`future`): it may have finished before the cancellation cut it, its pager moved on,
    and its items come first at the follower's next step (`settle`)."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[Any] | None = None

    async def settle(self) -> Any:
        """What the pending read returned (None: no read pending, or it was cut or never
        ran, and its pager did not move). Its error, if it failed otherwise."""
        import asyncio

        pending = self.future
        if pending is None:
            return None
        if not pending.done():
            try:
                await asyncio.wrap_future(pending)
            except BaseException:
                task = asyncio.current_task()
                if (task is not None and task.cancelling()) or not pending.done():
                    raise  # (this step's own cancellation: the read stays pending)
                # (Else it ended: a cut read's `concurrent.futures.CancelledError` comes
                # through `wrap_future` as asyncio's, as does its step's cancellation
                # reaching it while still queued, which only now took effect.)
        self.future = None
        if pending.cancelled():
            return None
        error = pending.exception()
        if error is None:
            return pending.result()
        if isinstance(error, concurrent.futures.CancelledError):
            return None
        raise error


class Resume:
    """Where an asyncio follow is, kept across the async generators of one `AsyncFollow`
    (each step of it is a step of one of them; a cancelled step ends the one it reached):
    its pager once made (`pager`, and its `readers`), the follower driving the pager
    (`follower`, an `afollow`: it outlives a generator whose step was cancelled before it
    began, with the rest of its page), the read of a step cancelled while a worker thread
    ran it (`pending`), and `over` once the follow ended (by itself, with an error, or
    `aclose`). (Nothing the follower holds refers back to it: dropped, its readers are
    freed at once, not by the cyclic garbage collector.)"""

    __slots__ = ("follower", "over", "pager", "pending", "readers")

    def __init__(self) -> None:
        self.pager: Any = None
        self.readers: Any = None
        self.follower: AsyncGenerator[Any, None] | None = None
        self.pending = PendingRead()
        self.over = False

    def end(self) -> None:
        """The follow ended (by itself, with an error, or closed): its next steps end at
        once, and its readers are closed."""
        self.over = True
        self.follower = None
        readers, self.readers = self.readers, None
        if readers is not None:
            readers.close()

    def release(self) -> None:
        """A step was cancelled: close the readers' files until the next page (a task
        cancelled for good may be kept long, by its traceback: a server that keeps its
        tasks until it reaps them kept a segment file open for each)."""
        readers = self.readers
        if readers is not None:
            readers.release()

    def following(self) -> bool:
        """Whether the follower still has a step to take (else it ended: cancelled, or
        not made yet)."""
        follower = self.follower
        return follower is not None and follower.ag_frame is not None  # type: ignore[attr-defined]


class AsyncFollow(Generic[ItemT]):
    """What `awatch` and `awatch_sessions` return: an async iterator over async generators
    (`_steps`) that all drive one pager, made by `start(resume)` at the first step (None:
    the follow ended at once, the journal closed during its first read).

    A step cancelled from outside the iterating task (`asyncio.wait_for(anext(it), t)`,
    `asyncio.timeout` around one step) ends the generator it reached, as a cancellation
    ends any async generator (or, cancelled before it began, the generator is thrown
    into where it last yielded); the next step starts another, which goes on with the
    same follower or pager, after the last item delivered. (Until 2026-12-05 `awatch`
    was that async generator: the next step raised `StopAsyncIteration`, as at the
    session's end, and a server sending keep-alives while a session was quiet ended its
    stream at the first one: a trial.) A cancelled task just stops stepping,
    and its follow ends. `__anext__` is not a coroutine of its own (one more frame an
    item made a catch-up 25-35% slower)."""

    __slots__ = ("_follow", "_resume", "_steps")

    def __init__(
        self,
        start: Callable[[Resume], Awaitable[Pager[ItemT] | None]],
        waiter: Notifier,
        closed: Callable[[], bool],
        threads: ReadThreads | None,
    ) -> None:
        self._follow = (start, waiter, closed, threads)
        self._resume = Resume()
        self._steps = _steps(self._resume, *self._follow)  # (runs nothing yet)

    def __aiter__(self) -> AsyncFollow[ItemT]:
        return self

    def __anext__(self) -> Awaitable[ItemT]:
        steps = self._steps
        if steps.ag_frame is None and not self._resume.over:  # type: ignore[attr-defined]
            # (A cancellation ended the last generator: another goes on.)
            steps = self._steps = _steps(self._resume, *self._follow)
        return steps.__anext__()

    async def aclose(self) -> None:
        """Stop following and release what the follow holds (`async for` does not need
        it: leaving the loop or cancelling the task is enough)."""
        follower = self._resume.follower  # (before the step's end drops it)
        await self._steps.aclose()
        self._resume.end()
        if follower is not None:
            await follower.aclose()


async def _steps(
    resume: Resume,
    start: Callable[[Resume], Awaitable[Pager[ItemT] | None]],
    waiter: Notifier,
    closed: Callable[[], bool],
    threads: ReadThreads | None,
) -> AsyncGenerator[ItemT, None]:
    """One generator of an `AsyncFollow`: the first starts the follow, the others go on
    with its follower (the rest of a page), or a new follower of its pager."""
    import asyncio

    cancelled = False
    try:
        if not resume.following():
            pager = resume.pager
            if pager is None:
                pager = resume.pager = await start(resume)
                if pager is None:
                    return
            elif closed():
                return
            resume.follower = afollow(pager, waiter, closed, threads, resume.pending)
        async for item in resume.follower:  # type: ignore[union-attr]
            yield item
            del item  # (not held while the follower waits)
    except asyncio.CancelledError:
        cancelled = True  # (the follow goes on at the next step: `AsyncFollow`)
        resume.release()
        raise
    finally:
        if not cancelled:
            resume.end()


async def afollow(
    pager: Pager[ItemT],
    waiter: Notifier,
    closed: Callable[[], bool],
    threads: ReadThreads | None,
    pending: PendingRead | None = None,
) -> AsyncGenerator[ItemT, None]:
    """Drive `pager` from asyncio (cancel the task to stop); items one by one. With
    `threads` (the engine's reads wait on the network) each step runs in one of them, so
    the caller's loop goes on meanwhile. Without them each step reads on the loop, and
    the follower yields to the loop once per page (`asyncio.sleep(0)`): a catch-up of a
    long backlog whose consumer does not suspend (socket writes the kernel takes at
    once) otherwise held the loop until it reached the head, so the loop's other tasks,
    a cancellation and `asyncio.timeout` waited that long (SPEC 7.6). With `pending`, a
    read of a step cancelled before (`AsyncFollow`) is settled first."""
    import asyncio

    while not closed():
        epoch = waiter.epoch  # (before the step: a `recheck` during it is not lost)
        try:
            settled = None if pending is None else await pending.settle()
            if settled is None:
                items, wait_past, done = await off_loop(threads, pager.step, pending=pending)
            else:
                items, wait_past, done = settled
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
