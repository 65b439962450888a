"""The targets (DESIGN.md section 9, issue targets): each row's goal, whether one run met
it, and with `--repeat N` the median of N interleaved runs."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .latency import Extra
from .report import Result, ratios


@dataclass(slots=True)
class Run:
    """What one run of the benchmark measured: the main table and the extra rows."""

    results: list[Result] = field(default_factory=list)
    extras: list[Extra] = field(default_factory=list)

    def ratio(self, row: str, column: str = "x sqlite") -> float | None:
        for result in self.results:
            if result.row.name == row:
                return ratios(result, self.results).get(column)
        return None

    def extra(self, prefix: str) -> Extra | None:
        for extra in self.extras:
            if extra.name.startswith(prefix):
                return extra
        return None


def _ratio(row: str) -> Callable[[Run], float | None]:
    return lambda run: run.ratio(row)


def _extra_ratio(prefix: str) -> Callable[[Run], float | None]:
    def measure(run: Run) -> float | None:
        extra = run.extra(prefix)
        return None if extra is None else extra.ratio

    return measure


def _extra_value(prefix: str) -> Callable[[Run], float | None]:
    def measure(run: Run) -> float | None:
        extra = run.extra(prefix)
        return None if extra is None else extra.value

    return measure


def _extra_detail(prefix: str, key: str) -> Callable[[Run], float | None]:
    def measure(run: Run) -> float | None:
        extra = run.extra(prefix)
        return None if extra is None else extra.detail.get(key)

    return measure


@dataclass(frozen=True, slots=True)
class Target:
    """One goal: `measure(run)` (None: the row was not run) against `at_least` or `below`."""

    label: str
    unit: str
    measure: Callable[[Run], float | None]
    at_least: float | None = None
    below: float | None = None

    @property
    def goal(self) -> str:
        if self.at_least is not None:
            return f">= {self.at_least:g} {self.unit}"
        return f"< {self.below:g} {self.unit}"

    def met(self, value: float) -> bool:
        if self.at_least is not None:
            return value >= self.at_least
        assert self.below is not None
        return value < self.below


TARGETS: tuple[Target, ...] = (
    Target(
        "journal append, batches of 100, durable",
        "x sqlite-full",
        _ratio("journal append (public API)"),
        at_least=2.5,
    ),
    Target(
        "journal replay, decoded events",
        "x sqlite read",
        _ratio("journal replay (decoded Event)"),
        at_least=2.0,
    ),
    Target(
        "16 threads, single durable appends",
        "x sqlite single commits",
        _extra_ratio("journal 16 threads"),
        at_least=10.0,
    ),
    Target(
        "follow latency p99, same process",
        "ms",
        _extra_detail("follow latency, same process", "p99"),
        below=2.0,
    ),
    Target(
        "follow latency p99, other process",
        "ms",
        _extra_detail("follow latency, other process", "p99"),
        below=5.0,
    ),
    Target(
        "resume mid-session, first event p99",
        "ms",
        _extra_detail("resume mid-session", "p99"),
        below=5.0,
    ),
    Target(
        "1,000 idle watchers in one process",
        "% of one core",
        _extra_value("1,000 idle watchers"),
        below=2.0,
    ),
    Target(
        "writer RSS after 1M single appends",
        "MiB above a fresh open",
        _extra_value("writer RSS after"),
        below=50.0,
    ),
    Target(
        "filtered listing, 100k sessions, one match",
        "ms",
        _extra_value("filtered listing"),
        below=2.0,
    ),
    Target(
        "peak RSS exporting a large session",
        "MiB above baseline",
        _extra_value("peak RSS exporting"),
        below=100.0,
    ),
    Target(
        "compaction throughput",
        "MB/s",
        _extra_value("compaction throughput"),
        at_least=100.0,
    ),
)


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.2f}"


def table(runs: Sequence[Run]) -> list[str]:
    """Each target: the value of every run, their median, the goal, met or missed.

    A target whose row was not run is left out."""
    lines: list[list[str]] = []
    for target in TARGETS:
        values = [v for v in (target.measure(run) for run in runs) if v is not None]
        if not values:
            continue
        median = statistics.median(values)
        lines.append(
            [
                target.label,
                " ".join(_fmt(v) for v in values),
                _fmt(median),
                target.goal,
                "met" if target.met(median) else "MISSED",
            ]
        )
    if not lines:
        return []
    head = ["target", "runs" if len(runs) > 1 else "value", "median", "goal", ""]
    widths = [max(len(row[i]) for row in [head, *lines]) for i in range(len(head))]

    def render(cells: list[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i in (0, 3) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    title = f"[targets: median of {len(runs)} run(s)]"
    return [title, render(head), *(render(row) for row in lines)]
