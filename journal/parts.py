"""The parts a `Journal` is made of over an open engine, and their closing: which parts
there are, what each is given, and the order they are closed in (also when a journal is
garbage-collected without `close()`).
"""

from collections.abc import Callable
from typing import NamedTuple

from cursors import TokenCodec

from .abandoned import Detachable, close_when_dropped
from .engine import Engine
from .event_pages import EventPages
from .follow import ReadThreads
from .followers import Followers
from .lifecycle import LifecycleFeed
from .session_cursors import SessionCursors
from .session_views import SessionViews
from .subscriptions import Deliveries

__all__ = ["JournalParts", "assemble"]


class JournalParts(NamedTuple):
    """A journal's parts over one engine; `close()` closes them and the engine."""

    codec: TokenCodec
    cursors: SessionCursors
    sessions: SessionViews
    lifecycle: LifecycleFeed
    pages: EventPages
    deliveries: Deliveries
    # The asyncio followers' read threads, for an engine whose reads block (SPEC 7.6).
    read_threads: ReadThreads | None
    followers: Followers
    close: Callable[[], None]

    def close_when_dropped(self, journal: object, location: str) -> Detachable:
        """Closed when `journal` is garbage-collected without close() (SPEC 7): its
        thread, files and the store's place in this process are not kept for the life of
        the process. `detach()` the result when the journal is closed."""
        return close_when_dropped(
            journal,
            self.close,
            f"the journal of {location!r} was dropped without close() and is closed "
            "now: use `with Journal.open(...) as journal:`",
        )


def assemble(engine: Engine) -> JournalParts:
    """The parts of a journal over `engine` (which they close last but the read threads)."""
    codec = TokenCodec(engine.key_ring, keys_in_stream=engine.keys_in_stream)
    cursors = SessionCursors(engine, codec)
    sessions = SessionViews(engine, codec, engine.store_id, cursors)
    lifecycle = LifecycleFeed(engine, codec, sessions.metadata)
    pages = EventPages(engine, cursors)
    deliveries = Deliveries(engine.waiter)
    threads = ReadThreads() if engine.reads_block else None
    followers = Followers(engine, pages, lifecycle, deliveries, threads)

    def close() -> None:
        deliveries.close()  # (joins the delivery thread before the engine closes)
        pages.close()
        engine.close()  # (cancels the reads in flight: section 16.4)
        if threads is not None:
            threads.close()

    return JournalParts(
        codec, cursors, sessions, lifecycle, pages, deliveries, threads, followers, close
    )
