"""A journal's pages of a session's events: one page after an ordinal, with the page
rule's results (a session evicted while read, a position compacted away), and the pager
that the event streams, `awatch` and subscriptions step (`follow.EventPager`)."""

from __future__ import annotations

from functools import partial

from .engine import Engine, PageReaders
from .errors import SessionNotFound
from .follow import EventPager
from .models import Event, ReadContext
from .owner_watch import OwnerWatch
from .session_cursors import EventMark, SessionCursors, Start, event_mark
from .sessions import SessionRow
from .turns import check_unsettled

__all__ = ["EventPages"]


class EventPages:
    """The event pages of a journal's engine, their cursors signed by `cursors`; its live
    followers' owner checks (`OwnerWatch`) end with `close()`."""

    __slots__ = ("_cursors", "_engine", "_owners")

    def __init__(self, engine: Engine, cursors: SessionCursors) -> None:
        self._engine = engine
        self._cursors = cursors
        self._owners = OwnerWatch(engine.owners_alive, engine.waiter.recheck)

    def close(self) -> None:
        self._owners.close()

    def page(
        self,
        row: SessionRow,
        context: ReadContext,
        readers: PageReaders,
        after: int,
        max_bytes: int,
    ) -> tuple[list[Event], bool, bool, int, SessionRow]:
        """(events, has_more, terminal, committed next position, row) after `after`."""
        page = self._engine.read(
            row.session_id, row.incarnation, after, max_bytes, context, readers
        )
        current = page.row
        if current is None or current.incarnation != row.incarnation:
            raise SessionNotFound(
                f"session {row.session_id!r} was evicted while being read; its "
                "remaining history is gone"
            )
        if after < current.first_ordinal - 1:
            raise self._cursors.expired(current, after)
        if after > current.last_ordinal:  # (delivered, then cut off: SPEC 9)
            raise self._cursors.future(current, after, "this follower delivered up to")
        return page.events, page.has_more, current.session_state.terminal, page.head, current

    def pager(
        self,
        row: SessionRow,
        start: Start,
        readers: PageReaders,
        live: bool,
        page_bytes: tuple[int, int],
        cursor: str | None,
    ) -> EventPager:
        """The session's pages after `start` (`live`: then its new events as they come),
        `page_bytes` the first's bound, then the others'; `cursor` is the one followed
        from (the unsettled-turn check of a live follower)."""
        context = self._cursors.context(row)
        engine = self._engine
        if engine.readonly and engine.reads_uncut:
            anchor = _Anchor(start.withdrawals, start.mark)
            page = partial(self._followed, row, context, readers, anchor)
        else:  # (its reads serve committed frames only: nothing to check again)
            page = partial(self.page, row, context, readers)
        unsettled = partial(check_unsettled, self._engine, cursor)
        return EventPager(page, start.after, live, (unsettled, self._owners.watch), page_bytes)

    def _followed(
        self,
        row: SessionRow,
        context: ReadContext,
        readers: PageReaders,
        anchor: _Anchor,
        after: int,
        max_bytes: int,
    ) -> tuple[list[Event], bool, bool, int, SessionRow]:
        """A pager's page after `after`. When the engine found frames this journal read
        cut off the log since the pager's previous page read began (or since its start
        event was read), the event it went on after (`anchor`: the last it read, else the
        one its cursor named) is read again: another event at its ordinal means it was
        cut off, and another event committed there (SPEC 14.4). Until 2026-12-06 the
        follower went on after that ordinal, the event now there never delivered, and the
        one it had delivered never committed; until 2026-12-07 it compared the timestamp
        only (an event committed there in the same millisecond passed), and a follower
        that had delivered nothing yet went on after its cursor's event unchecked."""
        # The count before the page is the one its events are checked against at the
        # next page: a rebuild after this page's read and before the count after it was
        # missed (its events came from the view before the rebuild; a review).
        before = self._engine.withdrawals()
        found = self.page(row, context, readers, after, max_bytes)
        count = self._engine.withdrawals()  # (after the page: its read may have counted one)
        if count != anchor.withdrawals:
            anchor.withdrawals = before
            mark = anchor.mark
            if mark is not None:
                cursors = self._cursors
                now = cursors.event_at(row.session_id, row.incarnation, mark.ordinal, readers)
                if now is not None and event_mark(now) != mark:
                    raise cursors.foreign(found[4], mark.ordinal)
        events = found[0]
        if events:
            anchor.mark = event_mark(events[-1])  # (one CRC-32 a page, of its last event)
        return found


class _Anchor:
    """What a pager checks again once frames this journal read are found cut off: the
    engine's count of such finds its last page was checked against, and the mark of
    the event it went on after."""

    __slots__ = ("mark", "withdrawals")

    def __init__(self, withdrawals: int, mark: EventMark | None) -> None:
        self.withdrawals = withdrawals
        self.mark = mark
