"""Export and import of archives beside SQLite's online backup of the same rows, and the
peak RSS of a child process exporting one large session.

Throughput counts event data bytes (the 580-byte bodies), so the MB/s of the three rows
compare the same payload: `export_sessions` of every session to a file, `import_sessions`
of that archive into an empty store, and `sqlite3.Connection.backup` (the `.backup`
command's API) of a WAL database holding the same events.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

from journal import EventIn, Journal, RetentionPolicy

from .events import make_events
from .latency import Extra

_SESSIONS = 4


def _fill_journal(path: str, bodies: list[bytes], events: int, sessions: int) -> None:
    with Journal.open(path, create=True, durability="os") as j:
        names = [f"x{i}" for i in range(sessions)]
        for name in names:
            j.create_session(name)
        for first in range(0, events, 100):
            name = names[(first // 100) % sessions]
            j.append(
                name, [EventIn("message", bodies[(first + i) % len(bodies)]) for i in range(100)]
            )


def _fill_sqlite(path: str, bodies: list[bytes], events: int) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(
        "CREATE TABLE events (session TEXT, seq INTEGER, body BLOB, PRIMARY KEY (session, seq))"
    )
    with db:
        db.executemany(
            "INSERT INTO events VALUES (?, ?, ?)",
            ((f"x{(n // 100) % _SESSIONS}", n, bodies[n % len(bodies)]) for n in range(events)),
        )
    db.close()


def _sqlite_backup(source: str, target: str) -> float:
    start = time.perf_counter()
    src = sqlite3.connect(source)
    dst = sqlite3.connect(target)
    src.backup(dst)
    dst.close()
    src.close()
    fd = os.open(target, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - start


_EXPORT_CHILD = """
import os, resource, sys, time
from journal import Journal
def peak():
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec from the forking parent,
    # so a benchmark parent with a large RSS inflated this child's peak.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def current():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return peak()
with Journal.open(sys.argv[1], readonly=True) as j:
    assert j.get_session("big").first_ordinal == 1, "the session was trimmed"
    j.get_session("big")
    base = current()
    start = time.perf_counter()
    report = j.export_sessions(["big"], sys.argv[2])
    seconds = time.perf_counter() - start
print(base, peak(), seconds, report.events, report.content_bytes)
"""


def export_rss(directory: str, mib: int) -> Extra:
    """Peak RSS above baseline of a child exporting one session of about `mib` MiB."""
    bodies = make_events(1000)
    path = os.path.join(directory, "rss-store")
    events = (mib << 20) // len(bodies[0])
    unbounded = RetentionPolicy(max_history_bytes=None)  # the whole session is kept
    with Journal.open(path, create=True, durability="os", retention=unbounded) as j:
        j.create_session("big")
        for _ in range(0, events, 1000):
            j.append("big", [EventIn("message", bodies[i % 1000]) for i in range(1000)])
    archive = os.path.join(directory, "rss.sja")
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", _EXPORT_CHILD, path, archive],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.split()
    base, peak, seconds = float(out[0]), float(out[1]), float(out[2])
    exported, content = int(out[3]), int(out[4])
    os.unlink(archive)
    return Extra(
        f"peak RSS exporting one {mib:,} MiB session ({exported:,} events, "
        f"{content / 2**20:,.0f} MiB of content; child, above its {base:.0f} MiB baseline; "
        f"{seconds:.1f} s)",
        peak - base,
        "MiB",
    )


def rows(directory: str, events: int, rss_mib: int) -> list[Extra]:
    bodies = make_events(1000)
    data_mb = sum(len(bodies[n % len(bodies)]) for n in range(events)) / 1e6
    store = os.path.join(directory, "archive-source")
    _fill_journal(store, bodies, events, _SESSIONS)
    database = os.path.join(directory, "archive.db")
    _fill_sqlite(database, bodies, events)
    archive = os.path.join(directory, "all.sja")
    with Journal.open(store) as j:
        start = time.perf_counter()
        j.export_sessions(None, archive)
        export_s = time.perf_counter() - start
    target = os.path.join(directory, "archive-target")
    with Journal.open(target, create=True) as j:
        start = time.perf_counter()
        j.import_sessions(archive)
        import_s = time.perf_counter() - start
    backup_s = _sqlite_backup(database, os.path.join(directory, "backup.db"))
    backup_rate = data_mb / backup_s
    result = [
        Extra("sqlite backup() of the same rows", backup_rate, "MB/s"),
        Extra(
            "journal export, every session",
            data_mb / export_s,
            "MB/s",
            "sqlite backup() of the same rows",
            (data_mb / export_s) / backup_rate,
        ),
        Extra("journal export, every session", events / export_s, "events/s"),
        Extra(
            "journal import of that archive",
            data_mb / import_s,
            "MB/s",
            "sqlite backup() of the same rows",
            (data_mb / import_s) / backup_rate,
        ),
        Extra("journal import of that archive", events / import_s, "events/s"),
        Extra(
            f"archive size / event data ({os.path.getsize(archive):,} bytes)",
            os.path.getsize(archive) / (data_mb * 1e6),
            "x",
        ),
    ]
    if rss_mib:
        result.append(export_rss(directory, rss_mib))
    return result
