"""A power cut of a store written with durability "os" (SPEC 3.3, 9, 14.4).

Nothing an "os" writer commits is synced, so the disk may keep a later write of the
active segment and lose an earlier one: zeros, or a frame that fails its checksum, with
whole frames after it. That is no torn tail (valid frames follow it): every open refuses
it as damage, and says the way out. `verify(fix=True)` on a journal opened with
`repair=True` (`journal verify --fix`) cuts the active segment at the damage, keeping a
copy of everything from there on in `cut-tails/`, and reports it; then the store opens
and takes writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from pathlib import Path

import pytest
from _disk import SimulatedDisk
from click.testing import CliRunner

from cli.main import main
from journal import EventIn, InvalidArgument, Journal, JournalCorrupt

SEGMENT_BYTES = 16 << 10
BODY = b"x" * 300


def _damaged_store(tmp_path: Path, past: int = 0) -> tuple[Path, int]:
    """A store whose active segment a power cut left with damage before whole frames
    past byte `past` (the first seed that does: most do), and how many events were
    appended."""
    for seed in range(20):
        path = tmp_path / f"s{seed}"
        with Journal.open(path, segment_bytes=SEGMENT_BYTES) as journal:
            journal.create_session("a")
        disk = SimulatedDisk(str(path), random.Random(seed))
        disk.settle()
        journal = Journal.open(path, durability="os", file_ops=disk, segment_bytes=SEGMENT_BYTES)
        count = random.Random(seed).randrange(5, 60)
        for i in range(count):
            journal.append("a", [EventIn("m", BODY + str(i).encode())])
        disk.power_cut()
        with contextlib.suppress(Exception):  # (the disk is gone: whatever close meets)
            journal.close()
        try:
            with Journal.open(path) as reopened:
                list(reopened.replay("a"))
        except JournalCorrupt as e:
            if e.offset > past:
                return path, count
    raise AssertionError("no seed left damage before whole frames")


def _events(path: Path) -> list[bytes]:
    with Journal.open(path) as journal:
        return [event.data for event in journal.replay("a")]


def test_open_refuses_and_names_the_way_out(tmp_path: Path) -> None:
    path, _ = _damaged_store(tmp_path)
    with pytest.raises(JournalCorrupt) as raised:
        Journal.open(path)
    message = str(raised.value)
    assert "00000000000000000001.seg" in message
    assert "verify(fix=True)" in message and "cut-tails" in message
    assert 'durability "os"' in message
    with pytest.raises(JournalCorrupt, match="repair=True"):
        Journal.open(path, readonly=True)
    assert not (path / "cut-tails").exists()  # (nothing was cut)


def test_a_repair_open_takes_no_write_before_the_fix(tmp_path: Path) -> None:
    path, _ = _damaged_store(tmp_path)
    with pytest.raises(InvalidArgument, match="readonly"):
        Journal.open(path, readonly=True, repair=True)
    with Journal.open(path, repair=True) as journal:
        with pytest.raises(JournalCorrupt, match="cut-tails"):
            journal.append("a", [EventIn("m", b"refused")])
        assert not journal.verify().ok
    assert not (path / "cut-tails").exists()
    with pytest.raises(JournalCorrupt):
        Journal.open(path)


def test_verify_fix_cuts_at_the_damage_keeping_a_copy(tmp_path: Path) -> None:
    # (Past the first event's frame, which ends at byte 110: events before the damage.)
    path, count = _damaged_store(tmp_path, past=110)
    segment = path / "segments" / "00000000000000000001.seg"
    before = segment.read_bytes()
    with Journal.open(path, repair=True) as journal:
        report = journal.verify(fix=True)
    assert report.fixed and report.ok
    cut = report.problems[0]
    assert cut.segment == "00000000000000000001.seg"
    assert 'durability "os"' in cut.what and "cut-tails" in cut.what
    assert "whole frame" in cut.what
    # (The "os" writer marked the segment before its first frame there: a segment only
    # "fsync" writers wrote is not cut unasked, tests/test_durable_damage.py.)
    assert (path / "segments" / "00000000000000000001.os").exists()
    copies = list((path / "cut-tails").iterdir())
    assert len(copies) == 1
    kept = copies[0].read_bytes()
    assert copies[0].name == f"00000000000000000001.seg-{cut.offset}.tail"
    assert before[cut.offset : cut.offset + len(kept)] == kept
    assert not before[cut.offset + len(kept) :].strip(b"\0")
    # Every event before the damage is there, in order; those after it are in the copy.
    events = _events(path)
    assert events == [BODY + str(i).encode() for i in range(len(events))]
    assert 0 < len(events) < count
    for i in range(len(events) + 1, count):
        if BODY + str(i).encode() in kept:
            break
    else:
        raise AssertionError("no event after the damage is in the copy")
    with Journal.open(path) as journal:
        journal.append("a", [EventIn("m", b"after")])
        assert journal.verify().ok
    assert _events(path)[-1] == b"after"


def test_cli_verify_fix(tmp_path: Path) -> None:
    path, _ = _damaged_store(tmp_path)
    runner = CliRunner()
    refused = runner.invoke(main, ["--store", str(path), "verify"])
    assert refused.exit_code != 0
    assert "journal --store" in refused.output and "verify --fix" in refused.output
    assert "Journal." not in refused.output and "repair=True" not in refused.output
    fixed = runner.invoke(main, ["--store", str(path), "--format", "json", "verify", "--fix"])
    assert fixed.exit_code == 0, fixed.output
    lines = [json.loads(line) for line in fixed.output.splitlines() if line.startswith("{")]
    assert lines[-1]["fixed"] is True and lines[-1]["ok"] is True
    assert any('durability "os"' in line.get("problem", "") for line in lines)
    again = runner.invoke(main, ["--store", str(path), "verify"])
    assert again.exit_code == 0, again.output
    assert os.listdir(path / "cut-tails")


def test_a_view_that_ends_before_the_damage(tmp_path: Path) -> None:
    # The view of this boot ends where the damage begins (the writer's catch-up, not a
    # rebuild, meets it): the same refusal, and the same cut.
    path, _ = _damaged_store(tmp_path, past=110)
    segment = path / "segments" / "00000000000000000001.seg"
    full = segment.read_bytes()
    with pytest.raises(JournalCorrupt) as raised:
        Journal.open(path)
    offset = raised.value.offset
    segment.write_bytes(full[:offset])
    before = _events(path)
    assert before
    segment.write_bytes(full)
    with pytest.raises(JournalCorrupt, match="cut-tails"):
        Journal.open(path)
    with Journal.open(path, repair=True) as journal:
        assert [event.data for event in journal.replay("a")] == before
        report = journal.verify(fix=True)
    assert report.fixed and report.problems[0].offset == offset
    assert _events(path) == before
    assert (path / "cut-tails" / f"00000000000000000001.seg-{offset}.tail").exists()
