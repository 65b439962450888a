"""A file size limit and a full disk: `journal init` refused by a file size limit
left a store its readers called corrupt, a file size limit was blamed on the disk (and
made every new segment fail, for its zeros ahead), and `journal compact` on a full disk
did not say what it needed room for."""

from __future__ import annotations

import errno
import os
import resource
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from journal import EventIn, Journal, RetentionPolicy, StoreUnavailable
from journal._local.files import FileOps
from tests._cli_runs import cli_env, run_cli
from tests._small_disk import on_a_small_disk


def _limit_file_size(limit: int) -> Callable[[], None]:
    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    return limited


def _limited_cli(
    store: Path, limit: int, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`journal --store STORE ARGS` under a file size limit of `limit` bytes (`ulimit -f`)."""
    return subprocess.run(
        [sys.executable, "-m", "cli", "--store", str(store), *args],
        capture_output=True,
        text=True,
        # (No bytecode written: one past the limit is cut short, and later imports of it
        # fail with "marshal data too short".)
        env={**cli_env(), "PYTHONDONTWRITEBYTECODE": "1"},
        timeout=60,
        input=stdin,
        preexec_fn=_limit_file_size(limit),
        check=False,
    )


def test_an_init_the_disk_refused_leaves_no_store_that_reads_as_corrupt(tmp_path: Path) -> None:
    """`journal init` under a file size limit its view's files exceed fails (exit 9,
    "nothing of this call was committed ... usable again once the cause is fixed"). It
    left `store.json` and an index without a segment: with the limit gone, read commands
    (`stats`, `verify`) exited 7 with "corrupt journal data ... restore the segment from a
    backup" for a store that never held an event, and a second `init` said "opened the
    existing store". Now the store reads as not there until a creating open finishes it.
    (The trial's 2 MiB limit no longer fails `init`: its segment skips the zeros ahead,
    `test_init_works_under_a_file_size_limit_below_the_zeros_ahead`.)"""
    store = tmp_path / "store"
    failed = _limited_cli(store, 64 << 10, "init")
    assert failed.returncode == 9, failed.stderr
    stats = run_cli(store, "stats")
    verify = run_cli(store, "verify")
    assert "corrupt" not in stats.stderr + verify.stderr, (stats.stderr, verify.stderr)
    assert verify.returncode != 7, verify.stderr
    assert "creation did not finish" in stats.stderr, stats.stderr
    again = run_cli(store, "init")
    assert again.returncode == 0 and "created a new store" in again.stderr, again.stderr
    assert "creating" not in os.listdir(store)
    verify = run_cli(store, "verify")
    assert verify.returncode == 0, verify.stderr
    assert "ulimit -f" in failed.stderr, failed.stderr  # (not "free space, replace the disk")


def test_init_works_under_a_file_size_limit_below_the_zeros_ahead(tmp_path: Path) -> None:
    """A new segment is born with 4 MiB of zeros ahead of its frames: under a 2 MiB file
    size limit every `journal init` failed with EFBIG, where a disk near full skips the
    zeros and works. The zeros are skipped there too, and appends go on up to the limit."""
    store = tmp_path / "store"
    limit = 2 << 20
    init = _limited_cli(store, limit, "init")
    assert init.returncode == 0, init.stderr
    created = _limited_cli(store, limit, "sessions", "create", "a")
    assert created.returncode == 0, created.stderr
    for n in range(3):
        appended = _limited_cli(store, limit, "append", "-s", "a", stdin=f'{{"n": {n}}}\n')
        assert appended.returncode == 0, appended.stderr
        assert "warning" not in appended.stderr, appended.stderr
    verify = run_cli(store, "verify")
    assert verify.returncode == 0 and "0 problems" in verify.stdout, verify.stdout


def test_a_file_size_limit_is_not_blamed_on_the_disk(tmp_path: Path) -> None:
    """An append refused with EFBIG (a `ulimit -f` file size limit) said "free space,
    replace the disk", which helps nothing: the limit is the process's (as EMFILE's
    message names `ulimit -n`, this one names the file size limit)."""
    store = tmp_path / "store"
    assert run_cli(store, "init").returncode == 0
    assert run_cli(store, "sessions", "create", "a").returncode == 0
    data = '{"data": "%s"}\n' % ("x" * 3_000_000)
    refused = _limited_cli(store, 2 << 20, "append", "-s", "a", stdin=data * 2)
    assert refused.returncode == 9, refused.stderr
    assert "File too large" in refused.stderr, refused.stderr
    assert "replace the disk" not in refused.stderr, refused.stderr
    assert "ulimit -f" in refused.stderr, refused.stderr


_COMPACT_ON_A_FULL_DISK = r"""
import os, sys
from journal import EventIn, Journal, JournalError, RetentionPolicy
disk = sys.argv[1]
with Journal.open(
    os.path.join(disk, "store"), segment_bytes=4 << 20,
    retention=RetentionPolicy(max_history_bytes=None),
) as j:
    j.create_session("a")
    j.create_session("b")
    for i in range(1500):  # (random bytes: the copy compresses no smaller)
        j.append("a", [EventIn("e", os.urandom(4000))])
        j.append("b", [EventIn("e", os.urandom(4000))])
    j.compact_session("a", through_ordinal=1500, snapshot=b"done")  # half of each is dead
    ballast = os.path.join(disk, "ballast")
    with open(ballast, "wb") as f:
        try:
            while True:
                f.write(bytes(1 << 16))
                f.flush()
        except OSError:
            pass
    os.truncate(ballast, os.path.getsize(ballast) - (1 << 20))
    try:
        j.compact(dead_share=0.3)
        print("compacted", flush=True)
    except JournalError as e:
        print("refused", type(e).__name__, getattr(e, "errno", None), e.message, flush=True)
"""


def test_compaction_on_a_full_disk_says_it_needs_room_for_its_copy(tmp_path: Path) -> None:
    """`journal compact` on a full disk failed with "free space, replace the disk" alone:
    compaction writes each rewritten segment's copy before it deletes the old file, so it
    needs room for that copy (README), which the message did not say, nor how much. It
    names the segment, the room its copy takes at most and what is free."""
    lines = on_a_small_disk(tmp_path, _COMPACT_ON_A_FULL_DISK, options="size=32m")
    assert len(lines) == 1 and lines[0].startswith("refused StoreUnavailable 28 "), lines
    message = lines[0]
    assert "compaction writes a copy of segment 0000000000000000000" in message, message
    assert "needs room for that copy: up to 2." in message, message
    assert "MB are free there" in message, message


# argv: DISK STEP. The store of the copy's test above, with room for the copy; another
# process's file takes the disk's last free byte while compaction's STEP ("seal": the
# seal of the active segment, once its zeros are cut; "swap": the swap, once the old
# plain file is deleted) commits, so that commit's next write finds no room.
_FULL_DURING_A_COMMIT = r"""
import os, sys
from journal import EventIn, Journal, JournalError, RetentionPolicy
from journal._local.files import FileOps
disk, step = sys.argv[1:3]

def fill():
    fd = os.open(os.path.join(disk, "ballast"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 16, 4096, 512, 1):
            try:
                while os.write(fd, bytes(size)):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)

class FillsTheDisk(FileOps):
    armed = False
    def ftruncate(self, fd, length):
        super().ftruncate(fd, length)
        if self.armed and step == "seal":
            fill()
    def unlink(self, path):
        super().unlink(path)
        if self.armed and step == "swap" and path.endswith(".seg"):
            fill()

ops = FillsTheDisk()
with Journal.open(
    os.path.join(disk, "store"), segment_bytes=16 << 20, file_ops=ops,
    retention=RetentionPolicy(max_history_bytes=None),
) as j:
    j.create_session("a")
    j.create_session("b")
    for i in range(1500):
        j.append("a", [EventIn("e", os.urandom(4000))])
        j.append("b", [EventIn("e", os.urandom(4000))])
    j.compact_session("a", through_ordinal=1500, snapshot=b"done")
    ops.armed = True
    try:
        j.compact(dead_share=0.3)
        print("compacted", flush=True)
    except JournalError as e:
        print("refused", type(e).__name__, getattr(e, "errno", None), e.message, flush=True)
    ops.armed = False
    os.unlink(os.path.join(disk, "ballast"))
    j.compact(dead_share=0.3)
    print("events", len(list(j.replay("b"))), flush=True)
"""


@pytest.mark.parametrize("step", ["seal", "swap"])
def test_compaction_s_commit_on_a_full_disk_says_what_it_needs_room_for(
    tmp_path: Path, step: str
) -> None:
    """The disk filled up while compaction's seal or swap committed: it said "could not be
    read or written: No space left on device ... (free space, replace the disk)", as if
    the disk were failing, where the copy's step says what it wrote, that nothing was
    lost, and how much room to free. Nothing was lost: once room is freed, compaction
    goes on, every event still there."""
    lines = on_a_small_disk(
        tmp_path,
        _FULL_DURING_A_COMMIT.replace("sys.argv[1:3]", f"sys.argv[1], {step!r}"),
        options="size=32m",
    )
    assert len(lines) == 2 and lines[0].startswith("refused StoreUnavailable 28 "), lines
    message = lines[0]
    what = {
        "seal": "compaction seals the active segment 00000000000000000001.seg",
        "swap": "compaction put its copy of segment 00000000000000000001.seg without its dead",
    }[step]
    assert what in message, message
    assert "nothing was lost" in message, message
    assert "MB are free there" in message, message
    assert "free at least" in message and "outside the store" in message, message
    assert "replace the disk" not in message, message
    assert lines[1] == "events 1500", lines


_APPEND_UNDER_A_LIMIT = """
import resource, signal, sys
from journal import EventIn, Journal, StoreUnavailable
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, resource.RLIM_INFINITY))
with Journal.open(sys.argv[1], segment_bytes=4 << 20) as j:
    j.create_session("a")
    for n in range(100):
        j.append("a", [EventIn("e", bytes(1000))])
    try:
        j.append("a", [EventIn("e", bytes(3 << 20))])
    except StoreUnavailable as e:
        print("refused", e.errno)
    j.append("a", [EventIn("e", b"after")])
    print(len(list(j.replay("a"))), j.verify().ok)
"""


def test_a_segment_preallocated_whole_skips_zeros_past_a_file_size_limit(tmp_path: Path) -> None:
    """A segment of at most 4 MiB has no filler: its writer preallocates it whole at its
    first append, and under a smaller file size limit that append failed with EFBIG
    though its frame fitted. The zeros are skipped (as on a disk near full); a frame past
    the limit fails alone."""
    done = subprocess.run(
        [sys.executable, "-c", _APPEND_UNDER_A_LIMIT, str(tmp_path / "s")],
        capture_output=True,
        text=True,
        env={**cli_env(), "PYTHONDONTWRITEBYTECODE": "1"},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["refused 27", "101 True"], done.stdout


class _NoRoomForTheSwapMark(FileOps):
    """The directory's sync after compaction makes its swap mark (the first after its
    copy is written) finds no room (ENOSPC, as a file system with delayed allocation
    may say at a sync)."""

    def __init__(self) -> None:
        self.armed = False
        self.fired = False

    def point(self, name: str, detail: object = None) -> None:
        if name == "compaction.rewritten" and not self.fired:
            self.armed = self.fired = True

    def fsync(self, fd: int) -> None:
        if self.armed and stat.S_ISDIR(os.fstat(fd).st_mode):
            self.armed = False
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().fsync(fd)


def test_compaction_s_swap_mark_refused_room_says_what_it_needs(tmp_path: Path) -> None:
    """The swap's mark, made before its commit, escaped as a bare `OSError` when the disk
    refused it: it is the swap's `StoreUnavailable` saying that nothing was lost and how
    much room to free, and compaction goes on once it is given room."""
    ops = _NoRoomForTheSwapMark()
    with Journal.open(
        tmp_path / "s",
        segment_bytes=1 << 20,
        file_ops=ops,
        retention=RetentionPolicy(max_history_bytes=None),
    ) as journal:
        for session in ("a", "b"):
            journal.create_session(session)
        for _ in range(300):
            journal.append("a", [EventIn("e", os.urandom(4000))])
            journal.append("b", [EventIn("e", os.urandom(4000))])
        journal.compact_session("a", through_ordinal=300, snapshot=b"done")
        with pytest.raises(StoreUnavailable) as refused:
            journal.compact(dead_share=0.3)
        message = refused.value.message
        assert refused.value.errno == errno.ENOSPC, message
        assert "compaction put its copy of segment" in message, message
        assert "nothing was lost" in message and "free at least" in message, message
        assert journal.compact(dead_share=0.3).segments_rewritten
        assert len(list(journal.replay("b"))) == 300
        assert journal.verify().ok
