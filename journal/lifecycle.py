"""The lifecycle feed's cursor decisions: where a lifecycle follow resumes (its cursor
checked against the store's head), the startup snapshot (one CREATED per session, from
one consistent snapshot), and lifecycle events built from the engine's feed entries.

The facade owns one `LifecycleFeed` and drives its pagers with the follow loop.
"""

from __future__ import annotations

import bisect
import time
import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from cursors import Claims, TokenCodec, TokenKind, scope_digest

from .engine import Engine
from .errors import CursorExpired, CursorForeign, CursorFuture, JournalCorrupt
from .follow import LifecyclePager
from .models import LifecycleEvent, LifecycleEventType, SessionMetadata
from .session_cursors import event_check
from .sessions import FeedEntry, SessionRow

__all__ = ["SNAPSHOT_PAGE", "SNAPSHOT_REUSE", "LifecycleFeed"]


# The ordinal of a lifecycle cursor says what it resumes (SPEC 5, 7.7): 0 after a feed
# position; 1 a fresh snapshot (a startup snapshot's event before its last, as issued
# until 2026-12-04: such a cursor still works); from 2 on, such an event now, carrying
# `_MID_SNAPSHOT + ` the incarnation of the last session delivered (and, as its check,
# `_id_check` of that session's id), so that a restart inside a snapshot goes on after
# the sessions already delivered instead of starting over.
_FRESH_SNAPSHOT = 1
_MID_SNAPSHOT = 2

# Feed entries read at once while a resumed snapshot delivers the changes since.
_FEED_BATCH = 256

# A startup snapshot's events are built and delivered this many at a time.
SNAPSHOT_PAGE: Final = 64

# A new lifecycle follow takes the snapshot another one still delivers when at most this
# many feed entries came after it (it then delivers those entries too), instead of
# copying every row again.
SNAPSHOT_REUSE: Final = 64


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _id_check(session_id: str) -> int:
    """The check of a mid-snapshot cursor: it tells the session it names from another
    one created at the same position in another history (a restored copy)."""
    return zlib.crc32(session_id.encode())


class _Registry:
    """Every row and the lifecycle position they stand at (`Engine.registry`); `damaged`
    once building a page of it raised `JournalCorrupt` (it is not shared again); `anchor`
    once known, what its events before the last are anchored at (`_anchor`)."""

    __slots__ = ("__weakref__", "anchor", "damaged", "point", "rows")

    def __init__(self, point: int, rows: Sequence[SessionRow]) -> None:
        self.point = point
        self.rows = rows
        self.damaged = False
        self.anchor: tuple[int, int] | None = None


class LifecycleFeed:
    """Lifecycle pagers over one engine; `metadata` turns a row into public metadata."""

    def __init__(
        self,
        engine: Engine,
        codec: TokenCodec,
        metadata: Callable[[SessionRow], SessionMetadata],
    ) -> None:
        self._engine = engine
        self._codec = codec
        self._metadata = metadata
        self._scope = scope_digest(engine.store_id, purpose="lifecycle")
        # The registry snapshot the newest startup snapshot took, while a follow still
        # delivers it.
        self._shared: Callable[[], _Registry | None] = lambda: None

    def forget_shared(self) -> None:
        """No follow starting from now takes the copy the follows in progress share (the
        view was rebuilt: the copy may hold damaged rows the rebuild repaired)."""
        self._shared = lambda: None

    def pager(self, cursor: str | None) -> LifecyclePager:
        """Where to resume the lifecycle feed; cursor errors are raised here."""
        if cursor is None:
            return LifecyclePager(self._feed_after, 0, self._startup_snapshot)
        claims = self._codec.decode(cursor, TokenKind.LIFECYCLE, self._scope)
        if claims.ordinal >= _MID_SNAPSHOT:
            # A startup snapshot's event before its last: the sessions after it in that
            # snapshot were never delivered, and the feed after its position will not
            # announce them. A snapshot resumed after the last one delivered does.
            last_id = self._delivered_by(claims)
            return LifecyclePager(
                self._feed_after, 0, lambda: self._resumed_snapshot(claims, last_id)
            )
        if claims.ordinal == _FRESH_SNAPSHOT:
            # (The same, from a release before 2026-12-04: the earlier ones come again.)
            return LifecyclePager(self._feed_after, 0, self._startup_snapshot)
        position = claims.position
        # A checked cursor names a feed entry: read it (from the same snapshot).
        checked = claims.check is not None and position > 0
        entries, _, floor = self._feed_reaching(
            position,
            "the lifecycle cursor points at",
            position - 1 if checked else position,
            int(checked),
        )
        self._check_retained(position, floor)
        if checked and position > floor:  # (at the floor, its entry may be pruned)
            found = entries[0] if entries else None
            if found is None or found[0] != position or event_check(found[1].at_ms) != claims.check:
                raise CursorForeign(
                    f"the lifecycle cursor was issued for another change at position "
                    f"{position} than the one this store holds (the store was restored from "
                    "an older copy and written since): watch again without a cursor"
                )
        return LifecyclePager(self._feed_after, position, None)

    def _feed_reaching(
        self, position: int, what: str, after: int, limit: int, newest_first: bool = False
    ) -> tuple[list[tuple[int, FeedEntry]], int, int]:
        """`engine.feed(after, limit, newest_first)`, whose head must be past `position`
        (`_check_head`, `what` it is): read again once the engine's reads hold every
        commit when it is not (a copy behind the store, a cut-off stream leader's, ends
        before a cursor another process was given, SPEC 16.4)."""
        found = self._engine.feed(after, limit, newest_first)
        if position > found[1] - 1:
            self._engine.confirm_current()
            found = self._engine.feed(after, limit, newest_first)
        self._check_head(position, found[1], what)
        return found

    @staticmethod
    def _check_head(after: int, head: int, what: str) -> None:
        """Past the store's end: a foreign cursor, or the end was cut (an older copy of
        the store, or a hole `verify(fix=True)` accepted, SPEC 9)."""
        if after > head - 1:
            raise CursorFuture(
                f"{what} position {after} but this store ends at {head - 1} (was it "
                "restored from an older copy, or a hole in its log accepted by `verify "
                "--fix`?): watch from a cursor this store issued, or without one",
                head_ordinal=head - 1,
            )

    def _check_retained(self, after: int, floor: int) -> None:
        """A follower after `after` would miss pruned entries when it is below the floor."""
        if after < floor:
            raise CursorExpired(
                f"the lifecycle changes after position {after} are no longer all kept "
                f"(retention or compaction removed those up to position {floor}): watch "
                "again without a cursor (a fresh snapshot of every session), or resume "
                "from `resume_cursor` to accept the gap",
                earliest_ordinal=floor + 1,
                resume_cursor=self._cursor(floor),
            )

    def _mid_cursor(self, anchor: tuple[int, int], incarnation: int, id_check: int) -> str:
        """The cursor of a snapshot's event before its last: the watcher has every
        session up to the one of `incarnation` (its id's `_id_check` is `id_check`) as
        the feed up to the anchor's position left it, and none after it
        (`_resumed_snapshot`). Its check also carries the anchor's (`_anchor`), so that
        a store restored from an older copy and written since is told apart even when
        that session is in the copy (until 2026-12-04 it carried the id's alone, and such
        a restart resumed in the copy's history: sessions the copy never had stayed
        with the watcher for ever; found in review)."""
        position, anchor_check = anchor
        ordinal = _MID_SNAPSHOT + incarnation
        check = id_check ^ anchor_check
        return self._codec.encode(TokenKind.LIFECYCLE, self._scope, position, ordinal, check)

    def _anchor(self, registry: _Registry) -> tuple[int, int]:
        """Where a snapshot's events before its last resume from, and the check of that
        history: the newest feed entry at or below the registry's point (none lies
        between them) and its time's `event_check`; when no kept entry is known there,
        the point itself and 0 (such a cursor is told from another history only by the
        absence of an entry at its position)."""
        if registry.anchor is None:
            entries, _, floor = self._engine.feed(registry.point, 1, newest_first=True)
            if entries and entries[0][0] > floor:
                registry.anchor = entries[0][0], event_check(entries[0][1].at_ms)
            else:
                registry.anchor = registry.point, 0
        return registry.anchor

    def _cursor(self, position: int, at_ms: int | None = None) -> str:
        """The cursor that resumes after `position`, checked when it is a feed entry's
        (stamped `at_ms`); else it names a position, not an entry (`_snapshot_cursor`)."""
        check = None if at_ms is None else event_check(at_ms)
        return self._codec.encode(TokenKind.LIFECYCLE, self._scope, position, 0, check)

    def _startup_snapshot(self) -> tuple[Iterator[list[LifecycleEvent]], int]:
        """One CREATED per session, all from one consistent snapshot, in pages of
        `SNAPSHOT_PAGE`; and the snapshot's position.

        The rows are copied out of the engine before anything is delivered, so a slow or
        abandoned consumer pins nothing in the engine. The copy is shared by the follows
        that start while one still delivers it (`SNAPSHOT_REUSE`), and each builds its
        events a page at a time: 1,000 follows starting together over 1,001 sessions
        held 1.1 KB per session each until 2026-12-03 (430 MB)."""
        registry = self._registry()
        return self._snapshot_pages(registry), registry.point

    def _delivered_by(self, claims: Claims) -> str | None:
        """The id of the last session a mid-snapshot cursor (`_mid_cursor`) delivered,
        checked as a feed cursor is: past the store's end is `CursorFuture`; the feed
        after its position no longer all kept is `CursorExpired` (the changes since of
        the sessions delivered cannot be given: watch again without a cursor); a check
        that does not give a session of its incarnation here (a store restored from an
        older copy and written since) is `CursorForeign`. Until 2026-12-04, the day such
        cursors came, each of these gave a fresh snapshot instead, in which a watcher
        folding the events never heard that sessions it held were evicted meanwhile
        (found in review). At the floor itself the anchor's entry may be pruned: the
        id's check is not made. None for a cursor without a check (a fresh snapshot)."""
        position, check = claims.position, claims.check
        at, head, floor = self._feed_reaching(
            position, "the lifecycle cursor points at", position, 1, newest_first=True
        )
        self._check_snapshot_retained(position, floor)
        if check is None:
            return None
        if at and at[0][0] == position:
            # (The anchor's check comes off: what is left is the id's, `_mid_cursor`.)
            check ^= event_check(at[0][1].at_ms)
        elif position == floor:
            check = None
        found = self._delivered_last(claims.ordinal - _MID_SNAPSHOT, check, position, head - 1)
        if found is None:
            raise CursorForeign(
                "the lifecycle cursor resumes a startup snapshot this store's history did "
                "not deliver (the store was restored from an older copy and written "
                "since): watch again without a cursor (a fresh snapshot of every session)"
            )
        return found

    @staticmethod
    def _check_snapshot_retained(after: int, floor: int) -> None:
        """A resumed startup snapshot (`_resumed_snapshot`) whose changes since after
        `after` are no longer all kept cannot go on: no `resume_cursor`, since a feed
        cursor after the floor would skip the snapshot's sessions not delivered yet
        (until 2026-12-05 a pruning while the changes were being given raised the feed's
        `CursorExpired`, whose `resume_cursor` did that)."""
        if after < floor:
            raise CursorExpired(
                f"a startup snapshot resumed from a lifecycle cursor is at position {after}, "
                f"and the changes after it are no longer all kept (retention or compaction "
                f"removed those up to position {floor}): the sessions it delivered may have "
                "changed unseen; watch again without a cursor (a fresh snapshot of every "
                "session) and start over from it",
                earliest_ordinal=floor + 1,
            )

    def _resumed_snapshot(
        self, claims: Claims, last_id: str | None
    ) -> tuple[Iterator[list[LifecycleEvent]], int]:
        """A startup snapshot resumed from the cursor of one of its events but the last
        (`_mid_cursor`: position P, the last session delivered, X, whose id `last_id` is
        `_delivered_by`'s): the watcher has the sessions up to X as the feed up to P left
        them, and none after X. From a registry snapshot at Q >= P it is given the feed
        entries in (P, Q] of sessions up to X (their changes since, those created since
        included, each with a cursor that resumes the same way from its position), then
        the rows at Q after X, then the feed after Q."""
        position, incarnation = claims.position, claims.ordinal - _MID_SNAPSHOT
        registry = self._registry(position)
        point = registry.point
        if last_id is None or point < position:
            return self._snapshot_pages(registry), point
        pages = self._resumed_pages(registry, position, last_id, incarnation, _id_check(last_id))
        return pages, point

    def _delivered_last(
        self, incarnation: int, check: int | None, after_position: int, point: int
    ) -> str | None:
        """The id of the session of `incarnation` whose `_id_check` is `check` (None:
        any): the
        engine knows it while the session's creation record is kept (as for page
        tokens); else a kept feed entry of it up to `point` names it (its EVICTED one,
        all of them at or after its creation, `incarnation`: until 2026-12-04 only those
        after the cursor's position were read, so a restart after that session's
        eviction, once its creation record left the log, fell back to a fresh snapshot).
        None if neither does. Each read of the feed checks its floor against the
        cursor's position, `after_position`: a pruning since the caller's check may have
        taken the session's entries after it, and its id with them (until 2026-12-05
        this was `CursorForeign`, where `CursorExpired` is what happened)."""
        found = self._engine.session_id_of(incarnation)
        if found is not None and check in (None, _id_check(found)):
            return found
        after = max(incarnation - 1, 0)
        while after < point:
            entries, _, floor = self._engine.feed(after, _FEED_BATCH)
            self._check_snapshot_retained(after_position, floor)
            for position, entry in entries:
                row = entry.row
                if position > point:
                    return None
                if row.incarnation == incarnation and check in (None, _id_check(row.session_id)):
                    return row.session_id
            if not entries:
                return None
            after = entries[-1][0]
        return None

    def _resumed_pages(
        self, registry: _Registry, after: int, last_id: str, incarnation: int, id_check: int
    ) -> Iterator[list[LifecycleEvent]]:
        """`_resumed_snapshot`'s events: the changes up to the registry's point of the
        sessions up to `last_id`, then its rows after `last_id`."""
        point = registry.point
        newest = 0  # (the newest feed entry at or below the point, once one is read)
        while after < point:
            entries, _, floor = self._engine.feed(after, _FEED_BATCH)
            self._check_snapshot_retained(after, floor)
            entries = [(position, entry) for position, entry in entries if position <= point]
            if not entries:
                break
            after = newest = entries[-1][0]
            events = []
            for position, entry in entries:
                if entry.row.session_id <= last_id:
                    # (Anchored at its own entry: a restart there resumes from it.)
                    anchor = position, event_check(entry.at_ms)
                    cursor = self._mid_cursor(anchor, incarnation, id_check)
                    events.append(self._event(entry, position, cursor))
            if events:
                yield events
        try:
            first = bisect.bisect_right(registry.rows, last_id, key=_session_id)
        except JournalCorrupt:
            registry.damaged = True  # (as in `_snapshot_pages`)
            raise
        yield from self._snapshot_pages(registry, first, newest)

    def _registry(self, at_least: int = 0) -> _Registry:
        """The shared registry snapshot if a follow still holds it, it is at `at_least`
        or later, the feed after it is retained and short, and the store still reaches
        its point (a hole accepted by `verify(fix=True)` in another process cut it, SPEC
        9); else a new one."""
        shared = self._shared()
        if shared is not None and not shared.damaged and shared.point >= at_least:
            entries, head, floor = self._engine.feed(shared.point, SNAPSHOT_REUSE + 1)
            if floor <= shared.point < head and len(entries) <= SNAPSHOT_REUSE:
                return shared
        registry = _Registry(*self._engine.registry())
        self._shared = weakref.ref(registry)
        return registry

    def _snapshot_pages(
        self, registry: _Registry, first: int = 0, newest: int = 0
    ) -> Iterator[list[LifecycleEvent]]:
        """CREATED events of the rows from index `first` on; `newest`: a lifecycle change
        at or below the point (0: none known), where `_snapshot_cursor` looks from."""
        point, rows = registry.point, registry.rows
        anchor = self._anchor(registry)
        now = _now_ms()
        for start in range(first, len(rows), SNAPSHOT_PAGE):
            try:
                page = rows[start : start + SNAPSHOT_PAGE]
            except JournalCorrupt:
                # A damaged row (decoded here, on the local engine): the follows sharing
                # this copy meet it too, but no follow takes it again; one started (or
                # resumed) after `verify(fix=True)` repaired the view copies the rows anew.
                registry.damaged = True
                raise
            newest = max(newest, *(row.lifecycle_position for row in page))
            # Every event but the last resumes after the sessions delivered up to it:
            # resuming after `point` would skip the sessions after it in this snapshot
            # (they were created before it), and a fresh snapshot would give the earlier
            # ones again, so a watcher restarted every N events never got past the first N
            # (until 2026-12-04: supervisor-author trial).
            cursors = [
                self._mid_cursor(anchor, row.incarnation, _id_check(row.session_id)) for row in page
            ]
            if start + len(page) == len(rows):
                cursors[-1] = self._snapshot_cursor(point, newest)
            yield [
                LifecycleEvent(
                    LifecycleEventType.CREATED, self._metadata(row), cursor, now, in_snapshot=True
                )
                for row, cursor in zip(page, cursors, strict=True)
            ]

    def _snapshot_cursor(self, point: int, newest: int) -> str:
        """The cursor of a snapshot's last event: resumes after `point`. It is the checked
        cursor of the newest feed entry at or below `point` (none lies between them), so a
        store restored from an older copy and written since refuses it as foreign, as it
        does any feed entry's cursor; unchecked when that entry cannot be read (pruned, or
        more than a page of entries past the newest listed session's change, such as
        evictions). Until 2026-12-03 it was always unchecked: after such a restore, a
        supervisor resuming from it was given the changes after `point` in the other
        history, without the ones before it (operator trial)."""
        limit = SNAPSHOT_REUSE + 1
        entries, _, floor = self._engine.feed(max(newest - 1, 0), limit)
        found = [(position, entry) for position, entry in entries if position <= point]
        complete = len(found) < len(entries) or len(entries) < limit
        if complete and found and found[-1][0] > floor:
            position, entry = found[-1]
            return self._cursor(position, entry.at_ms)
        return self._cursor(point)

    def _feed_after(self, after: int) -> tuple[list[LifecycleEvent], int, int]:
        """Feed entries after `after` (a bounded batch), the new `after`, the head."""
        entries, head, floor = self._feed_reaching(
            after, "this follower delivered up to", after, 256
        )
        self._check_retained(after, floor)
        events = [self._event(entry, position) for position, entry in entries]
        return events, entries[-1][0] if entries else after, head

    def _event(self, entry: FeedEntry, position: int, cursor: str | None = None) -> LifecycleEvent:
        """The event of a feed entry; `cursor`: its own (else the entry's checked one)."""
        return LifecycleEvent(
            event_type=LifecycleEventType(entry.event_type),
            session=self._metadata(entry.row),
            cursor=self._cursor(position, entry.at_ms) if cursor is None else cursor,
            observed_at_ms=entry.at_ms,
        )


def _session_id(row: SessionRow) -> str:
    return row.session_id
