"""`python -m benchmarks`: run the rows side by side in this process and print the table."""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

from . import archives, folds, idle, latency, listing, memory, report, targets
from .events import Dataset, make_dataset
from .workloads import ROWS, Plan, plan


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
        "--listing-sessions",
        type=int,
        default=100_000,
        metavar="N",
        help="sessions in the store of the filtered-listing row (0: skip; default 100000)",
    )
    parser.add_argument(
        "--rss-appends",
        type=int,
        default=1_000_000,
        metavar="N",
        help="single durable appends made by the writer whose RSS is measured (0: skip; "
        "default 1000000, several minutes)",
    )
    parser.add_argument(
        "--fold-events",
        type=int,
        default=1_000_000,
        metavar="N",
        help="events of the session whose fold is restored from a checkpoint and from "
        "scratch (0: skip the fold rows; default 1000000; `--only fold` runs just them)",
    )
    parser.add_argument(
        "--no-latency",
        action="store_true",
        help="skip the concurrency and latency rows",
    )
    parser.add_argument(
        "--repeat",
        type=_positive,
        default=1,
        metavar="N",
        help="run everything N times, one run after the other (so baselines and the "
        "journal alternate), and report the median of each target over the N runs",
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
    if args.only == ["fold"]:
        return _folds_only(args)
    selected = plan(args.only)
    if not selected.reported:
        print(
            f"no row matches {args.only}: --only picks among these rows: "
            + "; ".join(row.name for row in ROWS)
            + ". `--only archive` and `--only fold` run those rows alone; the other rows "
            "(16 threads, resume, follow latency, compaction, idle watchers, listing, "
            "writer RSS) run only in a run without --only",
            file=sys.stderr,
        )
        return 2
    data = make_dataset(args.events, args.batch)
    runs: list[targets.Run] = []
    for number in range(1, args.repeat + 1):
        if args.repeat > 1:
            print(f"\n=== run {number} of {args.repeat} ===", flush=True)
        runs.append(_run(args, selected, data))
        print()
        print("\n".join(targets.table(runs[-1:])))
    if args.repeat > 1:
        print()
        print("\n".join(targets.table(runs)))
    if args.json:
        last = runs[-1]
        report.write_json(args.json, last.results, last.extras)
        print(f"\nwrote {args.json} (the last run)")
    return 0


def _run(args: argparse.Namespace, selected: Plan, data: Dataset) -> targets.Run:
    """One run of every selected row (each in a fresh temporary directory)."""
    root = tempfile.mkdtemp(prefix="journal-bench-", dir=args.dir)
    run = targets.Run()
    try:
        for line in report.header(data, args.batch, root):
            print(line, flush=True)
        for row, reported in selected.in_order():
            directory = os.path.join(root, row.store)
            os.makedirs(directory, exist_ok=True)
            gc.collect()
            measurement = row.run(directory, data)
            if reported:
                run.results.append(report.Result(row, measurement))
            else:
                print(f"(setup, not reported: {row.name})", flush=True)
        print()
        print("\n".join(report.table(run.results, args.batch)))
        usage = report.disk_usage(run.results, data)
        if usage:
            print()
            print("\n".join(usage))
        if not args.no_latency and not args.only:
            extra_dir = os.path.join(root, "latency")
            os.makedirs(extra_dir)
            run.extras = latency.run(extra_dir, args.resume_events, args.events)
            run.extras += archives.rows(extra_dir, args.events, args.archive_mib)
            run.extras += idle.rows(extra_dir)
            if args.listing_sessions:
                run.extras += listing.rows(extra_dir, args.listing_sessions)
            if args.rss_appends:
                run.extras += memory.rows(extra_dir, args.rss_appends)
            if args.fold_events:
                run.extras += folds.rows(extra_dir, args.fold_events)
            print()
            print("\n".join(latency.table(run.extras)))
    finally:
        shutil.rmtree(root)
    return run


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


def _folds_only(args: argparse.Namespace) -> int:
    """`--only fold`: just the fold rows (restore, update round trips)."""
    root = tempfile.mkdtemp(prefix="journal-bench-", dir=args.dir)
    try:
        extras = folds.rows(root, args.fold_events or 1_000_000)
        print("\n".join(latency.table(extras)))
        if args.json:
            report.write_json(args.json, [], extras)
    finally:
        shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
