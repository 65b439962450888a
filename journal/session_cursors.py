"""Session cursors: signing them (for events, appends, snapshots and expiries) and
deciding where a read resumes from one: `CursorFuture` past the session's end,
`CursorExpired` below what it retains, and `CursorForeign` when the event a cursor was
issued for is no longer the one at its ordinal (a store restored from an older copy and
written since: SPEC 5; or, when the engine found frames this journal read cut off the log
since, that cut: SPEC 14.4).

A cursor signed for an event carries its mark (`cursor_mark`: a CRC-32 of the event's
timestamp, position, type, request id and data; token version 3); resuming from it reads
that event once and compares. Cursors of earlier releases carry the low 32 bits of the
event's timestamp instead (version 2, `event_check`), compared the same way. Cursors
signed where no event is at hand (a snapshot's, an expiry's resume cursor, a
deduplicated append's whose events were trimmed between its commit and the read of
their time) and cursors of releases before checks carry none and are not checked (a
read-only local journal reads their event once all the same). The `EventMark` of the
event read (what tells it apart from an event committed at its ordinal since) is in the
`Start` a follower of a read-only local journal checks again after a cut under its reads
(SPEC 14.4).
"""

from __future__ import annotations

import struct
import zlib
from contextlib import nullcontext
from functools import partial
from typing import Final, NamedTuple

from cursors import TokenCodec, TokenKind, scope_digest

from .checksums import fast_crc32
from .engine import Append, Appended, AppendTurnEvent, Engine, PageReaders
from .errors import CursorExpired, CursorForeign, CursorFuture
from .models import AppendResult, Event, ReadContext
from .sessions import SessionRow

__all__ = ["EventMark", "SessionCursors", "Start", "cursor_mark", "event_check", "event_mark"]

_CHECK_MASK: Final = 0xFFFFFFFF
# What `cursor_mark` takes before the variable fields: timestamp, position, and the
# lengths of the type, the data and the request id (-1: none).
_MARK_HEAD: Final = struct.Struct(">qQIIi")
# The data's part of a mark (zlib's polynomial; ISA-L's where installed: a 4 MiB event's
# mark took about 2.2 ms with zlib's against 0.9 ms).
_data_crc32: Final = fast_crc32()
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

# The same, said by a journal that found no such cut itself (a cursor taken to another
# process, or used after a reopen).
_CUT_ELSEWHERE: Final = (
    "cut off the log after a read-only journal read {them}: a write whose commit failed "
    "after its frame was written, WRITE_OUTCOME_UNKNOWN, taken off again by its writer's "
    "next commit"
)


def event_check(time_ms: int) -> int:
    """The check a cursor of an earlier release (token version 2) carries for an event
    stamped `time_ms` (lifecycle cursors still carry it for their feed entry's time)."""
    return time_ms & _CHECK_MASK


def cursor_mark(time_ms: int, position: int, type: str, request_id: str | None, data: bytes) -> int:
    """The mark a session cursor carries for the event so stamped, placed and made: a
    CRC-32 of all of it, so an event that replaced it at its ordinal since (stamped in the
    same millisecond, even at the same position) is told apart unless it is the same."""
    kind = type.encode()
    request = b"" if request_id is None else request_id.encode()
    crc = zlib.crc32(
        _MARK_HEAD.pack(
            time_ms, position, len(kind), len(data), -1 if request_id is None else len(request)
        )
    )
    return _data_crc32(data, zlib.crc32(request, zlib.crc32(kind, crc)))


class EventMark(NamedTuple):
    """What tells an event read apart from another event at its ordinal since: its
    ordinal and its cursor's mark (`cursor_mark`), as a cursor tells it."""

    ordinal: int
    mark: int


def event_mark(event: Event) -> EventMark:
    """`event`'s mark (a follower takes it of each page's last event only)."""
    mark = cursor_mark(event.timestamp_ms, event.position, event.type, event.request_id, event.data)
    return EventMark(event.ordinal, mark)


class Start(NamedTuple):
    """Where a read resumes: after ordinal `after`; `withdrawals`, the engine's count of
    cuts under this journal's reads (`Engine.withdrawals`) before the event at `after`
    was read, and `mark`, that event as read (None: not retained, or the read starts
    with the session), which a follower checks again once the count changed."""

    after: int
    withdrawals: int
    mark: EventMark | None


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
        mark: int | None = None,
    ) -> str:
        """The cursor that resumes after `ordinal` (stored at `position`), checked when
        the event's `mark` (`cursor_mark`) is given."""
        scope = self.scope(session_id, incarnation)
        return self._codec.encode(
            TokenKind.SESSION, scope, position, ordinal, mark, marked=mark is not None
        )

    def event_cursor(self, session_id: str, incarnation: int, event: Event) -> str:
        """The checked cursor of `event`, read from the session's `incarnation`."""
        position = event.position
        mark = cursor_mark(event.timestamp_ms, position, event.type, event.request_id, event.data)
        return self.cursor(session_id, incarnation, position, event.ordinal, mark)

    def context(self, row: SessionRow) -> ReadContext:
        """What the events read from the session share (their cursors are checked)."""
        return self._context(row.session_id, row.incarnation)

    def _context(self, session_id: str, incarnation: int) -> ReadContext:
        return ReadContext(session_id, partial(self.event_cursor, session_id, incarnation))

    def append_result(
        self, session_id: str, appended: Appended, written: Append | AppendTurnEvent
    ) -> AppendResult:
        """What an append returns: its ordinals and the cursor after its last event (the
        last of what `written` appended, as checked)."""
        incarnation, position = appended.incarnation, appended.last_position
        time_ms = appended.time_ms
        if time_ms is None:
            # Deduplicated: the original append's cursor, checked by its last event (an
            # idempotency key is remembered only while its events are retained).
            found = self.event_at(session_id, incarnation, appended.last_ordinal)
            if found is None:
                cursor = self.cursor(session_id, incarnation, position, appended.last_ordinal)
            else:
                cursor = self.event_cursor(session_id, incarnation, found)
        else:
            if isinstance(written, Append):
                last = written.events[-1]
                kind, request_id, data = last.type, last.request_id, last.data
            else:
                kind, request_id, data = written.type, written.request_id, written.data
            mark = cursor_mark(time_ms, position, kind, request_id, data)
            cursor = self.cursor(session_id, incarnation, position, appended.last_ordinal, mark)
        return AppendResult(
            session_id,
            appended.first_ordinal,
            appended.last_ordinal,
            cursor,
            deduplicated=appended.deduplicated,
        )

    def event_at(
        self,
        session_id: str,
        incarnation: int,
        ordinal: int,
        readers: PageReaders | None = None,
    ) -> Event | None:
        """The session's event at `ordinal` (None if it is not retained): one read of
        that event (through `readers` when given)."""
        engine = self._engine
        context = self._context(session_id, incarnation)
        with engine.readers() if readers is None else nullcontext(readers) as used:
            page = engine.read(session_id, incarnation, ordinal - 1, 1, context, used)
        found = page.events[0] if page.events else None
        return found if found is not None and found.ordinal == ordinal else None

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
        cut = self._or_cut(" Or were its events after that", "them")
        return CursorFuture(
            f"{what} ordinal {after} but session {row.session_id!r} ends at "
            f"{row.last_ordinal} (was the store restored from an older copy, or a hole in "
            f"its log accepted by `verify --fix`?{cut and cut + '?'}): resume from a cursor "
            "this store issued, or from the start",
            head_ordinal=row.last_ordinal,
        )

    def start(
        self, row: SessionRow, cursor: str | None, readers: PageReaders | None = None
    ) -> Start:
        """Where a read resumes; cursor errors are raised here. The event a cursor names
        is read once (its check compared, when it carries one; one without a check only
        where a follower may check the mark again): the `Start`'s mark."""
        engine = self._engine
        marks = engine.readonly and engine.reads_uncut  # (only their followers check one)
        withdrawals = engine.withdrawals()  # (before the read: `Start`)
        if cursor is None:
            return Start(row.first_ordinal - 1, withdrawals, None)
        claims = self._codec.decode(
            cursor, TokenKind.SESSION, self.scope(row.session_id, row.incarnation)
        )
        after = claims.ordinal
        if after > row.last_ordinal:
            raise self.future(row, after, "the cursor points at")
        if after < row.first_ordinal - 1:
            raise self.expired(row, after)
        if after < row.first_ordinal or (claims.check is None and not marks):
            return Start(after, withdrawals, None)  # (no mark: nothing checks one)
        found = self.event_at(row.session_id, row.incarnation, after, readers)
        if found is None:
            return Start(after, withdrawals, None)  # trimmed meanwhile: the read says so
        mark = event_mark(found) if claims.marked or marks else None
        check = claims.check
        if check is not None and check != (
            mark.mark if mark is not None and claims.marked else event_check(found.timestamp_ms)
        ):
            raise self.foreign(row, after)  # (not the event the cursor was issued for)
        return Start(after, withdrawals, mark if marks else None)

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
            f"from an older copy and written since{self._or_cut(', or the event was', 'it')}"
            "): resume from a cursor this store issued, or from the start"
        )

    def _or_cut(self, lead: str, them: str) -> str:
        """Where a cursor's events may have been cut off after a read-only journal read
        them (`Engine.reads_uncut`), the other cause a journal that found no such cut
        itself names: nothing durable records a cut (the log is left as it was before
        the frame), so it cannot tell one from a restored store (SPEC 14.4)."""
        if not self._engine.reads_uncut:
            return ""
        return f"{lead} {_CUT_ELSEWHERE.format(them=them)}"
