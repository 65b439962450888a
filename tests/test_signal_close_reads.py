"""A signal handler that closes the journal while the main thread is inside a read.

Python runs a signal handler in the main thread between any two of its steps, so a
SIGTERM handler that calls `Journal.close()` closes the journal in the middle of
whatever that thread was doing: here, inside a page read (the local engine's page
readers, held for the page; an LMDB read transaction). Real processes and real signals
(`signal.raise_signal`, raised by a trace function at a chosen line), one process
sweeping many points, each on a journal of its own opened for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _turn_blocks import journal_arguments, run_child
from engines import ENGINES, EngineFactory, JetStreamEngineFactory, engine_params

from journal import EventIn, Journal

ROOT = Path(__file__).resolve().parent.parent

# argv: store; the workload ("reads": a `read`, a `replay` and a few pages of a `watch`;
# "turn": `own()`, a turn with an append, a plain append and the release first;
# "readonly": the reads on a read-only journal whose private view has commits to catch
# up); the modules of `journal` whose lines are counted (comma-separated; "*":
# all journal code); the first point, the step between points, the last point, and the
# bound of one point (s). Point n raises SIGTERM at the n-th line counted. Prints one
# JSON line per point, then the number of lines counted; a point that hangs past its
# bound has every thread's stack dumped and the process exits 1 (faulthandler).
_SWEEP = r"""
import faulthandler, json, os, signal, sys, threading
import journal
from journal import EventIn, Journal, JournalClosed

store, what, files = sys.argv[1], sys.argv[2], sys.argv[3]
first, step, last, bound = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
URL = os.environ.get("SWEEP_NATS_URL")  # (set: the JetStream engine, `store` its name)
PKG = os.path.dirname(journal.__file__) + os.sep
READER = os.path.join(PKG, "_local", "reader.py")
FILES = None if files == "*" else {os.path.join(PKG, f) for f in files.split(",")}
point = {"n": 0, "at": 0, "where": None, "in_page": False, "j": None}

def on_sigterm(signum, frame):
    point["j"].close()

signal.signal(signal.SIGTERM, on_sigterm)

def in_page(frame):
    while frame is not None:
        if frame.f_code.co_name == "read_page" and frame.f_code.co_filename == READER:
            return True
        frame = frame.f_back
    return False

def local(frame, event, arg):
    if event == "line" and (FILES is None or frame.f_code.co_filename in FILES):
        point["n"] += 1
        if point["n"] == point["at"]:
            point["where"] = f"{os.path.relpath(frame.f_code.co_filename, PKG)}:{frame.f_lineno}"
            point["in_page"] = in_page(frame)
            signal.raise_signal(signal.SIGTERM)  # (its handler runs here, at once)
    return local

def call(frame, event, arg):
    return local if frame.f_code.co_filename.startswith(PKG) else None

def workload(j, sid):
    if what == "readonly":
        j.get_session(sid)
    if what == "turn":
        with j.own(sid) as owner:
            with owner.turn("r1") as turn:
                turn.append([EventIn("message", b'{"n": 1}')])
        j.append(sid, [EventIn("message", b'{"n": 2}')])
    j.read(sid, max_bytes=64)
    for _ in j.replay(sid, max_bytes=64):
        pass
    stop = threading.Event()
    for seen, _ in enumerate(j.watch(sid, stop=stop, max_bytes=64)):
        if seen == 3:
            stop.set()

def opened(where, **keywords):
    if URL is None:
        return Journal.open(where, **keywords)
    return Journal.open(URL, store=where, **keywords)

def fds():
    return len(os.listdir("/proc/self/fd"))

with opened(store, durability="os") as j:
    j.append("warm", [EventIn("message", b"{}")], create=True)
writer = None
at = first
while at <= last:
    sid = f"s{at}"
    events = [EventIn("message", b'{"n": %d}' % n) for n in range(6)]
    if what != "readonly":
        with opened(store, durability="os") as j:
            j.append(sid, events, create=True)
        before = fds()
        j = opened(store, durability="os")
    else:
        # (A writer holds the view, so the reader's is a private one, which catches up
        # at each read. A store of its own: a private view projects the whole log.)
        if writer is not None:
            writer.close()
        writer = Journal.open(f"{store}-{at}", durability="os")
        writer.append(sid, events[:3], create=True)
        before = fds()
        j = Journal.open(f"{store}-{at}", readonly=True)
        writer.append(sid, events[3:])  # (the reader's first read projects them)
    point.update(n=0, at=at, where=None, in_page=False, j=j)
    faulthandler.dump_traceback_later(bound, exit=True)
    sys.settrace(call)
    try:
        workload(j, sid)
        outcome = "completed"
    except JournalClosed:
        outcome = "JournalClosed"
    except BaseException as error:
        outcome = f"{type(error).__name__}: {error}"
    finally:
        sys.settrace(None)
        faulthandler.cancel_dump_traceback_later()
    closed = j.closed
    j.close()
    del j
    point["j"] = None
    left = fds() - before
    if point["where"] is None:
        break
    print(json.dumps({"at": at, "where": point["where"], "in_page": point["in_page"],
                      "outcome": outcome, "closed": closed, "fds_left": left}), flush=True)
    at += step
if writer is not None:
    writer.close()
print(json.dumps({"lines": point["n"]}), flush=True)
"""


def _sweep(
    store: Path | str, what: str, files: str, step: int, budget_s: float, url: str = ""
) -> list[dict[str, object]]:
    """The points of one sweeping process (see `_SWEEP`: every `step`-th line from the
    first, each bounded by 10 s); the test fails when one hung."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if url:
        env["SWEEP_NATS_URL"] = url
    args = [str(store), what, files, "1", str(step), str(10**6), "10"]
    child = subprocess.Popen(
        [sys.executable, "-c", _SWEEP, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        output, _ = child.communicate(timeout=budget_s)
    except subprocess.TimeoutExpired:
        child.kill()
        output, _ = child.communicate()
        pytest.fail("the sweep did not end in time:\n" + output[-4000:])
    assert child.returncode == 0, "a point hung (stacks dumped):\n" + output[-4000:]
    points = [json.loads(line) for line in output.splitlines()]
    assert points and "lines" in points[-1], output[-4000:]
    return points[:-1]


def _check(points: list[dict[str, object]]) -> None:
    """Each point's read completed or raised `JournalClosed`, the journal is closed, and
    the close let go of every descriptor the journal opened (a close deferred to the end
    of the page read it interrupted is done once that read ends)."""
    for point in points:
        assert point["outcome"] in ("completed", "JournalClosed"), point
        assert point["closed"] is True, point
        assert point["fds_left"] == 0, point


def _verified(store: Path) -> None:
    with Journal.open(store) as j:
        report = j.verify()
    assert report.ok, report


def test_a_signal_handler_closes_inside_a_page_read(tmp_path: Path) -> None:
    """A SIGTERM handler that closes the journal, run at every fourth line of the page
    reader (the local engine's `read_page` and its page readers) during a `read`, a
    `replay` and a `watch`: the close waited for the page readers' lock, held by the very
    read it interrupted, for good. The read now ends with `JournalClosed` or completes,
    its page readers closed as the page ends and the environments as its transaction
    ends; no descriptor is left open, and the store verifies clean."""
    points = _sweep(tmp_path / "store", "reads", "_local/reader.py", 4, 240.0)
    _check(points)
    assert sum(bool(point["in_page"]) for point in points) >= 50, points
    _verified(tmp_path / "store")


def test_a_signal_handler_closes_as_its_thread_releases_a_lease(tmp_path: Path) -> None:
    """The same at every line of the local engine's leases during `own()`, a turn, its
    release and reads: a close while the release held its lease's lock (taking the lock
    file's descriptor) took that lock again, for good."""
    points = _sweep(tmp_path / "store", "turn", "_local/leases.py", 1, 240.0)
    _check(points)
    assert any(point["where"].startswith("_local/leases.py") for point in points)
    _verified(tmp_path / "store")


def test_a_signal_handler_closes_a_read_only_journal_catching_up(tmp_path: Path) -> None:
    """The same at every line of the local engine's module during reads of a read-only
    journal whose private view has commits to project: a close while the catch-up held
    the private view's lock took it again, for good."""
    points = _sweep(tmp_path / "store", "readonly", "_local/engine.py", 1, 240.0)
    _check(points)
    assert len(points) > 20, points


@pytest.mark.slow
def test_a_signal_handler_closes_at_every_line_of_reads_and_turns(tmp_path: Path) -> None:
    """The same at every line of the page reader during reads, at every line of the
    read-only journal's catch-up and page reads, and at every third line of all journal
    code that `own()`, a turn with an append, a plain append, the release and the reads
    run (SPEC 7.8 gives the counts of a sweep of every second line)."""
    points = _sweep(tmp_path / "a", "reads", "_local/reader.py", 1, 1200.0)
    _check(points)
    points = _sweep(
        tmp_path / "b",
        "readonly",
        "_local/engine.py,_local/private_tail.py,_local/reader.py",
        1,
        3600.0,
    )
    _check(points)
    points = _sweep(tmp_path / "c", "turn", "*", 3, 3600.0)
    _check(points)
    assert len(points) > 2000 and sum(bool(point["in_page"]) for point in points) > 400
    for store in ("a", "b", "c"):
        _verified(tmp_path / store)


# A process whose SIGTERM handler closes the journal, the signal raised at the second
# line its owner's lease runs as it is released (as the turn's owner lets go): the
# line where the release held its lease's lock, which the close's release of the same
# lease took again.
_LEASE_RELEASED = """
import json, signal, sys
from journal import Journal, JournalClosed
from journal._jetstream.leases import JetStreamLease
from journal._local.leases import LocalLease
j = Journal.open(sys.argv[1], durability="os", **json.loads(sys.argv[2]))
closed = []

def on_sigterm(signum, frame):
    j.close()
    closed.append(j.closed)

signal.signal(signal.SIGTERM, on_sigterm)
releases = {LocalLease.release.__code__, JetStreamLease.release.__code__}
lines = [0]

def local(frame, event, arg):
    if event == "line":
        lines[0] += 1
        if lines[0] == 2 and not closed:
            signal.raise_signal(signal.SIGTERM)  # (its handler runs here, at once)
    return local

def call(frame, event, arg):
    return local if frame.f_code in releases else None

with j.own("s") as owner:
    with owner.turn("r1"):
        pass
    sys.settrace(call)
sys.settrace(None)
print("closed:", closed, flush=True)
"""


def test_a_signal_handler_closes_as_its_thread_releases_the_lease(
    engine: EngineFactory, store: Path
) -> None:
    """A SIGTERM handler that closes the journal while the main thread releases its
    owner's lease (inside the release's once-only step): the close released the same
    lease, took that step's lock again and waited for itself for good. It closes, the
    lease is released once, and the next owner takes it at once. Both engines."""
    with engine.open(store, durability="os") as j:
        j.create_session("s")
    exited, output = run_child(_LEASE_RELEASED, journal_arguments(engine, store))
    assert exited, output
    assert output.splitlines() == ["closed: [True]"]
    with engine.open(store, durability="os") as j, j.own("s") as owner:
        assert owner.recovered_turn is None


# The JetStream engines of `engine_params` (one server; the cluster's under its mark).
_JETSTREAM = [
    pytest.param(ENGINES[param.values[0]], marks=param.marks, id=param.id)
    for param in engine_params()
    if isinstance(ENGINES[param.values[0]], JetStreamEngineFactory)
]


@pytest.mark.parametrize("engine", _JETSTREAM)
def test_a_signal_handler_closes_inside_a_read_of_jetstream(
    engine: JetStreamEngineFactory, store: Path
) -> None:
    """The same with the JetStream engine, at every fourth line of its connection's calls and of
    the read scopes, during `own()`, a turn, its release and the reads: a close while a
    request was registered (under the connection's lock of calls), or while a
    follower's read registered its cancel hook (under its scope's lock; the close's
    release of the lease sends a request in that scope), took that lock again and waited
    for good."""
    files = "_jetstream/client.py,engine.py"
    points = _sweep(engine.store_name(store), "turn", files, 4, 600.0, engine.url())
    _check(points)
    assert len(points) > 20, points


# A process whose read is interrupted (SIGINT's KeyboardInterrupt) at the line right
# after an LMDB transaction entered the transactions' gate, before it opened; then it
# closes the journal and opens the store again.
_INTERRUPTED_AT_THE_GATE = """
import signal, sys
from journal import Journal
from journal._local.view import _Transaction
j = Journal.open(sys.argv[1], durability="os")
code = _Transaction.__enter__.__code__
target = code.co_firstlineno + 3  # (the line after `TRANSACTIONS.enter(self)`)
fired = []

def local(frame, event, arg):
    if event == "line" and frame.f_lineno == target and not fired:
        fired.append(True)
        signal.raise_signal(signal.SIGINT)  # (KeyboardInterrupt, raised here)
    return local

def call(frame, event, arg):
    return local if frame.f_code is code else None

sys.settrace(call)
try:
    j.read("s")
except KeyboardInterrupt:
    print("interrupted", flush=True)
finally:
    sys.settrace(None)
j.close()
with Journal.open(sys.argv[1], durability="os") as j:
    print("reopened:", len(j.read("s").events), flush=True)
"""


def test_a_read_interrupted_as_it_enters_a_transaction_leaves_the_close_whole(
    store: Path,
) -> None:
    """A KeyboardInterrupt landing right after a transaction entered the transactions'
    gate (before the `try` that leaves it on an error) left this thread counted inside
    for good: every later close of a journal in it put its release off to a leave that
    never came, and opening the store again said it was open already."""
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
    exited, output = run_child(_INTERRUPTED_AT_THE_GATE, [str(store)])
    assert exited, output
    assert output.splitlines() == ["interrupted", "reopened: 0"], output


# The same, interrupted at the start of the transaction's `__exit__` (a function's start
# is a check point: the trace function's "call" event); the read is then asked again.
_INTERRUPTED_AS_IT_LEAVES = """
import signal, sys
from journal import Journal
from journal._local.view import _Transaction
j = Journal.open(sys.argv[1], durability="os")
code = _Transaction.__exit__.__code__
fired = []

def call(frame, event, arg):
    if frame.f_code is code and not fired:
        fired.append(True)
        signal.raise_signal(signal.SIGINT)  # (KeyboardInterrupt, raised as it starts)
    return None

sys.settrace(call)
try:
    j.read("s")
except KeyboardInterrupt:
    print("interrupted", flush=True)
finally:
    sys.settrace(None)
print("read again:", len(j.read("s").events), flush=True)
j.close()
with Journal.open(sys.argv[1], durability="os") as j:
    print("reopened:", len(j.read("s").events), flush=True)
"""


def test_a_read_interrupted_as_its_transaction_ends_leaves_the_close_whole(
    store: Path,
) -> None:
    """A KeyboardInterrupt at the start of the transaction's `__exit__` (before any of its
    code ran: the `with` statement calls it outside the block it protects) skipped its
    leave: the thread stayed counted inside the transactions' gate for good, and every
    later close in it put its release off (opening the store again said it was open
    already; a read-only journal kept its descriptors)."""
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
    exited, output = run_child(_INTERRUPTED_AS_IT_LEAVES, [str(store)])
    assert exited, output
    assert output.splitlines() == ["interrupted", "read again: 0", "reopened: 0"], output


# A SIGTERM handler that closes the journal, raised at the first line of the view's head
# read inside a page's LMDB transaction; then the store is opened again.
_CLOSED_INSIDE_A_TRANSACTION = """
import signal, sys
from journal import EventIn, Journal
from journal._local.view import View
j = Journal.open(sys.argv[1], durability="os")
signal.signal(signal.SIGTERM, lambda signum, frame: j.close())
code = View.head.__code__
fired = []

def local(frame, event, arg):
    if event == "line" and not fired:
        fired.append(True)
        signal.raise_signal(signal.SIGTERM)  # (its handler runs here, at once)
    return local

def call(frame, event, arg):
    return local if frame.f_code is code else None

sys.settrace(call)
try:
    page = j.read("s")
finally:
    sys.settrace(None)
print("read:", len(page.events), j.closed, flush=True)
with Journal.open(sys.argv[1], durability="os") as j:
    print("reopened:", len(j.read("s").events), flush=True)
"""


def test_a_close_inside_a_pages_transaction_lets_the_page_end(store: Path) -> None:
    """A close from a signal handler inside a page's LMDB transaction closes the
    environments as the transaction ends (`ForkGate.defer`), not under it: the page
    is read whole, and the store opens again afterwards. (Closed at once, the
    transaction failed and the read raised `JournalClosed`: the sweeps above accept
    that outcome, and passed without the deferral.)"""
    with Journal.open(store, durability="os") as j:
        j.append("s", [EventIn("message", b"{}")], create=True)
    exited, output = run_child(_CLOSED_INSIDE_A_TRANSACTION, [str(store)])
    assert exited, output
    assert output.splitlines() == ["read: 1 True", "reopened: 1"], output


# The same close (a SIGTERM handler, inside a page's transaction: `close_at_first_line`
# traces the view's head read), cut short its own way by each script's `call` below; then
# the read's outcome, what was fired, and the store opened again.
_CLOSED_IN_A_TRANSACTION_THEN = """
import dis, signal, sys
from journal import EventIn, Journal
from journal._local.view import View, _Transaction
from journal._local.writer import SegmentWriter
j = Journal.open(sys.argv[1], durability="os")
j.append("s", [EventIn("message", b"{}")])
signal.signal(signal.SIGTERM, lambda signum, frame: j.close())
head = View.head.__code__
fired = []

def close_at_first_line(frame, event, arg):
    if frame.f_code is head and event == "line" and not fired:
        fired.append("close")
        signal.raise_signal(signal.SIGTERM)  # (its handler runs here, at once)
    return close_at_first_line
"""
_READ_AND_REOPEN = """
sys.settrace(call)
try:
    print("read:", len(j.read("s").events), flush=True)
except BaseException as e:
    print(type(e).__name__, flush=True)
finally:
    sys.settrace(None)
print(fired, j.closed, flush=True)
with Journal.open(sys.argv[1], durability="os") as j:
    print("reopened:", len(j.read("s").events), flush=True)
"""

# A SIGINT as the release the transaction's end runs has just closed the active segment's
# descriptor (the line after `os.close` in the writer's `close`).
_RELEASE_INTERRUPTED = (
    _CLOSED_IN_A_TRANSACTION_THEN
    + """
close = SegmentWriter.close.__code__
# (Its one call is `os.close`: the instruction after it is where its return is checked.)
calls = [i.offset for i in dis.get_instructions(close) if i.opname == "CALL"]
assert len(calls) == 1, calls
after = min(i.offset for i in dis.get_instructions(close) if i.offset > calls[0])

def local(frame, event, arg):
    if frame.f_code is close and event == "opcode" and frame.f_lasti == after:
        if fired == ["close"]:
            fired.append("interrupt")
            signal.raise_signal(signal.SIGINT)  # (KeyboardInterrupt, raised here)
    return close_at_first_line(frame, event, arg) and local

def call(frame, event, arg):
    if frame.f_code is close:
        frame.f_trace = local
        frame.f_trace_opcodes = True
    return local if frame.f_code in (head, close) else None

sys._getframe().f_trace_opcodes = True  # (Python 3.12: CPython gh-114480)
"""
    + _READ_AND_REOPEN
)


def test_a_release_interrupted_as_it_ends_a_transaction_closes_each_descriptor_once(
    store: Path,
) -> None:
    """A close deferred to a transaction's end (a signal handler's, inside it) whose
    release a Ctrl+C cut short is run again whole as the transaction leaves the gate:
    each part must then close what it had not closed yet, and nothing twice. Until
    2026-12-07 the segment writer's `close` cleared its descriptor only after closing it:
    run again, it closed the same number a second time (another file's, had it been
    reused meanwhile; here EBADF), and the rest of the release never ran (the store
    stayed open in the process: "open already")."""
    with Journal.open(store, durability="os") as j:
        j.append("s", [EventIn("message", b"{}")], create=True)
    exited, output = run_child(_RELEASE_INTERRUPTED, [str(store)])
    assert exited, output
    assert output.splitlines() == [
        "KeyboardInterrupt",
        "['close', 'interrupt'] True",
        "reopened: 2",
    ], output


# A SIGINT at the start of that transaction's `__exit__` (which it then skips).
_CLOSED_THEN_INTERRUPTED_AS_IT_LEAVES = (
    _CLOSED_IN_A_TRANSACTION_THEN
    + """
leave = _Transaction.__exit__.__code__

def call(frame, event, arg):
    if frame.f_code is leave and fired == ["close"]:
        fired.append("interrupt")
        signal.raise_signal(signal.SIGINT)  # (KeyboardInterrupt, raised as it starts)
        return None
    return close_at_first_line if frame.f_code is head else None
"""
    + _READ_AND_REOPEN
)


def test_a_close_deferred_by_a_transaction_whose_end_is_interrupted_still_releases(
    store: Path,
) -> None:
    """A close deferred to a transaction's end (a signal handler's, inside it), then a
    Ctrl+C at the start of that transaction's `__exit__`: the leave never runs, and the
    transaction (the gate's holder) is dropped with the interrupt's traceback. The
    deferred release must still run: the store opens again in the process."""
    with Journal.open(store, durability="os") as j:
        j.append("s", [EventIn("message", b"{}")], create=True)
    exited, output = run_child(_CLOSED_THEN_INTERRUPTED_AS_IT_LEAVES, [str(store)])
    assert exited, output
    assert output.splitlines() == [
        "KeyboardInterrupt",
        "['close', 'interrupt'] True",
        "reopened: 2",
    ], output


# As the release the transaction's end runs starts closing the active segment, a SIGUSR1
# handler that reads another store (a transaction of its own, whose end finds the same
# release deferred).
_READ_DURING_THE_RELEASE = (
    _CLOSED_IN_A_TRANSACTION_THEN
    + """
other = Journal.open(sys.argv[2], durability="os")
other.append("o", [EventIn("message", b"{}")], create=True)
signal.signal(signal.SIGUSR1, lambda signum, frame: print("other:", len(other.read("o").events)))
close = SegmentWriter.close.__code__

def call(frame, event, arg):
    if frame.f_code is close and fired == ["close"]:
        fired.append("read")
        signal.raise_signal(signal.SIGUSR1)
        return None
    return close_at_first_line if frame.f_code is head else None
"""
    + _READ_AND_REOPEN
)


def test_a_read_in_a_signal_handler_during_a_deferred_release_lets_both_end(
    store: Path,
) -> None:
    """A deferred release (a close from a signal handler inside a transaction), run as
    the transaction ends, interrupted by a handler whose read ends a transaction of its
    own: that leave runs the same release (the thread is out), and the outer run, once
    resumed, must neither fail nor skip an action (it popped the list another run had
    emptied: IndexError)."""
    with Journal.open(store, durability="os") as j:
        j.append("s", [EventIn("message", b"{}")], create=True)
    exited, output = run_child(_READ_DURING_THE_RELEASE, [str(store), str(store) + "-other"])
    assert exited, output
    assert output.splitlines() == [
        "other: 1",
        "read: 2",
        "['close', 'read'] True",
        "reopened: 2",
    ], output
