"""Checking a store: every frame against its checksum, every sidecar against its segment,
and the LMDB view against a view rebuilt from the log.

`verify(fix=False)` only reads (the rebuilt view goes to a temporary directory outside the
store); `verify(fix=True)` rewrites bad sidecars and rebuilds the view in place.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from typing import Final

import lmdb
import msgspec

from .errors import JournalCorrupt
from .index import LOCATION, Head, Projection, View
from .records import EventAppended, decode_frame_body
from .segments import (
    SEGMENT_HEADER_SIZE,
    SUMMARY_FORMAT,
    SegmentLog,
    SegmentReader,
    read_summary,
    summarize_segment,
)

__all__ = ["VerifyProblem", "VerifyReport", "check_log", "compare_views", "project_log"]

Progress = Callable[[int, int], None]


class VerifyProblem(msgspec.Struct, frozen=True):
    """One problem: where (segment file name, or "index"), the byte offset, and what."""

    segment: str
    offset: int
    what: str


class VerifyReport(msgspec.Struct, frozen=True):
    """What `verify` checked and found. `ok` is True when nothing is wrong (or, with
    `fix=True`, when everything found was repaired)."""

    segments: int
    frames: int
    records: int
    problems: list[VerifyProblem]
    fixed: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems or self.fixed


def check_log(
    log: SegmentLog, head: Head | None, progress: Progress | None = None
) -> tuple[list[VerifyProblem], int, int, list[int]]:
    """Verify every frame of every segment and every sidecar.

    Returns (problems, frames, records, bases whose sidecar is missing or wrong).
    """
    problems: list[VerifyProblem] = []
    frames = records = 0
    bad_sidecars: list[int] = []
    bases = log.bases()
    sizes = {}
    for base in bases:
        with SegmentReader(log.directory, base) as reader:
            sizes[base] = reader.file_size()
    total = sum(sizes.values())
    done = 0
    for i, base in enumerate(bases):
        active = i == len(bases) - 1
        committed_end = head.end_offset if head is not None and head.segment == base else None
        try:
            with SegmentReader(log.directory, base) as reader:
                for info, body in reader.frames(committed_end=committed_end, tail=active):
                    frames += 1
                    try:
                        decoded = decode_frame_body(body)
                    except msgspec.DecodeError as e:
                        problems.append(
                            VerifyProblem(reader.name, info.offset, f"undecodable frame: {e}")
                        )
                        continue
                    records += len(decoded)
                    position = info.first_position
                    for record in decoded:
                        if (
                            isinstance(record, EventAppended)
                            and record.position
                            and record.position != position
                        ):
                            problems.append(
                                VerifyProblem(
                                    reader.name,
                                    info.offset,
                                    f"event record says position {record.position}, "
                                    f"its frame places it at {position}",
                                )
                            )
                        position += 1
        except JournalCorrupt as e:
            problems.append(VerifyProblem(e.segment, e.offset, e.detail))
            done += sizes[base]
            if progress is not None:
                progress(done, total)
            continue
        if not active:
            written = read_summary(log.directory, base)
            if written is None:
                problems.append(VerifyProblem(f"{base:020d}.idx", 0, "sidecar missing or bad"))
                bad_sidecars.append(base)
            else:
                try:
                    rescanned = summarize_segment(log.directory, base)
                except JournalCorrupt:
                    rescanned = None
                if rescanned is not None:
                    rescanned.blocks = written.blocks
                    if rescanned != written:
                        problems.append(
                            VerifyProblem(
                                f"{base:020d}.idx", 0, "sidecar disagrees with its segment"
                            )
                        )
                        bad_sidecars.append(base)
        done += sizes[base]
        if progress is not None:
            progress(done, total)
    return problems, frames, records, bad_sidecars


def project_segments(log: SegmentLog, projection: Projection) -> list[int]:
    """Apply every frame after `projection.head` (across segments) to the projection.

    The one loop behind a writer's catch-up, a rebuild and a read-only refresh. Positions
    never go backwards; sealed segments may have gaps (retention deletes dead segments,
    compaction drops dead frames), the active segment is dense. Returns the bases of the
    sealed segments visited (a writer checks their sidecars). Does not flush.
    """
    head = projection.head
    bases = [b for b in log.bases() if b >= head.segment]
    if not bases:
        raise JournalCorrupt(
            f"{head.segment:020d}.seg", 0, "the active segment indexed by the view is missing"
        )
    start_segment, start_offset = head.segment, head.end_offset
    for i, base in enumerate(bases):
        last = i == len(bases) - 1
        if base != start_segment:
            if base < head.next_position:
                raise JournalCorrupt(
                    f"{base:020d}.seg",
                    0,
                    f"segment starts at position {base}, expected {head.next_position}",
                )
            head.segment = base
            head.end_offset = SEGMENT_HEADER_SIZE
            head.next_position = base
        start = start_offset if base == start_segment else SEGMENT_HEADER_SIZE
        with SegmentReader(log.directory, base) as reader:
            for info, body in reader.frames(start, tail=last):
                expected = head.next_position
                if info.first_position < expected or (last and info.first_position != expected):
                    raise JournalCorrupt(
                        reader.name,
                        info.offset,
                        f"frame starts at position {info.first_position}, expected {expected}",
                    )
                projection.apply(info, decode_frame_body(body))
    return bases[:-1]


def project_log(
    log: SegmentLog, view: View, txn: lmdb.Transaction, *, use_sidecars: bool = True
) -> Head:
    """Project the whole log into an empty view (a rebuild); returns the head.

    With `use_sidecars`, sealed segments whose sidecar carries their records (format 2)
    are projected from it without being read; the rest, and the active segment, are read.
    """
    bases = log.bases()
    first = bases[0] if bases else 1
    projection = Projection(view, txn, Head(first, SEGMENT_HEADER_SIZE, first, 0))
    if use_sidecars:
        for base in bases[:-1]:
            summary = read_summary(log.directory, base)
            if summary is None or summary.format < SUMMARY_FORMAT:
                break
            projection.apply_summary(summary)
            projection.head.segment = base
        else:
            if bases and projection.head.segment != bases[-1]:
                projection.head.segment = bases[-1]
                projection.head.end_offset = SEGMENT_HEADER_SIZE
                projection.head.next_position = max(projection.head.next_position, bases[-1])
    if bases:
        project_segments(log, projection)
    projection.flush()
    return projection.head


_COMPARED_ROW_FIELDS: Final = (
    "incarnation",
    "state",
    "mode",
    "context_id",
    "tags",
    "extensions",
    "created_at_ms",
    "ended_at_ms",
    "first_ordinal",
    "last_ordinal",
    "ttl_ms",
    "max_suspend_ms",
    "suspended_at_ms",
    "snapshot_ordinal",
    "snapshot_position",
)


def compare_views(
    view: View, txn: lmdb.Transaction, rebuilt: View, rebuilt_txn: lmdb.Transaction
) -> list[VerifyProblem]:
    """What the live view says differently from a view rebuilt from the log (fields that a
    rebuild of a retention-trimmed log cannot know, like byte counters, are not compared)."""
    problems: list[VerifyProblem] = []

    def rows(v: View, t: lmdb.Transaction) -> dict[bytes, tuple[object, ...]]:
        out = {}
        for key, raw in t.cursor(db=v.sessions):
            row = v.decode_row(bytes(raw))
            out[bytes(key)] = tuple(getattr(row, f) for f in _COMPARED_ROW_FIELDS)
        return out

    live, fresh = rows(view, txn), rows(rebuilt, rebuilt_txn)
    for key in sorted(live.keys() | fresh.keys()):
        if live.get(key) != fresh.get(key):
            problems.append(
                VerifyProblem("index", 0, f"session {key.decode()!r} differs from the log")
            )

    def locations(v: View, t: lmdb.Transaction) -> dict[bytes, tuple[int, int]]:
        return {bytes(k): LOCATION.unpack(val)[:2] for k, val in t.cursor(db=v.events)}

    live_locations, fresh_locations = locations(view, txn), locations(rebuilt, rebuilt_txn)
    if live_locations != fresh_locations:
        missing = len(fresh_locations.keys() - live_locations.keys())
        extra = len(live_locations.keys() - fresh_locations.keys())
        problems.append(
            VerifyProblem(
                "index",
                0,
                f"event index differs from the log ({missing} missing, {extra} extra or moved)",
            )
        )
    live_head, fresh_head = view.head(txn), rebuilt.head(rebuilt_txn)
    if (
        live_head is None
        or fresh_head is None
        or (
            (live_head.segment, live_head.end_offset, live_head.next_position)
            != (fresh_head.segment, fresh_head.end_offset, fresh_head.next_position)
        )
    ):
        problems.append(
            VerifyProblem("index", 0, f"head {live_head} but the log ends {fresh_head}")
        )
    return problems


def rebuild_into_temporary(log: SegmentLog) -> tuple[View, str]:
    """A view rebuilt from the log in a temporary directory (caller closes and removes)."""
    directory = tempfile.mkdtemp(prefix="journal-verify-")
    try:
        view = View(directory)
        with view.env.begin(write=True) as txn:
            project_log(log, view, txn, use_sidecars=False)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return view, directory
