"""Concurrency and latency workloads of the journal, each beside its baseline in one run.

- 16 threads appending single events durably (group commit) vs SQLite FULL committing
  single events (one transaction each) from one thread;
- the first event after a cursor in the middle of a large session (no scan);
- follow latency, append -> delivery, for a watcher in this process and in another one.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from journal import EventIn, Journal, RetentionPolicy

from .events import EVENT_BYTES, make_events
from .timing import percentile


@dataclass(slots=True)
class Extra:
    """One row of the second table: a value, its unit, and how it compares."""

    name: str
    value: float
    unit: str
    baseline: str = ""
    ratio: float | None = None
    detail: dict[str, float] = field(default_factory=dict)


def _ms(values_ns: list[int]) -> dict[str, float]:
    return {
        "p50": percentile(values_ns, 50) / 1e6,
        "p99": percentile(values_ns, 99) / 1e6,
        "max": max(values_ns) / 1e6,
    }


def sqlite_single_commits(directory: str, count: int, bodies: list[bytes]) -> float:
    """SQLite WAL synchronous=FULL, one event per transaction: events/s."""
    path = os.path.join(directory, "single.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(
        "CREATE TABLE events (session TEXT, seq INTEGER, body BLOB, PRIMARY KEY (session, seq))"
    )
    start = time.perf_counter()
    for seq in range(count):
        db.execute("BEGIN")
        db.execute("INSERT INTO events VALUES (?, ?, ?)", ("s", seq, bodies[seq % len(bodies)]))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - start
    db.close()
    return count / elapsed


def journal_threads(directory: str, threads: int, per_thread: int, bodies: list[bytes]) -> float:
    """`threads` threads each appending `per_thread` single events durably: events/s."""
    with Journal.open(os.path.join(directory, "threads")) as j:
        for t in range(threads):
            j.create_session(f"t{t}")
        barrier = threading.Barrier(threads + 1)

        def work(t: int) -> None:
            session = f"t{t}"
            barrier.wait()
            for i in range(per_thread):
                j.append(session, [EventIn("message", bodies[(t + i) % len(bodies)])])

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        barrier.wait()
        start = time.perf_counter()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - start
        total = j.get_session("t0").last_ordinal * threads
    if total != threads * per_thread:
        raise RuntimeError(f"appended {total} events, expected {threads * per_thread}")
    return threads * per_thread / elapsed


def resume_latency(directory: str, events: int, bodies: list[bytes]) -> dict[str, float]:
    """Build one session of `events` events; time read(cursor in the middle) -> first event."""
    batch = 1000
    cursors = []
    # No history window: the whole session stays retained for the measurement.
    unbounded = RetentionPolicy(max_history_bytes=None)
    with Journal.open(os.path.join(directory, "resume"), durability="os", retention=unbounded) as j:
        j.create_session("big")
        for first in range(0, events, batch):
            n = min(batch, events - first)
            result = j.append(
                "big", [EventIn("message", bodies[(first + i) % 64]) for i in range(n)]
            )
            if events // 3 <= result.last_ordinal <= 2 * events // 3:
                cursors.append(result.cursor)
    samples: list[int] = []
    with Journal.open(os.path.join(directory, "resume"), retention=unbounded) as j:
        for cursor in cursors[:: max(1, len(cursors) // 200)]:
            start = time.perf_counter_ns()
            page = j.read("big", cursor=cursor, max_bytes=1)
            samples.append(time.perf_counter_ns() - start)
            if len(page.events) != 1:
                raise RuntimeError("resume returned no event")
    return _ms(samples)


def follow_in_process(directory: str, samples: int) -> dict[str, float]:
    """A watcher thread in the writer's process: append -> delivery latency."""
    latencies: list[int] = []
    with Journal.open(os.path.join(directory, "follow"), durability="os") as j:
        j.create_session("live")
        ready = threading.Event()

        def watch() -> None:
            ready.set()
            for event in j.watch("live"):
                latencies.append(time.monotonic_ns() - int(event.data))

        watcher = threading.Thread(target=watch)
        watcher.start()
        ready.wait()
        for _ in range(samples):
            j.append("live", [EventIn("tick", str(time.monotonic_ns()).encode())])
            time.sleep(0.002)
        j.resolve_session("live")
        watcher.join(10)
    return _ms(latencies)


_CHILD = """
import sys, time
from journal import Journal
with Journal.open(sys.argv[1]) as j:
    print("ready", flush=True)
    out = []
    for event in j.watch("live"):
        out.append(time.monotonic_ns() - int(event.data))
    print(" ".join(map(str, out)), flush=True)
"""


def follow_cross_process(directory: str, samples: int) -> dict[str, float]:
    """A watcher in another process (CLOCK_MONOTONIC is system-wide on Linux)."""
    path = os.path.join(directory, "follow-x")
    with Journal.open(path, durability="os") as j:
        j.create_session("live")
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, path], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        raise RuntimeError("the watcher process did not start")
    time.sleep(0.2)
    with Journal.open(path, durability="os") as j:
        for _ in range(samples):
            j.append("live", [EventIn("tick", str(time.monotonic_ns()).encode())])
            time.sleep(0.003)
        j.resolve_session("live")
    out, _ = child.communicate(timeout=30)
    latencies = [int(v) for v in out.split()]
    if len(latencies) != samples:
        raise RuntimeError(f"the watcher saw {len(latencies)} of {samples} events")
    return _ms(latencies)


def _replay_rate(j: Journal, sessions: list[str]) -> float:
    start = time.perf_counter()
    count = 0
    for session in sessions:
        for _event in j.replay(session):
            count += 1
    return count / (time.perf_counter() - start)


def compaction_rows(directory: str, events: int) -> list[Extra]:
    """Compression and compaction on the benchmark events: throughput (MB/s of live data
    copied), bytes before/after, zstd ratio, replay from plain vs compressed segments."""
    bodies = make_events(1000)
    sessions = [f"c{i}" for i in range(4)]
    path = os.path.join(directory, "compaction")
    unbounded = RetentionPolicy(max_history_bytes=None)
    rows: list[Extra] = []
    with Journal.open(path, durability="os", segment_bytes=8 << 20, retention=unbounded) as j:
        for session in sessions:
            j.create_session(session)
        for first in range(0, events, 100):
            session = sessions[(first // 100) % len(sessions)]
            j.append(session, [EventIn("message", bodies[(first + i) % 1000]) for i in range(100)])
        plain_rate = _replay_rate(j, sessions)
        # Nothing dead yet: compaction only compresses (the zstd ratio of these events).
        packed = j.compact(dead_share=1.0)
        compressed_rate = _replay_rate(j, sessions)
        rows.append(
            Extra(
                "zstd ratio of sealed segments (plain/compressed)",
                packed.bytes_before / max(packed.bytes_after, 1),
                "x",
                detail={},
            )
        )
        rows.append(
            Extra(
                "compaction throughput (live data copied)",
                packed.live_bytes_copied / packed.seconds / 1e6,
                "MB/s",
            )
        )
        rows.append(Extra("replay from plain segments", plain_rate, "events/s"))
        rows.append(
            Extra(
                "replay from compressed segments",
                compressed_rate,
                "events/s",
                "replay from plain segments",
                compressed_rate / plain_rate,
            )
        )
        # Half of every session folded into a snapshot: compaction drops the dead half.
        for session in sessions:
            last = j.get_session(session).last_ordinal
            j.compact_session(session, last // 2, b"snapshot")
        halved = j.compact(dead_share=0.3)
        rows.append(
            Extra(
                f"bytes on disk before -> after compaction ({halved.bytes_before:,} -> "
                f"{halved.bytes_after:,})",
                halved.bytes_after / max(halved.bytes_before, 1),
                "x",
            )
        )
    return rows


def run(
    directory: str, resume_events: int, compaction_events: int = 200_000, threads: int = 16
) -> list[Extra]:
    bodies = make_events(256)
    assert all(len(b) == EVENT_BYTES for b in bodies)
    rows: list[Extra] = []
    sqlite_rate = sqlite_single_commits(directory, 2000, bodies)
    rows.append(Extra("sqlite-full single-event commits", sqlite_rate, "events/s"))
    rate = journal_threads(directory, threads, 400, bodies)
    rows.append(
        Extra(
            f"journal {threads} threads x single-event appends (fsync)",
            rate,
            "events/s",
            "sqlite-full single-event commits",
            rate / sqlite_rate,
        )
    )
    resume = resume_latency(directory, resume_events, bodies)
    rows.append(
        Extra(
            f"resume mid-session of {resume_events:,} events",
            resume["p50"],
            "ms p50",
            "",
            None,
            resume,
        )
    )
    local = follow_in_process(directory, 500)
    rows.append(Extra("follow latency, same process", local["p50"], "ms p50", "", None, local))
    remote = follow_cross_process(directory, 300)
    rows.append(Extra("follow latency, other process", remote["p50"], "ms p50", "", None, remote))
    rows += compaction_rows(directory, compaction_events)
    return rows


def _detail(key: str, value: float) -> str:
    """One detail of a row: latency percentiles in ms, other values as they are named."""
    if key in ("p50", "p99", "max"):
        return f"{key} {value:.3f} ms"
    return f"{key} {value:,.3f}".rstrip("0").rstrip(".")


def table(rows: list[Extra]) -> list[str]:
    out = ["[concurrency and latency]"]
    width = max(len(r.name) for r in rows)
    for r in rows:
        value = f"{r.value:,.0f}" if r.unit in ("events/s", "MB/s") else f"{r.value:.3f}"
        line = f"{r.name.ljust(width)}  {value:>12} {r.unit}"
        if r.ratio is not None:
            line += f"  {r.ratio:.2f}x {r.baseline}"
        if r.detail:
            line += "  (" + ", ".join(_detail(k, v) for k, v in r.detail.items()) + ")"
        out.append(line)
    return out
