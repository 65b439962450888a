"""Bytes a writer cuts off after the active segment's last whole frame are kept first
(SPEC 3.3, `cut-tails/`): without a view that knew it committed, a last frame damaged on
disk looks like a write a crash interrupted, and was cut with nothing left of it."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _cli_runs import run_cli

from journal import EventIn, Journal, JournalCorrupt, StoreUnavailable
from journal._local.cut_tails import CUT_TAILS_DIRECTORY, cut_tail_end
from journal._local.files import FileOps
from journal._local.frames import MAX_BLOCK_BYTES, segment_name
from journal._local.segments import SegmentReader

ROOT = Path(__file__).resolve().parent.parent
SEGMENT = segment_name(1)


def store_with_events(store: Path, count: int = 3) -> tuple[int, bytes]:
    """A store whose session "s" holds `count` events, one frame each; returns where its
    last frame starts and the segment's bytes up to its end."""
    with Journal.open(store) as j:
        j.create_session("s")
        for i in range(count):
            j.append("s", [EventIn("m", bytes([0x41 + i]) * 100)])
    with SegmentReader(str(store / "segments"), 1) as reader:
        last = [info for info, _ in reader.frames(tail=True)][-1]
    data = (store / "segments" / SEGMENT).read_bytes()[: last.end_offset]
    return last.offset, data


def rot_last_frame(store: Path) -> tuple[int, bytes]:
    """Damage the last frame's body on disk and lose the view (`index/`): the log alone
    cannot tell it from a torn write. Returns its offset and its bytes as damaged."""
    offset, data = store_with_events(store)
    damaged = bytearray(data[offset:])
    damaged[-10:-6] = b"\xff\xff\xff\xff"
    with open(store / "segments" / SEGMENT, "r+b") as f:
        f.seek(offset)
        f.write(damaged)
    shutil.rmtree(store / "index")
    return offset, bytes(damaged)


def kept(store: Path) -> dict[str, bytes]:
    directory = store / CUT_TAILS_DIRECTORY
    if not directory.exists():
        return {}
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_a_damaged_last_frame_cut_without_the_view_is_kept_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The trial that found it damaged the only frame of a store and deleted `index/`: the
    # next open cut the frame off (an acknowledged event), saying nothing, keeping nothing.
    store = tmp_path / "store"
    offset, damaged = rot_last_frame(store)
    with caplog.at_level("WARNING", logger="journal"), Journal.open(store) as j:
        assert [e.data for e in j.replay("s")] == [b"A" * 100, b"B" * 100]
        assert j.append("s", [EventIn("m", b"after")]).first_ordinal == 3
    name = f"{SEGMENT}-{offset}.tail"
    assert kept(store) == {name: damaged}  # exactly the cut bytes, no zeros
    path = store / CUT_TAILS_DIRECTORY / name
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)  # the store's file mode
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert str(path) in warning and f"offset {offset}" in warning
    assert f"cut off {len(damaged)} bytes" in warning
    caplog.clear()
    with caplog.at_level("WARNING", logger="journal"), Journal.open(store) as j:
        assert [e.data for e in j.replay("s")][-1] == b"after"
    assert kept(store) == {name: damaged}  # (nothing more to cut: no second copy)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


# Appends until the frame holding b"torn" is written: half of it reaches the file, the
# process dies (SIGKILL) before its sync returns. Prints the half written, as hex.
_TORN_WRITE = textwrap.dedent(
    """
    import os, signal, sys
    from journal import EventIn, Journal
    from journal._local.files import FileOps

    class DiesMidWrite(FileOps):
        def pwrite_synced(self, fd, data, offset):
            if b"torn" * 50 in bytes(data):
                half = bytes(data[: len(data) // 2])
                os.pwrite(fd, half, offset)
                print(half.hex(), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return super().pwrite_synced(fd, data, offset)

    with Journal.open(sys.argv[1], file_ops=DiesMidWrite()) as j:
        j.append("s", [EventIn("m", b"kept" * 50)], create=True)
        j.append("s", [EventIn("m", b"torn" * 50)])
    """
)


def killed_mid_write(store: Path) -> bytes:
    """A writer of `store` killed halfway through its second frame's write (before its
    view commit); returns the half it wrote."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    child = subprocess.run(
        [sys.executable, "-c", _TORN_WRITE, str(store)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    return bytes.fromhex(child.stdout.strip())


@pytest.mark.parametrize("view", ["deleted", "current"])
def test_a_torn_write_of_a_killed_writer_is_kept_only_when_the_view_was_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, view: str
) -> None:
    """With the view the killed writer left, its head says where commits end: the torn
    bytes past it never committed and are cut without a copy (a copy at every crash piled
    up, and a full disk then stopped every writer). Without it, the log alone cannot tell
    them from a damaged committed frame: a copy is kept first."""
    store = tmp_path / "store"
    half = killed_mid_write(store)
    with SegmentReader(str(store / "segments"), 1) as reader:
        end = [info for info, _ in reader.frames(tail=True)][-1].end_offset
    assert (store / "segments" / SEGMENT).read_bytes()[end : end + len(half)] == half
    if view == "deleted":
        shutil.rmtree(store / "index")
    with caplog.at_level("WARNING", logger="journal"), Journal.open(store) as j:
        assert [e.data for e in j.replay("s")] == [b"kept" * 50]
        assert j.append("s", [EventIn("m", b"next")]).first_ordinal == 2
    warned = any(CUT_TAILS_DIRECTORY in r.getMessage() for r in caplog.records)
    if view == "deleted":
        assert kept(store) == {f"{SEGMENT}-{end}.tail": half.rstrip(b"\0")}
        assert warned
    else:
        assert kept(store) == {} and not warned
    with Journal.open(store) as j:
        assert [e.data for e in j.replay("s")] == [b"kept" * 50, b"next"]
    assert len(kept(store)) == (1 if view == "deleted" else 0)


class NoRoomForTheCopy(FileOps):
    """The disk is full when the cut bytes are to be kept: at the named point, or when
    the copy, written and synced, is renamed into place."""

    def __init__(self, where: str) -> None:
        self.where = where

    def point(self, name: str, detail: object = None) -> None:
        if self.where == "point" and name == "segments.keep_tail":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def rename(self, source: str, destination: str) -> None:
        if self.where == "rename" and CUT_TAILS_DIRECTORY in destination:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), source)
        super().rename(source, destination)


@pytest.mark.parametrize("where", ["point", "rename"])
def test_a_copy_that_cannot_be_kept_fails_the_open_and_cuts_nothing(
    tmp_path: Path, where: str
) -> None:
    store = tmp_path / "store"
    offset, damaged = rot_last_frame(store)
    segment = store / "segments" / SEGMENT
    before = segment.read_bytes()
    with pytest.raises(StoreUnavailable) as caught:
        Journal.open(store, file_ops=NoRoomForTheCopy(where))
    message = str(caught.value)
    assert caught.value.errno == errno.ENOSPC
    assert "nothing was cut" in message and f"offset {offset}" in message
    assert "free space" in message and "retry" in message
    assert segment.read_bytes() == before
    assert kept(store) == {}  # (and no temporary copy left behind)
    with Journal.open(store) as j:  # room again: kept, then cut
        assert [e.data for e in j.replay("s")] == [b"A" * 100, b"B" * 100]
    assert kept(store) == {f"{SEGMENT}-{offset}.tail": damaged}


class CutFailsOnce(FileOps):
    """The copy is kept, and the cut after it fails (once)."""

    def __init__(self) -> None:
        self.kept = False
        self.failed = False

    def point(self, name: str, detail: object = None) -> None:
        self.kept = self.kept or name == "segments.keep_tail"

    def ftruncate(self, fd: int, length: int) -> None:
        if self.kept and not self.failed:
            self.failed = True
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().ftruncate(fd, length)


def test_a_cut_that_failed_after_its_copy_keeps_one_copy(tmp_path: Path) -> None:
    store = tmp_path / "store"
    offset, damaged = rot_last_frame(store)
    ops = CutFailsOnce()
    with pytest.raises(StoreUnavailable):
        Journal.open(store, file_ops=ops)
    assert ops.failed
    with Journal.open(store) as j:
        assert len(list(j.replay("s"))) == 2
    assert kept(store) == {f"{SEGMENT}-{offset}.tail": damaged}


def test_a_second_cut_at_the_same_offset_keeps_both_copies(tmp_path: Path) -> None:
    store = tmp_path / "store"
    offset, first = rot_last_frame(store)
    Journal.open(store).close()
    with open(store / "segments" / SEGMENT, "r+b") as f:
        f.seek(offset)
        f.write(b"SJFR" + b"\x07" * 40)  # another crash, another torn write there
    shutil.rmtree(store / "index")
    Journal.open(store).close()
    assert kept(store) == {
        f"{SEGMENT}-{offset}.tail": first,
        f"{SEGMENT}-{offset}-2.tail": b"SJFR" + b"\x07" * 40,
    }


def test_bytes_further_than_one_frame_after_the_last_are_no_torn_write(tmp_path: Path) -> None:
    # One frame is written at a time: a torn write is at most one frame, then zeros.
    path = tmp_path / "sparse"
    with open(path, "wb") as f:
        f.write(b"x")
        f.seek(MAX_BLOCK_BYTES - 1)
        f.write(b"yz")  # (a hole between: a sparse file)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        assert cut_tail_end(fd, SEGMENT, 0, size - 1, FileOps()) == MAX_BLOCK_BYTES
        with pytest.raises(JournalCorrupt, match="nothing was cut"):
            cut_tail_end(fd, SEGMENT, 0, size, FileOps())
    finally:
        os.close(fd)


def test_journal_verify_notes_the_cut_tails_the_store_keeps(tmp_path: Path) -> None:
    # The copies are the operator's: `journal verify` says they are there (a store whose
    # damaged last frame was cut after a rebuild otherwise verifies as sound).
    store = tmp_path / "store"
    store_with_events(store)
    done = run_cli(store, "--format", "json", "verify")
    assert done.returncode == 0, done.stderr
    assert "cut_tails" not in json.loads(done.stdout.splitlines()[-1])
    rot_last_frame(tmp_path / "rotted")
    Journal.open(tmp_path / "rotted").close()
    done = run_cli(tmp_path / "rotted", "--format", "json", "verify")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["cut_tails"] == 1
    done = run_cli(tmp_path / "rotted", "verify")
    assert done.returncode == 0, done.stderr
    note = done.stdout.splitlines()[-1]
    assert note.startswith("note: 1 cut tail kept in ")
    assert str(tmp_path / "rotted" / CUT_TAILS_DIRECTORY) in note


class DiskFullWhile(FileOps):
    """ENOSPC at `segments.keep_tail` while `full` is set."""

    def __init__(self) -> None:
        self.full = False

    def point(self, name: str, detail: object = None) -> None:
        if self.full and name == "segments.keep_tail":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_torn_write_met_by_a_commit_is_cut_without_a_copy_even_on_a_full_disk(
    tmp_path: Path,
) -> None:
    """A writer killed mid-write while another process's journal is open: that journal's
    next commit catches up and cuts the torn frame (SPEC 7.1, step 2). Its view recorded
    where commits end, so no copy is kept, and a full disk does not stop the commit (it
    did while every cut kept a copy: StoreUnavailable until space was freed)."""
    store = tmp_path / "store"
    ops = DiskFullWhile()
    with Journal.open(store, file_ops=ops) as j:
        j.create_session("other")
        half = killed_mid_write(store)
        segment = store / "segments" / SEGMENT
        assert half in segment.read_bytes()
        ops.full = True
        assert j.append("other", [EventIn("m", b"x")]).first_ordinal == 1
        assert half not in segment.read_bytes() and kept(store) == {}
        assert [e.data for e in j.replay("s")] == [b"kept" * 50]
    assert kept(store) == {}


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


class DirectorySyncs(FileOps):
    """Records the syncs of directories and the cuts of segments, in order; fails the
    first sync of the directory `fail` (an EIO, or a writer killed before it) when set."""

    def __init__(self, fail: Path | None = None) -> None:
        self.fail = fail
        self.events: list[tuple[str, str]] = []

    def fsync(self, fd: int) -> None:
        path = _fd_path(fd)
        if self.fail is not None and path == str(self.fail) and os.path.isdir(path):
            self.fail = None
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        super().fsync(fd)
        self.events.append(("fsync", path))

    def ftruncate(self, fd: int, length: int) -> None:
        self.events.append(("ftruncate", _fd_path(fd)))
        super().ftruncate(fd, length)


@pytest.mark.parametrize("directory", ["cut-tails", "store"])
def test_a_copy_found_from_a_failed_keep_is_made_durable_before_the_cut(
    tmp_path: Path, directory: str
) -> None:
    # A keep that failed after its copy was renamed into place (or after cut-tails/ was
    # made), before its directory entry was synced: the next open finds the copy (or the
    # directory) there, and must sync the entry before it cuts, or a power cut after the
    # (synced) cut loses the copy.
    store = tmp_path / "store"
    offset, damaged = rot_last_frame(store)
    failing = store / CUT_TAILS_DIRECTORY if directory == "cut-tails" else store
    with pytest.raises(StoreUnavailable):
        Journal.open(store, file_ops=DirectorySyncs(fail=failing))
    segment = store / "segments" / SEGMENT
    assert (store / CUT_TAILS_DIRECTORY).is_dir()
    ops = DirectorySyncs()
    with Journal.open(store, file_ops=ops):
        pass
    assert kept(store) == {f"{SEGMENT}-{offset}.tail": damaged}
    cut = ops.events.index(("ftruncate", str(segment)))
    assert ("fsync", str(failing)) in ops.events[:cut], ops.events[:cut]
