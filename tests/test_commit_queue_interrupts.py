"""Ctrl-C in the main thread while it appends next to other threads fails that caller's
operation at most: the queue keeps working, no other caller sees the interrupt, and every
result returned is in the journal exactly once (dense ordinals). While the main thread is
in the queue, SIGINT is held (SPEC 7.1 "Interrupted threads"): the KeyboardInterrupt comes
once the append is done, never from inside the queue or a commit.

Each test runs a child process whose main thread appends in a loop next to worker threads
that append too; a one-shot SIGALRM timer (re-armed on the way out of its handler) raises
SIGINT (as Ctrl-C does) in the main thread at random points of a chosen kind, at most once
per append of the main thread."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from journal import EventIn, Journal, Unsupported
from journal._local.files import FileOps

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import inspect, os, random, signal, sys, tempfile, threading, time
sys.path.insert(0, sys.argv[1])
from journal import EventIn, Journal
from journal._local import commit_queue

mode, seed, duration = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
rng = random.Random(seed)
fires = []  # where each KeyboardInterrupt was raised
ticks = [0, 0]  # timer ticks in an append of the main thread; of them, at a chosen point
once = [True]  # set: no (further) KeyboardInterrupt in this append of the main thread
progress = [0, 0]  # appends started by the main thread, done by the workers
WORKERS = 8
# Where the main thread waits for the committer: `item.done.acquire()` in its `submit`.
# Where a follower waits for its leader: the last `wake.acquire()` of the queue's submit.
SUBMIT = commit_queue.CommitQueue._submit.__code__
source, first = inspect.getsourcelines(commit_queue.CommitQueue._submit)
WAITING = [max(first + i for i, line in enumerate(source) if line.strip() == "wake.acquire()")]
# Frames a KeyboardInterrupt must never come from: the queue's and the commit's own.
INSIDE = {"_submit", "_lead", "_gather", "_wake", "_abandon", "_run_commit", "_commit"}
QUEUE_FILES = ("commit_queue.py", os.path.join("_local", "engine.py"))


def in_queue(frame):
    return frame.f_globals.get("__name__", "").endswith("commit_queue")


def chosen(frame):
    if mode == "queue":  # anywhere in the commit queue's own code
        return in_queue(frame)
    if mode == "commit":  # the journal's code below it (the commit a leader makes)
        if in_queue(frame) or not frame.f_globals.get("__name__", "").startswith("journal."):
            return False
        f = frame.f_back
        while f is not None and not in_queue(f):
            f = f.f_back
        return f is not None
    if mode == "waiting":  # only while waiting for a leader
        return frame.f_code is SUBMIT and frame.f_lineno == WAITING[0]
    raise SystemExit(mode)


def handler(sig, frame):
    signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00002, 0.0002))  # one-shot, re-armed
    if once[0]:
        return
    ticks[0] += 1
    if not chosen(frame):
        return
    ticks[1] += 1
    if rng.random() > 0.3:
        return
    once[0] = True
    fires.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
    signal.raise_signal(signal.SIGINT)  # Ctrl-C, here


def state():
    return f"progress={progress}"


def finish(verdict):
    signal.setitimer(signal.ITIMER_REAL, 0)
    print(verdict, "fires:", len(fires), "ticks:", ticks[0], "chosen:", ticks[1], "last:",
          fires[-3:], flush=True)
    os._exit(0)


signal.signal(signal.SIGALRM, handler)
j = Journal.open(tempfile.mkdtemp() + "/s", durability="os")
for i in range(WORKERS + 1):
    j.create_session(f"s{i}")
results = {}  # payload -> AppendResult
interrupted = set()  # the main thread's appends that raised KeyboardInterrupt
problems = []
stop = threading.Event()


def worker(i):
    n = 0
    while not stop.is_set():
        data = f"s{i}:{n}"
        n += 1
        try:
            r = j.append(f"s{i}", [EventIn("t", data.encode())])
        except BaseException as e:
            problems.append(f"worker {data} raised {e!r}")
            continue
        if r is None:
            problems.append(f"worker {data} returned None")
        results[data] = r
        progress[1] += 1


def watchdog():
    last, since = None, time.monotonic()
    while True:
        time.sleep(0.5)
        now = tuple(progress)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > 10:
            finish("HANG " + state())


threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(WORKERS)]
for t in threads:
    t.start()
threading.Thread(target=watchdog, daemon=True).start()
signal.setitimer(signal.ITIMER_REAL, 0.0001)
start = time.monotonic()
n = 0
while time.monotonic() - start < duration:
    data = f"s{WORKERS}:{n}"
    n += 1
    progress[0] = n
    try:
        once[0] = False
        r = j.append(f"s{WORKERS}", [EventIn("t", data.encode())])
        once[0] = True
    except KeyboardInterrupt as e:
        interrupted.add(data)
        tb = e.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_name in INSIDE and code.co_filename.endswith(QUEUE_FILES):
                problems.append(f"interrupt raised in {tb.tb_frame.f_code.co_name}")
            tb = tb.tb_next
        continue
    except BaseException as e:
        once[0] = True
        problems.append(f"main {data} raised {e!r}")
        continue
    if r is None:
        problems.append(f"main {data} returned None")
    results[data] = r
once[0] = True
signal.setitimer(signal.ITIMER_REAL, 0)
done = threading.Event()
after = [EventIn("t", b"after")]
threading.Thread(target=lambda: (j.append("s0", after), done.set()), daemon=True).start()
if not done.wait(10):
    finish("HANG-AFTER " + state())
stop.set()
for t in threads:
    t.join(10)
    if t.is_alive():
        finish("HANG-WORKER " + state())
for i in range(WORKERS + 1):
    try:
        events = list(j.replay(f"s{i}"))
    except BaseException as e:
        problems.append(f"replay s{i} raised {e!r}")
        continue
    ordinals = [e.ordinal for e in events]
    if ordinals != list(range(1, len(events) + 1)):
        problems.append(f"s{i}: ordinals not dense")
    seen = {}
    for e in events:
        d = e.data.decode()
        if d in seen:
            problems.append(f"{d} committed twice ({seen[d]}, {e.ordinal})")
        seen[d] = e.ordinal
        if d not in results and d not in interrupted and d != "after":
            problems.append(f"{d} committed but never submitted")
    for d, r in results.items():
        if d.startswith(f"s{i}:") and r is not None and seen.get(d) != r.first_ordinal:
            problems.append(f"{d} returned ordinal {r.first_ordinal}, replay has {seen.get(d)}")
verdict = "BAD " + " | ".join(problems[:5]) if problems else "ok"
finish(f"{verdict} appends={n} interrupted={len(interrupted)}")
"""


def _run(mode: str, seed: int, seconds: float = 3.0) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ROOT), mode, str(seed), str(seconds)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout.strip() or out.stderr[-2000:]


def _count(out: str, label: str) -> int:
    words = out.split()
    return int(words[words.index(label) + 1])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ctrl_c_while_the_main_thread_waits_loses_nothing(seed: int) -> None:
    # Ctrl-C while it waits for a leader (whether its request was taken meanwhile, or it
    # was just handed leadership): held until its request is done.
    out = _run("waiting", seed)
    assert out.startswith("ok"), out
    assert _count(out, "fires:") > 0, out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ctrl_c_anywhere_in_the_commit_queue_loses_nothing(seed: int) -> None:
    # Anywhere the main thread runs the queue's code: taking leadership, gathering,
    # waking the batch, handing leadership on (this hung every writer before SIGINT was
    # held).
    out = _run("queue", seed)
    assert out.startswith("ok"), out
    assert _count(out, "fires:") > 0, out


@pytest.mark.parametrize("seed", [1, 2])
def test_ctrl_c_inside_a_commit_fails_no_other_caller(seed: int) -> None:
    # Inside the commit the main thread leads (once reported to every caller of the
    # batch, or undoing a frame the view already held): the KeyboardInterrupt comes
    # after the commit, from no frame of the queue or the commit.
    out = _run("commit", seed)
    assert out.startswith("ok"), out
    assert _count(out, "fires:") > 0, out


_CLOSE = """
import os, random, signal, sys, tempfile, threading, time
sys.path.insert(0, sys.argv[1])
from journal import EventIn, Journal, JournalClosed
from journal._local.files import FileOps

rng = random.Random(int(sys.argv[2]))
fired = []
armed = [False]
main = threading.main_thread()


class Slow(FileOps):
    # Batches (led by workers) take a while: close() waits for one in flight.
    def point(self, name, detail=None):
        if name == "commit.batch_taken" and threading.current_thread() is not main:
            time.sleep(0.002)


def handler(sig, frame):
    # Ctrl-C anywhere in the commit queue's close() (its wait for the batch in flight).
    signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00002, 0.0002))
    if not armed[0] or fired:
        return
    code = frame.f_code
    in_close = code.co_name == "close" and frame.f_globals.get("__name__", "").endswith(
        "commit_queue"
    )
    # (And inside a Condition's wait, where close() waited before: the window that
    # released the mutex twice.)
    in_wait = code.co_filename.endswith("threading.py") and code.co_name in (
        "_release_save", "_acquire_restore"
    )
    if (in_close or in_wait) and rng.random() < 0.5:
        fired.append(frame.f_lineno)
        raise KeyboardInterrupt


signal.signal(signal.SIGALRM, handler)
j = Journal.open(tempfile.mkdtemp() + "/s", durability="os", file_ops=Slow())
j.create_session("s")
ended = []


def worker():
    while True:
        try:
            j.append("s", [EventIn("t", b"x")])
        except JournalClosed:
            ended.append(1)
            return
        except BaseException as e:
            print("worker raised", repr(e), flush=True)
            os._exit(0)


workers = [threading.Thread(target=worker, daemon=True) for _ in range(4)]
for w in workers:
    w.start()
time.sleep(0.05)
signal.setitimer(signal.ITIMER_REAL, 0.0001)
armed[0] = True
try:
    j.close()
    outcome = "closed"
except KeyboardInterrupt:
    outcome = "interrupted"
except BaseException as e:
    outcome = repr(e)
armed[0] = False
signal.setitimer(signal.ITIMER_REAL, 0)
done = threading.Event()
threading.Thread(target=lambda: (j.close(), done.set()), daemon=True).start()
closed = done.wait(20)
for w in workers:
    w.join(20)
print(outcome, "closed-again" if closed else "HANG", len(ended), fired, flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("seed", range(1, 5))
def test_ctrl_c_while_close_waits_leaves_a_journal_that_closes(seed: int) -> None:
    # close() waited on a Condition over the queue's raw mutex: interrupted between the
    # wait's release and re-acquire, the `with` released the mutex again (RuntimeError,
    # or the mutex taken from whichever thread held it then). Now it waits on a raw lock
    # of its own: interrupted, it is a KeyboardInterrupt, and closing again works.
    out = subprocess.run(
        [sys.executable, "-c", _CLOSE, str(ROOT), str(seed)],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.split()
    assert out[:1] in (["closed"], ["interrupted"]), out
    assert out[1:3] == ["closed-again", "4"], out


class _RaiseAt(FileOps):
    """Raises `signum` (once) in the main thread at the named fault point."""

    def __init__(self, point: str, signum: int, times: int = 1) -> None:
        self.where, self.signum, self.left = point, signum, 0
        self.times = times

    def arm(self) -> None:
        self.left = self.times

    def point(self, name: str, detail: object = None) -> None:
        if name == self.where and self.left:
            self.left -= 1
            signal.raise_signal(self.signum)


@pytest.fixture
def sigint_counter() -> Iterator[list[int]]:
    calls: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        yield calls
    finally:
        signal.signal(signal.SIGINT, previous)


def test_two_ctrl_c_inside_a_commit_run_the_handler_twice(
    tmp_path: Path, sigint_counter: list[int]
) -> None:
    # Held, the second Ctrl-C puts the handler back and runs it for both (asyncio's
    # handler, say, cancels on the first and raises on the second): none is dropped.
    handler = signal.getsignal(signal.SIGINT)
    ops = _RaiseAt("commit.view_flush", signal.SIGINT, times=2)
    with Journal.open(tmp_path / "s", durability="os", file_ops=ops) as j:
        j.create_session("s")
        ops.arm()
        j.append("s", [EventIn("t", b"x")])
        assert sigint_counter == [signal.SIGINT, signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is handler
        assert [e.data for e in j.replay("s")] == [b"x"]


def test_a_failure_inside_the_queue_puts_the_sigint_handler_back(
    tmp_path: Path, sigint_counter: list[int]
) -> None:
    # Another signal's handler raises in the queue (at a fault point): the append fails,
    # and the SIGINT handler is the caller's again (a swapped one left in place swallowed
    # every later first Ctrl-C).
    class Stop(Exception):
        pass

    def stop(signum: int, frame: object) -> None:
        raise Stop

    handler = signal.getsignal(signal.SIGINT)
    previous = signal.signal(signal.SIGUSR1, stop)
    try:
        ops = _RaiseAt("commit.queued", signal.SIGUSR1)
        with Journal.open(tmp_path / "s", durability="os", file_ops=ops) as j:
            j.create_session("s")
            ops.arm()
            with pytest.raises(Stop):
                j.append("s", [EventIn("t", b"lost")])
            assert signal.getsignal(signal.SIGINT) is handler
            j.append("s", [EventIn("t", b"kept")])
            assert [e.data for e in j.replay("s")] == [b"kept"]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_write_from_a_signal_handler_mid_write_is_refused_not_a_hang(tmp_path: Path) -> None:
    # A SIGUSR1 handler that appends while the main thread leads a commit of the same
    # journal would wait for a batch only that thread can finish.
    refused: list[BaseException] = []
    ops = _RaiseAt("commit.batch_taken", signal.SIGUSR1)

    def usr1(signum: int, frame: object) -> None:
        try:
            j.append("s", [EventIn("t", b"from the handler")])
        except Unsupported as e:
            refused.append(e)

    previous = signal.signal(signal.SIGUSR1, usr1)
    try:
        with Journal.open(tmp_path / "s", durability="os", file_ops=ops) as j:
            j.create_session("s")
            ops.arm()
            j.append("s", [EventIn("t", b"outer")])
            assert len(refused) == 1 and "signal handler" in str(refused[0])
            assert [e.data for e in j.replay("s")] == [b"outer"]
            j.append("s", [EventIn("t", b"after")])  # (the main thread is out again)
    finally:
        signal.signal(signal.SIGUSR1, previous)
