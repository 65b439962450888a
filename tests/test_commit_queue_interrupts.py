"""A signal in the main thread while it appends next to other threads fails that caller's
operation at most: the queue keeps working, no other caller sees the interrupt, and every
result returned is in the journal exactly once (dense ordinals). While the main thread is
in the queue, every Python signal handler is held (SPEC 7.1 "Interrupted threads"): the
handler's exception (Ctrl-C's KeyboardInterrupt, a SIGTERM handler's SystemExit, any
handler's own) comes once the append is done, never from inside the queue or a commit.

Each test runs a child process whose main thread appends in a loop next to worker threads
that append too, and raises a signal in the main thread once per append at a random point
of a chosen kind: a trace function of the main thread (`sys.settrace`, opcode events, in
the chosen frames only) calls `signal.raise_signal` at a randomly chosen bytecode, where
an unheld handler's exception lands exactly as a real signal's would (at a bytecode
boundary of that frame); while the main thread waits for a leader, a helper thread sends
the signal with `signal.pthread_kill`, so that it comes while the main thread is blocked.
(A timer's SIGALRM, as these tests used before, is held itself now.)"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # (signal's C module: no stubs)
import contextlib
import dis
import inspect
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, Final

import pytest

from journal import EventIn, Journal, Unsupported
from journal._local.engine import LocalEngine
from journal._local.files import FileOps

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import inspect, os, random, signal, sys, threading, time
sys.path.insert(0, sys.argv[1])
from journal import EventIn, Journal
from journal._local import commit_queue

mode, kind, seed, duration = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
scratch = sys.argv[6]  # (the test's tmp_path: the store goes there, removed with it)
rng = random.Random(seed)


class Boom(Exception):
    pass


def exiting(signum, frame):  # (a SIGTERM handler that ends the program)
    ran[0] += 1
    sys.exit(0)


def booming(signum, frame):
    ran[0] += 1
    raise Boom


ran = [0]  # how many times the handler under test ran (its Python version)
if kind == "int":  # Python's own handler (C code): KeyboardInterrupt
    SIG, RAISED = signal.SIGINT, KeyboardInterrupt
elif kind == "term":
    SIG, RAISED = signal.SIGTERM, SystemExit
    signal.signal(SIG, exiting)
elif kind == "usr1":
    SIG, RAISED = signal.SIGUSR1, Boom
    signal.signal(SIG, booming)
else:
    raise SystemExit(kind)

fires = []  # where each signal was raised
events = [0, 0, 10**9]  # chosen events in this append; the one to fire at; the last count
armed = [False]  # set: the signal is still to be raised in this append
progress = [0, 0]  # appends started by the main thread, done by the workers
WORKERS = 8
MAIN = threading.main_thread().ident
# Where a follower waits for its leader: the last `wake.acquire()` of the queue's submit.
SUBMIT = commit_queue.CommitQueue._submit.__code__
source, first = inspect.getsourcelines(commit_queue.CommitQueue._submit)
WAITING = max(first + i for i, line in enumerate(source) if line.strip() == "wake.acquire()")
# The queue's own code (what runs while the main thread is in the queue, held or not).
QUEUE = {"_submit", "_lead", "_gather", "_wake", "_abandon", "_pick_successor",
         "_release_closers", "_hand_over", "_uncommitted"}
# Frames a handler's exception must never come from: the queue's and the commit's own.
INSIDE = {"_submit", "_lead", "_gather", "_wake", "_abandon", "_run_commit", "_commit"}
QUEUE_FILES = ("commit_queue.py", os.path.join("_local", "commit.py"))


def in_queue(frame):
    return frame.f_globals.get("__name__", "").endswith("commit_queue")


def chosen(frame):
    if mode == "queue":  # anywhere in the commit queue's own code
        return in_queue(frame) and frame.f_code.co_name in QUEUE
    if mode == "commit":  # the journal's code below a leader (the commit it makes)
        if in_queue(frame) or not frame.f_globals.get("__name__", "").startswith("journal."):
            return False
        f = frame.f_back
        while f is not None and not (in_queue(f) and f.f_code.co_name == "_lead"):
            f = f.f_back
        return f is not None
    if mode == "waiting":  # about to wait for a leader: the helper thread sends it
        return frame.f_code is SUBMIT
    raise SystemExit(mode)


def local(frame, event, arg):
    if mode == "waiting":
        if event == "line" and frame.f_lineno == WAITING and armed[0]:
            armed[0] = False
            go.set()  # (for this append: `progress[0]`)
        return local
    if event == "opcode":
        events[0] += 1
        if events[0] == events[1] and armed[0]:
            armed[0] = False
            fires.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            signal.raise_signal(SIG)  # (unheld, its handler's exception lands right here)
    return local


def tracer(frame, event, arg):
    if not chosen(frame):
        return None
    frame.f_trace = local  # (before f_trace_opcodes: see _opcode_events below)
    frame.f_trace_opcodes = mode != "waiting"
    return local


sys._getframe().f_trace_opcodes = True  # (Python 3.12: see _tracing in the test module)


go = threading.Event()  # the main thread is about to wait


def sender():
    # The signal while the main thread waits for a leader: sent with the GIL held, so
    # the main thread cannot run on (it is blocked in the wait, or woken from it but not
    # yet running) until it has arrived. (The long switch interval keeps the GIL from
    # being handed over between the look and the signal, should this thread be preempted
    # there on a loaded machine.)
    pace = random.Random(seed + 1)
    sent = None
    while True:
        go.wait()
        go.clear()
        append = progress[0]
        time.sleep(pace.uniform(0, 0.0002))
        frame = sys._current_frames().get(MAIN)
        if sent == append or progress[0] != append:
            continue  # (once per append of the main thread)
        if frame is not None and frame.f_code is SUBMIT and frame.f_lineno == WAITING:
            sent = append
            fires.append(f"waiting:{frame.f_lineno}")
            signal.pthread_kill(MAIN, SIG)


def state():
    return f"progress={progress}"


def finish(verdict):
    sys.settrace(None)
    print(verdict, "fires:", len(fires), "ran:", ran[0], "last:", fires[-3:], flush=True)
    os._exit(0)


j = Journal.open(scratch + "/s", durability="os")
for i in range(WORKERS + 1):
    j.create_session(f"s{i}")
results = {}  # payload -> AppendResult
interrupted = set()  # the main thread's appends that raised the handler's exception
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
        if mode == "commit":
            time.sleep(0.001)  # (room in the queue: the main thread leads now and then)


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
if mode == "waiting":
    sys.setswitchinterval(1.0)
    threading.Thread(target=sender, daemon=True).start()
start = time.monotonic()
n = 0
while time.monotonic() - start < duration:
    data = f"s{WORKERS}:{n}"
    n += 1
    progress[0] = n
    # At a random one of the chosen bytecodes, as many as the last append that ran any
    # and did not fire.
    events[0], events[1] = 0, rng.randint(1, events[2])
    try:
        armed[0] = True
        sys.settrace(tracer)
        r = j.append(f"s{WORKERS}", [EventIn("t", data.encode())])
        sys.settrace(None)
    except RAISED as e:
        sys.settrace(None)
        interrupted.add(data)
        tb = e.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_name in INSIDE and code.co_filename.endswith(QUEUE_FILES):
                problems.append(f"{e!r} raised in {tb.tb_frame.f_code.co_name}")
            tb = tb.tb_next
        continue
    except BaseException as e:
        sys.settrace(None)
        problems.append(f"main {data} raised {e!r}")
        continue
    finally:
        if events[0] and armed[0]:
            events[2] = events[0]  # (all of them: none fired, so the trace ran to the end)
        armed[0] = False
    if r is None:
        problems.append(f"main {data} returned None")
    results[data] = r
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
if len(interrupted) != len(fires):
    # Each signal raised its handler's exception once, out of the append it came in.
    problems.append(f"{len(fires)} signals raised, {len(interrupted)} appends interrupted")
if kind != "int" and ran[0] != len(fires):
    problems.append(f"{len(fires)} signals raised, the handler ran {ran[0]} times")
for i in range(WORKERS + 1):
    try:
        events_of = list(j.replay(f"s{i}"))
    except BaseException as e:
        problems.append(f"replay s{i} raised {e!r}")
        continue
    ordinals = [e.ordinal for e in events_of]
    if ordinals != list(range(1, len(events_of) + 1)):
        problems.append(f"s{i}: ordinals not dense")
    seen = {}
    for e in events_of:
        d = e.data.decode()
        if d in seen:
            problems.append(f"{d} committed twice ({seen[d]}, {e.ordinal})")
        seen[d] = e.ordinal
        if d not in results and d not in interrupted and d != "after":
            problems.append(f"{d} committed but never submitted")
    for d, r in results.items():
        if d.startswith(f"s{i}:") and r is not None and seen.get(d) != r.first_ordinal:
            problems.append(f"{d} returned ordinal {r.first_ordinal}, replay has {seen.get(d)}")
    for d in interrupted:
        # The exception came once the append was done: it is in the journal.
        if d.startswith(f"s{i}:") and d not in seen:
            problems.append(f"{d} interrupted and not committed")
try:
    report = j.verify()
    if not report.ok:
        problems.append(f"verify: {report.problems[:3]}")
except BaseException as e:
    problems.append(f"verify raised {e!r}")
verdict = "BAD " + " | ".join(problems[:5]) if problems else "ok"
finish(f"{verdict} appends={n} interrupted={len(interrupted)}")
"""

# Fewest signals raised in the chosen region of one run: a run with fewer proves nothing.
_MIN_FIRES = 20


def _run(scratch: Path, mode: str, kind: str, seed: int, seconds: float = 2.5) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            str(ROOT),
            mode,
            kind,
            str(seed),
            str(seconds),
            str(scratch),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout.strip() or out.stderr[-2000:]


def _count(out: str, label: str) -> int:
    words = out.split()
    return int(words[words.index(label) + 1])


def _check(out: str) -> None:
    assert out.startswith("ok"), out
    assert _count(out, "fires:") >= _MIN_FIRES, out


# (Each seed runs 2.5 s of signals: the default run takes one, `-m slow` the others.)
_MORE_SEEDS: Final = [pytest.param(seed, marks=pytest.mark.slow) for seed in (2, 3)]


@pytest.mark.parametrize("seed", [1, *_MORE_SEEDS])
def test_ctrl_c_while_the_main_thread_waits_loses_nothing(tmp_path: Path, seed: int) -> None:
    # Ctrl-C while it waits for a leader (whether its request was taken meanwhile, or it
    # was just handed leadership): held until its request is done.
    _check(_run(tmp_path, "waiting", "int", seed))


@pytest.mark.parametrize("seed", [1, *_MORE_SEEDS])
def test_ctrl_c_anywhere_in_the_commit_queue_loses_nothing(tmp_path: Path, seed: int) -> None:
    # Anywhere the main thread runs the queue's code: taking leadership, gathering,
    # waking the batch, handing leadership on (this hung every writer before SIGINT was
    # held).
    _check(_run(tmp_path, "queue", "int", seed))


@pytest.mark.parametrize("seed", [1, *_MORE_SEEDS[:1]])
def test_ctrl_c_inside_a_commit_fails_no_other_caller(tmp_path: Path, seed: int) -> None:
    # Inside the commit the main thread leads (once reported to every caller of the
    # batch, or undoing a frame the view already held): the KeyboardInterrupt comes
    # after the commit, from no frame of the queue or the commit.
    _check(_run(tmp_path, "commit", "int", seed))


@pytest.mark.parametrize(
    ("kind", "mode"), [("term", "queue"), ("usr1", "queue"), ("term", "waiting")]
)
def test_a_raising_handler_of_another_signal_in_the_queue_loses_nothing(
    tmp_path: Path, kind: str, mode: str
) -> None:
    # A SIGTERM handler calling sys.exit (SystemExit), a SIGUSR1 handler raising its own
    # exception: held like Ctrl-C (before, such an exception in a leader's queue code left
    # every writer waiting, and a waiter's gave up a request the caller never learnt the
    # fate of).
    _check(_run(tmp_path, mode, kind, 1))


@pytest.mark.parametrize("kind", ["term", "usr1"])
def test_a_raising_handler_of_another_signal_in_a_commit_loses_nothing(
    tmp_path: Path, kind: str
) -> None:
    # Inside the commit (before, the exception went to every caller of the batch, and
    # right after the view's LMDB commit it undid a frame the view held: JournalCorrupt).
    _check(_run(tmp_path, "commit", kind, 1))


_CLOSE = """
import os, random, signal, sys, threading, time
sys.path.insert(0, sys.argv[1])
from journal import EventIn, Journal, JournalClosed
from journal._local.files import FileOps

rng = random.Random(int(sys.argv[2]))
scratch = sys.argv[3]  # (the test's tmp_path)
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
j = Journal.open(scratch + "/s", durability="os", file_ops=Slow())
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
def test_ctrl_c_while_close_waits_leaves_a_journal_that_closes(tmp_path: Path, seed: int) -> None:
    # close() waited on a Condition over the queue's raw mutex: interrupted between the
    # wait's release and re-acquire, the `with` released the mutex again (RuntimeError,
    # or the mutex taken from whichever thread held it then). Now it waits on a raw lock
    # of its own: interrupted, it is a KeyboardInterrupt, and closing again works.
    out = subprocess.run(
        [sys.executable, "-c", _CLOSE, str(ROOT), str(seed), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.split()
    assert out[:1] in (["closed"], ["interrupted"]), out
    assert out[1:3] == ["closed-again", "4"], out


class _RaiseAt(FileOps):
    """Raises `signums` (in turn, once armed) in the main thread at the named fault point."""

    def __init__(self, point: str, *signums: int) -> None:
        self.where, self.signums, self.left = point, signums, False

    def arm(self) -> None:
        self.left = True

    def point(self, name: str, detail: object = None) -> None:
        if name == self.where and self.left:
            self.left = False
            for signum in self.signums:
                signal.raise_signal(signum)


def _in_the_queue() -> bool:
    """Whether the caller runs inside the commit queue or a commit (a frame of either is
    on its stack)."""
    frame: FrameType | None = sys._getframe(1)  # noqa: SLF001 (the caller's stack)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if (module.endswith("commit_queue") and frame.f_code.co_name in _QUEUE) or (
            module.endswith("_local.commit") and frame.f_code.co_name in _COMMIT
        ):
            return True
        frame = frame.f_back
    return False


_QUEUE = {"_submit", "_lead", "_gather", "_wake"}
_COMMIT = {"_run_commit", "_commit"}


def _inside(frame: traceback.FrameSummary) -> bool:
    """Whether a traceback's frame is one of the queue's or the commit's own."""
    return (frame.filename.endswith("commit_queue.py") and frame.name in _QUEUE) or (
        frame.filename.endswith(os.path.join("_local", "commit.py")) and frame.name in _COMMIT
    )


class _Boom(Exception):
    pass


@contextlib.contextmanager
def _handlers(handlers: dict[int, Any]) -> Iterator[None]:
    previous = {signum: signal.signal(signum, handler) for signum, handler in handlers.items()}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _armed(path: Path, ops: _RaiseAt, handlers: dict[int, Any]) -> Iterator[Journal]:
    """A journal at `path` with one session "s", `handlers` set and `ops` armed: its
    signals come at the next commit."""
    with _handlers(handlers), Journal.open(path, durability="os", file_ops=ops) as j:
        j.create_session("s")
        ops.arm()
        yield j


@pytest.fixture
def sigint_counter() -> Iterator[list[int]]:
    calls: list[int] = []
    with _handlers({signal.SIGINT: lambda signum, frame: calls.append(signum)}):
        yield calls


def test_two_ctrl_c_inside_a_commit_run_the_handler_twice(
    tmp_path: Path, sigint_counter: list[int]
) -> None:
    # Held, the second Ctrl-C puts the handler back and runs it for both (asyncio's
    # handler, say, cancels on the first and raises on the second): none is dropped.
    handler = signal.getsignal(signal.SIGINT)
    ops = _RaiseAt("commit.view_flush", signal.SIGINT, signal.SIGINT)
    with _armed(tmp_path / "s", ops, {}) as j:
        j.append("s", [EventIn("t", b"x")])
        assert sigint_counter == [signal.SIGINT, signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is handler
        assert [e.data for e in j.replay("s")] == [b"x"]


def test_signals_of_two_kinds_run_their_handlers_after_the_request_as_they_came(
    tmp_path: Path,
) -> None:
    # SIGUSR2 then SIGUSR1 inside the commit: each handler runs once, in that order (not
    # the signals' numbers), with every handler already back, once the append is done.
    calls: list[tuple[int, bool, bool]] = []

    def note(signum: int, frame: object) -> None:
        back = signal.getsignal(signal.SIGUSR1) is note and signal.getsignal(signal.SIGUSR2) is note
        calls.append((signum, back, _in_the_queue()))

    ops = _RaiseAt("commit.batch_taken", signal.SIGUSR2, signal.SIGUSR1)
    with _armed(tmp_path / "s", ops, {signal.SIGUSR1: note, signal.SIGUSR2: note}) as j:
        j.append("s", [EventIn("t", b"x")])
        assert calls == [(signal.SIGUSR2, True, False), (signal.SIGUSR1, True, False)]
        assert [e.data for e in j.replay("s")] == [b"x"]


def test_a_second_signal_of_a_held_kind_runs_what_is_held_at_once(tmp_path: Path) -> None:
    # As with Ctrl-C: SIGUSR2, then SIGUSR1 twice inside the commit. The first two are
    # held; the third puts the handlers back and runs all three there, as they came.
    calls: list[tuple[str, int, bool]] = []

    class Log(_RaiseAt):
        def point(self, name: str, detail: object = None) -> None:
            if name == self.where and self.left:
                self.left = False
                for signum in self.signums:
                    calls.append(("sent", signum, True))
                    signal.raise_signal(signum)

    def note(signum: int, frame: object) -> None:
        assert signal.getsignal(signal.SIGUSR1) is note
        calls.append(("ran", signum, _in_the_queue()))

    ops = Log("commit.view_flush", signal.SIGUSR2, signal.SIGUSR1, signal.SIGUSR1)
    with _armed(tmp_path / "s", ops, {signal.SIGUSR1: note, signal.SIGUSR2: note}) as j:
        j.append("s", [EventIn("t", b"x")])
        sent = [("sent", signum, True) for signum in ops.signums]
        assert calls == [*sent, *[("ran", signum, True) for signum in ops.signums]]
        assert signal.getsignal(signal.SIGUSR2) is note
        assert [e.data for e in j.replay("s")] == [b"x"]


def test_handlers_that_are_not_python_code_are_left_alone(tmp_path: Path) -> None:
    # SIG_IGN and SIG_DFL stay in place during the request; Python handlers (SIGHUP's,
    # SIGWINCH's) are swapped.
    seen: dict[int, object] = {}

    class Look(FileOps):
        def point(self, name: str, detail: object = None) -> None:
            if name == "commit.batch_taken":
                for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGWINCH):
                    seen[signum] = _signal.getsignal(signum)

    def python(signum: int, frame: object) -> None:
        pass

    def hup(signum: int, frame: object) -> None:
        pass

    handlers = {
        signal.SIGUSR1: signal.SIG_IGN,
        signal.SIGUSR2: signal.SIG_DFL,
        signal.SIGHUP: hup,
        signal.SIGWINCH: python,
    }
    with (
        _handlers(handlers),
        Journal.open(tmp_path / "s", durability="os", file_ops=Look()) as j,
    ):
        j.create_session("s")
        j.append("s", [EventIn("t", b"x")])
        assert seen[signal.SIGUSR1] == signal.SIG_IGN
        assert seen[signal.SIGUSR2] == signal.SIG_DFL
        assert seen[signal.SIGHUP] is not hup  # (held)
        assert seen[signal.SIGWINCH] is not python  # (held)
        assert signal.getsignal(signal.SIGHUP) is hup
        assert signal.getsignal(signal.SIGWINCH) is python


_NOT_FROM_PYTHON = """
import _signal, signal, sys
sys.path.insert(0, sys.argv[1])
from journal import EventIn, Journal
from journal._local.files import FileOps

seen = []

class Look(FileOps):
    def point(self, name, detail=None):
        if name == "commit.batch_taken":
            seen.append(_signal.getsignal(signal.SIGSEGV))

before = signal.getsignal(signal.SIGSEGV)
with Journal.open(sys.argv[2] + "/s", durability="os", file_ops=Look()) as j:
    j.create_session("s")
    j.append("s", [EventIn("t", b"x")])
print(repr(before), repr(seen[-1]), repr(signal.getsignal(signal.SIGSEGV)))
"""


def test_a_handler_not_set_from_python_is_left_alone(tmp_path: Path) -> None:
    # A handler that C code installed before Python's signal module started (here
    # faulthandler's SIGSEGV handler, with -X faulthandler) reads as None in Python:
    # putting anything back would replace the C handler, so it is never swapped.
    out = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", _NOT_FROM_PYTHON, str(ROOT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert out == ["None", "None", "None"], out


def test_a_failure_inside_the_queue_puts_every_handler_back(
    tmp_path: Path, sigint_counter: list[int]
) -> None:
    # An exception raised inside the queue (at a fault point): the append fails, and the
    # SIGINT and SIGUSR1 handlers are the caller's again (a swapped one left in place
    # swallowed every later first Ctrl-C).
    class Fail(FileOps):
        armed = False

        def point(self, name: str, detail: object = None) -> None:
            if name == "commit.queued" and self.armed:
                self.armed = False
                raise _Boom

    def usr1(signum: int, frame: object) -> None:
        pass

    handler = signal.getsignal(signal.SIGINT)
    ops = Fail()
    with (
        _handlers({signal.SIGUSR1: usr1}),
        Journal.open(tmp_path / "s", durability="os", file_ops=ops) as j,
    ):
        j.create_session("s")
        ops.armed = True
        with pytest.raises(_Boom):
            j.append("s", [EventIn("t", b"lost")])
        assert signal.getsignal(signal.SIGINT) is handler
        assert signal.getsignal(signal.SIGUSR1) is usr1
        j.append("s", [EventIn("t", b"kept")])
        assert [e.data for e in j.replay("s")] == [b"kept"]


def test_a_raising_handler_inside_the_queue_raises_once_the_append_is_done(
    tmp_path: Path,
) -> None:
    # A SIGUSR1 handler that raises, signalled inside the queue: held, so the append is
    # made and the exception comes after it (before, the append failed and the rest of
    # the queue's work was cut short).
    def stop(signum: int, frame: object) -> None:
        raise _Boom

    ops = _RaiseAt("commit.queued", signal.SIGUSR1)
    with _armed(tmp_path / "s", ops, {signal.SIGUSR1: stop}) as j:
        with pytest.raises(_Boom):
            j.append("s", [EventIn("t", b"held")])
        assert signal.getsignal(signal.SIGUSR1) is stop
        assert [e.data for e in j.replay("s")] == [b"held"]


def test_a_write_from_a_held_handler_is_made_after_the_request(tmp_path: Path) -> None:
    # A SIGUSR1 handler that appends, signalled while the main thread leads a commit of
    # the same journal: held, it runs once the main thread is out of the queue, and its
    # write is made. Signalled twice there, it runs inside (a second signal does not
    # wait), where a write would wait for a batch only that thread can finish: refused.
    refused: list[BaseException] = []
    ops = _RaiseAt("commit.batch_taken", signal.SIGUSR1)

    def usr1(signum: int, frame: object) -> None:
        try:
            j.append("s", [EventIn("t", b"from the handler")])
        except Unsupported as e:
            refused.append(e)

    with _armed(tmp_path / "s", ops, {signal.SIGUSR1: usr1}) as j:
        j.append("s", [EventIn("t", b"outer")])
        assert not refused
        assert [e.data for e in j.replay("s")] == [b"outer", b"from the handler"]
        ops.signums = (signal.SIGUSR1, signal.SIGUSR1)
        ops.arm()
        j.append("s", [EventIn("t", b"outer again")])
        assert len(refused) == 2 and all("signal handler" in str(e) for e in refused)
        j.append("s", [EventIn("t", b"after")])  # (the main thread is out again)
        assert [e.data for e in j.replay("s")][2:] == [b"outer again", b"after"]


def _traced(code: Callable[[FrameType], bool], at: Callable[[FrameType, int], None]) -> Any:
    """A trace function for `sys.settrace` that calls `at(frame, n)` at the n-th opcode
    (counted from 1, across frames) of the frames `code` chooses."""
    count = [0]

    def local(frame: FrameType, event: str, arg: object) -> Any:
        if event == "opcode":
            count[0] += 1
            at(frame, count[0])
        return local

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if not code(frame):
            return None
        _opcode_events(frame, local)
        return local

    return tracer


def _opcode_events(frame: FrameType, local: Any) -> None:
    """Asks for `frame`'s opcode events, from a global trace function's "call" event.
    Python 3.13 sends none to a frame whose `f_trace_opcodes` was set before its `f_trace`
    (the local trace function a "call" event returns is set after it) the first time its
    code is traced: set `f_trace` first."""
    frame.f_trace = local
    frame.f_trace_opcodes = True


@contextlib.contextmanager
def _tracing(tracer: Any) -> Iterator[None]:
    # Python 3.12 sends opcode events only when some frame had set `f_trace_opcodes`
    # before the `sys.settrace` (CPython gh-114480): this one does (its own has no effect).
    sys._getframe().f_trace_opcodes = True  # noqa: SLF001 (this frame's)
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield
    finally:
        sys.settrace(previous)


def test_a_signal_at_any_bytecode_of_the_holding_loses_nothing(tmp_path: Path) -> None:
    # SIGUSR2 (its handler raises) at each bytecode in turn of the code that swaps the
    # handlers, enters the queue, puts them back and runs the held ones, with SIGINT,
    # SIGUSR1 and SIGUSR2 all Python handlers: every handler is back afterwards, the
    # handler ran once and its exception came out of the append once, from no frame of
    # the queue, and the append is in the journal at most once (not at all when the
    # signal came before the request was made). Before any swap, between two swaps,
    # between two put-backs: every window.
    holding = {"submit", "_submit_main", "_holding_signals", "hold", "_rescan", "_release"}
    holding |= {"_put_back", "_run_held", "_submit"}

    def chosen(frame: FrameType) -> bool:
        module = frame.f_globals.get("__name__", "")
        return module.endswith("commit_queue") and frame.f_code.co_name in holding

    fired: list[int] = []
    target = [0]
    ran: list[int] = []

    def at(frame: FrameType, n: int) -> None:
        if n == target[0]:
            fired.append(n)
            signal.raise_signal(signal.SIGUSR2)

    def boom(signum: int, frame: object) -> None:
        ran.append(signum)
        raise _Boom

    def quiet(signum: int, frame: object) -> None:
        pass

    handlers = {signal.SIGINT: quiet, signal.SIGUSR1: quiet, signal.SIGUSR2: boom}
    with (
        _handlers(handlers),
        Journal.open(tmp_path / "s", durability="os") as j,
    ):
        j.create_session("s")
        n = 0
        while True:
            n += 1
            target[0] = n
            fired.clear()
            ran.clear()
            data = f"{n}".encode()
            try:
                with _tracing(_traced(chosen, at)):
                    j.append("s", [EventIn("t", data)])
            except _Boom as e:
                inside = [f.name for f in traceback.extract_tb(e.__traceback__) if _inside(f)]
                assert not inside, (n, inside)
            else:
                assert not fired, n
                break  # (past the last bytecode)
            assert fired == [n] and ran == [signal.SIGUSR2], n
            for signum, handler in handlers.items():
                assert signal.getsignal(signum) is handler, (n, signum)
        assert n > 50  # (the traced code ran at least that many bytecodes)
        committed = [e.data for e in j.replay("s")]
        assert len(committed) == len(set(committed))
        assert j.verify().ok


def test_a_raising_handler_right_after_the_view_commits_leaves_the_journal_readable(
    tmp_path: Path,
) -> None:
    # SIGUSR1 (its handler raises) at each bytecode of the commit between the end of the
    # view's write transaction and the end of the commit's `try`: held, the exception
    # comes after the append. (Before, one right after the LMDB commit made the commit
    # undo a frame the view already held: the next read said JournalCorrupt.)
    commit = LocalEngine._commit  # noqa: SLF001 (its source lines, read only)
    source, first = inspect.getsourcelines(commit)
    begin = next(first + i for i, line in enumerate(source) if "view.begin(write=True)" in line)
    last = next(first + i for i, line in enumerate(source) if "transaction_id = txn.id()" in line)
    # The `with`'s exit after its last line (then its exception path), in order: the
    # LMDB commit is its call.
    code = list(dis.get_instructions(commit))
    end = max(i for i, ins in enumerate(code) if ins.positions and ins.positions.lineno == last)
    exit = []
    for ins in code[end + 1 :]:
        if not ins.positions or ins.positions.lineno != begin:
            break
        exit.append(ins.opname)
    call = next(i for i, name in enumerate(exit) if name.startswith("CALL")) + 1
    after = [False]
    target = [0]
    fired: list[int] = []
    count = [0]

    def local(frame: FrameType, event: str, arg: object) -> Any:
        if event == "line" and frame.f_lineno == last:
            after[0] = True
        elif event == "opcode" and after[0] and frame.f_lineno == begin:
            count[0] += 1  # (the `with`'s exit: the LMDB commit, and what follows it)
            if count[0] == target[0]:
                fired.append(count[0])
                signal.raise_signal(signal.SIGUSR1)
        return local

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code is not commit.__code__:
            return None
        _opcode_events(frame, local)
        return local

    def stop(signum: int, frame: object) -> None:
        raise _Boom

    with (
        _handlers({signal.SIGUSR1: stop}),
        Journal.open(tmp_path / "s", durability="os") as j,
    ):
        j.create_session("s")
        appended = []
        # Right after the commit first, then before it; past the exit, nothing fires.
        for n in [*range(call + 1, call + 8), *range(1, call + 1)]:
            after[0], target[0], count[0] = False, n, 0
            data = f"{n}".encode()
            appended.append(data)
            try:
                with _tracing(tracer):
                    j.append("s", [EventIn("t", data)])
            except _Boom:
                assert fired[-1:] == [n]
            else:
                assert n > call and fired[-1:] != [n]
            assert [e.data for e in j.replay("s")] == appended
        assert sorted(fired) == list(range(1, max(fired) + 1)), (fired, exit)
        assert max(fired) > call, (fired, exit)  # (signals after the commit, too)
        assert j.verify().ok


# -- review (h-review): defects of the holding ------------------------------------------


def test_a_held_handler_that_installs_another_is_followed_by_the_next_signal(
    tmp_path: Path,
) -> None:
    # The common "first Ctrl-C: stop gracefully, second: force" handler installs the
    # forcing one when it runs. Unheld, two Ctrl-C run graceful then force; held, both
    # ran the handler read at the start of the request (graceful twice): the program's
    # own way out was swallowed. A held signal must run the handler in place when it runs.
    calls: list[str] = []

    def force(signum: int, frame: object) -> None:
        calls.append("force")

    def graceful(signum: int, frame: object) -> None:
        calls.append("graceful")
        signal.signal(signal.SIGINT, force)

    with _handlers({signal.SIGINT: graceful}):  # (unheld: what a program expects)
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
    assert calls == ["graceful", "force"]
    calls.clear()
    ops = _RaiseAt("commit.view_flush", signal.SIGINT, signal.SIGINT)
    with _armed(tmp_path / "s", ops, {signal.SIGINT: graceful}) as j:
        j.append("s", [EventIn("t", b"x")])
        assert calls == ["graceful", "force"]


def test_a_held_handler_that_ignores_another_signal_is_obeyed_by_that_signal(
    tmp_path: Path,
) -> None:
    # SIGUSR1's handler sets SIGUSR2 to SIG_IGN (a shutdown handler that ignores what
    # comes next); SIGUSR1 then SIGUSR2 came inside the commit. The held SIGUSR2 still
    # ran its old handler, which is no longer installed.
    calls: list[str] = []

    def usr1(signum: int, frame: object) -> None:
        calls.append("usr1")
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)

    def usr2(signum: int, frame: object) -> None:
        calls.append("usr2")

    ops = _RaiseAt("commit.view_flush", signal.SIGUSR1, signal.SIGUSR2)
    with _armed(tmp_path / "s", ops, {signal.SIGUSR1: usr1, signal.SIGUSR2: usr2}) as j:
        j.append("s", [EventIn("t", b"x")])
        assert calls == ["usr1"]


def _sa_flags(signum: int) -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    action = ctypes.create_string_buffer(256)  # (struct sigaction, x86-64 glibc layout)
    assert libc.sigaction(signum, None, action) == 0
    return int.from_bytes(action.raw[136:140], sys.byteorder)


def test_a_child_forked_while_the_main_thread_is_in_the_queue_has_its_handlers(
    tmp_path: Path,
) -> None:
    # Another thread forks while the main thread is in the queue (the fork gate waits
    # only for LMDB transactions): the child inherited `hold` as its SIGTERM handler, so
    # a SIGTERM to the child was noted and never run (its handler exits 42).
    import threading
    import time

    children: list[int] = []

    class ForkAt(FileOps):
        armed = False

        def point(self, name: str, detail: object = None) -> None:
            if name == "commit.queued" and self.armed:
                self.armed = False

                def fork() -> None:
                    pid = os.fork()
                    if pid == 0:
                        os.kill(os.getpid(), signal.SIGTERM)
                        time.sleep(0.5)
                        os._exit(0)
                    children.append(pid)

                thread = threading.Thread(target=fork)
                thread.start()
                thread.join()

    def term(signum: int, frame: object) -> None:
        os._exit(42)

    ops = ForkAt()
    with (
        _handlers({signal.SIGTERM: term}),
        Journal.open(tmp_path / "s", durability="os", file_ops=ops) as j,
    ):
        j.create_session("s")
        ops.armed = True
        j.append("s", [EventIn("t", b"x")])
    (child,) = children
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 42
