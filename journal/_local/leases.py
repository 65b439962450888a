"""Owner leases of the local engine: an exclusive `flock` per session under `locks/`
(released by the kernel when the owning process dies), and the owner's identity (pid,
process start time, host, boot id) recorded in the log, so anyone can tell a live owner
from a dead one, and a reused pid from its first holder.

Start times come from `/proc/<pid>/stat` (field 22, clock ticks after boot) on Linux;
where `/proc` is missing the start time is 0 and liveness falls back to "the pid exists"
(a reused pid then counts as alive: uncertain is alive).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Final

from ..engine import AcquireLease, ReleaseLease
from ..errors import JournalClosed, OwnerBusy
from ..sessions import SessionRow
from .files import FileOps, Permissions, open_regular

__all__ = [
    "BOOT_ID",
    "INITIAL_PID_NAMESPACE",
    "PROBE_S",
    "PROCESS_BOOT",
    "LocalLease",
    "OwnerRounds",
    "acquire_operation",
    "busy",
    "drop_lock",
    "holder_pid",
    "identity",
    "lease_held",
    "lock_path",
    "owner_alive",
    "owner_process_alive",
    "process_boot",
    "process_start_time",
    "remove_evicted_locks",
    "remove_lock",
    "take_lock",
]

_POLL_S: Final = 0.01
# How long a lock file that refuses to open (EACCES) is retried: a writer of a
# group-shared store that just created it sets the store's mode right after creating.
_GRACE_S: Final = 0.1
_GRACE_POLL_S: Final = 0.001
# How long a lock found busy is tried again before it counts as busy (`_flock_until`).
_PROBE_GRACE_S: Final = 0.01

_log = logging.getLogger("journal")


def _read_boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


# This machine's boot (constant for the life of the process: read once).
BOOT_ID: Final = _read_boot_id().encode()


def _read_pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:  # (no /proc: no pid namespaces either)
        return ""


# The initial pid namespace (the kernel's PROC_PID_INIT_INO): the host's own processes.
INITIAL_PID_NAMESPACE: Final = "pid:[4026531836]"


def process_boot(boot_id: str, namespace: str) -> str:
    """What a record names as the boot of a process of `namespace` (`PROCESS_BOOT`)."""
    if not boot_id or namespace in ("", INITIAL_PID_NAMESPACE):
        return boot_id
    return f"{boot_id}/{namespace}"


# What owner and importer records name as their process's boot: the machine's boot id
# and, after a slash, this process's pid namespace unless it is the initial one. A pid
# names a process only within its namespace, and containers of one machine sharing a
# store often share its boot id and host name (a Kubernetes pod's, `--network host`): a
# pid checked from another namespace names nobody, or somebody else. The initial
# namespace's records name the boot id alone, as releases before 2026-12-03 wrote them
# all and compare them (whole): those read the host's records of this release as theirs.
PROCESS_BOOT: Final = process_boot(BOOT_ID.decode(), _read_pid_namespace())


def process_start_time(pid: int) -> int:
    """The start time of process `pid` in clock ticks after boot; 0 when unknown, -1 when
    no such process exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        # Not shown is not gone: `/proc` mounted `hidepid=2` hides other users' processes
        # (`_HIDDEN` below); the kernel says which (EPERM: it lives, hidden).
        return _exists(pid)
    except OSError:
        return 0
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = raw[raw.rfind(b")") + 2 :].split()
    if fields[:1] == [b"X"] or (fields[:1] == [b"Z"] and _threads(pid) <= 1):
        # A zombie (dead, not yet reaped by its parent: a supervisor's child that was
        # killed) holds no file and no lock any more: it is gone. (A process whose main
        # thread ended while others run shows Z too: it has more threads.)
        return -1
    try:
        return int(fields[19])  # field 22 overall
    except (IndexError, ValueError):
        return 0


def _threads(pid: int) -> int:
    """How many threads process `pid` has (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _exists(pid: int) -> int:
    if pid <= 0:
        return -1  # (never a process: kill() would ask about a process group)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return -1
    except PermissionError:
        return 0
    return 0


def owner_alive(
    row: SessionRow, host: str, boot_id: str, lock_file: str | None = None
) -> bool | None:
    """Whether the owner the row records is alive (None: on another host, cannot tell).
    With `lock_file` (the session's lease lock), a process that lives on without holding
    it (it called exec, which closed the lock's descriptor) is not the owner any more."""
    alive = owner_process_alive(row, host, boot_id)
    if lock_file is None or row.owner_host != host or not row.owner_pid:
        return alive
    if alive is False:
        return lease_held(lock_file) is True  # (see `_HIDDEN`)
    # The pid is the owner's (or may be: uncertain is alive), or it names nobody here
    # (another pid namespace, None): the owner unless the lock is free.
    return lease_held(lock_file) is not False


# _HIDDEN: a pid that `/proc` does not show is not proof that its process is gone:
# `/proc` mounted with `hidepid=2` hides other users' processes (an observer of a store
# shared with a group, section 10, would have judged every live owner gone and raised
# `OutcomeUnknown` for every turn in progress). So a lease lock that is still held says
# its owner lives; a dead owner's lock is free (the kernel releases it at exit, a
# zombie's too), and a reused pid's owner is dead.


def owner_process_alive(
    row: SessionRow, host: str, boot_id: str, started: dict[int, int] | None = None
) -> bool | None:
    """The process part of `owner_alive`: False when the recorded process is gone, True
    while it lives (or may: uncertain is alive), None when its pid cannot tell (another
    host, another pid namespace). `started`: the start times read so far, by pid (a
    round of checks reads each once, `OwnerRounds`)."""
    if not row.owner_pid:
        return False
    if row.owner_host != host:
        return None
    boot, _, namespace = row.owner_boot_id.partition("/")
    own_boot, _, own_namespace = boot_id.partition("/")
    if boot != own_boot:
        return False  # this machine restarted since: that process is gone
    if namespace != own_namespace:
        # Another pid namespace of this machine (`PROCESS_BOOT`; none named: the initial
        # one): its pids are not ours to look up; only the lease's lock can tell.
        return None
    if started is None:
        start_time = process_start_time(row.owner_pid)
    else:
        start_time = started.get(row.owner_pid, -2)
        if start_time == -2:
            start_time = started[row.owner_pid] = process_start_time(row.owner_pid)
    if start_time < 0:
        return False
    # (A different start time: the pid was reused.)
    return not (start_time and row.owner_start_time and start_time != row.owner_start_time)


# How long a round of owner checks (`OwnerRounds`) may count a session's lease lock as
# held without probing it again while its owner's pid lives with its start time (one of
# each such owner's locks, the least recently probed, is probed every round: when it is
# free, all of them are).
PROBE_S: Final = 1.0

# A lease: session, incarnation and generation.
_Lease = tuple[str, int, int]


class OwnerRounds:
    """The live followers' rounds of owner checks of a store (`LocalEngine.owners_alive`,
    SPEC 7.8): `owner_alive` of each row, at a fraction of its cost when many unsettled
    turns share an owner. Each owner's start time is read once a round (a dead or reused
    pid is seen in the next round). A lock found held less than `PROBE_S` ago whose
    owner's pid lives on is probed again only when due, or when another lock of that
    owner is found free this round; one of its locks, the least recently probed, is
    probed every round. A process that called exec or closed its journal lost every
    lock at once: seen in the next round. A lease let go of alone without a record (its
    release's commit failed) is seen within `PROBE_S`, or as many rounds as its owner
    has locks checked, not in the next round. (Journals over one engine share it, each
    calling from its own thread: a round adds its probes to those of other rounds still
    younger than `PROBE_S`, so one journal's round does not make the next round of
    another probe every lock again.)"""

    def __init__(self, store: str, host: str, probe_s: float = PROBE_S) -> None:
        self._store = store
        self._host = host
        self._probe_s = probe_s
        # The leases probed held less than `probe_s` ago (by any round, of any journal
        # over the engine): when, and the lock file; rounds merge theirs under the lock.
        self._probed: dict[_Lease, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def check(self, rows: list[SessionRow]) -> list[bool | None]:
        now = time.monotonic()
        last, probed = self._probed, dict[_Lease, tuple[float, str]]()
        started: dict[int, int] = {}
        alive: list[bool | None] = []
        skipped: dict[int, list[tuple[int, _Lease]]] = {}  # by owner pid
        freed: set[int] = set()  # owner pids alive with a lock found free

        def probe_free(index: int, lease: _Lease, path: str) -> bool:
            """Probe the lock, answer for its row; whether it was free."""
            held = lease_held(path)
            probed[lease] = (now if held else 0.0, path)
            alive[index] = held is not False
            return held is False

        for row in rows:
            lease = (row.session_id, row.incarnation, row.owner_generation)
            at, path = last.get(lease) or (0.0, lock_path(self._store, row.session_id))
            process = owner_process_alive(row, self._host, PROCESS_BOOT, started)
            alive.append(process)
            if row.owner_host != self._host or not row.owner_pid:
                continue
            if process is False:
                alive[-1] = lease_held(path) is True  # (see `_HIDDEN`)
                continue
            if process is True and at and now - at < self._probe_s:
                probed[lease] = (at, path)
                skipped.setdefault(row.owner_pid, []).append((len(alive) - 1, lease))
            elif probe_free(len(alive) - 1, lease, path) and process is True:
                freed.add(row.owner_pid)
        for pid, leases in skipped.items():
            if pid not in freed:
                first = min(range(len(leases)), key=lambda i: probed[leases[i][1]][0])
                index, lease = leases.pop(first)
                if not probe_free(index, lease, probed[lease][1]):
                    continue
            for index, lease in leases:
                probe_free(index, lease, probed[lease][1])
        with self._lock:
            # Keep other rounds' probes (another journal's rows) while they are young; a
            # lease this round probed or found gone keeps only this round's answer.
            kept = {
                lease: entry
                for lease, entry in self._probed.items()
                if lease not in probed and entry[0] and now - entry[0] < self._probe_s
            }
            kept.update(probed)
            self._probed = kept
        return alive


def lease_held(path: str) -> bool | None:
    """Whether a process holds the lease lock at `path` (None: cannot tell). Probed with
    a shared lock held for a few microseconds (`take_lock` allows for it); a missing file
    is a lock nobody holds (a holder removes it only when it lets go)."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return None  # (a FIFO there, say: uncertain is alive)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # (releases the probe's lock)
    return False


def lock_path(store: str, session_id: str) -> str:
    digest = hashlib.sha256(session_id.encode()).hexdigest()[:32]
    return os.path.join(store, "locks", f"owner-{digest}.lock")


def take_lock(
    path: str, wait_s: float, permissions: Permissions, check: Callable[[], None] | None = None
) -> int | None:
    """An fd holding an exclusive flock on `path`, or None if it stayed busy `wait_s`.
    `check` is called between polls of a busy lock: what it raises ends the wait (the
    engine's `check_usable`, so a close by another thread ends it with `JournalClosed`).

    The lock is the flock of the file `path` names *now*: a holder removes the file when
    it lets go (`drop_lock`), so a process that opened the file before that and gets its
    flock after finds the path gone or naming another file (a newer one, perhaps locked by
    someone else), and opens the path again. Such a retry is not a busy lease: it does not
    wait and is not bound by `wait_s`.

    The holder writes its identity into the file (`<pid> <start time> <host>\n`), so a
    process that finds the lock busy can name the holder before its record commits."""
    permissions.make_dirs(os.path.dirname(path))
    deadline = time.monotonic() + wait_s
    while True:
        fd = _open_lock(path, permissions)
        try:
            taken = _flock_until(fd, deadline, _PROBE_GRACE_S, check)
            if taken:
                held = os.fstat(fd)
                if _names(path, held):
                    pid, start_time, host = identity()
                    if held.st_size:
                        os.ftruncate(fd, 0)  # a killed holder's line (a new file is empty)
                    os.pwrite(fd, f"{pid} {start_time} {host}\n".encode(), 0)
                    return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        if not taken:
            return None
        # Its holder removed the file meanwhile: try the one the path names now.


def _flock_until(
    fd: int, deadline: float, grace_s: float = 0.0, check: Callable[[], None] | None = None
) -> bool:
    """Take the exclusive flock of `fd`, polling until `deadline`; False if still busy.
    Busy for under `grace_s` is not busy (`take_lock`: `lease_held` probes a free lock
    with a shared one for microseconds). `check` runs before each poll's sleep."""
    grace = time.monotonic() + grace_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if check is not None:
                check()
            now = time.monotonic()
            if now < grace:
                time.sleep(_GRACE_POLL_S)
            elif now >= deadline:
                return False
            else:
                time.sleep(_POLL_S)


def _open_lock(path: str, permissions: Permissions) -> int:
    """Open (or create) the lock file. A file another writer of a group-shared store just
    created can refuse us for a moment (its umask narrowed the mode until that writer sets
    the store's, right after creating it): retried for `_GRACE_S`."""
    give_up = time.monotonic() + _GRACE_S
    while True:
        try:
            return permissions.open_or_create(path, os.O_RDWR)
        except PermissionError:
            if time.monotonic() >= give_up:
                raise
            time.sleep(_GRACE_POLL_S)


def _names(path: str, held: os.stat_result) -> bool:
    """Whether `path` names the file `held` describes."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    return (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev)


def drop_lock(fd: int, path: str, ops: FileOps) -> None:
    """Let go of a lock `take_lock` (or `remove_lock`) took: remove the file, then close.

    Safe because the file is removed only by a process holding its flock, and only while
    the path still names it: nobody else can remove or replace it meanwhile (a new file
    at the path is created only where none exists), and whoever gets the flock of the
    removed file afterwards sees that the path no longer names it (`take_lock`). A failed
    removal is only logged: the lock goes with the fd anyway, and the file is removed
    by its next holder or when its session is evicted."""
    try:
        _unlink_lock(fd, path, ops)
    finally:
        os.close(fd)


def _unlink_lock(fd: int, path: str, ops: FileOps) -> None:
    """Remove the lock file at `path` if it is still the one open as `fd` (`drop_lock`)."""
    try:
        if _names(path, os.fstat(fd)):
            ops.unlink(path)
            ops.point("lease.unlinked", path)
    except OSError as e:
        _log.warning("could not remove the lock file %s: %s", path, e)


def remove_lock(path: str, ops: FileOps) -> bool:
    """Remove the lock file at `path` if nobody holds it (the file of an evicted session
    whose owner was killed); False if it was held (or missing). Never waits: a held
    lock's holder removes the file itself when it lets go."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        taken = _flock_until(fd, 0.0)
    except BaseException:
        os.close(fd)
        raise
    if not taken:
        os.close(fd)
        return False
    drop_lock(fd, path, ops)
    return True


# Every lease this process holds (a deliberate module-level registry), from its taking
# until its release has closed the lock's fd (a release in flight included): a forked
# child closes its copies of their lock fds at once, so the lock dies with the owner
# process and not with the last of its children (flock belongs to the shared open file).
_HELD: Final[weakref.WeakSet[LocalLease]] = weakref.WeakSet()


def remove_evicted_locks(store: str, session_ids: list[str], ops: FileOps) -> None:
    """Remove the lock files evicted sessions left: a holder removes its file when it
    lets go, so only the file of an owner killed while holding the lease is still there
    (and removed here, unless someone holds it again). After the commit, like the segment
    files retention deletes; a failure is logged, never the batch's."""
    for session_id in session_ids:
        path = lock_path(store, session_id)
        try:
            remove_lock(path, ops)
        except OSError as e:
            _log.warning("could not remove the lock file %s: %s", path, e)


def _close_inherited() -> None:
    for lease in list(_HELD):
        lease.forget_inherited()
    _HELD.clear()


os.register_at_fork(after_in_child=_close_inherited)


class LocalLease:
    """This process's hold on a session's owner lease (see the module docstring):
    `submit` records the release, the fd holds the lock at `path` until then (releasing
    removes the file: `drop_lock`), `forget` tells the engine (which releases what is
    still held when it closes)."""

    def __init__(
        self,
        submit: Callable[[ReleaseLease], object],
        session_id: str,
        incarnation: int,
        generation: int,
        lock: tuple[int, str, FileOps],
        forget: Callable[[LocalLease], None],
    ) -> None:
        self.session_id = session_id
        self.incarnation = incarnation
        self.generation = generation
        self._submit = submit
        fd, self._path, self._ops = lock
        # (The lock's fd and its file, for a forked child to find its copy whatever the
        # parent's release had done at the fork: `forget_inherited`.)
        self._fd = fd
        held = os.fstat(fd)
        self._file = (held.st_dev, held.st_ino)
        # (The lock's fd while held, taken out in one step: once, by whichever comes
        # first, and with no lock, which a signal handler's close in the thread that was
        # taking it would wait for, for good.)
        self._fds = [fd]
        # (Its fd once the release is recorded, until the lock is dropped: `_drop`.)
        self._undropped: list[int] = []
        self._forget = forget
        _HELD.add(self)

    @property
    def held(self) -> bool:
        return bool(self._fds)

    def holds(self, path: str) -> bool:
        """Whether this lease holds the lock file at `path` now."""
        return self.held and self._path == path

    def forget_inherited(self) -> None:
        """In a forked child: close this copy of the lock fd; the lease (and its file) is
        the parent's. Also when the fork came in the middle of the parent's release (its
        record on its way to commit, its lock being dropped), where the release had
        taken the fd out of `_fds` already: the copy is found by its number, and closed
        if it still is the lock's file (the parent may have closed it before the fork,
        and opened another file under that number; in the moment between that close and
        the end of the release, the lease is still listed in `_HELD`). Nothing is left for
        this copy of the lease to release or drop: a release here (the child's close of
        its journal) neither records the parent's release nor removes its lock file."""
        self._fds = []
        self._undropped = []
        try:
            copy = os.fstat(self._fd)
            if (copy.st_dev, copy.st_ino) == self._file:
                os.close(self._fd)
        except OSError:
            pass  # (closed in the parent before the fork)

    def release(self) -> None:
        # Atomically (the journal's close, the owner and a dropped owner's release thread
        # may race, and a signal handler's close runs between any two steps of the
        # thread it interrupts): the fd is closed once, never a number reused since by
        # another file.
        # Taken with no call between, so no check point where a Ctrl+C can land (the
        # return of a call is one: a close cut short right after `pop()` returned lost
        # the fd, and with it the lock, for the life of the process; a review); a
        # release cut short before the lock was dropped is finished by the next one.
        # The lock is dropped only once the release's record committed (until then the
        # row names this process as the owner, and a free lock would tell every other
        # process that it is gone: `owner_alive`); the lease stays in `_HELD` until the
        # lock's fd is closed, so a child forked meanwhile closes its copy too
        # (`forget_inherited`; until 2026-12-07 it kept it for its whole life).
        fds, self._fds = self._fds, []
        if not fds:
            self._drop()
            return
        try:
            self._submit(ReleaseLease(self.session_id, self.incarnation, self.generation))
        except JournalClosed:
            pass  # the journal closed first: the lock goes with the fd, no record
        finally:
            self._undropped = fds
            self._ops.point("lease.released", self._path)
            self._drop()
            _HELD.discard(self)
            self._forget(self)

    def _drop(self) -> None:
        """Drop the lock, if a release left it to drop (once: taken as `release` takes it,
        and closed in the frame that took it, so no Ctrl+C loses it)."""
        undropped, self._undropped = self._undropped, []
        if not undropped:
            return
        fd = undropped[0]
        try:
            _unlink_lock(fd, self._path, self._ops)
        finally:
            os.close(fd)


def identity(pid: int | None = None) -> tuple[int, int, str]:
    """(pid, start time, host) of this process."""
    pid = os.getpid() if pid is None else pid
    return pid, max(process_start_time(pid), 0), socket.gethostname()


def holder_pid(path: str) -> int:
    """The pid the lock file names (0 while the holder has not written it yet)."""
    for _ in range(50):
        try:
            with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as f:
                fields = f.read(512).split()
        except FileNotFoundError:
            return 0
        if fields and fields[0].isdigit():
            return int(fields[0])
        time.sleep(_POLL_S)  # taken a moment ago: the holder writes its line right away
    return 0


def busy(session_id: str, path: str, wait_s: float) -> OwnerBusy:
    pid = holder_pid(path)
    holder = f"pid {pid}" if pid else "another process"
    # (This process: one of its own leases holds the lock, whatever pid the file names.)
    mine = any(lease.holds(path) for lease in list(_HELD))
    return OwnerBusy.held(session_id, pid, f"{holder} (waited {wait_s:g} s)", mine)


def acquire_operation(session_id: str, boot_id: str) -> AcquireLease:
    pid, start_time, host = identity()
    return AcquireLease(session_id, pid, start_time, host, boot_id)
