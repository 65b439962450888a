"""The zero-filler: a large active segment's zeros are written ahead of the writer by a
background thread (SPEC 3.2), never over a frame and never onto a sealed segment.

Exclusion is checked by pausing the filler at its fault point while it holds a segment's
extension lock; crashes by SIGKILL while it fills and by power cuts of the simulated disk
(a half-written zero region included); two writer processes with fillers running rotate
through several segments and every sealed one must end at its last frame.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _cli_runs import run_cli
from _disk import SimulatedDisk

from journal import EventIn, Journal, StoreUnavailable
from journal._local.files import FileOps
from journal._local.frames import SEGMENT_SUFFIX
from journal._local.segments import SegmentReader
from journal._local.zerofill import (
    AHEAD_BYTES,
    INLINE_BYTES,
    KEEP_FREE_BYTES,
    RETRY_S,
    STEP_BYTES,
)

ROOT = Path(__file__).resolve().parent.parent
BIG_SEGMENT = 16 << 20  # filled by the filler
SMALL_ROTATING = INLINE_BYTES + (1 << 20)  # just big enough for a filler, rotates soon
FILLER = "journal-zerofill"


def batch(tag: str, n: int, size: int = 580, count: int = 100) -> list[EventIn]:
    return [EventIn("m", f"{tag}:{n}:{i}:".encode().ljust(size, b"x")) for i in range(count)]


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.01)


def active_segment(store: Path) -> Path:
    return sorted((store / "segments").glob("*" + SEGMENT_SUFFIX))[-1]


def data_end(segment: Path) -> int:
    """Where the last valid frame of a plain segment ends."""
    with SegmentReader(str(segment.parent), int(segment.name[:20])) as reader:
        frames = [info for info, _ in reader.frames(tail=True)]
    return frames[-1].end_offset if frames else 64


def open_files() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (the listing's own descriptor)
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
    return found


def append_until_the_filler_fails(j: Journal, caplog: pytest.LogCaptureFixture) -> int:
    """Append batches to session "s" until the filler logs a failure; how many."""
    n = 0
    while "could not zero-fill" not in caplog.text:
        assert n < 400, "the filler never failed"
        j.append("s", batch("s", n))
        n += 1
    return n


def fillers_alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == FILLER and t.is_alive()]


class Recorder(FileOps):
    """Records the points that fired (with their thread) and zero writes of the commit
    path; `fill_error` makes the filler's steps fail; `full` every write growing a file."""

    def __init__(self) -> None:
        self.points: list[tuple[str, object, str]] = []
        self.inline_zeros = 0
        self.fill_error: int | None = None
        self.full = False  # writes that would grow a file fail with ENOSPC
        self.zeros_full = False  # zero writes growing a file write half, then ENOSPC
        self.free: int | None = None  # the free space the file system reports
        self.cut_short: list[tuple[int, int]] = []  # (offset, length) of fills cut short
        self.pause_step = threading.Event()  # set: the filler stops at its next step
        self.paused = threading.Event()
        self.resume = threading.Event()

    def point(self, name: str, detail: object = None) -> None:
        self.points.append((name, detail, threading.current_thread().name))
        if name == "zerofill.step" and self.pause_step.is_set():
            self.pause_step.clear()
            self.paused.set()
            self.resume.wait(30)

    def _grows(self, fd: int, offset: int, length: int) -> None:
        if self.full and offset + length > os.fstat(fd).st_size:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._grows(fd, offset, len(data))
        if not bytes(data).strip(b"\0"):
            if self.zeros_full and offset + len(data) > os.fstat(fd).st_size:
                super().pwrite(fd, data[: len(data) // 2], offset)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.inline_zeros += len(data)
        return super().pwrite(fd, data, offset)

    def free_bytes(self, fd: int) -> int:
        return super().free_bytes(fd) if self.free is None else self.free

    def pwrite_synced(self, fd: int, data: bytes, offset: int) -> int:
        self._grows(fd, offset, len(data))
        return super().pwrite_synced(fd, data, offset)

    def fill_zeros(self, fd: int, offset: int, length: int, *, sync: bool) -> None:
        if self.fill_error is not None:
            raise OSError(self.fill_error, os.strerror(self.fill_error))
        if self.zeros_full:
            super().fill_zeros(fd, offset, length // 2, sync=sync)
            self.cut_short.append((offset, length))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().fill_zeros(fd, offset, length, sync=sync)

    def filled(self) -> list[object]:
        return [detail for name, detail, _ in self.points if name == "zerofill.filled"]


def test_a_large_segment_is_zero_filled_ahead_by_the_filler_not_by_commits(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    ops = Recorder()
    with Journal.open(store, segment_bytes=BIG_SEGMENT, file_ops=ops) as j:
        j.create_session("s")
        for n in range(40):
            j.append("s", batch("s", n))
        segment = active_segment(store)
        end = data_end(segment)
        wait_for(lambda: os.path.getsize(segment) >= end + AHEAD_BYTES - STEP_BYTES)
        assert ops.inline_zeros == 0, "a commit wrote zeros although the filler works"
        # (Every zero-filler point runs in its thread but `zerofill.start`, which runs in
        # the thread that asks for zeros and starts it.)
        threads = {
            thread
            for name, _, thread in ops.points
            if name.startswith("zerofill.") and name != "zerofill.start"
        }
        assert threads == {FILLER}
        assert "zerofill.start" in [name for name, _, _ in ops.points]
        assert [e.data for e in j.replay("s")] == [e.data for n in range(40) for e in batch("s", n)]
        assert j.verify().problems == []
    assert fillers_alive() == []
    # Reopened: the zeros past the last frame are the end of the data.
    with Journal.open(store, segment_bytes=BIG_SEGMENT) as j:
        assert j.append("s", batch("s", 40)).first_ordinal == 4001


def test_a_small_segment_is_preallocated_whole_at_birth_without_a_filler(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    ops = Recorder()
    with Journal.open(store, segment_bytes=INLINE_BYTES, file_ops=ops) as j:
        j.create_session("s")
        j.append("s", batch("s", 0))
        assert os.path.getsize(active_segment(store)) == INLINE_BYTES
        assert ops.filled() == [] and fillers_alive() == []


def test_sealed_segments_end_at_their_last_frame_while_a_filler_runs(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ops = Recorder()
    with Journal.open(store, segment_bytes=SMALL_ROTATING, file_ops=ops) as j:
        j.create_session("s")
        for n in range(200):  # ~11.6 MB: two rotations
            j.append("s", batch("s", n))
        segments = sorted((store / "segments").glob("*" + SEGMENT_SUFFIX))
        assert len(segments) >= 3
        for sealed in segments[:-1]:
            assert os.path.getsize(sealed) == data_end(sealed), sealed.name
        filled = {detail[0] for detail in ops.filled()}  # type: ignore[index]
        assert {sealed.name for sealed in segments[:-1]} <= filled
        assert j.verify().problems == []


def test_a_writer_that_outruns_the_zeros_waits_for_the_filler_s_step(tmp_path: Path) -> None:
    """The filler holds the extension lock of a fresh segment; a commit whose frame ends
    past the file's size waits for it (then writes its frame past the zeros' start)."""
    store = tmp_path / "store"
    ops = Recorder()
    with Journal.open(store, segment_bytes=BIG_SEGMENT, file_ops=ops) as j:
        j.create_session("s")
        j.append("s", batch("s", 0))
        wait_for(lambda: os.path.getsize(active_segment(store)) >= AHEAD_BYTES)
        ops.pause_step.set()
        # Outrun the zeros: a batch larger than what is left ahead.
        big = [EventIn("m", bytes([n % 255 + 1]) * 1000) for n in range(AHEAD_BYTES // 1000 + 64)]
        done = threading.Event()

        def append_big() -> None:
            j.append("s", big)
            done.set()

        for n in range(1, 200):  # until the writer asks for more and the filler pauses
            j.append("s", batch("s", n))
            if ops.paused.wait(0.05):
                break
        assert ops.paused.is_set()
        appender = threading.Thread(target=append_big)
        appender.start()
        assert not done.wait(0.5), "a frame past the size was written under a filler's step"
        ops.resume.set()
        appender.join(30)
        assert done.is_set()
        assert [e.data for e in j.replay("s")][-len(big) :] == [e.data for e in big]
        assert j.verify().problems == []


def test_a_failing_filler_is_logged_and_commits_preallocate_inline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    ops = Recorder()
    ops.fill_error = errno.ENOSPC
    caplog.set_level(logging.WARNING, logger="journal")
    with Journal.open(store, segment_bytes=BIG_SEGMENT, file_ops=ops) as j:
        j.create_session("s")
        n = 0
        while "could not zero-fill" not in caplog.text or not ops.inline_zeros:
            assert n < 400, "the filler never failed, or commits never preallocated"
            j.append("s", batch("s", n))
            n += 1
        assert "No space left on device" in caplog.text
        # The disk is full for the commit too: the error is the commit's, as without a
        # filler (whether it meets it writing zeros or growing the file with its frame).
        ops.full = True
        with pytest.raises(StoreUnavailable) as raised:
            j.append("s", [EventIn("m", b"y" * (INLINE_BYTES + 1000))])
        assert raised.value.errno == errno.ENOSPC
        ops.full = False
        ops.fill_error = None
        j.append("s", batch("s", n))
        expected = [e.data for k in range(n + 1) for e in batch("s", k)]
        assert [e.data for e in j.replay("s")] == expected
        assert j.verify().problems == []


def test_zeros_ahead_leave_the_last_free_space_of_a_disk_near_full_to_the_frames(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Zeros ahead are a speed-up (SPEC 3.2): neither a new segment, nor the filler, nor a
    commit writes them where the file system would keep less than `KEEP_FREE_BYTES`
    free; the frames grow the file instead, and the filler says why once. Zeros come back
    when space does."""
    store = tmp_path / "store"
    ops = Recorder()
    ops.free = KEEP_FREE_BYTES + STEP_BYTES - 1  # not room for one step
    caplog.set_level(logging.WARNING, logger="journal")
    with Journal.open(store, create=True, segment_bytes=BIG_SEGMENT, file_ops=ops) as j:
        j.create_session("s")
        segment = active_segment(store)
        for n in range(30):
            j.append("s", batch("s", n))
            assert os.path.getsize(segment) == data_end(segment)
        wait_for(lambda: "no zeros are written ahead" in caplog.text)
        warned = [r for r in caplog.records if "no zeros are written ahead" in r.getMessage()]
        assert warned[0].levelno == logging.WARNING
        assert "zeros ahead leave its last 16 MiB to frames and the view" in caplog.text
        assert "could not zero-fill" not in caplog.text  # (no failure: nothing to retry)
        assert ops.inline_zeros == 0 and ops.filled() == []
        time.sleep(0.3)  # (a step in flight would have written by now)
        assert os.path.getsize(segment) == data_end(segment)
        ops.free = None  # space again: the zeros come back
        n = 30
        deadline = time.monotonic() + 30
        while os.path.getsize(segment) < data_end(segment) + STEP_BYTES:
            assert time.monotonic() < deadline, "the zeros did not come back"
            j.append("s", batch("s", n))
            n += 1
            time.sleep(0.05)
        assert [e.data for e in j.replay("s")] == [e.data for k in range(n) for e in batch("s", k)]
        assert j.verify().problems == []


def test_a_new_store_born_without_zeros_is_not_taken_for_one_moved_on(
    tmp_path: Path,
) -> None:
    """On a disk near full a segment is born without zeros (SPEC 3.2): its file ends at
    its header. A new store's view names that place (the first segment, offset 64), and
    a file ending at the view's head was taken for a sealed segment whose successor is
    the one named after the next position: the segment itself. So the log had "moved
    past" the view: a read-only open waited for a writer to index it, then read through a
    private view; the writer's first commit caught up for nothing."""
    store = tmp_path / "store"
    ops = Recorder()
    ops.free = 0
    with Journal.open(store, create=True, file_ops=ops):
        pass
    assert os.path.getsize(active_segment(store)) == 64
    reader_ops = Recorder()
    with Journal.open(store, readonly=True, file_ops=reader_ops) as r:
        assert list(r.list_sessions()) == []
    assert [name for name, _, _ in reader_ops.points if name == "open.view_behind"] == []


def test_a_filler_without_room_for_its_last_short_steps_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The filler's refusal named the step's length, and the last steps of a segment are
    shorter each time (up to the segment's end, from a file the frames grow): every
    retry was a new failure, a warning once a second through the last MiB of every
    segment. The same refusal is the same failure: one warning, then debug level."""
    store = tmp_path / "store"
    ops = Recorder()
    ops.free = KEEP_FREE_BYTES + 1  # not room for any zeros
    caplog.set_level(logging.DEBUG, logger="journal")

    def failures() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "no zeros are written ahead" in r.getMessage()]

    with Journal.open(store, create=True, segment_bytes=SMALL_ROTATING, file_ops=ops) as j:
        j.create_session("s")
        segment = active_segment(store)
        n = 0
        while data_end(segment) < SMALL_ROTATING - STEP_BYTES + (100 << 10):
            j.append("s", batch("s", n))
            n += 1
        for _ in range(2):  # the filler rests, then is asked for a short step
            seen = len(failures())
            time.sleep(RETRY_S + 0.3)
            j.append("s", batch("s", n))
            n += 1
            wait_for(lambda seen=seen: len(failures()) > seen)
        assert len(list(store.glob("segments/*" + SEGMENT_SUFFIX))) == 1
        assert [r.levelno for r in failures()][:1] == [logging.WARNING]
        assert [r.levelno for r in failures()][1:] == [logging.DEBUG] * (len(failures()) - 1)
        assert len({str(r.args[1]) for r in failures()}) == 1  # type: ignore[index]


def test_a_commit_s_zeros_that_fail_midway_are_cut_off_and_its_frame_goes_in(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk met while a commit writes its own zeros ahead (the filler failing):
    what was written of them is cut off again, so the zeros never hold the disk's last
    space, and the commit's frame still goes in, growing the file."""
    store = tmp_path / "store"
    ops = Recorder()
    caplog.set_level(logging.WARNING, logger="journal")
    with Journal.open(store, create=True, segment_bytes=BIG_SEGMENT, file_ops=ops) as j:
        j.create_session("s")
        segment = active_segment(store)
        ops.fill_error = errno.ENOSPC
        ops.zeros_full = True
        n = append_until_the_filler_fails(j, caplog)
        # The commits' own zeros fail halfway, and go again.
        for _ in range(80):  # past the zeros there were
            j.append("s", batch("s", n))
            n += 1
        assert os.path.getsize(segment) == data_end(segment)
        assert ops.inline_zeros == 0
        assert [e.data for e in j.replay("s")] == [e.data for k in range(n) for e in batch("s", k)]
        assert j.verify().problems == []


def test_a_filler_step_that_fails_midway_leaves_what_it_wrote(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Unlike a commit's own zeros, a filler's step cut short by a full disk is not cut
    off: a writer that saw the file grow may have written a frame there already (it
    writes below the size it sees without the extension lock), and cutting would cut it."""
    store = tmp_path / "store"
    ops = Recorder()
    caplog.set_level(logging.WARNING, logger="journal")
    with Journal.open(store, create=True, segment_bytes=BIG_SEGMENT, file_ops=ops) as j:
        j.create_session("s")
        segment = active_segment(store)
        ops.zeros_full = True
        n = append_until_the_filler_fails(j, caplog)
        # The first step cut short (not the last step begun: the filler tries again, and
        # its next step may be halfway through its zeros now).
        size, length = ops.cut_short[0]
        assert os.path.getsize(segment) >= size + length // 2
        assert len(list(j.replay("s"))) == n * len(batch("s", 0))


def test_the_filler_is_paused_across_fork_and_the_child_fills_its_own(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ops = Recorder()
    with Journal.open(store, segment_bytes=BIG_SEGMENT, file_ops=ops) as j:
        j.create_session("s")
        j.append("s", batch("s", 0))
        for _ in range(5):
            pid = os.fork()
            if pid == 0:  # the child: no filler descriptor inherited, its own journal works
                code = 1
                try:
                    segments = os.path.realpath(store / "segments")
                    inherited = [fd for fd in open_files() if fd.startswith(segments)]
                    j.close()  # (a forked child's close touches no parent thread)
                    if len(inherited) <= 1:  # the writer's own descriptor
                        with Journal.open(store, segment_bytes=BIG_SEGMENT) as child:
                            child.append("s", batch("c", 0))
                        code = 0
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert status == 0
            j.append("s", batch("s", 1))
        assert len(list(j.replay("s"))) == 1100
        assert j.verify().problems == []


_KILLED_CHILD = """
import sys, time, threading
from journal import EventIn, Journal
from journal._local.files import FileOps

class PauseOnSecondStep(FileOps):
    steps = 0
    def point(self, name, detail=None):
        if name == "zerofill.step":
            self.steps += 1
            if self.steps == 2:
                sys.stdout.write("filling\\n")
                sys.stdout.flush()
                time.sleep(60)

with Journal.open(sys.argv[1], segment_bytes=%d, file_ops=PauseOnSecondStep()) as j:
    j.create_session("s")
    for n in range(10 ** 6):
        r = j.append("s", [EventIn("m", b"%%d:%%d:" %% (n, i) + b"k" * 500) for i in range(50)])
        sys.stdout.write("ack %%d\\n" %% r.last_ordinal)
        sys.stdout.flush()
"""


def test_sigkill_while_the_filler_holds_the_extension_lock_loses_nothing(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CHILD % BIG_SEGMENT, str(store)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    acked = 0
    filling = False
    try:
        for line in child.stdout:
            if line.startswith("filling"):
                filling = True
            elif line.startswith("ack"):
                acked = int(line.split()[1])
            if filling and acked >= 500:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert filling and acked >= 500
    with Journal.open(store, segment_bytes=BIG_SEGMENT) as j:
        events = list(j.replay("s"))
        assert len(events) >= acked
        assert [e.ordinal for e in events] == list(range(1, len(events) + 1))
        # The dead filler's lock went with it: this writer extends the segment, and its
        # own filler runs.
        for n in range(200):
            j.append("s", batch("t", n, size=100))
        assert len(list(j.replay("s"))) == len(events) + 20_000
        assert j.verify().problems == []


# Killed from the filler's own thread: after its N-th step was written and synced
# (`zerofill.filled`), or halfway through writing it (`mid`: half the zeros written).
_KILLED_BY_THE_FILLER = """
import os, signal, sys
from journal import EventIn, Journal
from journal._local.files import FileOps

where, occurrence = sys.argv[2], int(sys.argv[3])

class Killed(FileOps):
    seen = 0
    def point(self, name, detail=None):
        if name == where:
            self.at()
    def fill_zeros(self, fd, offset, length, *, sync):
        if where == "mid":
            os.pwrite(fd, bytes(length // 2), offset)
            self.at()
        super().fill_zeros(fd, offset, length, sync=sync)
    def at(self):
        self.seen += 1
        if self.seen == occurrence:
            os.kill(os.getpid(), signal.SIGKILL)

with Journal.open(sys.argv[1], segment_bytes=%d, file_ops=Killed()) as j:
    j.create_session("s")
    for n in range(10 ** 6):
        r = j.append("s", [EventIn("m", b"%%d:" %% n + b"k" * 20000)])
        print("ack", n, flush=True)
"""


@pytest.mark.parametrize(("where", "occurrence"), [("zerofill.filled", 1), ("mid", 3)])
def test_sigkill_inside_a_fill_step_leaves_a_store_every_reader_and_verify_take_as_sound(
    tmp_path: Path, where: str, occurrence: int
) -> None:
    """The file ends in zeros of a step done, or half done: the end of the data (SPEC
    3.2), which a read-only journal, `verify()`, `journal verify` and the next writer
    take as such."""
    store = tmp_path / "store"
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            _KILLED_BY_THE_FILLER % BIG_SEGMENT,
            str(store),
            where,
            str(occurrence),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr  # (killed by the filler only)
    acked = len(child.stdout.splitlines())
    with Journal.open(store, readonly=True) as reader:
        found = [e.data for e in reader.replay("s")]
        assert reader.verify().problems == []
    assert len(found) in (acked, acked + 1)  # (the batch in flight, if its frame was synced)
    assert found == [b"%d:" % n + b"k" * 20000 for n in range(len(found))]
    done = run_cli(store, "verify")
    assert done.returncode == 0 and "0 problems" in done.stdout, (done.stdout, done.stderr)
    with Journal.open(store, segment_bytes=BIG_SEGMENT) as j:
        assert [e.data for e in j.replay("s")] == found
        for n in range(400):  # (past the zeros the dead filler left, and a seal)
            j.append("s", [EventIn("m", b"after %d" % n + b"a" * 40000)])
        assert len(list(j.replay("s"))) == len(found) + 400
        assert j.verify().problems == []


def _power_cut_round(path: Path, seed: int) -> None:
    """Appends to a large segment on the simulated disk while the filler runs, then a
    power cut at a random call (a fill's write may be on disk without its sync: a
    half-written zero region); every acknowledged batch survives."""
    rng = random.Random(seed)
    disk = SimulatedDisk(str(path), rng)
    acked: list[bytes] = []
    refused: list[bytes] = []
    j = Journal.open(path, segment_bytes=SMALL_ROTATING, file_ops=disk)
    try:
        j.create_session("s")
        disk.settle()
        disk.cut_at = disk.calls + rng.randrange(1, 300)
        for n in range(10**6):
            payloads = [
                f"{n}:{i}:".encode().ljust(rng.randrange(100, 3000), b"z") for i in range(20)
            ]
            try:
                j.append("s", [EventIn("m", p) for p in payloads])
            except StoreUnavailable:
                refused = payloads
                break
            acked.extend(payloads)
    finally:
        with contextlib.suppress(Exception):
            j.close()
    disk.power_cut()
    with Journal.open(path, segment_bytes=SMALL_ROTATING) as j:
        found = [e.data for e in j.replay("s")]
        if found[len(acked) :] == refused:  # synced before the power went: whole
            acked.extend(refused)
        assert found == acked
        assert j.verify().problems == []
        j.append("s", [EventIn("m", b"after")])


@pytest.mark.parametrize("seed", range(4))
def test_a_power_cut_while_the_filler_runs_loses_nothing_acknowledged(
    tmp_path: Path, seed: int
) -> None:
    _power_cut_round(tmp_path / "s", seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4, 60))
def test_a_power_cut_while_the_filler_runs_loses_nothing_acknowledged_many(
    tmp_path: Path, seed: int
) -> None:
    _power_cut_round(tmp_path / "s", seed)


_ALTERNATING_WRITER = """
import sys
from journal import EventIn, Journal
store, tag, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Journal.open(store, segment_bytes=%d) as j:
    print("ready", flush=True)
    sys.stdin.readline()
    for n in range(batches):
        data = [b"%%s:%%d:%%d:" %% (tag.encode(), n, i) + b"w" * 700 for i in range(40)]
        j.append(tag, [EventIn("m", d) for d in data])
"""


def test_two_writer_processes_with_fillers_rotate_without_zeros_on_sealed_segments(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    with Journal.open(store, create=True, segment_bytes=SMALL_ROTATING) as j:
        j.create_session("a")
        j.create_session("b")
    batches = 250  # 2 x 250 x ~29 KB: about three rotations
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _ALTERNATING_WRITER % SMALL_ROTATING,
                str(store),
                tag,
                str(batches),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for tag in ("a", "b")
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.close()
    for child in children:
        assert child.wait(120) == 0
        assert child.stdout is not None
        child.stdout.close()
    segments = sorted((store / "segments").glob("*" + SEGMENT_SUFFIX))
    assert len(segments) >= 3
    for sealed in segments[:-1]:
        assert os.path.getsize(sealed) == data_end(sealed), sealed.name
    with Journal.open(store, segment_bytes=SMALL_ROTATING) as j:
        for tag in ("a", "b"):
            found = [e.data.split(b":")[1:3] for e in j.replay(tag)]
            assert found == [
                [str(n).encode(), str(i).encode()] for n in range(batches) for i in range(40)
            ]
        assert j.verify().problems == []
    assert STEP_BYTES < AHEAD_BYTES  # (the premise of "a step at a time")


def test_a_new_store_verifies_clean_before_its_first_write(tmp_path: Path) -> None:
    # Its first segment is born with zeros after the header: the view must still record
    # where the log ends (it did only by accident while segments were born 64 bytes long).
    with Journal.open(tmp_path / "s") as j:
        assert j.verify().problems == []
        j.create_session("a")
        assert j.verify().problems == []


def test_a_filler_that_keeps_failing_warns_once_until_it_works_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    ops = Recorder()
    ops.fill_error = errno.ENOSPC
    caplog.set_level(logging.DEBUG, logger="journal")

    def failures() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "could not zero-fill" in r.getMessage()]

    with Journal.open(store, segment_bytes=BIG_SEGMENT, file_ops=ops) as j:
        j.create_session("s")
        n = 0
        deadline = time.monotonic() + 60
        while len(failures()) < 3:  # the filler retried twice after resting
            assert time.monotonic() < deadline, "the filler did not retry"
            j.append("s", batch("s", n))
            n += 1
        levels = [r.levelno for r in failures()]
        assert levels[0] == logging.WARNING
        assert set(levels[1:]) == {logging.DEBUG}, "a repeated failure warned again"
        ops.fill_error = None
        while not any("works again" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the filler never recovered"
            j.append("s", batch("s", n))
            n += 1
        assert len(list(j.replay("s"))) == n * len(batch("s", 0))


@pytest.mark.parametrize("sync", [True, False])
def test_the_real_fill_writes_exactly_the_zeros_asked_for_in_pieces(
    tmp_path: Path, sync: bool
) -> None:
    """`FileOps.fill_zeros` writes its step a piece at a time (SPEC 3.2): every byte of
    the range, whatever its length, and nothing before it."""
    path = tmp_path / "segment"
    path.write_bytes(b"\xff" * 1000)
    length = STEP_BYTES + 5_000  # not a whole number of pieces
    fd = os.open(path, os.O_WRONLY)
    try:
        FileOps().fill_zeros(fd, 1000, length, sync=sync)
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert len(data) == 1000 + length
    assert data[:1000] == b"\xff" * 1000
    assert data[1000:] == bytes(length)


class InterruptedFillerStart(FileOps):
    """Ctrl+C (a KeyboardInterrupt) as the zero-filler's thread starts, once."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = True

    def point(self, name: str, detail: object = None) -> None:
        if name == "zerofill.start" and self.armed:
            self.armed = False
            raise KeyboardInterrupt


def test_ctrl_c_as_the_zero_filler_starts_is_the_interrupt(tmp_path: Path) -> None:
    # A Ctrl+C inside the thread's start() (`journal append` interrupted as it opened the
    # store, CI run 57) left the thread recorded though it never ran: the failed open's
    # cleanup then raised "cannot join thread before it is started" in place of the
    # KeyboardInterrupt, and the command printed a traceback.
    store = tmp_path / "store"
    with Journal.open(store, create=True, segment_bytes=8 << 20) as j:
        j.append("a", [EventIn("m", b"x" * 1000)] * 5000, create=True)
    ops = InterruptedFillerStart()
    with pytest.raises(KeyboardInterrupt):
        Journal.open(store, file_ops=ops)  # (its segment's last step of zeros is asked for)
    assert not ops.armed, "the fault point was not reached"
    with Journal.open(store, file_ops=ops) as j:  # (the store and the filler work on)
        j.append("a", [EventIn("m", b"y")])
        assert j.get_session("a").last_ordinal == 5001
        assert j.verify().problems == []
