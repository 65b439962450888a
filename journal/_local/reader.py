"""The page reader: a session's events after an ordinal, by the page rule, straight from
the segment frames the view points at; and the context-managed cache of the segment
readers one reader of pages keeps open.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterator
from itertools import accumulate
from operator import attrgetter
from typing import Final

import lmdb

from ..engine import EventsPage
from ..errors import JournalCorrupt
from ..models import (
    Event,
    ReadContext,
    attach_context,
    bind_event,
    bind_events,
    event_incarnation,
)
from ..records import ReadRecord, decode_frame_for_read
from ..sessions import SessionRow
from .events_index import LOST_SEGMENT_WAY
from .files import DEFAULT_FILE_OPS, FileOps
from .frames import segment_name
from .segments import SegmentReader
from .view import Head, View, corrupt

__all__ = ["ReaderCache", "read_page"]

_DATA: Final = attrgetter("data")


# The frame a page ended inside (a page ends inside a frame whenever the next event does
# not fit): segment, offset and first ordinal of its index entry, the ordinal the next
# page starts at, the frame's first position and body length, its decoded records, the
# index of the first record the page did not deliver, and the data bytes of the records
# from there on (-1: not known).
# The next page reuses it when its snapshot's index names the same frame and it starts at
# that ordinal: frames are immutable where the index points (retention deletes,
# compaction copies frames to the same offsets), so the same entry means the same
# records, and re-reading them would only repeat the checks. Measured: with 1 MiB pages
# of 100-event frames, one frame in ten was decoded twice.
Carried = tuple[int, int, int, int, int, int, list[ReadRecord], int, int]


# How many followers' readers a process keeps open between pages (`ReaderCache.rest`,
# `ReaderCache.pause`).
KEPT_AT_HEAD: Final = 32


class _OpenReaders:
    """How many segment readers the process's `ReaderCache`s hold open now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def change(self, by: int) -> None:
        with self._lock:
            self.count += by


_OPEN: Final = _OpenReaders()


class ReaderCache:
    """The segment reader one reader of pages keeps open: a single `read()`, or a
    follower across all its pages (so read-ahead survives from page to page). It holds
    one reader at a time: opening a segment closes the other one (a page reads positions
    in order, and a follower's pages follow each other; a page of a session written
    slowly beside busy ones otherwise held a descriptor and a read buffer for each of its
    segments, and an export, reading session after session, one more per session). So a
    follower at the head holds the active segment only, and keeps its read-ahead.

    Context-managed: leaving it closes the reader. `begin_page()` drops it when its file
    was deleted or replaced meanwhile (retention, compaction: the disk space is freed at
    once).

    `lock` is held for a whole page: `close()` from another thread (the journal closing
    under a follower that is not being advanced) waits for a page in flight instead of
    closing files under it. From the thread of that page (a signal handler run inside
    it: the lock is reentrant) it closes nothing under the page: the page closes the
    reader as it ends (it waited for the page's lock, held by the very thread that
    waited, for good)."""

    # (A class default: a signal raised inside `__init__` leaves an object that `__del__`
    # still frees; it printed "Exception ignored in ... AttributeError" on stderr as the
    # demo stopped on SIGTERM, found by CI.)
    _reader: SegmentReader | None = None

    def __init__(self, directory: str, ops: FileOps = DEFAULT_FILE_OPS) -> None:
        self.directory = directory
        self.lock = threading.RLock()
        self._ops = ops
        self._paging = False  # (a page is in flight: set and cleared under `lock`)
        self._close_pending = False  # (closed while it was: the page's end closes it)
        self._reader: SegmentReader | None = None
        self._carried: Carried | None = None
        self._page_bytes = 1 << 20  # (the page being read: `begin_page`)
        # Where the reader `pause` closed had read to (its segment, its last frame's end):
        # the next page's reader of that segment reads ahead from there at once (it took
        # its first read for a jump: two reads a page, not one).
        self._paused_at: tuple[int, int] | None = None

    def __enter__(self) -> ReaderCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Dropped without `close()`: an `awatch` whose event loop was closed without
        # `shutdown_asyncgens` is never finalized, its frame is just cleared (found by a
        # soak trial: its descriptor stayed open for the life of the process, and `_OPEN`
        # never came back down). Nobody else holds it now; `_OPEN`'s lock is never held
        # while an object is freed (it guards an int addition only).
        self._drop_reader()

    def __len__(self) -> int:
        return 0 if self._reader is None else 1

    def get(self, segment: int) -> SegmentReader:
        """The open reader of `segment` (opened now, closing the other, if needed)."""
        reader = self._reader
        if reader is None or reader.base_position != segment:
            self._drop_reader()
            reader = self._reader = SegmentReader(self.directory, segment, self._ops)
            _OPEN.change(1)
            reader.set_pages(self._page_bytes)
            paused, self._paused_at = self._paused_at, None
            if paused is not None and paused[0] == segment:
                reader.read_on_from(paused[1])
        return reader

    def carry(self, carried: Carried) -> None:
        """Keep the frame a page ended inside for the next page (see `Carried`)."""
        self._carried = carried

    def take_carry(self) -> Carried | None:
        """The frame the last page ended inside, if any (each page takes it once)."""
        carried, self._carried = self._carried, None
        return carried

    def begin_page(self, active_segment: int, page_bytes: int) -> None:
        """Start a page of up to about `page_bytes`; `active_segment` is the log's active
        segment in the page's snapshot. Only sealed segments are deleted or replaced, so
        only their reader is checked (an fstat: a follower at the head makes no system
        call here)."""
        reader = self._reader
        if page_bytes != self._page_bytes:
            self._page_bytes = page_bytes
            if reader is not None:
                reader.set_pages(page_bytes)
        if reader is not None and reader.base_position != active_segment and reader.unlinked():
            self._drop_reader()

    def release(self) -> None:
        """Close the reader until the next page (`PageReaders.release`); the frame a page
        ended inside stays carried (its decoded records)."""
        with self.lock:
            if not self._paging:  # (a page of this thread in flight: not under it)
                self._drop_reader()

    def rest(self) -> None:
        """A page ended at the session's last event, and its follower may wait at the
        head for long: close the reader (its descriptor and buffer) when the process
        keeps more than `KEPT_AT_HEAD` followers' readers open, else keep it open without
        a large buffer (`SegmentReader.rest`). A thousand followers that caught up held
        a descriptor each (the 1,020th failed with EMFILE under the usual limit of 1,024)
        and a buffer of up to 64 KiB (37 MiB); reopening the segment for every page
        (about 14 us: open, the header's `pread`, close) made the next event of a few
        followers reach them later (cross-process follow p50 0.2 ms later)."""
        reader = self._reader
        if reader is None:
            return
        if _OPEN.count > KEPT_AT_HEAD:
            self._drop_reader()
        else:
            reader.rest()

    def pause(self) -> None:
        """A page ended before the session's last event, and its reader may not come
        back for long (the consumer of a follow that stopped pulling: a server's slow
        client): close the reader, its descriptor and its read buffer of up to 1 MiB,
        when the process keeps more than `KEPT_AT_HEAD` followers' readers open. 1,000
        `awatch` streams stalled in a catch-up failed with EMFILE under the usual limit of
        1,024, and 200 with 64 KiB pages held 231 MiB. The first `KEPT_AT_HEAD` keep
        their read-ahead from page to page."""
        reader = self._reader
        if reader is not None and _OPEN.count > KEPT_AT_HEAD:
            self._drop_reader()
            self._paused_at = (reader.base_position, reader.last_end)

    def _drop_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            _OPEN.change(-1)
            reader.close()

    def close(self) -> None:
        with self.lock:
            if self._paging:  # (a page of this very thread: see the class)
                self._close_pending = True
            else:
                self.drop_all()

    def page(self) -> None:
        """A page begins (the caller holds `lock`)."""
        self._paging = True

    def page_ended(self) -> None:
        """The page ended (the caller holds `lock`): a close meanwhile is done now."""
        self._paging = False
        if self._close_pending:
            self._close_pending = False
            self.drop_all()

    def drop_all(self) -> None:
        """Close the reader (the caller holds `lock`)."""
        self._carried = self._paused_at = None
        self._drop_reader()


def read_page(
    view: View,
    session_id: str,
    incarnation: int,
    after: int,
    max_bytes: int,
    context: ReadContext,
    readers: ReaderCache,
    refresh: Callable[[], None] | None = None,
) -> EventsPage:
    """One page in one read snapshot (see `Engine.read`), retried on a fresh snapshot when
    retention deleted (or compaction dropped) a frame the snapshot still pointed at: the
    newer snapshot either no longer needs it or says the history expired. Real damage
    fails again and is raised. `refresh` (a read-only journal's private view) brings the
    view up to the log before a retry: only then does its fresh snapshot know of the trim
    that let the frame go. (Without it, a private view's reader got `JournalCorrupt`
    "points at ..., which does not exist" where the history had expired; found by a
    long-running trial.)"""
    with readers.lock:
        readers.page()
        try:
            return _page_retried(
                view, session_id, incarnation, after, max_bytes, context, readers, refresh
            )
        finally:
            readers.page_ended()


def _page_retried(
    view: View,
    session_id: str,
    incarnation: int,
    after: int,
    max_bytes: int,
    context: ReadContext,
    readers: ReaderCache,
    refresh: Callable[[], None] | None,
) -> EventsPage:
    """`read_page` under the page readers' lock."""
    head: Head | None = None
    for attempt in range(3):
        if attempt and refresh is not None:
            refresh()
        try:
            with view.begin() as txn:
                head = view.head(txn)
                readers.begin_page(0 if head is None else head.segment, max_bytes)
                page = _page_once(
                    txn, view, head, session_id, incarnation, after, max_bytes, context, readers
                )
        except FileNotFoundError as e:
            readers.drop_all()
            if attempt == 2:
                raise _missing_file(session_id, e.filename, head) from None
            continue
        except JournalCorrupt:
            readers.drop_all()
            if attempt == 2:
                raise
            continue
        if page.has_more:
            readers.pause()
        else:
            readers.rest()
        return page
    raise AssertionError("unreachable")


def _missing_file(session_id: str, filename: str | None, head: Head | None) -> JournalCorrupt:
    """The error of a read whose segment file is gone for good: three fresh snapshots
    still place the session's frames there, so it is no race with retention or compaction.
    A segment at or below the view's head is a file the log lost (deleted by hand, left
    out of a restore: SPEC 9), named as `verify` names it, with the same ways out; until
    2026-12-06 the read said "corrupt journal view", named the `.seg.zst` it tried last,
    and sent the user to `verify --fix`, which keeps such a view (rebuilt, it would take
    the events for trimmed ones) and said so. Past the head no segment ever was: the
    entry is damage of the view."""
    name = os.path.basename(filename or "?").removesuffix(".zst")
    base = name.removesuffix(".seg")
    if head is not None and base.isdigit() and int(base) <= head.segment:
        return JournalCorrupt(
            name,
            0,
            f"missing: the index places events of session {session_id!r} in it, and the "
            "log no longer has the file",
            way=LOST_SEGMENT_WAY,
        )
    return corrupt(
        f"the events index of session {session_id!r} points at {name}, which does not exist"
    )


def _page_once(
    txn: lmdb.Transaction,
    view: View,
    head: Head | None,
    session_id: str,
    incarnation: int,
    after: int,
    max_bytes: int,
    context: ReadContext,
    readers: ReaderCache,
) -> EventsPage:
    next_position = 1 if head is None else head.next_position
    row = view.row(txn, session_id)
    if row is not None and row.incarnation == incarnation:
        missing = view.missing(txn, incarnation)
        if missing is not None and after < missing.last:
            # (A read that would pass over events a lost segment file held: SPEC 9.)
            # (Not "restore the segment": the one named holds the frame after them.)
            raise JournalCorrupt(
                segment_name(missing.segment),
                missing.offset,
                f"{missing.describe()}; the frame after them is here",
                way="restore the lost segment file (one before this one) from a backup and "
                "run `journal verify --fix`, or accept the loss with `journal verify --fix`",
            )
    if row is None or row.incarnation != incarnation or after < row.first_ordinal - 1:
        return EventsPage([], False, row, next_position)
    events, has_more = _read_events(txn, view, head, row, after, max_bytes, context, readers)
    return EventsPage(events, has_more, row, next_position)


def _read_events(
    txn: lmdb.Transaction,
    view: View,
    head: Head | None,
    row: SessionRow,
    after: int,
    max_bytes: int,
    context: ReadContext,
    readers: ReaderCache,
) -> tuple[list[Event], bool]:
    """Events after ordinal `after` up to about `max_bytes`, and whether more follow."""
    start = after + 1
    last = row.last_ordinal
    carried = readers.take_carry()
    if start > last:
        return [], False
    incarnation = row.incarnation
    session_id = row.session_id
    events: list[Event] = []
    size = 0
    expected = start
    full = False
    append = events.append
    head_segment, head_end = (head.segment, head.end_offset) if head else (0, 0)
    reader: SegmentReader | None = None
    reader_segment = -1
    locations = view.events.frames_from(txn, incarnation, start)
    entry = _next_entry(locations)
    while entry is not None:
        if isinstance(entry, JournalCorrupt):
            if events:  # (the events before the damage first: the next page raises it)
                return events, True
            raise entry
        first_ordinal, segment, offset, before = entry
        # The reader looks one entry ahead (for the byte counts), but raises damage only
        # when it reaches that entry, so a page that ends before it is still read.
        try:
            entry = next(locations, None)
        except JournalCorrupt as damage:
            entry = damage
        # The data bytes of the session's events in this frame, from the index: the next
        # entry's running total (or the row's) minus this one's. Checked against the
        # body length below; an index without them (or damaged) makes it implausible.
        if entry is None:
            frame_bytes = row.appended_bytes - before
        else:
            frame_bytes = -1 if isinstance(entry, JournalCorrupt) else entry[3] - before
        if segment != reader_segment or reader is None:
            reader = readers.get(segment)
            reader_segment = segment
        if carried is not None and carried[:4] == (segment, offset, first_ordinal, start):
            # The frame the last page ended inside: its records were decoded and checked
            # then (the index entry named this frame), and its undelivered tail is reused.
            first_position, body_length, records, skip, run_bytes = carried[4:]
            carried = None
        else:
            try:
                first_position, body_length, records = reader.read_records(
                    offset, head_end if segment == head_segment else None, decode_frame_for_read
                )
            except JournalCorrupt:
                if events:  # (as above: a damaged frame is raised by the page it starts)
                    return events, True
                raise
            skip = 0
            run_bytes = frame_bytes if 0 <= frame_bytes <= body_length else -1
        # The run: the records from `skip` on (all of them, but in a carried frame).
        position = first_position + skip
        count = len(records) - skip
        first_record = records[skip]
        last_record = records[-1]
        if (
            first_record.__class__ is Event
            and last_record.__class__ is Event
            and event_incarnation(first_record) == incarnation
            and event_incarnation(last_record) == incarnation
            and first_record.ordinal == expected
            and (skip or first_record.ordinal == first_ordinal)
            and last_record.ordinal == expected + count - 1
            and last_record.ordinal <= last
        ):
            # The common frame: one batch of this session's next events (dense ordinals
            # leave no room for other records between first and last), taken whole when
            # it fits the page (the body length bounds the data when the index has no
            # count), else as many events as fit, found without a Python step per event.
            run: list[Event] = records[skip:] if skip else records  # type: ignore[assignment]
            # Frames written before records carried their position are numbered here.
            renumber = 0 if first_record.position == position else position
            if run_bytes >= 0 and size + run_bytes <= max_bytes:
                attach_context(run, context, renumber)
                size += run_bytes
            elif run_bytes < 0 and size + body_length <= max_bytes:
                size += bind_events(run, context, renumber)
            else:
                # ends[k]: the page's bytes with the run's first k events
                ends = list(accumulate(map(len, map(_DATA, run)), initial=size))
                fit = max(bisect_right(ends, max_bytes) - 1, 0 if events else 1)
                if fit < count:
                    # The next page starts inside this frame: keep its undelivered
                    # records instead of reading and decoding it again.
                    full = True
                    readers.carry(
                        (
                            segment,
                            offset,
                            first_ordinal,
                            expected + fit,
                            first_position,
                            body_length,
                            records,
                            skip + fit,
                            ends[-1] - ends[fit],
                        )
                    )
                    run = run[:fit]
                attach_context(run, context, renumber)
                size = ends[fit]
                count = fit
            events.extend(run)
            expected += count
            if full or expected > last:
                break
            continue
        # The general case, one record at a time: kept flat.
        indexed = 0 if skip else first_ordinal
        for index in range(skip, len(records)):
            record = records[index]
            if record.__class__ is Event and event_incarnation(record) == incarnation:
                ordinal = record.ordinal
                if indexed:
                    # The index entry must name the frame's first event of the session.
                    if ordinal != indexed:
                        raise _misplaced(session_id, indexed, reader.name, offset)
                    indexed = 0
                if ordinal >= expected:
                    if ordinal != expected:
                        raise JournalCorrupt(
                            reader.name,
                            offset,
                            f"session {session_id!r} skips from ordinal "
                            f"{expected - 1} to {ordinal}",
                        )
                    length = len(record.data)
                    if events and size + length > max_bytes:
                        full = True
                        # The next page starts here: keep the frame's undelivered records
                        # (one frame at most) instead of reading and decoding it again.
                        readers.carry(
                            (
                                segment,
                                offset,
                                first_ordinal,
                                expected,
                                first_position,
                                body_length,
                                records,
                                index,
                                -1,
                            )
                        )
                        break
                    bind_event(record, context, position)
                    append(record)
                    size += length
                    expected += 1
                    if expected > last:
                        break
            position += 1
        if indexed:
            raise _misplaced(session_id, indexed, reader.name, offset)
        if full or expected > last:
            break
    if not full and expected <= last:
        # The view points past what the segments hold: name the last segment read (or the
        # active one) so the message leads to a real file.
        raise JournalCorrupt(
            reader.name if reader is not None else segment_name(head_segment),
            0,
            f"the index of session {session_id!r} has no frame for ordinal {expected}",
        )
    return events, expected <= last


def _next_entry(
    locations: Iterator[tuple[int, int, int, int]],
) -> tuple[int, int, int, int] | JournalCorrupt | None:
    """The next index entry, or the damage found reading it: the reader looks one entry
    ahead (for the byte counts), but raises damage only when it reaches that entry, so a
    page that ends before it is still read as before."""
    try:
        return next(locations, None)
    except JournalCorrupt as damage:
        return damage


def _misplaced(session_id: str, ordinal: int, segment: str, offset: int) -> JournalCorrupt:
    return corrupt(
        f"the events index of session {session_id!r} places ordinal {ordinal} in the "
        f"frame at {segment}:{offset}, which does not begin the session's events there"
    )
