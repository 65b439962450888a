"""A Ctrl+C that lands anywhere in a synchronous call of the JetStream engine's connection
(`Connection.call`: a read's request) or in its close (`Connection.close`, which waits for
the client's close and for the loop's tasks) leaves a journal whose close ends the
connection's thread (`journal-nats`) within seconds.

The script below raises SIGINT from a trace function of the main thread at each check
point of those frames and of everything they call in that thread (`_tracer.py`: the
condition a `concurrent.futures.Future` waits on, in threading.py, among them), in one
process, on a journal opened for each point; it then closes the journal (again, for the
close), and reports how long that took and which of the journal's threads it left.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _tracer import TRACER, run_sweep
from engines import ENGINES, JetStreamEngineFactory

ROOT = Path(__file__).resolve().parent.parent

# argv: the store's name; the workload ("read": a read-write journal's `read`, the points
# those under `Connection.call`; "close": a read-only journal's `close()` after a read, the
# points those under `Connection.close`); the step between points. Prints "POINTS n",
# then per point "AT n fired outcome close_s=S threads=T", then "END".
_SCRIPT = (
    TRACER
    + r"""
import faulthandler, threading, time
from journal import EventIn, Journal
import journal._jetstream.client as client

name, what, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
URL = os.environ["SWEEP_NATS_URL"]
CLIENT = client.__file__
SCOPE = "call" if what == "read" else "close"

with Journal.open(URL, store=name, create=True) as j:
    j.append("s", [EventIn("message", b"first")], create=True)

def under(frame):
    while frame is not None:
        code = frame.f_code
        if code.co_name == SCOPE and code.co_filename == CLIENT:
            return True
        frame = frame.f_back
    return False

def scoped(frame, event, arg):
    # (the tracer's, in the frames that run under the connection's `call` or `close`)
    return tracer(frame, event, arg) if under(frame) else None

def journal_threads(before, wait_s):
    # The journal's threads started since `before` (a set of threads) still alive.
    deadline = time.monotonic() + wait_s
    while True:
        alive = sorted(t.name for t in threading.enumerate()
                       if t.name.startswith("journal") and t not in before)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)

def at_point(at):
    before = set(threading.enumerate())
    j = Journal.open(URL, store=name, readonly=(what == "close"))
    if what == "close":
        j.read("s")
    state.update(n=0, at=at, fired=None)
    outcome = "done"
    faulthandler.dump_traceback_later(120, exit=True)  # (a hang: every stack, exit 1)
    sys.settrace(scoped)
    try:
        if what == "read":
            j.read("s")
        else:
            j.close()
    except BaseException as e:  # (KeyboardInterrupt, the one expected)
        outcome = type(e).__name__
    finally:
        sys.settrace(None)
    started = time.monotonic()
    j.close()  # (the close, or the close asked again)
    took = time.monotonic() - started
    faulthandler.cancel_dump_traceback_later()
    threads = journal_threads(before, 2.0)
    return state["n"], state["fired"], outcome, took, threads

points_seen, *_ = at_point(10**9)  # (no SIGINT: how many check points there are)
print(f"POINTS {points_seen}", flush=True)
for at in range(1, points_seen + 1, step):
    _, fired, outcome, took, threads = at_point(at)
    if fired is None:
        break
    print(f"AT {at} {fired} {outcome} close_s={took:.2f} threads={','.join(threads) or '-'}",
          flush=True)
print("END", flush=True)
"""
)


def _sweep(name: str, what: str, step: int, timeout: float, url: str) -> list[list[str]]:
    lines, cases = run_sweep(_SCRIPT, [name, what, str(step)], timeout, {"SWEEP_NATS_URL": url})
    assert len(cases) > 10, lines[:3]
    return cases


def _left(cases: list[list[str]]) -> list[str]:
    """The points after which the close took 3 s or more, or left a thread of the
    journal's (a close that waits for a loop that no longer runs gives up after 5 s)."""
    return [
        " ".join(case)
        for case in cases
        if case[3] not in ("KeyboardInterrupt", "done")
        or float(case[4].removeprefix("close_s=")) >= 3.0
        or case[5] != "threads=-"
    ]


@pytest.mark.cluster
@pytest.mark.parametrize("what", ["read", "close"])
def test_ctrl_c_at_each_point_of_a_connection_wait_leaves_a_close_that_ends_its_thread(
    store: Path, what: str
) -> None:
    """Until the fix the connection waited with `concurrent.futures.Future.result`, whose
    condition (an RLock) is taken and given back by Python code of threading.py in the
    waiting thread: a KeyboardInterrupt right after `Condition.__enter__` took it left
    it held by the main thread for good, and the loop's thread, which takes it to hand
    over the answer, blocked: the close waited 15 s for the loop and left the thread
    (`journal-nats`) alive (2 of a read's 114 points); one between the condition's
    release and its `try` raised RuntimeError in place of the KeyboardInterrupt (2
    more); and a close after one cut short once it asked the loop to stop waited 5 s
    for the client's close, which the stopping loop never ran (4 of the close's)."""
    engine = ENGINES["jetstream"]
    assert isinstance(engine, JetStreamEngineFactory)
    wrong = _left(_sweep(engine.store_name(store) + what[0], what, 1, 900, engine.url()))
    assert not wrong, "\n".join(wrong)
