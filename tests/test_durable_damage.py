"""Damage before whole frames in an active segment that no "os" writer wrote (SPEC 3.3,
"Who wrote the active segment"; 9, "Cutting at damage").

A writer with durability "os" makes its segment's mark (`segments/<base>.os`) durable
before its first frame there, so a power cut never leaves one of its frames on disk
without the mark. A segment without the mark was written by "fsync" writers only: its
frames were synced as they were committed, so damage with whole frames after it is the
disk's, found after a reboot, and those frames were acknowledged and durable.
`verify(fix=True)` refuses to cut them (it cuts an "os" or mixed segment as before) and
says what happened and what to do; `repair="cut-durable"` (`journal verify --fix
--cut-durable`) cuts them all the same, keeping a copy.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _disk import SimulatedDisk
from _shared_disk import SharedDisk
from click.testing import CliRunner

from cli.main import main
from journal import (
    EventIn,
    InvalidArgument,
    Journal,
    JournalCorrupt,
    RetentionPolicy,
    StoreUnavailable,
)
from journal._local.files import FileOps

SEGMENT_BYTES = 16 << 10
BODY = b"x" * 300
SEGMENT = "00000000000000000001.seg"
MARK = "00000000000000000001.os"
ROOT = Path(__file__).resolve().parent.parent
WRITERS = Path(__file__).resolve().parent / "_procs_writers.py"
START_S = 60.0  # interpreter start and journal import on a loaded 2-core machine


def _fsync_store_with_media_damage(tmp_path: Path, events: int = 10) -> Path:
    """A store written by a "fsync" writer alone, through the simulated disk, after a
    power cut (the view dropped, as a reboot discards it), with a flipped byte in its
    sixth event's frame: damage with whole frames after it, not made by the power cut."""
    path = tmp_path / "s"
    with Journal.open(path, segment_bytes=SEGMENT_BYTES) as journal:
        journal.create_session("a")
    disk = SimulatedDisk(str(path), random.Random(1))
    disk.settle()
    with Journal.open(path, file_ops=disk, segment_bytes=SEGMENT_BYTES) as journal:
        for i in range(events):
            journal.append("a", [EventIn("m", BODY + str(i).encode())])
    disk.power_cut()  # (after the close: every frame was synced as it was committed)
    segment = path / "segments" / SEGMENT
    data = bytearray(segment.read_bytes())
    data[data.index(BODY + b"5")] ^= 0xFF
    segment.write_bytes(bytes(data))
    assert not (path / "index").exists()
    return path


def _events(path: Path) -> list[bytes]:
    with Journal.open(path) as journal:
        return [event.data for event in journal.replay("a")]


def test_the_fix_refuses_to_cut_frames_only_fsync_writers_wrote(tmp_path: Path) -> None:
    path = _fsync_store_with_media_damage(tmp_path)
    segment = path / "segments" / SEGMENT
    before = segment.read_bytes()
    assert not (path / "segments" / MARK).exists()
    with pytest.raises(JournalCorrupt) as opened:
        Journal.open(path)
    message = str(opened.value)
    assert SEGMENT in message and 'durability "fsync"' in message
    assert "damage to the disk" in message and "backup" in message
    assert "--cut-durable" in message and 'repair="cut-durable"' in message
    with Journal.open(path, repair=True) as journal:
        with pytest.raises(JournalCorrupt) as refused:
            journal.verify(fix=True)
        assert not journal.verify().ok
    message = str(refused.value)
    assert refused.value.segment == SEGMENT and refused.value.offset == opened.value.offset
    assert "acknowledged and durable" in message and "damage to the disk" in message
    assert "4 whole frame(s)" in message and "nothing was cut" in message
    assert "restore the segment from a backup" in message and "--cut-durable" in message
    # Nothing was cut, and nothing was kept.
    assert segment.read_bytes() == before
    assert not (path / "cut-tails").exists()
    with pytest.raises(JournalCorrupt):
        Journal.open(path)


def test_cut_durable_cuts_them_keeping_a_copy(tmp_path: Path) -> None:
    path = _fsync_store_with_media_damage(tmp_path)
    segment = path / "segments" / SEGMENT
    before = segment.read_bytes()
    with pytest.raises(InvalidArgument, match="cut-durable"):
        Journal.open(path, repair="durable")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="readonly"):
        Journal.open(path, readonly=True, repair="cut-durable")
    with Journal.open(path, repair="cut-durable") as journal:
        report = journal.verify(fix=True)
    assert report.fixed and report.ok
    cut = report.problems[0]
    assert cut.segment == SEGMENT and "4 whole frame(s)" in cut.what
    assert "acknowledged and durable" in cut.what and 'repair="cut-durable"' in cut.what
    (copy,) = (path / "cut-tails").iterdir()
    assert before[cut.offset : cut.offset + copy.stat().st_size] == copy.read_bytes()
    assert BODY + b"9" in copy.read_bytes()
    assert _events(path) == [BODY + str(i).encode() for i in range(5)]


def test_a_mark_lost_with_an_older_version_s_os_store_is_refused_too(tmp_path: Path) -> None:
    # A store written with "os" by a version that left no mark reads as one only "fsync"
    # writers wrote: refused (nothing acknowledged is cut unasked); "cut-durable" cuts.
    from test_os_power_cut_fix import _damaged_store

    path, _ = _damaged_store(tmp_path)
    os.unlink(path / "segments" / MARK)
    with (
        Journal.open(path, repair=True) as journal,
        pytest.raises(JournalCorrupt, match="before 2026-12-07"),
    ):
        journal.verify(fix=True)
    assert not (path / "cut-tails").exists()
    with Journal.open(path, repair="cut-durable") as journal:
        assert journal.verify(fix=True).fixed
    with Journal.open(path) as journal:
        assert journal.verify().ok


def test_cli_verify_fix_refuses_and_cut_durable_cuts(tmp_path: Path) -> None:
    path = _fsync_store_with_media_damage(tmp_path)
    runner = CliRunner()
    alone = runner.invoke(main, ["--store", str(path), "verify", "--cut-durable"])
    assert alone.exit_code == 2 and "--fix" in alone.output
    refused = runner.invoke(main, ["--store", str(path), "verify", "--fix"])
    assert refused.exit_code == 7, refused.output
    assert "damage to the disk" in refused.output and "backup" in refused.output
    assert f"journal --store {path} verify --fix --cut-durable" in refused.output
    assert "Journal." not in refused.output and "repair=" not in refused.output
    assert not (path / "cut-tails").exists()
    fixed = runner.invoke(main, ["--store", str(path), "verify", "--fix", "--cut-durable"])
    assert fixed.exit_code == 0, fixed.output
    assert "(repaired)" in fixed.output and "acknowledged and durable" in fixed.output
    again = runner.invoke(main, ["--store", str(path), "verify"])
    assert again.exit_code == 0, again.output
    helped = runner.invoke(main, ["verify", "--help"])
    assert "--cut-durable" in helped.output


class _Counting(FileOps):
    """The real file operations, counting the marks made."""

    def __init__(self) -> None:
        self.marks: list[str] = []

    def point(self, name: str, detail: object = None) -> None:
        if name == "segments.mark_os":
            self.marks.append(os.path.basename(str(detail)))


def test_an_os_writer_marks_each_segment_once_and_fsync_writers_never(tmp_path: Path) -> None:
    path = tmp_path / "s"
    ops = _Counting()
    with Journal.open(path, segment_bytes=SEGMENT_BYTES, file_ops=ops) as journal:
        journal.create_session("a")
        for i in range(60):
            journal.append("a", [EventIn("m", BODY + str(i).encode())])
    assert ops.marks == []
    assert not [name for name in os.listdir(path / "segments") if name.endswith(".os")]
    with Journal.open(path, durability="os", segment_bytes=SEGMENT_BYTES, file_ops=ops) as journal:
        for i in range(100):
            journal.append("a", [EventIn("m", BODY + str(i).encode())])
        segments = sorted(n for n in os.listdir(path / "segments") if n.endswith(".seg"))
    # One mark per segment it wrote (the one it found, and each one it started), made
    # before its first frame there; no commit after that makes one again.
    assert len(segments) > 3
    written = [name.replace(".seg", ".os") for name in segments[-len(ops.marks) :]]
    assert ops.marks == written and len(set(ops.marks)) == len(ops.marks)
    for name in written:
        assert (path / "segments" / name).exists()
    with Journal.open(path, durability="os", segment_bytes=SEGMENT_BYTES, file_ops=ops) as journal:
        journal.append("a", [EventIn("m", b"again")])
        journal.append("a", [EventIn("m", b"and again")])
    assert ops.marks[-1] == written[-1] and len(ops.marks) == len(written) + 1


def test_marks_go_with_their_segments(tmp_path: Path) -> None:
    path = tmp_path / "s"
    evict = RetentionPolicy(session_retention_ms=1)
    with Journal.open(path, durability="os", segment_bytes=4096, retention=evict) as journal:
        journal.create_session("gone")
        for _ in range(8):
            journal.append("gone", [EventIn("m", b"g" * 1500)])
        ended = journal.resolve_session("gone").ended_at_ms
        assert ended is not None
        journal.append("kept", [EventIn("m", b"k")], create=True)
        assert MARK in os.listdir(path / "segments")
        report = journal.apply_retention(now_ms=ended + 10)
        assert SEGMENT in report.deleted_segments
    names = os.listdir(path / "segments")
    assert MARK not in names and SEGMENT not in names  # (deleted with its segment)
    assert [n for n in names if n.endswith(".os")]  # (the live segments' stay)
    stray = path / "segments" / "00000000000000000002.os"  # (a pass stopped midway)
    stray.touch()
    with Journal.open(path):
        pass
    assert not stray.exists()
    with Journal.open(path) as journal:
        assert journal.verify().ok


def test_a_power_cut_never_keeps_an_os_frame_without_its_mark(tmp_path: Path) -> None:
    # The power goes at every file operation of an "os" writer in turn (one that starts
    # segments as it goes): whatever of its frames reached the disk, their segment's
    # mark did first. (A frame's bytes: its events' payloads.)
    template = tmp_path / "template"
    with Journal.open(template, segment_bytes=SEGMENT_BYTES) as journal:
        journal.create_session("a")
    payloads = [b"os-frame-" + bytes([65 + i]) * 6000 for i in range(6)]

    def run(path: Path, cut_at: int | None) -> int:
        disk = SimulatedDisk(str(path), random.Random(cut_at))
        disk.settle()
        disk.cut_at = cut_at
        journal = None
        with contextlib.suppress(OSError, StoreUnavailable, JournalCorrupt):
            journal = Journal.open(
                path, durability="os", file_ops=disk, segment_bytes=SEGMENT_BYTES
            )
            for payload in payloads:
                journal.append("a", [EventIn("m", payload)])
        calls = disk.calls
        disk.power_cut()
        if journal is not None:
            with contextlib.suppress(Exception):
                journal.close()
        return calls

    total = run(shutil.copytree(template, tmp_path / "all"), None)
    found = 0
    for cut_at in range(1, total + 1):
        path = shutil.copytree(template, tmp_path / f"cut{cut_at}")
        run(path, cut_at)
        for name in os.listdir(path / "segments"):
            if not name.endswith(".seg"):
                continue
            if b"os-frame-" in (path / "segments" / name).read_bytes():
                found += 1
                mark = path / "segments" / name.replace(".seg", ".os")
                assert mark.exists(), (cut_at, name)
        shutil.rmtree(path)
    assert found  # (some cuts kept frames)


def _child(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, str(WRITERS), *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


@pytest.mark.parametrize("seed", [1, 2])
def test_writer_processes_of_both_durabilities_and_a_power_cut(tmp_path: Path, seed: int) -> None:
    # An "fsync" and an "os" writer process append to one store on the shared simulated
    # disk; the power goes, and both are killed. Every segment that holds a byte of the
    # "os" writer's frames has its mark; damage before whole frames (the "os" writer's
    # lost pages) is a mixed segment's, which `repair=True` and the fix cut as before.
    path = tmp_path / "s"
    with Journal.open(path, segment_bytes=SEGMENT_BYTES) as journal:
        journal.create_session("shared")
    state = str(tmp_path / "disk")
    disk = SharedDisk(str(path), state, random.Random(seed))
    disk.settle()
    children = [
        _child("append", str(path), tag, str(seed), durability, state, "0", "shared")
        for tag, durability in (("fsw", "fsync"), ("osw", "os"))
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n"
        for child in children:  # (each acknowledged a few appends)
            assert child.stdout is not None
            for _ in range(5):
                assert child.stdout.readline().startswith("ack ")
        time.sleep(random.Random(seed).uniform(0.1, 0.5))
        disk.power_off()
    finally:
        for child in children:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(START_S)
    disk.power_cut()
    disk.power_on()
    marked = 0
    for name in os.listdir(path / "segments"):
        if name.endswith(".seg") and b"osw:" in (path / "segments" / name).read_bytes():
            assert (path / "segments" / name.replace(".seg", ".os")).exists(), name
            marked += 1
    assert marked
    try:
        Journal.open(path).close()
    except JournalCorrupt:
        with Journal.open(path, repair=True) as journal:
            assert journal.verify(fix=True).fixed
        with Journal.open(path) as journal:
            assert journal.verify().ok
