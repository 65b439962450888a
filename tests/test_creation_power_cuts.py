"""A power cut at every file operation of a store's creation (SPEC 7, "creating"): after
it, the store reads as no store (`StoreNotFound`) or opens, never as damaged; a creating
open then finishes it, and what it appends is kept."""

from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path

import pytest
from _disk import SimulatedDisk

from journal import EventIn, Journal, StoreNotFound


def _operations(root: Path, durability: str) -> int:
    """How many file operations a creation and a first append make."""
    disk = SimulatedDisk(str(root), random.Random(0))
    disk.settle()
    with Journal.open(root / "store", file_ops=disk, durability=durability) as journal:
        journal.create_session("s")
    return disk.calls


def _cut_creation(root: Path, durability: str, cut_at: int, seed: int) -> bool:
    """Create the store at root/store with the power cut at operation `cut_at`, then an
    append; whether the append was acknowledged."""
    disk = SimulatedDisk(str(root), random.Random(seed))
    disk.settle()
    disk.cut_at = cut_at
    journal = None
    acknowledged = False
    try:
        journal = Journal.open(root / "store", file_ops=disk, durability=durability)
        journal.create_session("s")
        acknowledged = durability == "fsync"
    except Exception:  # (the disk is gone: whatever the open or append meets)
        pass
    disk.power_cut()
    if journal is not None:
        with contextlib.suppress(Exception):
            journal.close()
    return acknowledged


def _check_after_the_cut(path: Path, acknowledged: bool) -> None:
    for options in ({"readonly": True}, {"create": False}):
        try:
            with Journal.open(path, **options) as journal:  # type: ignore[arg-type]
                sessions = [s.session_id for s in journal.list_sessions()]
        except StoreNotFound:
            assert not acknowledged, options
            continue
        assert sessions in ([], ["s"]), sessions
        if acknowledged:
            assert sessions == ["s"]
    with Journal.open(path) as journal:  # (a creating open: finishes it)
        if not any(s.session_id == "s" for s in journal.list_sessions()):
            journal.create_session("s")
        journal.append("s", [EventIn("m", b"after")])
    assert "creating" not in os.listdir(path)
    with Journal.open(path, readonly=True) as journal:
        assert [e.data for e in journal.replay("s")] == [b"after"]


@pytest.mark.parametrize("durability", ["fsync", "os"])
def test_a_power_cut_at_every_operation_of_a_creation(
    tmp_path: Path, durability: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (The key ring file is written past the simulated disk, with its own syncs, which the
    # disk does not see: a key from the environment keeps it out of the store.)
    monkeypatch.setenv("JOURNAL_CURSOR_KEY", "ab" * 32)
    total = _operations(tmp_path / "count", durability)
    assert total > 5
    for cut_at in range(1, total + 2):
        root = tmp_path / f"{cut_at}"
        root.mkdir()
        acknowledged = _cut_creation(root, durability, cut_at, cut_at)
        _check_after_the_cut(root / "store", acknowledged)
