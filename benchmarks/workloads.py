"""The rows of the benchmark table: their order, stores, and the baselines they face."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from . import baselines, project
from .events import Dataset
from .timing import Measurement

Kind = Literal["append", "read"]


@dataclass(frozen=True, slots=True)
class Row:
    """One workload: `run(store_directory, data)`; read rows read what `store`'s append wrote."""

    name: str
    kind: Kind
    store: str
    run: Callable[[str, Dataset], Measurement]


ROWS: Final = (
    Row("sqlite-full append", "append", "sqlite", baselines.sqlite_append),
    Row("lmdb append", "append", "lmdb", baselines.lmdb_append),
    Row("jsonl append", "append", "jsonl", baselines.jsonl_append),
    Row("journal append (public API)", "append", "journal", project.journal_append),
    Row("sqlite read", "read", "sqlite", baselines.sqlite_read),
    Row("lmdb read (cursor)", "read", "lmdb", baselines.lmdb_read),
    Row("jsonl read (lines)", "read", "jsonl", baselines.jsonl_read),
    Row("journal replay (decoded Event)", "read", "journal", project.journal_replay),
)

# Ratio columns: column label -> the baseline row each kind of row is compared with.
BASELINES: Final[dict[Kind, dict[str, str]]] = {
    "append": {
        "x sqlite": "sqlite-full append",
        "x lmdb": "lmdb append",
        "x jsonl": "jsonl append",
    },
    "read": {
        "x sqlite": "sqlite read",
        "x lmdb": "lmdb read (cursor)",
        "x jsonl": "jsonl read (lines)",
    },
}


@dataclass(frozen=True, slots=True)
class Plan:
    """Rows to run and report, in order, plus appends run only to fill a store for a read."""

    reported: tuple[Row, ...]
    setup_only: tuple[Row, ...]

    def in_order(self) -> list[tuple[Row, bool]]:
        """(row, reported) in the order to run: every append before any read."""
        wanted = set(self.reported) | set(self.setup_only)
        ordered = [row for row in ROWS if row in wanted]
        ordered.sort(key=lambda row: row.kind != "append")
        return [(row, row in self.reported) for row in ordered]


def plan(only: Sequence[str] = ()) -> Plan:
    """Rows whose name contains any of `only` (case-insensitive; all rows when empty)."""
    needles = [needle.lower() for needle in only]
    reported = tuple(
        row for row in ROWS if not needles or any(n in row.name.lower() for n in needles)
    )
    appended = {row.store for row in reported if row.kind == "append"}
    needed = {row.store for row in reported if row.kind == "read"} - appended
    setup_only = tuple(row for row in ROWS if row.kind == "append" and row.store in needed)
    return Plan(reported, setup_only)
