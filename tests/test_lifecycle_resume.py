"""Resuming `watch_sessions` from a startup snapshot's event before its last (SPEC 7.7,
"Resuming inside a startup snapshot"): the changes since of the sessions delivered, then
the snapshot's sessions after the last one delivered; `CursorExpired`, `CursorForeign` or
`CursorFuture` when that cannot be done, as for a feed cursor; cursors of earlier releases
(ordinal 1) still resume with a fresh snapshot."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from engines import EngineFactory

from cursors import TokenKind
from journal import (
    CursorExpired,
    CursorForeign,
    CursorFuture,
    EventIn,
    Journal,
    LifecycleEvent,
    LifecycleEventType,
    RetentionPolicy,
)

EVICT_LATER = RetentionPolicy(max_history_bytes=None, session_retention_ms=3_600_000)
IDS = [f"s{i:03d}" for i in range(30)]


def evict(j: Journal) -> None:
    j.apply_retention(now_ms=time.time_ns() // 1_000_000 + 7_200_000)


def take(j: Journal, cursor: str | None, count: int) -> list[LifecycleEvent]:
    stop = threading.Event()
    timer = threading.Timer(10.0, stop.set)
    timer.start()
    try:
        with j.watch_sessions(cursor, stop=stop) as feed:
            got = [event for _, event in zip(range(count), feed, strict=False)]
    finally:
        timer.cancel()
    assert len(got) == count, f"{len(got)} of {count} events"
    return got


def seen(events: list[LifecycleEvent]) -> list[tuple[str, str, bool]]:
    return [(e.event_type.value, e.session.session_id, e.in_snapshot) for e in events]


def forged(j: Journal, position: int, ordinal: int, check: int | None) -> str:
    """A lifecycle cursor this store signs (what an earlier release, or another history,
    issued)."""
    scope = j._lifecycle._scope  # noqa: SLF001
    return j._codec.encode(TokenKind.LIFECYCLE, scope, position, ordinal, check)  # noqa: SLF001


def test_the_last_delivered_session_evicted_before_the_restart(
    engine: EngineFactory, store: Path
) -> None:
    """The session a mid-snapshot cursor names ended and was evicted, and one created
    after the snapshot with an id before it was created and evicted too: the restart
    gives their changes, then the sessions after it."""
    with engine.open(store, durability="os", retention=EVICT_LATER) as j:
        for session in IDS:
            j.create_session(session)
        first = take(j, None, 10)
        assert [e.session.session_id for e in first] == IDS[:10]
        j.create_session("s005a")
        j.resolve_session("s005a")
        j.resolve_session("s009")
        j.suspend_session("s020")  # (after the last delivered: its row says it)
        evict(j)
        resumed = take(j, first[-1].cursor, 5 + 20)
        assert seen(resumed[:3]) == [
            ("created", "s005a", False),
            ("resolved", "s005a", False),
            ("resolved", "s009", False),
        ]
        assert sorted(seen(resumed[3:5])) == [
            ("evicted", "s005a", False),
            ("evicted", "s009", False),
        ]
        rest = resumed[5:]
        assert [e.session.session_id for e in rest] == IDS[10:]
        assert all(e.in_snapshot for e in rest)
        assert rest[10].session.state.value == "suspended"
        # A restart inside those changes goes on from there, the same way.
        again = take(j, resumed[1].cursor, 3 + 20)
        assert seen(again[:3]) == seen(resumed[2:5])
        assert [e.session.session_id for e in again[3:]] == IDS[10:]


def test_a_mid_snapshot_cursor_whose_feed_was_pruned_is_expired(tmp_path: Path) -> None:
    """Retention pruned the feed past the cursor's position: the changes since of the
    sessions delivered can no longer be given, so the restart raises `CursorExpired`
    (no `resume_cursor`: watch again without a cursor). Until 2026-12-04 it got a fresh
    snapshot, which never says that a session the watcher holds was evicted meanwhile."""
    with Journal.open(
        tmp_path / "s", durability="os", segment_bytes=4096, retention=EVICT_LATER
    ) as j:
        for session in IDS:
            j.create_session(session)
        first = take(j, None, 10)
        for i in range(30):  # (after P, in segments retention then deletes)
            j.create_session(f"gone{i:02d}")
            j.append(f"gone{i:02d}", [EventIn("m", b"x" * 200)])
            j.resolve_session(f"gone{i:02d}")
        evict(j)
        j.apply_retention()
        floor = j._engine.feed(0, 0)[2]  # noqa: SLF001
        position = j._codec.decode(  # noqa: SLF001
            first[-1].cursor,
            TokenKind.LIFECYCLE,
            j._lifecycle._scope,  # noqa: SLF001
        ).position
        assert floor > position, (floor, position)
        with pytest.raises(CursorExpired) as expired:
            j.watch_sessions(first[-1].cursor)
        assert expired.value.resume_cursor is None
        assert expired.value.earliest_ordinal == floor + 1
        assert "watch again without a cursor" in str(expired.value)


def test_cursors_of_earlier_releases_resume_with_a_fresh_snapshot_others_are_refused(
    engine: EngineFactory, store: Path
) -> None:
    """An ordinal-1 cursor (a snapshot event before its last, issued until 2026-12-04)
    resumes with a fresh snapshot as documented; a mid-snapshot cursor whose check does
    not give the session its incarnation names here (a store restored from an older copy
    and written since) is `CursorForeign`, one past the store's end `CursorFuture`."""
    with engine.open(store, durability="os") as j:
        for session in IDS:
            j.create_session(session)
        first = take(j, None, 10)
        claims = j._codec.decode(  # noqa: SLF001
            first[-1].cursor,
            TokenKind.LIFECYCLE,
            j._lifecycle._scope,  # noqa: SLF001
        )
        assert claims.ordinal == 2 + first[-1].session.incarnation
        assert take(j, first[-1].cursor, 1)[0].session.session_id == IDS[10]
        resumed = take(j, forged(j, claims.position, 1, None), len(IDS))
        assert seen(resumed) == [("created", s, True) for s in IDS]
        with pytest.raises(CursorForeign, match="restored from an older copy"):
            j.watch_sessions(forged(j, claims.position, claims.ordinal, (claims.check or 0) ^ 1))
        with pytest.raises(CursorFuture):
            j.watch_sessions(forged(j, claims.position + 10_000, claims.ordinal, claims.check))
        # Up to the largest position a token carries (u64): the local engine's read of
        # the feed before it raised struct.error there (adversarial trial, 2026-12-05).
        for position in (2**48, 2**63, 2**64 - 1):
            with pytest.raises(CursorFuture):
                j.watch_sessions(forged(j, position, claims.ordinal, None))
        # A mid-snapshot cursor naming incarnation 0 (no session has it: incarnations
        # start at 1): the JetStream engine asked the server for the message at sequence
        # 0 and raised `StoreUnavailable` "bad request (JetStream error 10003)" (a
        # review); it is a cursor of another history, as on the local engine.
        with pytest.raises(CursorForeign):
            j.watch_sessions(forged(j, claims.position, 2, 0))
        j.create_session("zz")
        resumed = take(j, forged(j, claims.position, 1, None), len(IDS) + 1)
        assert resumed[-1].event_type is LifecycleEventType.CREATED
        assert resumed[-1].session.session_id == "zz"


def test_a_mid_snapshot_cursor_after_a_restore_from_an_older_copy_written_since(
    engine: EngineFactory, store: Path, tmp_path: Path
) -> None:
    """The store was restored from a copy older than the snapshot's position P and
    written past P since; the session the cursor names was created before the copy,
    so its id and incarnation still match. The watcher was given a session (before that
    one in id order) that the copy never had: resuming after the sessions delivered
    would leave it believing in that session for ever. The restart is `CursorForeign`,
    as a feed cursor of another history is (before: it resumed in the copy's history,
    the copy's sessions after the last delivered and nothing about `s005a`; then, the
    same day, a fresh snapshot, which says nothing about `s005a` either)."""
    backup = tmp_path / "backup"
    with engine.open(store, durability="os") as j:
        for session in IDS:
            j.create_session(session)
    engine.copy_store(store, backup)
    with engine.open(store, durability="os") as j:
        j.create_session("s005a")  # (only in the original's history)
        first = take(j, None, 10)
        assert "s005a" in [e.session.session_id for e in first]
    with engine.open(backup, durability="os") as j:  # (the restored copy)
        for i in range(40):  # (past P, in the copy's history)
            j.create_session(f"z{i:02d}")
        with pytest.raises(CursorForeign, match="restored from an older copy"):
            j.watch_sessions(first[-1].cursor)


def test_a_restart_after_the_last_delivered_sessions_eviction_once_its_creation_left_the_log(
    tmp_path: Path,
) -> None:
    """The last session a mid-snapshot cursor delivered (X) was evicted; the watcher got
    its EVICTED as a change since and saved that event's cursor; compaction then dropped
    X's creation record, so its id is no longer known by incarnation, and another
    delivered session was evicted. The restart from that cursor finds X's id in its
    EVICTED entry (before the cursor's position) and gives the other eviction. (Before:
    it looked only after the position, fell back to a fresh snapshot, and a watcher
    folding the events never heard that `s003` was gone.)"""
    with Journal.open(
        tmp_path / "s", durability="os", segment_bytes=4096, retention=EVICT_LATER
    ) as j:
        for session in IDS:
            j.create_session(session)
        first = take(j, None, 10)
        j.resolve_session("s009")
        evict(j)
        since = take(j, first[-1].cursor, 2)
        assert seen(since) == [("resolved", "s009", False), ("evicted", "s009", False)]
        for i in range(40):  # (segments to seal and compact)
            j.create_session(f"z{i:02d}")
            j.append(f"z{i:02d}", [EventIn("m", b"x" * 300)])
        j.compact(dead_share=0.0)
        incarnation = first[-1].session.incarnation
        assert j._engine.session_id_of(incarnation) is None  # noqa: SLF001
        j.resolve_session("s003")
        evict(j)
        resumed = take(j, since[-1].cursor, 2 + 20 + 40)
        assert seen(resumed[:2]) == [("resolved", "s003", False), ("evicted", "s003", False)]
        rest = [e.session.session_id for e in resumed[2:]]
        assert rest == IDS[10:] + [f"z{i:02d}" for i in range(40)]


def test_the_feed_pruned_while_a_resumed_snapshot_delivers_its_changes_since(
    tmp_path: Path,
) -> None:
    """Retention prunes the feed while a resumed snapshot is still giving the changes
    since of the sessions delivered (more than one batch of them): the follow raises
    `CursorExpired` without `resume_cursor`, as at the start. Before 2026-12-05 its
    `resume_cursor` was a feed cursor after the floor, and a watcher that took it never
    got the snapshot's sessions after the last one delivered (`s010` to `s029`)."""
    with Journal.open(
        tmp_path / "s", durability="os", segment_bytes=4096, retention=EVICT_LATER
    ) as j:
        for session in IDS:
            j.create_session(session)
        first = take(j, None, 10)
        changed = [f"s005_{i:03d}" for i in range(300)]  # (before `s009`: delivered)
        for session in changed:
            j.create_session(session)
            j.append(session, [EventIn("m", b"x" * 200)])
            j.resolve_session(session)
        stop = threading.Event()
        timer = threading.Timer(10.0, stop.set)
        timer.start()
        got: list[LifecycleEvent] = []
        try:
            with (
                j.watch_sessions(first[-1].cursor, stop=stop) as feed,
                pytest.raises(CursorExpired) as expired,
            ):
                for event in feed:
                    got.append(event)
                    if len(got) == 1:
                        evict(j)  # (the changes since leave the feed's kept range)
                        j.apply_retention()
        finally:
            timer.cancel()
        assert seen(got[:2]) == [("created", changed[0], False), ("resolved", changed[0], False)]
        assert not any(e.in_snapshot for e in got), "the rows after s009 came after the gap"
        assert expired.value.resume_cursor is None
        assert "watch again without a cursor" in str(expired.value)
