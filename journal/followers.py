"""A journal's followers: the drivers of its follow loops over a session's events and the
lifecycle feed, for `replay` and `watch` (streams), `awatch` and `awatch_sessions`
(asyncio follows), `watch_sessions`, and the subscriptions its delivery thread steps.
Each is a pager (`EventPages`, `LifecycleFeed`) driven by the one follow loop
(`journal.follow`) or the delivery thread (`journal.subscriptions`), and each ends once
its journal does (`JournalEnds`). The facade checks the arguments and where a read
starts; this is what follows from there.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Generator
from functools import partial
from typing import NamedTuple

from .arguments import check_max_bytes
from .engine import Engine
from .errors import JournalClosed
from .event_pages import EventPages
from .follow import (
    AsyncFollow,
    EventPager,
    LifecyclePager,
    ReadThreads,
    Resume,
    Stream,
    follow,
    off_loop,
)
from .lifecycle import LifecycleFeed
from .models import Event, LifecycleEvent
from .session_cursors import Start
from .sessions import SessionRow
from .subscriptions import Deliveries, ErrorHandler, Subscription

__all__ = ["Followers", "JournalEnds"]

# Where a session's read starts: its row and its start after a cursor (`Journal._start`).
StartOf = Callable[[str, str | None], tuple[SessionRow, Start]]


class JournalEnds(NamedTuple):
    """How a journal's followers learn that it ended: `closed()` once its close has
    closed it (a replay ends there), `closing()` from the moment a close begins (live
    follows end there, SPEC 7.8)."""

    closed: Callable[[], bool]
    closing: Callable[[], bool]


class Followers:
    """The followers of one journal over `engine`: streams, asyncio follows and
    subscriptions of a session's events (`pages`) and of the lifecycle feed
    (`lifecycle`), on the journal's delivery thread (`deliveries`) and its asyncio
    followers' read threads (`read_threads`)."""

    def __init__(
        self,
        engine: Engine,
        pages: EventPages,
        lifecycle: LifecycleFeed,
        deliveries: Deliveries,
        read_threads: ReadThreads | None,
    ) -> None:
        self._engine = engine
        self._pages = pages
        self._lifecycle = lifecycle
        self._deliveries = deliveries
        self._read_threads = read_threads

    # -- a session's events ----------------------------------------------------------------

    def events(
        self,
        row: SessionRow,
        start: Start,
        cursor: str | None,
        stop: threading.Event | None,
        live: bool,
        page_bytes: tuple[int, int],
        ends: JournalEnds,
    ) -> Stream[Event]:
        """The events of `row`'s session after `start`: those committed now (a replay),
        or then live ones too (`live`: a watch)."""
        # The stream flattens pages with itertools.chain (in C): no frame per event. A
        # watch ends in the middle of a page once its stop is set or its journal closing
        # (a replay cut by a close raises `JournalClosed` at its next page: `_follow`).
        return Stream(
            partial(self._follow, row, start, stop, live, page_bytes, cursor, ends),
            self._engine.waiter.recheck,
            _stopped(stop, ends) if live else None,
        )

    def _follow(
        self,
        row: SessionRow,
        start: Start,
        stop: threading.Event | None,
        live: bool,
        page_bytes: tuple[int, int],
        cursor: str | None,
        ends: JournalEnds,
        halted: Callable[[], bool],
    ) -> Generator[list[Event], None, None]:
        """A stream's pages; `page_bytes`: the first's bound, then the others'."""
        with self._engine.readers() as readers:
            pager = self._pages.pager(row, start, readers, live, page_bytes, cursor)
            ended = _closing_or(ends, halted) if live else lambda: ends.closed() or halted()
            yield from follow(pager, self._engine.waiter, stop, ended)
        if not live and not pager.finished and ends.closed() and not halted():
            raise JournalClosed(  # (not as if complete: a fold would hold part of it)
                f"the journal was closed while session {row.session_id!r} was replayed: "
                f"events after ordinal {pager.after} were not read"
            )

    def aevents(
        self,
        session_id: str,
        cursor: str | None,
        max_bytes: int,
        start_of: StartOf,
        ends: JournalEnds,
    ) -> AsyncIterator[Event]:
        """The asyncio follow of the session's events after `cursor` (`awatch`)."""
        start = partial(self._aevents_start, session_id, cursor, max_bytes, start_of, ends)
        return AsyncFollow(start, self._engine.waiter, ends.closing, self._read_threads)

    async def _aevents_start(
        self,
        session_id: str,
        cursor: str | None,
        max_bytes: int,
        start_of: StartOf,
        ends: JournalEnds,
        resume: Resume,
    ) -> EventPager | None:
        check_max_bytes(max_bytes)
        opened = not ends.closed()
        try:
            row, start = await off_loop(self._read_threads, start_of, session_id, cursor)
        except JournalClosed:
            if opened and ends.closed():  # (closed while its first read was in flight)
                return None
            raise
        resume.readers = readers = self._engine.readers()
        return self._pages.pager(row, start, readers, True, (max_bytes, max_bytes), cursor)

    def subscribe(
        self,
        row: SessionRow,
        start: Start,
        cursor: str | None,
        listener: Callable[[Event], object],
        on_error: ErrorHandler | None,
        max_bytes: int,
    ) -> Subscription[Event]:
        """`listener(event)` for every event of `row`'s session after `start`, replay
        first and then live, on the delivery thread."""
        readers = self._engine.readers()
        pager = self._pages.pager(row, start, readers, True, (max_bytes, max_bytes), cursor)
        return self._deliveries.add(
            row.session_id, pager, listener, on_error, cursor, readers.close, readers.release
        )

    # -- the lifecycle feed ----------------------------------------------------------------

    def lifecycle(
        self, cursor: str | None, stop: threading.Event | None, ends: JournalEnds
    ) -> Stream[LifecycleEvent]:
        """The lifecycle events after `cursor` (`watch_sessions`)."""
        pager = self._lifecycle.pager(cursor)
        waiter = self._engine.waiter
        return Stream(
            lambda halted: follow(pager, waiter, stop, _closing_or(ends, halted)),
            waiter.recheck,
            _stopped(stop, ends),
        )

    def alifecycle(
        self, cursor: str | None, check_open: Callable[[], None], ends: JournalEnds
    ) -> AsyncIterator[LifecycleEvent]:
        """The asyncio follow of the lifecycle events after `cursor` (`awatch_sessions`);
        `check_open` raises what makes the journal unusable."""
        start = partial(self._alifecycle_start, cursor, check_open, ends)
        return AsyncFollow(start, self._engine.waiter, ends.closing, self._read_threads)

    async def _alifecycle_start(
        self,
        cursor: str | None,
        check_open: Callable[[], None],
        ends: JournalEnds,
        resume: Resume,
    ) -> LifecyclePager | None:
        check_open()
        try:
            return await off_loop(self._read_threads, self._lifecycle.pager, cursor)
        except JournalClosed:
            if ends.closed():  # (closed while its first read was in flight: it ends)
                return None
            raise

    def subscribe_lifecycle(
        self,
        cursor: str | None,
        listener: Callable[[LifecycleEvent], object],
        on_error: ErrorHandler | None,
    ) -> Subscription[LifecycleEvent]:
        """`listener(event)` for every lifecycle event after `cursor`, on the delivery
        thread."""
        pager = self._lifecycle.pager(cursor)
        return self._deliveries.add(None, pager, listener, on_error, cursor, lambda: None)


def _closing_or(ends: JournalEnds, halted: Callable[[], bool]) -> Callable[[], bool]:
    return lambda: ends.closing() or halted()


def _stopped(stop: threading.Event | None, ends: JournalEnds) -> Callable[[], bool]:
    """Whether a live follow is over for a reason of its own (what `follow` looks at
    before each step, but its stream's `halted`)."""
    if stop is None:
        return ends.closing
    is_set = stop.is_set
    return lambda: is_set() or ends.closing()
