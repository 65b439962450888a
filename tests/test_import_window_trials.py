"""Imports into stores with byte windows (SPEC 8, 12.3: the staging steps of the history
a window may cut are at most 1/16 of it), and imports killed midway (SPEC 12.3: nothing
staged becomes visible; the next writable open rolls it back, and retention and
compaction take its space back)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _cli_runs import ROOT
from _local_engine import open_local
from hypothesis import given, settings
from hypothesis import strategies as st

from journal import EventIn, InvalidArgument, Journal, RetentionPolicy
from journal.archive import ArchiveEvent, ArchiveSession
from journal.engine import AbortImport, StagedSession, StageEvents, StageSessions
from journal.import_windows import WINDOW_STEPS


def _window_trial(root: Path, sizes: list[int], window: int, own: bool, more: int) -> None:
    """Single-event appends of `sizes` bytes to a session under a byte window (its own,
    or the store's), exported, imported under the same window; one more append (`more`
    bytes) to each, then a retention pass. The target keeps what the source keeps, give or take
    events of at most 1/16 of the window or 64 KiB (`MIN_STEP`), or one event larger than
    that, and never more
    than the window (but its newest batch)."""
    policy = RetentionPolicy(max_history_bytes=None if own else window)
    session_window = {"max_history_bytes": window} if own else {}
    kept = {}
    buffer = io.BytesIO()
    for name in ("src", "dst"):
        with Journal.open(root / name, retention=policy) as journal:
            if name == "src":
                journal.create_session("s", **session_window)  # type: ignore[arg-type]
                for i, size in enumerate(sizes):
                    journal.append("s", [EventIn("m", bytes([i % 251]) * size)])
                journal.apply_retention()
                journal.export_sessions(None, buffer)
            else:
                journal.import_sessions(io.BytesIO(buffer.getvalue()))
            journal.append("s", [EventIn("m", b"z" * more)])
            journal.apply_retention()
            kept[name] = journal.get_session("s").first_ordinal
            data = [len(e.data) for e in journal.replay("s")]
        all_sizes = [*sizes, more]
        assert data == all_sizes[kept[name] - 1 :], name
        if len(data) > 1:  # (the newest batch always stays)
            assert sum(data) <= window or sum(data[1:]) < window, (name, data, window)
    source, target = kept["src"], kept["dst"]
    first, last = sorted((source, target))
    between = sizes[first - 1 : last - 1]
    step = max(window // WINDOW_STEPS, 64 << 10)  # (MIN_STEP, SPEC 8)
    assert sum(between) <= step or len(between) == 1, (source, target, between, step)


# (`share`: the window as a share of the session's data, so that it trims; mostly past
# 64 KiB, where steps are smaller than the window, and past 1 MiB, where 1/16 of it)
@settings(max_examples=12)
@given(
    st.lists(st.integers(5_000, 60_000), min_size=30, max_size=60),
    st.floats(0.3, 0.95),
    st.booleans(),
    st.integers(1, 20_000),
)
def test_an_import_keeps_what_the_source_keeps_within_a_sixteenth_of_the_window(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], share: float, own: bool, more: int
) -> None:
    window = max(500, int(sum(sizes) * share))
    _window_trial(tmp_path_factory.mktemp("w"), sizes, window, own, more)


@pytest.mark.slow
@settings(max_examples=60)
@given(
    st.lists(st.integers(1, 100_000), min_size=1, max_size=100),
    st.floats(0.01, 1.2),
    st.booleans(),
    st.integers(1, 100_000),
)
def test_an_import_keeps_what_the_source_keeps_many_windows(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], share: float, own: bool, more: int
) -> None:
    window = max(500, int(sum(sizes) * share))
    _window_trial(tmp_path_factory.mktemp("w"), sizes, window, own, more)


# argv: STORE ARCHIVE KILL_AT. Import ARCHIVE into STORE; SIGKILL itself as its KILL_AT-th
# staging step (`StageSessions`, `StageEvents`) is planned (those before it committed).
_KILLED_IMPORT = """
import os, signal, sys
from journal import Journal
from journal._local.files import FileOps
from journal.engine import StageEvents, StageSessions
store, archive, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
class KillAt(FileOps):
    steps = 0
    def point(self, name, detail=None):
        if name == "plan.operation" and isinstance(detail, (StageSessions, StageEvents)):
            KillAt.steps += 1
            if KillAt.steps == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
with Journal.open(store, file_ops=KillAt(), segment_bytes=1 << 16) as j:
    j.import_sessions(archive)
sys.exit(3)  # (not reached: fewer steps than KILL_AT)
"""


@pytest.mark.parametrize("kill_at", [2, 9, 20])
def test_an_import_killed_midway_leaves_nothing_and_its_space_comes_back(
    tmp_path: Path, kill_at: int
) -> None:
    # (steps of 125,000 bytes, 2 events each, over the window: more than 20 steps)
    window = RetentionPolicy(max_history_bytes=2_000_000)
    archive = tmp_path / "archive"
    with Journal.open(tmp_path / "src", retention=window, segment_bytes=1 << 16) as source:
        for name in ("big", "small"):
            source.create_session(name)
        for i in range(60):
            source.append("big", [EventIn("m", bytes([i]) * 45_000)])
            source.append("small", [EventIn("m", bytes([i]) * 10)])
        source.export_sessions(None, str(archive))
        expected = {s: [e.data for e in source.replay(s)] for s in ("big", "small")}
    target = tmp_path / "dst"
    with Journal.open(target, retention=window, segment_bytes=1 << 16) as journal:
        journal.append("mine", [EventIn("m", b"mine")], create=True)
        before = journal.stats().segments
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_IMPORT, str(target), str(archive), str(kill_at)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    with Journal.open(target, readonly=True) as journal:
        assert [s.session_id for s in journal.list_sessions()] == ["mine"]
        staged = journal.stats().segments
    # (segments of 64 KiB: every step of 90,000 bytes filled one)
    assert staged > before or kill_at < 9, (before, staged)
    with Journal.open(target, retention=window, segment_bytes=1 << 16) as journal:
        # (the open rolled the dead process's import back)
        assert [s.session_id for s in journal.list_sessions()] == ["mine"]
        journal.apply_retention()
        journal.compact(dead_share=0.01)
        journal.apply_retention()
        after = journal.stats().segments
        # (what the import staged is gone; the active segment may be a new one)
        assert after <= before + 1, (before, staged, after)
        assert after < staged or staged <= before + 1, (before, staged, after)
        assert journal.verify().ok
        journal.import_sessions(str(archive))  # (again, whole)
        for name, events in expected.items():
            assert [e.data for e in journal.replay(name)] == events
        assert [e.data for e in journal.replay("mine")] == [b"mine"]


def test_the_local_engine_refuses_several_staging_steps_in_one_operation(tmp_path: Path) -> None:
    """The local engine's window trims a staging operation's frame whole, so it takes one
    staging step an operation (it does not `joins_staging_steps`): an operation marking
    several (`StagedSession.steps`, `StageEvents.steps`) is `InvalidArgument` and stages
    nothing, and the same operation in one step is staged."""
    journal, engine = open_local(tmp_path / "s")
    with journal:
        assert engine.joins_staging_steps is False
        meta = ArchiveSession(
            "s", "m", None, {}, {}, "open", 1, None, None, 1, 4, None, 0, None, None, None
        )
        events = [ArchiveEvent(o, "m", 1000 + o, None, b"x" * 10) for o in range(1, 5)]

        def stage(steps: tuple[int, ...]) -> Any:
            session = StagedSession(meta, None, events[:2], None, "", steps)
            return engine.submit(StageSessions([session], "src", 1))

        before = journal.stats()
        with pytest.raises(InvalidArgument, match="one staging step an operation"):
            stage((1,))
        assert journal.stats() == before
        (row,) = stage(())
        with pytest.raises(InvalidArgument, match="one staging step an operation"):
            engine.submit(StageEvents(row.incarnation, events[2:], (1,)))
        assert engine.submit(StageEvents(row.incarnation, events[2:])) == 4
        assert engine.submit(AbortImport([row.incarnation])) == 1
        assert list(journal.list_sessions()) == []
