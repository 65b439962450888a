"""`python -m benchmarks`: run the rows side by side in this process and print the table."""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

from . import archives, latency, report
from .events import make_dataset
from .workloads import ROWS, plan


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Durable appends and full reads: the segment log against SQLite (WAL, "
        "synchronous=FULL), raw LMDB and a JSONL file, in one process on the same data.",
        epilog="rows: " + "; ".join(row.name for row in ROWS),
    )
    parser.add_argument("--events", type=_positive, default=200_000, help="default 200000")
    parser.add_argument("--batch", type=_positive, default=100, help="events per durable batch")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON rows")
    parser.add_argument(
        "--dir",
        metavar="PATH",
        help="make the temporary stores under PATH (default: the system temp directory)",
    )
    parser.add_argument(
        "--resume-events",
        type=_positive,
        default=1_000_000,
        help="size of the session for the resume-from-the-middle row (default 1000000)",
    )
    parser.add_argument(
        "--archive-mib",
        type=int,
        default=256,
        help="size of the session whose export's peak RSS is measured (0: skip; default 256)",
    )
    parser.add_argument(
        "--no-latency",
        action="store_true",
        help="skip the concurrency and latency rows",
    )
    parser.add_argument(
        "--only",
        metavar="SUBSTR",
        action="append",
        default=[],
        help="run rows whose name contains SUBSTR (repeatable); a read row also runs, "
        "unreported, the append that fills its store",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.only == ["archive"]:
        return _archives_only(args)
    selected = plan(args.only)
    if not selected.reported:
        print(f"no row matches {args.only}", file=sys.stderr)
        return 2
    data = make_dataset(args.events, args.batch)
    root = tempfile.mkdtemp(prefix="journal-bench-", dir=args.dir)
    try:
        for line in report.header(data, args.batch, root):
            print(line, flush=True)
        results: list[report.Result] = []
        for row, reported in selected.in_order():
            directory = os.path.join(root, row.store)
            os.makedirs(directory, exist_ok=True)
            gc.collect()
            measurement = row.run(directory, data)
            if reported:
                results.append(report.Result(row, measurement))
            else:
                print(f"(setup, not reported: {row.name})", flush=True)
        print()
        print("\n".join(report.table(results, args.batch)))
        usage = report.disk_usage(results, data)
        if usage:
            print()
            print("\n".join(usage))
        extras: list[latency.Extra] = []
        if not args.no_latency and not args.only:
            extra_dir = os.path.join(root, "latency")
            os.makedirs(extra_dir)
            extras = latency.run(extra_dir, args.resume_events, args.events)
            extras += archives.rows(extra_dir, args.events, args.archive_mib)
            print()
            print("\n".join(latency.table(extras)))
        if args.json:
            report.write_json(args.json, results, extras)
            print(f"\nwrote {args.json}")
    finally:
        shutil.rmtree(root)
    return 0


def _archives_only(args: argparse.Namespace) -> int:
    """`--only archive`: just the export and import rows."""
    root = tempfile.mkdtemp(prefix="journal-bench-", dir=args.dir)
    try:
        extras = archives.rows(root, args.events, args.archive_mib)
        print("\n".join(latency.table(extras)))
        if args.json:
            report.write_json(args.json, [], extras)
    finally:
        shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
