"""Checking a store: every frame against its checksum, every sidecar against its segment,
and the LMDB view against a view rebuilt from the log.

`verify(fix=False)` only reads (the rebuilt view goes to a temporary directory outside the
store); `verify(fix=True)` rewrites bad sidecars and rebuilds the view in place.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import Final, TypeVar

import lmdb

from ..errors import JournalCorrupt
from ..models import VerifyProblem, VerifyReport
from ..records import EventAppended, decode_frame_body
from .compaction import Unfinished, swap_marks, unfinished_swaps
from .events_index import LOST_SEGMENT_WAY
from .frames import (
    SEGMENT_HEADER_SIZE,
    FrameInfo,
    segment_name,
    sidecar_name,
)
from .log import SegmentLog
from .projector import project_log
from .reader_views import while_files_change
from .recovery import process_alive
from .retention import SummaryCache, dead_segments
from .segments import LogHole, SegmentReader, frame_records, summarize_segment
from .sidecar import read_summary, write_summary
from .view import Head, MissingEvents, View
from .view_codec import U64

__all__ = [
    "check_log",
    "compare_views",
    "fix_store",
    "missing_segments",
    "rebuilt_view",
    "verify_store",
    "view_problem",
]

Progress = Callable[[int, int], None]
_K = TypeVar("_K")


def check_log(
    log: SegmentLog,
    head: Head | None,
    progress: Progress | None = None,
    swapped: Collection[int] = (),
) -> tuple[list[VerifyProblem], int, int, list[int]]:
    """Verify every frame of every segment and every sidecar.

    Returns (problems, frames, records, bases whose sidecar is missing or wrong).
    `swapped`: the segments that swap marks name (SPEC 8, "Compaction"), whose missing
    sidecar (deleted before the rename) a writer's catch-up writes.
    """
    problems: list[VerifyProblem] = []
    frames = records = 0
    bad_sidecars: list[int] = []
    # incarnation -> the last event ordinal its records reached, in log order: checksummed
    # event records the projector would pass over (an ordinal that does not move on, or a
    # session that does not exist yet) are problems, not silently skipped.
    reached: dict[int, int] = {}
    bases = log.bases()
    sizes = {}
    for base in bases:
        try:
            reader = SegmentReader(log.directory, base, log.ops)
        except JournalCorrupt:
            # (A damaged header, or no file: `_check_segment` reports it, and goes on;
            # its bytes only count towards the progress report.)
            sizes[base] = 0
            continue
        with reader:
            sizes[base] = reader.file_size()
            if reader.header.store_id != log.store_id:
                problems.append(
                    VerifyProblem(
                        reader.name,
                        0,
                        f"belongs to another store (its header names store "
                        f"{reader.header.store_id.hex()}, store.json {log.store_id.hex()})",
                    )
                )
    total = sum(sizes.values())
    done = 0
    # A writer killed inside a seal, after the next segment's birth and before the sealed
    # one's sidecar (SPEC 3.4), leaves the newest sealed segment without one and the head
    # (a private view's: the store's stays in the sealed segment) at the start of the next
    # segment, which no frame reaches before the sidecar is written: the next writer
    # writes it. A damaged sidecar there is still a problem.
    sealing = None
    if head is not None and head.end_offset == SEGMENT_HEADER_SIZE and head.segment in bases[1:]:
        sealing = bases[bases.index(head.segment) - 1]
    for i, base in enumerate(bases):
        # Active as of `head` (a writer may have sealed it since, its sidecar not yet
        # written): only segments sealed before the snapshot must have their sidecar.
        active = i == len(bases) - 1 or (head is not None and base >= head.segment)
        committed_end = head.end_offset if head is not None and head.segment == base else None
        counted, read, damaged = _check_segment(log, base, committed_end, active, reached, problems)
        frames += counted
        records += read
        if damaged:
            done += sizes[base]
            if progress is not None:
                progress(done, total)
            continue  # (its sidecar cannot be checked against a rescan that fails)
        if not active:
            written = read_summary(log.directory, base)
            if (
                written is None
                and (base in swapped or base == sealing)
                and not _exists(log, sidecar_name(base))
            ):
                pass  # (not damage: what the next writable open finishes, SPEC 3.4 and 8)
            elif written is None:
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


def _check_segment(
    log: SegmentLog,
    base: int,
    committed_end: int | None,
    active: bool,
    reached: dict[int, int],
    problems: list[VerifyProblem],
) -> tuple[int, int, bool]:
    """Check every frame of one segment (problems appended): (frames, records, whether it
    is damaged). A damaged frame is reported and the check reads on from the next valid
    frame after it, so every damaged frame is listed, not only the first."""
    frames = records = 0
    try:
        reader = SegmentReader(log.directory, base, log.ops)
    except JournalCorrupt as e:  # (its header)
        problems.append(VerifyProblem(e.segment, e.offset, e.detail))
        return 0, 0, True
    damaged = False
    start: int | None = SEGMENT_HEADER_SIZE
    last_position = base - 1  # (of the last frame read whole)
    with reader:
        while start is not None:
            begun = start
            try:
                for info, body in reader.frames(begun, committed_end=committed_end, tail=active):
                    frames += 1
                    records += _check_frame(reader.name, info, body, reached, problems)
                    last_position = info.first_position + info.count - 1
                start = None
            except JournalCorrupt as e:
                problems.append(VerifyProblem(e.segment, e.offset, e.detail))
                damaged = True
                restart = reader.next_frame_after(e.offset, last_position)
                # (Always forward: a restart at or before where this read began ends it.)
                start = restart if restart is not None and restart > begun else None
    return frames, records, damaged


def _check_frame(
    name: str,
    info: FrameInfo,
    body: memoryview,
    reached: dict[int, int],
    problems: list[VerifyProblem],
) -> int:
    """Check one frame's records (problems appended); returns how many it holds."""
    try:
        decoded = frame_records(name, info, body, decode_frame_body)
    except JournalCorrupt as e:
        problems.append(VerifyProblem(e.segment, e.offset, e.detail))
        return 0
    position = info.first_position
    for record in decoded:
        if isinstance(record, EventAppended):
            what = _event_problem(record, position, reached)
            if what is not None:
                problems.append(VerifyProblem(name, info.offset, what))
        position += 1
    return len(decoded)


def _event_problem(record: EventAppended, position: int, reached: dict[int, int]) -> str | None:
    """What is wrong with an event record stored at `position` (None: nothing), given the
    ordinals its session's earlier records `reached` (updated). A session's incarnation is
    the position of the record that created it, so it comes before its events; ordinals
    start at 1 and only grow (retention and compaction leave gaps, never steps back)."""
    if record.position and record.position != position:
        return f"event record says position {record.position}, its frame places it at {position}"
    incarnation, ordinal = record.incarnation, record.ordinal
    if not 0 < incarnation < position:
        return (
            f"event record at position {position} names session incarnation {incarnation}, "
            "which no earlier record created: the index passes over it"
        )
    if ordinal < 1:
        return (
            f"event record at position {position} has ordinal {ordinal} (ordinals start "
            "at 1): the index passes over it"
        )
    last = reached.get(incarnation, 0)
    if ordinal <= last:
        return (
            f"event record at position {position} has ordinal {ordinal} of incarnation "
            f"{incarnation}, which already reached {last}: the index passes over it"
        )
    reached[incarnation] = ordinal
    return None


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
    "checkpoint_ordinal",
    "checkpoint_position",
)


def missing_segments(
    log: SegmentLog, view: View, txn: lmdb.Transaction, present: set[int] | None = None
) -> list[VerifyProblem]:
    """A problem for each segment the view's events index places frames in that the log
    no longer has (retention and compaction remove a segment's entries before its file:
    one that is gone with entries left was lost). `present`: the log's segments, listed
    before `txn` began (a compaction that commits meanwhile then deletes nothing the
    transaction still places frames in), else listed now."""
    present = set(log.bases()) if present is None else present
    frames: dict[int, int] = {}
    sessions: dict[int, set[int]] = {}
    try:
        for incarnation, segment in view.events.segments_used(txn):
            if segment not in present:
                frames[segment] = frames.get(segment, 0) + 1
                sessions.setdefault(segment, set()).add(incarnation)
    except JournalCorrupt:
        return []  # (a damaged entry: the comparison with a rebuilt view reports it)
    return [
        VerifyProblem(
            segment_name(segment),
            0,
            f"missing: the index places {frames[segment]} frame(s) of events of "
            f"{len(sessions[segment])} session(s) in it; {LOST_SEGMENT_WAY}",
        )
        for segment in sorted(frames)
    ]


def compare_views(
    view: View,
    txn: lmdb.Transaction,
    rebuilt: View,
    rebuilt_txn: lmdb.Transaction,
    dead: Callable[[], list[tuple[int, int]]] = list,
    unfinished: Sequence[Unfinished] = (),
) -> list[VerifyProblem]:
    """What the live view says differently from a view rebuilt from the log: rows, the
    events index, the state index, the other derived tables and the head (what a rebuild
    of a retention-trimmed log cannot know, like byte counters, is not compared). `dead`:
    the position ranges of the sealed segments the live view holds nothing live in (their
    files may not be deleted yet); `unfinished`: swaps whose view's part is left to the
    next writable open, the live view compared as that part will leave it."""
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

    live_locations, fresh_locations = (
        view.events.everything(txn),
        rebuilt.events.everything(rebuilt_txn),
    )
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
    live_states, fresh_states = view.states.entries(txn), rebuilt.states.entries(rebuilt_txn)
    if live_states != fresh_states:
        missing, extra = _missing_and_stale(live_states, fresh_states)
        problems.append(
            VerifyProblem(
                "index",
                0,
                f"state index differs from the log ({missing} missing, {extra} extra or stale)",
            )
        )
    kept = {row.incarnation for row in rebuilt.rows(rebuilt_txn, staged=True)}
    problems += _compare_tables(view, txn, rebuilt, rebuilt_txn, kept, dead, unfinished)
    live_head, fresh_head = view.head(txn), rebuilt.head(rebuilt_txn)
    if (
        live_head is None
        or fresh_head is None
        or not (_same_end(live_head, fresh_head) or _same_end(fresh_head, live_head))
    ):
        problems.append(
            VerifyProblem("index", 0, f"head {live_head} but the log ends {fresh_head}")
        )
    return problems


# The derived tables a rebuild recreates entry for entry from the records the log still
# holds (SPEC 9): compared as stored (values and their checksums).
_EXACT_TABLES: Final = (b"incarnations", b"idem", b"deadlines", b"pins", b"tombstones", b"aged")


def _compare_tables(
    view: View,
    txn: lmdb.Transaction,
    rebuilt: View,
    rebuilt_txn: lmdb.Transaction,
    kept: set[int],
    dead: Callable[[], list[tuple[int, int]]],
    unfinished: Sequence[Unfinished],
) -> list[VerifyProblem]:
    """What the live view's other derived tables say differently from the rebuilt view's
    (`kept`: the incarnations of the rebuilt view's sessions; `dead`: the position
    ranges of the sealed segments that hold nothing live for the live view;
    `unfinished`: as for `compare_views`)."""
    problems: list[VerifyProblem] = []
    tables = {name: rebuilt.stored(rebuilt_txn, name) for name in _EXACT_TABLES}
    lives = {name: view.stored(txn, name) for name in _EXACT_TABLES}
    feed = view.stored(txn, b"feed")
    floor = max(view.feed_floor(txn), _as_finished(view, txn, lives, feed, unfinished))
    live_tombstones = lives[b"tombstones"]
    forgotten = tables[b"tombstones"].keys() - live_tombstones.keys()
    if forgotten:
        # A retention pass forgets the tombstones (with their ids and eviction pins) of
        # the sessions created in the segments it found dead, in its transaction; their
        # files go after it commits, or at a later pass when deleting them failed. Till
        # then a rebuild still finds those creation records.
        ranges = dead()
        for key in forgotten:
            incarnation = U64.unpack(key)[0]
            if any(first <= incarnation <= last for first, last in ranges):
                position = tables[b"tombstones"].pop(key)[: U64.size]
                tables[b"incarnations"].pop(key, None)
                tables[b"pins"].pop(position, None)
    for name in _EXACT_TABLES:
        live, fresh = lives[name], tables[name]
        if live != fresh:
            missing, extra = _missing_and_stale(live, fresh)
            problems.append(
                VerifyProblem(
                    "index",
                    0,
                    f"{name.decode()} table differs from the log ({len(live)} entries, a "
                    f"rebuilt view has {len(fresh)}: {missing} missing, {extra} extra or stale)",
                )
            )
    # The lifecycle feed above the live view's floor (entries at or below it are never
    # read; a read-only reader's private view deletes them). An entry's row is the
    # session after the change, which a rebuild of a trimmed log cannot know (byte
    # counters, transitions that left the log): what the record says is compared. And an
    # evicted session's entries stay while their records do, but a rebuild derives them
    # only while its creation (or import) record is still in the log: one without a
    # session row in the rebuilt view may have entries only the live view has.
    # (Entries stored alike are alike; only the others are decoded.)
    live_feed = {k: v for k, v in feed.items() if U64.unpack(k)[0] > floor}
    fresh_feed = _feed_after(rebuilt, rebuilt_txn, floor)
    missing = len(fresh_feed.keys() - live_feed.keys())
    extra = 0
    for key, raw in live_feed.items():
        stored = fresh_feed.get(key)
        if stored != raw:
            change = _change(view, txn, key)
            if stored is not None:
                extra += change != _change(rebuilt, rebuilt_txn, key)
            else:
                extra += change[2] in kept
    if missing or extra:
        problems.append(
            VerifyProblem(
                "index",
                0,
                f"lifecycle feed differs from the log after position {floor} "
                f"({missing} missing, {extra} extra or stale)",
            )
        )
    return problems


def _as_finished(
    view: View,
    txn: lmdb.Transaction,
    tables: dict[bytes, dict[bytes, bytes]],
    feed: dict[bytes, bytes],
    unfinished: Sequence[Unfinished],
) -> int:
    """Take out of the live view's `tables` what the view's part of the `unfinished`
    swaps forgets (`finish_swaps`: the tombstones, with their ids and the pins of their
    eviction records, of the incarnations in each range its file no longer holds), and
    return the feed floor that part raises (the highest position in a range whose feed
    entry goes: the file no longer holds it; 0: none), as it prunes the `feed`."""
    floor = 0
    for swap in unfinished:
        first, last = swap.first_position, swap.last_position
        for incarnation, position in view.tombstones_between(txn, first, last):
            if not swap.held(incarnation):
                tables[b"tombstones"].pop(U64.pack(incarnation), None)
                tables[b"incarnations"].pop(U64.pack(incarnation), None)
                tables[b"pins"].pop(U64.pack(position), None)
        for key in feed:
            position = U64.unpack(key)[0]
            if first <= position <= last and not swap.held(position):
                floor = max(floor, position)
    return floor


def _exists(log: SegmentLog, name: str) -> bool:
    return os.path.lexists(os.path.join(log.directory, name))


def _feed_after(view: View, txn: lmdb.Transaction, floor: int) -> dict[bytes, bytes]:
    """The lifecycle feed's entries after `floor`, as stored (keys: u64 positions)."""
    return {k: v for k, v in view.stored(txn, b"feed").items() if U64.unpack(k)[0] > floor}


def _change(view: View, txn: lmdb.Transaction, key: bytes) -> tuple[object, ...]:
    """What a feed entry's record says: event, time, incarnation and session id."""
    entry = view.feed_entry(txn, U64.unpack(key)[0])
    assert entry is not None  # (read from the same snapshot)
    return entry.event_type, entry.at_ms, entry.row.incarnation, entry.row.session_id


@contextmanager
def rebuilt_view(
    log: SegmentLog, until: Head | None = None, missing: list[MissingEvents] | None = None
) -> Iterator[View]:
    """A view rebuilt from the log in a temporary directory, closed and removed at the
    end of the block; with `until`, of the log as it was at that head (writers may have
    gone on). Events the log lacks unaccounted for go in `missing` (`project_log`)."""
    with _temporary_directory("journal-verify-") as directory:
        view = View(directory)
        try:
            with view.begin(write=True) as txn:
                project_log(log, view, txn, use_sidecars=False, until=until, missing=missing)
            yield view
        finally:
            view.close()


@contextmanager
def _temporary_directory(prefix: str) -> Iterator[str]:
    """A new directory (0700) in the temporary directory, removed with its contents at
    the end of the block. Named before it is made: `tempfile.mkdtemp` made it and then
    returned its name, and the exception of a signal's handler (Ctrl+C, the CLI's
    SIGTERM) raised in between, as the mkdir returned, left it behind for good."""
    parent = tempfile.gettempdir()
    while True:
        directory = os.path.join(parent, prefix + secrets.token_hex(6))
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue
        except OSError:
            raise  # (not made)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)  # (raised once it was made)
            raise
        break
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def verify_store(
    log: SegmentLog,
    view: View,
    lock: bool,
    progress: Progress | None,
    first: tuple[AbstractContextManager[object], Callable[[], None]] | None = None,
) -> VerifyReport:
    """Check everything, change nothing: frames, sidecars, and the view against a view
    rebuilt from the log.

    One snapshot of the view throughout, compared with the log as of its head: writers
    that go on meanwhile are not differences. Retention or compaction deleting or
    rewriting segments meanwhile is not damage either: a run that saw the segment files
    change is repeated, and one that found a problem is repeated under the segment-files
    lock, which holds them still (`lock`: a writer's; a read-only reader takes it
    through a read-only descriptor, or runs without it when it cannot open the lock
    file). `first`: a read-only journal's private view is caught up with the files at
    the start of every run, under the view's lock (`while_files_change`), so that its
    snapshot and the rebuild see the same files."""
    return while_files_change(
        log,
        lambda: _verify_once(log, view, progress),
        readonly_lock=not lock,
        settled=lambda report: report.ok,
        first=first,
    )


def _verify_once(log: SegmentLog, view: View, progress: Progress | None) -> VerifyReport:
    # The view's file is checked before LMDB reads it (a damaged one could crash it); a
    # damaged view is reported, and the log is still checked in full.
    damage = view.inspect()
    if damage is None:
        try:
            with view.begin() as txn:
                head = view.head(txn)
                # (Swaps a killed compaction left to the next writable open: a sound store.)
                _, unfinished = unfinished_swaps(log, process_alive)
                # (Marks of live processes too: a swap in progress, or one that failed
                # after its rename, whose sidecar the next commit writes: SPEC 14.4.)
                swapped = swap_marks(log)
                problems, frames, records, _ = check_log(log, head, progress, swapped)
                problems += missing_segments(log, view, txn)
                if not any(p.segment != "index" for p in problems):
                    missing: list[MissingEvents] = []
                    with (
                        rebuilt_view(log, head, missing) as rebuilt,
                        rebuilt.begin() as rebuilt_txn,
                    ):
                        dead = partial(_dead, log, view, txn)
                        problems += compare_views(view, txn, rebuilt, rebuilt_txn, dead, unfinished)
                    problems += [_missing_problem(log, m, accepted=False) for m in missing]
            return VerifyReport(len(log.bases()), frames, records, problems)
        except JournalCorrupt as e:
            if e.segment != "index":
                raise
            damage = e.detail
    problems, frames, records, _ = check_log(log, None, progress)
    problems.insert(0, view_problem(damage))
    return VerifyReport(len(log.bases()), frames, records, problems)


def _missing_problem(
    log: SegmentLog, missing: MissingEvents, accepted: bool | None
) -> VerifyProblem:
    """How events the log lacks unaccounted for are reported (`MissingEvents`); `accepted`
    None: by a fix that accepted a hole, which leaves them to the next fix."""
    if accepted:
        way = f"the loss is accepted (a trim record now starts the session at {missing.last + 1})"
    elif accepted is None:
        way = (
            "restore the segment file from a backup and run verify --fix, or accept the "
            "loss with verify --fix again (this one accepted the cut-off frames only)"
        )
    else:
        way = (
            "restore the segment file from a backup and run verify --fix, or accept the "
            "loss with verify --fix"
        )
    name = segment_name(missing.segment)
    if not os.path.exists(os.path.join(log.directory, name)):
        name = segment_name(missing.segment, compressed=True)
    return VerifyProblem(name, missing.offset, f"{missing.describe()}: {way}")


def _dead(log: SegmentLog, view: View, txn: lmdb.Transaction) -> list[tuple[int, int]]:
    """The position ranges of the sealed segments that hold nothing live for `view`."""
    return [
        (segment.base_position, segment.last_position)
        for segment in dead_segments(txn, view, log, SummaryCache())
    ]


def _same_end(a: Head, b: Head) -> bool:
    """Whether two heads name the same end of the log: equal, or `a` at the start of an
    empty active segment that begins where `b`'s segment ends (a rotation whose first
    frame was refused leaves such a segment; a rebuild stops before it)."""
    if a.next_position != b.next_position:
        return False
    if (a.segment, a.end_offset) == (b.segment, b.end_offset):
        return True
    return a.segment == a.next_position and a.end_offset == SEGMENT_HEADER_SIZE


def view_problem(damage: str) -> VerifyProblem:
    """How a damaged view is reported (the way out once: a finding of the view's own
    checks names it already)."""
    if "verify --fix" in damage:
        return VerifyProblem("index", 0, f"the view is damaged: {damage}")
    return VerifyProblem("index", 0, f"the view is damaged ({damage}); verify --fix rebuilds it")


def fix_store(
    log: SegmentLog,
    view: View,
    txn: lmdb.Transaction,
    ids: tuple[bytes, bytes],
    hole: LogHole | None,
    progress: Progress | None,
) -> tuple[VerifyReport, bool, list[MissingEvents]]:
    """`verify(fix=True)` in the writer's transaction `txn` (`ids`: the store id and this
    boot's id): check the log, rewrite bad sidecars of intact segments, and rebuild the
    view when only derived data was wrong. The report, whether the view was rebuilt, and
    the events of live sessions the log lacks unaccounted for, whose loss the caller
    accepts (records a trim that starts each such session after them).
    With damaged frames the view is left as it is: it still points readers at the damage
    (`JournalCorrupt`), where a rebuild would make the lost events look trimmed."""
    store_id, boot_id = ids
    # (With a hole, the view's head lies past the log's end: check the log as it is.)
    head = None if hole is not None else view.head(txn)
    problems, frames, records, bad_sidecars = check_log(log, head, progress)
    # (A rebuild would drop the events the index places in a segment that is gone, as if
    # trimmed, and hand their ordinals out again: refused like damage.)
    problems += missing_segments(log, view, txn)
    if view.replaced_because is not None:
        # The commit that carries this fix replaced a damaged view (and rebuilt it).
        problems.insert(0, view_problem(view.replaced_because))
        view.replaced_because = None
    damaged = {p.segment for p in problems if p.segment.endswith((".seg", ".seg.zst"))}
    for base in bad_sidecars:
        if segment_name(base) in damaged or segment_name(base, compressed=True) in damaged:
            continue
        summary = summarize_segment(log.directory, base, log.ops)
        write_summary(log.directory, summary, log.ops, log.permissions)
    if damaged:
        return VerifyReport(len(log.bases()), frames, records, problems, fixed=False), False, []
    # Only derived data was wrong: rebuild the view from the (intact) log.
    before = {row.incarnation: row.last_ordinal for row in view.rows(txn)}
    view.clear(txn)
    view.put_store_id(txn, store_id)
    view.put_boot_id(txn, boot_id)
    missing: list[MissingEvents] = []
    project_log(log, view, txn, record_floor=True, missing=missing)
    if hole is not None:
        # The writer is placed at the log's end by the next commit's catch-up, not in
        # this one: a trim record written now would land where the cut-off frames ended
        # (it wrote over the segment). The next fix accepts these.
        problems += [_missing_problem(log, m, accepted=None) for m in missing]
        missing = []  # (the view refuses their reads as before)
    else:
        problems += [_missing_problem(log, m, accepted=True) for m in missing]
    if hole is not None:
        after = {row.incarnation: row.last_ordinal for row in view.rows(txn)}
        lost = {i: n - after.get(i, 0) for i, n in before.items() if n > after.get(i, 0)}
        problems.insert(
            0,
            VerifyProblem(
                hole.segment,
                hole.offset,
                f"committed frames from byte {hole.offset} to {hole.end_offset} were "
                f"cut off: the loss is accepted, {sum(lost.values())} event(s) of "
                f"{len(lost)} session(s) are dropped (sessions created there are gone)",
            ),
        )
    return VerifyReport(len(log.bases()), frames, records, problems, fixed=True), True, missing


def _missing_and_stale(live: Mapping[_K, object], fresh: Mapping[_K, object]) -> tuple[int, int]:
    """How many entries of a rebuilt table the live one lacks, and how many of its own
    the rebuilt one lacks or holds otherwise."""
    return len(fresh.keys() - live.keys()), sum(live.get(k) != fresh.get(k) for k in live)
