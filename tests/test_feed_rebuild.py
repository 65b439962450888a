"""A view rebuilt from the log answers the lifecycle calls as the view it replaces did, or
with `CursorExpired` where the live view still held changes a rebuild cannot make (SPEC
7.7 and 8): `watch_sessions` from every cursor, the startup snapshot and the listing,
after retention deleted segments or compaction dropped frames, plain or compressed,
rebuilt by a writer or as a read-only journal's private view.

Found by a reading of the projector: an evicted session whose creation record left the
log while its later lifecycle records (its end, its eviction) stayed kept their feed
entries in the live view, and a rebuild (after a reboot, `index/` deleted) could not make
them (it knows no session for those records), so a cursor from before them was given
the EVICTED changes by the one and nothing, silently, by the other.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _waiting import first_of

from journal import (
    CursorExpired,
    EventIn,
    Journal,
    JournalError,
    LifecycleEvent,
    RetentionPolicy,
)

SMALL_SEGMENTS = 4096
EVICT_LATER = RetentionPolicy(max_history_bytes=None, session_retention_ms=3_600_000)
SENTINEL = "zz-sentinel"  # created last: a watch has caught up when it delivers it


def open_store(path: Path, compressed: bool, readonly: bool = False) -> Journal:
    if readonly:
        return Journal.open(path, readonly=True)
    return Journal.open(
        path,
        durability="os",
        segment_bytes=SMALL_SEGMENTS,
        retention=EVICT_LATER,
        compress_sealed=compressed,
    )


def evict_all(j: Journal) -> list[str]:
    return j.apply_retention(now_ms=time.time_ns() // 1_000_000 + 7_200_000).evicted_sessions


def changes_after(
    j: Journal, cursor: str | None, last: str = SENTINEL
) -> list[LifecycleEvent] | tuple[Any, ...]:
    """What `watch_sessions(cursor)` gives up to the creation of `last`, or the
    `CursorExpired` it raises (its earliest ordinal and resume cursor)."""
    try:
        feed = j.watch_sessions(cursor=cursor, stop=threading.Event())
    except CursorExpired as expired:
        return ("expired", expired.earliest_ordinal, expired.resume_cursor)
    except JournalError as error:
        return (type(error).__name__, str(error), None)
    with feed:
        changes: list[LifecycleEvent] = []
        while not changes or changes[-1].session.session_id != last:
            change = first_of(feed, 10.0)
            assert isinstance(change, LifecycleEvent)
            changes.append(change)
            assert len(changes) < 10_000
    return changes


def changes_of(answer: list[LifecycleEvent] | tuple[Any, ...]) -> list[LifecycleEvent]:
    assert isinstance(answer, list), answer
    return answer


def answers(j: Journal, cursors: list[str]) -> dict[str, Any]:
    """The public answers of the lifecycle calls: the listing, the startup snapshot, and
    `watch_sessions` from each cursor."""
    found: dict[str, Any] = {
        "listing": list(j.list_sessions()),
        "snapshot": [(c.event_type, c.session) for c in changes_of(changes_after(j, None))],
    }
    for cursor in cursors:
        found[cursor] = changes_after(j, cursor)
    return found


def every_answer(j: Journal, cursors: list[str]) -> dict[str, Any]:
    """`answers` for `cursors` and for every cursor those answers hand out (of each change
    delivered but the sentinel's creation, after which nothing comes, and of each error),
    and so on."""
    found = answers(j, cursors)
    while True:
        more = []
        for answer in found.values():
            if isinstance(answer, tuple) and answer[2] is not None:
                more.append(answer[2])
            elif isinstance(answer, list) and answer and isinstance(answer[0], LifecycleEvent):
                more += [change.cursor for change in answer[:-1]]
        more = [cursor for cursor in dict.fromkeys(more) if cursor not in found]
        if not more:
            return found
        for cursor in more:
            found[cursor] = changes_after(j, cursor)


def sessions_beside_a_long_lived_one(j: Journal) -> None:
    """Evicted sessions share segments with one that stays: compaction drops their dead
    frames (creation records among them) from segments that stay."""
    j.create_session("keep")
    for i in range(40):
        j.append("keep", [EventIn("m", b"k" * 300)])
        session = f"s{i:02d}"
        j.create_session(session)
        j.append(session, [EventIn("m", b"x" * 300)])
        if i % 3:
            j.suspend_session(session)
            j.resume_session(session)
        j.resolve_session(session)


def sessions_apart(j: Journal) -> None:
    """Evicted sessions in segments of their own: retention deletes them."""
    j.create_session("anchor")
    for i in range(60):
        session = f"s{i:02d}"
        j.create_session(session)
        j.append(session, [EventIn("m", b"x" * 200)])
        j.resolve_session(session)


def ends_apart(j: Journal, others: int = 0) -> None:
    """Evicted sessions whose creation records stay (beside a long-lived session's events)
    while the records of their ends go (in a segment of their own, beside the trimmed
    events of a session with a small window): retention deletes that one. `others`:
    sessions ended and evicted beside the long-lived one (more tombstones than that
    segment holds records)."""
    j.create_session("keep")
    for i in range(others):
        j.create_session(f"other{i:02d}")
        j.resolve_session(f"other{i:02d}")
    for i in range(10):
        j.create_session(f"s{i:02d}")
        j.append("keep", [EventIn("m", b"k" * 300)])
    j.create_session("filler", max_history_bytes=1000)
    for _ in range(15):
        j.append("filler", [EventIn("m", b"f" * 300)])
    for i in range(10):
        j.resolve_session(f"s{i:02d}")
        j.append("filler", [EventIn("m", b"f" * 300)])
    for _ in range(15):
        j.append("filler", [EventIn("m", b"f" * 300)])


def ends_apart_among_many(j: Journal) -> None:
    ends_apart(j, others=60)


def compact(j: Journal) -> None:
    assert j.compact(dead_share=0.0).segments_rewritten


def nothing(j: Journal) -> None:
    pass


@pytest.mark.parametrize("readonly", [False, True], ids=["reopened", "read-only"])
@pytest.mark.parametrize("floor_file", [True, False], ids=["floor-recorded", "floor-file-lost"])
@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "compressed"])
@pytest.mark.parametrize(
    ("build", "reclaim"),
    [
        (sessions_apart, nothing),
        (sessions_beside_a_long_lived_one, compact),
        (ends_apart, nothing),
        (ends_apart_among_many, nothing),
    ],
    ids=["deleted-segments", "compacted-frames", "ends-deleted", "ends-deleted-among-many"],
)
def test_a_rebuilt_view_answers_lifecycle_calls_like_the_live_one(
    store: Path,
    compressed: bool,
    floor_file: bool,
    readonly: bool,
    build: Callable[[Journal], None],
    reclaim: Callable[[Journal], None],
) -> None:
    with open_store(store, compressed) as j:
        j.create_session("first")
        with j.watch_sessions(stop=threading.Event()) as feed:
            start = first_of(feed, 10.0).cursor  # (after the first creation)
        build(j)
        j.create_session("marker")
        cursors = [change.cursor for change in changes_of(changes_after(j, start, "marker"))]
        assert len(evict_all(j)) >= 10
        reclaim(j)
        j.create_session(SENTINEL)
        # (The live view keeps changes a rebuild cannot make: not a problem, SPEC 9.)
        assert j.verify().problems == []
        live = every_answer(j, [start, *cursors])
        cursors = [cursor for cursor in live if cursor not in ("listing", "snapshot")]
    # Rebuilt from the log at the next open (a read-only one builds a private view).
    shutil.rmtree(store / "index")
    if not floor_file:
        # A store from before the floor was recorded, or whose file was lost: judged
        # from the log alone (what it lacks, the changes it cannot make again).
        (store / "segments" / "feed-floor").unlink()
    with open_store(store, compressed, readonly=readonly) as j:
        rebuilt = answers(j, cursors)
    assert_rebuilt_answers(live, rebuilt)


def assert_rebuilt_answers(live: dict[str, Any], rebuilt: dict[str, Any]) -> None:
    """The rebuilt view's answers are the live view's, or `CursorExpired` where the live
    view still held changes a rebuild cannot make: never other changes, fewer of them or
    another error (SPEC 7.7)."""
    assert list(rebuilt) == list(live)
    assert rebuilt["listing"] == live["listing"]
    assert rebuilt["snapshot"] == live["snapshot"]
    same = 0
    for cursor, answer in live.items():
        if rebuilt[cursor] == answer:
            same += isinstance(answer, list)
            continue
        assert isinstance(rebuilt[cursor], tuple), (cursor, rebuilt[cursor], answer)
        assert rebuilt[cursor][0] == "expired", (cursor, rebuilt[cursor], answer)
        if isinstance(answer, tuple):  # (expired on both: the rebuilt floor is higher)
            assert answer[0] == "expired" and answer[1] < rebuilt[cursor][1], cursor
    assert same >= 1, "no cursor resumed on the rebuilt view: the check would be empty"


def random_history(j: Journal, rng: random.Random) -> None:
    """Sessions created, appended to, suspended, resumed, ended, snapshotted, evicted,
    compacted and passed over by retention, in a random order."""
    open_ids: list[str] = []
    for step in range(rng.randrange(50, 250)):
        roll = rng.random()
        if roll < 0.2 or not open_ids:
            open_ids.append(f"r{step:03d}")
            j.create_session(open_ids[-1])
            continue
        session = rng.choice(open_ids)
        with contextlib.suppress(JournalError):  # (a suspended session refuses some)
            if roll < 0.55:
                j.append(session, [EventIn("m", b"x" * rng.randrange(10, 600))])
            elif roll < 0.62:
                j.suspend_session(session)
            elif roll < 0.69:
                j.resume_session(session)
            elif roll < 0.8:
                j.resolve_session(session)
                open_ids.remove(session)
            elif roll < 0.85:
                last = j.get_session(session).last_ordinal
                if last:
                    j.compact_session(session, rng.randrange(1, last + 1), b"snapshot")
            elif roll < 0.9:
                evict_all(j)
            elif roll < 0.93:
                j.compact(dead_share=rng.choice([0.0, 0.3, 0.9]))
            else:
                j.apply_retention()


def without_ranges(found: dict[str, Any]) -> dict[str, Any]:
    """The answers with the retained range of each change's session left out: after a
    rebuild it counts only the events left in the log before the change (SPEC 8)."""
    return {
        key: [
            msgspec.structs.replace(
                change,
                session=msgspec.structs.replace(change.session, first_ordinal=0, last_ordinal=0),
            )
            for change in answer
        ]
        if isinstance(answer, list) and answer and isinstance(answer[0], LifecycleEvent)
        else answer
        for key, answer in found.items()
    }


def test_random_histories_rebuild_to_the_same_lifecycle_answers(
    store: Path, rng: random.Random
) -> None:
    for _ in range(4):
        shutil.rmtree(store, ignore_errors=True)
        compressed = rng.random() < 0.5
        with open_store(store, compressed) as j:
            j.create_session("first")
            with j.watch_sessions(stop=threading.Event()) as feed:
                start = first_of(feed, 10.0).cursor
            random_history(j, rng)
            j.create_session("marker")
            seen = changes_after(j, start, "marker")
            if isinstance(seen, tuple):  # (expired meanwhile: from what is kept)
                seen = changes_after(j, seen[2], "marker")
            cursors = [change.cursor for change in changes_of(seen)]
            evict_all(j)
            if rng.random() < 0.7:
                j.compact(dead_share=0.0)
            j.create_session(SENTINEL)
            assert j.verify().problems == []
            live = every_answer(j, [start, *cursors])
            cursors = [cursor for cursor in live if cursor not in ("listing", "snapshot")]
        shutil.rmtree(store / "index")
        with open_store(store, compressed) as j:
            rebuilt = answers(j, cursors)
        assert_rebuilt_answers(without_ranges(live), without_ranges(rebuilt))
