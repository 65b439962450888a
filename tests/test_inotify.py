"""The local engine's change notification (SPEC 7.6): the watches of every journal of a
process are in one inotify instance (a user has 128 by default, shared by all its
processes), whose thread wakes each journal's waiter; a directory watched by two
journals is one watch, given up when the last leaves; a replaced directory is watched
again by each; a forked child starts an instance of its own.

Nothing here asserts a duration: "not polling" is counted in head reads.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest

from journal import EventIn, Journal
from journal._local import inotify_hub
from journal._local.engine import LocalEngine, LocalOptions
from journal._local.inotify import DirectoryChanges
from journal.waiter import Notifier

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(os, "fork"),
    reason="inotify and fork (Linux)",
)

WAIT_S = 30.0  # a bound for liveness only: a broken change source hangs instead of failing
QUIET_S = 0.5  # a window with no commit, whose head reads are counted
QUIET_READS = 10  # at most, per waiter sleeping on inotify (`quiet_head_reads`)
ROOT = Path(__file__).resolve().parent.parent

APPEND_ELSEWHERE = """
import sys
from journal import EventIn, Journal
for path in sys.argv[1:]:
    with Journal.open(path, durability="os") as j:
        j.append("s", [EventIn("remote", b"x")])
"""


def append_in_another_process(*paths: Path) -> None:
    """One event in session "s" of each store, committed by another process."""
    subprocess.run(
        [sys.executable, "-c", APPEND_ELSEWHERE, *map(str, paths)],
        check=True,
        cwd=ROOT,
        timeout=WAIT_S,
    )


def inotify_instances() -> int:
    """This process's inotify descriptors."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}") == "anon_inode:inotify"
        except OSError:
            continue  # (the listing's own descriptor)
    return count


def inotify_threads() -> int:
    return sum(thread.name == "journal-inotify" for thread in threading.enumerate())


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.005)


def opened(path: Path, readonly: bool = False) -> tuple[Journal, Notifier]:
    """A journal on the local engine, and that engine's waiter."""
    engine = LocalEngine.open(str(path), LocalOptions(durability="os", readonly=readonly))
    return Journal.over(engine), engine.waiter


class Followers:
    """One follower thread per journal (`watch("s", stop=...)`), counting what it got;
    ended (stop set, journals closed, threads joined) when the test ends."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.journals: list[Journal] = []
        self.threads: list[threading.Thread] = []
        self.got: dict[int, int] = {}
        self._lock = threading.Lock()

    def start(self, j: Journal) -> None:
        index = len(self.journals)
        self.journals.append(j)
        self.got[index] = 0

        def follow() -> None:
            for _ in j.watch("s", stop=self.stop):
                with self._lock:
                    self.got[index] += 1

        thread = threading.Thread(target=follow, daemon=True, name=f"follow-{index}")
        thread.start()
        self.threads.append(thread)

    def end(self) -> None:
        self.stop.set()
        for j in self.journals:
            j.close()
        for thread in self.threads:
            thread.join(WAIT_S)


@pytest.fixture
def followers() -> Iterator[Followers]:
    started = Followers()
    yield started
    started.end()


def quiet_head_reads(waiters: list[Notifier]) -> int:
    """The head reads of `waiters`' threads over QUIET_S with nothing committed (polling:
    about 250 each; sleeping on inotify: the 1 s safety look, and the last of the 6 looks
    again after a commit if a loaded machine delayed them: `QUIET_READS` at most)."""
    before = sum(waiter.polls for waiter in waiters)
    time.sleep(QUIET_S)
    return sum(waiter.polls for waiter in waiters) - before


def test_journals_with_followers_share_one_inotify_instance(
    tmp_path: Path, followers: Followers
) -> None:
    """Until 2026-12-06 each journal with followers took an inotify instance of its own
    (40 here), and past the user's 128 a journal polled its store every 2 ms: 300
    journals with an idle follower each took 121% of a core."""
    count = 40
    paths = [tmp_path / f"tenant-{i}" for i in range(count)]
    waiters = []
    for path in paths:
        j, waiter = opened(path)
        j.create_session("s")
        waiters.append(waiter)
        followers.start(j)
    until(lambda: all(waiter.waiting == 1 for waiter in waiters), "every follower to wait")
    until(lambda: all(waiter.polls >= 1 for waiter in waiters), "every waiter's first look")
    assert inotify_instances() == 1
    append_in_another_process(*paths)
    until(lambda: all(got == 1 for got in followers.got.values()), "every follower's event")
    time.sleep(0.1)  # (the looks again after those commits)
    assert quiet_head_reads(waiters) <= QUIET_READS * count
    followers.end()
    # The last journal's waiter gone, the instance is closed and its thread ends.
    until(lambda: inotify_instances() == 0 and inotify_threads() == 0, "the instance to close")


def test_change_sources_on_one_directory_share_its_watch(tmp_path: Path) -> None:
    """inotify gives one watch descriptor for a directory watched twice in an instance:
    closing one of its change sources must not remove it for the other."""
    first = DirectoryChanges.open([str(tmp_path)])
    second = DirectoryChanges.open([str(tmp_path)])
    assert first is not None and second is not None
    try:
        (tmp_path / "f").write_bytes(b"1")
        assert first.wait(WAIT_S) is True
        assert second.wait(WAIT_S) is True
        first.close()
        (tmp_path / "f").write_bytes(b"2")
        assert second.wait(WAIT_S) is True  # (False after WAIT_S: its watch was removed)
        third = DirectoryChanges.open([str(tmp_path)])
        assert third is not None
        try:
            (tmp_path / "f").write_bytes(b"3")
            assert second.wait(WAIT_S) is True
            assert third.wait(WAIT_S) is True
        finally:
            third.close()
        assert inotify_instances() == 1
    finally:
        first.close()
        second.close()


def drained(changes: DirectoryChanges) -> bool:
    """Whether `changes` went quiet (its waits ending without a change) within WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while changes.wait(0.05):
        if time.monotonic() > deadline:
            return False
    return True


def test_a_replaced_directory_is_watched_again_by_each_of_its_change_sources(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "index"
    directory.mkdir()
    watching = [DirectoryChanges.open([str(directory)]) for _ in range(2)]
    sources = [changes for changes in watching if changes is not None]
    assert len(sources) == 2
    try:
        assert all(drained(changes) for changes in sources)
        directory.rename(tmp_path / "old")
        directory.mkdir()
        (tmp_path / "old").rmdir()  # (the watch goes with it: IN_IGNORED)
        for changes in sources:
            assert changes.wait(WAIT_S) is True
        # Each watches the new directory, and sleeps again until it changes.
        assert all(drained(changes) for changes in sources)
        (directory / "data.mdb").write_bytes(b"x")
        for changes in sources:
            assert changes.wait(WAIT_S) is True
    finally:
        for changes in sources:
            changes.close()


def test_two_read_only_journals_on_one_store_share_its_watch(
    tmp_path: Path, followers: Followers
) -> None:
    """Two read-only journals of one process on one store both watch its `segments/`:
    one watch, woken for both, kept for the other when one closes."""
    path = tmp_path / "s"
    with Journal.open(path) as j:
        j.create_session("s")
    readers = [opened(path, readonly=True) for _ in range(2)]
    for j, _ in readers:
        followers.start(j)
    waiters = [waiter for _, waiter in readers]
    until(lambda: all(waiter.waiting == 1 for waiter in waiters), "both followers to wait")
    until(lambda: all(waiter.polls >= 1 for waiter in waiters), "both waiters' first look")
    assert inotify_instances() == 1
    append_in_another_process(path)
    until(lambda: followers.got == {0: 1, 1: 1}, "both followers' events")
    readers[0][0].close()
    append_in_another_process(path)
    until(lambda: followers.got[1] == 2, "the other follower's event")
    time.sleep(0.1)  # (the looks again after that commit)
    assert quiet_head_reads(waiters[1:]) <= QUIET_READS  # (it sleeps on its watch)


# The forked child: open another store, follow it, and report (one line) its inotify
# descriptors once it waits, whether the parent's commit reached it, and its head reads
# over a quiet window afterwards.
def _child(path: Path, ready: int, go: int, report: int) -> None:
    inherited = inotify_instances()
    j, waiter = opened(path)
    got = threading.Event()
    stop = threading.Event()

    def follow() -> None:
        for _ in j.watch("s", stop=stop):
            got.set()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    until(lambda: waiter.waiting == 1 and waiter.polls >= 1, "the child's follower to wait")
    instances = inotify_instances()
    os.write(ready, b"r")
    os.read(go, 1)  # (the parent committed)
    delivered = got.wait(WAIT_S)
    time.sleep(0.1)
    reads = quiet_head_reads([waiter])
    stop.set()
    thread.join(WAIT_S)
    j.close()
    os.write(report, f"{inherited} {instances} {int(delivered)} {reads}".encode())


def test_a_forked_child_follows_with_an_inotify_instance_of_its_own(
    tmp_path: Path, followers: Followers
) -> None:
    """The child inherits the parent's instance but not its thread: it closes its copy
    (a read there would take the parent's events) and opens one of its own; the parent's
    watches are untouched."""
    parent_path, child_path = tmp_path / "parent", tmp_path / "child"
    j, waiter = opened(parent_path)
    j.create_session("s")
    followers.start(j)
    with Journal.open(child_path) as made:
        made.create_session("s")
    until(lambda: waiter.waiting == 1 and waiter.polls >= 1, "the parent's follower to wait")
    assert inotify_instances() == 1
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    report_r, report_w = os.pipe()
    child = os.fork()
    if child == 0:  # never returns into pytest
        status = 1
        try:
            _child(child_path, ready_w, go_r, report_w)
            status = 0
        finally:
            os._exit(status)
    for fd in (ready_w, go_r, report_w):
        os.close(fd)
    try:
        assert os.read(ready_r, 1) == b"r", "the child failed before it followed"
        with Journal.open(child_path, durability="os") as other:
            other.append("s", [EventIn("from-parent", b"x")])
        os.write(go_w, b"g")
        inherited, instances, delivered, reads = map(int, os.read(report_r, 100).split())
    finally:
        _, status = os.waitpid(child, 0)
        for fd in (ready_r, go_w, report_r):
            os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert inherited == 0  # (closed at the fork, with the parent's thread not there)
    assert instances == 1
    assert delivered == 1
    assert reads <= QUIET_READS  # (the child sleeps on its own instance, not polling)
    # The parent still sleeps on its watch, and is woken by another process's commit.
    append_in_another_process(parent_path)
    until(lambda: followers.got[0] == 1, "the parent's follower's event")
    time.sleep(0.1)
    assert quiet_head_reads([waiter]) <= QUIET_READS


def test_no_wake_up_reaches_a_closed_change_sources_descriptor(tmp_path: Path) -> None:
    """The instance's thread wakes a change source through its eventfd: once it closed,
    the number may be another file's (here a new eventfd, which takes the lowest free
    number), which must never be written to."""
    keep = DirectoryChanges.open([str(tmp_path)])  # (the instance stays open throughout)
    assert keep is not None
    writing = threading.Event()
    done = threading.Event()

    def write() -> None:
        with open(tmp_path / "f", "wb", buffering=0) as f:
            while not done.is_set():
                f.write(b"x")
                writing.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writing.wait(WAIT_S)
    written_to = 0
    try:
        for _ in range(200):
            changes = DirectoryChanges.open([str(tmp_path)])
            assert changes is not None
            changes.wait(0.001)
            changes.close()
            probe = os.eventfd(0, os.EFD_NONBLOCK)
            try:
                time.sleep(0.001)
                try:
                    os.eventfd_read(probe)
                    written_to += 1
                except BlockingIOError:
                    pass
            finally:
                os.close(probe)
    finally:
        done.set()
        writer.join(WAIT_S)
        keep.close()
    assert written_to == 0


def test_the_instances_thread_does_not_keep_a_process_from_exiting(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from journal._local.inotify import DirectoryChanges\n"
        "changes = DirectoryChanges.open([sys.argv[1]])\n"
        "assert changes is not None\n"
        "print('open', flush=True)\n"  # (and ends without closing it)
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        cwd=ROOT,
        timeout=WAIT_S,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout == b"open\n"


def test_close_leaves_no_inotify_thread_or_descriptor(tmp_path: Path) -> None:
    """`Journal.close()` joins the journal's waiter thread, and the last journal's close
    joins the thread of the process's inotify instance too: right after it returns, no
    journal thread and no inotify descriptor is left, so a check of
    `threading.enumerate()` and `/proc/self/fd` after `with Journal.open(...)` finds
    nothing. Until 2026-12-06 the close only told that thread to end: in 2 of 5 runs of an
    asyncio service's shutdown (a trial) `journal-inotify` was still listed after the
    close, with its inotify instance and eventfd open."""
    for n in range(20):
        with Journal.open(tmp_path / f"store-{n}", durability="os") as j:
            j.create_session("s")
            j.append("s", [EventIn("e", b"x")])
            stream = j.watch("s")
            assert next(iter(stream)).ordinal == 1
            waiter = threading.Thread(target=list, args=(stream,), daemon=True)
            waiter.start()
            until(lambda: inotify_instances() == 1, "the instance to open")
        waiter.join(WAIT_S)
        assert inotify_threads() == 0, f"run {n}: the inotify thread outlived close()"
        assert inotify_instances() == 0, f"run {n}: the inotify instance outlived close()"


def test_a_child_forked_as_the_last_change_source_leaves_keeps_no_inotify_descriptor(
    tmp_path: Path,
) -> None:
    """The last change source's close retires the instance at once (a later one opens
    another) and its thread closes the instance's descriptors a moment later. A child
    forked between the two inherited them: the fork's handler closed the copies of the
    process's current instance only, and the retired one was no longer that, so the child
    kept a copy of the parent's instance (an inotify instance of the user's 128, held
    while the child lived). Here the child is forked right after the last `leave`,
    before the instance's thread gets the interpreter (a long switch interval); in a run
    of 50 such forks 27 children kept it. The child closes every instance not closed
    yet."""
    until(lambda: inotify_instances() == 0, "the other tests' instances to close")
    kept = []
    interval = sys.getswitchinterval()
    children: list[tuple[int, int]] = []

    def fork_after_leave(frame: FrameType, event: str, arg: object) -> None:
        if event == "return" and frame.f_code is inotify_hub.leave.__code__ and not children:
            report_r, report_w = os.pipe()
            child = os.fork()
            if child == 0:  # never returns into pytest
                os.write(report_w, str(inotify_instances()).encode())
                os._exit(0)
            os.close(report_w)
            children.append((child, report_r))

    for _ in range(20):
        changes = DirectoryChanges.open([str(tmp_path)])
        assert changes is not None
        children.clear()
        sys.setswitchinterval(100)  # (this thread keeps the interpreter until it blocks)
        sys.setprofile(fork_after_leave)
        try:
            changes.close()
        finally:
            sys.setprofile(None)
            sys.setswitchinterval(interval)
        [(child, report_r)] = children
        try:
            kept.append(int(os.read(report_r, 100)))
        finally:
            os.close(report_r)
            _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    assert kept == [0] * 20
    assert inotify_instances() == 0
