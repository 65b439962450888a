"""A child forked while its parent releases an owner lease (SPEC 7.8, "A process that
forks while it holds a lease"): the lock dies with the owner, not with its child, also
when the fork lands inside the release.

The parent's release is paused at a fault point in another thread (its record queued for
commit, its record committed with the lock not yet dropped, the lock file removed with
its descriptor not yet closed), the parent forks, and the child reports the descriptors
of the lock file it holds and closes its copy of the journal. Meanwhile another process
waits in `own()` on the lock file it opened before the release: it must get the lease
once the parent's release returned, while the child still lives. Until 2026-12-07 the
release took the descriptor out of the lease before its commit, where the child's fork
handler did not look: the child kept a copy (the lock's open file, so the lock) for its
whole life, the waiter got `OwnerBusy` after all of its `wait_s`, and a child forked
after the commit removed the parent's lock file when it closed its journal.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _pipes import line, reap, send

from journal import Journal
from journal._local.files import FileOps
from journal._local.leases import lock_path

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

ROOT = Path(__file__).resolve().parent.parent
CHILD_S = 20.0  # a bound for liveness only
WAIT_S = 8.0  # the waiter's wait_s: far above what a release takes

# Open the store; at "go", own("s") waiting up to WAIT_S: "won GENERATION" or
# "busy PID"; then release and exit.
_WAITER = """
import sys
from journal import Journal, OwnerBusy
with Journal.open(sys.argv[1], durability="os") as j:
    print("opened", flush=True)
    sys.stdin.readline()
    try:
        owner = j.own("s", wait_s=float(sys.argv[2]))
    except OwnerBusy as e:
        print(f"busy {e.pid}", flush=True)
        sys.exit(0)
    print(f"won {owner.generation}", flush=True)
    owner.release()
"""


class PauseRelease(FileOps):
    """Pauses the thread named "releaser" once at the fault point `at`; records the
    fault points that thread passes."""

    def __init__(self, at: str) -> None:
        self.at = at
        self.armed = False
        self.paused = threading.Event()
        self.go = threading.Event()
        self.passed: list[str] = []

    def point(self, name: str, detail: object = None) -> None:
        if threading.current_thread().name != "releaser":
            return
        self.passed.append(name)
        if self.armed and name == self.at:
            self.armed = False
            self.paused.set()
            self.go.wait(CHILD_S)


def _lock_fds(path: str, pid: int | str = "self") -> int:
    """How many of process `pid`'s descriptors name the lock file at `path` (removed
    or not)."""
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            held += os.readlink(f"/proc/{pid}/fd/{fd}").startswith(path)
    return held


@pytest.mark.parametrize(
    "at",
    [
        "commit.queued",  # the release's record is on its way to commit
        "lease.released",  # recorded; the lock is dropped next
        "lease.unlinked",  # the lock file is removed; its descriptor is closed next
    ],
)
def test_a_child_forked_during_a_release_holds_nothing_of_the_lock(tmp_path: Path, at: str) -> None:
    store = tmp_path / "store"
    lock = lock_path(str(store), "s")
    ops = PauseRelease(at)
    j = Journal.open(store, durability="os", file_ops=ops)
    waiter = subprocess.Popen(
        [sys.executable, "-c", _WAITER, str(store), str(WAIT_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    child = 0
    try:
        j.create_session("s")
        owner = j.own("s")
        assert line(waiter) == "opened"
        send(waiter)
        deadline = time.monotonic() + CHILD_S
        while not _lock_fds(lock, waiter.pid):  # (it polls the parent's lock now)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        ops.armed = True
        releaser = threading.Thread(target=owner.release, name="releaser")
        releaser.start()
        assert ops.paused.wait(CHILD_S)
        report_r, report_w = os.pipe()
        hold_r, hold_w = os.pipe()
        child = os.fork()
        if child == 0:
            code = 1
            try:
                os.close(report_r)
                os.close(hold_w)
                held = _lock_fds(lock)
                j.close()  # (its copy: it must neither record nor remove anything)
                os.write(report_w, f"{held}\n".encode())
                os.read(hold_r, 1)  # (lives until the parent is done)
                code = 0
            finally:
                os._exit(code)
        os.close(report_w)
        os.close(hold_r)
        with os.fdopen(report_r) as report:
            held_in_child = int(report.readline())
        ops.go.set()
        releaser.join(CHILD_S)
        assert not releaser.is_alive()
        # The parent removed its own lock file (the child never does).
        assert ops.passed[-1] == "lease.unlinked", ops.passed
        started = time.monotonic()
        answer = line(waiter)  # (the child lives on meanwhile)
        waited = time.monotonic() - started
        os.close(hold_w)
        _, status = os.waitpid(child, 0)
        child = 0
        assert os.waitstatus_to_exitcode(status) == 0
        assert (held_in_child, answer) == (0, "won 2"), waited
        assert waiter.wait(CHILD_S) == 0
        assert not os.path.exists(lock)
    finally:
        ops.go.set()
        if child:
            os.kill(child, 9)
            os.waitpid(child, 0)
        reap(waiter)
        j.close()


# Own "s", release it in a thread paused once the release's record is queued for commit,
# fork a child that sleeps, print the child's pid, then sleep (until killed).
_FORKS_IN_RELEASE = """
import os, sys, threading, time
from journal import Journal
from journal._local.files import FileOps

class Pause(FileOps):
    armed = False
    def point(self, name, detail=None):
        if self.armed and name == "commit.queued" and threading.current_thread().name == "r":
            self.armed = False
            queued.set()
            time.sleep(3600)

queued = threading.Event()
ops = Pause()
j = Journal.open(sys.argv[1], durability="os", file_ops=ops)
j.create_session("s")
owner = j.own("s")
ops.armed = True
threading.Thread(target=owner.release, name="r", daemon=True).start()
queued.wait()
child = os.fork()
if child == 0:
    time.sleep(3600)
    os._exit(0)
print(child, flush=True)
time.sleep(3600)
"""


def test_an_owner_killed_in_its_release_is_gone_while_its_child_lives(tmp_path: Path) -> None:
    """The owner is SIGKILLed while its release's record is on its way to commit, after
    it forked: the record names it still, but it is gone (its lock with it), and the
    next `own()` takes the lease at once. Until 2026-12-07 its child held the lock for
    its whole life: the dead owner was listed as alive and `own()` raised `OwnerBusy`
    naming the dead pid."""
    store = tmp_path / "store"
    owner = subprocess.Popen(
        [sys.executable, "-c", _FORKS_IN_RELEASE, str(store)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    child = 0
    try:
        child = int(line(owner))
        owner.kill()
        owner.wait(CHILD_S)
        with Journal.open(store, durability="os") as j:
            assert j.get_session("s").owner is None
            with j.own("s") as taken:
                assert taken.generation == 2
        assert os.path.exists(f"/proc/{child}")  # (it lived all along)
    finally:
        if child:
            os.kill(child, 9)  # (the owner's child: reaped by init once its parent died)
        reap(owner)
