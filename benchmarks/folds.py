"""Folds: restoring a fold of a large session from a checkpoint against folding it from
scratch, and `Fold.update()` round trips per second with 1 and with 4 contending
processes on one session.

The restore rows fill one session of `events` 580-byte benchmark events (durability
"os", batches of 1,000, no history window), then, in a fresh journal, time one `fold()`
with a reducer of no checkpoint's version (every event is read, decoded and reduced)
and, after `snapshot()` stored a checkpoint at the last event, the median of 20
`fold()` calls that start from it. The update rows run `update()` on one counter for
`seconds` with the default durability ("fsync": each round trip is a durable append and
the read of what it appended), in this process and then in 4 processes at once, each a
fold of the same session: conflicts make them retry (the detail gives the `fn` calls
per committed update).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from journal import Event, EventIn, Journal, RetentionPolicy

from .events import make_events
from .latency import Extra

__all__ = ["restore_rows", "rows", "update_rows"]

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bytes_seen(state: int, event: Event) -> int:
    return state + len(event.data)


def restore_rows(directory: str, events: int) -> list[Extra]:
    """Restore from a checkpoint vs from scratch (see the module docstring)."""
    bodies = make_events(64)
    path = os.path.join(directory, "fold-restore")
    unbounded = RetentionPolicy(max_history_bytes=None)
    with Journal.open(path, durability="os", retention=unbounded) as j:
        j.create_session("big")
        for first in range(0, events, 1000):
            count = min(1000, events - first)
            j.append("big", [EventIn("message", bodies[(first + i) % 64]) for i in range(count)])
    with Journal.open(path, retention=unbounded) as j:
        start = time.perf_counter()
        scratch = j.fold("big", _bytes_seen, 0, version="scratch")
        scratch_s = time.perf_counter() - start
        if scratch.ordinal != events:
            raise RuntimeError(f"the fold from scratch reached {scratch.ordinal} of {events}")
        fold = j.fold("big", _bytes_seen, 0, version="checkpointed")  # also from scratch
        fold.snapshot()
        samples: list[float] = []
        for _ in range(20):
            start = time.perf_counter()
            restored = j.fold("big", _bytes_seen, 0, version="checkpointed")
            samples.append(time.perf_counter() - start)
            if restored.state != scratch.state or restored.ordinal != events:
                raise RuntimeError("the fold from the checkpoint differs from scratch")
    checkpoint_ms = statistics.median(samples) * 1e3
    label = f"{events:,}-event session"
    return [
        Extra(f"fold restore of a {label}, from scratch", scratch_s, "s", detail={}),
        Extra(
            f"fold restore of a {label}, from a checkpoint",
            checkpoint_ms,
            "ms",
            "faster than from scratch",
            scratch_s / (checkpoint_ms / 1e3),
            {"p99": max(samples) * 1e3, "events/s from scratch": events / scratch_s},
        ),
    ]


_CHILD = """
import sys, time
from journal import EventIn, Journal
with Journal.open(sys.argv[1]) as j:
    fold = j.fold("counter", lambda s, e: s + 1, 0)
    calls = 0
    def increment(state):
        global calls
        calls += 1
        return [EventIn("incremented", b"%d" % (state + 1))]
    print("ready", flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + float(sys.argv[2])
    done = 0
    while time.monotonic() < deadline:
        fold.update(increment, tries=10_000)
        done += 1
    print(done, calls, flush=True)
"""


def _contended(path: str, processes: int, seconds: float) -> tuple[int, int]:
    """(committed updates, fn calls) of `processes` processes for `seconds`."""
    env = {**os.environ, "PYTHONPATH": _ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, path, str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError("an update process did not start")
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        done = calls = 0
        for child in children:
            out, _ = child.communicate(timeout=seconds + 60)
            committed, tried = (int(v) for v in out.split())
            done += committed
            calls += tried
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    return done, calls


def update_rows(directory: str, seconds: float = 3.0) -> list[Extra]:
    """`update()` round trips per second, 1 process and 4 contending (durable)."""
    path = os.path.join(directory, "fold-updates")
    with Journal.open(path) as j:
        j.create_session("counter")
    single, single_calls = _contended(path, 1, seconds)
    several, several_calls = _contended(path, 4, seconds)
    with Journal.open(path) as j:
        total = j.fold("counter", lambda s, e: s + 1, 0).state
    if total != single + several:
        raise RuntimeError(f"the counter ended at {total}, not {single + several}")
    single_rate = single / seconds
    return [
        Extra(
            "fold update() round trips, 1 process (durable)",
            single_rate,
            "updates/s",
            detail={"fn calls per update": single_calls / max(single, 1)},
        ),
        Extra(
            "fold update() round trips, 4 contending processes (durable)",
            several / seconds,
            "updates/s",
            "1 process",
            several / seconds / single_rate,
            {"fn calls per update": several_calls / max(several, 1)},
        ),
    ]


def rows(directory: str, events: int, seconds: float = 3.0) -> list[Extra]:
    return restore_rows(directory, events) + update_rows(directory, seconds)


if __name__ == "__main__":
    import tempfile

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    with tempfile.TemporaryDirectory(prefix="journal-folds-") as scratch:
        started = time.perf_counter()
        for row in rows(scratch, count):
            print(row)
        print(f"({time.perf_counter() - started:.1f} s)")
