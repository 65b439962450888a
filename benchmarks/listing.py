"""Listing sessions: a state filter that matches one session among many, beside the
unfiltered first page, in one store.

The store is filled by 16 threads creating sessions (group commit, durability "os": the
fill is setup, not what is measured); one session is suspended, the rest stay open. Each
listing is one `list_sessions_page` call, timed up to `repeats` times (within a few
seconds); the row reports the median and the detail the p99 and the unfiltered first page.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable

from journal import Journal, SessionState

from .latency import Extra
from .timing import percentile

__all__ = ["fill", "rows"]

_THREADS = 16


def fill(j: Journal, sessions: int) -> str:
    """Create `sessions` open sessions (ids `s000000`...) and suspend one in the middle;
    returns the suspended session's id."""

    def work(first: int) -> None:
        for n in range(first, sessions, _THREADS):
            j.create_session(f"s{n:06d}")

    workers = [threading.Thread(target=work, args=(t,)) for t in range(_THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    rare = f"s{sessions // 2:06d}"
    j.suspend_session(rare)
    return rare


def _timed_ns(call: Callable[[], object], repeats: int, budget_s: float = 5.0) -> list[int]:
    """`repeats` timed calls, or fewer (at least 5) once `budget_s` is spent: a full scan
    of 100k rows takes a large part of a second."""
    clock = time.perf_counter_ns
    deadline = clock() + int(budget_s * 1e9)
    found: list[int] = []
    while len(found) < repeats and (len(found) < 5 or clock() < deadline):
        start = clock()
        call()
        found.append(clock() - start)
    return found


def rows(directory: str, sessions: int = 100_000, repeats: int = 200) -> list[Extra]:
    """The filtered listing row (ms, median of `repeats` calls)."""
    with Journal.open(os.path.join(directory, "listing"), durability="os") as j:
        rare = fill(j, sessions)
        page = j.list_sessions_page(state=SessionState.SUSPENDED)
        if [m.session_id for m in page.sessions] != [rare] or page.next_page_token:
            raise RuntimeError(f"the filtered listing returned {page!r}, expected {rare!r}")
        filtered = _timed_ns(lambda: j.list_sessions_page(state=SessionState.SUSPENDED), repeats)
        unfiltered = _timed_ns(lambda: j.list_sessions_page(), repeats)
    label = f"{sessions // 1000}k" if sessions % 1000 == 0 else str(sessions)
    return [
        Extra(
            f"filtered listing, {label} sessions, one match",
            statistics.median(filtered) / 1e6,
            "ms",
            "unfiltered first page (100)",
            statistics.median(filtered) / statistics.median(unfiltered),
            {
                "p99": percentile(filtered, 99) / 1e6,
                "unfiltered first page p50": statistics.median(unfiltered) / 1e6,
                "unfiltered first page p99": percentile(unfiltered, 99) / 1e6,
            },
        )
    ]


if __name__ == "__main__":
    import sys
    import tempfile

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with tempfile.TemporaryDirectory(prefix="journal-listing-") as scratch:
        started = time.perf_counter()
        for row in rows(scratch, count):
            print(row)
        print(f"({time.perf_counter() - started:.1f} s)")
