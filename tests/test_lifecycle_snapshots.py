"""Lifecycle follows that start, resume and stop while others deliver their startup
snapshots (SPEC 7.7, "What a startup snapshot holds"): whether a follow copies the rows
or shares the copy another still delivers, each one's events are checked against a model
built from the lifecycle feed itself: a snapshot that is the registry at its position
(in id order on the local engine), then every feed entry after that position once, in
order; a resume from a cursor gives the entries after it (from a snapshot event but the
last: the changes since of the sessions it had delivered, then the snapshot's other
sessions, then the feed). Nothing is held once every follow stopped."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from engines import ENGINES, EngineFactory, engine_params
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from cursors import Claims, TokenKind
from journal import (
    CursorExpired,
    EventIn,
    IllegalTransition,
    Journal,
    JournalCorrupt,
    LifecycleEvent,
    LifecycleEventType,
    RetentionPolicy,
    SessionExists,
    SessionNotFound,
    Stream,
)
from journal.engine import Engine
from journal.lifecycle import SNAPSHOT_PAGE, SNAPSHOT_REUSE
from journal.sessions import FeedEntry

# Ended sessions are evicted only by the passes the tests run with a clock two hours
# ahead; nothing prunes the feed (its floor stays 0), so every cursor stays valid.
EVICT_LATER = RetentionPolicy(max_history_bytes=None, session_retention_ms=3_600_000)
IDS = [f"s{i:03d}" for i in range(160)]
WAIT_S = 30.0


# (What the model needs of the journal's insides: the feed as the engine keeps it, what
# a cursor claims, and the snapshot copy the lifecycle feed shares.)
def engine_of(j: Journal) -> Engine:
    return j._engine  # noqa: SLF001


def claims(j: Journal, cursor: str) -> Claims:
    lifecycle = j._lifecycle  # noqa: SLF001
    return j._codec.decode(cursor, TokenKind.LIFECYCLE, lifecycle._scope)  # noqa: SLF001


def shared_copy(j: Journal) -> object:
    return j._lifecycle._shared()  # noqa: SLF001


def reference_feed(j: Journal) -> list[tuple[int, FeedEntry]]:
    """Every lifecycle feed entry, read from the engine (nothing is pruned here)."""
    found: list[tuple[int, FeedEntry]] = []
    after = 0
    while True:
        entries, _, floor = engine_of(j).feed(after, 1000)
        assert floor == 0
        if not entries:
            return found
        found += entries
        after = entries[-1][0]


def registry_at(feed: list[tuple[int, FeedEntry]], point: int) -> dict[str, tuple[int, int]]:
    """id -> (incarnation, state wire value) of every session after the entries up to
    `point`."""
    live: dict[str, tuple[int, int]] = {}
    for position, entry in feed:
        if position > point:
            break
        if entry.event_type == LifecycleEventType.EVICTED.value:
            live.pop(entry.row.session_id, None)
        else:
            live[entry.row.session_id] = (entry.row.incarnation, entry.row.state)
    return live


@dataclass
class Run:
    """One follow: where it started (None: no cursor) and what it delivered."""

    cursor: str | None
    events: list[LifecycleEvent] = field(default_factory=list)
    started_at_head: int = 0


# Lifecycle cursor ordinals (SPEC 5): 0 after a feed position; 1 a fresh snapshot (issued
# until 2026-12-04); from MID on, a snapshot event before its last, resumed after the
# session of incarnation `ordinal - MID`.
FRESH, MID = 1, 2


def id_of(feed: list[tuple[int, FeedEntry]], incarnation: int) -> str:
    """The session id of an incarnation, from its feed entries."""
    (found,) = {e.row.session_id for _, e in feed if e.row.incarnation == incarnation}
    return found


def mid_check(feed: list[tuple[int, FeedEntry]], anchor: int, session_id: str) -> int:
    """The check of a mid-snapshot cursor anchored at `anchor` naming `session_id`
    (SPEC 5): the id's CRC32 XOR the anchor entry's time (0 when none is there)."""
    at = [e.at_ms for p, e in feed if p == anchor]
    return zlib.crc32(session_id.encode()) ^ (at[0] & 0xFFFF_FFFF if at else 0)


def available(j: Journal, run: Run, settled: bool = True) -> int:
    """How many events the follow has for sure now (the feed only grows here). After a
    snapshot event but its last (at position p, the last session delivered S): every
    feed entry after p of a session up to S (as a change since, or live), and one for
    each session after S there is now (its row at the snapshot's point, or its CREATED
    after it). With writers still running (`settled` False) and no event of the follow
    yet, its snapshot is not taken: a session after S there is now may be evicted before
    the snapshot's point, in neither its rows nor the feed after it, so only the changes
    up to S are sure (until 2026-12-05 the model counted such sessions too, and a
    follower of the threaded test waited 30 s for an event the design never gives: one
    run in ten on three servers, where reads are slowest)."""
    cursor = run.events[-1].cursor if run.events else run.cursor
    last = None if cursor is None else claims(j, cursor)
    if last is None or last.ordinal == FRESH:
        return 1  # (the "anchor" session is always there)
    entries, _, _ = engine_of(j).feed(last.position, 10_000)
    if last.ordinal == 0:
        return len(entries)
    incarnation = last.ordinal - MID
    delivered = engine_of(j).session_id_of(incarnation) or id_of(reference_feed(j), incarnation)
    since = sum(e.row.session_id <= delivered for _, e in entries)
    if not settled and not run.events:
        return since
    return since + len(engine_of(j).sessions(delivered, None, 100_000)[0])


def check_snapshot_rows(
    engine: str,
    events: list[LifecycleEvent],
    got: list[Claims],
    feed: list[tuple[int, FeedEntry]],
    after_id: str | None,
) -> tuple[int, int | None]:
    """Checks the leading snapshot events (CREATED, `in_snapshot`) of sessions after
    `after_id` (None: all): the registry at the snapshot's point, in id order. Returns
    how many there were and the point (None: unknown, no snapshot event)."""
    i = 0
    point: int | None = None
    while i < len(events) and got[i].ordinal >= MID and events[i].in_snapshot:
        # (Its position is the snapshot's anchor, the newest feed entry at or below its
        # point: the registry there is the same, and the feed after it too.)
        assert point in (None, got[i].position), (point, got[i])
        point = got[i].position
        # (its cursor names the session it delivered: a restart goes on after it)
        assert got[i].ordinal - MID == events[i].session.incarnation, (got[i], events[i])
        assert got[i].check == mid_check(feed, point, events[i].session.session_id), got[i]
        i += 1
    whole = i < len(events) and events[i].in_snapshot
    if whole:
        # The snapshot's last event resumes after its position: its cursor names that
        # position, or (checked) the newest feed entry at or below it.
        last = got[i]
        assert last.ordinal == 0, last
        if last.check is not None:
            if point is None:
                point = last.position  # (the same place: no entry lies between)
            assert last.position <= point, (last, point)
            assert not [p for p, _ in feed if last.position < p <= point], (last, point)
        else:
            if point is not None:
                low, high = sorted((last.position, point))
                assert not [p for p, _ in feed if low < p <= high], (last, point)
            point = last.position
        i += 1
    snapshot = events[:i]
    assert all(e.event_type is LifecycleEventType.CREATED and e.in_snapshot for e in snapshot)
    ids = [e.session.session_id for e in snapshot]
    assert len(ids) == len(set(ids)), f"a session twice in one snapshot: {ids}"
    if point is None:
        return 0, None
    expected = {
        s: v for s, v in registry_at(feed, point).items() if after_id is None or s > after_id
    }
    if engine == "local":  # (the registry at its position exactly, in id order)
        order = sorted(expected)
        assert ids == (order if whole else order[: len(ids)]), (point, ids, order)
        for e in snapshot:
            meta = e.session
            assert (meta.incarnation, meta.state.wire) == expected[meta.session_id]
    else:  # (rows read after the position: as new or newer, never a later creation)
        assert all(e.session.incarnation <= point for e in snapshot)
        assert ids == sorted(ids) and all(after_id is None or s > after_id for s in ids)
    return i, point


def check_changes_since(
    start: Claims,
    events: list[LifecycleEvent],
    got: list[Claims],
    feed: list[tuple[int, FeedEntry]],
    after_id: str,
) -> int:
    """Checks the leading events of a snapshot resumed from `start` (its position P, the
    last session delivered `after_id`) that are the feed's changes after P of sessions
    up to `after_id`, each with a cursor that resumes the same way; how many."""
    since = [(p, e) for p, e in feed if p > start.position and e.row.session_id <= after_id]
    i = 0
    while i < len(events) and got[i].ordinal == start.ordinal and not events[i].in_snapshot:
        assert i < len(since), "more changes since the snapshot than the feed holds"
        position, entry = since[i]
        event = events[i]
        seen = (got[i].position, got[i].check, event.event_type.value, event.session.session_id)
        check = mid_check(feed, position, after_id)
        assert seen == (position, check, entry.event_type, entry.row.session_id), i
        assert (event.session.incarnation, event.session.state.wire) == (
            entry.row.incarnation,
            entry.row.state,
        )
        i += 1
    return i


def check_run(j: Journal, engine: str, run: Run, feed: list[tuple[int, FeedEntry]]) -> bool:
    """Asserts `run` against the feed; True when its snapshot was shared (its position is
    behind the head its follow started at)."""
    events = run.events
    got = [claims(j, e.cursor) for e in events]
    start = None if run.cursor is None else claims(j, run.cursor)
    if start is not None and start.ordinal == 0:
        return check_live(events, got, feed, start.position)
    if start is None or start.ordinal == FRESH:
        i, point = check_snapshot_rows(engine, events, got, feed, None)
        if point is None:
            return False
        return check_live(events[i:], got[i:], feed, point) or point < run.started_at_head - 1
    # Resumed inside a snapshot: the changes since of the sessions delivered, the rest of
    # a snapshot, then live.
    after_id = id_of(feed, start.ordinal - MID)
    i = check_changes_since(start, events, got, feed, after_id)
    k, point = check_snapshot_rows(engine, events[i:], got[i:], feed, after_id)
    if point is None:
        if i == len(events):
            return False
        # No session after `after_id` was left: live events follow the changes since.
        point = got[i].position - 1
        assert not [s for s in registry_at(feed, point) if s > after_id], (point, after_id)
    since = [p for p, e in feed if start.position < p <= point and e.row.session_id <= after_id]
    assert i == len(since), f"{len(since) - i} changes since the snapshot missing"
    i += k
    return check_live(events[i:], got[i:], feed, point) or point < run.started_at_head - 1


def check_live(
    events: list[LifecycleEvent], got: list[Claims], feed: list[tuple[int, FeedEntry]], after: int
) -> bool:
    """Live events: the feed entries after `after`, in order, each once."""
    tail = [(p, e) for p, e in feed if p > after]
    assert len(events) <= len(tail), "more live events than feed entries after the position"
    for k, (event, claim, (position, entry)) in enumerate(
        zip(events, got, tail[: len(events)], strict=True)
    ):
        seen = (claim.ordinal, claim.position, event.event_type.value, event.session.session_id)
        assert seen == (0, position, entry.event_type, entry.row.session_id), (
            f"live event {k} after position {after}: {seen} where the feed has "
            f"{(position, entry.event_type, entry.row.session_id)}"
        )
        assert claim.check is not None
        assert not event.in_snapshot
        assert event.session.incarnation == entry.row.incarnation
        assert event.session.state.wire == entry.row.state
    return False


def head(j: Journal) -> int:
    return engine_of(j).feed(0, 0)[1]


def change(j: Journal, session: str, how: int) -> None:
    """A change to `session` if the journal allows it (create, a transition)."""
    with contextlib.suppress(IllegalTransition, SessionExists, SessionNotFound):
        if how == 0:
            j.create_session(session)
        elif how == 1:
            j.suspend_session(session)
        elif how == 2:
            j.resume_session(session)
        elif how == 3:
            j.cancel_session(session)
        else:
            j.resolve_session(session)


def evict(j: Journal) -> None:
    j.apply_retention(now_ms=time.time_ns() // 1_000_000 + 7_200_000)


# -- one thread, every interleaving hypothesis picks ------------------------------------------

_CHANGE = st.tuples(st.just("change"), st.integers(0, len(IDS) - 1), st.integers(0, 4))
_BURST = st.tuples(st.just("burst"), st.integers(1, SNAPSHOT_REUSE + 8), st.integers(0, 4))
# (a follow takes its snapshot at its first event: most take one or two at once)
_START = st.tuples(
    st.just("start"), st.integers(0, 3), st.integers(0, 5), st.sampled_from([1, 2, 0])
)
# (mostly a little: a follow inside its snapshot is one a new follow may share)
_ADVANCE = st.tuples(st.just("advance"), st.integers(0, 3), st.sampled_from([1, 2, 70, 400]))
OPS = st.one_of(
    _START,
    _ADVANCE,
    _BURST,
    _START,
    _ADVANCE,
    _CHANGE,
    _START,
    _ADVANCE,
    st.tuples(st.just("evict")),
    st.tuples(st.just("close"), st.integers(0, 3)),
)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Path]]:
    """A fresh store path per hypothesis example."""
    base = tmp_path_factory.mktemp("snapshots")
    yield [base / f"s{i}" for i in range(10_000)]


def test_follows_started_resumed_and_stopped_in_any_order_match_the_feed(
    engine: EngineFactory, stores: list[Path]
) -> None:
    """Hypothesis picks the changes and when follows start (fresh, or from a cursor an
    earlier one gave), take events and stop. (Breaking the code checked it: a shared
    snapshot resumed from the head instead of its own position failed within 150
    examples; its last-but-one event given the snapshot's cursor, a copy kept after
    every follow stopped, a row skipped at a page's end: within 40. The default run
    takes 60 examples on the local engine, 150 took 33 s of CI's 15 minutes; `-m slow`
    runs 300.)"""
    _follows_in_any_order(engine, stores, more=False)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [p for p in engine_params() if p.values[0] in ("local", "jetstream")]
)
def test_more_follows_in_any_order_match_the_feed(name: str, stores: list[Path]) -> None:
    """The test above with more examples (not on the cluster: `-m slow` starts none)."""
    _follows_in_any_order(ENGINES[name], stores, more=True)


def _follows_in_any_order(engine: EngineFactory, stores: list[Path], *, more: bool) -> None:
    local = engine.name == "local"

    @settings(
        max_examples=(300 if local else 40) if more else (60 if local else 8),
        suppress_health_check=list(HealthCheck),
    )
    @given(
        sessions=st.integers(1, 2 * SNAPSHOT_PAGE + 10),
        ops=st.lists(OPS, min_size=4, max_size=40),
    )
    def check(sessions: int, ops: list[tuple[Any, ...]]) -> None:
        with engine.open(stores.pop(), durability="os", retention=EVICT_LATER) as j:
            shared = run_ops(j, engine.name, sessions, ops)
        target(float(shared))  # (follows that shared a snapshot changes came after)

    check()


def run_ops(j: Journal, engine: str, sessions: int, ops: list[tuple[Any, ...]]) -> int:
    """Runs `ops`, checks every follow against the feed; how many shared a snapshot that
    changes came after."""
    j.create_session("anchor")
    for session in IDS[:sessions]:
        j.create_session(session)
    stop = threading.Event()
    timer = threading.Timer(WAIT_S, stop.set)
    timer.daemon = True
    timer.start()
    runs: list[Run] = []
    open_: dict[int, tuple[Run, Stream[LifecycleEvent]]] = {}

    def advance(w: int, count: int) -> None:
        run, feed = open_[w]
        for _ in range(min(count, available(j, run))):
            run.events.append(next(feed))

    def close(w: int) -> None:
        if w in open_:
            _, feed = open_.pop(w)
            feed.close()

    try:
        for op in ops:
            if op[0] == "change":
                change(j, IDS[op[1]], op[2])
            elif op[0] == "burst":  # (past the reuse bound, or not)
                for k in range(op[1]):
                    change(j, IDS[(op[2] * 37 + k) % len(IDS)], (op[2] + k) % 5)
            elif op[0] == "evict":
                evict(j)
            elif op[0] == "start":
                w, how = op[1], op[2]
                close(w)
                cursors = [e.cursor for r in runs for e in r.events]
                cursor = None if how < 2 or not cursors else cursors[-1 - how * 7 % len(cursors)]
                run = Run(cursor, started_at_head=head(j))
                runs.append(run)
                open_[w] = (run, j.watch_sessions(cursor, stop=stop))
                advance(w, op[3] if len(op) > 3 else 0)
            elif op[0] == "advance":
                if op[1] in open_:
                    advance(op[1], op[2])
            else:
                close(op[1])
        for w in list(open_):  # (each delivers everything there is, then stops)
            while available(j, open_[w][0]):
                advance(w, 1_000)
            close(w)
        assert not stop.is_set(), "a follow did not deliver what the feed holds"
    finally:
        timer.cancel()
        for w in list(open_):
            close(w)
    feed = reference_feed(j)
    shared = sum(check_run(j, engine, run, feed) for run in runs)
    gc.collect()
    assert shared_copy(j) is None, "a snapshot copy held after every follow stopped"
    return shared


@pytest.mark.parametrize(
    "ops",
    [
        # b shares a's snapshot, past which sessions were evicted and re-created
        [
            ("start", 0, 0),
            ("advance", 0, 1),
            ("burst", 6, 3),
            ("evict",),
            ("burst", 6, 0),
            ("start", 1, 0),
            ("advance", 1, 500),
            ("advance", 0, 500),
        ],
        # a cursor of a shared snapshot's event before its last, and of its last
        [
            ("start", 0, 0),
            ("advance", 0, 1),
            ("change", 5, 1),
            ("start", 1, 0),
            ("advance", 1, 2),
            ("start", 2, 2),
            ("advance", 1, 300),
            ("start", 3, 3),
        ],
        # past the reuse bound: a copy of its own
        [
            ("start", 0, 0),
            ("advance", 0, 1),
            ("burst", SNAPSHOT_REUSE + 1, 1),
            ("start", 1, 0),
            ("advance", 1, 1),
        ],
    ],
)
def test_follows_sharing_a_snapshot_match_the_feed(
    engine: EngineFactory, store: Path, ops: list[tuple[Any, ...]]
) -> None:
    with engine.open(store, durability="os", retention=EVICT_LATER) as j:
        run_ops(j, engine.name, SNAPSHOT_PAGE + 20, ops)


# -- threads and asyncio tasks at once -----------------------------------------------------


def test_follows_from_threads_and_tasks_while_sessions_change_match_the_feed(
    engine: EngineFactory, store: Path, rng: random.Random
) -> None:
    """Writers create, change, evict and re-create sessions while follow threads and
    asyncio tasks start (fresh or from a cursor they were given), read a little of their
    snapshot or more, and stop; each run is checked against the feed, some of them shared
    a snapshot, and each follower's last run reads up to the head."""
    with engine.open(store, durability="os", retention=EVICT_LATER) as j:
        j.create_session("anchor")
        for session in IDS[: SNAPSHOT_PAGE * 2]:
            j.create_session(session)
        stop = threading.Event()
        writing = threading.Event()
        runs: list[Run] = []
        lock = threading.Lock()
        seeds = [rng.randrange(1 << 30) for _ in range(8)]
        errors: list[BaseException] = []

        def cursor_for(r: random.Random, mine: list[Run]) -> str | None:
            cursors = [e.cursor for run in mine for e in run.events]
            return r.choice(cursors) if cursors and r.random() < 0.4 else None

        def writer(seed: int) -> None:
            r = random.Random(seed)
            try:
                while writing.is_set():
                    if r.random() < 0.02:
                        evict(j)
                    else:
                        change(j, r.choice(IDS), r.randrange(5))
            except BaseException as e:
                errors.append(e)

        def follower(seed: int, final: threading.Event) -> None:
            r = random.Random(seed)
            mine: list[Run] = []
            try:
                while True:
                    last = final.is_set()
                    run = Run(cursor_for(r, mine), started_at_head=head(j))
                    with j.watch_sessions(run.cursor, stop=stop) as feed:
                        want = 10**9 if last else r.choice([1, 2, SNAPSHOT_PAGE, 200])
                        while want and (n := available(j, run, last)):
                            for _ in range(min(n, want)):
                                run.events.append(next(feed))
                                want -= 1
                            if not last:
                                time.sleep(r.random() * 0.003)
                    mine.append(run)
                    if last:
                        break
            except BaseException as e:
                errors.append(e)
            with lock:
                runs.extend(mine)

        async def tasks(seed: int, final: threading.Event) -> None:
            async def one(r: random.Random) -> None:
                mine: list[Run] = []
                while True:
                    last = final.is_set()
                    run = Run(cursor_for(r, mine), started_at_head=head(j))
                    feed = j.awatch_sessions(run.cursor)
                    try:
                        want = 10**9 if last else r.choice([1, 3, SNAPSHOT_PAGE + 1, 150])
                        while want and (n := available(j, run, last)):
                            for _ in range(min(n, want)):
                                run.events.append(await asyncio.wait_for(anext(feed), WAIT_S))
                                want -= 1
                            await asyncio.sleep(r.random() * 0.003)
                    finally:
                        await feed.aclose()  # type: ignore[attr-defined]
                    mine.append(run)
                    if last:
                        break
                with lock:
                    runs.extend(mine)

            r = random.Random(seed)
            await asyncio.gather(*(one(random.Random(r.random())) for _ in range(6)))

        def loop(seed: int, final: threading.Event) -> None:
            try:
                asyncio.run(tasks(seed, final))
            except BaseException as e:
                errors.append(e)

        final = threading.Event()
        writing.set()
        threads = [threading.Thread(target=writer, args=(s,)) for s in seeds[:2]]
        threads += [threading.Thread(target=follower, args=(s, final)) for s in seeds[2:7]]
        threads.append(threading.Thread(target=loop, args=(seeds[7], final)))
        for thread in threads:
            thread.start()
        time.sleep(3.0)
        writing.clear()
        for thread in threads[:2]:
            thread.join()
        final.set()  # (each follower's next run reads everything, then they end)
        for thread in threads[2:]:
            thread.join(120)
        stop.set()
        assert not errors, errors
        assert not any(thread.is_alive() for thread in threads)
        feed = reference_feed(j)
        shared = sum(check_run(j, engine.name, run, feed) for run in runs)
        # (the final runs read everything: their state is the journal's)
        assert len(runs) > 30
        gc.collect()
        assert shared_copy(j) is None
        print(f"{len(runs)} runs, {shared} shared a snapshot, {len(feed)} feed entries")
        if engine.name == "local":
            assert shared > 0, "no follow shared a snapshot: the test missed its point"


# -- a damaged row in a shared copy ----------------------------------------------------------

_DAMAGE = """
import lmdb, sys
env = lmdb.open(sys.argv[1], max_dbs=16, map_size=1 << 36)
with env.begin(write=True) as txn:
    db = env.open_db(b"sessions", txn=txn)
    raw = bytearray(txn.get(sys.argv[2].encode(), db=db))
    raw[-1] ^= 0xFF  # (its checksum fails)
    txn.put(sys.argv[2].encode(), bytes(raw), db=db)
env.close()
"""


def test_a_snapshot_copy_with_a_damaged_row_is_not_shared_after_the_view_is_repaired(
    tmp_path: Path,
) -> None:
    """A row damaged under an open journal, copied by two follows that stall before its
    page; verify(fix=True) repairs the view. Until 2026-12-03 every follow started or
    resumed after the repair (resuming inside a snapshot takes a copy too) took the
    damaged copy the stalled follows held and raised JournalCorrupt at that row's page,
    for as long as they held it (3 of 3 tried). The stalled follows, which hold it, meet
    the damage; no follow after the repair does."""
    store = tmp_path / "s"
    ids = [f"s{i:03d}" for i in range(SNAPSHOT_PAGE + 30)]
    damaged = ids[SNAPSHOT_PAGE + 10]  # (on the second page)
    with Journal.open(store, durability="os") as j:
        for session in ids:
            j.create_session(session)
        subprocess.run([sys.executable, "-c", _DAMAGE, str(store / "index"), damaged], check=True)
        stop = threading.Event()
        stalled = [j.watch_sessions(stop=stop) for _ in range(2)]
        for feed in stalled:
            assert next(feed).session.session_id == ids[0]  # (each holds the copy now)
        with pytest.raises(JournalCorrupt):
            j.get_session(damaged)
        report = j.verify(fix=True)
        assert report.problems and report.fixed
        assert j.get_session(damaged).session_id == damaged
        assert j.verify().ok

        with j.watch_sessions(stop=stop) as after:
            got = [next(after) for _ in ids]
            assert [e.session.session_id for e in got] == ids
        # The stalled follows deliver their copy: they meet the damage...
        delivered: list[LifecycleEvent] = []
        with pytest.raises(JournalCorrupt):
            for _ in ids:
                delivered.append(next(stalled[0]))
        assert len(delivered) == SNAPSHOT_PAGE - 1
        # ...and resuming from the last cursor given gives every session after it, and a
        # new follow every session, while the other stalled follow still holds that copy.
        for cursor, expected in (
            (delivered[-1].cursor, ids[SNAPSHOT_PAGE:]),  # (it delivered ids[1:64])
            (got[5].cursor, ids[6:]),
            (None, ids),
        ):
            with j.watch_sessions(cursor, stop=stop) as again:
                assert [next(again).session.session_id for _ in expected] == expected
        stop.set()
        for feed in stalled:
            feed.close()


# -- a shared copy and the feed's pruning --------------------------------------------------


def test_a_snapshot_whose_feed_was_pruned_is_not_shared_and_its_follow_expires(
    tmp_path: Path,
) -> None:
    """A follows from a snapshot at P; then sessions made after P end, are evicted and
    their segments deleted, so the feed's floor passes P with fewer than SNAPSHOT_REUSE
    entries left after it. B, started then, must not share A's copy (it would expire at
    once after its snapshot): it takes its own and follows on. A delivers its whole
    snapshot, then raises CursorExpired, never skipping to what is left."""
    with Journal.open(
        tmp_path / "s", durability="os", segment_bytes=4096, retention=EVICT_LATER
    ) as j:
        j.create_session("anchor")
        ids = [f"a{i:03d}" for i in range(SNAPSHOT_PAGE + 5)]
        for session in ids:
            j.create_session(session)
        stop = threading.Event()
        a = j.watch_sessions(stop=stop)
        got_a = [next(a)]
        point = claims(j, got_a[0].cursor).position
        for i in range(30):  # (after P, in segments retention then deletes)
            j.create_session(f"gone{i:02d}")
            j.append(f"gone{i:02d}", [EventIn("m", b"x" * 200)])
            j.resolve_session(f"gone{i:02d}")
        evict(j)
        j.apply_retention()
        _, _, floor = engine_of(j).feed(0, 0)
        left, _, _ = engine_of(j).feed(floor, 10_000)
        assert floor > point and len(left) <= SNAPSHOT_REUSE, (floor, point, len(left))
        j.create_session("after")
        with j.watch_sessions(stop=stop) as b:
            got_b = [next(b) for _ in range(len(ids) + 2)]
            assert [e.session.session_id for e in got_b] == sorted(["after", "anchor", *ids])
            assert claims(j, got_b[-1].cursor).position >= floor
            j.suspend_session("after")
            changed = next(b)
            assert (changed.event_type, changed.session.session_id) == (
                LifecycleEventType.SUSPENDED,
                "after",
            )
        with pytest.raises(CursorExpired):
            while True:
                got_a.append(next(a))
        assert [e.session.session_id for e in got_a] == sorted(["anchor", *ids])
        stop.set()
        a.close()
