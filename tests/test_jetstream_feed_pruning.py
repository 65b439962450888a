"""The JetStream engine prunes its lifecycle feed (SPEC 16.2, 7.7): the `lc.<id>` entries
and `in.<id>` claim of a session evicted a day ago leave the stream with the first
retention pass after that, the feed's floor (`j.<store>.ff`) rises to the highest
sequence pruned, and a lifecycle cursor below it fails with `CursorExpired` as on the
local engine. Retention passes are given a clock ahead of the real one (`now_ms`)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import io
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from _nats import shared_server, stream_messages
from _waiting import first_of
from test_jetstream_imports import _import_in_thread

from journal import (
    CursorExpired,
    EventIn,
    Journal,
    LifecycleEvent,
    LifecycleEventType,
    RetentionPolicy,
    SessionNotFound,
    SessionState,
    StoreUnavailable,
)
from journal._jetstream.engine import READ_RETRY_S, JetStreamEngine, JetStreamOptions
from journal._jetstream.layout import ENCODER, META_DECODER, Heartbeat, Subjects

HOUR_MS = 3_600_000
# How long an evicted session's entries stay (SPEC 16.2: `feed_pruning.FEED_KEEP_MS`).
FEED_KEEP_MS = 24 * HOUR_MS
# Ended sessions are evicted an hour after they end, by the passes the tests run.
EVICT_LATER = RetentionPolicy(max_history_bytes=None, session_retention_ms=HOUR_MS)

T = TypeVar("T")


def store_name(path: Path) -> str:
    return "t" + hashlib.sha256(str(path).encode()).hexdigest()[:24]


@pytest.fixture
def url() -> str:
    return shared_server().url


@pytest.fixture
def name(tmp_path: Path) -> str:
    return store_name(tmp_path)


@pytest.fixture
def j(url: str, name: str) -> Iterator[Journal]:
    with Journal.open(url, store=name, retention=EVICT_LATER) as opened:
        yield opened


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def evict(j: Journal) -> list[str]:
    """A pass two hours ahead: evicts the ended sessions, prunes nothing (a day's grace)."""
    return j.apply_retention(now_ms=_now_ms() + 2 * HOUR_MS).evicted_sessions


def prune(j: Journal) -> list[str]:
    """A pass a day and two hours ahead: evicts, and prunes the evictions made until now."""
    return j.apply_retention(now_ms=_now_ms() + FEED_KEEP_MS + 2 * HOUR_MS).evicted_sessions


def messages(url: str, name: str, subjects: str = ">") -> int:
    return stream_messages(url, name, subjects)


def next_of(feed: Iterator[LifecycleEvent], timeout: float = 10.0) -> LifecycleEvent:
    event = first_of(feed, timeout)
    assert isinstance(event, LifecycleEvent)
    return event


def anchor_cursor(j: Journal) -> str:
    """A lifecycle cursor at the store's head now (a startup snapshot's last event)."""
    sessions = max(1, len(list(j.list_sessions())))
    with j.watch_sessions(stop=threading.Event()) as feed:
        return [next_of(feed) for _ in range(sessions)][-1].cursor


def live_and_ended(j: Journal, prefix: str, count: int) -> None:
    """Sessions created, given an event and resolved (CREATED and RESOLVED entries)."""
    for i in range(count):
        session = f"{prefix}{i}"
        j.create_session(session)
        j.append(session, [EventIn("m", b"x" * 200)])
        j.resolve_session(session)


def test_the_stream_stays_bounded_over_rounds_of_session_lifetimes(
    j: Journal, url: str, name: str
) -> None:
    j.create_session("anchor")  # (stays open: its entry is kept)
    sizes = []
    for round_ in range(6):
        live_and_ended(j, f"r{round_}-", 40)
        assert len(prune(j)) == 40
        sizes.append(messages(url, name))
    # Each round leaves 40 x 3 feed entries (CREATED, RESOLVED, EVICTED) without the
    # pruning; with it the anchor's session, its entry, the store's records and the floor.
    assert max(sizes) <= 8, sizes
    assert messages(url, name, "lc.*") == 1


def _beats_of(url: str, name: str, session_id: str) -> int:
    return messages(url, name, f"s.{Subjects.token(session_id)}.hb")


def _late_beat(url: str, name: str, session_id: str) -> None:
    """A beat of an owner of an early incarnation of the session, published as one that
    landed between its session's tombstone and the eviction's purge is left (or one of
    a release whose owners beat on after an eviction, as before 2026-12-06)."""
    import nats

    async def publish() -> None:
        nc = await nats.connect(servers=url.removeprefix("nats://").split(","))
        try:
            beat = Heartbeat(1, 1, 1, "elsewhere", _now_ms())
            subject = f"j.{name}.s.{Subjects.token(session_id)}.hb"
            await nc.jetstream().publish(subject, ENCODER.encode(beat))
        finally:
            await nc.close()

    asyncio.run(publish())


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_beat_left_after_its_sessions_eviction_is_pruned(j: Journal, url: str, name: str) -> None:
    """A beat written outside the compare-and-set after a session's eviction (its owner
    held the lease meanwhile) stayed in the stream for good: the eviction purges the
    session's subjects up to its tombstone only (one message a session, found by a
    soak). The pass that prunes the session's feed entries purges it; the owner of an
    incarnation created since keeps its own."""
    for session in ("held", "again"):
        j.create_session(session)
        with j.own(session):
            pass
        j.resolve_session(session)
    assert sorted(evict(j)) == ["again", "held"]
    _late_beat(url, name, "held")
    j.create_session("again")
    with j.own("again"):
        _until(lambda: _beats_of(url, name, "again") == 1, "the new owner's beat")
        assert _beats_of(url, name, "held") == 1
        prune(j)
        assert _beats_of(url, name, "held") == 0
        assert _beats_of(url, name, "again") == 1
    assert j.get_session("again").state == SessionState.OPEN


def test_a_pass_keeps_the_entries_of_evictions_less_than_a_day_old(
    j: Journal, url: str, name: str
) -> None:
    j.create_session("anchor")
    before = anchor_cursor(j)
    live_and_ended(j, "s", 5)
    assert len(evict(j)) == 5
    assert messages(url, name, "lc.*") == 1 + 5 * 3
    with j.watch_sessions(cursor=before, stop=threading.Event()) as feed:
        changes = [next_of(feed) for _ in range(15)]
    assert [c.event_type for c in changes[-5:]] == [LifecycleEventType.EVICTED] * 5
    prune(j)
    assert messages(url, name, "lc.*") == 1


def test_a_cursor_below_the_floor_is_expired_and_resumes_from_its_resume_cursor(
    j: Journal,
) -> None:
    j.create_session("anchor")
    before = anchor_cursor(j)
    live_and_ended(j, "s", 5)
    evict(j)
    j.create_session("k0")
    j.create_session("k1")
    with j.watch_sessions(cursor=before, stop=threading.Event()) as feed:
        changes = [next_of(feed) for _ in range(17)]
    assert changes[-2].session.session_id == "k0"
    after_floor = changes[-2].cursor  # (k0's CREATED: above every eviction)
    prune(j)
    with pytest.raises(CursorExpired) as info:
        j.watch_sessions(cursor=before)
    # The floor is the last EVICTED entry (the highest sequence pruned).
    evicted_at = _position(changes[-3].cursor)
    assert info.value.earliest_ordinal == evicted_at + 1
    resume = info.value.resume_cursor
    assert resume is not None
    with j.watch_sessions(cursor=resume, stop=threading.Event()) as feed:
        assert [next_of(feed).session.session_id for _ in range(2)] == ["k0", "k1"]
    # A cursor after the floor resumes unchanged.
    with j.watch_sessions(cursor=after_floor, stop=threading.Event()) as feed:
        j.create_session("k2")
        assert [next_of(feed).session.session_id for _ in range(2)] == ["k1", "k2"]
    # A new watcher's snapshot (its position read from the feed, all of whose newest
    # entries were pruned: at least the floor) follows without an error.
    with j.watch_sessions(stop=threading.Event()) as feed:
        snapshot = [next_of(feed).session.session_id for _ in range(4)]
        assert snapshot == ["anchor", "k0", "k1", "k2"]
        j.create_session("k3")
        assert next_of(feed).session.session_id == "k3"


def test_a_fresh_watch_after_the_newest_entries_were_pruned_follows(
    j: Journal,
) -> None:
    j.create_session("live")
    live_and_ended(j, "s", 3)
    prune(j)  # (the feed's last entries are pruned: its last position is live's, below)
    with j.watch_sessions(stop=threading.Event()) as feed:
        assert next_of(feed).session.session_id == "live"  # (the snapshot is taken)
        j.create_session("new")
        event = next_of(feed)
        assert (event.event_type, event.session.session_id) == (LifecycleEventType.CREATED, "new")


def _position(cursor: str) -> int:
    """The position a lifecycle cursor carries (SPEC 5: version 2, a u48 at byte 12)."""
    import base64

    raw = base64.urlsafe_b64decode(cursor + "=")
    width = 8 if raw[0] == 1 else 6
    return int.from_bytes(raw[12 : 12 + width], "big")


def test_a_snapshot_cursor_whose_session_is_pruned_while_it_resumes_is_expired(
    url: str, name: str
) -> None:
    """A mid-snapshot cursor resumed while a pruning takes the last delivered session's
    entries (between the cursor's check of the floor and the look-up of its id): the
    changes since cannot be given, `CursorExpired`, not `CursorForeign`."""
    pruning = threading.Event()

    def point(where: str, detail: object) -> None:
        if where == "sessions.id_of" and pruning.is_set():
            pruning.clear()
            with Journal.open(url, store=name) as other:
                prune(other)

    options = JetStreamOptions(servers=[url], store=name, point=point, retention=EVICT_LATER)
    with Journal.over(JetStreamEngine.open(options)) as j:
        for session in ("a", "b", "c"):
            j.create_session(session)
        with j.watch_sessions(stop=threading.Event()) as feed:
            cursor = next_of(feed).cursor  # (a's: the snapshot resumes after it)
        j.resolve_session("a")
        assert evict(j) == ["a"]
        pruning.set()
        with pytest.raises(CursorExpired) as info:
            j.watch_sessions(cursor=cursor)
        assert not pruning.is_set()  # (the pruning ran where it was meant to)
        assert info.value.resume_cursor is None


def _export_of(path: Path, session_id: str) -> bytes:
    with Journal.open(path) as local:
        local.create_session(session_id)
        local.append(session_id, [EventIn("m", b"imported")])
        out = io.BytesIO()
        local.export_sessions(None, out)
        return out.getvalue()


def test_an_import_in_flight_keeps_its_claim_while_the_evicted_incarnation_is_pruned(
    url: str, name: str, tmp_path: Path
) -> None:
    archive = _export_of(tmp_path / "local", "x")
    token = b"x".hex()
    reached, go = threading.Event(), threading.Event()

    def point(where: str, detail: object) -> None:
        if where == "import.commit" and not go.is_set():
            reached.set()
            assert go.wait(60)

    options = JetStreamOptions(servers=[url], store=name, point=point, retention=EVICT_LATER)
    with (
        Journal.over(JetStreamEngine.open(options)) as j,
        Journal.open(url, store=name, retention=EVICT_LATER) as other,
    ):
        other.create_session("x")
        other.resolve_session("x")
        assert evict(other) == ["x"]
        assert messages(url, name, f"lc.{token}") == 3

        thread, result = _import_in_thread(j, archive)
        try:
            assert reached.wait(60), result
            prune(other)  # (the importer is alive: its staging is left alone)
            assert messages(url, name, f"lc.{token}") == 0  # the evicted incarnation's
            assert messages(url, name, f"in.{token}") == 1  # the import's claim
        finally:
            go.set()
            thread.join(60)
        assert result and not isinstance(result[0], BaseException), result
        assert [e.data for e in other.replay("x")] == [b"imported"]
        # Its incarnation (the claim) still names it: a page token after it works.
        page = other.list_sessions_page(page_size=1)
        assert [m.session_id for m in page.sessions] == ["x"]
        other.create_session("y")
        page = other.list_sessions_page(page_size=1)
        assert [
            m.session_id for m in other.list_sessions_page(1, page.next_page_token).sessions
        ] == ["y"]


def test_a_pass_stopped_between_its_floor_and_its_purges_is_finished_by_the_next(
    url: str, name: str
) -> None:
    """The floor is recorded before the purges it covers: a pass that stops in between
    has made the cursors below it expire early, never skipped an entry, and the next
    pass purges what it left (the record names those sessions)."""
    failing = threading.Event()

    def point(where: str, detail: object) -> None:
        if where == "feed.floor_recorded" and failing.is_set():
            failing.clear()
            raise RuntimeError("stopped at feed.floor_recorded")

    options = JetStreamOptions(servers=[url], store=name, point=point, retention=EVICT_LATER)
    with Journal.over(JetStreamEngine.open(options)) as j:
        j.create_session("anchor")
        before = anchor_cursor(j)
        live_and_ended(j, "s", 5)
        evict(j)
        failing.set()
        with pytest.raises(RuntimeError, match=r"feed\.floor_recorded"):
            prune(j)
        assert messages(url, name, "lc.*") == 1 + 5 * 3  # (nothing purged yet)
        with pytest.raises(CursorExpired):
            j.watch_sessions(cursor=before)
        prune(j)
        assert messages(url, name, "lc.*") == 1


def _as_operator(url: str, act: Callable[[Any], Awaitable[T]]) -> T:
    """`act(nc)` run with a NATS client of its own, as an operator's `nats` tool would."""
    import asyncio

    import nats

    async def run() -> T:
        nc = await nats.connect(servers=url.removeprefix("nats://").split(","))
        try:
            return await act(nc)
        finally:
            await nc.close()

    return asyncio.run(run())


def _publish(url: str, subject: str, data: bytes) -> int:
    """Publish `data` on `subject` of the store's stream with a client of the test's own
    (as an operator's `nats pub` would); its stream sequence."""

    async def publish(nc: Any) -> int:
        return int((await nc.jetstream().publish(subject, data)).seq)

    return _as_operator(url, publish)


def test_a_floor_record_that_does_not_decode_expires_the_cursors_below_it(
    j: Journal, url: str, name: str
) -> None:
    """A damaged `ff` record is taken as a floor at its own sequence (every floor it could
    have recorded lies below it: the floor is an entry written before its record), as
    the local engine's rebuild judges without its `feed-floor` file: the cursors below it
    expire, those above resume, and the next pass writes a good record again. Until
    2026-12-05 every lifecycle read and retention pass raised `JournalCorrupt` for good,
    and deleting the record (the one way out) lowered the floor to 0: silent gaps."""
    j.create_session("anchor")
    before = anchor_cursor(j)
    live_and_ended(j, "s", 3)
    prune(j)
    damaged_at = _publish(url, f"j.{name}.ff", b"\xc1 not msgpack")
    j.create_session("k0")
    with pytest.raises(CursorExpired) as info:
        j.watch_sessions(cursor=before)
    assert info.value.earliest_ordinal == damaged_at + 1
    resume = info.value.resume_cursor
    assert resume is not None
    with j.watch_sessions(cursor=resume, stop=threading.Event()) as feed:
        k0 = next_of(feed)
        assert k0.session.session_id == "k0"
    # The next pass prunes and records a good floor again: the last eviction it pruned.
    live_and_ended(j, "t", 2)
    evict(j)
    with j.watch_sessions(cursor=k0.cursor, stop=threading.Event()) as feed:
        changes = [next_of(feed) for _ in range(6)]
    assert changes[-1].event_type == LifecycleEventType.EVICTED
    prune(j)
    assert messages(url, name, "lc.*") == 2  # (anchor's and k0's)
    with pytest.raises(CursorExpired) as info:
        j.watch_sessions(cursor=k0.cursor)
    assert info.value.earliest_ordinal == _position(changes[-1].cursor) + 1


def _format(url: str, name: str) -> int:
    """The format the store's identity record gives (what every release checks at open)."""

    async def read(nc: Any) -> int:
        found = await nc.jetstream().get_last_msg(f"JOURNAL_{name}", f"j.{name}.meta")
        return int(META_DECODER.decode(found.data or b"").format)

    return _as_operator(url, read)


def test_a_store_is_marked_before_its_first_purge_so_that_older_releases_refuse_it(
    j: Journal, url: str, name: str
) -> None:
    """A release from before the pruning reads format 1 and knows no floor: opening a
    pruned store, it resumed a lifecycle cursor from before the pruned changes right past
    them (found by a review, with a worktree of that release). The first purge
    marks the store format 2, which such a release refuses; until then it stays 1."""
    live_and_ended(j, "s", 3)
    assert len(evict(j)) == 3
    assert _format(url, name) == 1  # (nothing pruned yet: every release reads it)
    prune(j)
    assert messages(url, name, "lc.*") == 0
    assert _format(url, name) == 2
    j.create_session("after")
    with Journal.open(url, store=name) as again:
        assert [s.session_id for s in again.list_sessions()] == ["after"]


def _purge_subject(url: str, name: str, subject: str) -> None:
    """Purge one subject of the store's stream with a client of the test's own."""

    async def purge(nc: Any) -> None:
        await nc.jetstream().purge_stream(f"JOURNAL_{name}", subject=subject)

    _as_operator(url, purge)


def test_nothing_is_purged_when_the_store_cannot_be_marked(j: Journal, url: str, name: str) -> None:
    """The mark comes before the first purge, not after it: a pass that cannot mark the
    store (here its identity record is gone) purges nothing, so no entry leaves a store
    that older releases would still open. (The test above sees the mark only once the
    pass is done.)"""
    live_and_ended(j, "s", 3)
    assert len(evict(j)) == 3
    entries = messages(url, name, "lc.*")
    _purge_subject(url, name, f"j.{name}.meta")
    with pytest.raises(StoreUnavailable, match="identity record is gone: nothing pruned"):
        prune(j)
    assert messages(url, name, "lc.*") == entries == 9


def test_a_store_of_a_later_format_is_refused_and_both_known_ones_open(url: str, name: str) -> None:
    """This release reads formats 1 and 2 (a pruned feed's); a later one is refused at
    open with what to do, before anything is read or written."""

    import msgspec

    from journal import StoreIncompatible
    from journal._jetstream.layout import ENCODER

    with Journal.open(url, store=name):
        pass

    async def mark(nc: Any, format_: int) -> None:
        js = nc.jetstream()
        found = await js.get_last_msg(f"JOURNAL_{name}", f"j.{name}.meta")
        meta = msgspec.structs.replace(META_DECODER.decode(found.data or b""), format=format_)
        headers = {"Nats-Rollup": "sub"}
        await js.publish(f"j.{name}.meta", ENCODER.encode(meta), headers=headers)

    for known in (2, 1):
        _as_operator(url, functools.partial(mark, format_=known))
        with Journal.open(url, store=name) as j:
            j.create_session(f"f{known}")
    _as_operator(url, functools.partial(mark, format_=3))
    with pytest.raises(StoreIncompatible, match="has format 3; this version reads formats 1, 2"):
        Journal.open(url, store=name)
    assert _format(url, name) == 3


def test_a_floor_record_deleted_from_a_pruned_store_expires_the_cursors_below_it(
    j: Journal, url: str, name: str
) -> None:
    """A floor record deleted by hand (`nats stream rmm`, a purge of its subject) from a
    store whose feed was pruned (format 2): the floor it held is unknown, so a writable
    journal records the stream's last sequence (an upper bound of every floor it could
    have held) and the cursors below it expire; a read-only one refuses lifecycle reads
    until then. Until 2026-12-05 the floor read as 0, and a cursor from before the
    pruned changes resumed right past them: a silent skip."""
    j.create_session("anchor")
    before = anchor_cursor(j)
    live_and_ended(j, "s", 3)
    prune(j)
    assert _format(url, name) == 2
    _purge_subject(url, name, f"j.{name}.ff")
    j.create_session("k0")
    with Journal.open(url, store=name, readonly=True) as reader:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=r"floor record .* is missing") as refused:
            reader.watch_sessions(cursor=before)
        # (Said at once: the reads ask again for 30 s only when the servers do not answer;
        # until 2026-12-05 this refusal too came after 30 s.)
        assert time.monotonic() - started < READ_RETRY_S / 2
        assert type(refused.value) is StoreUnavailable
    with pytest.raises(CursorExpired) as info:
        j.watch_sessions(cursor=before)
    assert messages(url, name, "ff") == 1  # (written back, once)
    assert info.value.earliest_ordinal > _position(anchor_cursor(j))  # (past k0's entry)
    resume = info.value.resume_cursor
    assert resume is not None
    with Journal.open(url, store=name, readonly=True) as reader, pytest.raises(CursorExpired):
        reader.watch_sessions(cursor=before)
    with j.watch_sessions(cursor=resume, stop=threading.Event()) as feed:
        j.create_session("k1")
        assert next_of(feed).session.session_id == "k1"
    # The next pass examines the feed from its start and records a floor again.
    live_and_ended(j, "t", 2)
    prune(j)
    assert messages(url, name, "lc.*") == 3  # (anchor's, k0's and k1's)
    assert messages(url, name, "ff") == 1


def test_a_store_never_pruned_reads_without_a_floor_record(url: str, name: str) -> None:
    """A store whose feed was never pruned (format 1) needs no floor record: a read-only
    journal resumes every cursor and writes nothing; a writable one's first lifecycle
    read records the floor 0, so that later reads need not read the identity record to
    tell a store never pruned from one whose record was deleted."""
    with Journal.open(url, store=name, create=True) as j:
        j.create_session("anchor")
        live_and_ended(j, "s", 2)
    with Journal.open(url, store=name, readonly=True) as reader:
        with reader.watch_sessions(stop=threading.Event()) as feed:
            first = next_of(feed)
        with reader.watch_sessions(cursor=first.cursor, stop=threading.Event()) as feed:
            assert next_of(feed).session.session_id == "s0"
    assert messages(url, name, "ff") == 0
    for _ in range(2):
        with (
            Journal.open(url, store=name) as j,
            j.watch_sessions(cursor=first.cursor, stop=threading.Event()) as feed,
        ):
            assert next_of(feed).session.session_id == "s0"
        assert _floor_record(url, name) == (0, 0, [])
    assert messages(url, name, "ff") == 1


def _publish_eviction_written_at(url: str, name: str, session_id: str, at_ms: int) -> None:
    """An EVICTED feed entry for `session_id` that says it was written at `at_ms`, stored
    now: what a writer whose clock is behind by (now - at_ms) writes. Its row is copied
    from the store's first feed entry."""

    import msgspec

    from journal._jetstream.layout import ENCODER, FEED_DECODER

    async def publish(nc: Any) -> None:
        js = nc.jetstream()
        first = await js.get_msg(f"JOURNAL_{name}", 1, next=True, subject=f"j.{name}.lc.*")
        stored = FEED_DECODER.decode(first.data or b"")
        row = msgspec.structs.replace(stored.entry.row, session_id=session_id)
        entry = msgspec.structs.replace(
            stored.entry, event_type=LifecycleEventType.EVICTED.value, at_ms=at_ms, row=row
        )
        subject = f"j.{name}.lc.{session_id.encode().hex()}"
        await js.publish(subject, ENCODER.encode(msgspec.structs.replace(stored, entry=entry)))

    _as_operator(url, publish)


def test_an_eviction_written_by_a_clock_two_days_behind_is_kept_a_day(
    j: Journal, url: str, name: str
) -> None:
    """An eviction's age is the servers' time now less the time the server stored it, not
    the time its writer's clock put in it: until 2026-12-05 a writer two days behind wrote
    evictions that the next pass pruned at once, and a watcher a minute behind got
    `CursorExpired` where a day's resume is promised."""
    j.create_session("anchor")
    before = anchor_cursor(j)
    _publish_eviction_written_at(url, name, "ghost", _now_ms() - 2 * FEED_KEEP_MS)
    j.apply_retention()  # (now, by the servers' clock)
    assert messages(url, name, f"lc.{b'ghost'.hex()}") == 1
    with j.watch_sessions(cursor=before, stop=threading.Event()) as feed:
        assert next_of(feed).session.session_id == "ghost"
    prune(j)  # (a day and two hours on)
    assert messages(url, name, f"lc.{b'ghost'.hex()}") == 0


def test_the_servers_times_are_read_to_the_millisecond() -> None:
    from journal._jetstream.server_clock import parse_server_time_ms

    assert parse_server_time_ms("2026-12-05T04:25:52.457856779Z", "t") == 1_796_444_752_457
    assert parse_server_time_ms("2026-12-05T04:25:52Z", "t") == 1_796_444_752_000
    assert parse_server_time_ms("2026-12-05T05:25:52.4+01:00", "t") == 1_796_444_752_400
    with pytest.raises(StoreUnavailable, match="upgrade nats-server"):
        parse_server_time_ms("", "t")


def _floor_record(url: str, name: str) -> tuple[int, int, list[tuple[str, int]]]:
    """The floor record as stored (floor, examined, pending), read with a client of the
    test's own."""

    from journal._jetstream.layout import FLOOR_DECODER

    async def read(nc: Any) -> tuple[int, int, list[tuple[str, int]]]:
        found = await nc.jetstream().get_last_msg(f"JOURNAL_{name}", f"j.{name}.ff")
        record = FLOOR_DECODER.decode(found.data or b"")
        return record.floor, record.examined, [(t, s) for t, s in record.pending]

    return _as_operator(url, read)


def test_a_refused_purge_of_a_pass_is_raised_and_its_batch_left_for_the_next(
    url: str, name: str
) -> None:
    """A purge the server refuses (here: a stream without a leader, JetStream error 10008,
    at the engine's `store.purge` point) fails the pass with `StoreUnavailable` saying
    what to do, and its batch stays recorded as pending: the next pass purges it. Until
    2026-12-05 every refusal was swallowed, the batch recorded done and its entries left
    in the stream for good, without a word. The failure also says that the eviction the
    pass committed before it stays done (until 2026-12-05 it did not: a caller could
    take it for a pass that changed nothing)."""
    from journal._jetstream.client import ApiError

    refusing = threading.Event()
    feed_purges = f"j.{name}.*."

    def point(where: str, detail: object) -> None:
        if where == "store.purge" and refusing.is_set() and str(detail).startswith(feed_purges):
            raise ApiError(503, 10008, "JetStream system temporarily unavailable")

    options = JetStreamOptions(servers=[url], store=name, point=point, retention=EVICT_LATER)
    with Journal.over(JetStreamEngine.open(options)) as j:
        j.create_session("anchor")
        before = anchor_cursor(j)
        live_and_ended(j, "s", 3)
        evict(j)
        live_and_ended(j, "t", 1)  # (evicted by the pass that fails)
        refusing.set()
        with pytest.raises(StoreUnavailable) as failed:
            prune(j)
        assert re.search(r"refused to purge .*error 10008.*again", str(failed.value))
        assert "1 eviction(s) and 0 history trim(s) committed before it and stay done" in str(
            failed.value
        )
        with pytest.raises(SessionNotFound):
            j.get_session("t0")
        assert messages(url, name, "lc.*") == 1 + 4 * 3  # (nothing purged)
        assert len(_floor_record(url, name)[2]) == 4  # (the batch, still pending)
        with pytest.raises(CursorExpired):
            j.watch_sessions(cursor=before)
        refusing.clear()
        prune(j)
        assert messages(url, name, "lc.*") == 1
        assert _floor_record(url, name)[2] == []


def test_an_identity_record_that_stops_decoding_is_journal_corrupt_for_a_pass(
    j: Journal, url: str, name: str
) -> None:
    """The identity record (`meta`) rewritten by hand with what does not decode, after the
    journal opened: the pass that would mark it before purging raises `JournalCorrupt`
    naming the record and what to do, and purges nothing. Until 2026-12-05 msgspec's
    `DecodeError` came out of `apply_retention`."""
    from journal import JournalCorrupt

    live_and_ended(j, "s", 2)
    prune(j)  # (format 2, a floor record)
    live_and_ended(j, "t", 2)
    evict(j)
    _publish_rollup(url, f"j.{name}.meta", b"\xc1 not msgpack")
    with pytest.raises(JournalCorrupt, match=rf"j\.{name}\.meta.*identity record.*backup"):
        prune(j)
    assert messages(url, name, "lc.*") == 2 * 3  # (nothing purged)


def _publish_rollup(url: str, subject: str, data: bytes) -> None:
    """Replace what `subject` holds with `data` (a roll-up), as an operator's client would."""

    async def publish(nc: Any) -> None:
        await nc.jetstream().publish(subject, data, headers={"Nats-Rollup": "sub"})

    _as_operator(url, publish)


def test_an_unanswered_purge_after_a_committed_change_does_not_report_it_failed(
    url: str, name: str
) -> None:
    """The purge that follows a committed trim (an append's byte window, a snapshot's
    compaction) is left unsaid when the servers do not answer it, as when they refuse
    it: the change committed, and a `StoreUnavailable` for it would have its caller
    write it again (an append without an idempotency key: its events twice). Until a
    review only a refusal was left unsaid (`purge_or_leave`); an unanswered purge
    failed the committed append."""
    from nats.errors import TimeoutError as NatsTimeout

    unanswered = threading.Event()

    def point(where: str, detail: object) -> None:
        if where == "store.purge" and unanswered.is_set() and str(detail).endswith(".ev"):
            raise NatsTimeout

    options = JetStreamOptions(servers=[url], store=name, point=point)
    with Journal.over(JetStreamEngine.open(options)) as j:
        j.create_session("s", max_history_bytes=100)
        for i in range(3):
            j.append("s", [EventIn("m", bytes([i]) * 30)])
        unanswered.set()
        assert j.append("s", [EventIn("m", b"x" * 80)]).last_ordinal == 4  # (trims 1..3)
        assert [e.ordinal for e in j.replay("s")] == [4]
        j.create_session("c")
        j.append("c", [EventIn("m", b"y")] * 3)
        assert j.compact_session("c", 2, b"{}").ordinal == 2
        assert [e.ordinal for e in j.replay("c")] == [3]
        unanswered.clear()


def _seal(url: str, name: str) -> None:
    """Seal the store's stream (an operator's `nats stream seal`): nothing more is stored."""
    import json

    async def seal(nc: Any) -> None:
        stream = f"JOURNAL_{name}"
        info = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"")).data)
        config = {**info["config"], "sealed": True}
        reply = await nc.request(f"$JS.API.STREAM.UPDATE.{stream}", json.dumps(config).encode())
        assert "error" not in json.loads(reply.data), reply.data

    _as_operator(url, seal)


def test_a_never_pruned_store_that_refuses_writes_is_read_by_a_writable_journal(
    url: str, name: str
) -> None:
    """A writable journal's first lifecycle read of a store never pruned records its floor
    0 only to spare later reads a look at the identity record: when the store refuses the
    write (sealed here; an account out of JetStream storage alike) the floor is still 0,
    and the read goes on. Until a review it raised `StoreUnavailable` ("could not be
    written"), after 30 s of asking again: a writable journal could not watch the
    sessions of a store it could not write, as it could before floor records were
    written back."""
    with Journal.open(url, store=name) as j:
        j.create_session("anchor")
        live_and_ended(j, "s", 2)
        _seal(url, name)
        with j.watch_sessions(stop=threading.Event()) as feed:
            first = next_of(feed)
        assert first.session.session_id == "anchor"
        with j.watch_sessions(cursor=first.cursor, stop=threading.Event()) as feed:
            assert next_of(feed).session.session_id == "s0"
    assert messages(url, name, "ff") == 0


def _suspend_and_resume(j: Journal, session_id: str, rounds: int) -> None:
    for _ in range(rounds):
        j.suspend_session(session_id)
        j.resume_session(session_id)


def test_a_live_sessions_superseded_entries_leave_a_day_after_what_superseded_them(
    j: Journal, url: str, name: str
) -> None:
    """A session that never ends added a feed entry with each change, kept for good (500
    suspensions and resumptions: 1,001 messages after a pass). A pass prunes the entries
    of a live session followed by a later one of it that is a day old: its CREATED entry
    (its incarnation, the id's look-up) and its newest entry a day old stay, as the local
    engine keeps a live session's creation and latest transition. The floor rises past
    them: a cursor from before them expires, one after them resumes with no gap."""
    j.create_session("live")
    j.create_session("other")
    token = j.list_sessions_page(page_size=1).next_page_token  # (after live's incarnation)
    before = anchor_cursor(j)
    _suspend_and_resume(j, "live", 200)
    assert messages(url, name, "lc.*") == 2 + 400
    time.sleep(0.05)
    cut = _now_ms()  # (the entries before it are a day old for the pass below)
    time.sleep(0.05)
    after = anchor_cursor(j)  # (at live's last entry before the cut)
    _suspend_and_resume(j, "live", 5)
    with j.watch_sessions(cursor=after, stop=threading.Event()) as feed:
        young = [next_of(feed) for _ in range(10)]
    assert _format(url, name) == 1
    j.apply_retention(now_ms=cut + FEED_KEEP_MS)
    # Both CREATED entries, live's newest before the cut, and the ten after it.
    assert messages(url, name, "lc.*") == 2 + 1 + 10
    assert _format(url, name) == 2  # (older releases, which know no floor, refuse it)
    with pytest.raises(CursorExpired):
        j.watch_sessions(cursor=before)
    j.create_session("marker")
    expected = [(e.event_type, e.session.session_id) for e in young] + [
        (LifecycleEventType.CREATED, "marker")
    ]
    for start, cursor in [(0, after), *((i + 1, e.cursor) for i, e in enumerate(young))]:
        with j.watch_sessions(cursor=cursor, stop=threading.Event()) as feed:
            got = [next_of(feed) for _ in range(len(expected) - start)]
        assert [(e.event_type, e.session.session_id) for e in got] == expected[start:]
    # The incarnation still names its id (the CREATED entry stays).
    assert [s.session_id for s in j.list_sessions_page(page_token=token).sessions] == [
        "marker",
        "other",
    ]
    # A day later every entry but each live session's CREATED and newest is gone.
    prune(j)
    assert messages(url, name, "lc.*") == 4
    assert j.get_session("live").state == SessionState.OPEN


def test_a_pass_that_fails_to_delete_superseded_entries_leaves_them_to_a_later_one(
    url: str, name: str
) -> None:
    """The floor covering a live session's superseded entries is recorded before they are
    deleted (not as pending: a pass stopped in between leaves them below the floor, never
    read). A refused delete (a stream without a leader, at the engine's `store.delete`
    point) fails the pass with `StoreUnavailable`; the pass that walks the session's next
    entry looks below it and deletes what was left."""
    from journal._jetstream.client import ApiError

    refusing = threading.Event()

    def point(where: str, detail: object) -> None:
        if where == "store.delete" and refusing.is_set():
            raise ApiError(503, 10008, "JetStream system temporarily unavailable")

    options = JetStreamOptions(servers=[url], store=name, point=point, retention=EVICT_LATER)
    with Journal.over(JetStreamEngine.open(options)) as j:
        j.create_session("live")
        before = anchor_cursor(j)
        _suspend_and_resume(j, "live", 20)
        refusing.set()
        with pytest.raises(StoreUnavailable) as failed:
            prune(j)
        assert re.search(r"refused to delete .*error 10008.*again", str(failed.value))
        assert messages(url, name, "lc.*") == 1 + 40  # (nothing deleted)
        assert _format(url, name) == 2  # (marked before the first delete, as for a purge)
        with pytest.raises(CursorExpired):
            j.watch_sessions(cursor=before)
        refusing.clear()
        prune(j)  # (nothing walked since: what the failed pass left stays)
        assert messages(url, name, "lc.*") == 1 + 40
        j.suspend_session("live")
        prune(j)
        assert messages(url, name, "lc.*") == 2
        assert j.get_session("live").state == SessionState.SUSPENDED
