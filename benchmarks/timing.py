"""What a measurement holds, and the timed loop every append workload runs through."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .events import Dataset


@dataclass(slots=True)
class Measurement:
    """One row's result: events handled, wall seconds, per-batch latencies, files written.

    `files` maps a file name to (apparent size, allocated bytes); append rows fill it
    right after their last batch, before the store is closed.
    """

    events: int
    seconds: float
    batch_ns: list[int] = field(default_factory=list)
    files: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else math.inf


def time_batches(data: Dataset, write_batch: Callable[[int, list[bytes]], None]) -> Measurement:
    """Call `write_batch(first_seq, bodies)` for every batch; time each call and the loop.

    `write_batch` must return only once the batch is durable: that is what is measured.
    """
    clock = time.perf_counter_ns
    latencies: list[int] = []
    start = clock()
    for first_seq, bodies in data.batches:
        before = clock()
        write_batch(first_seq, bodies)
        latencies.append(clock() - before)
    elapsed = clock() - start
    return Measurement(data.count, elapsed / 1e9, latencies)


def time_read(expected: int, read_all: Callable[[], int]) -> Measurement:
    """Time `read_all()` (which returns how many events it read) and check the count."""
    start = time.perf_counter_ns()
    count = read_all()
    elapsed = time.perf_counter_ns() - start
    if count != expected:
        raise RuntimeError(f"read {count} events, expected {expected}")
    return Measurement(count, elapsed / 1e9)


def store_files(directory: str) -> dict[str, tuple[int, int]]:
    """Every file under `directory`: (apparent size, allocated bytes), by relative name."""
    found: dict[str, tuple[int, int]] = {}
    for parent, _dirs, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            st = os.stat(path)
            found[os.path.relpath(path, directory)] = (st.st_size, st.st_blocks * 512)
    return dict(sorted(found.items()))


def percentile(values: list[int], p: float) -> int:
    """Nearest-rank percentile of `values` (not interpolated: a latency that happened)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]
