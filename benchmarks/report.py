"""Ratios to the baselines, the printed table, the bytes-on-disk summary, the JSON rows."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lmdb
import msgspec

from .events import EVENT_BYTES, Dataset
from .timing import Measurement, percentile
from .workloads import BASELINES, Row


@dataclass(frozen=True, slots=True)
class Result:
    row: Row
    measurement: Measurement


def ratios(result: Result, results: Sequence[Result]) -> dict[str, float]:
    """events/s of `result` over each baseline run in the same session (column -> ratio)."""
    by_name = {r.row.name: r.measurement.events_per_s for r in results}
    return {
        column: result.measurement.events_per_s / by_name[baseline]
        for column, baseline in BASELINES[result.row.kind].items()
        if baseline in by_name
    }


def _latency_ms(measurement: Measurement) -> dict[str, float] | None:
    if not measurement.batch_ns:
        return None
    values = measurement.batch_ns
    return {
        "p50": percentile(values, 50) / 1e6,
        "p99": percentile(values, 99) / 1e6,
        "max": max(values) / 1e6,
    }


def _filesystem(path: str) -> str:
    """Best effort: the type of the filesystem holding `path` (from /proc/mounts)."""
    try:
        with open("/proc/mounts") as mounts:
            entries = [line.split() for line in mounts]
    except OSError:
        return "unknown"
    real = os.path.realpath(path)
    best, kind = "", "unknown"
    for entry in entries:
        if len(entry) < 3:
            continue
        mount = entry[1]
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > len(best):
            best, kind = mount, entry[2]
    return kind


def header(data: Dataset, batch: int, directory: str) -> list[str]:
    """Machine, versions and data description: the context every number depends on."""
    fs = _filesystem(directory)
    lines = [
        f"machine: Python {platform.python_version()} ({platform.python_implementation()}) | "
        f"{platform.platform()} | {os.cpu_count()} CPUs | "
        f"{data.count} events x {EVENT_BYTES} B JSON, batches of {batch}",
        f"versions: SQLite {sqlite3.sqlite_version} | LMDB {'.'.join(map(str, lmdb.version()))} "
        f"(py-lmdb {lmdb.__version__}) | msgspec {msgspec.__version__} | "
        f"frame CRC32 {_frame_crc()} | stores in {directory} ({fs})",
    ]
    if fs in {"tmpfs", "ramfs"}:
        lines.append("warning: the stores are in memory; fsync costs nothing, use --dir")
    return lines


def _frame_crc() -> str:
    """Which CRC32 sums frame bodies: ISA-L when the `isal` package is installed (a
    dependency where it has wheels: SPEC.md 1), else zlib; it moves the replay row by a
    third."""
    if importlib.util.find_spec("isal") is None:
        return "zlib"
    return f"ISA-L (isal {importlib.metadata.version('isal')})"


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(results: Sequence[Result], batch: int) -> list[str]:
    """The aligned results table, appends first; '-' where a baseline was not run."""
    columns = ["name", "events", "seconds", "events/s", "x sqlite", "x lmdb", "x jsonl"]
    columns += ["p50 ms", "p99 ms", "max ms"]
    body: list[list[str] | str] = []
    for kind, title in (
        ("append", f"appends (durable: on disk before the batch of {batch} is acknowledged)"),
        ("read", "reads (same data, just written: warm page cache)"),
    ):
        rows = [r for r in results if r.row.kind == kind]
        if not rows:
            continue
        body.append(title)
        for result in rows:
            m = result.measurement
            ratio = ratios(result, results)
            latency = _latency_ms(m)
            cells = [
                result.row.name,
                str(m.events),
                f"{m.seconds:.3f}",
                f"{m.events_per_s:,.0f}",
                *(_cell(ratio.get(c), ".2f") for c in ("x sqlite", "x lmdb", "x jsonl")),
            ]
            if latency is None:
                cells += ["", "", ""]
            else:
                cells += [f"{latency[k]:.3f}" for k in ("p50", "p99", "max")]
            body.append(cells)
    widths = [len(c) for c in columns]
    for line in body:
        if isinstance(line, list):
            widths = [max(w, len(c)) for w, c in zip(widths, line, strict=True)]

    def render(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    out = [render(columns), "-" * len(render(columns))]
    for line in body:
        out.append(f"[{line}]" if isinstance(line, str) else render(line))
    return out


def _file_summary(files: dict[str, tuple[int, int]]) -> str:
    """Each file's size, or per-extension totals when there are many files."""
    if len(files) <= 4:
        return ", ".join(f"{name} {size:,}" for name, (size, _) in files.items())
    groups: dict[str, tuple[int, int]] = {}
    for name, (size, _) in files.items():
        ext = os.path.splitext(name)[1] or name
        count, total = groups.get(ext, (0, 0))
        groups[ext] = (count + 1, total + size)
    return ", ".join(f"{n} x *{ext} {total:,}" for ext, (n, total) in groups.items())


def disk_usage(results: Sequence[Result], data: Dataset) -> list[str]:
    """Bytes on disk per store, taken right after its last append (before closing)."""
    appends = [r for r in results if r.row.kind == "append"]
    if not appends:
        return []
    out = [
        f"bytes on disk after appending (payload {data.payload_bytes:,} B = "
        f"{data.count} x {EVENT_BYTES} B; apparent size, allocated blocks in brackets):"
    ]
    rows: list[list[str]] = []
    for result in appends:
        files = result.measurement.files
        apparent = sum(s for s, _ in files.values())
        allocated = sum(a for _, a in files.values())
        rows.append(
            [
                result.row.store,
                f"{apparent:,}",
                f"({allocated:,})",
                f"{apparent / data.payload_bytes:.2f}x payload",
                _file_summary(files),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:4], widths[1:], strict=True)]
        out.append("  " + "  ".join([*cells, row[4]]))
    return out


def json_rows(results: Sequence[Result]) -> list[dict[str, Any]]:
    """Machine-readable rows; `ratios` is keyed by the baseline row's name."""
    rows = []
    for result in results:
        m = result.measurement
        baselines = BASELINES[result.row.kind]
        rows.append(
            {
                "name": result.row.name,
                "kind": result.row.kind,
                "events": m.events,
                "seconds": m.seconds,
                "events_per_s": m.events_per_s,
                "ratios": {baselines[c]: v for c, v in ratios(result, results).items()},
                "latency_ms": _latency_ms(m),
                "bytes_on_disk": sum(s for s, _ in m.files.values()) if m.files else None,
            }
        )
    return rows


def write_json(path: str, results: Sequence[Result], extras: Sequence[Any] = ()) -> None:
    rows = json_rows(results)
    for extra in extras:
        rows.append(
            {
                "name": extra.name,
                "kind": "latency" if extra.unit.startswith("ms") else "throughput",
                "value": extra.value,
                "unit": extra.unit,
                "ratios": {extra.baseline: extra.ratio} if extra.ratio is not None else {},
                "latency_ms": extra.detail or None,
            }
        )
    with open(path, "w") as out:
        json.dump(rows, out, indent=2)
        out.write("\n")
