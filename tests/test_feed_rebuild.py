"""A view rebuilt from the log answers the lifecycle calls like the view it replaces (SPEC
7.7 and 8): `watch_sessions` from every cursor (the changes it delivers, or the same
`CursorExpired`), the startup snapshot and the listing, after retention deleted segments
or compaction dropped frames, plain or compressed.

Found by a reading of the projector: an evicted session whose creation record left the
log while its later lifecycle records (its end, its eviction) stayed kept their feed
entries in the live view, and a rebuild (after a reboot, `index/` deleted) could not make
them (it knows no session for those records), so a cursor from before them was given
the EVICTED changes by the one and nothing by the other.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def open_store(path: Path, compressed: bool) -> Journal:
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
    segment holds records: `tombstones.forget_ended` reads its feed entries then)."""
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
        live = every_answer(j, [start, *cursors])
        cursors = [cursor for cursor in live if cursor not in ("listing", "snapshot")]
    shutil.rmtree(store / "index")  # rebuilt from the log at the next open
    if not floor_file:
        # A store from before the floor was recorded, or whose file was lost: judged
        # from the log alone (what it lacks, the changes it cannot make again).
        (store / "segments" / "feed-floor").unlink()
    with open_store(store, compressed) as j:
        rebuilt = answers(j, cursors)
    assert list(rebuilt) == list(live)
    for cursor, answer in live.items():
        assert rebuilt[cursor] == answer, cursor
