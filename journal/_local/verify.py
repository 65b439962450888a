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

from ..errors import JournalCorrupt
from ..models import VerifyProblem
from ..records import EventAppended, decode_frame_body
from .frames import sidecar_name
from .log import SegmentLog
from .projector import project_log
from .segments import SegmentReader, summarize_segment
from .sidecar import read_summary
from .view import Head, View

__all__ = ["check_log", "compare_views", "rebuild_into_temporary"]

Progress = Callable[[int, int], None]


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
        with SegmentReader(log.directory, base, log.ops) as reader:
            sizes[base] = reader.file_size()
    total = sum(sizes.values())
    done = 0
    for i, base in enumerate(bases):
        # Active as of `head` (a writer may have sealed it since, its sidecar not yet
        # written): only segments sealed before the snapshot must have their sidecar.
        active = i == len(bases) - 1 or (head is not None and base >= head.segment)
        committed_end = head.end_offset if head is not None and head.segment == base else None
        try:
            with SegmentReader(log.directory, base, log.ops) as reader:
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
                problems.append(VerifyProblem(sidecar_name(base), 0, "sidecar missing or bad"))
                bad_sidecars.append(base)
            else:
                try:
                    rescanned = summarize_segment(log.directory, base, log.ops)
                except JournalCorrupt:
                    rescanned = None
                if rescanned is not None:
                    rescanned.blocks = written.blocks
                    if rescanned != written:
                        problems.append(
                            VerifyProblem(
                                sidecar_name(base), 0, "sidecar disagrees with its segment"
                            )
                        )
                        bad_sidecars.append(base)
        done += sizes[base]
        if progress is not None:
            progress(done, total)
    return problems, frames, records, bad_sidecars


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
    "owner_generation",
    "owner_pid",
    "owner_start_time",
    "turn_request_id",
    "staged",
    "name_position",
    "imported_store",
    "imported_exported_at_ms",
)


def compare_views(
    view: View, txn: lmdb.Transaction, rebuilt: View, rebuilt_txn: lmdb.Transaction
) -> list[VerifyProblem]:
    """What the live view says differently from a view rebuilt from the log (fields that a
    rebuild of a retention-trimmed log cannot know, like byte counters, are not compared)."""
    problems: list[VerifyProblem] = []

    def rows(v: View, t: lmdb.Transaction) -> dict[str, tuple[object, ...]]:
        return {
            row.session_id: tuple(getattr(row, f) for f in _COMPARED_ROW_FIELDS)
            for row in v.rows(t, staged=True)
        }

    live, fresh = rows(view, txn), rows(rebuilt, rebuilt_txn)
    for key in sorted(live.keys() | fresh.keys()):
        if live.get(key) != fresh.get(key):
            problems.append(VerifyProblem("index", 0, f"session {key!r} differs from the log"))

    live_locations, fresh_locations = view.all_locations(txn), rebuilt.all_locations(rebuilt_txn)
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


def rebuild_into_temporary(log: SegmentLog, until: Head | None = None) -> tuple[View, str]:
    """A view rebuilt from the log in a temporary directory (caller closes and removes);
    with `until`, of the log as it was at that head (writers may have gone on)."""
    directory = tempfile.mkdtemp(prefix="journal-verify-")
    view: View | None = None
    try:
        view = View(directory)
        with view.begin(write=True) as txn:
            project_log(log, view, txn, use_sidecars=False, until=until)
    except BaseException:
        if view is not None:
            view.close()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return view, directory
