"""Projections into a view whose reader holds no lock on the segment files: run again
while retention deletes or compaction replaces the files they read (`while_files_change`,
also verify's), and a read-only journal's private view (its build and refresh, SPEC 10).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import TypeVar

from ..errors import JournalCorrupt
from .files import FileOps
from .log import SegmentLog
from .projector import Projection, log_missing, project_log, project_segments
from .tombstones import forget_gone_creations
from .view import MissingEvents, View

__all__ = ["build_private", "project_new", "refresh_private", "while_files_change"]

T = TypeVar("T")


def while_files_change(
    log: SegmentLog,
    project: Callable[[], T],
    *,
    readonly_lock: bool = True,
    settled: Callable[[T], bool] | None = None,
    first: tuple[AbstractContextManager[object], Callable[[], None]] | None = None,
) -> T:
    """`project()`, a projection of a reader that holds no lock (a read-only journal's
    private view: its build at open and its refresh), run again when it failed on a
    segment file that retention deleted or compaction replaced after it was listed: it
    lists the segments again, without it. The last try holds the segment-files lock
    (through a read-only descriptor; unlocked when the lock file cannot be opened), as
    `verify` does (through this, with `settled`: a report with problems counts only from
    the run under the lock, which comes next when the files did not change meanwhile: a
    compaction swap replaces a segment, then writes its sidecar, under that lock).
    Without `settled`, a failure is tried again
    whether or not the files changed (listing them before every try took 0.4 ms at 200
    segments, on every refresh of a private view), so damage fails four times.

    `project` must leave nothing behind when it raises (its write transaction aborts).
    (Before, the error itself was raised: `journal watch` or a read-only open failed with
    "No such file or directory" now and then while a writer rotated segments under a
    retention window; found by a long-running trial with a reader process beside it.)

    `first`: (a lock, a step) the step runs at the start of every try under the lock,
    taken before the segment-files lock (verify catching a private view up: a refresh
    holds the journal's private-view lock when it takes the segment-files lock)."""
    attempt = 0
    while True:
        last = attempt == 3
        before = None if settled is None else log.file_versions()
        with contextlib.ExitStack() as stack:
            try:
                with first[0] if first is not None else contextlib.nullcontext():
                    if last:
                        # (A reader that may not even open the lock file runs unlocked.)
                        with contextlib.suppress(OSError):
                            stack.enter_context(log.files_lock(readonly=readonly_lock))
                    if first is not None:
                        first[1]()
                result = project()
            except (FileNotFoundError, JournalCorrupt):
                if last or (before is not None and log.file_versions() == before):
                    raise
                attempt += 1
                continue
        if last or settled is None or settled(result):
            return result
        # Unsettled: again while the files change, and under the lock when they did not
        # (a compaction swap replaces a segment and then its sidecar, both under it).
        attempt = attempt + 1 if log.file_versions() != before else 3


def build_private(log: SegmentLog, view: View, once: bool = False) -> None:
    """Project the whole log into a private view, emptied first, in one write transaction
    (retried as `while_files_change` does, but with `once`): its build at open, and its
    rebuild when the log was cut back under it (`private_tail`). Events the log lacks
    unaccounted for (SPEC 9) are logged from a build that saw the files hold still (a
    segment swapped in place after the listing, its trim record in a segment sealed
    after it, would look like a lost one)."""

    def build() -> list[MissingEvents]:
        missing: list[MissingEvents] = []
        with view.begin(write=True) as txn:
            view.clear(txn)
            view.put_store_id(txn, log.store_id)
            project_log(log, view, txn, missing=missing)
        return missing

    if once:
        log_missing(log, build())
    else:
        log_missing(log, while_files_change(log, build, settled=lambda found: not found))


def refresh_private(log: SegmentLog, view: View, ops: FileOps) -> None:
    """Project into a private view the frames the writer committed after its head, if
    any (retried, in a new transaction, on a fresh listing of the segments when one
    listed was deleted or replaced meanwhile: `while_files_change`)."""
    with view.begin() as txn:
        head = view.head(txn)
    if head is not None and log.moved_past(head.segment, head.end_offset, head.next_position):
        while_files_change(log, partial(project_new, log, view, ops))


def project_new(log: SegmentLog, view: View, ops: FileOps) -> None:
    """Project the frames after a private view's head into it, in one write transaction
    (aborted if it fails), with the pruning of the lifecycle feed below the writer's."""
    with view.begin(write=True) as txn:
        head = view.head(txn)
        assert head is not None  # (a private view has one from its build)
        projection = Projection(view, txn, head, ops)
        listing = log.segments()  # (one listing for the projection and the tombstones)
        project_segments(log, projection, listed=[s.base_position for s in listing])
        projection.flush()
        # Changes the writer pruned meanwhile, maybe past this view's head: a lifecycle
        # cursor from before them must expire here too, and their entries go here as well
        # (none at or below the floor is ever read), so a long-lived reader's view does
        # not keep every change ever made.
        floor = log.feed_floor() or 0
        below = view.feed_floor(txn)
        if floor > below:
            view.prune_feed(txn, below + 1, floor)
            view.raise_feed_floor(txn, floor)
        # The tombstones whose creation record left the log go as well (the writer's
        # retention and compaction forget them): `tombstones`.
        forget_gone_creations(log, view, txn, [(s.base_position, s.compressed) for s in listing])
