"""The journal contract: behaviour every storage engine behind `journal.Journal` must show.

`JournalContract` is a reusable base that runs against every engine in `engines.ENGINES`
(the `engine` fixture is parametrised by engine factory). A test module subclasses it
(named `Test...` so pytest collects it) and sets `options`, the keyword arguments of
`Journal.open` its configuration uses (`durability`, `segment_bytes`, ...); `make_journal(path,
**kw)` opens (creating if needed) the store at `path` on the engine under test, and
`copy_store(src, dst)` copies a closed store, for the restore-from-an-older-copy case.

Tests use only the public API; one test per rule, named after the rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from engines import ENGINES, EngineFactory, engine_params

import journal
from journal import (
    AppendResult,
    CursorForeign,
    CursorFuture,
    CursorMalformed,
    Event,
    EventIn,
    IdempotencyKeyReused,
    IllegalTransition,
    InvalidArgument,
    InvalidPageToken,
    Journal,
    JournalError,
    LifecycleEvent,
    LifecycleEventType,
    OrdinalConflict,
    Page,
    SessionExists,
    SessionMetadata,
    SessionNotFound,
    SessionNotWritable,
    SessionPage,
    SessionState,
    Stream,
    TurnSettled,
)
from journal.lifecycle import SNAPSHOT_PAGE, SNAPSHOT_REUSE

__all__ = ["JournalContract"]

# The stable code and status of every error the contract names.
ERROR_CODES: dict[type[JournalError], tuple[str, str]] = {
    SessionExists: ("SESSION_EXISTS", "ALREADY_EXISTS"),
    SessionNotFound: ("SESSION_NOT_FOUND", "NOT_FOUND"),
    IllegalTransition: ("ILLEGAL_TRANSITION", "FAILED_PRECONDITION"),
    SessionNotWritable: ("SESSION_NOT_WRITABLE", "FAILED_PRECONDITION"),
    OrdinalConflict: ("ORDINAL_CONFLICT", "ABORTED"),
    IdempotencyKeyReused: ("IDEMPOTENCY_KEY_REUSED", "FAILED_PRECONDITION"),
    InvalidArgument: ("INVALID_ARGUMENT", "INVALID_ARGUMENT"),
    CursorMalformed: ("CURSOR_MALFORMED", "INVALID_ARGUMENT"),
    CursorForeign: ("CURSOR_FOREIGN", "INVALID_ARGUMENT"),
    CursorFuture: ("CURSOR_FUTURE", "OUT_OF_RANGE"),
    InvalidPageToken: ("INVALID_PAGE_TOKEN", "INVALID_ARGUMENT"),
    TurnSettled: ("TURN_SETTLED", "ALREADY_EXISTS"),
}

SEVEN_DAYS_MS = 7 * 24 * 3600 * 1000
TOKEN_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
# Generous bounds for things that should take milliseconds: a broken implementation fails
# the test instead of hanging the run.
WAIT_S = 15.0
PROMPT_S = 1.0

TERMINAL_OPS = ("resolve", "cancel", "expire")
TERMINAL_STATE = {
    "resolve": SessionState.RESOLVED,
    "cancel": SessionState.CANCELLED,
    "expire": SessionState.EXPIRED,
}


# -- helpers ---------------------------------------------------------------------------------


@contextlib.contextmanager
def raises(cls: type[JournalError]) -> Iterator[pytest.ExceptionInfo[JournalError]]:
    """`pytest.raises(cls)` that also checks the error's stable code and status."""
    with pytest.raises(cls) as info:
        yield info
    error = info.value
    assert isinstance(error, JournalError)
    code, status = ERROR_CODES[cls]
    assert (error.code, error.status) == (code, status), repr(error)
    assert str(error), "every error carries a message"


def evs(*payloads: bytes, type: str = "message") -> list[EventIn]:
    return [EventIn(type=type, data=payload) for payload in payloads]


def numbered(count: int, prefix: str = "e", size: int = 0) -> list[EventIn]:
    return [
        EventIn(type="message", data=f"{prefix}{i}:".encode() + b"x" * size) for i in range(count)
    ]


def flip_char(token: str, index: int) -> str:
    old = token[index]
    new = TOKEN_ALPHABET[(TOKEN_ALPHABET.index(old) + 7) % 64] if old in TOKEN_ALPHABET else "A"
    return token[:index] + new + token[index + 1 :]


def page_length(sizes: list[int], max_bytes: int) -> int:
    """How many events the page rule takes from events of `sizes`: add while the sum stays
    <= max_bytes, but always at least the first."""
    total = 0
    for count, size in enumerate(sizes):
        if count > 0 and total + size > max_bytes:
            return count
        total += size
    return len(sizes)


def ordinals(events: Iterable[Event]) -> list[int]:
    return [event.ordinal for event in events]


@contextlib.contextmanager
def guarded_stop(timeout: float = WAIT_S) -> Iterator[threading.Event]:
    """A stop event that fires by itself after `timeout`, so a watch that never delivers
    ends (and the test fails on what it got) instead of hanging the run."""
    stop = threading.Event()
    timer = threading.Timer(timeout, stop.set)
    timer.daemon = True
    timer.start()
    try:
        yield stop
    finally:
        stop.set()
        timer.cancel()


class WatchThread(threading.Thread):
    """Runs `journal.watch` in a thread and records what it yields and how it ended."""

    def __init__(self, j: Journal, session_id: str, cursor: str | None = None) -> None:
        super().__init__(daemon=True)
        self.j = j
        self.session_id = session_id
        self.cursor = cursor
        self.stop = threading.Event()
        self.events: list[Event] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for event in self.j.watch(self.session_id, cursor=self.cursor, stop=self.stop):
                self.events.append(event)
        except BaseException as error:
            self.error = error

    def wait_for(self, count: int, timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while len(self.events) < count and time.monotonic() < deadline:
            if not self.is_alive():
                break
            time.sleep(0.005)
        assert self.error is None, repr(self.error)
        assert len(self.events) >= count, (
            f"watch delivered {len(self.events)} events, expected {count}"
        )

    def finish(self, timeout: float = WAIT_S) -> None:
        """Wait for the watch to end by itself; stop it and fail if it does not."""
        self.join(timeout)
        if self.is_alive():
            self.stop.set()
            self.join(timeout)
            pytest.fail(f"watch did not end by itself within {timeout}s")
        assert self.error is None, repr(self.error)


def run_async(main: Callable[[], Coroutine[Any, Any, None]], timeout: float = WAIT_S) -> None:
    """asyncio.run(main()) in a thread, failing if it does not finish (for example because a
    cancelled `awatch` left a worker thread blocked, which asyncio.run waits for)."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            asyncio.run(main())
        except BaseException as error:
            outcome.append(error)
        else:
            outcome.append(None)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"asyncio.run did not finish within {timeout}s"
    if outcome[0] is not None:
        raise outcome[0]


def close_feed(feed: Iterator[LifecycleEvent]) -> None:
    close = getattr(feed, "close", None)
    if close is not None:
        close()


def next_or_fail(iterator: Iterator[LifecycleEvent]) -> LifecycleEvent:
    try:
        return next(iterator)
    except StopIteration:
        pytest.fail("watch_sessions ended (or was stopped by the guard) before the next event")


def listing(pages: Iterable[SessionPage]) -> list[str]:
    return [meta.session_id for page in pages for meta in page.sessions]


# -- the contract ----------------------------------------------------------------------------


class JournalContract:
    """Contract tests for `Journal`, run once per engine; subclass as `Test<Configuration>`
    and set `options`."""

    options: dict[str, Any] = {}  # noqa: RUF012 (read-only per subclass)
    engine: EngineFactory

    @pytest.fixture(autouse=True, params=engine_params())
    def _engine(self, request: pytest.FixtureRequest) -> None:
        self.engine = ENGINES[request.param]

    def requires(self, capability: str) -> None:
        """Skip a test whose engine says it cannot do `capability` (`engines.py`)."""
        if capability not in self.engine.supports:
            pytest.skip(f"the {self.engine.name} engine does not support {capability!r}")

    def make_journal(self, path: Path, **kw: Any) -> Journal:
        """Open (creating when missing) the store at `path` with `Journal.open` keywords."""
        return self.engine.open(path, **{**self.options, **kw})

    def copy_store(self, src: Path, dst: Path) -> None:
        """Copy a closed store, as a backup/restore would."""
        self.engine.copy_store(src, dst)

    @pytest.fixture
    def store_path(self, tmp_path: Path) -> Path:
        return tmp_path / "store"

    @pytest.fixture
    def j(self, store_path: Path) -> Iterator[Journal]:
        with self.make_journal(store_path) as opened:
            yield opened

    # Helpers that need the journal.

    def read_all(self, j: Journal, session_id: str, cursor: str | None = None) -> list[Event]:
        return list(j.replay(session_id, cursor=cursor))

    def payloads(self, j: Journal, session_id: str) -> list[bytes]:
        return [event.data for event in self.read_all(j, session_id)]

    def make_terminal(self, j: Journal, session_id: str, op: str) -> SessionMetadata:
        if op == "resolve":
            return j.resolve_session(session_id)
        if op == "cancel":
            return j.cancel_session(session_id)
        meta = j.get_session(session_id)
        assert meta.ttl_ms is not None, "create the session with a ttl to expire it"
        expired = j.expire_due(now_ms=meta.created_at_ms + meta.ttl_ms)
        assert [m.session_id for m in expired] == [session_id]
        return expired[0]

    # -- opening and sessions --------------------------------------------------------------

    def test_journal_is_a_context_manager_and_close_is_explicit(self, store_path: Path) -> None:
        with self.make_journal(store_path) as j:
            assert isinstance(j, Journal)
            j.create_session("s1")
        j2 = self.make_journal(store_path)
        try:
            assert j2.get_session("s1").session_id == "s1"
        finally:
            j2.close()

    def test_a_call_that_races_close_from_another_thread_raises_journal_closed(
        self, store_path: Path
    ) -> None:
        """Before: on the local engine about 3 in 4 such calls raised LMDB's own
        `lmdb.Error: Attempt to operate on closed/deleted/dropped object`; on JetStream a
        call the connection's loop had not run yet when it stopped waited for ever."""
        with self.make_journal(store_path) as j:
            j.create_session("s")
        failures: list[BaseException] = []
        for _ in range(20):
            j = self.make_journal(store_path)
            started = threading.Barrier(3)

            def calls(j: Journal = j, started: threading.Barrier = started) -> None:
                started.wait()
                try:
                    while True:
                        j.get_session("s")
                        j.list_sessions_page(page_size=10)
                except journal.JournalClosed:
                    pass
                except BaseException as error:
                    failures.append(error)

            threads = [threading.Thread(target=calls, daemon=True) for _ in range(2)]
            for thread in threads:
                thread.start()
            started.wait()
            time.sleep(0.002)
            j.close()
            for thread in threads:
                thread.join(30)
            assert not any(t.is_alive() for t in threads), "a call waits for ever after close()"
        assert failures == [], failures[:3]

    def test_create_session_returns_open_metadata(self, j: Journal) -> None:
        before = int(time.time() * 1000)
        meta = j.create_session(
            "s1",
            mode="review",
            context_id="ctx-9",
            tags={"team": "ops", "tier": "1"},
            extensions={"k": b"v", "other": b"\x00\x01"},
            ttl_ms=60_000,
            max_suspend_ms=5_000,
        )
        after = int(time.time() * 1000)
        assert isinstance(meta, SessionMetadata)
        assert meta.session_id == "s1"
        assert meta.state is SessionState.OPEN
        assert (meta.first_ordinal, meta.last_ordinal) == (1, 0)
        assert meta.mode == "review"
        assert meta.context_id == "ctx-9"
        assert meta.tags == {"team": "ops", "tier": "1"}
        assert sorted(meta.extension_keys) == ["k", "other"]
        assert meta.ttl_ms == 60_000
        assert meta.max_suspend_ms == 5_000
        assert before - 1000 <= meta.created_at_ms <= after + 1000
        assert meta.ended_at_ms is None
        assert meta.suspended_at_ms is None

    def test_create_session_defaults(self, j: Journal) -> None:
        meta = j.create_session("plain")
        assert meta.state is SessionState.OPEN
        assert meta.context_id is None
        assert meta.tags == {}
        assert tuple(meta.extension_keys) == ()
        assert meta.ttl_ms is None

    def test_a_session_s_own_history_windows_are_reported(self, store_path: Path) -> None:
        """`create_session(max_history_bytes=, max_history_age_ms=)` is read back from the
        metadata (None: the store's policy applies). Until 2026-12-07 no read said it, and
        only an export showed it (a new-user trial)."""
        with self.make_journal(store_path) as j:
            meta = j.create_session("w", max_history_bytes=5000, max_history_age_ms=60_000)
            j.create_session("plain")
            for got in (meta, j.get_session("w"), *j.list_sessions(), *j.expire_due(0)):
                if got.session_id == "w":
                    assert (got.max_history_bytes, got.max_history_age_ms) == (5000, 60_000)
            [page_w] = [m for m in j.list_sessions_page().sessions if m.session_id == "w"]
            assert page_w == j.get_session("w")
            plain = j.get_session("plain")
            assert (plain.max_history_bytes, plain.max_history_age_ms) == (None, None)
            j.append("w", [EventIn("e", b"x")])
            assert j.resolve_session("w").max_history_bytes == 5000
        self.engine.discard_derived_state(store_path)
        with self.make_journal(store_path) as j:  # (rebuilt from the log where it derives)
            got = j.get_session("w")
            assert (got.max_history_bytes, got.max_history_age_ms) == (5000, 60_000)

    def test_get_session_returns_what_create_returned(self, j: Journal) -> None:
        created = j.create_session("s1", mode="m", tags={"a": "b"})
        assert j.get_session("s1") == created

    def test_get_unknown_session_raises_session_not_found(self, j: Journal) -> None:
        j.create_session("s1")
        with raises(SessionNotFound):
            j.get_session("s2")

    def test_create_duplicate_session_raises_session_exists(self, j: Journal) -> None:
        first = j.create_session("s1", mode="a")
        with raises(SessionExists):
            j.create_session("s1", mode="b")
        assert j.get_session("s1") == first

    @pytest.mark.parametrize("op", TERMINAL_OPS)
    def test_create_over_terminal_session_raises_session_exists(self, j: Journal, op: str) -> None:
        j.create_session("s1", ttl_ms=60_000)
        ended = self.make_terminal(j, "s1", op)
        with raises(SessionExists):
            j.create_session("s1")
        assert j.get_session("s1") == ended

    # -- lifecycle ---------------------------------------------------------------------------

    def test_suspend_then_resume(self, j: Journal) -> None:
        j.create_session("s1")
        suspended = j.suspend_session("s1")
        assert suspended.state is SessionState.SUSPENDED
        assert suspended.suspended_at_ms is not None
        assert suspended.ended_at_ms is None
        assert j.get_session("s1") == suspended
        resumed = j.resume_session("s1")
        assert resumed.state is SessionState.OPEN
        assert resumed.ended_at_ms is None
        assert j.get_session("s1") == resumed

    @pytest.mark.parametrize("suspend_first", [False, True])
    @pytest.mark.parametrize("op", ["resolve", "cancel"])
    def test_resolve_and_cancel_end_open_or_suspended_sessions(
        self, j: Journal, op: str, suspend_first: bool
    ) -> None:
        created = j.create_session("s1")
        if suspend_first:
            j.suspend_session("s1")
        ended = self.make_terminal(j, "s1", op)
        assert ended.state is TERMINAL_STATE[op]
        assert ended.ended_at_ms is not None
        assert ended.ended_at_ms >= created.created_at_ms
        assert j.get_session("s1") == ended

    @pytest.mark.parametrize(
        ("setup", "op"),
        [
            ([], "resume"),
            (["suspend"], "suspend"),
            (["resolve"], "suspend"),
            (["resolve"], "resume"),
            (["cancel"], "suspend"),
            (["cancel"], "resume"),
            (["cancel"], "resolve"),
            (["expire"], "suspend"),
            (["expire"], "resume"),
            (["expire"], "resolve"),
        ],
    )
    def test_illegal_transition_raises_and_changes_nothing(
        self, j: Journal, setup: list[str], op: str
    ) -> None:
        j.create_session("s1", ttl_ms=60_000)
        for step in setup:
            if step == "suspend":
                j.suspend_session("s1")
            else:
                self.make_terminal(j, "s1", step)
        before = j.get_session("s1")
        with raises(IllegalTransition):
            getattr(j, f"{op}_session")("s1")
        assert j.get_session("s1") == before

    @pytest.mark.parametrize("op", TERMINAL_OPS)
    def test_cancel_on_terminal_session_returns_its_metadata_unchanged(
        self, j: Journal, op: str
    ) -> None:
        j.create_session("s1", ttl_ms=60_000)
        ended = self.make_terminal(j, "s1", op)
        assert j.cancel_session("s1") == ended
        assert j.get_session("s1") == ended

    @pytest.mark.parametrize(("setup", "again"), [("resolve", "resolve"), ("cancel", "cancel")])
    def test_a_repeated_end_returns_the_session_as_is_and_records_no_change(
        self, j: Journal, setup: str, again: str
    ) -> None:
        """A caller that retries its own resolve (its first try's answer lost: exit 8 or 9
        in the CLI) gets the resolved session back, as a repeated cancel does, and the
        lifecycle feed gets no second entry (until 2026-12-07 the resolve raised
        `IllegalTransition`: an operator trial)."""
        j.create_session("s0")
        with guarded_stop() as stop:
            feed = j.watch_sessions(stop=stop)
            start = next_or_fail(feed).cursor
            close_feed(feed)
        j.create_session("s1")
        ended = self.make_terminal(j, "s1", setup)
        assert getattr(j, f"{again}_session")("s1") == ended
        assert j.get_session("s1") == ended
        j.create_session("s2")
        with guarded_stop() as stop:
            feed = j.watch_sessions(cursor=start, stop=stop)
            changes = [next_or_fail(feed) for _ in range(3)]
            close_feed(feed)
        assert [(c.event_type, c.session.session_id) for c in changes] == [
            (LifecycleEventType.CREATED, "s1"),
            (LifecycleEventType[ended.state.name], "s1"),
            (LifecycleEventType.CREATED, "s2"),
        ]

    @pytest.mark.parametrize("op", ["suspend", "resume", "resolve", "cancel"])
    def test_transition_of_unknown_session_raises_session_not_found(
        self, j: Journal, op: str
    ) -> None:
        with raises(SessionNotFound):
            getattr(j, f"{op}_session")("nobody")

    def test_expire_due_expires_sessions_whose_ttl_has_passed(self, j: Journal) -> None:
        meta = j.create_session("short", ttl_ms=1_000)
        j.create_session("long", ttl_ms=10_000)
        j.create_session("forever")
        deadline = meta.created_at_ms + 1_000
        assert j.expire_due(now_ms=deadline - 1) == []
        assert j.get_session("short").state is SessionState.OPEN
        expired = j.expire_due(now_ms=deadline + 10)
        assert [m.session_id for m in expired] == ["short"]
        assert expired[0].state is SessionState.EXPIRED
        assert expired[0].ended_at_ms is not None
        assert j.get_session("short") == expired[0]
        assert j.get_session("long").state is SessionState.OPEN
        assert j.get_session("forever").state is SessionState.OPEN
        assert j.expire_due(now_ms=deadline + 20) == [], "expiring twice"

    def test_expire_due_ttl_boundary_is_inclusive(self, j: Journal) -> None:
        meta = j.create_session("s1", ttl_ms=500)
        assert j.expire_due(now_ms=meta.created_at_ms + 499) == []
        expired = j.expire_due(now_ms=meta.created_at_ms + 500)
        assert [m.session_id for m in expired] == ["s1"]

    def test_expire_due_applies_ttl_to_suspended_sessions(self, j: Journal) -> None:
        meta = j.create_session("s1", ttl_ms=500, max_suspend_ms=10**9)
        j.suspend_session("s1")
        expired = j.expire_due(now_ms=meta.created_at_ms + 500)
        assert [(m.session_id, m.state) for m in expired] == [("s1", SessionState.EXPIRED)]

    def test_expire_due_expires_sessions_suspended_too_long(self, j: Journal) -> None:
        j.create_session("s1", max_suspend_ms=500)
        j.create_session("open", max_suspend_ms=500)
        suspended = j.suspend_session("s1")
        assert suspended.suspended_at_ms is not None
        start = suspended.suspended_at_ms
        assert j.expire_due(now_ms=start + 499) == []
        expired = j.expire_due(now_ms=start + 500)
        assert [(m.session_id, m.state) for m in expired] == [("s1", SessionState.EXPIRED)]
        assert j.get_session("open").state is SessionState.OPEN

    def test_expire_due_default_max_suspend_is_seven_days(self, j: Journal) -> None:
        j.create_session("s1")  # max_suspend_ms=0: the default
        suspended = j.suspend_session("s1")
        assert suspended.suspended_at_ms is not None
        start = suspended.suspended_at_ms
        assert j.expire_due(now_ms=start + SEVEN_DAYS_MS - 1) == []
        expired = j.expire_due(now_ms=start + SEVEN_DAYS_MS)
        assert [m.session_id for m in expired] == ["s1"]

    def test_a_ttl_fires_by_itself(self, j: Journal) -> None:
        """Nobody calls expire_due: the journal expires the session on time, and a
        session past its deadline takes no append even before that."""
        j.create_session("due", ttl_ms=300)
        j.create_session("later", ttl_ms=10 * 60_000)
        deadline = time.monotonic() + 5
        while j.get_session("due").state is SessionState.OPEN and time.monotonic() < deadline:
            time.sleep(0.01)
        meta = j.get_session("due")
        assert meta.state is SessionState.EXPIRED
        assert meta.ended_at_ms is not None and meta.ended_at_ms >= meta.created_at_ms + 300
        assert meta.ended_at_ms - (meta.created_at_ms + 300) < 2000, "it fired late"
        assert j.expire_due() == [], "already expired: nothing left for an explicit pass"
        assert j.get_session("later").state is SessionState.OPEN
        with pytest.raises(SessionNotWritable):
            j.append("due", [EventIn("message", b"too late")])

    def test_a_suspension_cap_fires_by_itself(self, j: Journal) -> None:
        j.create_session("paused", max_suspend_ms=300)
        j.suspend_session("paused")
        deadline = time.monotonic() + 5
        while j.get_session("paused").state is SessionState.SUSPENDED:
            assert time.monotonic() < deadline, "the suspension cap never fired"
            time.sleep(0.01)
        assert j.get_session("paused").state is SessionState.EXPIRED
        with pytest.raises(IllegalTransition):
            j.resume_session("paused")

    def test_a_session_past_its_deadline_takes_no_append(self, j: Journal) -> None:
        j.create_session("due", ttl_ms=1)
        time.sleep(0.01)
        # Whether or not the expiry thread ran yet: the append's own commit expires it.
        with pytest.raises(SessionNotWritable):
            j.append("due", [EventIn("message", b"too late")])
        assert j.get_session("due").state is SessionState.EXPIRED

    def test_expire_due_ignores_resumed_and_terminal_sessions(self, j: Journal) -> None:
        # (Deadlines a minute away: 100 ms passed between the calls on a loaded machine,
        # and the session expired before its resume, CI run 71.)
        j.create_session("resumed", max_suspend_ms=60_000)
        j.suspend_session("resumed")
        j.resume_session("resumed")
        j.create_session("resolved", ttl_ms=60_000)
        resolved = j.resolve_session("resolved")
        far = int(time.time() * 1000) + 3 * SEVEN_DAYS_MS
        assert j.expire_due(now_ms=far) == []
        assert j.get_session("resumed").state is SessionState.OPEN
        assert j.get_session("resolved") == resolved

    # -- appends -----------------------------------------------------------------------------

    def test_append_assigns_dense_ordinals_from_one(self, j: Journal) -> None:
        j.create_session("s1")
        first = j.append("s1", numbered(3, "a"))
        second = j.append("s1", numbered(1, "b"))
        third = j.append("s1", numbered(5, "c"))
        assert isinstance(first, AppendResult)
        assert [(r.first_ordinal, r.last_ordinal) for r in (first, second, third)] == [
            (1, 3),
            (4, 4),
            (5, 9),
        ]
        assert all(r.session_id == "s1" and not r.deduplicated for r in (first, second, third))
        assert all(isinstance(r.cursor, str) and r.cursor for r in (first, second, third))
        assert ordinals(self.read_all(j, "s1")) == list(range(1, 10))
        assert j.get_session("s1").last_ordinal == 9
        assert j.get_session("s1").first_ordinal == 1

    def test_events_read_back_with_all_their_fields(self, j: Journal) -> None:
        j.create_session("s1")
        before = int(time.time() * 1000)
        j.append(
            "s1",
            [
                EventIn(type="message", data=b'{"jsonrpc":"2.0"}', request_id="r-1"),
                EventIn(type="tool", data=b"", request_id=None),
                EventIn(type="bin", data=bytes(range(256))),
            ],
        )
        after = int(time.time() * 1000)
        events = self.read_all(j, "s1")
        assert [(e.session_id, e.ordinal, e.type, e.data, e.request_id) for e in events] == [
            ("s1", 1, "message", b'{"jsonrpc":"2.0"}', "r-1"),
            ("s1", 2, "tool", b"", None),
            ("s1", 3, "bin", bytes(range(256)), None),
        ]
        for event in events:
            assert isinstance(event.timestamp_ms, int)
            assert before - 1000 <= event.timestamp_ms <= after + 1000
            assert isinstance(event.position, int) and event.position >= 1
            assert isinstance(event.cursor, str) and event.cursor

    def test_ordinals_are_per_session_and_positions_store_wide(self, j: Journal) -> None:
        j.create_session("a")
        j.create_session("b")
        for i in range(4):
            j.append("a", numbered(2, f"a{i}-"))
            j.append("b", numbered(1, f"b{i}-"))
        events_a = self.read_all(j, "a")
        events_b = self.read_all(j, "b")
        assert ordinals(events_a) == list(range(1, 9))
        assert ordinals(events_b) == list(range(1, 5))
        positions = sorted(e.position for e in events_a + events_b)
        assert len(set(positions)) == len(positions), "positions are never reused"
        assert [e.position for e in events_a] == sorted(e.position for e in events_a)
        # b's i-th event was committed after a's i-th pair and before the next pair.
        for i, event in enumerate(events_b):
            assert events_a[2 * i + 1].position < event.position
            if 2 * i + 2 < len(events_a):
                assert event.position < events_a[2 * i + 2].position

    def test_append_result_cursor_resumes_after_its_last_event(self, j: Journal) -> None:
        j.create_session("s1")
        res = j.append("s1", numbered(3, "a"))
        j.append("s1", numbered(2, "b"))
        assert ordinals(j.read("s1", cursor=res.cursor).events) == [4, 5]

    def test_expected_last_ordinal_that_matches_appends(self, j: Journal) -> None:
        j.create_session("s1")
        assert j.append("s1", numbered(2), expected_last_ordinal=0).last_ordinal == 2
        assert j.append("s1", numbered(1), expected_last_ordinal=2).last_ordinal == 3

    @pytest.mark.parametrize("expected", [0, 2, 4, 100])
    def test_wrong_expected_last_ordinal_raises_ordinal_conflict_and_writes_nothing(
        self, j: Journal, expected: int
    ) -> None:
        j.create_session("s1")
        j.append("s1", numbered(3))
        with raises(OrdinalConflict) as info:
            j.append("s1", numbered(2, "bad"), expected_last_ordinal=expected)
        assert (info.value.expected, info.value.actual) == (expected, 3)
        assert ordinals(self.read_all(j, "s1")) == [1, 2, 3]
        assert j.get_session("s1").last_ordinal == 3
        assert j.append("s1", numbered(1)).first_ordinal == 4

    def test_idempotent_retry_returns_original_result_and_appends_nothing(self, j: Journal) -> None:
        j.create_session("s1")
        j.append("s1", numbered(2, "pre"))
        batch = [EventIn(type="m", data=b"once", request_id="r1"), EventIn(type="m", data=b"2")]
        original = j.append("s1", batch, idempotency_key="key-1")
        assert not original.deduplicated
        j.append("s1", numbered(1, "between"))
        retry = j.append("s1", list(batch), idempotency_key="key-1")
        assert retry.deduplicated
        assert retry == msgspec.structs.replace(original, deduplicated=True)
        assert self.payloads(j, "s1") == [b"pre0:", b"pre1:", b"once", b"2", b"between0:"]
        assert j.get_session("s1").last_ordinal == 5

    def test_a_turn_request_id_runs_once_across_owners(self, j: Journal) -> None:
        j.create_session("s1")
        with j.own("s1") as owner, owner.turn("r1") as turn:
            turn.append(numbered(1))
        before = j.get_session("s1").last_ordinal
        with j.own("s1") as owner:
            with raises(TurnSettled) as info:
                owner.turn("r1")
            with owner.turn("r2"):
                pass
        assert info.value.result == {"status": "completed"}  # type: ignore[attr-defined]
        assert j.get_session("s1").last_ordinal == before + 2

    def test_owners_one_after_another_know_the_turns_ended_since_and_forget_compacted_ones(
        self, j: Journal
    ) -> None:
        """A journal keeps its last read of the session's turn results between owners and
        reads only the events after it (SPEC 7.8): what the events after it add is known,
        and a snapshot since makes the next owner read the history again."""
        j.create_session("s1")
        with j.own("s1") as owner:
            for request_id in ("r1", "r2"):
                with owner.turn(request_id):
                    pass
        j.append("s1", numbered(50))
        with j.own("s1") as owner:
            for settled in ("r1", "r2"):
                with raises(TurnSettled):
                    owner.turn(settled)
            with owner.turn("r3") as turn:
                turn.append(numbered(3))
        r1_result = next(e for e in self.read_all(j, "s1") if e.type == "turn_result")
        j.compact_session("s1", r1_result.ordinal, b"snap")
        with j.own("s1") as owner:
            for settled in ("r2", "r3"):
                with raises(TurnSettled):
                    owner.turn(settled)
            with owner.turn("r1"):  # (its result is under the snapshot: forgotten)
                pass
        started = [e.request_id for e in self.read_all(j, "s1") if e.type == "turn_started"]
        assert started == ["r2", "r3", "r1"]

    @pytest.mark.parametrize(
        "changed",
        [
            [EventIn(type="m", data=b"other")],
            [EventIn(type="other", data=b"once")],
            [EventIn(type="m", data=b"once", request_id="r2")],
            [EventIn(type="m", data=b"once"), EventIn(type="m", data=b"once")],
        ],
        ids=["data", "type", "request_id", "count"],
    )
    def test_idempotency_key_reused_with_different_events_raises_and_writes_nothing(
        self, j: Journal, changed: list[EventIn]
    ) -> None:
        j.create_session("s1")
        j.append("s1", [EventIn(type="m", data=b"once")], idempotency_key="key-1")
        with raises(IdempotencyKeyReused):
            j.append("s1", changed, idempotency_key="key-1")
        assert self.payloads(j, "s1") == [b"once"]
        assert j.get_session("s1").last_ordinal == 1

    def test_distinct_idempotency_keys_append_independently(self, j: Journal) -> None:
        j.create_session("s1")
        first = j.append("s1", evs(b"x"), idempotency_key="k1")
        second = j.append("s1", evs(b"x"), idempotency_key="k2")
        assert (first.first_ordinal, second.first_ordinal) == (1, 2)
        assert not second.deduplicated
        assert self.payloads(j, "s1") == [b"x", b"x"]

    @pytest.mark.parametrize(
        "events",
        [
            [],
            [EventIn(type="m", data="text")],
            [EventIn(type="m", data=None)],
            [EventIn(type="m", data=12)],
            [b"raw bytes"],
            [("m", b"tuple")],
            [{"type": "m", "data": b"dict"}],
            [EventIn(type="m", data=b"ok"), EventIn(type="m", data="not bytes")],
            [EventIn(type="m", data=b"ok"), "not an event"],
        ],
        ids=[
            "empty",
            "str-data",
            "none-data",
            "int-data",
            "bytes-item",
            "tuple-item",
            "dict-item",
            "valid-then-str-data",
            "valid-then-str-item",
        ],
    )
    def test_invalid_append_raises_invalid_argument_and_writes_nothing(
        self, j: Journal, events: list[Any]
    ) -> None:
        j.create_session("s1")
        j.append("s1", evs(b"before"))
        with raises(InvalidArgument):
            j.append("s1", events)
        assert self.payloads(j, "s1") == [b"before"]
        assert j.get_session("s1").last_ordinal == 1

    def test_events_that_are_not_a_list_or_tuple_are_refused_saying_what_to_pass(
        self, j: Journal
    ) -> None:
        j.create_session("s1")
        with raises(InvalidArgument) as refused:
            j.append("s1", (e for e in evs(b"a")))  # type: ignore[arg-type]
        assert "a list or tuple of EventIn, got a generator" in str(refused.value)
        assert "pass list(...)" in str(refused.value)
        assert j.append("s1", tuple(evs(b"a", b"b"))).last_ordinal == 2

    def test_one_event_not_in_a_list_is_refused_saying_to_wrap_it(self, j: Journal) -> None:
        # A runtime author's first append passed one EventIn: the message read "got a
        # EventIn" and did not say what to pass (a turn's append says the same).
        j.create_session("s1")
        one = EventIn(type="m", data=b"a")
        with raises(InvalidArgument) as refused:
            j.append("s1", one)  # type: ignore[arg-type]
        assert "got an EventIn: pass one event in a list, [event]" in str(refused.value)
        with raises(InvalidArgument) as refused:
            j.append("s1", 5)  # type: ignore[arg-type]
        assert "got an int" in str(refused.value)
        with j.own("s1") as owner, owner.turn("r1") as turn:
            with raises(InvalidArgument) as refused:
                turn.append(one)  # type: ignore[arg-type]
            assert "[event]" in str(refused.value)
            turn.append([one])
        assert [e.type for e in j.replay("s1")] == ["turn_started", "m", "turn_result"]

    def test_event_larger_than_max_event_bytes_is_refused(self, j: Journal) -> None:
        limit = journal.MAX_EVENT_BYTES
        assert limit == 8 << 20
        j.create_session("s1")
        with raises(InvalidArgument):
            too_big = [EventIn(type="m", data=b"ok"), EventIn(type="m", data=bytes(limit + 1))]
            j.append("s1", too_big)
        assert j.get_session("s1").last_ordinal == 0
        assert self.read_all(j, "s1") == []

    def test_event_of_exactly_max_event_bytes_is_accepted(self, j: Journal) -> None:
        limit = journal.MAX_EVENT_BYTES
        j.create_session("s1")
        payload = random.Random(7).randbytes(limit)
        res = j.append("s1", [EventIn(type="m", data=payload)])
        assert res.last_ordinal == 1
        page = j.read("s1", max_bytes=1)
        assert len(page.events) == 1
        assert page.events[0].data == payload

    def test_append_to_unknown_session_raises_session_not_found(self, j: Journal) -> None:
        with raises(SessionNotFound):
            j.append("nobody", evs(b"x"))
        with raises(SessionNotFound):
            j.get_session("nobody")

    def test_append_to_suspended_session_raises_and_writes_nothing(self, j: Journal) -> None:
        j.create_session("s1")
        j.append("s1", evs(b"a"))
        j.suspend_session("s1")
        with raises(SessionNotWritable):
            j.append("s1", evs(b"b"))
        assert self.payloads(j, "s1") == [b"a"]
        j.resume_session("s1")
        assert j.append("s1", evs(b"c")).first_ordinal == 2
        assert self.payloads(j, "s1") == [b"a", b"c"]

    @pytest.mark.parametrize("op", TERMINAL_OPS)
    def test_append_to_terminal_session_raises_and_writes_nothing(
        self, j: Journal, op: str
    ) -> None:
        j.create_session("s1", ttl_ms=60_000)
        j.append("s1", evs(b"a"))
        self.make_terminal(j, "s1", op)
        with raises(SessionNotWritable):
            j.append("s1", evs(b"b"))
        assert self.payloads(j, "s1") == [b"a"]
        assert j.get_session("s1").last_ordinal == 1

    # -- bounded pages and resume --------------------------------------------------------------

    def test_read_of_empty_session(self, j: Journal) -> None:
        j.create_session("s1")
        page = j.read("s1")
        assert isinstance(page, Page)
        assert (page.events, page.next_cursor, page.has_more) == ([], None, False)

    def test_read_of_unknown_session_raises_session_not_found(self, j: Journal) -> None:
        with raises(SessionNotFound):
            j.read("nobody")
        with raises(SessionNotFound):
            list(j.replay("nobody"))

    def test_pages_follow_the_byte_budget_rule(self, j: Journal, rng: random.Random) -> None:
        j.create_session("s1")
        sizes = [rng.choice([0, 1, 10, 100, 700, 3000, 20_000]) for _ in range(120)]
        sizes[rng.randrange(len(sizes))] = 70_000  # larger than any budget below
        payloads = [f"{i}:".encode() + rng.randbytes(size) for i, size in enumerate(sizes)]
        start = 0
        while start < len(payloads):
            count = rng.randint(1, 9)
            j.append("s1", [EventIn(type="m", data=p) for p in payloads[start : start + count]])
            start += count
        lengths = [len(p) for p in payloads]
        for _ in range(12):
            max_bytes = rng.choice([1, 50, 800, 5000, 30_000, 65_536, 1 << 20])
            cursor: str | None = None
            index = 0
            while True:
                page = j.read("s1", cursor=cursor, max_bytes=max_bytes)
                expected = page_length(lengths[index:], max_bytes)
                assert [e.data for e in page.events] == payloads[index : index + expected], (
                    f"max_bytes={max_bytes} from ordinal {index + 1}"
                )
                assert ordinals(page.events) == list(range(index + 1, index + expected + 1))
                index += expected
                assert page.has_more == (index < len(payloads))
                assert page.next_cursor == page.events[-1].cursor
                if not page.has_more:
                    break
                cursor = page.next_cursor
            assert index == len(payloads)

    def test_oversized_event_comes_through_whole_on_its_own_page(self, j: Journal) -> None:
        j.create_session("s1")
        big = bytes(range(256)) * 400
        j.append("s1", [*evs(b"small"), EventIn(type="m", data=big), *evs(b"after")])
        first = j.read("s1", max_bytes=10)
        assert [e.data for e in first.events] == [b"small"]
        assert first.has_more
        second = j.read("s1", cursor=first.next_cursor, max_bytes=10)
        assert [e.data for e in second.events] == [big]
        assert second.has_more
        third = j.read("s1", cursor=second.next_cursor, max_bytes=10)
        assert [e.data for e in third.events] == [b"after"]
        assert not third.has_more

    def test_default_page_budget_is_one_mebibyte(self, j: Journal) -> None:
        j.create_session("s1")
        j.append("s1", [EventIn(type="m", data=bytes(300_000)) for _ in range(5)])
        page = j.read("s1")
        assert ordinals(page.events) == [1, 2, 3]
        assert page.has_more

    def test_next_cursor_is_the_last_event_cursor(self, j: Journal) -> None:
        j.create_session("s1")
        j.append("s1", numbered(6))
        page = j.read("s1", max_bytes=5)
        assert page.next_cursor == page.events[-1].cursor
        resumed = j.read("s1", cursor=page.next_cursor)
        assert ordinals(resumed.events) == list(range(page.events[-1].ordinal + 1, 7))

    def test_empty_page_at_head_returns_the_cursor_passed_in(self, j: Journal) -> None:
        j.create_session("s1")
        res = j.append("s1", numbered(2))
        page = j.read("s1", cursor=res.cursor)
        assert (page.events, page.next_cursor, page.has_more) == ([], res.cursor, False)

    def test_resume_from_any_event_cursor_is_exclusive(self, j: Journal) -> None:
        j.create_session("s1")
        for i in range(5):
            j.append("s1", numbered(i + 1, f"b{i}-"))
        events = self.read_all(j, "s1")
        assert ordinals(events) == list(range(1, 16))
        for event in events:
            after = self.read_all(j, "s1", cursor=event.cursor)
            assert after == events[event.ordinal :]
            page = j.read("s1", cursor=event.cursor, max_bytes=1)
            assert ordinals(page.events) == ([event.ordinal + 1] if event.ordinal < 15 else [])

    def test_replay_crosses_many_pages(self, j: Journal) -> None:
        j.create_session("s1")
        payloads = [f"{i}:".encode() + bytes(40_000) for i in range(80)]  # > 3 default pages
        for start in range(0, 80, 10):
            j.append("s1", [EventIn(type="m", data=p) for p in payloads[start : start + 10]])
        events = self.read_all(j, "s1")
        assert [e.data for e in events] == payloads
        assert ordinals(self.read_all(j, "s1", cursor=events[29].cursor)) == list(range(31, 81))

    def test_every_read_signs_an_append_s_cursor_for_its_last_event(self, store_path: Path) -> None:
        """A cursor marks its whole event (SPEC 5): the cursor an append returns is the one
        every read signs for its last event, in this journal and after a reopen (replay,
        pages, watch, awatch, subscribe; plain, creating, keyed and retried appends, a
        turn's events, appends of two sessions committed together, empty, large and
        non-ASCII fields), and each resumes right after its event."""
        j = self.make_journal(store_path)
        results: list[AppendResult] = [j.append("s", [EventIn("m", b"")], create=True)]
        results.append(
            j.append(
                "s",
                [EventIn("m", b"one"), EventIn("t\u00e9", bytes(range(256)) * 300, "r-\u00fc")],
            )
        )
        keyed = [EventIn("m", b"k", request_id="q")]
        results.append(j.append("s", keyed, idempotency_key="k1"))
        results.append(j.append("s", keyed, idempotency_key="k1"))
        assert results[-1].deduplicated
        with j.own("s") as owner, owner.turn("t-1") as turn:
            assert turn.started is not None
            results.append(turn.started)
            results.append(turn.append([EventIn("m", "tr\u00eas".encode())]))
        assert turn.result is not None
        results.append(turn.result)

        def writer(session_id: str) -> None:
            for i in range(20):
                results.append(j.append(session_id, numbered(1 + i % 3, f"{session_id}{i}-")))

        j.create_session("u")
        threads = [threading.Thread(target=writer, args=(s,)) for s in ("s", "u", "s", "u")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        j.resolve_session("s")
        j.resolve_session("u")

        def check(j: Journal) -> None:
            for session_id in ("s", "u"):
                read = self.read_all(j, session_id)
                cursors = [e.cursor for e in read]
                for result in results:
                    if result.session_id == session_id:
                        assert cursors[result.last_ordinal - 1] == result.cursor, result
                        after = self.read_all(j, session_id, result.cursor)
                        assert after == read[result.last_ordinal :]
                for at, event in enumerate(read):
                    assert self.read_all(j, session_id, event.cursor) == read[at + 1 :]
                paged: list[str] = []
                page = j.read(session_id, max_bytes=1)
                while page.events:
                    assert page.next_cursor == page.events[-1].cursor
                    paged += [e.cursor for e in page.events]
                    page = j.read(session_id, cursor=page.next_cursor, max_bytes=3000)
                assert paged == cursors
                watcher = WatchThread(j, session_id)
                watcher.start()
                watcher.finish()
                assert [e.cursor for e in watcher.events] == cursors
                awatched: list[str] = []

                async def main() -> None:
                    async for event in j.awatch(session_id):  # noqa: B023
                        awatched.append(event.cursor)  # noqa: B023

                run_async(main)
                assert awatched == cursors
                delivered: list[str] = []
                done = threading.Event()

                def listener(event: Event) -> None:
                    delivered.append(event.cursor)  # noqa: B023
                    if len(delivered) == len(cursors):  # noqa: B023
                        done.set()  # noqa: B023

                sub = j.subscribe(session_id, listener)
                try:
                    assert done.wait(WAIT_S)
                finally:
                    sub()
                assert delivered == cursors

        try:
            check(j)
        finally:
            j.close()
        with self.make_journal(store_path) as reopened:
            check(reopened)

    def test_cursors_of_one_session_are_independent_of_other_sessions(self, j: Journal) -> None:
        j.create_session("a")
        j.create_session("b")
        res_a = j.append("a", evs(b"a1"))
        j.append("b", evs(b"b1", b"b2"))
        j.append("a", evs(b"a2"))
        assert [e.data for e in j.read("a", cursor=res_a.cursor).events] == [b"a2"]

    # -- cursor errors -----------------------------------------------------------------------

    def consume(self, j: Journal, api: str, session_id: str, cursor: str | None) -> list[Event]:
        """Read through `api` (read, replay or watch) from `cursor`; errors surface."""
        if api == "read":
            return j.read(session_id, cursor=cursor).events
        if api == "replay":
            return list(j.replay(session_id, cursor=cursor))
        with guarded_stop(5.0) as stop:
            return list(j.watch(session_id, cursor=cursor, stop=stop))

    @pytest.mark.parametrize("api", ["read", "replay", "watch"])
    @pytest.mark.parametrize(
        "garbage",
        ["", "garbage", "%%%%", "A" * 10, "A" * 200, "not a cursor at all, clearly"],
    )
    def test_garbage_cursor_raises_cursor_malformed(
        self, j: Journal, api: str, garbage: str
    ) -> None:
        j.create_session("s1")
        j.append("s1", evs(b"x"))
        with raises(CursorMalformed):
            self.consume(j, api, "s1", garbage)

    @pytest.mark.parametrize("api", ["read", "replay", "watch"])
    @pytest.mark.parametrize("damage", ["truncate", "extend"])
    def test_cursor_of_wrong_length_raises_cursor_malformed(
        self, j: Journal, api: str, damage: str
    ) -> None:
        j.create_session("s1")
        cursor = j.append("s1", evs(b"x")).cursor
        bad = cursor[:-1] if damage == "truncate" else cursor + "A"
        with raises(CursorMalformed):
            self.consume(j, api, "s1", bad)

    @pytest.mark.parametrize("api", ["read", "replay", "watch"])
    def test_cursor_with_altered_signature_raises_cursor_foreign(
        self, j: Journal, api: str
    ) -> None:
        j.create_session("s1")
        cursor = j.append("s1", evs(b"x")).cursor
        j.append("s1", evs(b"y"))
        with raises(CursorForeign):
            self.consume(j, api, "s1", flip_char(cursor, 45))

    @pytest.mark.parametrize("api", ["read", "replay", "watch"])
    def test_cursor_of_another_session_raises_cursor_foreign(self, j: Journal, api: str) -> None:
        j.create_session("a")
        j.create_session("b")
        cursor_a = j.append("a", evs(b"a1", b"a2")).cursor
        j.append("b", evs(b"b1", b"b2", b"b3"))
        with raises(CursorForeign):
            self.consume(j, api, "b", cursor_a)

    @pytest.mark.parametrize("api", ["read", "replay", "watch"])
    def test_cursor_from_another_store_raises_cursor_foreign(
        self, j: Journal, tmp_path: Path, api: str
    ) -> None:
        j.create_session("s1")
        j.append("s1", numbered(5))
        with self.make_journal(tmp_path / "other") as other:
            other.create_session("s1")
            foreign = other.append("s1", numbered(2)).cursor
        with raises(CursorForeign):
            self.consume(j, api, "s1", foreign)

    @pytest.mark.parametrize("api", ["read", "replay", "watch"])
    def test_lifecycle_cursor_raises_cursor_malformed(self, j: Journal, api: str) -> None:
        j.create_session("s1")
        j.append("s1", evs(b"x"))
        with guarded_stop() as stop:
            feed = j.watch_sessions(stop=stop)
            lifecycle_cursor = next_or_fail(feed).cursor
            close_feed(feed)
        with raises(CursorMalformed):
            self.consume(j, api, "s1", lifecycle_cursor)

    @pytest.mark.parametrize("api", ["read", "replay", "watch"])
    def test_page_token_raises_cursor_malformed(self, j: Journal, api: str) -> None:
        for i in range(3):
            j.create_session(f"s{i}")
        j.append("s1", evs(b"x"))
        token = j.list_sessions_page(page_size=1).next_page_token
        assert token
        with raises(CursorMalformed):
            self.consume(j, api, "s1", token)

    def restored_copy(self, tmp_path: Path) -> tuple[Path, str, list[str]]:
        """A backup of a store whose session s1 held events 1..4, taken before the
        original appended 5..7: (the backup, event 4's cursor, the cursors of events 6
        and 7 and of the append of 5..7, which the backup lacks)."""
        self.requires("copy_store")
        original = tmp_path / "store"
        backup = tmp_path / "backup"
        with self.make_journal(original) as j:
            j.create_session("s1")
            j.append("s1", numbered(4))
            shared = self.read_all(j, "s1")[-1].cursor
        self.copy_store(original, backup)
        with self.make_journal(original) as j:
            appended = j.append("s1", numbered(3, "later"))
            events = self.read_all(j, "s1")
            lost = [events[-2].cursor, events[-1].cursor, appended.cursor]
        return backup, shared, lost

    @pytest.mark.parametrize("api", ["read", "replay", "watch"])
    def test_cursor_beyond_session_head_raises_cursor_future(
        self, tmp_path: Path, api: str
    ) -> None:
        backup, _, lost = self.restored_copy(tmp_path)
        future = lost[1]  # event 7
        with self.make_journal(backup) as restored:
            assert restored.get_session("s1").last_ordinal == 4
            with raises(CursorFuture) as info:
                self.consume(restored, api, "s1", future)
            assert info.value.head_ordinal == 4
            # The restored store itself still reads as it was.
            assert ordinals(self.read_all(restored, "s1")) == [1, 2, 3, 4]

    @pytest.mark.parametrize("api", ["read", "replay", "watch"])
    def test_cursor_of_an_event_a_restored_copy_replaced_raises_cursor_foreign(
        self, tmp_path: Path, api: str
    ) -> None:
        # The copy's new events take the ordinals (and often the positions) of the events
        # the original had past the copy's head: a cursor of one of those must not resume
        # past the copy's own events without an error.
        backup, shared, lost = self.restored_copy(tmp_path)  # shared: event 4, in both
        time.sleep(0.005)  # (the copy's events are stamped later)
        with self.make_journal(backup) as restored:
            restored.append("s1", numbered(5, "new"))  # ordinals 5..9
            for cursor in lost:
                with raises(CursorForeign) as info:
                    self.consume(restored, api, "s1", cursor)
                assert "restored from an older copy" in str(info.value)
            # A cursor of an event both histories hold resumes as before.
            assert ordinals(self.read_all(restored, "s1", shared)) == [5, 6, 7, 8, 9]

    def _event_past_a_copy(self, tmp_path: Path, kept: int) -> tuple[Path, str]:
        """A copy of a store whose session s1 held `kept` events, and the cursor of the
        one event the original appended after the copy."""
        self.requires("copy_store")
        original = tmp_path / "store"
        backup = tmp_path / "backup"
        with self.make_journal(original) as j:
            j.create_session("s1")
            if kept:
                j.append("s1", numbered(kept))
        self.copy_store(original, backup)
        with self.make_journal(original) as j:
            return backup, j.append("s1", numbered(1, "later")).cursor

    @pytest.mark.parametrize("api", ["read", "replay", "watch"])
    def test_cursor_one_past_session_head_raises_cursor_future(
        self, tmp_path: Path, api: str
    ) -> None:
        # The boundary of CursorFuture: a cursor of the event just after the copy's head
        # (not only of one further on) must not read as "nothing new yet".
        backup, next_one = self._event_past_a_copy(tmp_path, 4)  # event 5
        with self.make_journal(backup) as restored:
            with raises(CursorFuture) as info:
                self.consume(restored, api, "s1", next_one)
            assert info.value.head_ordinal == 4

    @pytest.mark.parametrize("api", ["read", "replay", "watch"])
    def test_cursor_of_a_replaced_first_event_raises_cursor_foreign(
        self, tmp_path: Path, api: str
    ) -> None:
        # The check of the event a cursor was issued for covers the session's first
        # retained event too (ordinal == first_ordinal), not only the later ones.
        backup, lost = self._event_past_a_copy(tmp_path, 0)  # event 1
        time.sleep(0.005)  # (the copy's events are stamped later)
        with self.make_journal(backup) as restored:
            restored.append("s1", numbered(2, "new"))  # ordinals 1..2
            assert restored.get_session("s1").first_ordinal == 1
            with raises(CursorForeign) as info:
                self.consume(restored, api, "s1", lost)
            assert "restored from an older copy" in str(info.value)

    def _change_past_a_copy(self, tmp_path: Path) -> tuple[Path, str, LifecycleEvent]:
        """A copy of a store holding s1; the cursor of s1's startup snapshot; and the
        original's next change, made after the copy (s2 created)."""
        self.requires("copy_store")
        original = tmp_path / "store"
        backup = tmp_path / "backup"
        with self.make_journal(original) as j:
            j.create_session("s1")
            with guarded_stop(5.0) as stop:
                feed = j.watch_sessions(stop=stop)
                shared = next(feed).cursor  # the snapshot's: nothing after it is lost
                feed.close()
        self.copy_store(original, backup)
        with self.make_journal(original) as j:
            j.create_session("s2")
            with guarded_stop(5.0) as stop:
                feed = j.watch_sessions(cursor=shared, stop=stop)
                lost = next(feed)
                feed.close()
        assert (lost.event_type, lost.session.session_id) == (LifecycleEventType.CREATED, "s2")
        return backup, shared, lost

    def test_lifecycle_cursor_of_a_change_a_restored_copy_replaced_raises_cursor_foreign(
        self, tmp_path: Path
    ) -> None:
        backup, shared, lost = self._change_past_a_copy(tmp_path)
        time.sleep(0.005)  # (the copy's changes are stamped later)
        with self.make_journal(backup) as restored:
            restored.create_session("s3")  # the copy's change where the original had s2's
            restored.resolve_session("s3")
            with raises(CursorForeign) as info, guarded_stop(5.0) as stop:
                next(restored.watch_sessions(cursor=lost.cursor, stop=stop))
            assert "restored from an older copy" in str(info.value)
            with guarded_stop(5.0) as stop:
                feed = restored.watch_sessions(cursor=shared, stop=stop)
                resumed = next(feed)
                feed.close()
            assert (resumed.event_type, resumed.session.session_id) == (
                LifecycleEventType.CREATED,
                "s3",
            )

    def test_startup_snapshot_cursor_from_changes_a_restored_copy_lacks_is_foreign(
        self, tmp_path: Path
    ) -> None:
        # Operator trial: a supervisor saved the last cursor of its startup snapshot, which
        # listed s2; the store was restored from a copy without s2 and written since, and
        # resuming from that cursor silently gave the copy's later changes (s3 resolved),
        # never saying that s2 was gone or that s3 was created.
        self.requires("copy_store")
        original = tmp_path / "store"
        backup = tmp_path / "backup"
        with self.make_journal(original) as j:
            j.create_session("s1")
        self.copy_store(original, backup)
        with self.make_journal(original) as j:
            j.create_session("s2")
            j.append("s2", evs(b"after the change"))  # (the snapshot's point is past it)
            with guarded_stop(5.0) as stop:
                snapshot = list(itertools.islice(j.watch_sessions(stop=stop), 2))
            assert [e.session.session_id for e in snapshot] == ["s1", "s2"]
            saved = snapshot[-1].cursor
            j.create_session("s4")  # it still resumes after the snapshot here
            with guarded_stop(5.0) as stop:
                assert next(j.watch_sessions(cursor=saved, stop=stop)).session.session_id == "s4"
        time.sleep(0.005)  # (the copy's changes are stamped later)
        with self.make_journal(backup) as restored:
            for session_id in ("s3", "s5", "s6"):
                restored.create_session(session_id)
            restored.resolve_session("s3")
            with raises(CursorForeign) as info, guarded_stop(5.0) as stop:
                next(restored.watch_sessions(cursor=saved, stop=stop))
            assert "restored from an older copy" in str(info.value)

    def test_lifecycle_cursor_one_past_a_restored_copys_feed_raises_cursor_future(
        self, tmp_path: Path
    ) -> None:
        # The boundary of the lifecycle feed's CursorFuture: the cursor of the change just
        # after the copy's last one (the copy took no writes since).
        backup, _, lost = self._change_past_a_copy(tmp_path)
        with (
            self.make_journal(backup) as restored,
            raises(CursorFuture),
            guarded_stop(5.0) as stop,
        ):
            next(restored.watch_sessions(cursor=lost.cursor, stop=stop))

    # -- listing sessions ----------------------------------------------------------------------

    def test_list_sessions_page_pages_in_session_id_order(
        self, j: Journal, rng: random.Random
    ) -> None:
        ids = [f"s-{i:03d}" for i in range(23)] + ["A", "Z", "a", "z", "s"]
        rng.shuffle(ids)
        for session_id in ids:
            j.create_session(session_id)
        pages = []
        token: str | None = None
        while True:
            page = j.list_sessions_page(page_size=7, page_token=token)
            assert isinstance(page, SessionPage)
            pages.append(page)
            if page.next_page_token == "":
                break
            token = page.next_page_token
            assert len(pages) < 20, "listing does not end"
        assert [len(p.sessions) for p in pages] == [7, 7, 7, 7]
        assert listing(pages) == sorted(ids)
        assert all(
            meta == j.get_session(meta.session_id) for page in pages for meta in page.sessions
        )

    def test_list_sessions_page_of_empty_store(self, j: Journal) -> None:
        page = j.list_sessions_page()
        assert (page.sessions, page.next_page_token) == ([], "")

    def test_list_sessions_page_exact_fit_ends_with_empty_token(self, j: Journal) -> None:
        for i in range(4):
            j.create_session(f"s{i}")
        first = j.list_sessions_page(page_size=2)
        assert first.next_page_token
        second = j.list_sessions_page(page_size=2, page_token=first.next_page_token)
        assert [m.session_id for m in second.sessions] == ["s2", "s3"]
        if second.next_page_token:
            third = j.list_sessions_page(page_size=2, page_token=second.next_page_token)
            assert (third.sessions, third.next_page_token) == ([], "")

    def test_list_sessions_page_is_keyset_paged(self, j: Journal) -> None:
        for name in ("b", "d", "f", "h"):
            j.create_session(name)
        first = j.list_sessions_page(page_size=2)
        assert [m.session_id for m in first.sessions] == ["b", "d"]
        j.create_session("a")  # before the key: not seen by this listing
        j.create_session("e")  # after the key: seen
        rest = j.list_sessions_page(page_size=10, page_token=first.next_page_token)
        assert [m.session_id for m in rest.sessions] == ["e", "f", "h"]
        assert rest.next_page_token == ""

    def test_list_sessions_page_default_size_is_100(self, j: Journal) -> None:
        for i in range(105):
            j.create_session(f"s{i:04d}")
        page = j.list_sessions_page()
        assert len(page.sessions) == 100
        assert page.next_page_token
        rest = j.list_sessions_page(page_token=page.next_page_token)
        assert [m.session_id for m in rest.sessions] == [f"s{i:04d}" for i in range(100, 105)]
        assert rest.next_page_token == ""

    def test_list_sessions_page_clamps_page_size_to_1000(self, j: Journal) -> None:
        for i in range(1003):
            j.create_session(f"s{i:05d}")
        page = j.list_sessions_page(page_size=5000)
        assert len(page.sessions) == 1000
        assert page.next_page_token
        rest = j.list_sessions_page(page_size=5000, page_token=page.next_page_token)
        assert [m.session_id for m in rest.sessions] == ["s01000", "s01001", "s01002"]

    @pytest.mark.parametrize("page_size", [0, -1, -100])
    def test_list_sessions_page_size_below_one_raises_invalid_argument(
        self, j: Journal, page_size: int
    ) -> None:
        j.create_session("s1")
        with raises(InvalidArgument):
            j.list_sessions_page(page_size=page_size)

    def test_list_sessions_page_filters_by_state(self, j: Journal) -> None:
        states: dict[str, SessionState] = {}
        for i in range(20):
            session_id = f"s{i:02d}"
            op = ["open", "suspend", "resolve", "cancel", "expire"][i % 5]
            # Only sessions about to expire get a ttl, so expire_due takes just that one.
            j.create_session(session_id, ttl_ms=60_000 if op == "expire" else None)
            if op == "suspend":
                j.suspend_session(session_id)
            elif op != "open":
                self.make_terminal(j, session_id, op)
            states[session_id] = j.get_session(session_id).state
        for state in SessionState:
            pages = []
            token: str | None = None
            while True:
                page = j.list_sessions_page(page_size=3, page_token=token, state=state)
                pages.append(page)
                assert all(m.state is state for m in page.sessions)
                if not page.next_page_token:
                    break
                token = page.next_page_token
            assert listing(pages) == sorted(s for s, st in states.items() if st is state)
        assert listing([j.list_sessions_page(page_size=1000)]) == sorted(states)

    @pytest.mark.parametrize(
        "filters",
        [
            (None, SessionState.OPEN),
            (SessionState.OPEN, None),
            (SessionState.OPEN, SessionState.RESOLVED),
        ],
    )
    def test_page_token_of_a_listing_with_another_filter_raises_invalid_page_token(
        self, j: Journal, filters: tuple[SessionState | None, SessionState | None]
    ) -> None:
        issued_for, used_with = filters
        for i in range(6):
            j.create_session(f"s{i}")
        j.resolve_session("s4")
        j.resolve_session("s5")
        token = j.list_sessions_page(page_size=1, state=issued_for).next_page_token
        assert token
        with raises(InvalidPageToken):
            j.list_sessions_page(page_size=1, page_token=token, state=used_with)

    def test_page_token_from_another_store_raises_invalid_page_token(
        self, j: Journal, tmp_path: Path
    ) -> None:
        for i in range(3):
            j.create_session(f"s{i}")
        with self.make_journal(tmp_path / "other") as other:
            for i in range(3):
                other.create_session(f"s{i}")
            foreign = other.list_sessions_page(page_size=1).next_page_token
        assert foreign
        with raises(InvalidPageToken):
            j.list_sessions_page(page_size=1, page_token=foreign)

    def test_a_page_token_of_another_state_filter_says_to_pass_the_same(self, j: Journal) -> None:
        """It said "another store or listing", which a new user read as "another page
        size" (which the token does not bind; until 2026-12-05)."""
        for i in range(3):
            j.create_session(f"s{i}")
        token = j.list_sessions_page(page_size=1).next_page_token
        assert token
        with raises(InvalidPageToken) as refused:
            j.list_sessions_page(page_size=1, page_token=token, state=SessionState.OPEN)
        assert "its state filter: pass the one its first page" in str(refused.value)
        assert j.list_sessions_page(page_size=2, page_token=token).sessions  # (any size)

    @pytest.mark.parametrize("index", [0, 5, 20, 30, 45, 57, 58])
    def test_tampered_page_token_raises_invalid_page_token(self, j: Journal, index: int) -> None:
        for i in range(3):
            j.create_session(f"s{i}")
        token = j.list_sessions_page(page_size=1).next_page_token
        assert token
        with raises(InvalidPageToken):
            j.list_sessions_page(page_size=1, page_token=flip_char(token, index))

    @pytest.mark.parametrize("garbage", ["garbage", "A" * 59, "%%%", "x" * 300, "token!"])
    def test_garbage_page_token_raises_invalid_page_token(self, j: Journal, garbage: str) -> None:
        j.create_session("s1")
        with raises(InvalidPageToken):
            j.list_sessions_page(page_token=garbage)

    @pytest.mark.parametrize("token", [0, False, b"", [], 5, b"x"])
    def test_a_page_token_that_is_not_a_str_is_named_and_told_what_to_pass(
        self, j: Journal, token: object
    ) -> None:
        # (Until 2026-12-05 a falsy one, 0, False, b"" or [], said only "page_token must
        # be a str", where a truthy one named its type and what to pass: supervisor
        # a trial.)
        j.create_session("s1")
        with raises(InvalidPageToken) as refused:
            j.list_sessions_page(page_token=token)  # type: ignore[arg-type]
        message = str(refused.value)
        assert f"must be a str, not {type(token).__name__}" in message
        assert "omit it to start from the first page" in message

    def test_session_cursor_as_page_token_raises_invalid_page_token(self, j: Journal) -> None:
        j.create_session("s1")
        cursor = j.append("s1", evs(b"x")).cursor
        with raises(InvalidPageToken):
            j.list_sessions_page(page_token=cursor)

    def test_list_sessions_of_a_closed_journal_raises_when_called(self, j: Journal) -> None:
        # (As `watch_sessions` and `list_sessions_page` do; until 2026-12-05 it gave back
        # an iterator that raised at its first item: a supervisor trial.)
        j.create_session("s1")
        j.close()
        with pytest.raises(journal.JournalClosed):
            j.list_sessions()

    def test_list_sessions_is_lazy_and_complete(self, j: Journal, rng: random.Random) -> None:
        ids = [f"s{i:03d}" for i in range(37)]
        rng.shuffle(ids)
        for session_id in ids:
            j.create_session(session_id)
        for session_id in ids[:10]:
            j.resolve_session(session_id)
        everything = j.list_sessions(page_size=4)
        assert isinstance(everything, Iterator)
        assert [m.session_id for m in everything] == sorted(ids)
        resolved = [m.session_id for m in j.list_sessions(state=SessionState.RESOLVED)]
        assert resolved == sorted(ids[:10])
        opened = [m.session_id for m in j.list_sessions(state=SessionState.OPEN, page_size=3)]
        assert opened == sorted(ids[10:])

    # -- watch -------------------------------------------------------------------------------

    @pytest.mark.parametrize("op", TERMINAL_OPS)
    def test_watch_ends_by_itself_for_a_terminal_session_after_draining(
        self, j: Journal, op: str
    ) -> None:
        j.create_session("s1", ttl_ms=60_000)
        for i in range(5):
            j.append("s1", numbered(3, f"b{i}-", size=100))
        self.make_terminal(j, "s1", op)
        watcher = WatchThread(j, "s1")
        watcher.start()
        watcher.finish()
        assert ordinals(watcher.events) == list(range(1, 16))
        assert watcher.events == self.read_all(j, "s1")

    def test_watch_from_cursor_of_a_resolved_session_yields_the_rest_and_ends(
        self, j: Journal
    ) -> None:
        j.create_session("s1")
        res = j.append("s1", numbered(4))
        j.append("s1", numbered(3))
        j.resolve_session("s1")
        watcher = WatchThread(j, "s1", cursor=res.cursor)
        watcher.start()
        watcher.finish()
        assert ordinals(watcher.events) == [5, 6, 7]

    def test_watch_ends_when_session_is_resolved_while_following(self, j: Journal) -> None:
        j.create_session("s1")
        j.append("s1", numbered(2))
        watcher = WatchThread(j, "s1")
        watcher.start()
        watcher.wait_for(2)
        j.append("s1", numbered(1))
        j.resolve_session("s1")
        watcher.finish()
        assert ordinals(watcher.events) == [1, 2, 3]

    def test_watch_stop_event_ends_an_idle_watch_promptly(self, j: Journal) -> None:
        j.create_session("s1")
        j.append("s1", numbered(3))
        watcher = WatchThread(j, "s1")
        watcher.start()
        watcher.wait_for(3)
        time.sleep(0.2)  # idle: caught up with the head
        assert watcher.is_alive(), "watch of an open session ended by itself"
        started = time.monotonic()
        watcher.stop.set()
        watcher.join(WAIT_S)
        elapsed = time.monotonic() - started
        assert not watcher.is_alive(), "watch ignored its stop event"
        assert elapsed < PROMPT_S, f"watch took {elapsed:.3f}s to stop"
        assert watcher.error is None, repr(watcher.error)
        assert ordinals(watcher.events) == [1, 2, 3]

    @pytest.mark.parametrize("kind", ["watch", "watch_sessions"])
    def test_closing_a_stream_another_thread_iterates_ends_it_promptly(
        self, j: Journal, kind: str
    ) -> None:
        """`close()` from another thread raised ValueError ("generator already
        executing") and left the iterating thread waiting for ever."""
        j.create_session("s1")
        j.append("s1", numbered(2))
        with guarded_stop() as stop:  # (only if close() fails: ends the thread anyway)
            stream: Stream[Any] = (
                j.watch("s1", stop=stop) if kind == "watch" else j.watch_sessions(stop=stop)
            )
            items: list[Any] = []
            errors: list[BaseException] = []

            def iterate() -> None:
                try:
                    items.extend(stream)
                except BaseException as error:
                    errors.append(error)

            thread = threading.Thread(target=iterate, daemon=True)
            thread.start()
            deadline = time.monotonic() + WAIT_S
            while not items and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.1)  # idle: caught up with the head
            started = time.monotonic()
            stream.close()
            thread.join(WAIT_S)
            elapsed = time.monotonic() - started
            assert not thread.is_alive(), "the stream went on after close()"
            assert elapsed < PROMPT_S, f"the stream took {elapsed:.3f}s to end"
            assert errors == [] and len(items) == (2 if kind == "watch" else 1)

    def test_watch_follows_appends_from_another_thread_live(self, j: Journal) -> None:
        j.create_session("s1")
        watcher = WatchThread(j, "s1")
        watcher.start()
        time.sleep(0.05)
        for i in range(1, 41):
            j.append("s1", numbered(1, f"live{i}-"))
            watcher.wait_for(i)  # each event arrives while the writer waits
        j.resolve_session("s1")
        watcher.finish()
        assert [e.data for e in watcher.events] == [f"live{i}-0:".encode() for i in range(1, 41)]

    def test_watch_switch_from_replay_to_live_has_no_gap_or_duplicate(
        self, j: Journal, rng: random.Random
    ) -> None:
        # The writer starts together with the watcher, so its appends land while the watch
        # is still replaying, switching to live, or already live.
        for round_ in range(3):
            session_id = f"s{round_}"
            j.create_session(session_id)
            for i in range(0, 300, 10):
                j.append(session_id, numbered(10, f"pre{i}-", size=rng.randrange(200)))
            batch_sizes = [rng.randint(1, 5) for _ in range(80)]
            barrier = threading.Barrier(2)
            writer = threading.Thread(
                target=self._write_batches_then_resolve,
                args=(j, session_id, batch_sizes, barrier),
                daemon=True,
            )
            watcher = WatchThread(j, session_id, cursor=None)
            writer.start()
            watcher.start()
            barrier.wait()
            writer.join(WAIT_S)
            assert not writer.is_alive()
            watcher.finish()
            total = 300 + sum(batch_sizes)
            assert ordinals(watcher.events) == list(range(1, total + 1))
            assert watcher.events == self.read_all(j, session_id)

    @staticmethod
    def _write_batches_then_resolve(
        j: Journal, session_id: str, batch_sizes: list[int], barrier: threading.Barrier
    ) -> None:
        barrier.wait()
        for n, size in enumerate(batch_sizes):
            j.append(session_id, numbered(size, f"live{n}-"))
            if n % 10 == 0:
                time.sleep(0.001)
        j.resolve_session(session_id)

    def test_watch_of_unknown_session_raises_session_not_found(self, j: Journal) -> None:
        with raises(SessionNotFound), guarded_stop(5.0) as stop:
            list(j.watch("nobody", stop=stop))

    # -- awatch ------------------------------------------------------------------------------

    def test_awatch_follows_live_appends_and_ends_for_resolved_session(
        self, j: Journal, rng: random.Random
    ) -> None:
        j.create_session("s1")
        j.append("s1", numbered(50, "pre"))
        batch_sizes = [rng.randint(1, 6) for _ in range(40)]

        def write() -> None:
            for n, size in enumerate(batch_sizes):
                j.append("s1", numbered(size, f"live{n}-"))
                if n % 5 == 0:
                    time.sleep(0.002)
            j.resolve_session("s1")

        received: list[Event] = []

        async def main() -> None:
            async def consume() -> None:
                async for event in j.awatch("s1"):
                    received.append(event)

            task = asyncio.create_task(consume())
            await asyncio.sleep(0)
            await asyncio.to_thread(write)
            await asyncio.wait_for(task, WAIT_S)

        run_async(main)
        assert ordinals(received) == list(range(1, 51 + sum(batch_sizes)))
        assert received == self.read_all(j, "s1")

    def test_awatch_resumes_from_cursor_exclusively(self, j: Journal) -> None:
        j.create_session("s1")
        cursor = j.append("s1", numbered(3)).cursor
        j.append("s1", numbered(2))
        j.resolve_session("s1")
        received: list[int] = []

        async def main() -> None:
            async for event in j.awatch("s1", cursor=cursor):
                received.append(event.ordinal)

        run_async(main)
        assert received == [4, 5]

    def test_awatch_cancellation_ends_it_cleanly(self, j: Journal) -> None:
        j.create_session("s1")
        j.append("s1", numbered(3))
        received: list[int] = []

        async def main() -> None:
            async def consume() -> None:
                async for event in j.awatch("s1"):
                    received.append(event.ordinal)

            task = asyncio.create_task(consume())
            deadline = time.monotonic() + WAIT_S
            while len(received) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.1)  # idle at the head
            assert not task.done(), "awatch of an open session ended by itself"
            started = time.monotonic()
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=WAIT_S)
            assert task in done, "awatch did not react to cancellation"
            assert time.monotonic() - started < PROMPT_S
            assert task.cancelled(), repr(task.exception())

        run_async(main)
        assert received == [1, 2, 3]
        # The journal is unaffected: writers and new watches carry on.
        j.append("s1", numbered(1))
        j.resolve_session("s1")
        watcher = WatchThread(j, "s1")
        watcher.start()
        watcher.finish()
        assert ordinals(watcher.events) == [1, 2, 3, 4]

    def test_awatch_raises_cursor_errors(self, j: Journal) -> None:
        j.create_session("s1")
        j.append("s1", evs(b"x"))

        async def main() -> None:
            async for _ in j.awatch("s1", cursor="garbage"):
                pass

        with raises(CursorMalformed):
            run_async(main)

    # -- watch_sessions ----------------------------------------------------------------------

    def _lifecycle_fixture(self, j: Journal) -> dict[str, SessionMetadata]:
        j.create_session("a", tags={"k": "a"})
        j.create_session("b")
        j.suspend_session("b")
        j.create_session("c")
        j.append("c", numbered(2))
        j.resolve_session("c")
        return {s: j.get_session(s) for s in ("a", "b", "c")}

    def test_watch_sessions_starts_with_one_created_per_session(self, j: Journal) -> None:
        current = self._lifecycle_fixture(j)
        with guarded_stop() as stop:
            feed = j.watch_sessions(stop=stop)
            snapshot = [next_or_fail(feed) for _ in current]
            close_feed(feed)
        assert all(isinstance(e, LifecycleEvent) for e in snapshot)
        assert [e.event_type for e in snapshot] == [LifecycleEventType.CREATED] * 3
        assert {e.session.session_id: e.session for e in snapshot} == current
        assert all(isinstance(e.cursor, str) and e.cursor for e in snapshot)
        assert all(isinstance(e.observed_at_ms, int) for e in snapshot)

    def _live_actions(self, j: Journal, tag: str) -> list[tuple[LifecycleEventType, str]]:
        """Do one of each lifecycle change; return what watch_sessions should report."""
        d, e = f"d{tag}", f"e{tag}"
        meta = j.create_session(d, ttl_ms=600_000)
        j.suspend_session("a")
        j.resume_session("a")
        j.create_session(e)
        j.cancel_session(e)
        j.expire_due(now_ms=meta.created_at_ms + 600_000)
        return [
            (LifecycleEventType.CREATED, d),
            (LifecycleEventType.SUSPENDED, "a"),
            (LifecycleEventType.RESUMED, "a"),
            (LifecycleEventType.CREATED, e),
            (LifecycleEventType.CANCELLED, e),
            (LifecycleEventType.EXPIRED, d),
        ]

    def test_watch_sessions_follows_live_changes_after_the_snapshot(self, j: Journal) -> None:
        current = self._lifecycle_fixture(j)
        with guarded_stop() as stop:
            feed = j.watch_sessions(stop=stop)
            for _ in current:
                next_or_fail(feed)
            expected = self._live_actions(j, "1")
            expected.append((LifecycleEventType.RESOLVED, "a"))
            resolved_a = j.resolve_session("a")
            live = [next_or_fail(feed) for _ in expected]
            close_feed(feed)
        assert [(e.event_type, e.session.session_id) for e in live] == expected
        states = [e.session.state for e in live]
        assert states == [
            SessionState.OPEN,
            SessionState.SUSPENDED,
            SessionState.OPEN,
            SessionState.OPEN,
            SessionState.CANCELLED,
            SessionState.EXPIRED,
            SessionState.RESOLVED,
        ]
        assert live[-1].session == resolved_a

    def test_watch_sessions_resumes_from_cursor_without_snapshot(self, j: Journal) -> None:
        self._lifecycle_fixture(j)
        with guarded_stop() as stop:
            feed = j.watch_sessions(stop=stop)
            for _ in range(3):
                next_or_fail(feed)
            expected = self._live_actions(j, "1")
            live = [next_or_fail(feed) for _ in expected]
            close_feed(feed)
        # Resume from the cursor of the 2nd live event: events 3.. then new ones, no snapshot.
        later = self._live_actions(j, "2")
        with guarded_stop() as stop:
            resumed_feed = j.watch_sessions(cursor=live[1].cursor, stop=stop)
            resumed = [next_or_fail(resumed_feed) for _ in range(len(expected) - 2 + len(later))]
            close_feed(resumed_feed)
        assert [(e.event_type, e.session.session_id) for e in resumed] == expected[2:] + later

    def test_watch_sessions_resume_from_snapshot_cursor_has_no_gap(self, j: Journal) -> None:
        self._lifecycle_fixture(j)
        with guarded_stop() as stop:
            feed = j.watch_sessions(stop=stop)
            snapshot = [next_or_fail(feed) for _ in range(3)]
            close_feed(feed)
        expected = self._live_actions(j, "1")
        with guarded_stop() as stop:
            resumed_feed = j.watch_sessions(cursor=snapshot[-1].cursor, stop=stop)
            resumed = [next_or_fail(resumed_feed) for _ in expected]
            close_feed(resumed_feed)
        assert [(e.event_type, e.session.session_id) for e in resumed] == expected

    def test_watch_sessions_resumed_from_inside_its_snapshot_skips_no_session(
        self, j: Journal
    ) -> None:
        """Every startup snapshot event carried the snapshot's cursor, which resumes with
        the changes after the snapshot: a watcher (or a subscription's `cursor`) stopped
        after the first CREATED never heard of the other sessions. Such a cursor resumes
        with the snapshot's sessions after the ones delivered now (until 2026-12-04 with
        a fresh snapshot, "a" again); the last snapshot event's still resumes after it."""
        self._lifecycle_fixture(j)
        with guarded_stop() as stop:
            feed = j.watch_sessions(stop=stop)
            first = next_or_fail(feed)
            close_feed(feed)
        j.create_session("d")
        with guarded_stop() as stop:
            resumed_feed = j.watch_sessions(cursor=first.cursor, stop=stop)
            resumed = [next_or_fail(resumed_feed) for _ in range(3)]
            close_feed(resumed_feed)
        assert [(e.event_type, e.session.session_id, e.in_snapshot) for e in resumed] == [
            (LifecycleEventType.CREATED, s, True) for s in ("b", "c", "d")
        ]
        with guarded_stop() as stop:
            resumed_feed = j.watch_sessions(cursor=resumed[-1].cursor, stop=stop)
            j.suspend_session("a")
            after = next_or_fail(resumed_feed)
            close_feed(resumed_feed)
        assert (after.event_type, after.session.session_id) == (
            LifecycleEventType.SUSPENDED,
            "a",
        )

    def _take_lifecycle(
        self, j: Journal, api: str, cursor: str | None, count: int
    ) -> list[LifecycleEvent]:
        """The first `count` lifecycle events after `cursor`, by `api`; then it stops."""
        if api == "watch":
            with guarded_stop() as stop:
                feed = j.watch_sessions(cursor, stop=stop)
                try:
                    return [next_or_fail(feed) for _ in range(count)]
                finally:
                    close_feed(feed)
        got: list[LifecycleEvent] = []
        if api == "awatch":

            async def main() -> None:
                feed = j.awatch_sessions(cursor)
                try:
                    for _ in range(count):
                        got.append(await asyncio.wait_for(anext(feed), WAIT_S))
                finally:
                    await feed.aclose()  # type: ignore[attr-defined]

            run_async(main)
            return got
        enough = threading.Event()

        def listener(event: LifecycleEvent) -> None:
            if len(got) < count:  # (those after it are lost: the supervisor stopped)
                got.append(event)
            if len(got) == count:
                enough.set()

        subscription = j.subscribe_sessions(listener, cursor)
        try:
            assert enough.wait(WAIT_S), f"{len(got)} of {count} events delivered"
        finally:
            subscription.close()
        return got

    @pytest.mark.parametrize("api", ["watch", "awatch", "subscribe"])
    def test_a_watcher_restarted_inside_its_startup_snapshot_makes_progress(
        self, j: Journal, api: str
    ) -> None:
        """A supervisor that saves each lifecycle event's cursor and is restarted every 50
        events, over 200 sessions: until 2026-12-04 every snapshot event but the last
        resumed with a fresh snapshot from the first session, so it was given the first 50
        again and again and never reached the live feed (supervisor-author trial). Now a
        snapshot event's cursor resumes after the sessions already delivered: first the
        changes of those since (a transition, a session created with an id before the last
        delivered one), then the snapshot's other sessions, each once."""
        ids = [f"s{i:03d}" for i in range(200)]
        for session in ids:
            j.create_session(session)
        cursor: str | None = None
        got: list[LifecycleEvent] = []
        for round_ in range(8):
            batch = self._take_lifecycle(j, api, cursor, min(50, len(ids) + 3 - len(got)))
            got += batch
            cursor = batch[-1].cursor
            if round_ == 0:
                j.suspend_session("s010")  # (delivered already)
                j.create_session("s010a")  # (after the snapshot, before the last delivered)
                j.create_session("s150a")  # (after it)
            if len(got) == len(ids) + 3:
                break
        seen = [(e.event_type, e.session.session_id) for e in got]
        created = [s for kind, s in seen if kind is LifecycleEventType.CREATED]
        assert len(created) == len(set(created)), "a session delivered twice"
        assert sorted(created) == sorted([*ids, "s010a", "s150a"])
        assert seen[50:52] == [
            (LifecycleEventType.SUSPENDED, "s010"),
            (LifecycleEventType.CREATED, "s010a"),
        ]
        assert [e.in_snapshot for e in got[50:52]] == [False, False]
        assert all(e.in_snapshot for i, e in enumerate(got) if not 50 <= i < 52)
        states = {e.session.session_id: e.session.state for e in got}
        assert states == {m.session_id: m.state for m in j.list_sessions()}
        # Past the snapshot, the next restart is in the live feed.
        j.create_session("t-live")
        (live,) = self._take_lifecycle(j, api, cursor, 1)
        assert (live.event_type, live.session.session_id, live.in_snapshot) == (
            LifecycleEventType.CREATED,
            "t-live",
            False,
        )

    @pytest.mark.parametrize("changes", [3, SNAPSHOT_REUSE + 6])
    def test_watch_sessions_started_while_another_delivers_its_snapshot(
        self, j: Journal, changes: int
    ) -> None:
        """A follow that starts while another still delivers its startup snapshot takes
        that snapshot when at most `SNAPSHOT_REUSE` changes came after it, and then those
        changes (a fresh snapshot otherwise): either way every session comes once, as it
        is now."""
        sessions = [f"s{i:03d}" for i in range(SNAPSHOT_PAGE + 6)]  # (more than a page)
        for session in sessions:
            j.create_session(session)
        with guarded_stop() as stop:
            first = j.watch_sessions(stop=stop)
            next_or_fail(first)  # (it holds its snapshot now)
            for i in range(changes):
                if i % 3 == 0:
                    j.create_session(f"n{i:03d}")
                elif i % 3 == 1:
                    j.cancel_session(sessions[i])
                else:
                    j.suspend_session(sessions[i])
            j.create_session("last")
            second = j.watch_sessions(stop=stop)
            total = len(sessions) + len(range(0, changes, 3)) + 1
            got: list[LifecycleEvent] = []
            while len({e.session.session_id for e in got}) < total:
                got.append(next_or_fail(second))
            close_feed(second)
            close_feed(first)
        created = [e.session.session_id for e in got if e.event_type is LifecycleEventType.CREATED]
        assert len(created) == len(set(created)) == total
        states = {e.session.session_id: e.session.state for e in got}
        assert states == {m.session_id: m.state for m in j.list_sessions()}
        if changes <= SNAPSHOT_REUSE:  # (the first's snapshot, then the changes after it)
            assert created[: len(sessions)] == sessions
            assert len(got) == len(sessions) + changes + 1
            assert got[-1].session.session_id == "last"
        else:  # (a snapshot of its own: in id order, and nothing after it)
            assert created == sorted(created)
            assert len(got) == len(created)

    def test_watch_sessions_stop_event_ends_it_promptly(self, j: Journal) -> None:
        self._lifecycle_fixture(j)
        got: list[LifecycleEvent] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                got.extend(j.watch_sessions(stop=stop))
            except BaseException as error:
                errors.append(error)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        time.sleep(0.3)
        assert thread.is_alive(), "watch_sessions ended by itself"
        started = time.monotonic()
        stop.set()
        thread.join(WAIT_S)
        assert not thread.is_alive(), "watch_sessions ignored its stop event"
        assert time.monotonic() - started < PROMPT_S
        assert errors == []
        assert len(got) == 3

    def test_awatch_sessions_snapshot_live_and_cancellation(self, j: Journal) -> None:
        self._lifecycle_fixture(j)
        got: list[LifecycleEvent] = []

        async def main() -> None:
            async def consume() -> None:
                async for event in j.awatch_sessions():
                    got.append(event)

            task = asyncio.create_task(consume())
            deadline = time.monotonic() + WAIT_S
            while len(got) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            await asyncio.to_thread(j.suspend_session, "a")
            while len(got) < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=WAIT_S)
            assert task in done, "awatch_sessions did not react to cancellation"
            assert task.cancelled(), repr(task.exception())

        run_async(main)
        assert [e.event_type for e in got] == [LifecycleEventType.CREATED] * 3 + [
            LifecycleEventType.SUSPENDED
        ]
        assert {e.session.session_id for e in got[:3]} == {"a", "b", "c"}
        assert got[3].session.state is SessionState.SUSPENDED

    def test_awatch_sessions_resumes_from_cursor(self, j: Journal) -> None:
        self._lifecycle_fixture(j)
        with guarded_stop() as stop:
            feed = j.watch_sessions(stop=stop)
            for _ in range(3):
                next_or_fail(feed)
            j.suspend_session("a")
            cursor = next_or_fail(feed).cursor
            close_feed(feed)
        j.resume_session("a")
        got: list[LifecycleEvent] = []

        async def main() -> None:
            async def consume() -> None:
                async for event in j.awatch_sessions(cursor=cursor):
                    got.append(event)
                    return

            await asyncio.wait_for(consume(), WAIT_S)

        run_async(main)
        assert [(e.event_type, e.session.session_id) for e in got] == [
            (LifecycleEventType.RESUMED, "a")
        ]

    @pytest.mark.parametrize("kind", ["garbage", "session-cursor", "page-token"])
    def test_watch_sessions_rejects_other_tokens_as_malformed(self, j: Journal, kind: str) -> None:
        for i in range(3):
            j.create_session(f"s{i}")
        if kind == "garbage":
            bad = "garbage"
        elif kind == "session-cursor":
            bad = j.append("s0", evs(b"x")).cursor
        else:
            bad = j.list_sessions_page(page_size=1).next_page_token
        with raises(CursorMalformed), guarded_stop(5.0) as stop:
            next(j.watch_sessions(cursor=bad, stop=stop))

    def test_watch_sessions_rejects_cursor_of_another_store(
        self, j: Journal, tmp_path: Path
    ) -> None:
        j.create_session("s0")
        with self.make_journal(tmp_path / "other") as other:
            other.create_session("s0")
            with guarded_stop() as stop:
                feed = other.watch_sessions(stop=stop)
                foreign = next_or_fail(feed).cursor
                close_feed(feed)
        with raises(CursorForeign), guarded_stop(5.0) as stop:
            next(j.watch_sessions(cursor=foreign, stop=stop))

    # -- durability across reopen ------------------------------------------------------------

    def test_reopen_preserves_sessions_events_states_and_cursors(
        self, store_path: Path, rng: random.Random
    ) -> None:
        with self.make_journal(store_path) as j:
            j.create_session("open", mode="m1", tags={"t": "1"}, extensions={"k": b"v"})
            j.create_session("suspended", context_id="ctx", max_suspend_ms=10**9)
            j.create_session("resolved", ttl_ms=99_999_999)
            j.create_session("cancelled")
            j.create_session("expired", ttl_ms=60_000)
            for session_id in ("open", "suspended", "resolved", "cancelled", "expired"):
                for _ in range(rng.randint(1, 4)):
                    size = rng.randint(1, 5)
                    j.append(session_id, [EventIn(type="m", data=rng.randbytes(300))] * size)
            j.append("open", [EventIn(type="t", data=b"req", request_id="r-77")])
            j.suspend_session("suspended")
            j.resolve_session("resolved")
            j.cancel_session("cancelled")
            self.make_terminal(j, "expired", "expire")
            metadata = list(j.list_sessions())
            events = {m.session_id: self.read_all(j, m.session_id) for m in metadata}
            cursors = {s: history[len(history) // 2].cursor for s, history in events.items()}
        with self.make_journal(store_path) as j:
            assert list(j.list_sessions()) == metadata
            for meta in metadata:
                assert j.get_session(meta.session_id) == meta
                assert self.read_all(j, meta.session_id) == events[meta.session_id]
                middle = len(events[meta.session_id]) // 2
                resumed = self.read_all(j, meta.session_id, cursor=cursors[meta.session_id])
                assert resumed == events[meta.session_id][middle + 1 :]
            res = j.append("open", evs(b"after reopen"))
            assert res.first_ordinal == len(events["open"]) + 1
            assert max(e.position for es in events.values() for e in es) < (
                self.read_all(j, "open")[-1].position
            )
        with self.make_journal(store_path) as j:
            assert self.payloads(j, "open")[-1] == b"after reopen"

    # -- concurrency -------------------------------------------------------------------------

    def test_sixteen_threads_appending_get_dense_ordinals_and_every_event_once(
        self, store_path: Path
    ) -> None:
        threads_n, per_thread = 16, 25
        with self.make_journal(store_path, durability="fsync") as j:
            j.create_session("shared")
            barrier = threading.Barrier(threads_n)
            results: dict[int, list[AppendResult]] = {t: [] for t in range(threads_n)}
            errors: list[BaseException] = []

            def work(thread_no: int) -> None:
                try:
                    barrier.wait()
                    for i in range(per_thread):
                        event = EventIn(type="m", data=f"t{thread_no}:{i}".encode())
                        results[thread_no].append(j.append("shared", [event]))
                except BaseException as error:
                    errors.append(error)

            workers = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(60)
            assert not any(worker.is_alive() for worker in workers)
            assert errors == []
            events = self.read_all(j, "shared")
        total = threads_n * per_thread
        assert ordinals(events) == list(range(1, total + 1))
        by_payload = {e.data: e.ordinal for e in events}
        assert len(by_payload) == total, "an event was stored twice"
        for thread_no, thread_results in results.items():
            acked = [r.first_ordinal for r in thread_results]
            assert all(r.first_ordinal == r.last_ordinal for r in thread_results)
            assert acked == sorted(acked), "one thread's appends were reordered"
            assert acked == [by_payload[f"t{thread_no}:{i}".encode()] for i in range(per_thread)]
        with self.make_journal(store_path) as j:
            assert self.read_all(j, "shared") == events

    def test_durability_os_and_fsync_stores_read_the_same(self, tmp_path: Path) -> None:
        for durability in ("os", "fsync"):
            path = tmp_path / durability
            with self.make_journal(path, durability=durability) as j:
                j.create_session("s1")
                j.append("s1", numbered(10, size=50))
            with self.make_journal(path, durability=durability) as j:
                assert self.payloads(j, "s1") == [e.data for e in numbered(10, size=50)]
