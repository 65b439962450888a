"""Writers of one store with different durabilities, and what a power cut leaves (SPEC
7.1, 14.4 "Power cuts").

A writer with durability "os" leaves its frames in the page cache; a writer with
durability "fsync" that appends after them syncs only its own frame's range (RWF_DSYNC).
A power cut then left zeros before an append acknowledged as durable, and the store read
as corrupt (`JournalCorrupt`, "zero"). An "fsync" writer's catch-up that finds its writer
not at the head syncs the segment the head is in before its commit builds on it. The
simulated disk (`tests/_disk.py`) tracks what is synced; the sync calls are counted
through the engine's `FileOps` seam, to show what the single-writer path pays (nothing).
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _disk import SimulatedDisk

from journal import EventIn, Journal, StoreUnavailable, WriteOutcomeUnknown
from journal._local.files import FileOps


def _after_the_power_cut(path: Path, expected: list[bytes]) -> None:
    with Journal.open(path) as j:
        assert [e.data for e in j.replay("a")] == expected
        assert j.verify().problems == []


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("view", ["kept", "deleted"])
def test_an_fsync_append_after_os_appends_survives_a_power_cut(
    tmp_path: Path, seed: int, view: str
) -> None:
    """Journals take turns: "os", then the default "fsync" (a runtime opened for speed,
    then a CLI), across rotations (small segments). Every append acknowledged with
    "fsync" is there after the power cut, and so is everything before it; with `index/`
    deleted before the "fsync" writer opens, its rebuild makes the same promise."""
    path = tmp_path / "s"
    disk = SimulatedDisk(str(path), random.Random(seed))
    with Journal.open(path, create=True, file_ops=disk, segment_bytes=4096) as j:
        j.append("a", [EventIn("m", b"before")], create=True)
    disk.settle()
    expected = [b"before"]
    for turn in range(3):
        with Journal.open(path, file_ops=disk, durability="os", segment_bytes=4096) as j:
            for i in range(4 + turn * 6):
                data = f"os {turn} {i} ".encode() * 40
                j.append("a", [EventIn("m", data)])
                expected.append(data)
        if view == "deleted" and turn == 2:
            shutil.rmtree(path / "index")
        with Journal.open(path, file_ops=disk, segment_bytes=4096) as j:
            data = f"fsync {turn}".encode()
            j.append("a", [EventIn("m", data)])
            expected.append(data)
    disk.power_cut()
    _after_the_power_cut(path, expected)


class CountingSyncs(FileOps):
    """Counts the syncs of segment files and directories made through the seam."""

    def __init__(self) -> None:
        self.synced_writes = 0
        self.syncs = 0
        self.writes = 0

    def pwrite(self, fd: int, data: bytes | bytearray, offset: int) -> int:
        self.writes += 1
        return super().pwrite(fd, data, offset)

    def pwrite_synced(self, fd: int, data: bytes | bytearray, offset: int) -> int:
        self.synced_writes += 1
        return super().pwrite_synced(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self.syncs += 1
        super().fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self.syncs += 1
        super().fdatasync(fd)


def test_a_single_writer_appending_makes_one_synced_write_per_commit_and_no_other_sync(
    tmp_path: Path,
) -> None:
    """The sync of frames others wrote is paid only when writers alternate (and at a
    writer's first commit): a journal appending alone makes one synced write per append
    and no other sync call."""
    ops = CountingSyncs()
    with Journal.open(tmp_path / "s", create=True, file_ops=ops) as j:
        j.append("a", [EventIn("m", b"first")], create=True)
    with Journal.open(tmp_path / "s", file_ops=ops) as j:
        j.append("a", [EventIn("m", b"opened")])
        before = (ops.synced_writes, ops.syncs)
        for i in range(50):
            j.append("a", [EventIn("m", b"%d" % i)])
        assert (ops.synced_writes - before[0], ops.syncs - before[1]) == (50, 0)


def test_a_rebuild_after_a_reboot_writes_nothing_again_and_one_after_a_deletion_does(
    tmp_path: Path,
) -> None:
    """A view discarded after a reboot is rebuilt from what the disk holds (the page cache
    is gone): nothing is written again. A view deleted (or damaged) in the same boot may
    be rebuilt from frames only the page cache holds: the active segment's frames are
    written again and synced. (A reboot is a view-boot marker of another boot.)"""
    path = tmp_path / "s"
    with Journal.open(path, create=True) as j:
        for i in range(20):
            j.append("a", [EventIn("m", b"x" * 100)], create=i == 0)
    (path / "view-boot").write_bytes(b"another-boot")
    rebooted = CountingSyncs()
    with Journal.open(path, file_ops=rebooted) as j:
        assert len(list(j.replay("a"))) == 20
    assert rebooted.writes == 0
    shutil.rmtree(path / "index")
    deleted = CountingSyncs()
    with Journal.open(path, file_ops=deleted) as j:
        assert len(list(j.replay("a"))) == 20
    assert deleted.writes > 0 and deleted.syncs > 0


class RefusingOnce(CountingSyncs):
    """`CountingSyncs` whose view commit fails once with EIO when armed (after the
    frame's synced write: the batch is refused, its frame cut off again)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.fdatasyncs = 0

    def fdatasync(self, fd: int) -> None:
        self.fdatasyncs += 1
        super().fdatasync(fd)

    def point(self, name: str, detail: object = None) -> None:
        if name == "commit.view_commit" and self.armed:
            self.armed = False
            raise OSError(errno.EIO, os.strerror(errno.EIO))


_OS_WRITER = """
import sys
from journal import EventIn, Journal
with Journal.open(sys.argv[1], durability="os") as j:
    j.append("a", [EventIn("m", b"same")])
"""


def test_a_refused_frame_leaves_no_claim_that_the_log_is_on_disk_past_the_head(
    tmp_path: Path,
) -> None:
    """A batch whose synced write succeeded and whose view commit failed is cut off
    again. An "os" writer of another process then commits a frame of the same size in
    its place (the same event): the log ends where the refused frame ended, with the
    same next position, but the bytes there are the "os" writer's, not synced. The
    "fsync" writer's next commit syncs them before building on them (until 2026-12-06
    it took that end for the one its own synced write had reached, and made no sync: a
    power cut could leave zeros before its acknowledged append)."""
    path = tmp_path / "s"
    ops = RefusingOnce()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    with Journal.open(path, create=True, file_ops=ops) as j:
        j.append("a", [EventIn("m", b"first")], create=True)
        ops.armed = True
        with pytest.raises(StoreUnavailable):
            j.append("a", [EventIn("m", b"same")])
        subprocess.run([sys.executable, "-c", _OS_WRITER, str(path)], env=env, check=True)
        before = (ops.synced_writes, ops.fdatasyncs)
        j.append("a", [EventIn("m", b"after")])
        # (One synced write, one sync of the segment: not counting the directory's.)
        assert (ops.synced_writes - before[0], ops.fdatasyncs - before[1]) == (1, 1)
        assert [e.data for e in j.replay("a")] == [b"first", b"same", b"after"]


_OS_APPENDER = """
import sys
from journal import EventIn, Journal
with Journal.open(sys.argv[1], durability="os") as j:
    j.append("a", [EventIn("m", b"os after the refused frame")])
"""


def test_an_fsync_append_after_its_own_refused_frame_an_os_writer_indexed_survives(
    tmp_path: Path,
) -> None:
    """An "fsync" writer's synced write fails (its pages clean, not on disk) and so does
    the cut that would take the frame off (WriteOutcomeUnknown). An "os" writer of another
    process indexes the frame (as committed) without writing it again, and appends after
    it. The "fsync" writer knows its sync failed: its next commit, which builds on that
    frame, must write it again before it is acknowledged, or a power cut leaves zeros
    before the acknowledged append."""
    path = tmp_path / "s"
    disk = SimulatedDisk(str(path), random.Random(3))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    with Journal.open(path, create=True, file_ops=disk) as j:
        j.append("a", [EventIn("m", b"first")], create=True)
        disk.settle()
        disk.fail("fdatasync", errno.EIO)
        disk.fail("ftruncate", errno.EIO)
        with pytest.raises(WriteOutcomeUnknown):
            j.append("a", [EventIn("m", b"refused")])
        subprocess.run([sys.executable, "-c", _OS_APPENDER, str(path)], env=env, check=True)
        j.append("a", [EventIn("m", b"acknowledged")])
    disk.power_cut()
    with Journal.open(path) as j:
        found = [e.data for e in j.replay("a")]
        assert found[0] == b"first" and found[-1] == b"acknowledged", found
        assert j.verify().problems == []
