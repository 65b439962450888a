"""Session cursors: signing them (for events, appends, snapshots and expiries) and
deciding where a read resumes from one: `CursorFuture` past the session's end,
`CursorExpired` below what it retains, and `CursorForeign` when the event a cursor was
issued for is no longer the one at its ordinal (a store restored from an older copy and
written since: SPEC 5; or, when the engine found frames this journal read cut off the log
since, that cut: SPEC 14.4).

A cursor signed for an event carries a check, the low 32 bits of the event's timestamp;
resuming from it reads that event once and compares. Cursors signed where no event's
timestamp is at hand (a snapshot's, an expiry's resume cursor, a deduplicated append's
whose events were trimmed between its commit and the read of their time) and cursors of
earlier releases carry none and are not checked.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial
from typing import Final

from cursors import TokenCodec, TokenKind, scope_digest

from .engine import Appended, Engine, PageReaders
from .errors import CursorExpired, CursorForeign, CursorFuture
from .models import AppendResult, ReadContext
from .sessions import SessionRow

__all__ = ["SessionCursors", "event_check"]

_CHECK_MASK: Final = 0xFFFFFFFF
# How many (session, incarnation) scopes are remembered (one SHA-256 each otherwise):
# about 230 bytes each, kept past the session's eviction until the cache starts over, so
# the bound is what a long-lived process keeps of sessions long gone (65,536 until
# 2026-12-05: 15 MB). A miss costs one SHA-256 of a few dozen bytes.
_SCOPES: Final = 4096

# Why events a read-only journal read are gone since (`Engine.withdrawals`): the cut of a
# refused frame its private view had projected (SPEC 14.4), or a hole `verify --fix`
# accepted under it (SPEC 9).
_CUT: Final = (
    "cut off the log after this read-only journal read {them} (a write whose commit failed "
    "after its frame was written, WRITE_OUTCOME_UNKNOWN, taken off again by its writer's "
    "next commit; or a hole accepted by `verify --fix`)"
)


def event_check(time_ms: int) -> int:
    """The check a cursor carries for an event stamped `time_ms`."""
    return time_ms & _CHECK_MASK


class SessionCursors:
    """Signs and checks one journal's session cursors."""

    def __init__(self, engine: Engine, codec: TokenCodec) -> None:
        self._engine = engine
        self._codec = codec
        self._scopes: dict[tuple[str, int], bytes] = {}

    def scope(self, session_id: str, incarnation: int) -> bytes:
        key = (session_id, incarnation)
        scope = self._scopes.get(key)
        if scope is None:
            # A deliberate, bounded cache: one SHA-256 per session, not per append.
            if len(self._scopes) >= _SCOPES:
                self._scopes.clear()
            scope = scope_digest(self._engine.store_id, session_id, incarnation)
            self._scopes[key] = scope
        return scope

    def cursor(
        self,
        session_id: str,
        incarnation: int,
        position: int,
        ordinal: int,
        time_ms: int | None = None,
    ) -> str:
        """The cursor that resumes after `ordinal` (stored at `position`), checked when
        the event's `time_ms` is given."""
        check = None if time_ms is None else event_check(time_ms)
        scope = self.scope(session_id, incarnation)
        return self._codec.encode(TokenKind.SESSION, scope, position, ordinal, check)

    def context(self, row: SessionRow) -> ReadContext:
        """What the events read from the session share (their cursors are checked)."""
        return self._context(row.session_id, row.incarnation)

    def _context(self, session_id: str, incarnation: int) -> ReadContext:
        # (Each event's cursor: `cursor` with the event's position, ordinal and time.)
        return ReadContext(session_id, partial(self.cursor, session_id, incarnation))

    def append_result(self, session_id: str, appended: Appended) -> AppendResult:
        """What an append returns: its ordinals and the cursor after its last event."""
        time_ms = appended.time_ms
        if time_ms is None:
            # Deduplicated: the original append's cursor, checked by its last event's time
            # (an idempotency key is remembered only while its events are retained).
            time_ms = self.event_time(session_id, appended.incarnation, appended.last_ordinal)
        cursor = self.cursor(
            session_id, appended.incarnation, appended.last_position, appended.last_ordinal, time_ms
        )
        return AppendResult(
            session_id,
            appended.first_ordinal,
            appended.last_ordinal,
            cursor,
            deduplicated=appended.deduplicated,
        )

    def event_time(
        self,
        session_id: str,
        incarnation: int,
        ordinal: int,
        readers: PageReaders | None = None,
    ) -> int | None:
        """The timestamp of the session's event at `ordinal` (None if it is not retained):
        one read of that event (through `readers` when given)."""
        engine = self._engine
        context = self._context(session_id, incarnation)
        with engine.readers() if readers is None else nullcontext(readers) as used:
            page = engine.read(session_id, incarnation, ordinal - 1, 1, context, used)
        found = page.events[0] if page.events else None
        return found.timestamp_ms if found is not None and found.ordinal == ordinal else None

    def expired(self, row: SessionRow, after: int) -> CursorExpired:
        resume = self.cursor(row.session_id, row.incarnation, 0, row.first_ordinal - 1)
        return CursorExpired(
            f"events {after + 1}..{row.first_ordinal - 1} of session {row.session_id!r} are "
            f"no longer retained (rotated or compacted away); the earliest retained ordinal "
            f"is {row.first_ordinal}: resume from the error's resume_cursor to accept the gap, "
            "or rebuild from a snapshot",
            earliest_ordinal=row.first_ordinal,
            resume_cursor=resume,
        )

    def future(self, row: SessionRow, after: int, what: str) -> CursorFuture:
        """`what` ordinal `after` of a session that ends before it now (its end was cut:
        an older copy of the store, or a hole `verify(fix=True)` accepted, SPEC 9; or
        events this journal read were cut off since, SPEC 14.4)."""
        if self._engine.withdrawals():
            return CursorFuture(
                f"{what} ordinal {after} but session {row.session_id!r} ends at "
                f"{row.last_ordinal}: its events after that were {_CUT.format(them='them')}: "
                "drop what was read from them, and resume from the cursor of an earlier "
                "event, or from the start",
                head_ordinal=row.last_ordinal,
            )
        return CursorFuture(
            f"{what} ordinal {after} but session {row.session_id!r} ends at "
            f"{row.last_ordinal} (was the store restored from an older copy, or a hole in "
            "its log accepted by `verify --fix`?): resume from a cursor this store issued, "
            "or from the start",
            head_ordinal=row.last_ordinal,
        )

    def after_ordinal(
        self, row: SessionRow, cursor: str | None, readers: PageReaders | None = None
    ) -> int:
        """The ordinal a read resumes after; cursor errors are raised here."""
        if cursor is None:
            return row.first_ordinal - 1
        claims = self._codec.decode(
            cursor, TokenKind.SESSION, self.scope(row.session_id, row.incarnation)
        )
        after = claims.ordinal
        if after > row.last_ordinal:
            raise self.future(row, after, "the cursor points at")
        if after < row.first_ordinal - 1:
            raise self.expired(row, after)
        if claims.check is not None and after >= row.first_ordinal:
            self._check_event(row, after, claims.check, readers)
        return after

    def _check_event(
        self, row: SessionRow, ordinal: int, check: int, readers: PageReaders | None
    ) -> None:
        """The event at `ordinal` must be the one the cursor was issued for."""
        time_ms = self.event_time(row.session_id, row.incarnation, ordinal, readers)
        if time_ms is None:
            return  # trimmed meanwhile: the read that follows says so
        if event_check(time_ms) != check:
            raise self.foreign(row, ordinal)

    def foreign(self, row: SessionRow, ordinal: int) -> CursorForeign:
        """The event at `ordinal` is not the one a cursor (or a follower) had from it."""
        if self._engine.withdrawals():
            return CursorForeign(
                f"event {ordinal} of session {row.session_id!r} as this journal read it is "
                f"no longer in the session: it was {_CUT.format(them='it')}, and another "
                f"event holds ordinal {ordinal} now: drop what was read from it on, and "
                "resume from the cursor of an earlier event, or from the start"
            )
        return CursorForeign(
            f"the cursor was issued for another event {ordinal} of session "
            f"{row.session_id!r} than the one this store holds (the store was restored "
            "from an older copy and written since): resume from a cursor this store "
            "issued, or from the start"
        )
