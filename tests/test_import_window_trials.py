"""Imports into stores with byte windows (SPEC 8, 12.3: the staging steps of the history
a window may cut are at most 1/16 of it), and imports killed midway (SPEC 12.3: nothing
staged becomes visible; the next writable open rolls it back, and retention and
compaction take its space back)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal import EventIn, Journal, RetentionPolicy
from journal.import_windows import WINDOW_STEPS


def _window_trial(root: Path, sizes: list[int], window: int, own: bool, more: int) -> None:
    """Single-event appends of `sizes` bytes to a session under a byte window (its own,
    or the store's), exported, imported under the same window; one more append (`more`
    bytes) to each, then a retention pass. The target keeps what the source keeps, give or take
    events of at most 1/16 of the window (or one event larger than that), and never more
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
    step = window // WINDOW_STEPS
    assert sum(between) <= step or len(between) == 1, (source, target, between, step)


@settings(max_examples=12)
@given(
    st.lists(st.integers(1, 6000), min_size=1, max_size=60),
    st.integers(500, 60_000),
    st.booleans(),
    st.integers(1, 20_000),
)
def test_an_import_keeps_what_the_source_keeps_within_a_sixteenth_of_the_window(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], window: int, own: bool, more: int
) -> None:
    _window_trial(tmp_path_factory.mktemp("w"), sizes, window, own, more)


@pytest.mark.slow
@settings(max_examples=150)
@given(
    st.lists(st.integers(1, 20_000), min_size=1, max_size=200),
    st.integers(500, 400_000),
    st.booleans(),
    st.integers(1, 100_000),
)
def test_an_import_keeps_what_the_source_keeps_many_windows(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], window: int, own: bool, more: int
) -> None:
    _window_trial(tmp_path_factory.mktemp("w"), sizes, window, own, more)
