"""Helper processes for tests/test_compaction_processes.py and tests/test_readonly.py
(run as `python tests/_procs_retention.py COMMAND ...`).

    reader STORE SESSION MODE MAX_BYTES SEED
        Print `ready`, then follow SESSION from the start (MODE `watch`: one watch; MODE
        `replay`: repeated replays from the last cursor until the session is terminal and
        drained), printing `ev ORDINAL OK|BAD` per event. On `CursorExpired` print
        `expired EARLIEST` and go on from its `resume_cursor`. Print `done` and exit 0 when
        the session is resolved and drained; anything else is a traceback and exit 1.
    compactor STORE SEGMENT_BYTES SEED
        Print `ready`, then run `compact()` (random dead_share) and `apply_retention()` in a
        loop until a line arrives on stdin; print `rewrote N deleted M` and exit 0.
    compact_interleaved STORE
        Print `ready`, wait for a line, run `compact(dead_share=0.0)` pausing twice on the
        first segment it rewrites: after writing the copy (`rewritten`, then wait for a
        line) and right after renaming it into place (`replaced`, then wait for a line);
        print `rewrote NAME,...` and exit 0.
    compact_paused STORE POINT
        Print `ready`, wait for a line, then run `compact()`, pausing (`paused`, then wait
        for a line) at the first hit of fault point POINT; print `rewrote NAME,...` and exit
        0 (a parent kills it at the pause: a crash there).
    compact_paused_before_the_swap_commits STORE
        As `compact_paused`, pausing at the view's commit of the first swap's batch (its
        copy renamed into place, its sidecar written).
    retention_paused STORE [POINT]
        Print `ready`, wait for a line, then run `apply_retention()`, pausing (`listed`,
        then wait for a line) when it first reads a sealed segment's sidecar (at the first
        hit of fault point POINT instead, printing `paused`, when given); print `deleted N`
        and exit 0.
    retention STORE NOW_MS SESSION_RETENTION_MS
        Open the store with that session retention, run `apply_retention(now_ms=NOW_MS)`, print
        `evicted ID,ID deleted N` and exit 0.
    ro_watch STORE SESSION
        Drop to uid/gid 65534, open the store read-only, print `sessions ID,ID,...`, then
        `ready`, then watch SESSION printing `ev ORDINAL DIGEST`; `done` when it ends.
    ro_watch_paused STORE SESSION
        As `ro_watch`, but the first time the reader scans the active segment's tail after
        `ready` it prints `paused` right after reading a chunk of it and waits for a line on
        stdin before using that chunk (a reader descheduled at the worst moment).
    ro_read STORE
        Drop to uid/gid 65534, open read-only, and print `session ID STATE FIRST LAST DIGEST`
        for every session (DIGEST over all its retained events); after closing, print
        `left behind [NAME, ...]` (temporary directories it created and did not remove),
        then `done`.
    ro_open STORE
        Drop to uid/gid 65534 and try to open read-only; print `opened` or `error CLASS CODE`.
    rw_open STORE
        The same, writable; the error line adds the errno and the message.
    writer STORE SEGMENT_BYTES
        A long-lived writer opened without a policy (so with the store's recorded one):
        create session `s`, print `ready`, then per line `append N` on stdin append N
        batches of one 300-byte event and print `s FIRST_ORDINAL LAST_ORDINAL`; exit 0 at
        end of input.

Payloads are derived from the ordinal (`payload`), so a reader recognises a wrong event.
Everything is imported before privileges are dropped: site-packages may be unreadable to
the unprivileged user. `Child` is the parent's side: it starts a command and collects its
output lines.
"""

from __future__ import annotations

import hashlib
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402, F401
import zstandard  # noqa: E402, F401

import journal  # noqa: E402
from journal import CursorExpired, Journal  # noqa: E402
from journal._local.files import FAULT_POINTS, FileOps  # noqa: E402

NOBODY = 65534
START_S = 60.0  # generous: interpreter start and imports on a loaded 2-core box


class Child:
    """A command of this file (or of the helper file `script`) in a subprocess; stdout
    lines are collected by a thread."""

    def __init__(
        self, *args: str, env: Mapping[str, str] | None = None, script: str = __file__
    ) -> None:
        environment = dict(os.environ if env is None else env)
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT), environment.get("PYTHONPATH")])
        )
        environment["PYTHONDONTWRITEBYTECODE"] = "1"
        # (What a child killed by the test leaves in its temporary directory, a read-only
        # reader's private view say, stays beside its store, under the test's tmp_path, not
        # in the tests' shared one; open to all, as the shared one is, for the children
        # that run as NOBODY. ARGS name the store after the command.)
        scratch = Path(args[1]).parent / "child-tmp"
        scratch.mkdir(exist_ok=True)
        scratch.chmod(0o1777)
        environment["TMPDIR"] = str(scratch)
        self.proc = subprocess.Popen(
            [sys.executable, script, *args],
            cwd="/",
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        self.seen: list[str] = []
        self.pumps = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put)),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append)),
        ]
        for pump in self.pumps:
            pump.daemon = True
            pump.start()

    @staticmethod
    def _pump(stream: object, sink: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            sink(line)  # type: ignore[operator]

    def next_line(self, timeout: float = START_S) -> str:
        """The next line printed (without its newline); AssertionError after `timeout`."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise AssertionError(f"child printed nothing for {timeout}s: {self.err()}") from None
        self.seen.append(line.rstrip("\n"))
        return self.seen[-1]

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def wait(self, timeout: float) -> int:
        """Exit status (after every output line was collected); kills it after `timeout`."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"child still running after {timeout}s: {self.err()}") from None
        for pump in self.pumps:
            pump.join(10)
        while not self.lines.empty():
            self.seen.append(self.lines.get_nowait().rstrip("\n"))
        return code

    def err(self) -> str:
        return "".join(self.stderr)[-4000:]


def payload(session_id: str, ordinal: int, size: int) -> bytes:
    """The one payload event `ordinal` of `session_id` may carry (given its size)."""
    prefix = f"{session_id}:{ordinal}:".encode()
    return prefix + random.Random(prefix).randbytes(max(0, size - len(prefix)))


def payload_ok(session_id: str, ordinal: int, data: bytes) -> bool:
    return data == payload(session_id, ordinal, len(data))


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def drop_privileges() -> None:
    """Become the unprivileged user, after a scratch store is opened, written, read and
    closed here as root: the interpreter's files may be readable by root only (CI's Python
    lives under /root), so every module a journal imports on first use (py-lmdb imports one
    when it opens an environment) must be loaded first."""
    with tempfile.TemporaryDirectory() as scratch:
        with Journal.open(scratch, durability="os") as j:
            j.create_session("s")
            j.append("s", [journal.EventIn(type="t", data=b"x")])
            list(j.replay("s"))
        with Journal.open(scratch, create=False, readonly=True) as j:
            list(j.replay("s"))
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _freeze_on_sigusr1(store: str) -> None:
    """SIGUSR1 freezes this process's main thread until `STORE.freeze` is removed: a slow
    reader, frozen between bytecodes. (SIGSTOP froze it anywhere, also inside LMDB while
    it held the reader table's lock, which then blocked every process of the store.)"""
    flag = Path(store + ".freeze")

    def freeze(signum: int, frame: object) -> None:
        ack = Path(store + ".frozen")
        ack.touch()
        while flag.exists():
            time.sleep(0.001)
        ack.unlink(missing_ok=True)  # (a nested freeze may have removed it)

    signal.signal(signal.SIGUSR1, freeze)


def reader(store: str, session_id: str, mode: str, max_bytes: str, seed: str) -> None:
    rng = random.Random(int(seed))
    budget = int(max_bytes)
    _freeze_on_sigusr1(store)
    with Journal.open(store, create=False, durability="os") as j:
        emit("ready")
        cursor: str | None = None
        while True:
            try:
                if mode == "watch":
                    for event in j.watch(session_id, cursor=cursor, max_bytes=budget):
                        ok = payload_ok(session_id, event.ordinal, event.data)
                        emit(f"ev {event.ordinal} {'OK' if ok else 'BAD'}")
                        cursor = event.cursor
                        if rng.random() < 0.02:
                            time.sleep(rng.uniform(0.001, 0.02))  # a slow observer
                    break
                terminal = j.get_session(session_id).state.terminal
                delivered = False
                for event in j.replay(session_id, cursor=cursor, max_bytes=budget):
                    ok = payload_ok(session_id, event.ordinal, event.data)
                    emit(f"ev {event.ordinal} {'OK' if ok else 'BAD'}")
                    cursor = event.cursor
                    delivered = True
                    if rng.random() < 0.02:
                        time.sleep(rng.uniform(0.001, 0.02))
                if terminal and not delivered:
                    break
                if not delivered:
                    time.sleep(0.005)
            except CursorExpired as e:
                emit(f"expired {e.earliest_ordinal}")
                cursor = e.resume_cursor
        emit("done")


def compactor(store: str, segment_bytes: str, seed: str) -> None:
    rng = random.Random(int(seed))
    finished = threading.Event()

    def wait_for_line() -> None:
        sys.stdin.readline()
        finished.set()

    threading.Thread(target=wait_for_line, daemon=True).start()
    rewrote = deleted = 0
    with Journal.open(store, create=False, durability="os", segment_bytes=int(segment_bytes)) as j:
        emit("ready")
        while not finished.is_set():
            report = j.compact(dead_share=rng.choice([0.0, 0.3, 0.5, 0.9]))
            rewrote += len(report.segments_rewritten)
            deleted += len(report.segments_deleted)
            deleted += len(j.apply_retention().deleted_segments)
            time.sleep(rng.uniform(0.0, 0.02))
    emit(f"rewrote {rewrote} deleted {deleted}")


class PauseAt(FileOps):
    """Fault points that pause once each: at the first hit of a point in `labels` (while
    `armed`), print its label and wait for a line on stdin."""

    def __init__(self, labels: Mapping[str, str], *, armed: bool = True) -> None:
        assert set(labels) <= set(FAULT_POINTS), labels
        self.labels = dict(labels)
        self.armed = armed

    def point(self, name: str, detail: object = None) -> None:
        if self.armed and name in self.labels:
            emit(self.labels.pop(name))
            sys.stdin.readline()


def compact_interleaved(store: str) -> None:
    pauses = PauseAt({"compaction.rewritten": "rewritten", "compaction.replaced": "replaced"})
    with Journal.open(store, create=False, durability="os", file_ops=pauses) as j:
        emit("ready")
        sys.stdin.readline()
        report = j.compact(dead_share=0.0)
    emit("rewrote " + ",".join(report.segments_rewritten))


def compact_paused(store: str, point: str) -> None:
    pauses = PauseAt({point: "paused"})
    with Journal.open(store, create=False, durability="os", file_ops=pauses) as j:
        emit("ready")
        sys.stdin.readline()
        report = j.compact()
    emit("rewrote " + ",".join(report.segments_rewritten))


class PauseBeforeTheSwapCommits(FileOps):
    """Pause (`paused`, then wait for a line) at the view's commit of the first swap's
    batch: its copy renamed into place and its new sidecar written."""

    renamed = False

    def point(self, name: str, detail: object = None) -> None:
        if name == "compaction.replaced":
            self.renamed = True
        elif name == "commit.view_commit" and self.renamed:
            self.renamed = False
            emit("paused")
            sys.stdin.readline()


def compact_paused_before_the_swap_commits(store: str) -> None:
    pauses = PauseBeforeTheSwapCommits()
    with Journal.open(store, create=False, durability="os", file_ops=pauses) as j:
        emit("ready")
        sys.stdin.readline()
        report = j.compact()
    emit("rewrote " + ",".join(report.segments_rewritten))


def retention_paused(store: str, *point: str) -> None:
    pauses = PauseAt({point[0]: "paused"} if point else {"retention.read_sidecar": "listed"})
    with Journal.open(store, create=False, durability="os", file_ops=pauses) as j:
        emit("ready")
        sys.stdin.readline()
        report = j.apply_retention()
    emit(f"deleted {len(report.deleted_segments)}")


def retention(store: str, now_ms: str, session_retention_ms: str) -> None:
    policy = journal.RetentionPolicy(
        max_history_bytes=None, session_retention_ms=int(session_retention_ms)
    )
    with Journal.open(store, create=False, durability="os", retention=policy) as j:
        report = j.apply_retention(now_ms=int(now_ms))
    emit(f"evicted {','.join(report.evicted_sessions)} deleted {len(report.deleted_segments)}")


def writer(store: str, segment_bytes: str) -> None:
    with Journal.open(store, create=False, durability="os", segment_bytes=int(segment_bytes)) as j:
        j.create_session("s")
        emit("ready")
        for line in sys.stdin:
            for _ in range(int(line.split()[1])):
                ordinal = j.get_session("s").last_ordinal + 1
                j.append("s", [journal.EventIn(type="m", data=payload("s", ordinal, 300))])
            row = j.get_session("s")
            emit(f"s {row.first_ordinal} {row.last_ordinal}")


def ro_watch(store: str, session_id: str) -> None:
    drop_privileges()
    with Journal.open(store, create=False, readonly=True) as j:
        emit("sessions " + ",".join(m.session_id for m in j.list_sessions()))
        emit("ready")
        for event in j.watch(session_id):
            emit(f"ev {event.ordinal} {digest(event.data)}")
    emit("done")


def ro_watch_paused(store: str, session_id: str) -> None:
    pausing = PauseAt({"segments.tail_read": "paused"}, armed=False)
    drop_privileges()
    with Journal.open(store, create=False, readonly=True, file_ops=pausing) as j:
        emit("ready")
        pausing.armed = True
        for event in j.watch(session_id):
            emit(f"ev {event.ordinal} {digest(event.data)}")
    emit("done")


def ro_read(store: str) -> None:
    drop_privileges()
    # A temporary directory of its own (where a read-only journal builds a private view),
    # so that other processes of this user creating theirs meanwhile do not count.
    scratch = tempfile.mkdtemp(prefix="journal-ro-read-")
    tempfile.tempdir = scratch
    try:
        _read_all(store)
        emit(f"left behind {sorted(os.listdir(scratch))}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    emit("done")


def _read_all(store: str) -> None:
    with Journal.open(store, create=False, readonly=True) as j:
        for meta in j.list_sessions():
            whole = hashlib.sha256()
            for event in j.replay(meta.session_id):
                whole.update(f"{event.ordinal}:{event.position}:".encode() + event.data)
            emit(
                f"session {meta.session_id} {meta.state.value} {meta.first_ordinal} "
                f"{meta.last_ordinal} {whole.hexdigest()[:16]}"
            )


def ro_open(store: str) -> None:
    drop_privileges()
    try:
        Journal.open(store, create=False, readonly=True).close()
    except journal.JournalError as e:
        emit(f"error {type(e).__name__} {e.code}")
        return
    emit("opened")


def rw_open(store: str) -> None:
    drop_privileges()
    try:
        Journal.open(store, create=False).close()
    except journal.JournalError as e:
        emit(f"error {type(e).__name__} {e.code} {getattr(e, 'errno', None)} {e}")
        return
    emit("opened")


COMMANDS = {
    "reader": reader,
    "compactor": compactor,
    "retention": retention,
    "retention_paused": retention_paused,
    "compact_interleaved": compact_interleaved,
    "compact_paused": compact_paused,
    "compact_paused_before_the_swap_commits": compact_paused_before_the_swap_commits,
    "ro_watch": ro_watch,
    "ro_watch_paused": ro_watch_paused,
    "ro_read": ro_read,
    "ro_open": ro_open,
    "rw_open": rw_open,
    "writer": writer,
}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
