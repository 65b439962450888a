"""What a writer keeps between retention passes does not grow with the store (SPEC 8,
"Writer memory"): a compact entry per sealed segment, not its sidecar, within a byte
budget; segments beyond the budget are read again by each pass, with the same outcome.

Sizes are measured structurally (the objects the engine's cache reaches), never as RSS.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
import types
from pathlib import Path
from typing import Any

from _local_engine import open_local

from journal import EventIn, Journal, RetentionPolicy
from journal._local import sidecar
from journal._local.engine import LocalEngine

SEGMENT_BYTES = 65536
NO_WINDOWS = RetentionPolicy(max_history_bytes=None)


def _open(
    path: Path, retention: RetentionPolicy = NO_WINDOWS, segment_bytes: int = SEGMENT_BYTES
) -> tuple[Journal, LocalEngine]:
    return open_local(path, durability="os", segment_bytes=segment_bytes, retention=retention)


def _deep_size(root: object) -> int:
    """Bytes of `root` and every object it reaches (classes and modules left out)."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def _sealed(store: Path) -> int:
    """Sealed plain segments (every one but the active segment)."""
    return sum(p.suffix == ".seg" for p in (store / "segments").iterdir()) - 1


def _seal_segments(j: Journal, sessions: list[str], appends: int) -> None:
    for n in range(appends):
        j.append(sessions[n % len(sessions)], [EventIn("m", b"%08d" % n + b"x" * 72)])


def test_retention_keeps_a_small_entry_per_sealed_segment_not_its_sidecar(
    tmp_path: Path,
) -> None:
    # Regression: every live sealed segment's whole sidecar stayed cached (about 0.5 KB
    # a frame), so a writer grew with the retained store.
    store = tmp_path / "store"
    j, engine = _open(store, segment_bytes=32768)
    with j:
        j.create_session("s")
        _seal_segments(j, ["s"], 6000)  # about 250 frames a segment
        assert j.apply_retention().deleted_segments == []
        sealed = _sealed(store)
        assert sealed >= 15
        cache = engine.summaries
        assert len(cache) == sealed  # every segment is live, and all of them fit
        # Before: about 90 KB a segment; now one small entry each, whatever its frames.
        assert _deep_size(cache) < 1024 * sealed, _deep_size(cache)
        assert cache.cached_bytes <= cache.budget_bytes


def test_a_segment_costs_sixteen_bytes_a_session_in_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    sessions = [f"s{i}" for i in range(200)]
    j, engine = _open(store)
    with j:
        for session_id in sessions:
            j.create_session(session_id)
        _seal_segments(j, sessions, 3000)
        j.apply_retention()
        cache = engine.summaries
        sealed = _sealed(store)
        assert len(cache) == sealed >= 4
        # Every segment holds events of all 200 sessions: charged 384 + 16 * 200 bytes.
        assert cache.cached_bytes == sealed * (384 + 16 * 200)
        assert _deep_size(cache) < 2 * cache.cached_bytes


def _scenario(path: Path, budget_bytes: int | None) -> tuple[Any, ...]:
    """Windows, a snapshot and passes over many sealed segments; what retention did."""
    policy = RetentionPolicy(max_history_bytes=25_000)
    reports = []
    seen: set[str] = set()
    j, engine = _open(path, policy, segment_bytes=16384)
    with j:
        cache = engine.summaries
        if budget_bytes is not None:
            cache.budget_bytes = budget_bytes
        for session_id in ("a", "b", "c"):
            j.create_session(session_id)
        for n in range(3000):
            session_id = "abc"[n % 3] if n < 2000 else "ab"[n % 2]
            j.append(session_id, [EventIn("m", b"%08d" % n + b"y" * (40 + n % 90))])
            assert cache.cached_bytes <= cache.budget_bytes
            if n % 50 == 0:
                seen.update(p.name for p in (path / "segments").iterdir())
        reports.append(j.apply_retention())
        j.compact_session("c", j.get_session("c").last_ordinal, b"all of c")
        reports.append(j.apply_retention())
        j.compact_session("a", j.get_session("a").last_ordinal - 10, b"most of a")
        reports.append(j.apply_retention())
        reports.append(j.apply_retention())
        assert cache.cached_bytes <= cache.budget_bytes
        entries = len(cache)
        sessions = {s: (m.first_ordinal, m.last_ordinal) for s in "abc" if (m := j.get_session(s))}
        files = sorted(p.name for p in (path / "segments").iterdir())
        assert j.verify().ok
    deleted = sorted(seen - set(files))
    return deleted, [r.deleted_segments for r in reports], sessions, files, entries


def test_segments_beyond_the_budget_are_read_again_with_the_same_outcome(
    tmp_path: Path,
) -> None:
    *unbounded, kept = _scenario(tmp_path / "unbounded", None)
    *two, kept_two = _scenario(tmp_path / "two", 2 * (384 + 16 * 3))
    *none, kept_none = _scenario(tmp_path / "none", 0)
    assert unbounded == two == none
    deleted, reported = unbounded[0], unbounded[1]
    assert len(deleted) >= 16, deleted  # segment files and sidecars, by passes and by itself
    assert reported[1], reported  # the snapshot of "c" let the explicit pass delete some
    assert kept > 2 and kept_two <= 2 and kept_none == 0


def test_the_active_segments_index_costs_little_per_frame(tmp_path: Path) -> None:
    # The writer indexes its active segment in memory as frames are appended (sealing then
    # writes the sidecar without a rescan): a segment of small frames holds a hundred
    # thousand of them, so each costs flat integers, not tuples and structs (~500 bytes
    # a frame before).
    with Journal.open(tmp_path / "s", durability="os") as j:
        j.create_session("s")
        for _ in range(500):
            j.append("s", [EventIn("e", b"x" * 100)])
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            for _ in range(5000):
                j.append("s", [EventIn("e", b"x" * 100)])
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
    # Only what the index's own module allocated: other allocations of the process (the
    # view's buffers, caches of earlier tests) are not the index's.
    only = [tracemalloc.Filter(True, sidecar.__file__)]
    kept = sum(
        stat.size_diff
        for stat in after.filter_traces(only).compare_to(before.filter_traces(only), "filename")
    )
    assert kept / 5000 < 200, f"{kept / 5000:.0f} bytes kept per frame"


def test_the_active_segments_index_costs_little_per_session(tmp_path: Path) -> None:
    # Sessions created, appended to, resolved and evicted (what a runtime churns) write
    # small frames of records other than events, which the index keeps encoded until the
    # segment is sealed: it held 725 bytes a session as structs, bytes objects and an
    # array per session (a session took 235 bytes of the segment), so a writer that
    # churned small sessions held about 3.7 times its active segment's size (RssAnon +60
    # MB before the seal of a 16 MiB segment, 68,000 sessions).
    policy = RetentionPolicy(session_retention_ms=1)
    with Journal.open(tmp_path / "s", durability="os", retention=policy) as j:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            for i in range(3000):
                j.create_session(f"session-{i:06d}")
                j.append(f"session-{i:06d}", [EventIn("m", b'{"x": 1}')] * 3)
                j.resolve_session(f"session-{i:06d}")
                if i % 200 == 199:
                    assert len(j.apply_retention(now_ms=2**62).evicted_sessions) == 200
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
    only = [tracemalloc.Filter(True, sidecar.__file__)]
    kept = sum(
        stat.size_diff
        for stat in after.filter_traces(only).compare_to(before.filter_traces(only), "filename")
    )
    assert kept / 3000 < 400, f"{kept / 3000:.0f} bytes kept per session"  # (about 300)
