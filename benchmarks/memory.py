"""Writer memory: the RSS a writer process gains over many single durable appends.

The writer runs in a child process (a fresh interpreter, so nothing of this one counts).
It opens a store with small segments (4 MiB) and a history window per session, so many
segments are sealed and retention runs by itself and deletes the oldest ones, creates one
session per thread, and then `threads` threads append single events (one `append` of one
580-byte event each, `durability="fsync"`) to their own sessions: concurrent single
appends share fsyncs (group commit), which keeps a million of them to minutes. RSS is
read from /proc/self/status (VmRSS) after a fresh open (sessions created, nothing
appended) and after every tenth of the appends; the row is the last reading minus the
first. The detail also has RssAnon (the heap and stacks: RSS without mapped files) and
the resident pages of the view's LMDB map at the end, which are page cache the kernel
reclaims, and grow with the view, not with what the writer holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from .latency import Extra

_SEGMENT_BYTES = 4 << 20
_WINDOW_BYTES = 16 << 20  # per session: 16 sessions keep 256 MiB of about 620 MB

_WRITER_CHILD = """
import gc, json, os, re, resource, sys, threading, time
from journal import EventIn, Journal, RetentionPolicy
from benchmarks.events import make_events

def status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")

def rss_mib():
    return status_mib("VmRSS")

def view_rss_mib():
    # Resident pages of the view's LMDB map: file-backed page cache, not the heap.
    total, in_view = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if re.match(r"[0-9a-f]+-[0-9a-f]+$", fields[0]):
                in_view = fields[-1].endswith("data.mdb")
            elif in_view and fields[0] == "Rss:":
                total += int(fields[1])
    return total / 1024

path, appends, threads, segment_bytes, window = sys.argv[1], *map(int, sys.argv[2:6])
bodies = make_events(1000)
policy = RetentionPolicy(max_history_bytes=window)
steps = []
with Journal.open(path, segment_bytes=segment_bytes, retention=policy) as j:
    sessions = [f"w{t}" for t in range(threads)]
    for session_id in sessions:
        j.create_session(session_id)
    gc.collect()
    fresh, fresh_anon = rss_mib(), status_mib("RssAnon")
    start = time.perf_counter()
    done = 0
    for step in range(1, 11):
        target = appends * step // 10
        share = [(target - done) // threads + (t < (target - done) % threads)
                 for t in range(threads)]

        def work(t, count, first):
            session_id = sessions[t]
            for i in range(first, first + count):
                j.append(session_id, [EventIn("message", bodies[i % 1000])])

        workers = [threading.Thread(target=work, args=(t, share[t], done + t))
                   for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        done = target
        steps.append((done, time.perf_counter() - start, rss_mib(), status_mib("RssAnon")))
    seconds = time.perf_counter() - start
    view = view_rss_mib()
    stats = j.stats()
    first = min(int(name[:20]) for name in os.listdir(os.path.join(path, "segments"))
                if name.endswith(".seg"))
peak = status_mib("VmHWM")  # (ru_maxrss carries the forking parent's peak across exec)
print(json.dumps({"fresh": fresh, "fresh_anon": fresh_anon, "view": view, "steps": steps,
                  "seconds": seconds, "peak": peak, "segments": stats.segments,
                  "first_position": first}))
"""


def _count(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1000 == 0:
        return f"{n // 1000}k"
    return f"{n:,}"


@dataclass(slots=True)
class WriterReadings:
    """What the writer child measured: RSS (and its anonymous part, RssAnon: without the
    mapped files, the view's LMDB pages among them) after a fresh open, (appends so far,
    seconds, RSS, RssAnon) after every tenth, peak RSS, and what retention left on
    disk."""

    fresh_mib: float
    fresh_anon_mib: float
    view_mib: float
    steps: list[tuple[int, float, float, float]]
    seconds: float
    peak_mib: float
    segments: int
    first_position: int


def writer_rss(directory: str, appends: int, threads: int) -> WriterReadings:
    """Run the writer child on a new store under `directory`."""
    path = os.path.join(directory, "memory-store")
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    args = [str(appends), str(threads), str(_SEGMENT_BYTES), str(_WINDOW_BYTES)]
    out = subprocess.run(
        [sys.executable, "-c", _WRITER_CHILD, path, *args],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    raw = json.loads(out.splitlines()[-1])
    return WriterReadings(
        float(raw["fresh"]),
        float(raw["fresh_anon"]),
        float(raw["view"]),
        [(int(n), float(at), float(rss), float(anon)) for n, at, rss, anon in raw["steps"]],
        float(raw["seconds"]),
        float(raw["peak"]),
        int(raw["segments"]),
        int(raw["first_position"]),
    )


def rows(directory: str, appends: int = 1_000_000, threads: int = 16) -> list[Extra]:
    """The writer's RSS above a fresh open after `appends` single appends."""
    readings = writer_rss(directory, appends, threads)
    fresh = readings.fresh_mib
    final = readings.steps[-1][2]
    detail = {
        "fresh_open_rss_mib": fresh,
        "final_rss_mib": final,
        "anon_above_fresh_mib": readings.steps[-1][3] - readings.fresh_anon_mib,
        "view_map_rss_mib": readings.view_mib,
        "peak_rss_mib": readings.peak_mib,
        "appends": float(appends),
        "threads": float(threads),
        "seconds": readings.seconds,
        # Retention was active: the segments left, and the first position still on disk.
        "segments_left": float(readings.segments),
        "first_position_kept": float(readings.first_position),
    }
    for done, _, rss, _ in readings.steps:
        detail[f"rss_above_fresh_at_{done}_mib"] = rss - fresh
    return [
        Extra(
            f"writer RSS after {_count(appends)} single appends",
            final - fresh,
            "MiB",
            detail=detail,
        )
    ]
