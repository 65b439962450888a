"""Reads of the JetStream engine (coroutines on the connection's loop): rows, listings,
the lifecycle feed, event pages by the page rule, and an event's sequence by ordinal.

Direct gets may be answered by any replica of an R3 stream, and a replica may lag: every
read that must see what this engine already saw committed (`known`, the highest sequence
it learned of) checks the responder's last sequence and asks again until it is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from typing import Any, Final

import msgspec

from ..errors import JournalCorrupt, StoreUnavailable
from ..models import Event, ReadContext, bind_event
from ..sessions import FeedEntry, SessionRow
from .client import ApiError, Connection, Found, Unavailable
from .layout import (
    ENCODER,
    EVENT_DECODER,
    FEED_DECODER,
    FLOOR_DECODER,
    MARKER_DECODER,
    META_DECODER,
    PRUNED_FORMAT,
    ROW_DECODER,
    SNAPSHOT_DECODER,
    FeedFloor,
    Marker,
    Meta,
    StoredEvent,
    StoredSnapshot,
    Subjects,
    resolve,
)

__all__ = ["FRESH_S", "Lasting", "Moved", "RowState", "StoreReader", "view_lag_ms"]

# A batched direct get returns at most this many messages (and multi_last subjects).
BATCH: Final = 1000
# How long a read waits for a lagging replica before it gives up.
FRESH_S: Final = 10.0
# A stream leader that has heard from a quorum of its replicas within this long (ms) is
# taken to hold every commit (`StoreReader.in_touch`): nats-server's raft elects another
# only after its voters heard nothing from it for 4 s or more (the shortest election
# timeout; the leader's heartbeat comes every 1 s, and an idle, healthy R3 stream's
# leader had heard from a follower at most 1.3 s before, in 121 samples, and 1.8 s in
# 199 on a busy machine: above 3 s, a refusal waits and the connection moves).
CURRENT_MS: Final = 3000.0
# How long `in_touch` waits for such a leader before it says `StoreUnavailable`.
IN_TOUCH_S: Final = 30.0
# Per-message overhead allowed for in a byte-bounded direct get (subject, headers).
_OVERHEAD: Final = 512
# The data bytes one direct get of `scan_events` asks for at most.
_SCAN_BYTES: Final = 4 << 20
# A registry snapshot reads the rows of sessions changed meanwhile again at most this
# many times, each time for at most this many changes (`StoreReader.registry`).
_SETTLE_ROUNDS: Final = 4
_SETTLE_PAGE: Final = 64


class RowState:
    """A session's row as stored (None: absent or evicted) and its row subject's last
    sequence (the compare-and-set value of the next commit; 0 when the subject is empty)."""

    __slots__ = ("row", "seq", "token")

    def __init__(self, row: SessionRow | None, seq: int, token: str) -> None:
        self.row = row
        self.seq = seq
        self.token = token


# How far back each page of row subjects after the first is asked for (`tokens`).
_PAGE_OVERLAP: Final = 1000


class StoreReader:
    """The reads (see the module docstring)."""

    def __init__(
        self,
        conn: Connection,
        subjects: Subjects,
        writable: bool = True,
        point: Callable[[str, object], None] | None = None,
    ) -> None:
        self.conn = conn
        self.subjects = subjects
        # (The engine's fault points: `store.purge` before each purge.)
        self.point = point or _no_point
        self.known = 0  # the highest stream sequence known committed
        # (A writable journal writes a missing floor record back: `feed_record`.)
        self.writable = writable

    def saw(self, seq: int) -> None:
        if seq > self.known:
            self.known = seq

    async def _fresh(self, body: dict[str, Any]) -> list[Found]:
        """A multi_last direct get answered by a replica that has everything known (the
        store's meta subject is asked for too, so there is always an answer that says how
        far the responder is)."""
        body = {**body, "multi_last": [*body["multi_last"], self.subjects.meta]}
        body["batch"] = len(body["multi_last"])
        deadline = time.monotonic() + FRESH_S
        while True:
            found, end = await self.conn.direct(body)
            upto = int(end.get("Nats-UpTo-Sequence", "0") or 0)
            if upto >= self.known:
                self.saw(upto)
                return [m for m in found if m.subject != self.subjects.meta]
            if time.monotonic() > deadline:
                raise StoreUnavailable(
                    f"the stream's replicas stayed behind sequence {self.known} for "
                    f"{FRESH_S:g} s: check the cluster's health"
                )
            await asyncio.sleep(0.002)

    async def head(self) -> int:
        """The committed next position (the stream's last sequence plus one)."""
        info = await self.conn.api(f"$JS.API.STREAM.INFO.{self.conn.stream}")
        last = int(info["state"]["last_seq"])
        self.saw(last)
        return last + 1

    async def in_touch(self, ended: Callable[[], bool] | None = None) -> None:
        """Return once the stream's leader that answers this connection has heard from a
        quorum of its replicas within `CURRENT_MS` (`view_lag_ms`), so that a row or
        feed entry it does not have was not committed when this was asked. Asked before
        a refusal a stale copy could cause (no such session, a cursor past an end, a
        write refused on its row): a leader cut off from its cluster by a partition goes
        on answering as the leader from its copy of before the cut for 15-20 s, and
        until 2026-12-06 a reader whose connection was on it was told `CursorFuture`
        ("was the store restored from an older copy") for a cursor another process had
        been given through the others, `SessionNotFound` for a session created there,
        `OrdinalConflict` for an append expecting the session's true end
        (`test_answers_through_a_cut_off_stream_leader_are_not_refusals_from_its_stale_copy`,
        `-m cluster`). Such an answer counts as none for the connection (`cut_off`),
        which moves off the leader 6 s after the first; `StoreUnavailable` after
        `IN_TOUCH_S`. Once `ended()` (a follower's read scope, `ReadScope.ended`: its
        follow was stopped) it is not asked again: it ends cancelled, the caller's
        `concurrent.futures.CancelledError`, as the step's other reads asked again do
        (until 2026-12-06 it went on: a `watch_sessions` stopped 3 s into its snapshot's
        listing raised `StoreUnavailable` 27 s later, `-m cluster`). A cancelled scope
        cuts the request in flight too (`Connection.call`)."""
        stale_since: float | None = None
        deadline = time.monotonic() + IN_TOUCH_S
        while True:
            if ended is not None and ended():  # (read from the loop: flags only)
                raise asyncio.CancelledError
            lag: float | None = None
            try:
                info = await self.conn.api(f"$JS.API.STREAM.INFO.{self.conn.stream}")
                lag = view_lag_ms(info.get("cluster") or {})
            except ApiError as e:
                if not e.transient:
                    raise
            except Unavailable:
                pass
            if _current(lag):
                return
            now = time.monotonic()
            if stale_since is None:
                stale_since = now
            self.conn.no_answer(stale_since)
            if now > deadline:
                last = (
                    "no leader, or no answer"
                    if lag is None
                    else f"a leader that had heard from none for {lag / 1000:.0f} s"
                )
                raise StoreUnavailable(
                    f"for {IN_TOUCH_S:g} s no stream leader in touch with a majority of its "
                    f"replicas answered (the last answer: {last}), and a server cut off from "
                    "its cluster answers from a stale copy: check that the servers run and "
                    "reach each other, then retry"
                )
            await asyncio.sleep(0.25)

    # -- rows ------------------------------------------------------------------------------

    async def row(self, session_id: str) -> RowState:
        token = Subjects.token(session_id)
        message = await self.conn.msg_get({"last_by_subj": self.subjects.row(token)})
        if message is None:
            return RowState(None, 0, token)
        self.saw(message.seq)
        return RowState(decode_row(message), message.seq, token)

    async def rows_of(self, tokens: list[str]) -> dict[str, tuple[SessionRow | None, int]]:
        """The rows of sessions by token (absent ones left out), in chunks."""
        result: dict[str, tuple[SessionRow | None, int]] = {}
        for start in range(0, len(tokens), BATCH):
            chunk = [self.subjects.row(t) for t in tokens[start : start + BATCH]]
            found = await self._fresh({"multi_last": chunk})
            for message in found:
                token = self.subjects.token_of_row(message.subject)
                if token is not None:
                    result[token] = (decode_row(message), message.seq)
        return result

    async def last_messages(self, subjects: list[str]) -> dict[str, Found]:
        """The last message of each subject (those without one left out), in chunks."""
        result: dict[str, Found] = {}
        for start in range(0, len(subjects), BATCH):
            for message in await self._fresh({"multi_last": subjects[start : start + BATCH]}):
                result[message.subject] = message
        return result

    async def tokens(self, ended: Callable[[], bool] | None = None) -> list[str]:
        """Every session token with a row subject, sorted (= session-id order).

        The server gives the subjects in pages of up to 100,000, sorted, at an offset into
        the sorted subjects as they are when each page is asked for: a session created or
        gone below the offset between two pages moves the next page's window. Each page
        is asked for from `_PAGE_OVERLAP` subjects before the previous page's end, and
        taken only from past the greatest subject seen: when it begins past that subject
        (more than the overlap went meanwhile), it is asked for again from further back.
        So a session that exists throughout a listing is listed once (until 2026-12-06 one
        evicted below the offset between two pages left out as many sessions of the next
        page, with more than 100,000 sessions: measured on nats-server 2.15). `ended`: as
        `in_touch`'s."""
        tokens: list[str] = []
        offset = 0
        back = _PAGE_OVERLAP
        greatest = ""  # the greatest row subject taken so far
        confirmed = False  # (`in_touch` asked: once a listing)
        while True:
            info = await self.conn.api(
                f"$JS.API.STREAM.INFO.{self.conn.stream}",
                {"subjects_filter": self.subjects.rows, "offset": offset},
            )
            if not confirmed and not _current(view_lag_ms(info.get("cluster") or {})):
                # (A leader cut off from its cluster lists from its stale copy: a session
                # created through the others since would be left out, `in_touch`.)
                await self.in_touch(ended)
                confirmed = True
                continue
            # The rows of these subjects are read next from any replica that has what
            # this engine knows committed: the leader's answer counts (until 2026-12-06
            # it did not, and a replica behind it could answer without a session created
            # before the listing began, which was left out: a crash trial).
            self.saw(int(info["state"]["last_seq"]))
            subjects = list(info["state"].get("subjects") or {})
            if offset > 0 and (not subjects or min(subjects) > greatest):
                # (Subjects below the offset went since the previous page: this one may
                # begin past some not taken yet, or past the end.)
                offset = max(0, offset - back)
                back *= 2
                continue
            back = _PAGE_OVERLAP
            for subject in subjects:
                token = self.subjects.token_of_row(subject)
                if subject > greatest and token is not None:
                    tokens.append(token)
            if subjects:
                greatest = max(greatest, max(subjects))
            total = int(info.get("total", 0))
            if not subjects or offset + len(subjects) >= total:
                break
            offset += len(subjects) - min(_PAGE_OVERLAP, len(subjects) // 2)
        tokens.sort()
        return tokens

    async def all_rows(self) -> list[SessionRow]:
        tokens = await self.tokens()
        rows = await self.rows_of(tokens)
        return [row for t in tokens if (row := rows.get(t, (None, 0))[0]) is not None]

    async def registry(
        self, at_point: Callable[[int], None], ended: Callable[[], bool] | None = None
    ) -> tuple[int, list[SessionRow]]:
        """Every live row as of one lifecycle feed position, and that position (SPEC 7.7):
        the feed's last position first, then the rows (`at_point(position)` in between,
        a fault point). A lifecycle change committed while the rows were read is in the
        feed after that position and may show in a row already: the feed after it is
        read, and the rows of the sessions it names are read again, up to
        `_SETTLE_ROUNDS` times, until no change came after the position (so the feed
        after it delivers none of the changes the rows show); a session created after
        the position is left to the feed. Past those rounds, or more than a page of
        changes after the position, the rows are given as they are: a change then
        shows in a row and comes again from the feed. The position is at least the
        feed's floor, read after the last entry (the newest entries may be pruned: a
        position below the floor would make the follow after it expire). `ended`: as
        `in_touch`'s (a follower's snapshot)."""
        point = await self.last_feed_position()
        point = max(point, await self.feed_floor())
        at_point(point)
        tokens = await self.tokens(ended)
        found = await self.rows_of(tokens)
        rows = {t: row for t in tokens if (row := found.get(t, (None, 0))[0]) is not None}
        for _ in range(_SETTLE_ROUNDS):
            later = await self.feed(point, _SETTLE_PAGE + 1)
            if not later or len(later) > _SETTLE_PAGE:
                break
            point = later[-1][0]
            changed = sorted({Subjects.token(entry.row.session_id) for _, entry in later})
            found = await self.rows_of(changed)
            for token in changed:
                row = found.get(token, (None, 0))[0]
                if row is None:
                    rows.pop(token, None)  # (evicted)
                else:
                    rows[token] = row
        # (An imported session's incarnation precedes its CREATED entry, `name_position`.)
        return point, [
            rows[t]
            for t in sorted(rows)
            if max(rows[t].incarnation, rows[t].name_position) <= point
        ]

    async def session_id_of(self, incarnation: int) -> str | None:
        if incarnation < 1:
            # (No message has sequence 0, which the server refuses as a bad request:
            # a forged cursor's, raised as `StoreUnavailable` until 2026-12-06.)
            return None
        message = await self.conn.msg_get({"seq": incarnation})
        if message is None:
            return None
        return self.subjects.session_of_feed(message.subject)

    # -- the lifecycle feed ----------------------------------------------------------------

    async def feed(self, after: int, limit: int) -> list[tuple[int, FeedEntry]]:
        # Through the leader, one entry a request: lifecycle changes are few, and a
        # replica that lags would make a watcher wait for the next change.
        entries: list[tuple[int, FeedEntry]] = []
        seq = after + 1
        while len(entries) < limit:
            message = await self.conn.msg_get({"seq": seq, "next_by_subj": self.subjects.feed})
            if message is None:
                break
            entries.append((message.seq, decode_feed(message)))
            self.saw(message.seq)  # (committed: a head read later is never below it)
            seq = message.seq + 1
        return entries

    async def feed_record(self) -> tuple[FeedFloor, int]:
        """The feed's pruning record (`feed_pruning.py`) and its sequence (0: none yet),
        read through the leader: the floor it gives is raised before any purge it
        covers, so one read after the entries says whether any of them went. A record
        that does not decode gives a floor at its own sequence, examined from the start:
        every floor it could have recorded is an entry written before it, so the
        cursors it expires include all those it did (SPEC 16.2; until 2026-12-05 it was
        `JournalCorrupt` for every lifecycle read and pass, and deleting it, the one way
        out, lowered the floor to 0). A missing record is `_missing_floor`."""
        message = await self.conn.msg_get({"last_by_subj": self.subjects.feed_floor})
        if message is None:
            return await self._missing_floor()
        # (Committed: rows read as of a point at the floor come from a replica that has
        # the evictions below it, as for `last_feed_position`.)
        self.saw(message.seq)
        try:
            return FLOOR_DECODER.decode(message.data), message.seq
        except msgspec.DecodeError:
            return FeedFloor(message.seq, 0, []), message.seq

    async def _missing_floor(self) -> tuple[FeedFloor, int]:
        """No floor record. On a store never pruned (format 1) the floor is 0, and a
        writable journal records that, so that the reads after it do not read the
        identity record each time to tell (one more leader request per lifecycle read).

        On a pruned store it was deleted by hand (`nats stream rmm`, a purge of its
        subject): the floor it held is unknown, and 0 would resume a lifecycle cursor
        from below it right past the pruned changes. Every floor it could have held is
        an entry written before now, so the stream's last sequence is one: a writable
        journal records that and reads it back, with nothing examined, so the next pass
        examines the feed from its start; a read-only one cannot pin a value (the
        stream's last sequence moves, and a follower at it would expire again and again)
        and refuses (SPEC 16.2; until 2026-12-05 such a store's floor read as 0: a
        silent skip). Either record is written with the compare-and-set on the empty
        subject, so all who write one agree on one value (a pass's record, written
        before it marks the store pruned, comes first or refuses this one)."""
        pruned = await self.identity_format() >= PRUNED_FORMAT
        if not self.writable:
            if not pruned:
                return FeedFloor(0, 0, []), 0  # (never pruned: nothing below any cursor)
            raise Lasting(
                f"the lifecycle feed's floor record {self.subjects.feed_floor} is missing "
                "from a store whose feed was pruned (deleted by hand?): lifecycle reads "
                "are refused until a writable journal of the store writes it back (any "
                "lifecycle read or `journal compact` of one does)"
            )
        floor = await self.head() - 1 if pruned else 0  # (the stream's last sequence)
        headers = {"Nats-Expected-Last-Subject-Sequence": "0"}
        with contextlib.suppress(ApiError):  # (another process wrote one first)
            await self.conn.publish(
                self.subjects.feed_floor, ENCODER.encode(FeedFloor(floor, 0, [])), headers
            )
        message = await self.conn.msg_get({"last_by_subj": self.subjects.feed_floor})
        if message is None and not pruned:
            # (The write refused, a sealed stream or an account out of storage: the floor
            # is 0 all the same, no pass having marked the store before the look above.)
            return FeedFloor(0, 0, []), 0
        if message is None:
            raise StoreUnavailable(
                f"the lifecycle feed's floor record {self.subjects.feed_floor} is missing "
                "and could not be written: check the stream (is it sealed?) and read again"
            )
        self.saw(message.seq)
        try:
            return FLOOR_DECODER.decode(message.data), message.seq
        except msgspec.DecodeError:
            return FeedFloor(message.seq, 0, []), message.seq

    async def identity_format(self) -> int:
        """The format the store's identity record gives now (another process's pass may
        have marked it since this journal opened)."""
        message = await self.conn.msg_get({"last_by_subj": self.subjects.meta})
        if message is None:
            raise StoreUnavailable(
                f"the store's identity record {self.subjects.meta} is gone: restore the "
                "stream from a backup"
            )
        return decode_meta(message).format

    async def feed_floor(self) -> int:
        """The highest feed position pruned (0: none)."""
        return (await self.feed_record())[0].floor

    async def last_feed_position(self) -> int:
        message = await self.conn.msg_get({"last_by_subj": self.subjects.feed})
        if message is None:
            return 0
        # (Committed: the rows read as of it come from a replica that has it. Until
        # 2026-12-04 a replica behind it could answer, and a change between the two was
        # in neither the rows nor the feed after the position.)
        self.saw(message.seq)
        return message.seq

    # -- events ----------------------------------------------------------------------------

    async def first_event_at(self, token: str, seq: int) -> tuple[int, StoredEvent] | None:
        message = await self.conn.msg_get({"seq": seq, "next_by_subj": self.subjects.events(token)})
        if message is None:
            return None
        return message.seq, EVENT_DECODER.decode(message.data)

    async def seq_where(
        self, row: SessionRow, token: str, reached: Callable[[StoredEvent], bool]
    ) -> int | None:
        """The sequence of the session's first retained event for which `reached(event)`
        holds (a predicate that stays true once true), by bisection over sequences: one
        leader get a step. None when no retained event satisfies it."""
        found = await self.event_where(row, token, reached)
        return None if found is None else found[0]

    async def event_where(
        self,
        row: SessionRow,
        token: str,
        reached: Callable[[StoredEvent], bool],
        lo: int = 0,
    ) -> tuple[int, StoredEvent] | None:
        """`seq_where`'s event and its sequence, looked for from sequence `lo` on (0: the
        session's incarnation)."""
        lo, hi = lo or row.incarnation, row.last_event_position
        found: tuple[int, StoredEvent] | None = None
        while lo <= hi:
            mid = (lo + hi) // 2
            probe = await self.first_event_at(token, mid)
            if probe is None or probe[0] > hi:
                hi = mid - 1
                continue
            seq, event = probe
            if reached(event):
                found, hi = probe, mid - 1
            else:
                lo = seq + 1
        return found

    async def scan_events(
        self,
        token: str,
        seq: int,
        ordinal: int,
        stop: int,
        end: int,
        reached: Callable[[StoredEvent], bool],
    ) -> tuple[int, StoredEvent | None] | None:
        """The session's events read in order, from `ordinal` (at sequence `seq`) up to
        ordinal `stop` (excluded) and sequence `end`, in batched direct gets of at most
        `BATCH` events and `_SCAN_BYTES` of data (a replica that has not the next one:
        through the leader), until `reached(event)` holds: that event and its sequence;
        else (the sequence after the last event read, None). None when the events do not
        follow one another (trimmed meanwhile: the caller cannot tell)."""
        subject = self.subjects.events(token)
        leader = False
        while ordinal < stop:
            if leader:
                one = await self.conn.msg_get({"seq": seq, "next_by_subj": subject})
                found = [] if one is None else [one]
            else:
                found, _ = await self.conn.direct(
                    {
                        "seq": seq,
                        "next_by_subj": subject,
                        "batch": BATCH,
                        "max_bytes": _SCAN_BYTES + BATCH * _OVERHEAD,
                    }
                )
            moved = False
            for message in found:
                event = EVENT_DECODER.decode(message.data)
                if message.seq > end or event.ordinal != ordinal:
                    break
                if reached(event):
                    return message.seq, event
                moved, ordinal, seq = True, ordinal + 1, message.seq + 1
                if ordinal >= stop:
                    break
            if not moved and leader:
                return None
            leader = not moved
        return seq, None

    async def seq_of(self, row: SessionRow, token: str, ordinal: int) -> int | None:
        if ordinal == row.last_ordinal:
            return row.last_event_position
        return await self.seq_where(row, token, lambda e: e.ordinal >= ordinal)

    async def events(
        self,
        row: SessionRow,
        token: str,
        start_seq: int,
        after: int,
        max_bytes: int,
        context: ReadContext,
        leader: bool = False,
    ) -> tuple[list[Event], bool, int]:
        """Events after ordinal `after` from sequence `start_seq` by the page rule; whether
        more follow, and the sequence of the first event not taken (0: none). With
        `leader`, one leader get an event (when the replicas lag)."""
        subject = self.subjects.events(token)
        events: list[Event] = []
        total = 0
        seq = start_seq
        expected = after + 1
        end = row.last_event_position
        while seq <= end:
            if leader:
                one = await self.conn.msg_get({"seq": seq, "next_by_subj": subject})
                found = [] if one is None else [one]
            else:
                budget = max(max_bytes - total, 1) + BATCH * _OVERHEAD
                found, _ = await self.conn.direct(
                    {"seq": seq, "next_by_subj": subject, "batch": BATCH, "max_bytes": budget}
                )
            if not found:
                break
            for message in found:
                if message.seq > end:
                    return events, False, 0
                stored = EVENT_DECODER.decode(message.data)
                if stored.ordinal != expected:
                    raise Moved(stored.ordinal, expected)
                size = len(stored.data)
                if events and total + size > max_bytes:
                    return events, True, message.seq
                event = Event(
                    row.incarnation,
                    stored.ordinal,
                    stored.timestamp_ms,
                    stored.type,
                    stored.data,
                    stored.request_id,
                )
                bind_event(event, context, message.seq)
                events.append(event)
                total += size
                expected += 1
            seq = found[-1].seq + 1
        if expected <= row.last_ordinal:
            raise Moved(expected, expected)  # the end is missing (not stored here yet)
        return events, False, 0

    async def marker(self, token: str, key: str) -> tuple[Marker, int] | None:
        message = await self.conn.msg_get({"last_by_subj": self.subjects.marker(token, key)})
        if message is None:
            return None
        marker = MARKER_DECODER.decode(message.data)
        anchor = message.seq + marker.anchor
        if marker.incarnation < 0:
            marker.incarnation += anchor
        if marker.last_position < 0:
            marker.last_position += anchor
        return marker, message.seq

    async def snapshot(self, position: int, suffix: str = ".sn") -> StoredSnapshot | None:
        """The snapshot (or, with `suffix=".ck"`, checkpoint) message at `position`."""
        message = await self.conn.msg_get({"seq": position})
        if message is None or not message.subject.endswith(suffix):
            return None
        return SNAPSHOT_DECODER.decode(message.data)

    async def purge(self, subject: str, keep_from: int) -> None:
        """Delete the messages on `subject` (wildcards allowed) below sequence `keep_from`
        (idempotent: a purge of nothing, or of what was purged meanwhile, succeeds with
        nothing purged, so no refusal of the server is benign here). A refusal is
        `StoreUnavailable` saying what to do (until 2026-12-05 every one was swallowed:
        a refused purge of a retention pass's batch was recorded done, its entries left
        for good, and nobody told)."""
        try:
            self.point("store.purge", subject)
            await self.conn.api(
                f"$JS.API.STREAM.PURGE.{self.conn.stream}", {"filter": subject, "seq": keep_from}
            )
        except ApiError as e:
            advice = (
                "the stream has no leader now (a failover?): run it again shortly"
                if e.transient
                else f"check stream {self.conn.stream} (`nats stream info`) and the "
                "account's JetStream permissions and limits, then run it again"
            )
            raise StoreUnavailable(
                f"JetStream refused to purge {subject} below sequence {keep_from} "
                f"({e.description}, error {e.err_code}): {advice}"
            ) from None

    async def purge_or_leave(self, subject: str, keep_from: int) -> None:
        """`purge`, a refusal or no answer left unsaid: for the purges after a change
        committed, which a failure must not report as the change's (the messages stay,
        below what any read reads; until a review an unanswered purge was raised, and a
        committed append whose byte window it trimmed failed as not committed)."""
        with contextlib.suppress(StoreUnavailable, *Unavailable):
            await self.purge(subject, keep_from)


def _no_point(name: str, detail: object) -> None:
    """No fault points armed."""


class Lasting(StoreUnavailable):
    """A refusal that asking again soon will not change (the engine's reads ask again for
    30 s only when the servers do not answer): raised at once, as `StoreUnavailable`."""


class Moved(Exception):
    """The events read do not continue where the row says (trimmed or lagging meanwhile;
    `gap`: an ordinal is missing before later ones, which no lag explains)."""

    def __init__(self, got: int, expected: int) -> None:
        super().__init__(f"ordinal {got} where {expected} was due")
        self.expected = expected
        self.gap = got > expected


def view_lag_ms(cluster: dict[str, Any]) -> float | None:
    """How far behind the servers' time the answering leader's copy of a replicated
    stream may be (ms): the time since it last heard from a quorum of the stream's
    replicas (each follower's `active`, ns), for no other leader can have stored anything
    before then. 0 for a stream of one replica; None when it cannot tell: the stream has
    no leader, or the leader has not heard from a quorum (measured: a leader cut off from
    both others of an R3 stream shows them `current` for 10 s, their `active` growing
    from the cut, until it steps down about 20 s in and its answers show no leader). A
    replica this leader never heard from shows `active` 0 (one that died before its
    election, for as long as it stays away): not in touch (until 2026-12-06 it counted
    as heard from just now, and a leader left with no other follower judged a live
    owner dead 10 s into its last 10 to 20 s of term: `-m cluster`,
    `test_a_leader_that_never_heard_from_a_dead_replica_does_not_count_it_in_touch`)."""
    followers = cluster.get("replicas") or []
    if not followers:
        return 0.0
    if not cluster.get("leader"):
        return None
    needed = (len(followers) + 1) // 2  # (with the leader, a majority of the replicas)
    actives = sorted(
        float(a) if isinstance(a := f.get("active"), int | float) and a > 0 else math.inf
        for f in followers
        if isinstance(f, dict)
    )
    if len(actives) < needed or math.isinf(actives[needed - 1]):
        return None
    return actives[needed - 1] / 1e6


def _current(lag_ms: float | None) -> bool:
    """Whether a leader whose copy may lag by `lag_ms` (`view_lag_ms`) holds every
    commit (`CURRENT_MS`)."""
    return lag_ms is not None and lag_ms < CURRENT_MS


def decode_row(message: Found) -> SessionRow | None:
    """The row a row message holds (None for an eviction's tombstone, and for the staged
    row of an import in progress: nobody sees it before its commit, `imports.py`)."""
    row = stored_row(message)
    return None if row is None or row.staged else row


def stored_row(message: Found) -> SessionRow | None:
    """The row a row message holds, staged or not (None for a tombstone)."""
    if not message.data:
        return None
    try:
        return resolve(ROW_DECODER.decode(message.data), message.seq)
    except msgspec.DecodeError:
        raise JournalCorrupt(
            message.subject,
            message.seq,
            f"the row message at stream sequence {message.seq} does not decode",
        ) from None


def decode_meta(message: Found) -> Meta:
    """The store's identity record (`j.<store>.meta`); `JournalCorrupt` naming it if it no
    longer decodes (it did when the journal opened: `opening.bootstrap` refuses one that
    never did)."""
    try:
        return META_DECODER.decode(message.data)
    except msgspec.DecodeError:
        raise JournalCorrupt(
            message.subject,
            message.seq,
            f"the store's identity record at stream sequence {message.seq} no longer "
            "decodes (rewritten by hand?): restore it from a backup of the stream (it "
            "holds the store's id and cursor key)",
        ) from None


def decode_feed(message: Found) -> FeedEntry:
    stored = FEED_DECODER.decode(message.data)
    resolve(stored.entry.row, message.seq + stored.anchor)
    return stored.entry
