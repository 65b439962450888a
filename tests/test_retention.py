"""Retention, snapshots, compaction and verification: one test per rule.

History windows (bytes, age, per-session overrides) work at append-batch granularity and
only ever move `first_ordinal` up; session retention evicts terminal sessions (EVICTED in
the lifecycle feed, the id reusable, old cursors foreign); `compact_session` trades a prefix
for a snapshot; a cursor below the retained range raises `CursorExpired` (never a silent
jump); `compact()` reclaims dead bytes without changing anything a reader can observe; and
`verify()` names damage by segment and frame offset, and `verify(fix=True)` rebuilds the
view so the store reads exactly as before.

Payloads are derived from (session, ordinal), so every event read back checks itself.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import shutil
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _waiting as waiting
import lmdb
import msgspec
import pytest
from _local_engine import open_local
from click.testing import CliRunner
from engines import ENGINES, EngineFactory, JetStreamEngineFactory, engine_params
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cli.main import main as journal_cli
from journal import (
    CompactionReport,
    CursorExpired,
    CursorForeign,
    Event,
    EventIn,
    InvalidArgument,
    InvalidPageToken,
    Journal,
    JournalCorrupt,
    JournalError,
    LifecycleEventType,
    RetentionPolicy,
    RetentionReport,
    SessionNotFound,
    SessionState,
    Snapshot,
    StoreIncompatible,
)
from journal._local.compaction import SwapSegment, compact_store
from journal._local.files import FileOps
from journal._local.frames import segment_name
from journal._local.segments import SegmentReader

BIG_SEGMENTS = 1 << 20  # no rotation, so no automatic retention pass unless a test wants one
SMALL_SEGMENTS = 8192
NO_WINDOWS = RetentionPolicy(max_history_bytes=None)
DAY_MS = 24 * 3600 * 1000
HOUR_MS = 3600 * 1000
WAIT_S = 15.0
FRAME_HEADER = struct.Struct(">4sIIQI")  # magic, body length, crc32, first position, count
SEGMENT_HEADER_SIZE = 64


# -- helpers ---------------------------------------------------------------------------------


def payload(session_id: str, ordinal: int, size: int = 40) -> bytes:
    """Exactly `size` bytes (at least the prefix) that only (session, ordinal) produce;
    incompressible, like real payloads, so compression does not hide dead bytes."""
    prefix = f"{session_id}:{ordinal}:".encode()
    return prefix + random.Random(prefix).randbytes(max(0, size - len(prefix)))


def open_store(
    path: Path,
    retention: RetentionPolicy = NO_WINDOWS,
    segment_bytes: int = BIG_SEGMENTS,
    **options: Any,
) -> Journal:
    return Journal.open(
        path, durability="os", segment_bytes=segment_bytes, retention=retention, **options
    )


def append_batch(j: Journal, session_id: str, sizes: list[int]) -> tuple[int, int]:
    """Append one batch of events of `sizes` bytes; returns its (first, last) ordinal."""
    first = j.get_session(session_id).last_ordinal + 1
    batch = [EventIn(type="m", data=payload(session_id, first + i, s)) for i, s in enumerate(sizes)]
    result = j.append(session_id, batch)
    assert (result.first_ordinal, result.last_ordinal) == (first, first + len(sizes) - 1)
    return result.first_ordinal, result.last_ordinal


def check_event(event: Event, session_id: str) -> None:
    assert event.session_id == session_id
    assert event.data == payload(session_id, event.ordinal, len(event.data)), event


def retained(j: Journal, session_id: str) -> list[int]:
    """The ordinals a full replay yields (every payload checked)."""
    events = list(j.replay(session_id))
    for event in events:
        check_event(event, session_id)
    return [e.ordinal for e in events]


def assert_range(j: Journal, session_id: str, first: int, last: int) -> None:
    meta = j.get_session(session_id)
    assert (meta.first_ordinal, meta.last_ordinal) == (first, last), meta
    assert retained(j, session_id) == list(range(first, last + 1))


def bytes_window_first(batches: list[tuple[int, int, int]], limit: int) -> int:
    """First ordinal the bytes rule keeps: the longest run of newest whole batches whose
    data fits in `limit`, and always the newest batch. `batches` is (first, last, bytes)."""
    keep = len(batches) - 1
    total = batches[keep][2]
    while keep > 0 and total + batches[keep - 1][2] <= limit:
        keep -= 1
        total += batches[keep][2]
    return batches[keep][0]


def segment_files(path: Path) -> list[str]:
    """Names of the segment files (plain and compressed), in position order."""
    return sorted(
        name for name in os.listdir(path / "segments") if name.endswith((".seg", ".seg.zst"))
    )


def frame_offsets(segment: Path) -> list[int]:
    """Byte offsets of the frames of a plain segment file."""
    data = segment.read_bytes()
    offsets = []
    at = SEGMENT_HEADER_SIZE
    while at + FRAME_HEADER.size <= len(data):
        magic, length, _, _, _ = FRAME_HEADER.unpack_from(data, at)
        if magic != b"SJFR":
            break
        offsets.append(at)
        at += FRAME_HEADER.size + length
    return offsets


def flip_bit(file: Path, offset: int, bit: int = 3) -> None:
    with open(file, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def outcome(call: Callable[[], Any]) -> Any:
    """What a read-like call gives: its value, or the error class with its telling fields."""
    try:
        return ("ok", call())
    except CursorExpired as e:
        return ("CursorExpired", e.earliest_ordinal, e.code, e.status)
    except JournalError as e:
        return (type(e).__name__, e.code, e.status)


def event_view(events: list[Event]) -> list[tuple[Any, ...]]:
    return [
        (e.session_id, e.ordinal, e.type, e.data, e.request_id, e.timestamp_ms, e.position)
        for e in events
    ]


def first_of(iterator: Iterator[Any], timeout: float = WAIT_S) -> Any:
    return waiting.first_of(iterator, timeout)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


# -- history windows: bytes --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "batches", "expected_first"),
    [
        # (sizes of each batch's events), oldest first
        (1000, [[300, 100], [500], [200, 200], [50], [400]], 4),  # 400+50+400 fits, +500 not
        (849, [[300, 100], [500], [200, 200], [50], [400]], 6),  # 850 is one byte too many
        (1350, [[300, 100], [500], [200, 200], [50], [400]], 3),  # exactly at the limit stays
        (1749, [[300, 100], [500], [200, 200], [50], [400]], 3),
        (1750, [[300, 100], [500], [200, 200], [50], [400]], 1),
        (100, [[300], [200], [700, 700]], 3),  # the newest batch stays even if alone too big
        (5000, [[300], [200], [700, 700]], 1),  # within the limit: nothing leaves
    ],
)
def test_bytes_window_drops_oldest_whole_batches_until_within_limit(
    store: Path, limit: int, batches: list[list[int]], expected_first: int
) -> None:
    with open_store(store, RetentionPolicy(max_history_bytes=limit)) as j:
        j.create_session("s")
        ranges = [append_batch(j, "s", sizes) for sizes in batches]
        model = [(f, la, sum(sizes)) for (f, la), sizes in zip(ranges, batches, strict=True)]
        assert bytes_window_first(model, limit) == expected_first  # the test's own model
        last = ranges[-1][1]
        report = j.apply_retention()
        assert isinstance(report, RetentionReport)
        assert report.trimmed_sessions == (["s"] if expected_first > 1 else [])
        assert report.evicted_sessions == []
        assert_range(j, "s", expected_first, last)
        # A second pass finds nothing more to do.
        assert j.apply_retention().trimmed_sessions == []
        assert_range(j, "s", expected_first, last)


@given(
    limit=st.integers(50, 3000),
    steps=st.lists(
        st.one_of(
            st.lists(st.sampled_from([1, 40, 150, 600, 1200]), min_size=1, max_size=4),
            st.just("apply"),
        ),
        min_size=1,
        max_size=14,
    ),
)
def test_bytes_window_matches_the_batch_model_across_appends_and_passes(
    tmp_path_factory: pytest.TempPathFactory, limit: int, steps: list[Any]
) -> None:
    store = tmp_path_factory.mktemp("bytes") / "store"
    batches: list[tuple[int, int, int]] = []
    first = 1
    with open_store(store, RetentionPolicy(max_history_bytes=limit)) as j:
        j.create_session("s")
        for step in steps:
            if step == "apply":
                report = j.apply_retention()
                if batches:
                    new_first = max(first, bytes_window_first(batches, limit))
                    assert report.trimmed_sessions == (["s"] if new_first > first else [])
                    first = new_first
                last = batches[-1][1] if batches else 0
                assert_range(j, "s", first, last)
            else:
                f, la = append_batch(j, "s", step)
                batches.append((f, la, sum(step)))


def test_per_session_bytes_override_beats_the_store_window(store: Path) -> None:
    with open_store(store, RetentionPolicy(max_history_bytes=1000)) as j:
        j.create_session("default")
        j.create_session("wider", max_history_bytes=2500)
        j.create_session("narrower", max_history_bytes=300)
        for _ in range(6):
            for session_id in ("default", "wider", "narrower"):
                append_batch(j, session_id, [200, 200])
        report = j.apply_retention()
        assert sorted(report.trimmed_sessions) == ["default", "narrower"]
        assert_range(j, "default", 9, 12)  # two batches of 400
        assert_range(j, "wider", 1, 12)  # all six (2400 bytes) fit its own window
        assert_range(j, "narrower", 11, 12)  # the newest batch alone (400 > 300)
        for session_id in ("default", "wider", "narrower"):
            append_batch(j, session_id, [200, 200])
        j.apply_retention()
        assert_range(j, "default", 11, 14)
        assert_range(j, "wider", 3, 14)
        assert_range(j, "narrower", 13, 14)


def test_history_window_trims_by_itself_when_a_segment_is_sealed(store: Path) -> None:
    policy = RetentionPolicy(max_history_bytes=2000)
    with open_store(store, policy, segment_bytes=SMALL_SEGMENTS) as j:
        j.create_session("s")
        for _ in range(120):
            append_batch(j, "s", [500])
            # Disk use stays bounded without anyone calling apply_retention.
            assert len(segment_files(store)) <= 4, segment_files(store)
        meta = j.get_session("s")
        assert meta.last_ordinal == 120
        # Trimmed at the last seal (and only whole batches): at most one segment's worth
        # of appends behind the window of 4 batches.
        assert 100 < meta.first_ordinal <= 117, meta
        assert retained(j, "s") == list(range(meta.first_ordinal, 121))


# -- history windows: age ----------------------------------------------------------------------


def _timed_batches(j: Journal, session_id: str, count: int) -> list[tuple[int, int, int]]:
    """`count` batches committed in distinct milliseconds: (first, last, commit time)."""
    batches = []
    for _ in range(count):
        first, last = append_batch(j, session_id, [30, 30])
        stamp = j.read(session_id, cursor=None, max_bytes=1 << 30).events[-1].timestamp_ms
        batches.append((first, last, stamp))
        time.sleep(0.003)
    stamps = [stamp for _, _, stamp in batches]
    assert stamps == sorted(set(stamps)), "batches must commit in distinct milliseconds"
    return batches


@pytest.mark.parametrize("keep_from", [0, 1, 3, 4])
def test_age_window_drops_batches_committed_before_the_horizon(store: Path, keep_from: int) -> None:
    age = 60_000
    with open_store(store, RetentionPolicy(max_history_bytes=None, max_history_age_ms=age)) as j:
        j.create_session("s")
        batches = _timed_batches(j, "s", 5)
        # The horizon is exactly the commit time of the batch that stays: "older" is strict.
        now = batches[keep_from][2] + age
        report = j.apply_retention(now_ms=now)
        first = batches[keep_from][0]
        assert report.trimmed_sessions == (["s"] if first > 1 else [])
        assert_range(j, "s", first, 10)
        # One millisecond later that batch is older than the horizon too.
        j.apply_retention(now_ms=now + 1)
        next_first = batches[keep_from + 1][0] if keep_from + 1 < len(batches) else 11
        assert_range(j, "s", next_first, 10)


def test_age_window_with_every_batch_older_keeps_nothing(store: Path) -> None:
    age = 1000
    with open_store(store, RetentionPolicy(max_history_bytes=None, max_history_age_ms=age)) as j:
        j.create_session("s")
        batches = _timed_batches(j, "s", 3)
        middle = j.read("s", max_bytes=1).events[0]  # the cursor of ordinal 1
        last_cursor = list(j.replay("s"))[-1].cursor
        report = j.apply_retention(now_ms=batches[-1][2] + age + 1)
        assert report.trimmed_sessions == ["s"]
        meta = j.get_session("s")
        assert (meta.first_ordinal, meta.last_ordinal) == (7, 6)
        assert j.read("s").events == []
        assert list(j.replay("s")) == []
        # The newest cursor is still exactly at the end; an older one has expired.
        assert j.read("s", cursor=last_cursor).events == []
        with pytest.raises(CursorExpired) as info:
            j.read("s", cursor=middle.cursor)
        assert info.value.earliest_ordinal == 7
        # Ordinals never restart: the next append continues after 6.
        assert append_batch(j, "s", [10]) == (7, 7)
        assert [e.ordinal for e in j.read("s", cursor=last_cursor).events] == [7]


def test_age_window_keeps_recent_batches_before_a_newest_one_stamped_by_a_clock_stepped_back(
    store: Path, tmp_path: Path
) -> None:
    """Commit times follow the wall clock, which may step back: a batch committed ten
    minutes ago, then one a minute later by a clock a day behind (the newest). The window
    keeps from the first batch committed within it; until 2026-12-05 the newest batch
    being older than the window made the pass trim every batch, so a clock wrong for a
    minute (then corrected) cost every session that appended in that minute, and not
    since, its recent history (found by a clock-jump trial). An archive is the seam that
    stamps events (each batch in its own frame: events of 2.5 MiB, 4 MiB a frame)."""
    from _archives import write_one_session

    from journal.archive import ArchiveEvent

    age = 3_600_000
    now = int(time.time() * 1000)
    stamps = (now - 10 * 60_000, now - DAY_MS - 9 * 60_000)
    archive = tmp_path / "stepped.archive"
    write_one_session(
        archive,
        "s",
        [ArchiveEvent(o, "m", stamps[o - 1], None, payload("s", o, 5 << 19)) for o in (1, 2)],
        exported_at_ms=now,
        created_at_ms=now - 20 * 60_000,
        max_history_age_ms=age,
    )
    with open_store(store) as j:
        j.import_sessions(archive)
        assert [e.timestamp_ms for e in j.replay("s")] == list(stamps)
        report = j.apply_retention(now_ms=now)
        assert report.trimmed_sessions == []
        assert_range(j, "s", 1, 2)
        # Once the first batch is older than the window, both leave (a prefix).
        report = j.apply_retention(now_ms=stamps[0] + age + 1)
        assert report.trimmed_sessions == ["s"]
        assert_range(j, "s", 3, 2)


# Age windows when commit times step back (SPEC 8). Appends are stamped by the clock as
# they commit; an import is the seam that stamps other times: events imported stamped a
# day ahead of the appends after them stand for a clock that stepped back a day between
# them (a pass's `now_ms` places the window).


def stamps_of(j: Journal, session_id: str) -> list[int]:
    return [e.timestamp_ms for e in j.replay(session_id)]


def append_spaced(j: Journal, session_id: str, batches: int) -> list[int]:
    """`batches` appends of two events each, a few milliseconds apart; the commit time of
    each (checked to grow, so that a window can fall between any two)."""
    for _ in range(batches):
        time.sleep(0.003)
        append_batch(j, session_id, [40, 40])
    stamps = stamps_of(j, session_id)[-2 * batches :]
    times = stamps[::2]
    assert stamps[1::2] == times, stamps  # (the events of a batch share its time)
    assert all(a < b for a, b in itertools.pairwise(times)), times
    return times


def open_stepped(
    engine: EngineFactory, tmp_path: Path, imported: list[int], batches: int
) -> tuple[Journal, list[int]]:
    """A store whose session "s" (an age window of an hour) holds events imported stamped
    `imported` (one batch on JetStream, one frame on the local engine), then `batches`
    appends of two events stamped as they commit; and the commit time of each append."""
    from _archives import write_one_session

    from journal.archive import ArchiveEvent

    now = int(time.time() * 1000)
    archive = tmp_path / "stepped.archive"
    write_one_session(
        archive,
        "s",
        [ArchiveEvent(o, "m", t, None, payload("s", o)) for o, t in enumerate(imported, 1)],
        exported_at_ms=now,
        created_at_ms=now - DAY_MS,
        max_history_age_ms=HOUR_MS,
    )
    j = engine.open(tmp_path / "store", retention=NO_WINDOWS)
    try:
        j.import_sessions(archive)
        times = append_spaced(j, "s", batches)
        assert stamps_of(j, "s")[: len(imported)] == imported
    except BaseException:
        j.close()
        raise
    return j, times


def test_age_window_keeps_a_batch_within_it_before_newer_ones_stamped_a_day_earlier(
    engine: EngineFactory, tmp_path: Path
) -> None:
    """A session's batch committed ten minutes ago, then batches stamped by a clock a day
    behind (the newest among them): the pass keeps the whole session (its first batch is
    within the window, and history leaves as a prefix). Until 2026-12-05 the JetStream
    engine trimmed every batch, its newest being older than the window (the local engine
    until 8b9251b); once the first batch is older than the window too, all leave."""
    ahead = int(time.time() * 1000) + DAY_MS
    j, _ = open_stepped(engine, tmp_path, [ahead], 3)
    with j:
        report = j.apply_retention(now_ms=ahead + 10 * 60_000)
        assert report.trimmed_sessions == []
        assert_range(j, "s", 1, 7)
        report = j.apply_retention(now_ms=ahead + HOUR_MS + 1)
        assert report.trimmed_sessions == ["s"]
        assert_range(j, "s", 8, 7)


def test_age_window_keeps_a_batch_within_it_before_older_stamped_ones_and_later_ones_within_it(
    engine: EngineFactory, tmp_path: Path
) -> None:
    """The first batch stamped a day ahead of the 30 after it, the window falling among
    those (the first 20 older than it, the newest 10 within it): the first batch is within
    the window, so nothing leaves. The JetStream engine found the first batch within the
    window by bisection over commit times, which took them to grow, and trimmed the
    first 21 batches (until 2026-12-05)."""
    ahead = int(time.time() * 1000) + DAY_MS
    j, times = open_stepped(engine, tmp_path, [ahead], 30)
    with j:
        report = j.apply_retention(now_ms=times[19] + HOUR_MS + 1)
        assert report.trimmed_sessions == []
        assert_range(j, "s", 1, 61)
        report = j.apply_retention(now_ms=ahead + HOUR_MS + 1)
        assert report.trimmed_sessions == ["s"]
        assert_range(j, "s", 62, 61)


def test_age_window_finds_the_first_batch_within_it_past_a_step_back(
    engine: EngineFactory, tmp_path: Path
) -> None:
    """Events stamped 50, 40 and 30 minutes ago, then one stamped a day earlier (a step
    back), then 30 appends: with the window among the appends, the pass keeps from the
    21st (on JetStream it reads the events before the step back in order, and bisects
    the ones after it); then all leave."""
    now = int(time.time() * 1000)
    imported = [now - 50 * 60_000, now - 40 * 60_000, now - 30 * 60_000, now - DAY_MS]
    j, times = open_stepped(engine, tmp_path, imported, 30)
    with j:
        report = j.apply_retention(now_ms=times[19] + HOUR_MS + 1)
        assert report.trimmed_sessions == ["s"]
        assert_range(j, "s", 45, 64)
        report = j.apply_retention(now_ms=times[29] + HOUR_MS + 1)
        assert report.trimmed_sessions == ["s"]
        assert_range(j, "s", 65, 64)


def test_age_window_trims_batches_stamped_in_order_up_to_the_first_within_it(
    engine: EngineFactory, tmp_path: Path
) -> None:
    """Commit times in order (the common case): each pass keeps from the first batch
    committed within the window, whole batches; a window past the newest trims all."""
    with engine.open(tmp_path / "store", retention=NO_WINDOWS) as j:
        j.create_session("s", max_history_age_ms=HOUR_MS)
        times = append_spaced(j, "s", 30)
        assert j.apply_retention(now_ms=times[0] + HOUR_MS).trimmed_sessions == []
        assert_range(j, "s", 1, 60)
        for batches in (1, 10, 11, 29):  # batches older than the window: they leave
            report = j.apply_retention(now_ms=times[batches - 1] + HOUR_MS + 1)
            assert report.trimmed_sessions == ["s"]
            assert_range(j, "s", 2 * batches + 1, 60)
        assert j.apply_retention(now_ms=times[28] + HOUR_MS + 1).trimmed_sessions == []
        report = j.apply_retention(now_ms=times[29] + HOUR_MS + 1)
        assert report.trimmed_sessions == ["s"]
        assert_range(j, "s", 61, 60)


def import_stamped(
    engine: EngineFactory,
    tmp_path: Path,
    stamps: list[int],
    size: int = 40,
    window: int | None = HOUR_MS,
    exported_at_ms: int | None = None,
    **options: Any,
) -> Journal:
    """A store holding session "s" (an age window of its own of `window`) imported with
    events stamped `stamps`, `size` bytes each (the local engine packs them into frames of
    up to 4 MiB; a JetStream import is one batch)."""
    from _archives import write_one_session

    from journal.archive import ArchiveEvent

    now = int(time.time() * 1000)
    archive = tmp_path / "spread.archive"
    write_one_session(
        archive,
        "s",
        [ArchiveEvent(o, "m", t, None, payload("s", o, size)) for o, t in enumerate(stamps, 1)],
        exported_at_ms=now if exported_at_ms is None else exported_at_ms,
        created_at_ms=min(stamps),
        max_history_age_ms=window,
    )
    j = engine.open(tmp_path / "store", retention=NO_WINDOWS, **options)
    try:
        j.import_sessions(archive)
        assert stamps_of(j, "s") == stamps
    except BaseException:
        j.close()
        raise
    return j


def test_age_window_keeps_an_imported_batch_holding_an_event_within_it(
    engine: EngineFactory, tmp_path: Path
) -> None:
    """Events committed two hours, 90 minutes and ten minutes ago on another store,
    imported (one batch: a frame on the local engine), then three appends: the event of
    ten minutes ago is within the window, so its batch stays, the older events in it too
    (a batch is never cut). Until 2026-12-05 the local engine took a frame's time from its
    first event: the imported frame counted as two hours old and left whole, the event of
    ten minutes ago with it. Once its newest event is older than the window, it leaves."""
    now = int(time.time() * 1000)
    stamps = [now - 2 * HOUR_MS, now - 90 * 60_000, now - 10 * 60_000]
    with import_stamped(engine, tmp_path, stamps) as j:
        times = append_spaced(j, "s", 3)
        report = j.apply_retention(now_ms=now)
        assert report.trimmed_sessions == []
        assert_range(j, "s", 1, 9)
        report = j.apply_retention(now_ms=stamps[-1] + HOUR_MS + 1)
        assert report.trimmed_sessions == ["s"]
        assert_range(j, "s", 4, 9)
        report = j.apply_retention(now_ms=times[-1] + HOUR_MS + 1)
        assert report.trimmed_sessions == ["s"]
        assert_range(j, "s", 10, 9)


def test_age_window_does_not_keep_a_batch_for_an_event_compacted_into_a_snapshot(
    engine: EngineFactory, tmp_path: Path
) -> None:
    """A batch stays for the events it still holds within the window: one compacted into a
    snapshot is no longer history, and keeps nothing (here the first imported event, ten
    minutes old, before two stamped two hours ago)."""
    now = int(time.time() * 1000)
    stamps = [now - 10 * 60_000, now - 2 * HOUR_MS, now - 2 * HOUR_MS + 1]
    with import_stamped(engine, tmp_path, stamps) as j:
        assert j.apply_retention(now_ms=now).trimmed_sessions == []
        j.compact_session("s", 1, b"through 1")
        assert_range(j, "s", 2, 3)
        report = j.apply_retention(now_ms=now)
        assert report.trimmed_sessions == ["s"]
        assert_range(j, "s", 4, 3)


def local_frames(store: Path, session_id: str = "s") -> list[tuple[int, int, int]]:
    """(first ordinal, segment, frame time) of each frame the local view indexes for the
    session (the journal closed)."""
    j, engine = open_local(store, create=False, durability="os")
    with j, engine.view.begin() as txn:
        row = engine.view.row(txn, session_id)
        assert row is not None
        return [
            (f.first_ordinal, f.segment, f.time_ms)
            for f in engine.view.events.locations(txn, row.incarnation)
        ]


# Imported events of 1.25 MiB stamped three hours to ten minutes ago: three to a 4 MiB
# frame on the local engine, the first frame older than an hour, the second holding an
# event within it (its first event two hours old).
SPREAD_MIN = (180, 170, 160, 120, 90, 10)


@pytest.mark.parametrize(
    "view", ["live", "compressed", "rebuilt-from-sidecars", "rebuilt-from-segments"]
)
def test_local_age_window_trims_imported_frames_by_their_newest_event(
    tmp_path: Path, view: str
) -> None:
    """The local engine cuts an import into frames of up to 4 MiB: a frame leaves once its
    newest event is older than the window, not its first (until 2026-12-05 the frame
    holding an event of ten minutes ago, whose first was two hours old, left). The index
    and sidecars keep the frame's first event's time, as before (a store written before
    holds the same): a view rebuilt (from the sidecars of the sealed segment, or from the
    segment itself) passes the same way, so does one whose segment was compressed since,
    and `verify` finds nothing."""
    now = int(time.time() * 1000)
    stamps = [now - minutes * 60_000 for minutes in SPREAD_MIN]
    store = tmp_path / "store"
    local = ENGINES["local"]
    with import_stamped(local, tmp_path, stamps, 5 << 18, None, segment_bytes=16 << 20):
        pass
    # Sealed by appends of another session past the segment's end (no window applies yet).
    with open_store(store, segment_bytes=16 << 20) as j:
        j.create_session("sealer")
        while j.stats().segments < 2:
            append_batch(j, "sealer", [1 << 20] * 4)
        if view == "compressed":
            assert j.compact(dead_share=1.0).segments_rewritten
            assert list((store / "segments").glob("*.seg.zst"))
    frames = local_frames(store)
    assert [(first, time_ms) for first, _, time_ms in frames] == [(1, stamps[0]), (4, stamps[3])]
    if view != "live":
        shutil.rmtree(store / "index")
        if view == "rebuilt-from-segments":
            sidecars = list((store / "segments").glob("*.idx"))
            assert sidecars
            for sidecar in sidecars:
                sidecar.unlink()
    window = RetentionPolicy(max_history_bytes=None, max_history_age_ms=HOUR_MS)
    with open_store(store, window, segment_bytes=16 << 20) as j:
        report = j.apply_retention(now_ms=now)
        assert report.trimmed_sessions == ["s"]
        assert_range(j, "s", 4, 6)
        assert j.verify().ok
        report = j.apply_retention(now_ms=stamps[-1] + HOUR_MS + 1)
        assert report.trimmed_sessions == ["s"]
        assert_range(j, "s", 7, 6)
        assert j.verify().ok


@given(
    st.lists(
        st.tuples(st.sampled_from([5, 9]), st.integers(1, 3), st.integers(0, 50)),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 70),
)
def test_staged_frame_gives_the_newest_time_of_a_sessions_events_from_an_ordinal_on(
    events: list[tuple[int, int, int]], start: int
) -> None:
    """`StagedFrame`, what an age window keeps of an imported frame: for each session in
    it, the newest time of its events from any ordinal on (times in any order)."""
    from journal._local.retention import StagedFrame, SummaryCache
    from journal.records import EventAppended

    ordinals = {5: 0, 9: 0}
    records = []
    for incarnation, step, stamp in events:
        ordinals[incarnation] += step
        records.append(EventAppended(incarnation, ordinals[incarnation], stamp, "m", b""))
    frame = StagedFrame.of(100, records)
    for incarnation in (5, 9, 7):
        times = [
            r.timestamp_ms for r in records if r.incarnation == incarnation and r.ordinal >= start
        ]
        assert frame.newest_from(incarnation, start) == (max(times) if times else None)
    cache = SummaryCache(budget_bytes=frame.cost)
    cache.keep_staged_frame(1, 64, frame)
    assert cache.staged_frame(1, 64) is frame and cache.cached_bytes == frame.cost
    cache.keep_staged_frame(1, 128, frame)  # (over the budget: not kept)
    assert cache.staged_frame(1, 128) is None and cache.cached_bytes == frame.cost
    cache.pop(1)
    assert cache.staged_frame(1, 64) is None and cache.cached_bytes == 0


class FrameReads(FileOps):
    """Counts the frames retention passes read for age windows; can fail those reads."""

    def __init__(self) -> None:
        self.reads = 0
        self.fail = False

    def point(self, name: str, detail: object = None) -> None:
        if name == "retention.read_frame":
            self.reads += 1
            if self.fail:
                raise OSError(5, "injected: frame unreadable")


def sealed_import(tmp_path: Path, stamps: list[int]) -> Path:
    """A local store holding `stamps` imported as in `SPREAD_MIN` (two frames) in a sealed
    segment, and a session "a" that sealed it; no window applied yet."""
    store = tmp_path / "store"
    with import_stamped(ENGINES["local"], tmp_path, stamps, 5 << 18, None, segment_bytes=16 << 20):
        pass
    with open_store(store, segment_bytes=16 << 20) as j:
        j.create_session("a")
        while j.stats().segments < 2:
            append_batch(j, "a", [1 << 20] * 4)
    return store


def test_local_age_window_reads_imported_frames_only_and_a_sealed_one_once(
    tmp_path: Path,
) -> None:
    """What the local engine's age window reads: only frames an import staged, older than
    the window by their first event (their stored time), up to the first that stays, each
    once (a sealed segment's frame is kept in the writer's cache); never an append's frame
    (its events share its commit time)."""
    now = int(time.time() * 1000)
    stamps = [now - minutes * 60_000 for minutes in SPREAD_MIN]
    store = sealed_import(tmp_path, stamps)
    probe = FrameReads()
    window = RetentionPolicy(max_history_bytes=None, max_history_age_ms=HOUR_MS)
    with open_store(store, window, segment_bytes=16 << 20, file_ops=probe) as j:
        assert j.apply_retention(now_ms=now).trimmed_sessions == ["s"]
        assert probe.reads == 2  # (both imported frames: the second one stays)
        assert_range(j, "s", 4, 6)
        assert j.apply_retention(now_ms=now + 60_000).trimmed_sessions == []
        assert probe.reads == 2
        last = j.get_session("a").last_ordinal
        report = j.apply_retention(now_ms=int(time.time() * 1000) + 2 * HOUR_MS)
        assert sorted(report.trimmed_sessions) == ["a", "s"]
        assert probe.reads == 2
        assert_range(j, "s", 7, 6)
        assert_range(j, "a", last + 1, last)


def test_local_age_window_forgets_a_kept_imported_frame_once_it_leaves(tmp_path: Path) -> None:
    """The writer keeps an imported frame of a sealed segment that straddles the horizon
    for later passes, and forgets it once it leaves: an import's segments live on while
    its sessions do (their `SessionStaged` records are pinned), and until 2026-12-05 the
    frames stayed in the cache with them, where no pass needed them again, and took its
    budget from the segments' entries (20,000 imported sessions straddling the horizon
    once: the 4 MiB full for good, 10 sidecars read by every pass, 150-180 ms a pass
    instead of 80-90)."""
    now = int(time.time() * 1000)
    stamps = [now - minutes * 60_000 for minutes in SPREAD_MIN]
    store = sealed_import(tmp_path, stamps)
    window = RetentionPolicy(max_history_bytes=None, max_history_age_ms=HOUR_MS)
    j, engine = open_local(
        store, create=False, durability="os", segment_bytes=16 << 20, retention=window
    )
    with j:
        with engine.view.begin() as txn:
            row = engine.view.row(txn, "s")
            assert row is not None
            second = engine.view.events.locations(txn, row.incarnation)[1]
        assert j.apply_retention(now_ms=now).trimmed_sessions == ["s"]
        kept = engine.summaries.staged_frame(second.segment, second.offset)
        assert kept is not None
        with_kept = engine.summaries.cached_bytes
        assert j.apply_retention(now_ms=stamps[-1] + HOUR_MS + 1).trimmed_sessions == ["s"]
        assert_range(j, "s", 7, 6)
        assert engine.summaries.staged_frame(second.segment, second.offset) is None
        assert engine.summaries.cached_bytes == with_kept - kept.cost


def test_local_age_window_keeps_an_imported_frame_it_cannot_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An imported frame older than the window by its first event that cannot be read
    (damaged, its file lost: here a read error) stays, with the session's history after
    it, and a warning says so; the pass goes on (other sessions are trimmed), and a later
    pass that can read it trims what it should."""
    now = int(time.time() * 1000)
    stamps = [now - minutes * 60_000 for minutes in SPREAD_MIN]
    store = sealed_import(tmp_path, stamps)
    probe = FrameReads()
    probe.fail = True
    window = RetentionPolicy(max_history_bytes=None, max_history_age_ms=HOUR_MS)
    with open_store(store, window, segment_bytes=16 << 20, file_ops=probe) as j:
        last = j.get_session("a").last_ordinal
        with caplog.at_level("WARNING", logger="journal"):
            report = j.apply_retention(now_ms=int(time.time() * 1000) + 2 * HOUR_MS)
        assert report.trimmed_sessions == ["a"]
        assert_range(j, "a", last + 1, last)
        assert_range(j, "s", 1, 6)
        assert "cannot be read" in caplog.text and "injected" in caplog.text
        probe.fail = False
        assert j.apply_retention(now_ms=now).trimmed_sessions == ["s"]
        assert_range(j, "s", 4, 6)
        assert j.verify().ok


def test_local_age_window_judges_a_damaged_imported_frame_by_its_recorded_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An imported frame whose bytes are damaged (a checksum that fails: no reader can
    serve its events, and `verify --fix` cannot repair it) is judged by the time its
    index entry records (its session's first event's), as every frame was before
    2026-12-05: it leaves once that is older than the window, and the window goes on with
    the session's later frames. Until 2026-12-05 it stayed, and with it all of the
    session's later history, at every pass (a warning each), for good: the session's
    age window no longer trimmed anything."""
    now = int(time.time() * 1000)
    stamps = [now - minutes * 60_000 for minutes in SPREAD_MIN]
    store = sealed_import(tmp_path, stamps)
    damaged = local_frames(store)[0]
    assert damaged[0] == 1
    j, engine = open_local(store, create=False, durability="os")
    with j, engine.view.begin() as txn:
        row = engine.view.row(txn, "s")
        assert row is not None
        first = engine.view.events.locations(txn, row.incarnation)[0]
    with (store / "segments" / segment_name(first.segment)).open("r+b") as file:
        file.seek(first.offset + 4096)
        byte = file.read(1)[0]
        file.seek(first.offset + 4096)
        file.write(bytes([byte ^ 0xFF]))
    window = RetentionPolicy(max_history_bytes=None, max_history_age_ms=HOUR_MS)
    with open_store(store, window, segment_bytes=16 << 20) as j:
        with caplog.at_level("WARNING", logger="journal"):
            assert j.apply_retention(now_ms=now).trimmed_sessions == ["s"]
        assert "cannot be read" in caplog.text and "checksum" in caplog.text
        assert_range(j, "s", 4, 6)
        _, last_new = append_batch(j, "s", [40])
        assert j.apply_retention(now_ms=now).trimmed_sessions == []
        later = int(time.time() * 1000) + 2 * HOUR_MS
        assert "s" in j.apply_retention(now_ms=later).trimmed_sessions
        assert_range(j, "s", last_new + 1, last_new)


@pytest.mark.parametrize("exported", ["before", "a day ahead"])
@pytest.mark.parametrize("sealed", [False, True], ids=["active", "sealed"])
def test_local_age_window_reads_a_compacted_append_frame_of_an_imported_session_once(
    tmp_path: Path, exported: str, sealed: bool
) -> None:
    """An imported session's append frame in the segment of its `SessionImported` record,
    with its first events compacted into a snapshot: stamped after the archive was
    exported, it is an append's and not read; stamped before (the source's clock a day
    ahead), a pass reads it to learn that an append wrote it (its recorded time is then
    its events'), once when its segment is sealed (kept, as an imported frame that stays
    is), at each pass in the active segment. Until 2026-12-05 every pass read it, sealed
    or not (SPEC 8 said an append's frame is never read): 2,000 imported sessions, half of
    them so, in a sealed segment: 1,000 frames read and 33-40 ms by each pass that trims
    nothing, 10-11 ms now."""
    now = int(time.time() * 1000)
    stamps = [now - 3 * HOUR_MS, now - 2 * HOUR_MS]
    ahead = now + DAY_MS if exported == "a day ahead" else now
    with import_stamped(
        ENGINES["local"], tmp_path, stamps, 40, None, ahead, segment_bytes=16 << 20
    ) as j:
        time.sleep(0.005)  # (the appends stamped after the export, when it was now)
        assert append_batch(j, "s", [40] * 4) == (3, 6)
        j.compact_session("s", 4, b"through 4")
    store = tmp_path / "store"
    if sealed:
        with open_store(store, segment_bytes=16 << 20) as j:
            j.create_session("a")
            while j.stats().segments < 2:
                append_batch(j, "a", [1 << 20] * 4)
    assert [first for first, _, _ in local_frames(store)] == [3]
    probe = FrameReads()
    window = RetentionPolicy(max_history_bytes=None, max_history_age_ms=HOUR_MS)
    with open_store(store, window, segment_bytes=16 << 20, file_ops=probe) as j:
        for _ in range(3):
            assert j.apply_retention(now_ms=now).trimmed_sessions == []
            assert_range(j, "s", 5, 6)
        assert probe.reads == (0 if exported == "before" else 1 if sealed else 3)


JETSTREAM_ENGINES = [p for p in engine_params("import") if p.id != "local"]
# The fields of a session row a release before 2026-12-05 knows (up to checkpoint_offset).
_OLDER_ROW_FIELDS = 42


def rewrite_row_as_an_older_release(engine: JetStreamEngineFactory, path: Path) -> None:
    """Session "s"'s row written again as a release before `SessionRow.last_event_ms` does
    (it decodes the row without the fields it does not know and encodes the rest): with
    the compare-and-set on the row subject, and its positions as sequences."""
    import nats

    from journal._jetstream.layout import ENCODER, ROW_DECODER, Subjects, resolve

    store = engine.store_name(path)
    subject = f"j.{store}.s.{Subjects.token('s')}.row"

    async def rewrite() -> None:
        nc = await nats.connect(servers=engine.url().removeprefix("nats://").split(","))
        try:
            js = nc.jetstream()
            message = await js.get_last_msg(f"JOURNAL_{store}", subject)
            row = resolve(ROW_DECODER.decode(message.data), message.seq)
            fields = msgspec.msgpack.decode(ENCODER.encode(row))
            await js.publish(
                subject,
                msgspec.msgpack.encode(fields[:_OLDER_ROW_FIELDS]),
                headers={
                    "Nats-Rollup": "sub",
                    "Nats-Expected-Last-Subject-Sequence": str(message.seq),
                },
            )
        finally:
            await nc.close()

    asyncio.run(rewrite())


@pytest.mark.parametrize("engine_name", JETSTREAM_ENGINES)
@pytest.mark.parametrize("older_row", [False, True], ids=["row", "older-release-row"])
@pytest.mark.parametrize("step_back", ["imported", "appended"])
def test_jetstream_age_window_keeps_an_imported_batch_with_an_event_within_it(
    engine_name: str, older_row: bool, step_back: str, tmp_path: Path
) -> None:
    """JetStream: an import is one batch. Its events stamped two hours and ten minutes
    ago, then (in the import, or its first append) a step back of a day, then appends (a
    day behind): the event of ten minutes ago is the first within the window, and its
    batch, the whole import, stays (and the appends after it); the pass reads the events
    before the step back in order. A row an older release wrote says nothing of the
    order: every event is read in order. Until 2026-12-05 the newest event being older
    than the window trimmed every batch. (The local engine takes a frame's time from its
    first event: the imported frame, stamped two hours ago, left with the appends until
    2026-12-05; `test_age_window_keeps_an_imported_batch_holding_an_event_within_it`.)"""
    engine = ENGINES[engine_name]
    assert isinstance(engine, JetStreamEngineFactory)
    ahead = int(time.time() * 1000) + DAY_MS
    imported = [ahead - 2 * HOUR_MS, ahead - 10 * 60_000]
    if step_back == "imported":
        imported.append(ahead - DAY_MS - 60_000)
    j, _ = open_stepped(engine, tmp_path, imported, 3)
    j.close()
    last = len(imported) + 6
    if older_row:
        rewrite_row_as_an_older_release(engine, tmp_path / "store")
    with engine.open(tmp_path / "store") as j:
        report = j.apply_retention(now_ms=ahead)
        assert report.trimmed_sessions == []
        assert_range(j, "s", 1, last)
        report = j.apply_retention(now_ms=ahead + HOUR_MS)
        assert report.trimmed_sessions == ["s"]
        assert_range(j, "s", last + 1, last)


def test_per_session_age_override(store: Path) -> None:
    policy = RetentionPolicy(max_history_bytes=None, max_history_age_ms=1000)
    with open_store(store, policy) as j:
        j.create_session("default")
        j.create_session("longer", max_history_age_ms=10 * DAY_MS)
        j.create_session("shorter", max_history_age_ms=10)
        for session_id in ("default", "longer", "shorter"):
            append_batch(j, session_id, [20, 20])
        stamp = j.read("shorter").events[-1].timestamp_ms
        report = j.apply_retention(now_ms=stamp + 500)  # only "shorter" is past its window
        assert report.trimmed_sessions == ["shorter"]
        assert_range(j, "default", 1, 2)
        assert_range(j, "shorter", 3, 2)
        report = j.apply_retention(now_ms=stamp + 5 * DAY_MS)
        assert report.trimmed_sessions == ["default"]
        assert_range(j, "default", 3, 2)
        assert_range(j, "longer", 1, 2)


def test_windows_never_change_ordinals_and_only_move_first_ordinal_up(store: Path) -> None:
    with open_store(store, RetentionPolicy(max_history_bytes=500)) as j:
        j.create_session("s")
        cursors = {}
        for _ in range(5):
            append_batch(j, "s", [100, 100])
        for event in j.replay("s"):
            cursors[event.ordinal] = event.cursor
        j.apply_retention()  # two batches of 200 fit in 500, three do not
        events = list(j.replay("s"))
        assert [e.ordinal for e in events] == [7, 8, 9, 10]
        positions = {e.ordinal: e.position for e in events}
        # A wider window later cannot bring history back.
    with open_store(store, RetentionPolicy(max_history_bytes=10_000)) as j:
        j.apply_retention()
        events = list(j.replay("s"))
        assert [(e.ordinal, e.position) for e in events] == sorted(positions.items())
        assert [e.cursor for e in events] == [cursors[n] for n in range(7, 11)]
        assert_range(j, "s", 7, 10)


# -- session retention (eviction) ---------------------------------------------------------------


@pytest.mark.parametrize("end", ["resolve", "cancel", "expire"])
def test_terminal_session_is_evicted_retention_after_it_ended(store: Path, end: str) -> None:
    retention_ms = 5000
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=retention_ms)
    with open_store(store, policy) as j:
        j.create_session("done", ttl_ms=600_000 if end == "expire" else None)
        j.create_session("open")
        j.create_session("paused")
        for session_id in ("done", "open", "paused"):
            append_batch(j, session_id, [10, 10])
        j.suspend_session("paused")
        time.sleep(0.005)
        if end == "expire":
            j.expire_due(now_ms=j.get_session("done").created_at_ms + 600_000)
        else:
            getattr(j, f"{end}_session")("done")
        ended = j.get_session("done").ended_at_ms
        assert ended is not None
        assert j.get_session("done").state.terminal
        report = j.apply_retention(now_ms=ended + retention_ms - 1)
        assert report.evicted_sessions == []
        j.get_session("done")
        report = j.apply_retention(now_ms=ended + retention_ms)  # the boundary is inclusive
        assert report.evicted_sessions == ["done"]
        with pytest.raises(SessionNotFound):
            j.get_session("done")
        with pytest.raises(SessionNotFound):
            j.read("done")
        with pytest.raises(SessionNotFound):
            j.snapshot("done")
        assert [m.session_id for m in j.list_sessions()] == ["open", "paused"]
        # Non-terminal sessions are never evicted, however late it is.
        assert j.apply_retention(now_ms=ended + 1000 * DAY_MS).evicted_sessions == []
        assert_range(j, "open", 1, 2)
        assert_range(j, "paused", 1, 2)
        j.close()
    with open_store(store, policy) as j, pytest.raises(SessionNotFound):
        j.get_session("done")


def test_session_retention_from_started_counts_from_creation(store: Path) -> None:
    retention_ms = 5000
    for measured_from, evicted in (("ended", False), ("started", True)):
        path = store.with_name(f"store-{measured_from}")
        policy = RetentionPolicy(
            max_history_bytes=None,
            session_retention_ms=retention_ms,
            session_retention_from=measured_from,
        )
        with open_store(path, policy) as j:
            j.create_session("s")
            time.sleep(0.01)
            meta = j.resolve_session("s")
            assert meta.ended_at_ms is not None and meta.ended_at_ms > meta.created_at_ms
            now = meta.created_at_ms + retention_ms  # due from creation, not yet from end
            assert j.apply_retention(now_ms=now - 1).evicted_sessions == []
            report = j.apply_retention(now_ms=now)
            assert report.evicted_sessions == (["s"] if evicted else []), measured_from
            if not evicted:
                report = j.apply_retention(now_ms=meta.ended_at_ms + retention_ms)
                assert report.evicted_sessions == ["s"]


def test_eviction_is_an_evicted_event_in_watch_sessions(store: Path) -> None:
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)
    with open_store(store, policy) as j:
        j.create_session("a")
        j.create_session("b")
        append_batch(j, "a", [10])
        resolved = j.resolve_session("a")
        stop = threading.Event()
        feed = j.watch_sessions(stop=stop)
        try:
            snapshot = [first_of(feed), first_of(feed)]
            assert [(e.event_type, e.session.session_id) for e in snapshot] == [
                (LifecycleEventType.CREATED, "a"),
                (LifecycleEventType.CREATED, "b"),
            ]
            report = j.apply_retention(now_ms=resolved.ended_at_ms + 10)
            assert report.evicted_sessions == ["a"]
            evicted = first_of(feed)
            assert evicted.event_type is LifecycleEventType.EVICTED
            assert evicted.session.session_id == "a"
            assert evicted.session.state is SessionState.RESOLVED
            assert evicted.session.incarnation == resolved.incarnation
            # Resuming after the EVICTED event: the next change is the id's new incarnation.
            again = j.watch_sessions(cursor=evicted.cursor, stop=stop)
            j.create_session("a")
            created = first_of(again)
            assert created.event_type is LifecycleEventType.CREATED
            assert created.session.session_id == "a"
            assert created.session.incarnation != resolved.incarnation
        finally:
            stop.set()
        # A fresh watcher's snapshot no longer shows the evicted incarnation.
        fresh = j.watch_sessions(stop=stop)
        stop.clear()
        try:
            first = [first_of(fresh), first_of(fresh)]
        finally:
            stop.set()
        assert [(e.session.session_id, e.session.state) for e in first] == [
            ("a", SessionState.OPEN),
            ("b", SessionState.OPEN),
        ]


def test_evicted_id_can_be_created_again_and_old_cursors_are_foreign(store: Path) -> None:
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)
    with open_store(store, policy) as j:
        j.create_session("s")
        append_batch(j, "s", [10, 10, 10])
        old_cursor = list(j.replay("s"))[1].cursor
        old_snapshot = j.compact_session("s", 1, b"old")
        ended = j.resolve_session("s").ended_at_ms
        assert j.apply_retention(now_ms=ended + 10).evicted_sessions == ["s"]
        with pytest.raises(SessionNotFound):
            j.read("s", cursor=old_cursor)
        meta = j.create_session("s")
        assert (meta.state, meta.first_ordinal, meta.last_ordinal) == (SessionState.OPEN, 1, 0)
        assert j.snapshot("s") is None
        assert j.read("s").events == []
        assert append_batch(j, "s", [10]) == (1, 1)
        assert retained(j, "s") == [1]
        for cursor in (old_cursor, old_snapshot.cursor):
            with pytest.raises(CursorForeign):
                j.read("s", cursor=cursor)
            with pytest.raises(CursorForeign):
                j.replay("s", cursor=cursor)
            with pytest.raises(CursorForeign):
                j.watch("s", cursor=cursor)
        j.close()
    with open_store(store, policy) as j:
        with pytest.raises(CursorForeign):
            j.read("s", cursor=old_cursor)
        assert retained(j, "s") == [1]


# -- snapshots (compact_session) -----------------------------------------------------------------


def test_compact_session_drops_the_prefix_and_keeps_a_snapshot(store: Path) -> None:
    with open_store(store) as j:
        j.create_session("s")
        j.create_session("other")
        for sizes in ([10, 10, 10], [10, 10], [10, 10, 10, 10], [10]):
            append_batch(j, "s", sizes)
            append_batch(j, "other", sizes)
        assert j.snapshot("s") is None
        before = {e.ordinal: e for e in j.replay("s")}
        snap = j.compact_session("s", 4, b"state through 4")  # inside the second batch
        assert isinstance(snap, Snapshot)
        assert (snap.session_id, snap.ordinal, snap.data) == ("s", 4, b"state through 4")
        assert j.snapshot("s") == snap
        assert_range(j, "s", 5, 10)
        assert_range(j, "other", 1, 10)  # other sessions are untouched
        # Kept events are the same events: ordinals, positions and cursors unchanged.
        assert event_view(list(j.replay("s"))) == event_view([before[n] for n in range(5, 11)])
        assert [e.cursor for e in j.replay("s")] == [before[n].cursor for n in range(5, 11)]
        j.resolve_session("s")
        for read in (
            lambda c: j.read("s", cursor=c, max_bytes=1 << 30).events,
            lambda c: list(j.replay("s", cursor=c)),
            lambda c: list(j.watch("s", cursor=c)),  # resolved: ends after draining
        ):
            assert [e.ordinal for e in read(snap.cursor)] == list(range(5, 11))
            assert [e.ordinal for e in read(before[4].cursor)] == list(range(5, 11))
            assert [e.ordinal for e in read(before[7].cursor)] == list(range(8, 11))


def test_compact_session_errors(store: Path) -> None:
    with open_store(store) as j:
        j.create_session("s")
        j.create_session("empty")
        append_batch(j, "s", [10] * 6)
        with pytest.raises(InvalidArgument):
            j.compact_session("s", 7, b"beyond the head")
        with pytest.raises(InvalidArgument):
            j.compact_session("empty", 1, b"nothing to stand for")
        with pytest.raises(InvalidArgument):
            j.compact_session("s", 0, b"zero")
        with pytest.raises(SessionNotFound):
            j.compact_session("missing", 1, b"")
        assert j.snapshot("s") is None
        assert_range(j, "s", 1, 6)
        first = j.compact_session("s", 4, b"four")
        with pytest.raises(InvalidArgument):
            j.compact_session("s", 3, b"older than the snapshot")
        assert j.snapshot("s") == first
        assert_range(j, "s", 5, 6)
        same = j.compact_session("s", 4, b"four again")  # as far as the last one is allowed
        assert (same.ordinal, same.data) == (4, b"four again")
        later = j.compact_session("s", 6, b"everything")
        assert j.snapshot("s") == later
        assert_range(j, "s", 7, 6)
        assert [e.ordinal for e in j.read("s", cursor=later.cursor).events] == []
        assert append_batch(j, "s", [10]) == (7, 7)
        assert [e.ordinal for e in j.read("s", cursor=later.cursor).events] == [7]
        j.close()
    with open_store(store) as j:
        assert j.snapshot("s") == later
        assert_range(j, "s", 7, 7)


def test_compact_session_works_on_terminal_sessions_and_survives_reopen(store: Path) -> None:
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        j.create_session("s")
        for _ in range(30):
            append_batch(j, "s", [300])
        j.cancel_session("s")
        snap = j.compact_session("s", 25, b"s25")
        assert_range(j, "s", 26, 30)
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        assert j.snapshot("s") == snap
        assert_range(j, "s", 26, 30)
        assert [e.ordinal for e in j.watch("s", cursor=snap.cursor)] == list(range(26, 31))


def test_idempotency_keys_are_remembered_while_their_append_is_retained(store: Path) -> None:
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        j.create_session("s")
        batches = {}
        for i in range(1, 41):
            key = f"k{i}"
            batch = [
                EventIn(type="m", data=payload("s", 2 * i - 1, 300)),
                EventIn(type="m", data=payload("s", 2 * i, 300)),
            ]
            result = j.append("s", batch, idempotency_key=key)
            assert (result.first_ordinal, result.last_ordinal) == (2 * i - 1, 2 * i)
            batches[key] = batch
        j.compact_session("s", 40, b"first twenty appends")
        j.compact()

        def retry(key: str) -> tuple[int, int, bool]:
            result = j.append("s", batches[key], idempotency_key=key)
            return result.first_ordinal, result.last_ordinal, result.deduplicated

        # Retained appends are still recognised, through compaction and a rebuilt view.
        assert retry("k21") == (41, 42, True)
        assert retry("k40") == (79, 80, True)
        j.close()
    shutil.rmtree(store / "index")
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        assert retry("k30") == (59, 60, True)
        assert j.get_session("s").last_ordinal == 80
        # A key whose append was trimmed away is forgotten: the retry appends again.
        assert retry("k3") == (81, 82, False)
        assert j.get_session("s").last_ordinal == 82


# -- expired cursors ---------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["read", "replay", "watch", "awatch"])
@pytest.mark.parametrize("trim", ["compact_session", "bytes_window", "age_window"])
def test_cursor_below_the_retained_range_raises_cursor_expired(
    store: Path, api: str, trim: str
) -> None:
    policy = RetentionPolicy(
        max_history_bytes=100 if trim == "bytes_window" else None,
        max_history_age_ms=1000 if trim == "age_window" else None,
    )
    with open_store(store, policy) as j:
        j.create_session("s")
        for _ in range(4):
            append_batch(j, "s", [40, 40])
            time.sleep(0.003)
        cursors = {e.ordinal: e.cursor for e in j.replay("s")}
        if trim == "compact_session":
            j.compact_session("s", 6, b"six")
        elif trim == "bytes_window":
            j.apply_retention()
        else:
            stamp = j.read("s", cursor=cursors[6]).events[0].timestamp_ms
            j.apply_retention(now_ms=stamp + 1000)
        assert j.get_session("s").first_ordinal == 7
        j.resolve_session("s")

        def run(cursor: str | None) -> list[int]:
            if api == "read":
                return [e.ordinal for e in j.read("s", cursor=cursor).events]
            if api == "replay":
                return [e.ordinal for e in j.replay("s", cursor=cursor)]
            if api == "watch":
                return [e.ordinal for e in j.watch("s", cursor=cursor)]

            async def collect() -> list[int]:
                return [e.ordinal async for e in j.awatch("s", cursor=cursor)]

            return asyncio.run(collect())

        for below in (1, 2, 5):
            with pytest.raises(CursorExpired) as info:
                run(cursors[below])
            error = info.value
            assert (error.code, error.status) == ("CURSOR_EXPIRED", "FAILED_PRECONDITION")
            assert error.earliest_ordinal == 7
            assert error.resume_cursor is not None
            assert run(error.resume_cursor) == [7, 8]
        assert run(cursors[6]) == [7, 8]  # just below first_ordinal is still exact
        assert run(cursors[7]) == [8]
        assert run(None) == [7, 8]


@pytest.mark.parametrize("trim", ["compact_session", "bytes_window", "age_window"])
def test_paused_watcher_whose_history_is_trimmed_gets_cursor_expired(
    store: Path, trim: str
) -> None:
    policy = RetentionPolicy(
        max_history_bytes=250 if trim == "bytes_window" else None,
        max_history_age_ms=1000 if trim == "age_window" else None,
    )
    with open_store(store, policy) as j:
        j.create_session("s")
        for _ in range(10):
            append_batch(j, "s", [100])
            time.sleep(0.002)
        stop = threading.Event()
        watcher = j.watch("s", stop=stop, max_bytes=1)  # one event per page
        seen = [first_of(watcher), first_of(watcher)]
        assert [e.ordinal for e in seen] == [1, 2]
        # The watcher pauses here while its history leaves.
        if trim == "compact_session":
            j.compact_session("s", 8, b"eight")
        elif trim == "bytes_window":
            j.apply_retention()  # keeps 9 and 10
        else:
            stamp = j.read("s", cursor=seen[1].cursor, max_bytes=1 << 30).events[6].timestamp_ms
            j.apply_retention(now_ms=stamp + 1000)  # keeps 9 and 10
        assert j.get_session("s").first_ordinal == 9
        try:
            with pytest.raises(CursorExpired) as info:
                while True:
                    event = first_of(watcher)
                    # Anything it still delivers must be the next event, never a jump.
                    assert event.ordinal == seen[-1].ordinal + 1, "watcher skipped events"
                    seen.append(event)
        finally:
            stop.set()
        assert info.value.earliest_ordinal == 9
        assert info.value.resume_cursor is not None
        j.resolve_session("s")
        rest = [e.ordinal for e in j.watch("s", cursor=info.value.resume_cursor)]
        assert rest == [9, 10]


def test_watchers_keep_correct_while_other_threads_append_trim_and_compact(
    store: Path, rng: random.Random
) -> None:
    # In one process: appenders, a thread trimming (snapshots, windows) and compacting, and
    # watchers that restart from resume_cursor on CursorExpired. Every event a watcher
    # gets is the right one, in dense order between restarts. The slow watcher is held
    # after its first event until half the appends and a retention pass are done, so it
    # surely falls behind the trims (its 2 ms per event alone kept up on a loaded machine).
    policy = RetentionPolicy(max_history_bytes=20_000)
    with open_store(store, policy, segment_bytes=SMALL_SEGMENTS) as j:
        j.create_session("s")
        j.create_session("noise")
        done = threading.Event()
        errors: list[BaseException] = []
        logs: list[list[tuple[str, int]]] = [[], []]
        behind = threading.Event()

        def watcher(log: list[tuple[str, int]], budget: int, pause: float) -> None:
            cursor = None
            try:
                while True:
                    try:
                        for event in j.watch("s", cursor=cursor, max_bytes=budget):
                            check_event(event, "s")
                            log.append(("ev", event.ordinal))
                            cursor = event.cursor
                            if pause:  # a slow observer falls behind the trims
                                behind.wait(WAIT_S)
                                time.sleep(pause)
                        return
                    except CursorExpired as e:
                        log.append(("expired", e.earliest_ordinal))
                        cursor = e.resume_cursor
            except BaseException as e:
                errors.append(e)

        def trimmer(seed: int) -> None:
            local = random.Random(seed)
            try:
                while not done.is_set():
                    action = local.random()
                    if action < 0.3:
                        meta = j.get_session("s")
                        snap = j.snapshot("s")
                        low = max(meta.first_ordinal - 1, snap.ordinal if snap else 1, 1)
                        if meta.last_ordinal >= low:
                            through = local.randint(low, meta.last_ordinal)
                            j.compact_session("s", through, b"snap")
                    elif action < 0.6:
                        j.apply_retention()
                    else:
                        j.compact(dead_share=local.random())
                    time.sleep(local.uniform(0, 0.005))
            except BaseException as e:
                errors.append(e)

        threads = [
            threading.Thread(target=watcher, args=(logs[0], 1, 0.002)),
            threading.Thread(target=watcher, args=(logs[1], 1 << 20, 0.0)),
            threading.Thread(target=trimmer, args=(rng.randrange(1 << 30),)),
        ]
        for thread in threads:
            thread.start()
        try:
            for n in range(300):
                append_batch(j, "s", [rng.choice([50, 400, 1500])] * rng.randint(1, 4))
                append_batch(j, "noise", [300])
                if n == 150:
                    j.apply_retention()  # (150 rounds of "s": far more than 20,000 bytes)
                    behind.set()
        finally:
            behind.set()
            done.set()
            threads[2].join(WAIT_S)
            append_batch(j, "s", [10])  # the end of the session is retained
            last = j.get_session("s").last_ordinal
            j.resolve_session("s")
            for thread in threads[:2]:
                thread.join(WAIT_S)
        assert not any(t.is_alive() for t in threads), "a thread did not finish"
        assert errors == []
        for log in logs:
            previous, floor = 0, 1
            for kind, ordinal in log:
                if kind == "expired":
                    assert ordinal > previous + 1
                    floor = ordinal
                elif floor:
                    assert ordinal >= floor and ordinal > previous, (ordinal, previous, floor)
                    previous, floor = ordinal, 0
                else:
                    assert ordinal == previous + 1, f"after {previous} came {ordinal}"
                    previous = ordinal
            assert previous == last
        assert any(kind == "expired" for kind, _ in logs[0]), "the slow watcher kept up"
        assert j.verify().ok


# -- segments holding nothing live are deleted ---------------------------------------------------


def _fill(j: Journal, session_id: str, count: int, size: int = 400) -> None:
    for _ in range(count):
        append_batch(j, session_id, [size])


def _sealed_bytes(store: Path) -> int:
    """Bytes of sealed segments and their sidecars (what CompactionReport counts)."""
    active = segment_files(store)[-1]
    return sum(
        size
        for name, size in _sizes(store).items()
        if name != active and name.endswith((".seg", ".seg.zst", ".idx"))
    )


def test_compact_counts_only_sealed_segments_and_their_sidecars(store: Path) -> None:
    """Nothing sealed yet: nothing to count (the segment directory's other files, such
    as the feed floor, are not sealed bytes)."""
    with open_store(store) as j:
        j.create_session("s")
        append_batch(j, "s", [10])
        assert len(segment_files(store)) == 1
        report = j.compact()
        assert (report.bytes_before, report.bytes_after) == (0, 0), report


def _sizes(store: Path) -> dict[str, int]:
    directory = store / "segments"
    return {name: (directory / name).stat().st_size for name in os.listdir(directory)}


@pytest.mark.parametrize("how", ["evict", "compact_session", "age_window"])
def test_segments_holding_nothing_live_are_deleted(store: Path, how: str) -> None:
    policy = RetentionPolicy(
        max_history_bytes=None,
        session_retention_ms=1 if how == "evict" else None,
        max_history_age_ms=1000 if how == "age_window" else None,
    )
    with open_store(store, policy, segment_bytes=SMALL_SEGMENTS) as j:
        j.create_session("old")
        _fill(j, "old", 80)  # several segments of nothing but "old"
        old_newest = j.read("old", cursor=None, max_bytes=1 << 30).events[-1].timestamp_ms
        time.sleep(0.005)
        j.create_session("keep")
        _fill(j, "keep", 20)
        before = segment_files(store)
        sizes = _sizes(store)
        assert len(before) >= 6, before
        if how == "evict":
            ended = j.resolve_session("old").ended_at_ms
            report = j.apply_retention(now_ms=ended + 10)
            assert report.evicted_sessions == ["old"]
        elif how == "compact_session":
            j.compact_session("old", 80, b"all of it")
            report = j.apply_retention()
        else:
            # Every batch of "old" is older than the horizon, every one of "keep" is not.
            report = j.apply_retention(now_ms=old_newest + 1001)
            assert "old" in report.trimmed_sessions
            assert_range(j, "old", 81, 80)
        after = segment_files(store)
        deleted = report.deleted_segments
        # Sealed segments of nothing but "old" go (the one holding its creation record may
        # stay while the session lives); the active segment never does.
        assert len(deleted) >= len(before) - 4, (deleted, before)
        assert before[-1] not in deleted
        for name in deleted:
            assert name not in after
            assert not (store / "segments" / name.replace(".seg", ".idx")).exists()
        assert sorted(set(before) - set(deleted)) == after
        freed = sum(sizes[name] + sizes.get(name.split(".")[0] + ".idx", 0) for name in deleted)
        assert report.reclaimed_bytes == freed
        assert_range(j, "keep", 1, 20)
        if how != "evict":
            assert j.get_session("old").last_ordinal == 80
        assert j.verify().ok
        # Nothing more to delete on a second pass.
        assert j.apply_retention().deleted_segments == []
        expected = _observe(j, [])
    with open_store(store, policy, segment_bytes=SMALL_SEGMENTS) as j:
        assert _observe(j, []) == expected
        assert segment_files(store) == after
    # A view rebuilt from a log with holes where dead segments were reads the same.
    shutil.rmtree(store / "index")
    with open_store(store, policy, segment_bytes=SMALL_SEGMENTS) as j:
        assert _observe(j, []) == expected
        assert j.verify().ok
        assert append_batch(j, "keep", [10]) == (21, 21)


def _segment_of_each_ordinal(store: Path, events: list[Event]) -> dict[int, str]:
    bases = sorted(int(name[:20]) for name in segment_files(store))
    names = {int(name[:20]): name for name in segment_files(store)}
    found = {}
    for event in events:
        base = max(b for b in bases if b <= event.position)
        found[event.ordinal] = names[base]
    return found


@pytest.mark.parametrize("keep_its_last_event", [True, False])
def test_a_segment_is_deleted_exactly_when_its_last_retained_event_leaves(
    store: Path, keep_its_last_event: bool
) -> None:
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        j.create_session("s")
        _fill(j, "s", 60)
        where = _segment_of_each_ordinal(store, list(j.replay("s")))
        second = sorted(set(where.values()))[1]  # sealed, and not the creation's segment
        last_in_second = max(n for n, name in where.items() if name == second)
        through = last_in_second - 1 if keep_its_last_event else last_in_second
        j.compact_session("s", through, b"snap")
        report = j.apply_retention()
        assert (second in report.deleted_segments) is not keep_its_last_event, report
        assert (second in segment_files(store)) is keep_its_last_event
        assert_range(j, "s", through + 1, 60)
        j.compact()
        assert_range(j, "s", through + 1, 60)
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        assert_range(j, "s", through + 1, 60)


# -- compact() ---------------------------------------------------------------------------------


def _observe(j: Journal, cursors: list[tuple[str, str]]) -> dict[str, Any]:
    """Everything a reader can observe: sessions, events (every field and cursor),
    snapshots, and what each given cursor yields (or which error)."""
    sessions = list(j.list_sessions())
    return {
        "sessions": sessions,
        "events": {
            m.session_id: [(*v, e.cursor) for v, e in zip(*_events(j, m.session_id), strict=True)]
            for m in sessions
        },
        "snapshots": {m.session_id: j.snapshot(m.session_id) for m in sessions},
        "cursors": [
            outcome(lambda s=s, c=c: event_view(j.read(s, cursor=c, max_bytes=1 << 30).events))
            for s, c in cursors
        ],
    }


def _events(j: Journal, session_id: str) -> tuple[list[tuple[Any, ...]], list[Event]]:
    events = list(j.replay(session_id, max_bytes=3000))
    for event in events:
        check_event(event, session_id)
    return event_view(events), events


def _busy_store(store: Path, policy: RetentionPolicy) -> tuple[Journal, list[tuple[str, str]]]:
    """A store with interleaved sessions, a snapshot, a trimmed session, an evicted one,
    a re-created id; plus cursors of every kind of outcome."""
    j = open_store(store, policy, segment_bytes=SMALL_SEGMENTS)
    for session_id in ("a", "b", "c", "gone"):
        j.create_session(session_id)
    for i in range(60):
        for session_id, size in (("a", 300), ("b", 200), ("c", 50), ("gone", 250)):
            append_batch(j, session_id, [size] * (1 + i % 3))
    cursors = [(s, e.cursor) for s in ("a", "b", "c", "gone") for e in list(j.replay(s))[::17]]
    j.compact_session("a", j.get_session("a").last_ordinal - 5, b"snapshot of a")
    j.resolve_session("gone")
    return j, cursors


def test_compact_keeps_every_retained_event_and_reclaims_dead_bytes(store: Path) -> None:
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=DAY_MS)
    j, cursors = _busy_store(store, policy)
    try:
        ended = j.get_session("gone").ended_at_ms
        assert j.apply_retention(now_ms=ended + DAY_MS).evicted_sessions == ["gone"]
        j.create_session("gone")  # a new incarnation: the old cursors are foreign
        append_batch(j, "gone", [10])
        cursors += [(s, e.cursor) for s in ("a", "b", "c", "gone") for e in j.replay(s)][::5]
        expected = _observe(j, cursors)
        assert {o[0] for o in expected["cursors"]} >= {"ok", "CursorExpired", "CursorForeign"}
        on_disk = _sealed_bytes(store)
        report = j.compact()
        assert isinstance(report, CompactionReport)
        assert report.bytes_before == on_disk
        assert report.bytes_after < report.bytes_before / 2, report
        assert report.live_bytes_copied > 0
        assert report.seconds >= 0
        assert report.segments_rewritten, report
        names = segment_files(store)
        for name in report.segments_rewritten:
            assert name.endswith(".seg.zst") and name in names
        # Every sealed segment is now compressed; the active one stays plain.
        assert [n for n in names if not n.endswith(".seg.zst")] == [names[-1]]
        assert report.bytes_after == _sealed_bytes(store)
        assert _observe(j, cursors) == expected
        # The journal keeps working: appends, reads, a second compaction with nothing new.
        append_batch(j, "b", [10])
        expected = _observe(j, cursors)
        again = j.compact()
        assert again.segments_rewritten == [] and again.segments_deleted == []
        assert _observe(j, cursors) == expected
        assert j.verify().ok
    finally:
        j.close()
    with open_store(store, policy, segment_bytes=SMALL_SEGMENTS) as j:
        assert _observe(j, cursors) == expected
    shutil.rmtree(store / "index")
    with open_store(store, policy, segment_bytes=SMALL_SEGMENTS) as j:
        # A view rebuilt from the compacted segments reads the same.
        assert _observe(j, cursors) == expected


def test_compact_deletes_segments_that_hold_nothing_live(store: Path) -> None:
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        j.create_session("old")
        _fill(j, "old", 80)
        j.create_session("keep")
        _fill(j, "keep", 30)
        j.compact_session("old", 80, b"done")
        before = segment_files(store)
        report = j.compact()
        assert len(report.segments_deleted) >= len(before) - 5, (report, before)
        after = segment_files(store)
        assert not set(report.segments_deleted) & set(after)
        assert len(after) == len(before) - len(report.segments_deleted)
        assert_range(j, "keep", 1, 30)
        assert_range(j, "old", 81, 80)


def _fill_two_sessions(j: Journal) -> None:
    """Sessions "a" and "b", 40 events of 300 bytes each, alternating: every small
    segment holds some of both."""
    j.create_session("a")
    j.create_session("b")
    for _ in range(40):
        append_batch(j, "a", [300])
        append_batch(j, "b", [300])


@pytest.mark.parametrize("dead_share", [0.0, 0.5, 1.0])
def test_compact_rewrites_only_segments_dead_enough_once_compressed(
    store: Path, dead_share: float
) -> None:
    with open_store(store, segment_bytes=SMALL_SEGMENTS, compress_sealed=True) as j:
        _fill_two_sessions(j)
        names = segment_files(store)
        assert all(n.endswith(".seg.zst") for n in names[:-1]), names
        # Nothing is dead yet and everything sealed is compressed: dead_share=1.0 and 0.5
        # rewrite nothing, 0.0 rewrites everything sealed.
        report = j.compact(dead_share=dead_share)
        assert len(report.segments_rewritten) == (len(names) - 1 if dead_share == 0.0 else 0)
        j.compact_session("a", 40, b"a")  # about half of every segment is now dead
        expected = _observe(j, [])
        report = j.compact(dead_share=dead_share)
        rewritten = len(report.segments_rewritten)
        if dead_share == 1.0:
            assert rewritten == 0
        else:
            assert rewritten >= len(names) - 3, report
            assert report.bytes_after < report.bytes_before
        assert _observe(j, []) == expected
        with pytest.raises(InvalidArgument):
            j.compact(dead_share=1.5)


def test_compact_progress_counts_segments_up_to_the_total(store: Path) -> None:
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        _fill_two_sessions(j)
        sealed = len(segment_files(store)) - 1
        for round_no in range(2):  # everything rewritten, then nothing to do
            calls: list[tuple[int, int]] = []
            j.compact(progress=lambda done, total, calls=calls: calls.append((done, total)))
            assert calls, f"round {round_no}: progress was never called"
            assert [total for _, total in calls] == [sealed] * len(calls)
            assert [done for done, _ in calls] == sorted(done for done, _ in calls)
            assert calls[-1] == (sealed, sealed), (round_no, calls)


def test_compact_goes_on_past_a_damaged_segment_and_then_raises_its_damage(
    store: Path,
) -> None:
    # One damaged sealed segment stopped compact() at that segment: the store's other
    # segments were never rewritten again, and their dead bytes stayed on disk for good
    # (operator trial).
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        _fill_two_sessions(j)
        names = segment_files(store)
        assert len(names) >= 4, names
        j.compact_session("a", 40, b"a")  # about half of every segment is now dead
        before = [(e.ordinal, e.position, e.data, e.cursor) for e in j.replay("b")]
        damaged = names[0]
        targets = frame_offsets(store / "segments" / damaged)[-2:]  # one of them "b"'s
        for target in targets:
            flip_bit(store / "segments" / damaged, target + 40)
        calls: list[tuple[int, int]] = []
        with pytest.raises(JournalCorrupt) as info:
            j.compact(progress=lambda done, total: calls.append((done, total)))
        assert info.value.segment == damaged and info.value.offset in targets
        after = segment_files(store)
        assert after[0] == damaged  # left as it is, for verify and a restore
        assert all(n.endswith(".seg.zst") for n in after[1:-1]), after
        assert calls[-1] == (len(names) - 1, len(names) - 1)
        # Past the damaged segment every event reads as before; through it, damage is
        # raised, never skipped.
        pivot = next(i for i, b in enumerate(before) if b[1] >= int(names[1][:20]))
        rest = [(e.ordinal, e.position, e.data) for e in j.replay("b", before[pivot][3])]
        assert rest == [b[:3] for b in before[pivot + 1 :]]
        with pytest.raises(JournalCorrupt):
            list(j.replay("b"))


# -- verify --------------------------------------------------------------------------------------


def test_verify_is_ok_on_a_healthy_store(store: Path) -> None:
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=DAY_MS)
    j, _ = _busy_store(store, policy)
    try:
        calls: list[tuple[int, int]] = []
        report = j.verify(progress=lambda done, total: calls.append((done, total)))
        assert report.ok and report.problems == [], report
        assert report.segments == len(segment_files(store))
        assert report.frames > 0 and report.records >= report.frames
        assert calls and calls[-1][0] == calls[-1][1]
        j.apply_retention(now_ms=j.get_session("gone").ended_at_ms + DAY_MS)
        j.compact()
        report = j.verify()
        assert report.ok and report.problems == [], report
        assert report.segments == len(segment_files(store))
    finally:
        j.close()


@pytest.mark.parametrize("where", ["body", "header"])
def test_verify_names_the_segment_and_frame_offset_of_a_flipped_bit(
    store: Path, where: str
) -> None:
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        j.create_session("s")
        _fill(j, "s", 60)
        j.create_session("t")
        append_batch(j, "t", [10, 10])  # in the active segment, far from the damage
        sealed = segment_files(store)[1]
        offsets = frame_offsets(store / "segments" / sealed)
        assert len(offsets) >= 5
        target = offsets[len(offsets) // 2]
        # In the header: the first-position field (covered by the checksum).
        flip_bit(store / "segments" / sealed, target + (40 if where == "body" else 14))
        report = j.verify()
        assert not report.ok
        assert [(p.segment, p.offset) for p in report.problems] == [(sealed, target)], (
            report.problems
        )
        # A reader that needs that frame fails loudly, naming the same place.
        with pytest.raises(JournalCorrupt) as info:
            list(j.replay("s"))
        assert (info.value.segment, info.value.offset) == (sealed, target)
        sessions = list(j.list_sessions())
        assert_range(j, "t", 1, 2)
        # fix=True cannot repair a damaged frame: it reports it, and leaves the store
        # readable and writable where it is not damaged.
        fixed = j.verify(fix=True)
        assert not fixed.ok
        assert (sealed, target) in [(p.segment, p.offset) for p in fixed.problems]
        assert list(j.list_sessions()) == sessions
        assert_range(j, "t", 1, 2)
        assert append_batch(j, "t", [10]) == (3, 3)
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        assert_range(j, "t", 1, 3)


def test_verify_lists_every_damaged_frame_of_a_segment_not_only_the_first(
    store: Path,
) -> None:
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        j.create_session("s")
        _fill(j, "s", 60)
        healthy = j.verify()
        assert healthy.ok
        names = segment_files(store)
        sealed, active = names[1], names[-1]
        offsets = frame_offsets(store / "segments" / sealed)
        assert len(offsets) >= 6
        in_active = frame_offsets(store / "segments" / active)
        assert len(in_active) >= 2
        # A body, a checksummed header field, and a length (the next frame is found by
        # its magic and checksum, not by the damaged length); and a committed frame of
        # the active segment.
        damaged = [(sealed, offsets[1]), (sealed, offsets[3]), (sealed, offsets[-2])]
        damaged.append((active, in_active[0]))
        for (name, offset), at in zip(damaged, (40, 14, 6, 40), strict=True):
            flip_bit(store / "segments" / name, offset + at)
        report = j.verify()
        assert [(p.segment, p.offset) for p in report.problems] == damaged, report.problems
        # Every other frame was checked.
        assert report.frames == healthy.frames - len(damaged)


def test_verify_reads_on_past_damage_without_taking_a_frame_in_event_data_for_one(
    store: Path,
) -> None:
    """A whole frame stored as an event's data is not where the log goes on after the
    damaged frame that holds it."""
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        j.create_session("s")
        append_batch(j, "s", [300, 300])
        (first_frame, *_) = frame_offsets(store / "segments" / segment_files(store)[0])
        raw = (store / "segments" / segment_files(store)[0]).read_bytes()
        length = FRAME_HEADER.unpack_from(raw, first_frame)[1]
        frame = raw[first_frame : first_frame + FRAME_HEADER.size + length]
        j.append("s", [EventIn("m", frame)])  # (an old frame, valid, as data)
        append_batch(j, "s", [300])
        healthy = j.verify()
        assert healthy.ok
        name = segment_files(store)[-1]
        data = (store / "segments" / name).read_bytes()
        holder = [o for o in frame_offsets(store / "segments" / name) if frame in data[o:]][-1]
        flip_bit(store / "segments" / name, holder + 30)  # (before the frame in its data)
        report = j.verify()
        assert [(p.segment, p.offset) for p in report.problems] == [(name, holder)], report.problems
        assert report.frames == healthy.frames - 1


def test_verify_goes_on_after_a_damaged_block_of_a_compressed_segment(store: Path) -> None:
    with open_store(store, segment_bytes=4 << 20, compress_sealed=True) as j:
        j.create_session("s")
        for i in range(60):
            j.append("s", [EventIn("m", b"%03d" % i + b"x" * 100_000)])
        healthy = j.verify()
        assert healthy.ok
        name = next(n for n in segment_files(store) if n.endswith(".seg.zst"))
        path = store / "segments" / name
        with SegmentReader(str(path.parent), int(name[:20])) as reader:
            blocks = reader.block_table()
            assert len(blocks) >= 3, blocks
            uoffset, ulength, coffset, _ = blocks[1]
            in_block = sum(
                uoffset <= info.offset < uoffset + ulength for info, _ in reader.frames()
            )
        flip_bit(path, coffset + 40)  # (in the block's compressed bytes)
        report = j.verify()
        assert [(p.segment, p.offset) for p in report.problems] == [(name, coffset)], (
            report.problems
        )
        assert report.frames == healthy.frames - in_block


def test_verify_names_a_damaged_compressed_segment(store: Path) -> None:
    with open_store(store, segment_bytes=SMALL_SEGMENTS, compress_sealed=True) as j:
        j.create_session("s")
        _fill(j, "s", 60)
        sealed = segment_files(store)[1]
        assert sealed.endswith(".seg.zst")
        path = store / "segments" / sealed
        flip_bit(path, path.stat().st_size // 3)
        report = j.verify()
        assert not report.ok
        assert sealed in {p.segment for p in report.problems}, report.problems
        with pytest.raises(JournalCorrupt) as info:
            list(j.replay("s"))
        assert info.value.segment == sealed


def test_verify_fix_rewrites_a_missing_sidecar(store: Path) -> None:
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        j.create_session("s")
        _fill(j, "s", 40)
        sealed = segment_files(store)[1]
        sidecar = store / "segments" / sealed.replace(".seg", ".idx")
        content = sidecar.read_bytes()
        sidecar.unlink()
        report = j.verify()
        assert not report.ok
        assert [p.segment for p in report.problems] == [sidecar.name], report.problems
        fixed = j.verify(fix=True)
        assert fixed.ok and fixed.fixed
        assert sidecar.read_bytes() == content
        assert j.verify().ok and j.verify().problems == []
        assert_range(j, "s", 1, 40)


def test_verify_fix_rebuilds_a_deleted_view_that_reads_exactly_as_before(store: Path) -> None:
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=DAY_MS)
    j, cursors = _busy_store(store, policy)
    try:
        j.apply_retention(now_ms=j.get_session("gone").ended_at_ms + DAY_MS)
        j.create_session("gone")
        append_batch(j, "gone", [10, 10])
        j.create_session("trimmed", max_history_bytes=500)
        for _ in range(5):
            append_batch(j, "trimmed", [200])
        j.apply_retention()
        j.compact()
        append_batch(j, "b", [10])
        cursors += [(s, e.cursor) for s in ("a", "b", "gone", "trimmed") for e in j.replay(s)]
        expected = _observe(j, cursors)
        kinds = {o[0] for o in expected["cursors"]}
        assert kinds >= {"ok", "CursorExpired", "CursorForeign"}, kinds
    finally:
        j.close()
    shutil.rmtree(store / "index")
    os.unlink(store / "view-boot")
    with open_store(store, policy, segment_bytes=SMALL_SEGMENTS) as j:
        report = j.verify(fix=True)
        assert report.ok, report
        assert _observe(j, cursors) == expected
        assert j.verify().ok
        # Still writable where it was, with ordinals continuing.
        last = j.get_session("b").last_ordinal
        assert append_batch(j, "b", [10]) == (last + 1, last + 1)
    with open_store(store, policy, segment_bytes=SMALL_SEGMENTS) as j:
        observed = _observe(j, cursors)
        assert observed["snapshots"] == expected["snapshots"]
        assert observed["sessions"][0] == expected["sessions"][0]


@given(
    batches=st.lists(st.integers(1, 6), min_size=1, max_size=40),
    # Sizes and limits in steps of 50, so a frame often ends exactly at the limit.
    sizes=st.lists(st.sampled_from([0, 50, 100, 150]), min_size=1, max_size=8),
    limit=st.integers(1, 60).map(lambda n: n * 50),
    passes=st.lists(st.integers(0, 39), max_size=4),
)
@example(batches=[1, 1, 1], sizes=[100], limit=200, passes=[2])  # a frame ends at the limit
@example(batches=[2, 1, 3, 1], sizes=[50, 0, 100], limit=150, passes=[1, 3])
@settings(max_examples=60, deadline=None)
def test_a_byte_window_keeps_exactly_the_frames_a_linear_scan_keeps(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[int],
    sizes: list[int],
    limit: int,
    passes: list[int],
) -> None:
    # The window's frame is found by a binary search over the index; the reference is
    # the rule itself: the oldest frame with at most `limit` bytes from it to the end,
    # else the newest frame; a pass never moves the first retained ordinal back.
    store = tmp_path_factory.mktemp("window")
    frames: list[tuple[int, int]] = []  # (first ordinal, bytes before)
    appended = 0
    expected_first = 1
    with open_store(store, RetentionPolicy(max_history_bytes=limit)) as j:
        j.create_session("s")
        ordinal = 1
        for i, count in enumerate(batches):
            bodies = [b"x" * sizes[(i + k) % len(sizes)] for k in range(count)]
            frames.append((ordinal, appended))
            j.append("s", [EventIn("e", body) for body in bodies])
            ordinal += count
            appended += sum(map(len, bodies))
            if i in passes:
                retained = appended - max((b for f, b in frames if f <= expected_first), default=0)
                if retained > limit:
                    keep = next((f for f, b in frames if appended - b <= limit), frames[-1][0])
                    expected_first = max(expected_first, keep)
                j.apply_retention()
                assert j.get_session("s").first_ordinal == expected_first


def test_a_session_that_stays_open_does_not_keep_evicted_sessions_segments(
    store: Path,
) -> None:
    """An eviction record stays while its session's creation record may still exist (a
    rebuild would bring the session back). One session that stays open kept its
    creation record's segment forever, so the eviction records of the sessions created
    there stayed, and kept their own segment, whose evicted sessions' eviction records
    kept the next one...: with churn, no segment was ever deleted (found by a soak test:
    +1 MB per 1,000 sessions with 64 KiB segments). Now the writer compacts the segments
    those creation records are in (the expiry thread does it), and the chain breaks."""
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)
    events = [EventIn("message", b"x" * 220) for _ in range(3)]
    most = 0
    with open_store(store, policy, segment_bytes=64 << 10) as j:
        j.create_session("supervisor")  # stays open
        for i in range(3000):
            j.create_session(f"s{i}")
            j.append(f"s{i}", events)
            j.resolve_session(f"s{i}")
            if i % 100 == 99:
                most = max(most, len(segment_files(store)))
        # (Each pass after a seal finds segments kept only by eviction records; the
        # expiry thread compacts, the next pass deletes.)
        assert most <= 8, most
        assert j.get_session("supervisor").state is SessionState.OPEN
        assert j.verify().ok
        before = [(m.session_id, m.state, m.last_ordinal) for m in j.list_sessions()]
    shutil.rmtree(store / "index")  # (a rebuild from what is left agrees)
    with open_store(store, policy, segment_bytes=64 << 10) as j:
        after = [(m.session_id, m.state, m.last_ordinal) for m in j.list_sessions()]
    assert after == before


def test_the_view_forgets_evicted_sessions_once_their_records_are_gone(store: Path) -> None:
    """The view's `incarnations` (incarnation -> session id) kept every session ever
    created (about 420 bytes of view per evicted session, found by a soak test); a view
    rebuilt from the log had none of those whose records were deleted. Now the entry
    goes with the tombstone, when the creation record is gone."""
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)
    events = [EventIn("message", b"x" * 220) for _ in range(3)]
    with open_store(store, policy, segment_bytes=64 << 10) as j:
        token = j.list_sessions_page(page_size=1).next_page_token  # ("" : none yet)
        for i in range(2000):
            j.create_session(f"s{i}")
            if i == 0:
                j.create_session("t")
                token = j.list_sessions_page(page_size=1).next_page_token  # (after s0)
            j.append(f"s{i}", events)
            j.resolve_session(f"s{i}")
        j.apply_retention()
        remaining = len(list(j.list_sessions()))
        with pytest.raises(InvalidPageToken):  # (s0 is long gone: a stale token)
            j.list_sessions_page(page_size=1, page_token=token)
    env = lmdb.open(str(store / "index"), max_dbs=16, map_size=1 << 36, readonly=True)
    try:
        with env.begin() as txn:
            kept = txn.stat(env.open_db(b"incarnations", txn=txn, create=False))["entries"]
    finally:
        env.close()
    assert kept <= remaining + 200, (kept, remaining)


def test_a_creation_record_sharing_its_frame_with_a_live_one_does_not_loop(
    store: Path,
) -> None:
    """Sessions created in one batch share a frame: while one of them lives, the frame
    and the others' creation records stay, and so do their eviction records (SPEC 8,
    "Eviction records"). The compaction the retention pass asks for finds nothing to
    drop there; it must then not run another pass (which would ask again, forever)."""
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)
    events = [EventIn("message", b"x" * 220) for _ in range(3)]
    with open_store(store, policy, segment_bytes=64 << 10) as j:
        barrier = threading.Barrier(8)

        def create(name: str) -> None:
            barrier.wait()
            j.create_session(name)

        threads = [threading.Thread(target=create, args=(f"b{i}",)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for i in range(1, 8):
            j.resolve_session(f"b{i}")
        for i in range(1500):
            j.create_session(f"s{i}")
            j.append(f"s{i}", events)
            j.resolve_session(f"s{i}")
        assert len(segment_files(store)) <= 8
        time.sleep(0.3)
        busy = time.process_time()
        time.sleep(1.0)
        assert time.process_time() - busy < 0.2  # (no pass after pass in the background)
        assert j.get_session("b0").state is SessionState.OPEN


def test_compactions_of_one_journal_never_run_at_once(store: Path) -> None:
    """The compactions a retention pass asks for (run by the expiry thread, `maintain`)
    and `compact()` wrote the same temporary copy of a segment: one could rename the
    other's half-written file into place (found by a review). One runs at a time now:
    asked while `compact()` is inside (paused at its fault point), `maintain` compacts
    nothing; asked again afterwards, it does."""
    paused, go = threading.Event(), threading.Event()
    seen: list[str] = []

    class Pause(FileOps):
        def point(self, name: str, detail: object = None) -> None:
            if name != "compaction.live_frames":
                return
            seen.append(threading.current_thread().name)
            if threading.current_thread() is threading.main_thread() and not paused.is_set():
                paused.set()
                go.wait(10)

    j, engine = open_local(
        store, durability="os", segment_bytes=SMALL_SEGMENTS, retention=NO_WINDOWS, file_ops=Pause()
    )
    with j:
        j.create_session("a")
        for _ in range(40):
            append_batch(j, "a", [300])

        def maintain() -> None:
            paused.wait(10)
            engine.compactions.ask({1})
            engine.maintain()
            go.set()

        other = threading.Thread(target=maintain, name="other")
        other.start()
        j.compact(dead_share=0.0)
        other.join()
        assert "MainThread" in seen and "other" not in seen
        engine.compactions.ask({1})
        again = threading.Thread(target=engine.maintain, name="again")
        again.start()
        again.join()
        assert "again" in seen
        assert j.verify().ok


# -- the store's recorded policy -----------------------------------------------------------


def test_a_journal_opened_without_a_policy_uses_the_one_the_store_records(store: Path) -> None:
    window = RetentionPolicy(max_history_bytes=2000)
    with open_store(store, window, segment_bytes=4096) as j:
        j.create_session("s")
    recorded = json.loads((store / "store.json").read_text())["retention"]
    assert recorded["max_history_bytes"] == 2000
    # Opened without one (as every `journal` command is): the recorded window applies,
    # not the default 320 MiB one.
    with Journal.open(store, durability="os", segment_bytes=4096) as j:
        for _ in range(40):
            append_batch(j, "s", [300])
        assert j.get_session("s").first_ordinal > 1
    # Another policy given to a writer is recorded; a read-only journal refuses one.
    with open_store(store, NO_WINDOWS, segment_bytes=4096):
        pass
    with pytest.raises(InvalidArgument, match="retention is for journals that write"):
        Journal.open(store, readonly=True, retention=window)
    assert json.loads((store / "store.json").read_text())["retention"]["max_history_bytes"] is None


def test_journal_compact_applies_the_store_s_policy_not_the_default(store: Path) -> None:
    with open_store(store, NO_WINDOWS, segment_bytes=4096) as j:
        j.create_session("s")
        for _ in range(40):
            append_batch(j, "s", [300])
    with open_store(store, RetentionPolicy(max_history_bytes=2000), segment_bytes=4096):
        pass  # (recorded now; this open sealed nothing)
    result = CliRunner().invoke(journal_cli, ["--store", str(store), "compact"])
    assert result.exit_code == 0, result.output
    with Journal.open(store, readonly=True) as j:
        assert j.get_session("s").first_ordinal > 1  # the recorded 2000-byte window


def test_a_damaged_policy_in_store_json_is_reported(store: Path) -> None:
    with open_store(store):
        pass
    document = json.loads((store / "store.json").read_text())
    document["retention"]["max_history_bytes"] = -5
    (store / "store.json").write_text(json.dumps(document))
    with pytest.raises(StoreIncompatible, match="retention"):
        Journal.open(store)


def test_the_policy_a_writer_gives_is_the_store_s_on_every_engine(
    engine: EngineFactory, tmp_path: Path
) -> None:
    path = tmp_path / "store"
    evicting = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)
    with engine.open(path, retention=evicting) as j:
        j.create_session("s")
        ended = j.resolve_session("s").ended_at_ms
        assert ended is not None
    # Opened without a policy: the recorded one (the default would evict nothing).
    with engine.open(path) as j:
        assert j.apply_retention(now_ms=ended + 1000).evicted_sessions == ["s"]


def test_compact_rewrites_a_segment_whose_sidecar_is_checksummed_but_inconsistent(
    store: Path,
) -> None:
    # A writer's open checks sidecars by checksum only, so a checksummed but inconsistent
    # one stays until `verify(fix=True)`; compaction took it as absent and skipped its
    # segment, whose dead bytes then stayed on disk with nothing said.
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        _fill_two_sessions(j)
        j.compact_session("a", 40, b"a")  # about half of every segment is now dead
    names = segment_files(store)
    sidecar = store / "segments" / (names[0].removesuffix(".seg") + ".idx")
    raw = sidecar.read_bytes()
    body = msgspec.msgpack.decode(raw[12:])
    body[4][0][0] = 2**63  # a frame offset out of the segment, checksum recomputed
    new = msgspec.msgpack.encode(body)
    sidecar.write_bytes(raw[:8] + struct.pack(">I", zlib.crc32(new)) + new)
    with open_store(store, segment_bytes=SMALL_SEGMENTS) as j:
        expected = [(e.ordinal, e.data) for e in j.replay("b")]
        report = j.compact()
        after = segment_files(store)
        assert all(n.endswith(".seg.zst") for n in after[:-1]), (after, report)
        assert [(e.ordinal, e.data) for e in j.replay("b")] == expected
        assert j.verify().problems == []
    assert not [n for n in os.listdir(store / "segments") if n.endswith(".tmp")]


def test_compact_stops_at_damage_its_swap_meets_and_leaves_no_temporary_copy(
    store: Path,
) -> None:
    # compact() goes on past a damaged segment; damage the swap's commit meets (the view's,
    # met again by every swap) is not the segment's: it went on compressing every other
    # segment, and each copy whose swap failed stayed on disk as a .tmp file.
    j, engine = open_local(
        store, durability="os", segment_bytes=SMALL_SEGMENTS, retention=NO_WINDOWS
    )
    with j:
        _fill_two_sessions(j)
        j.compact_session("a", 40, b"a")  # about half of every segment is now dead
        swaps: list[int] = []

        def submit(operation: Any) -> Any:
            if isinstance(operation, SwapSegment):
                swaps.append(operation.base)
                raise JournalCorrupt("index", 0, "a damaged entry")
            return engine.submit(operation)

        with pytest.raises(JournalCorrupt) as info:
            compact_store(engine.log, engine.view, submit, 0.0, None)
        assert info.value.segment == "index"
        assert len(swaps) == 1, swaps
        assert not [n for n in os.listdir(store / "segments") if n.endswith(".tmp")]
        assert j.verify().problems == []
