"""Owner lock files (SPEC 7.8): a holder removes its lock file when it lets go, eviction
removes a killed owner's, so `locks/` does not grow with the sessions ever owned; and
removing files never lets two processes hold one session's lease at once."""

from __future__ import annotations

import hashlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _pipes import line, send

from journal import EventIn, Journal, RetentionPolicy, SessionNotWritable

ROOT = Path(__file__).resolve().parent.parent

# own("s") when told, hold until told, release. With "pause": stops (printing
# "unlinked") at the fault point right after its release removed the lock file, still
# holding the lock, until told again.
_HOLDER = """
import sys
from journal import Journal, OwnerBusy
from journal._local.files import FileOps

class PauseAfterUnlink(FileOps):
    def point(self, name, detail=None):
        if name == "lease.unlinked":
            print("unlinked", flush=True)
            sys.stdin.readline()

store, wait_s, pause = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "pause"
with Journal.open(store, durability="os", file_ops=PauseAfterUnlink() if pause else None) as j:
    print("opened", flush=True)
    sys.stdin.readline()
    try:
        owner = j.own("s", wait_s=wait_s)
    except OwnerBusy as e:
        print(f"busy {e.pid}", flush=True)
        sys.exit(0)
    print(f"won {owner.generation}", flush=True)
    sys.stdin.readline()
    owner.release()
    print("released", flush=True)
"""

# Own each session named, print "held", then sleep until killed.
_KEEPER = """
import sys, time
from journal import Journal
j = Journal.open(sys.argv[1], durability="os")
owners = [j.own(session_id) for session_id in sys.argv[2:]]
print("held", flush=True)
time.sleep(3600)
"""

# ROUNDS times: own("s") (waiting up to WAIT_S), and while holding it log "in PID" and
# "out PID" (O_APPEND) around a marker file made with O_EXCL: a second holder at the same
# time finds the marker ("overlap") and shows in the log. With WAIT_S 0 a busy lease is
# just another round.
_CONTENDER = """
import os, random, sys, time
from journal import Journal, OwnerBusy
store, log, rounds, wait_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
marker = log + ".inside"
rng = random.Random(os.getpid())
with Journal.open(store, durability="os") as j:
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    won = 0
    for _ in range(rounds):
        try:
            owner = j.own("s", wait_s=wait_s)
        except OwnerBusy:
            time.sleep(rng.random() / 1000)
            continue
        with owner:
            os.write(out, f"in {os.getpid()}\\n".encode())
            try:
                os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                print("overlap", flush=True)
            time.sleep(rng.random() / 500)
            try:
                os.unlink(marker)
            except FileNotFoundError:
                print("overlap", flush=True)
            os.write(out, f"out {os.getpid()}\\n".encode())
        won += 1
    print(f"won {won}", flush=True)
"""

# Until its stdin closes: remove the session's lock file whenever nobody holds it (what
# eviction does for a killed owner's file).
_SWEEPER = """
import sys, threading
from journal._local.files import DEFAULT_FILE_OPS
from journal._local.leases import lock_path, remove_lock
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
removed = 0
while not done.is_set():
    removed += remove_lock(lock_path(sys.argv[1], "s"), DEFAULT_FILE_OPS)
print(f"removed {removed}", flush=True)
"""


# As user UID (group 65534) under umask 077: own("s") and release it ROUNDS times, waiting
# up to 30 s; print how many times opening the lock file was refused (EACCES).
_GROUP_WRITER = """
import os, sys
import tempfile
from journal import Journal, EventIn
# A scratch store is used first, as root: the interpreter's files may be root's only, and
# py-lmdb imports a module when it opens an environment.
with tempfile.TemporaryDirectory() as scratch, Journal.open(scratch, durability="os") as j:
    j.create_session("s")
    with j.own("s"):
        j.append("s", [EventIn(type="t", data=b"x")])
os.setgroups([65534])
os.setgid(65534)
os.setuid(int(sys.argv[2]))
os.umask(0o077)
refused = 0
with Journal.open(sys.argv[1], durability="os") as j:
    for _ in range(int(sys.argv[3])):
        try:
            with j.own("s", wait_s=30):
                pass
        except PermissionError:
            refused += 1
print(f"refused {refused}", flush=True)
"""

NOBODY = 65534


def _env() -> dict[str, str]:
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, paths)))


def _spawn(script: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )


def _quiet(proc: subprocess.Popen[str], seconds: float) -> bool:
    """Whether `proc` prints nothing for `seconds`."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    return not ready


def _lock_file(store: Path, session_id: str) -> Path:
    digest = hashlib.sha256(session_id.encode()).hexdigest()[:32]
    return store / "locks" / f"owner-{digest}.lock"


def _owner_files(store: Path) -> list[str]:
    return sorted(name for name in os.listdir(store / "locks") if name.startswith("owner-"))


def _has_open(pid: int, path: Path) -> bool:
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            pass
    return False


def test_locks_stay_bounded_over_many_owned_sessions(tmp_path: Path) -> None:
    policy = RetentionPolicy(session_retention_ms=1)
    with Journal.open(tmp_path, durability="os", retention=policy) as j:
        for i in range(1, 301):
            j.create_session(f"s{i}")
            with j.own(f"s{i}") as owner:
                with owner.turn(request_id="r1") as turn:
                    turn.append([EventIn("message", b"{}")])
                assert _owner_files(tmp_path) == [_lock_file(tmp_path, f"s{i}").name]
            assert _owner_files(tmp_path) == []  # released: no file, session or not
            if i % 100 == 0:
                j.resolve_session(f"s{i}")
                time.sleep(0.002)
                j.apply_retention()
        assert os.listdir(tmp_path / "locks") == ["open.lock"]
        assert j.stats().sessions == {"open": 297}
        # Owned again and again: each own() makes the file anew, with the store's mode.
        for _ in range(3):
            with j.own("s1"):
                assert (_lock_file(tmp_path, "s1").stat().st_mode & 0o777) == 0o600
        assert os.listdir(tmp_path / "locks") == ["open.lock"]


def test_a_killed_owners_lock_file_goes_at_the_next_release_or_at_eviction(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    policy = RetentionPolicy(session_retention_ms=1)
    with Journal.open(store, durability="os", retention=policy) as j:
        for session_id in ("a", "b", "c"):
            j.create_session(session_id)
    keeper = _spawn(_KEEPER, store, "a", "b", "c")
    try:
        assert line(keeper) == "held"
        keeper.send_signal(signal.SIGKILL)
        keeper.wait(10)
    finally:
        keeper.kill()
        keeper.wait(10)
    left = _owner_files(store)
    assert left == sorted(_lock_file(store, s).name for s in ("a", "b", "c"))
    assert _lock_file(store, "a").read_text().split()[0] == str(keeper.pid)
    # A read-only journal reads and closes without creating or removing any of them.
    with Journal.open(store, readonly=True) as reader:
        assert [m.session_id for m in reader.list_sessions()] == ["a", "b", "c"]
    assert _owner_files(store) == left
    with Journal.open(store, durability="os", retention=policy) as j:
        with j.own("a") as owner:  # the killed owner's file, taken over
            assert owner.generation == 2
            assert _lock_file(store, "a").read_text().split()[0] == str(os.getpid())
        assert not _lock_file(store, "a").exists()
        j.resolve_session("b")
        j.resolve_session("c")
        with pytest.raises(SessionNotWritable):
            j.own("c")  # takes the killed owner's file, is refused, removes the file
        assert not _lock_file(store, "c").exists()
        assert _lock_file(store, "b").exists()
        time.sleep(0.002)
        assert sorted(j.apply_retention().evicted_sessions) == ["b", "c"]
    assert _owner_files(store) == []  # eviction removed b's


def test_a_waiter_on_a_removed_lock_file_does_not_share_the_lease(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
    path = _lock_file(store, "s")
    first = _spawn(_HOLDER, store, 0, "pause")
    waiter = _spawn(_HOLDER, store, 30, "")
    third = _spawn(_HOLDER, store, 0, "")
    procs = (first, waiter, third)
    try:
        assert [line(p) for p in procs] == ["opened"] * 3
        send(first)
        assert line(first) == "won 1"
        # The waiter opens the lock file and polls its flock.
        send(waiter)
        deadline = time.monotonic() + 10
        while not _has_open(waiter.pid, path):
            assert time.monotonic() < deadline, "the waiter never opened the lock file"
            time.sleep(0.01)
        # The first releases: it removes the file and stops there, still holding it.
        send(first)
        assert line(first) == "unlinked"
        assert not path.exists()
        # A newcomer creates the file anew and takes the lease meanwhile.
        send(third)
        assert line(third) == "won 2"
        # The first lets go of the removed file: the waiter gets its flock, sees that
        # the path names the newcomer's file now, and waits on that one.
        send(first)
        assert line(first) == "released"
        assert _quiet(waiter, 0.5), "the waiter took the lease while the newcomer held it"
        with Journal.open(store, durability="os") as j:
            owner = j.get_session("s").owner
            assert owner is not None and owner.pid == third.pid
        send(third)
        assert line(third) == "released"
        assert line(waiter) == "won 3"
        send(waiter)
        assert line(waiter) == "released"
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
    assert _owner_files(store) == []


def test_processes_contending_for_a_lease_never_hold_it_together(tmp_path: Path) -> None:
    store = tmp_path / "store"
    log = tmp_path / "holders.log"
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
    rounds = 40
    waiting = [_spawn(_CONTENDER, store, log, rounds, 30) for _ in range(3)]
    eager = _spawn(_CONTENDER, store, log, rounds * 3, 0)  # wait_s=0: busy or not
    sweeper = _spawn(_SWEEPER, store)
    try:
        answers = [line(p) for p in (*waiting, eager)]
        assert sweeper.stdin is not None
        sweeper.stdin.close()
        swept = line(sweeper)
    finally:
        for proc in (*waiting, eager, sweeper):
            proc.kill()
            proc.wait(10)
    assert answers[:3] == [f"won {rounds}"] * 3, answers
    assert answers[3].startswith("won "), answers
    assert swept.startswith("removed "), swept
    lines = log.read_text().splitlines()
    assert len(lines) == 2 * (3 * rounds + int(answers[3].split()[1]))
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):
        assert enter.startswith("in ") and leave == "out " + enter[3:], (enter, leave)
    assert _owner_files(store) == []
    with Journal.open(store, durability="os") as j:
        assert j.get_session("s").owner is None


def test_writers_of_a_group_shared_store_take_lock_files_each_other_just_made(
    public_dir: Path,
) -> None:
    # Each own() creates the lock file anew, and a writer whose umask is stricter than the
    # store's mode creates it narrower for a moment before it sets the mode: another
    # user of the group opening it then is refused (EACCES), and retries (SPEC 7.8).
    assert os.geteuid() == 0, "this test runs children as other users: run it as root"
    store = public_dir / "store"
    store.mkdir()
    os.chown(store, 0, NOBODY)
    os.chmod(store, 0o2770)
    with Journal.open(store, durability="os", file_mode=0o660) as j:
        j.create_session("s")
    writers = [_spawn(_GROUP_WRITER, store, uid, 300) for uid in (NOBODY, 54321, 54322)]
    try:
        answers = [line(w) for w in writers]
    finally:
        for writer in writers:
            writer.kill()
            writer.wait(10)
    assert answers == ["refused 0"] * 3
    assert _owner_files(store) == []
