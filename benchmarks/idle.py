"""Idle cost of following: CPU used by one process while many watchers wait on sessions
nobody writes to (SPEC 7.6: one shared waiter per journal, so the cost is one loop,
not one per watcher).

The value is the whole process's CPU time (user + system, `time.process_time`) over the
measured seconds, as a % of one core, nothing subtracted. The detail holds the numbers
comparable with the waiter before it was shared (every watcher polled the head every
4 ms: 50 idle watcher threads used about 30-50% of a core): 50 and 1,000 threads with
and without a `stop` event, 1,000 asyncio tasks, the same 1,000 threads on the polling
fallback (no inotify), and how often the waiter thread read the head. A second row:
1,000 `awatch` tasks of one session whose owner is mid-turn (SPEC 7.8: one owner check
per turn for all of them), and their memory once they replayed 2 MB each.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from journal import EventIn, Journal
from journal._local.engine import LocalEngine, LocalOptions
from journal.waiter import Notifier

from .latency import Extra

__all__ = ["rows"]

WATCHERS = 1000
SETTLE_S = 1.0  # after the watchers started: replay done, every one waiting
MEASURE_S = 3.0
BUSY_COMMITS_S = 50  # (commits a second to a session nobody follows)


def _cpu_percent(seconds: float) -> float:
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(seconds)
    return 100 * (time.process_time() - cpu) / (time.monotonic() - wall)


def _threads(
    j: Journal, waiter: Notifier, count: int, stop: threading.Event | None
) -> tuple[float, float]:
    """CPU % and head reads/s while `count` watcher threads wait (each its own session)."""
    done = threading.Event()
    ending = stop or done

    def follow(session: str) -> None:
        for _event in j.watch(session, stop=ending):
            pass

    threads = [
        threading.Thread(target=follow, args=(f"idle-{i}",), daemon=True) for i in range(count)
    ]
    for thread in threads:
        thread.start()
    time.sleep(SETTLE_S)
    reads = waiter.polls
    wall = time.monotonic()
    percent = _cpu_percent(MEASURE_S)
    rate = (waiter.polls - reads) / (time.monotonic() - wall)
    ending.set()
    for thread in threads:
        thread.join(10)
    return percent, rate


def _tasks(j: Journal, count: int, commits_per_s: float = 0) -> float:
    """CPU % while `count` asyncio tasks wait in `awatch` on one event loop (each on its
    own session), while another session takes `commits_per_s` commits of this process
    (its appends alone measured apart and subtracted)."""

    def busy(stop: threading.Event) -> None:
        while not stop.wait(1 / commits_per_s):
            j.append("elsewhere", [EventIn("message", b"{}")])

    async def measure() -> float:
        async def follow(session: str) -> None:
            async for _event in j.awatch(session):
                pass

        tasks = [asyncio.create_task(follow(f"idle-{i}")) for i in range(count)]
        await asyncio.sleep(SETTLE_S)
        stop = threading.Event()
        writer = threading.Thread(target=busy, args=(stop,)) if commits_per_s else None
        if writer is not None:
            writer.start()
        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.sleep(MEASURE_S)
        percent = 100 * (time.process_time() - cpu) / (time.monotonic() - wall)
        stop.set()
        if writer is not None:
            writer.join()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return percent

    return asyncio.run(measure())


def _writer_alone(j: Journal, commits_per_s: float) -> float:
    """CPU % of the appends of `_tasks`' writer with nobody following."""
    cpu, wall = time.process_time(), time.monotonic()
    deadline = wall + MEASURE_S
    while time.monotonic() < deadline:
        j.append("elsewhere", [EventIn("message", b"{}")])
        time.sleep(1 / commits_per_s)
    return 100 * (time.process_time() - cpu) / (time.monotonic() - wall)


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def _mid_turn(j: Journal, count: int) -> tuple[float, float]:
    """CPU % while `count` asyncio tasks follow one session whose owner (this process) is
    mid-turn, and their RSS (anonymous, KiB per task) once they caught up on 2 MB."""
    j.create_session("busy")
    for _ in range(20):
        j.append("busy", [EventIn("message", bytes(1000)) for _ in range(100)])
    owner = j.own("busy")
    turn = owner.turn("r-busy")
    turn.__enter__()
    before = _rss_anon_kib()

    async def measure() -> tuple[float, float]:
        async def follow() -> None:
            async for _event in j.awatch("busy"):
                pass

        tasks = [asyncio.create_task(follow()) for _ in range(count)]
        await asyncio.sleep(SETTLE_S + 1.0)  # (2 MB each to replay first)
        rss = (_rss_anon_kib() - before) / count
        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.sleep(MEASURE_S)
        percent = 100 * (time.process_time() - cpu) / (time.monotonic() - wall)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return percent, rss

    try:
        return asyncio.run(measure())
    finally:
        turn.__exit__(None, None, None)
        owner.release()


def _opened(path: str, *, polling: bool = False) -> tuple[Journal, Notifier]:
    """The store on the local engine, and its waiter; `polling`: a waiter without a
    change source (it polls)."""
    engine = LocalEngine.open(path, LocalOptions(create=True, durability="os"))
    if polling:
        engine.waiter = Notifier(engine.head)
    return Journal.over(engine), engine.waiter


def rows(directory: str) -> list[Extra]:
    path = os.path.join(directory, "idle")
    j, waiter = _opened(path)
    with j:
        for i in range(WATCHERS):
            j.create_session(f"idle-{i}")
        main, reads = _threads(j, waiter, WATCHERS, None)
        shared_stop, stop_reads = _threads(j, waiter, WATCHERS, threading.Event())
        fifty, _ = _threads(j, waiter, 50, threading.Event())
        tasks = _tasks(j, WATCHERS)
        j.create_session("elsewhere")
        commits = _tasks(j, WATCHERS, BUSY_COMMITS_S) - _writer_alone(j, BUSY_COMMITS_S)
        turn_cpu, turn_rss = _mid_turn(j, WATCHERS)
    j, waiter = _opened(path, polling=True)
    with j:
        polling, poll_reads = _threads(j, waiter, WATCHERS, None)
    detail = {
        "1000 threads, no stop (% core)": main,
        "1000 threads, one shared stop (% core)": shared_stop,
        "50 threads, one shared stop (% core)": fifty,
        "1000 asyncio tasks (% core)": tasks,
        f"1000 asyncio tasks, another session taking {BUSY_COMMITS_S} commits/s "
        "of this process (% core, the commits' own cost subtracted)": commits,
        "1000 threads, polling fallback (% core)": polling,
        "head reads/s, no stop": reads,
        "head reads/s, with stop": stop_reads,
        "head reads/s, polling fallback": poll_reads,
    }
    turn_detail = {"RSS per watcher after replaying 2 MB (KiB, anonymous)": turn_rss}
    return [
        Extra("1,000 idle watchers, CPU", main, "% of one core", detail=detail),
        Extra(
            "1,000 awatch of a turn in progress, CPU", turn_cpu, "% of one core", detail=turn_detail
        ),
    ]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        for row in rows(scratch):
            print(f"{row.name}: {row.value:.2f} {row.unit}")
            for name, value in row.detail.items():
                print(f"  {name}: {value:.2f}")
