"""The commit path's shortcuts stay invisible: a writer reuses the rows its last batch of
appends wrote only while nothing else committed (in any process), and a leader that
gathers stragglers still gives every caller its own result."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from journal import EventIn, InvalidArgument, Journal, OrdinalConflict, SessionNotWritable
from journal._local.files import FileOps

ROOT = Path(__file__).resolve().parent.parent

_OTHER = """
import sys
sys.path.insert(0, sys.argv[1])
from journal import EventIn, Journal
with Journal.open(sys.argv[2]) as j:
    action = sys.argv[3]
    if action == "append":
        j.append("s", [EventIn("other", b"x")] * 3)
    elif action == "suspend":
        j.suspend_session("s")
    elif action == "compact":
        j.compact_session("s", 2, b"snap")
"""


def _other_process(store: Path, action: str) -> None:
    subprocess.run(
        [sys.executable, "-c", _OTHER, str(ROOT), str(store), action], check=True, timeout=60
    )


def test_a_writer_sees_what_another_process_appended_between_its_batches(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "s", durability="os") as j:
        j.create_session("s")
        j.append("s", [EventIn("mine", b"a")])
        j.append("s", [EventIn("mine", b"b")])  # the row of "s" is now known to the writer
        _other_process(tmp_path / "s", "append")
        with pytest.raises(OrdinalConflict):
            j.append("s", [EventIn("mine", b"c")], expected_last_ordinal=2)
        result = j.append("s", [EventIn("mine", b"c")], expected_last_ordinal=5)
        assert (result.first_ordinal, result.last_ordinal) == (6, 6)
        ordinals = [e.ordinal for e in j.replay("s")]
        assert ordinals == [1, 2, 3, 4, 5, 6]
        assert j.get_session("s").last_ordinal == 6


def test_a_writer_sees_a_transition_made_by_another_process(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "s", durability="os") as j:
        j.create_session("s")
        j.append("s", [EventIn("mine", b"a")])
        j.append("s", [EventIn("mine", b"b")])
        _other_process(tmp_path / "s", "suspend")
        with pytest.raises(SessionNotWritable):
            j.append("s", [EventIn("mine", b"c")])
        assert j.get_session("s").state.value == "suspended"


def test_a_writer_sees_a_snapshot_taken_by_another_process(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "s", durability="os") as j:
        j.create_session("s")
        for body in (b"a", b"b", b"c"):
            j.append("s", [EventIn("mine", body)])
        _other_process(tmp_path / "s", "compact")
        j.append("s", [EventIn("mine", b"d")])
        row = j.get_session("s")
        assert (row.first_ordinal, row.last_ordinal) == (3, 4)
        assert [e.ordinal for e in j.replay("s")] == [3, 4]


def test_a_failed_batch_leaves_no_stale_row_behind(tmp_path: Path) -> None:
    class FailOnce(FileOps):
        armed = False

        def point(self, name: str, detail: object = None) -> None:
            if name == "commit.view_flush" and self.armed:
                self.armed = False
                raise OSError(28, "No space left on device")

    ops = FailOnce()
    with Journal.open(tmp_path / "s", durability="os", file_ops=ops) as j:
        j.create_session("s")
        j.append("s", [EventIn("mine", b"a")])
        ops.armed = True
        with pytest.raises(Exception):  # noqa: B017 - StoreUnavailable
            j.append("s", [EventIn("mine", b"lost")])
        result = j.append("s", [EventIn("mine", b"b")])
        assert (result.first_ordinal, result.last_ordinal) == (2, 2)
        assert [e.data for e in j.replay("s")] == [b"a", b"b"]


def test_gathered_batches_give_each_caller_its_own_dense_result(tmp_path: Path) -> None:
    class CountBatches(FileOps):
        sizes: list[int]

        def __init__(self) -> None:
            self.sizes = []

        def point(self, name: str, detail: object = None) -> None:
            if name == "commit.batch_taken" and isinstance(detail, int):
                self.sizes.append(detail)

    ops = CountBatches()
    threads, per_thread = 12, 60
    results: dict[int, list[tuple[int, int]]] = {t: [] for t in range(threads)}
    with Journal.open(tmp_path / "s", durability="fsync", file_ops=ops) as j:
        for t in range(threads):
            j.create_session(f"t{t}")
        j.create_session("shared")
        barrier = threading.Barrier(threads)

        def work(t: int) -> None:
            barrier.wait()
            for i in range(per_thread):
                session = "shared" if i % 3 == 0 else f"t{t}"
                r = j.append(session, [EventIn("e", f"{t}:{i}".encode())])
                results[t].append((r.first_ordinal, r.last_ordinal))

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for t in range(threads):
            own = [e.data.decode() for e in j.replay(f"t{t}")]
            assert own == [f"{t}:{i}" for i in range(per_thread) if i % 3 != 0]
        shared = [e.ordinal for e in j.replay("shared")]
        assert shared == list(range(1, threads * (per_thread // 3) + 1))
    every = sorted(r for rs in results.values() for r in rs)
    assert len(every) == threads * per_thread
    assert sum(ops.sizes) == threads * per_thread + threads + 1


_INTERRUPTED_FOLLOWER = """
import os, signal, sys, threading
sys.path.insert(0, sys.argv[1])
from journal import EventIn, Journal
from journal._local.files import FileOps

go, queued, interrupted = threading.Event(), threading.Event(), threading.Event()


class Pause(FileOps):
    # The leader (a worker thread) waits, batch taken, until the main thread has queued
    # behind it and been interrupted there: the main thread is next in line.
    def point(self, name, detail=None):
        main = threading.current_thread() is threading.main_thread()
        if name == "commit.queued" and main and go.is_set():
            queued.set()
        if name == "commit.batch_taken" and go.is_set() and not main and not interrupted.is_set():
            queued.wait(10)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            interrupted.wait(10)


j = Journal.open(sys.argv[2] + "/s", durability="os", file_ops=Pause())  # (in tmp_path)
j.create_session("s")
go.set()
leader = threading.Thread(target=lambda: j.append("s", [EventIn("t", b"leader")]))
leader.start()
while not queued.is_set():
    try:
        # (The one request the main thread submits itself, in the queue: the others go
        # through the committer thread.)
        j.verify(fix=True)
    except KeyboardInterrupt:
        break
interrupted.set()
leader.join(10)
done = threading.Event()
after = [EventIn("t", b"after")]
threading.Thread(target=lambda: (j.append("s", after), done.set()), daemon=True).start()
print("ok" if done.wait(10) else "HANG", [e.data.decode() for e in j.replay("s")])
os._exit(0)
"""


def test_ctrl_c_in_the_caller_next_in_line_leaves_the_queue_working(tmp_path: Path) -> None:
    # The finishing leader hands leadership to the oldest waiting request; when its
    # caller was interrupted meanwhile, nobody led again and every writer hung. (Only
    # `verify(fix=True)` puts the main thread itself in the queue.)
    out = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_FOLLOWER, str(ROOT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert out.startswith("ok"), out
    assert "'after'" in out and "'leader'" in out


_INTERRUPTED = """
import os, signal, sys, threading, time
sys.path.insert(0, sys.argv[1])
from journal import EventIn, Journal
from journal._local.files import FileOps

where, scratch = sys.argv[2], sys.argv[3]  # (scratch: the test's tmp_path)
fired = threading.Event()


def inside(frame, name, module):
    while frame is not None:
        if frame.f_code.co_name == name and frame.f_globals.get("__name__", "").endswith(module):
            return frame
        frame = frame.f_back
    return None


def handler(sig, frame):
    # Ctrl-C, delivered exactly where the commit queue waits. The timer is one-shot and
    # re-armed on the way out: a periodic one fired again inside a slow handler on a
    # loaded machine, until the nested handlers overflowed the stack.
    if fired.is_set():
        return
    if where == "gather" and inside(frame, "_gather", "commit_queue"):
        fired.set()
        raise KeyboardInterrupt
    waiting = inside(frame, "submit", "commit_queue")
    if where == "follower" and armed.is_set() and waiting is frame:
        fired.set()
        raise KeyboardInterrupt
    signal.setitimer(signal.ITIMER_REAL, 0.00005)


class NextInLine(FileOps):
    # The main thread's request queued first behind a running batch: it is the one the
    # finishing leader will hand leadership to.
    def point(self, name, detail=None):
        if name == "commit.queued" and threading.current_thread() is threading.main_thread():
            if detail == 1:
                armed.set()
            else:
                armed.clear()


armed = threading.Event()
signal.signal(signal.SIGALRM, handler)
j = Journal.open(scratch + "/s", durability="os", file_ops=NextInLine())
for i in range(13):
    j.create_session(f"s{i}")
progress = [0] * 12
stop = threading.Event()


def worker(i):
    while not stop.is_set():
        j.append(f"s{i}", [EventIn("t", b"x")])
        progress[i] += 1


for i in range(12):
    threading.Thread(target=worker, args=(i,), daemon=True).start()
signal.setitimer(signal.ITIMER_REAL, 0.00005)
start = time.monotonic()
try:
    while not fired.is_set() and time.monotonic() - start < 30:
        j.verify(fix=True)  # (submitted in the main thread itself: it may lead)
except KeyboardInterrupt:
    pass
signal.setitimer(signal.ITIMER_REAL, 0, 0)
before = sum(progress)
done = threading.Event()
after = [EventIn("t", b"after")]
threading.Thread(target=lambda: (j.append("s12", after), done.set()), daemon=True).start()
ok = done.wait(20)
time.sleep(0.5)
print("fired" if fired.is_set() else "not-fired", "ok" if ok else "HANG", sum(progress) > before)
stop.set()
os._exit(0)
"""


def test_ctrl_c_while_the_leader_gathers_leaves_the_queue_working(tmp_path: Path) -> None:
    # A KeyboardInterrupt in the leader while it gathers stragglers once left the queue
    # with nobody leading: every writer hung. (The main thread leads only a
    # `verify(fix=True)` of its own.)
    out = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED, str(ROOT), "gather", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.split()
    assert out[:1] == ["fired"], out
    assert out[1:] == ["ok", "True"], out


def test_an_object_posing_as_a_str_is_not_a_session_id(tmp_path: Path) -> None:
    # Validated session ids are remembered; an object whose `__class__` says str and which
    # equals a remembered id must still be refused (before the first use and after).
    class PosingAsStr:
        __class__ = str  # type: ignore[assignment]

        def __hash__(self) -> int:
            return hash("s")

        def __eq__(self, other: object) -> bool:
            return other == "s"

    with Journal.open(tmp_path / "s", durability="os") as j:
        j.create_session("s")
        with pytest.raises(InvalidArgument):
            j.append(PosingAsStr(), [EventIn("e", b"x")])  # type: ignore[arg-type]
        j.append("s", [EventIn("e", b"x")])
        with pytest.raises(InvalidArgument):
            j.append(PosingAsStr(), [EventIn("e", b"y")])  # type: ignore[arg-type]
        assert [e.data for e in j.replay("s")] == [b"x"]
