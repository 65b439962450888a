"""Stateful model test: the journal must agree with a plain dict-of-lists model after every
step (creates, appends with and without optimistic concurrency and idempotency keys,
lifecycle transitions, bounded reads resumed from earlier cursors, listings, snapshots
that drop a prefix, checkpoints that keep it, retention that trims history and evicts
terminal sessions, compaction, reopen and a view rebuilt from the segments).

Segments are small, so rotation (and the retention pass it triggers) happens all the time.
After every step, every cursor seen so far must give exactly what the model says: the events
after it, `CursorExpired` (below the retained range), `CursorForeign` (a cursor of an evicted
incarnation whose id was created again) or `SessionNotFound` (its session is gone)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from engines import ENGINES, EngineFactory
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from journal import (
    CompactionReport,
    CursorExpired,
    CursorForeign,
    EventIn,
    IdempotencyKeyReused,
    IllegalTransition,
    InvalidArgument,
    Journal,
    OrdinalConflict,
    Owner,
    OwnerBusy,
    RetentionPolicy,
    SessionExists,
    SessionNotFound,
    SessionNotWritable,
    SessionState,
)

SESSION_IDS = ("s-a", "s-b", "s-c", "s-d", "s-e")
SEGMENT_BYTES = 8 << 10
DAY_MS = 24 * 3600 * 1000
EIGHT_DAYS_MS = 8 * DAY_MS
LONG_AGE_MS = 10 * DAY_MS
# Windows and eviction never trigger at the real time (the automatic pass at every seal), and
# always do at `now + 2 days` (the apply_retention rule), so the model knows what happens.
POLICY = RetentionPolicy(
    max_history_bytes=None, max_history_age_ms=DAY_MS, session_retention_ms=DAY_MS
)
CURSORS_KEPT = 1000  # per session incarnation (a bound that a default run never reaches)
FOREIGN_KEPT = 1000  # per id: cursors of evicted incarnations
DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"

UNKNOWN_RESULT = json.dumps(
    {
        "status": "failed",
        "error": {
            "code": "WATCH_OUTCOME_UNKNOWN",
            "message": "the previous owner ended without recording a settled result; the "
            "prompt may have executed",
        },
    },
    separators=(",", ":"),
).encode()

Stored = tuple[str, bytes, str | None]
"""An event as the model keeps it: type, data, request_id."""


def open_journal(factory: EngineFactory, path: Path) -> Journal:
    return factory.open(path, durability="os", segment_bytes=SEGMENT_BYTES, retention=POLICY)


def now_ms() -> int:
    return int(time.time() * 1000)


def page_length(sizes: list[int], max_bytes: int) -> int:
    total = 0
    for count, size in enumerate(sizes):
        if count > 0 and total + size > max_bytes:
            return count
        total += size
    return len(sizes)


def transition(state: SessionState, op: str) -> SessionState | None:
    """The state after `op`, or None when the transition is illegal. Cancel of a terminal
    session, and resolve of a resolved one, are not illegal: they leave it as it is."""
    if op == "suspend":
        return SessionState.SUSPENDED if state is SessionState.OPEN else None
    if op == "resume":
        return SessionState.OPEN if state is SessionState.SUSPENDED else None
    if state.terminal:
        as_is = op == "cancel" or (op == "resolve" and state is SessionState.RESOLVED)
        return state if as_is else None
    return SessionState.RESOLVED if op == "resolve" else SessionState.CANCELLED


class JournalModel(RuleBasedStateMachine):
    """The model machine; one subclass per engine (`factory`) is collected below."""

    factory: EngineFactory

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="journal-model-"))
        self.path = self.directory / "store"
        self.j = open_journal(self.factory, self.path)
        # Every event a session ever had (ordinal n at index n - 1); it retains
        # [first[s], len(events[s])].
        self.events: dict[str, list[Stored]] = {}
        self.first: dict[str, int] = {}
        self.snapshots: dict[str, tuple[int, bytes] | None] = {}
        # The latest checkpoint: it goes once history below it leaves (see `trim`).
        self.checkpoints: dict[str, tuple[int, bytes] | None] = {}
        self.long_history: dict[str, bool] = {}  # created with a 10-day age window
        self.states: dict[str, SessionState] = {}
        # (session, key) -> (events, first_ordinal, last_ordinal). Forgotten on reopen and
        # keys are never reused after it, so the model does not depend on whether an
        # engine keeps idempotency keys across a restart.
        self.keys: dict[tuple[str, str], tuple[list[EventIn], int, int]] = {}
        # Cursors seen so far, per session: (ordinal of the event it resumes after, cursor).
        self.cursors: dict[str, list[tuple[int, str]]] = {}
        # Cursors of evicted incarnations, per id (kept after the id is created again).
        self.foreign: dict[str, list[str]] = {}
        self.counter = 0
        # Owners held by this process, the live turn of each, the request id of the last
        # unsettled turn per session (kept when its owner goes), lease generations.
        self.owners: dict[str, Owner] = {}
        self.turns: dict[str, Any] = {}
        self.open_turn: dict[str, str] = {}
        self.generation: dict[str, int] = {}

    def teardown(self) -> None:
        try:
            self.j.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------------------

    def existing(self) -> st.SearchStrategy[str]:
        return st.sampled_from(sorted(self.states)) if self.states else st.nothing()

    def writable(self) -> list[str]:
        return sorted(s for s, state in self.states.items() if state is SessionState.OPEN)

    def make_events(self, sizes: list[int], with_request_id: bool) -> list[EventIn]:
        batch = []
        for size in sizes:
            self.counter += 1
            data = f"{self.counter}:".encode() + bytes([self.counter % 251]) * size
            request_id = f"r{self.counter}" if with_request_id else None
            batch.append(EventIn(type=f"t{size % 3}", data=data, request_id=request_id))
        return batch

    def commit(self, session_id: str, batch: list[EventIn], result: Any) -> None:
        before = len(self.events[session_id])
        assert (result.session_id, result.first_ordinal, result.last_ordinal) == (
            session_id,
            before + 1,
            before + len(batch),
        )
        assert not result.deduplicated
        self.events[session_id].extend((e.type, e.data, e.request_id) for e in batch)
        self.remember(session_id, result.last_ordinal, result.cursor)

    def remember(self, session_id: str, ordinal: int, cursor: str) -> None:
        seen = self.cursors[session_id]
        seen.append((ordinal, cursor))
        if len(seen) > CURSORS_KEPT:
            del seen[CURSORS_KEPT // 2]  # keep the oldest half and the newest ones

    def last(self, session_id: str) -> int:
        return len(self.events[session_id])

    def trim(self, session_id: str, new_first: int) -> None:
        """The retained range now starts at `new_first` (if that is higher)."""
        self.first[session_id] = max(self.first[session_id], new_first)
        first = self.first[session_id]
        checkpoint = self.checkpoints[session_id]
        if checkpoint is not None and checkpoint[0] < first - 1:
            self.checkpoints[session_id] = None  # it could never be used again
        for (s, key), (batch, key_first, key_last) in list(self.keys.items()):
            if s != session_id or key_first >= first:
                continue
            if key_last < first:
                # Its append was trimmed away: the key is forgotten (a retry appends again).
                self.keys[(s, key)] = (batch, 0, 0)
            else:
                del self.keys[(s, key)]  # partly retained: not specified, not used

    def evict(self, session_id: str) -> None:
        owner = self.owners.pop(session_id, None)
        if owner is not None:
            owner.release()  # lets the lock go; there is no session to record it on
        self.turns.pop(session_id, None)
        self.open_turn.pop(session_id, None)
        del self.states[session_id]
        self.checkpoints.pop(session_id, None)
        foreign = self.foreign.setdefault(session_id, [])
        foreign.extend(cursor for _, cursor in self.cursors.pop(session_id))
        del foreign[:-FOREIGN_KEPT]
        for s, key in list(self.keys):
            if s == session_id:
                del self.keys[(s, key)]

    def expected_after(self, session_id: str, cursor_ordinal: int | None) -> int | None:
        """The ordinal a read from this cursor resumes after, or None if it expired."""
        first = self.first[session_id]
        if cursor_ordinal is None:
            return first - 1
        return None if cursor_ordinal < first - 1 else cursor_ordinal

    def check_cursor(self, session_id: str, cursor_ordinal: int, cursor: str) -> None:
        after = self.expected_after(session_id, cursor_ordinal)
        if after is None:
            with pytest.raises(CursorExpired) as info:
                self.j.read(session_id, cursor=cursor)
            assert info.value.earliest_ordinal == self.first[session_id]
            assert info.value.resume_cursor is not None
            after, cursor = self.first[session_id] - 1, info.value.resume_cursor
        page = self.j.read(session_id, cursor=cursor, max_bytes=1 << 30)
        stored = self.events[session_id]
        got = [(e.ordinal, e.type, e.data, e.request_id) for e in page.events]
        assert got == [(n, *stored[n - 1]) for n in range(after + 1, len(stored) + 1)], (
            session_id,
            cursor_ordinal,
        )

    # -- rules -----------------------------------------------------------------------------

    @initialize(
        session_ids=st.sets(st.sampled_from(SESSION_IDS), min_size=1, max_size=4),
        long_history=st.booleans(),
        owned=st.booleans(),
    )
    def create_first_sessions(self, session_ids: set[str], long_history: bool, owned: bool) -> None:
        for session_id in sorted(session_ids):
            self.create(session_id, "review", long_history and session_id == min(session_ids))
            # A few segments' worth of history from the start, so rotation, retention at
            # every seal, snapshots and compaction have something to work on.
            for _ in range(3):
                batch = self.make_events([2500, 2500], with_request_id=False)
                self.commit(session_id, batch, self.j.append(session_id, batch))
        if owned:
            # Often a turn is under way from the start, so turn steps have work to do.
            first = min(session_ids)
            owner = self.j.own(first)
            self.generation[first] += 1
            self.owners[first] = owner
            self.counter += 1
            request_id = f"turn-{self.counter}"
            turn = owner.turn(request_id)
            started = turn.__enter__().started
            assert started is not None
            self.events[first].append(("turn_started", b"{}", request_id))
            self.remember(first, started.last_ordinal, started.cursor)
            self.turns[first] = turn
            self.open_turn[first] = request_id

    @rule(
        data=st.data(),
        mode=st.sampled_from(["", "review", "x"]),
        long_history=st.booleans(),
    )
    def create_session(self, data: st.DataObject, mode: str, long_history: bool) -> None:
        # Often an id that was evicted: its new incarnation must not see the old one.
        evicted = sorted(s for s in self.foreign if s not in self.states)
        session_id = data.draw(
            (st.sampled_from(evicted) if evicted else st.nothing()) | st.sampled_from(SESSION_IDS),
            label="session",
        )
        self.create(session_id, mode, long_history)

    def create(self, session_id: str, mode: str, long_history: bool) -> None:
        if session_id in self.states:
            with pytest.raises(SessionExists):
                self.j.create_session(session_id, mode=mode)
            return
        meta = self.j.create_session(
            session_id,
            mode=mode,
            tags={"id": session_id},
            max_history_age_ms=LONG_AGE_MS if long_history else None,
        )
        assert (meta.session_id, meta.state, meta.mode) == (session_id, SessionState.OPEN, mode)
        assert (meta.first_ordinal, meta.last_ordinal) == (1, 0)
        self.states[session_id] = SessionState.OPEN
        self.events[session_id] = []
        self.first[session_id] = 1
        self.snapshots[session_id] = None
        self.checkpoints[session_id] = None
        self.long_history[session_id] = long_history
        self.cursors[session_id] = []
        self.generation[session_id] = 0

    @rule(
        data=st.data(),
        sizes=st.lists(st.sampled_from([0, 1, 30, 500, 3000, 9000]), min_size=1, max_size=8),
        expectation=st.sampled_from(["none", "none", "right", "wrong"]),
        wrong_by=st.sampled_from([-2, -1, 1, 3]),
        with_request_id=st.booleans(),
    )
    def append(
        self,
        data: st.DataObject,
        sizes: list[int],
        expectation: str,
        wrong_by: int,
        with_request_id: bool,
    ) -> None:
        # Mostly sessions that exist (and are writable), sometimes any name at all.
        session_id = data.draw(
            (st.sampled_from(self.writable()) if self.writable() else self.existing())
            | self.existing()
            | st.sampled_from(SESSION_IDS),
            label="session",
        )
        batch = self.make_events(sizes, with_request_id)
        if session_id not in self.states:
            with pytest.raises(SessionNotFound):
                self.j.append(session_id, batch)
            return
        if self.states[session_id] is not SessionState.OPEN:
            with pytest.raises(SessionNotWritable):
                self.j.append(session_id, batch)
            return
        last = len(self.events[session_id])
        if expectation == "none":
            self.commit(session_id, batch, self.j.append(session_id, batch))
        elif expectation == "right":
            result = self.j.append(session_id, batch, expected_last_ordinal=last)
            self.commit(session_id, batch, result)
        else:
            expected = max(0, last + wrong_by)
            if expected == last:
                expected = last + 1
            with pytest.raises(OrdinalConflict):
                self.j.append(session_id, batch, expected_last_ordinal=expected)

    @precondition(lambda self: bool(self.writable()))
    @rule(data=st.data(), sizes=st.lists(st.sampled_from([0, 7, 800]), min_size=1, max_size=3))
    def append_with_idempotency_key(self, data: st.DataObject, sizes: list[int]) -> None:
        session_id = data.draw(st.sampled_from(self.writable()), label="session")
        known = sorted(key for (s, key) in self.keys if s == session_id)
        choice = "new"
        if known:
            choice = data.draw(st.sampled_from(["new", "same", "different"]), label="use")
        if choice == "new":
            self.counter += 1
            key = f"key-{self.counter}"
            batch = self.make_events(sizes, with_request_id=False)
            result = self.j.append(session_id, batch, idempotency_key=key)
            self.commit(session_id, batch, result)
            self.keys[(session_id, key)] = (batch, result.first_ordinal, result.last_ordinal)
            return
        key = data.draw(st.sampled_from(known), label="key")
        original, first, last = self.keys[(session_id, key)]
        if first == 0:  # forgotten with its trimmed append: any use appends anew
            batch = list(original) if choice == "same" else self.make_events(sizes, False)
            result = self.j.append(session_id, batch, idempotency_key=key)
            self.commit(session_id, batch, result)
            self.keys[(session_id, key)] = (batch, result.first_ordinal, result.last_ordinal)
            return
        if choice == "same":
            result = self.j.append(session_id, list(original), idempotency_key=key)
            assert result.deduplicated
            assert (result.first_ordinal, result.last_ordinal) == (first, last)
        else:
            with pytest.raises(IdempotencyKeyReused):
                self.j.append(session_id, self.make_events(sizes, False), idempotency_key=key)

    @rule(data=st.data(), op=st.sampled_from(["suspend", "resume", "resolve", "cancel"]))
    def change_state(self, data: st.DataObject, op: str) -> None:
        session_id = data.draw(self.existing() | st.sampled_from(SESSION_IDS), label="session")
        method = getattr(self.j, f"{op}_session")
        if session_id not in self.states:
            with pytest.raises(SessionNotFound):
                method(session_id)
            return
        after = transition(self.states[session_id], op)
        if after is None:
            with pytest.raises(IllegalTransition):
                method(session_id)
            return
        meta = method(session_id)
        assert meta.state is after
        self.states[session_id] = after

    @rule()
    def expire_long_suspended(self) -> None:
        # No session has a ttl, so only SUSPENDED ones (default limit 7 days) are due.
        expired = self.j.expire_due(now_ms=int(time.time() * 1000) + EIGHT_DAYS_MS)
        due = sorted(s for s, state in self.states.items() if state is SessionState.SUSPENDED)
        assert sorted(m.session_id for m in expired) == due
        assert all(m.state is SessionState.EXPIRED for m in expired)
        for session_id in due:
            self.states[session_id] = SessionState.EXPIRED

    @precondition(lambda self: bool(self.states))
    @rule(data=st.data(), max_bytes=st.sampled_from([1, 40, 600, 3500, 10_000, 40_000]))
    def read_page(self, data: st.DataObject, max_bytes: int) -> None:
        session_id = data.draw(st.sampled_from(sorted(self.states)), label="session")
        start, cursor = data.draw(
            st.sampled_from([(0, None), *self.cursors[session_id]]), label="from"
        )
        if cursor is None:
            start = self.first[session_id] - 1
        if self.expected_after(session_id, start) is None:
            with pytest.raises(CursorExpired):
                self.j.read(session_id, cursor=cursor, max_bytes=max_bytes)
            return
        page = self.j.read(session_id, cursor=cursor, max_bytes=max_bytes)
        stored = self.events[session_id]
        count = page_length([len(e[1]) for e in stored[start:]], max_bytes)
        assert [(e.type, e.data, e.request_id) for e in page.events] == stored[
            start : start + count
        ]
        assert [e.ordinal for e in page.events] == list(range(start + 1, start + count + 1))
        assert all(e.session_id == session_id for e in page.events)
        assert page.has_more == (start + count < len(stored))
        if page.events:
            assert page.next_cursor is not None
            self.remember(session_id, start + count, page.next_cursor)
            middle = page.events[len(page.events) // 2]
            self.remember(session_id, middle.ordinal, middle.cursor)
        else:
            assert page.next_cursor == cursor

    @precondition(lambda self: bool(self.states))
    @rule(data=st.data())
    def replay_from_seen_cursor(self, data: st.DataObject) -> None:
        session_id = data.draw(st.sampled_from(sorted(self.states)), label="session")
        start, cursor = data.draw(
            st.sampled_from([(0, None), *self.cursors[session_id]]), label="from"
        )
        if cursor is None:
            start = self.first[session_id] - 1
        if self.expected_after(session_id, start) is None:
            with pytest.raises(CursorExpired):
                self.j.replay(session_id, cursor=cursor)
            return
        replayed = [
            (e.ordinal, e.type, e.data, e.request_id)
            for e in self.j.replay(session_id, cursor=cursor, max_bytes=5000)
        ]
        stored = self.events[session_id]
        assert replayed == [(n, *stored[n - 1]) for n in range(start + 1, len(stored) + 1)]

    @rule(
        page_size=st.integers(1, 6),
        state=st.one_of(st.none(), st.sampled_from(list(SessionState))),
    )
    def list_sessions(self, page_size: int, state: SessionState | None) -> None:
        listed = []
        token = None
        for _ in range(len(SESSION_IDS) + 2):
            page = self.j.list_sessions_page(page_size=page_size, page_token=token, state=state)
            assert len(page.sessions) <= page_size
            listed.extend((m.session_id, m.state, m.last_ordinal) for m in page.sessions)
            token = page.next_page_token
            if token == "":
                break
        assert token == "", "listing did not end"
        expected = [
            (s, self.states[s], len(self.events[s]))
            for s in sorted(self.states)
            if state is None or self.states[s] is state
        ]
        assert listed == expected
        lazily = [m.session_id for m in self.j.list_sessions(state=state, page_size=page_size)]
        assert lazily == [s for s, _, _ in expected]
        whole = self.j.list_sessions_page(state=state)  # default size: one page
        assert [m.session_id for m in whole.sessions] == [s for s, _, _ in expected]
        assert whole.next_page_token == ""

    @rule(
        data=st.data(),
        snapshot=st.binary(max_size=40),
        where=st.sampled_from(
            ["last", "middle", "middle", "snapshot", "below_snapshot", "beyond", "zero"]
        ),
    )
    def compact_session(self, data: st.DataObject, snapshot: bytes, where: str) -> None:
        session_id = data.draw(self.existing() | st.sampled_from(SESSION_IDS), label="session")
        if session_id not in self.states:
            with pytest.raises(SessionNotFound):
                self.j.compact_session(session_id, 1, snapshot)
            return
        last = self.last(session_id)
        previous = self.snapshots[session_id]
        through = {
            "last": last,
            "middle": (last + 1) // 2,
            "snapshot": previous[0] if previous else last,
            "below_snapshot": previous[0] - 1 if previous else last - 1,
            "beyond": last + 1,
            "zero": 0,
        }[where]
        if through < 1 or through > last or (previous and through < previous[0]):
            with pytest.raises(InvalidArgument):
                self.j.compact_session(session_id, through, snapshot)
            return
        result = self.j.compact_session(session_id, through, snapshot)
        assert (result.session_id, result.ordinal, result.data) == (session_id, through, snapshot)
        self.snapshots[session_id] = (through, snapshot)
        self.trim(session_id, through + 1)
        self.remember(session_id, through, result.cursor)

    @rule(
        data=st.data(),
        checkpoint=st.binary(max_size=40),
        where=st.sampled_from(
            ["last", "last", "middle", "current", "below_current", "below_range", "beyond", "zero"]
        ),
    )
    def checkpoint_session(self, data: st.DataObject, checkpoint: bytes, where: str) -> None:
        session_id = data.draw(self.existing() | st.sampled_from(SESSION_IDS), label="session")
        if session_id not in self.states:
            with pytest.raises(SessionNotFound):
                self.j.checkpoint_session(session_id, 1, checkpoint)
            return
        last = self.last(session_id)
        first = self.first[session_id]
        previous = self.checkpoints[session_id]
        through = {
            "last": last,
            "middle": (last + 1) // 2,
            "current": previous[0] if previous else last,
            "below_current": previous[0] - 1 if previous else last - 1,
            "below_range": first - 2,
            "beyond": last + 1,
            "zero": 0,
        }[where]
        if (
            through < 1
            or through > last
            or through < first - 1
            or (previous is not None and through < previous[0])
        ):
            with pytest.raises(InvalidArgument):
                self.j.checkpoint_session(session_id, through, checkpoint)
            return
        result = self.j.checkpoint_session(session_id, through, checkpoint)
        assert (result.session_id, result.ordinal, result.data) == (session_id, through, checkpoint)
        self.checkpoints[session_id] = (through, checkpoint)  # nothing else changes
        self.remember(session_id, through, result.cursor)

    @rule(when=st.sampled_from(["now", "in two days"]))
    def apply_retention(self, when: str) -> None:
        if when == "now":
            report = self.j.apply_retention()
            assert (report.trimmed_sessions, report.evicted_sessions) == ([], [])
            return
        report = self.j.apply_retention(now_ms=now_ms() + 2 * DAY_MS)
        evicted = sorted(s for s, state in self.states.items() if state.terminal)
        trimmed = sorted(
            s
            for s, state in self.states.items()
            if not state.terminal and not self.long_history[s] and self.first[s] <= self.last(s)
        )
        assert sorted(report.evicted_sessions) == evicted
        assert sorted(report.trimmed_sessions) == trimmed
        for session_id in evicted:
            self.evict(session_id)
        for session_id in trimmed:
            self.trim(session_id, self.last(session_id) + 1)

    @precondition(lambda self: bool(self.states))
    @rule(data=st.data())
    def end_a_session_and_evict(self, data: st.DataObject) -> None:
        # Eviction needs a terminal session; make one rather than wait for it.
        session_id = data.draw(self.existing(), label="session")
        if not self.states[session_id].terminal:
            assert self.j.cancel_session(session_id).state is SessionState.CANCELLED
            self.states[session_id] = SessionState.CANCELLED
        self.apply_retention("in two days")

    @rule(dead_share=st.sampled_from([0.0, 0.5, 1.0]))
    def compact(self, dead_share: float) -> None:
        report = self.j.compact(dead_share=dead_share)
        assert isinstance(report, CompactionReport)
        for name in report.segments_rewritten:
            assert name.endswith(".seg.zst"), report

    # -- owners and turns ------------------------------------------------------------------

    @precondition(lambda self: bool(self.states))
    @rule(data=st.data())
    def own(self, data: st.DataObject) -> None:
        session_id = data.draw(self.existing(), label="session")
        state = self.states[session_id]
        if session_id in self.owners:
            with pytest.raises(OwnerBusy):
                self.j.own(session_id)
            return
        if state.terminal:
            with pytest.raises(SessionNotWritable):
                self.j.own(session_id)
            return
        if session_id in self.open_turn and state is not SessionState.OPEN:
            # The unknown outcome cannot be recorded on a suspended session: own() fails
            # (after taking and releasing a lease generation).
            with pytest.raises(SessionNotWritable):
                self.j.own(session_id)
            self.generation[session_id] += 1
            return
        owner = self.j.own(session_id)
        self.generation[session_id] += 1
        assert owner.generation == self.generation[session_id]
        request_id = self.open_turn.pop(session_id, None)
        if request_id is not None:  # its owner is gone: recorded as failed, outcome unknown
            self.events[session_id].append(("turn_result", UNKNOWN_RESULT, request_id))
        self.owners[session_id] = owner

    @precondition(lambda self: bool(self.owners))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        session_id = data.draw(st.sampled_from(sorted(self.owners)), label="owned")
        self.owners.pop(session_id).release()
        self.turns.pop(session_id, None)  # an open turn stays unsettled

    @precondition(lambda self: any(s not in self.turns for s in self.owners))
    @rule(data=st.data())
    def start_turn(self, data: st.DataObject) -> None:
        idle = sorted(s for s in self.owners if s not in self.turns)
        session_id = data.draw(st.sampled_from(idle), label="owned")
        self.counter += 1
        request_id = f"turn-{self.counter}"
        turn = self.owners[session_id].turn(request_id)
        if self.states[session_id] is not SessionState.OPEN:
            with pytest.raises(SessionNotWritable):
                turn.__enter__()
            return
        started = turn.__enter__()
        assert started.started is not None
        self.events[session_id].append(("turn_started", b"{}", request_id))
        self.remember(session_id, started.started.last_ordinal, started.started.cursor)
        self.turns[session_id] = turn
        self.open_turn[session_id] = request_id

    @precondition(lambda self: bool(self.turns))
    @rule(data=st.data(), sizes=st.lists(st.sampled_from([0, 7, 800]), min_size=1, max_size=3))
    def append_in_turn(self, data: st.DataObject, sizes: list[int]) -> None:
        session_id = data.draw(st.sampled_from(sorted(self.turns)), label="turn")
        turn = self.turns[session_id]
        batch = self.make_events(sizes, with_request_id=False)
        if self.states[session_id] is not SessionState.OPEN:
            with pytest.raises(SessionNotWritable):
                turn.append(batch)
            return
        result = turn.append(batch)
        tagged = [EventIn(e.type, e.data, turn.request_id) for e in batch]
        self.commit(session_id, tagged, result)

    @precondition(lambda self: bool(self.turns))
    @rule(data=st.data(), outcome=st.sampled_from(["completed", "cancelled", "failed"]))
    def end_turn(self, data: st.DataObject, outcome: str) -> None:
        session_id = data.draw(st.sampled_from(sorted(self.turns)), label="turn")
        turn = self.turns.pop(session_id)
        if outcome == "cancelled":
            turn.cancel()
        error = InvalidArgument("the tool failed") if outcome == "failed" else None
        if self.states[session_id] is not SessionState.OPEN:
            with pytest.raises(SessionNotWritable):
                turn.__exit__(None if error is None else type(error), error, None)
            return  # unsettled: the next owner records the unknown outcome
        turn.__exit__(None if error is None else type(error), error, None)
        result: dict[str, Any] = {"status": outcome}
        if error is not None:
            result["error"] = {"code": "INVALID_ARGUMENT", "message": "the tool failed"}
        self.events[session_id].append(
            ("turn_result", json.dumps(result, separators=(",", ":")).encode(), turn.request_id)
        )
        del self.open_turn[session_id]

    def _forget_owners(self) -> None:
        """Closing the journal released every lease (open turns stay unsettled)."""
        self.owners.clear()
        self.turns.clear()

    @rule()
    def close_and_reopen(self) -> None:
        self.j.close()
        self._forget_owners()
        self.j = open_journal(self.factory, self.path)
        self.keys.clear()

    @rule()
    def close_and_rebuild_the_view(self) -> None:
        self.j.close()
        self._forget_owners()
        self.factory.discard_derived_state(self.path)
        self.j = open_journal(self.factory, self.path)
        self.keys.clear()

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def metadata_matches_model(self) -> None:
        for session_id, state in self.states.items():
            meta = self.j.get_session(session_id)
            assert meta.state is state, (session_id, meta.state, state)
            assert (meta.first_ordinal, meta.last_ordinal) == (
                self.first[session_id],
                self.last(session_id),
            ), session_id
            assert (meta.ended_at_ms is not None) == state.terminal, (session_id, meta)
            if session_id in self.owners:
                assert meta.owner is not None and meta.owner.pid == os.getpid(), meta
                assert meta.owner.generation == self.generation[session_id]
            else:
                assert meta.owner is None, meta
            assert (meta.suspended_at_ms is not None) or state is not SessionState.SUSPENDED
        for session_id in set(SESSION_IDS) - set(self.states):
            with pytest.raises(SessionNotFound):
                self.j.get_session(session_id)

    @invariant()
    def snapshots_match_model(self) -> None:
        for session_id in self.states:
            got = self.j.snapshot(session_id)
            expected = self.snapshots[session_id]
            if expected is None:
                assert got is None, session_id
            else:
                assert got is not None, session_id
                assert (got.session_id, got.ordinal, got.data) == (session_id, *expected)

    @invariant()
    def checkpoints_match_model(self) -> None:
        for session_id in self.states:
            got = self.j.checkpoint(session_id)
            expected = self.checkpoints[session_id]
            if expected is None:
                assert got is None, session_id
            else:
                assert got is not None, session_id
                assert (got.session_id, got.ordinal, got.data) == (session_id, *expected)
                self.check_cursor(session_id, got.ordinal, got.cursor)

    @invariant()
    def every_seen_cursor_gives_what_the_model_says(self) -> None:
        for session_id in self.states:
            for cursor_ordinal, cursor in self.cursors[session_id]:
                self.check_cursor(session_id, cursor_ordinal, cursor)
            snapshot = self.j.snapshot(session_id)
            if snapshot is not None:
                self.check_cursor(session_id, snapshot.ordinal, snapshot.cursor)
        for session_id, cursors in self.foreign.items():
            for cursor in cursors:
                if session_id in self.states:
                    with pytest.raises(CursorForeign):
                        self.j.read(session_id, cursor=cursor)
                else:
                    with pytest.raises(SessionNotFound):
                        self.j.read(session_id, cursor=cursor)


# (Over JetStream, whose steps are server round trips, the default run takes fewer
# examples, 40 took 38 s of CI's 15 minutes and 15 about 10 s, and `-m slow` runs
# more; the deep profile runs 400 on each engine.)
_EXAMPLES: dict[tuple[str, bool], int] = {
    ("local", False): 40,
    ("jetstream", False): 8,
    ("jetstream", True): 60,
    ("jetstream-r3", False): 40,  # (`-m cluster`)
}

for (_name, _slow), _examples in sorted(_EXAMPLES.items()):
    _factory = ENGINES[_name]
    _label = f"{_name}_more" if _slow else _name
    _machine = type(f"JournalModel_{_label}", (JournalModel,), {"factory": _factory})
    _machine.TestCase.settings = settings(
        max_examples=400 if DEEP else _examples,
        stateful_step_count=60 if DEEP else 30,
    )
    _machine.TestCase.pytestmark = list(_factory.marks) + ([pytest.mark.slow] if _slow else [])
    globals()[f"TestJournalModel_{_label}"] = _machine.TestCase
