"""A sealed segment file lost while no view remembers it (SPEC 9, "Events the log lacks").

After a reboot the writer discards its view (it is not synced) and rebuilds it from the
log; so does a read-only journal's private view, and an operator who deletes `index/`. A
rebuild cannot tell a lost segment from history that retention or compaction removed by
position alone, but the log records every removal of a live session's events (a trim or
snapshot record, pinned while it matters). Until 2026-12-05 a rebuild took a lost
segment's events for trimmed history: a read from the start began after them, without a
word, and `verify` passed (the events before the lost ones, still in the log, were hidden
too). Now the rebuild logs it, `verify` reports it, and `verify(fix=True)` accepts the
loss by recording the trim.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from journal import EventIn, Journal, JournalCorrupt, RetentionPolicy
from journal._local.files import FAULT_POINTS, FileOps

SEGMENT_BYTES = 16 << 10
NO_WINDOWS = RetentionPolicy(max_history_bytes=None)


def _sealed(store: Path) -> list[Path]:
    return sorted(p for p in (store / "segments").iterdir() if p.name.endswith(".seg"))


# Cursors of every event of the store `_store_missing_a_middle_segment` made last.
CURSORS: dict[int, str] = {}


def _one_session_over_segments(store: Path) -> Journal:
    """`store` opened with one session "s" of 80 events over several small segments."""
    j = Journal.open(store, durability="os", segment_bytes=SEGMENT_BYTES, retention=NO_WINDOWS)
    j.create_session("s")
    for _ in range(80):
        j.append("s", [EventIn("m", b"x" * 700)])
    return j


def _store_missing_a_middle_segment(tmp_path: Path) -> tuple[Path, str, int, int]:
    """A store of one session over several segments whose second segment file is gone
    and whose view is gone too (a reboot discards it). Returns the store, the name of the
    segment after the lost one, and the first and last ordinals lost (`CURSORS`: the
    cursors saved before)."""
    store = tmp_path / "store"
    with _one_session_over_segments(store) as j:
        CURSORS.clear()
        CURSORS.update((e.ordinal, e.cursor) for e in j.replay("s"))
    sealed = _sealed(store)
    assert len(sealed) >= 3
    lost, after = sealed[1], sealed[2]
    first_lost = int(lost.name.split(".")[0])  # (one session: its ordinals are positions - 1)
    last_lost = int(after.name.split(".")[0]) - 1
    (tmp_path / "kept").mkdir()
    shutil.copy(lost, tmp_path / "kept" / lost.name)
    lost.unlink()
    (store / "segments" / lost.name.replace(".seg", ".idx")).unlink(missing_ok=True)
    shutil.rmtree(store / "index")
    return store, after.name, first_lost - 1, last_lost - 1


def test_a_rebuild_logs_events_a_lost_segment_held_and_verify_reports_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, after, first, last = _store_missing_a_middle_segment(tmp_path)
    with (
        caplog.at_level(logging.ERROR, logger="journal"),
        Journal.open(store, durability="os", retention=NO_WINDOWS) as j,
    ):
        report = j.verify()
        # A read that would pass over the lost events is refused: from the start, from
        # before them (events the log still holds), or from one of them...
        for cursor in (None, CURSORS[5], CURSORS[first - 1], CURSORS[last]):
            with pytest.raises(JournalCorrupt, match=f"events {first} to {last} of session"):
                list(j.replay("s", cursor))
        with pytest.raises(JournalCorrupt) as raised:
            j.fold("s", lambda state, event: state + 1, 0)
        assert raised.value.segment == after
        # ... a reader that had them goes on (its cursor is past them).
        assert next(e.ordinal for e in j.replay("s", CURSORS[last + 1])) == last + 2
        # (The retained range starts where the log says: not after the loss.)
        assert j.get_session("s").first_ordinal == 1
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(
        f"events {first} to {last} of session 's' are missing from the log" in m
        and f"reads of the session from before event {last + 1} raise JournalCorrupt" in m
        and "journal verify --fix" in m
        for m in logged
    ), logged
    assert not report.ok
    [problem] = report.problems
    assert problem.segment == after
    assert f"events {first} to {last} of session 's' are missing" in problem.what
    assert "restore the segment file from a backup and run verify --fix" in problem.what


def test_the_file_restored_and_a_fix_bring_the_events_back(tmp_path: Path) -> None:
    store, _after, first, last = _store_missing_a_middle_segment(tmp_path)
    lost = next(n for n in os.listdir(tmp_path / "kept") if n.endswith(".seg"))
    with Journal.open(store, durability="os", retention=NO_WINDOWS) as j:
        with pytest.raises(JournalCorrupt):
            list(j.replay("s"))
        shutil.copy(tmp_path / "kept" / lost, store / "segments" / lost)
        with pytest.raises(JournalCorrupt):  # (the view still lacks them)
            list(j.replay("s"))
        assert not j.verify().ok  # (the view differs from the log now)
        assert j.verify(fix=True).fixed
        assert [e.ordinal for e in j.replay("s")] == sorted(CURSORS)
        assert j.verify().ok
    assert first < last


def test_a_read_only_journal_reports_them_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, after, first, last = _store_missing_a_middle_segment(tmp_path)
    with (
        caplog.at_level(logging.ERROR, logger="journal"),
        Journal.open(store, readonly=True) as reader,  # (no view: a private one)
    ):
        report = reader.verify()
        with pytest.raises(JournalCorrupt, match=f"events {first} to {last} of session"):
            list(reader.replay("s"))
    assert [p.segment for p in report.problems] == [after]
    assert any(
        f"events {first} to {last} of session 's' are missing" in r.getMessage()
        for r in caplog.records
    )


def test_verify_fix_accepts_the_loss_with_a_trim_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, after, _first, last = _store_missing_a_middle_segment(tmp_path)
    with Journal.open(store, durability="os", retention=NO_WINDOWS) as j:
        fixed = j.verify(fix=True)
        assert fixed.fixed
        [problem] = fixed.problems
        assert problem.segment == after
        assert f"the loss is accepted (a trim record now starts the session at {last + 1})" in (
            problem.what
        )
        assert j.verify().ok
        assert j.get_session("s").first_ordinal == last + 1
        assert next(iter(j.replay("s"))).ordinal == last + 1  # (read again)
        j.append("s", [EventIn("m", b"after the fix")])
    shutil.rmtree(store / "index")  # (a later rebuild finds the loss accounted for)
    caplog.clear()
    with (
        caplog.at_level(logging.ERROR, logger="journal"),
        Journal.open(store, durability="os", retention=NO_WINDOWS) as j,
    ):
        assert j.verify().ok
        events = list(j.replay("s"))
    assert events[0].ordinal == last + 1
    assert events[-1].data == b"after the fix"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_history_retention_and_compaction_removed_is_not_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Gaps the log accounts for: a window trim whose dead segments retention deleted
    while an older segment stays (another session's live events keep it), a snapshot
    whose history compaction dropped, and an evicted session's leftovers."""
    store = tmp_path / "store"
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)
    with Journal.open(store, durability="os", segment_bytes=SEGMENT_BYTES, retention=policy) as j:
        j.create_session("keeper")
        j.create_session("trimmed", max_history_bytes=4000)
        j.create_session("folded")
        j.create_session("gone")
        j.append("keeper", [EventIn("m", b"k" * 100)])
        for i in range(60):
            j.append("trimmed", [EventIn("m", b"t" * 700)])
            j.append("folded", [EventIn("m", b"f" * 200)])
            if i < 5:
                j.append("gone", [EventIn("m", b"g" * 200)])
        j.resolve_session("gone")
        j.compact_session("folded", 50, b"snapshot")
        j.apply_retention()
        j.compact(dead_share=0.0)
        j.apply_retention()
        expected = {s: [e.ordinal for e in j.replay(s)] for s in ("keeper", "trimmed", "folded")}
        assert expected["trimmed"][0] > 2  # (trimmed: a gap a rebuild meets)
        assert expected["folded"][0] == 51
        assert j.verify().ok
    bases = [int(p.name.split(".")[0]) for p in (store / "segments").iterdir() if ".seg" in p.name]
    assert min(bases) == 1 and len(bases) >= 2  # (the keeper's kept the first one)
    shutil.rmtree(store / "index")
    with caplog.at_level(logging.ERROR, logger="journal"):
        with Journal.open(store, durability="os", retention=policy) as j:
            assert j.verify().ok
            assert {s: [e.ordinal for e in j.replay(s)] for s in expected} == expected
        with Journal.open(store, readonly=True) as reader:
            assert reader.verify().ok
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("how", ["retention", "compact", "swap"])
def test_a_power_cut_after_retention_with_os_durability_reports_nothing_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """With durability "os" a commit is not synced: a trim record that made segments dead
    must be on disk before retention deletes them (or compaction drops their frames), or
    a power cut leaves the log without the events and without the record that removed
    them, which a rebuild then reports as a lost segment file."""
    import random

    from _disk import SimulatedDisk

    store = tmp_path / "store"
    store.mkdir()
    disk = SimulatedDisk(str(store), random.Random(0))
    window = RetentionPolicy(max_history_bytes=4000)
    j = Journal.open(
        store, durability="os", segment_bytes=8192, file_ops=disk, retention=NO_WINDOWS
    )
    try:
        j.create_session("a")
        # ("swap": another session's live events in every segment: compaction drops
        # the frames of "a", retention deletes no segment.)
        j.create_session("b", max_history_bytes=1 << 30)
        for _ in range(60):
            j.append("a", [EventIn("m", b"x" * 500)])
            if how == "swap":
                j.append("b", [EventIn("m", b"y" * 100)])
        j.close()  # (closing syncs nothing more than a commit does, but the seals did)
        j = Journal.open(store, durability="os", segment_bytes=8192, file_ops=disk)
        disk.settle()  # (everything so far is on disk)
        j.change_retention_policy(lambda _: window)
        if how == "retention":
            assert j.apply_retention().deleted_segments
        else:
            compacted = j.compact(dead_share=0.0)
            assert compacted.segments_rewritten
            assert bool(compacted.segments_deleted) is (how == "compact")
        first = j.get_session("a").first_ordinal
        assert first > 2
    finally:
        j.close()
    disk.power_cut()
    with (
        caplog.at_level(logging.ERROR, logger="journal"),
        Journal.open(store, durability="os") as j,
    ):
        report = j.verify()
        assert next(e.ordinal for e in j.replay("a")) == first
    assert report.ok, report.problems
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_fix_that_accepts_a_hole_leaves_the_missing_events_to_the_next_fix(
    tmp_path: Path,
) -> None:
    """A fix that accepts cut-off frames (SPEC 9, "Accepting a hole") rebuilds the view,
    but its commit's writer is still where the cut frames ended: a trim record written
    by it went over the segment (`bad frame magic` at the next read), so the next fix
    accepts the lost segment's events."""
    store, _after, first, last = _store_missing_a_middle_segment(tmp_path)
    with Journal.open(store, durability="os", retention=NO_WINDOWS) as j:  # (rebuilt)
        for i in range(3):
            j.append("s", [EventIn("m", b"tail %d" % i)])
    active = sorted((store / "segments").glob("*.seg"))[-1]
    end = len(active.read_bytes().rstrip(b"\0"))
    with open(active, "r+b") as f:
        f.truncate(end - 10)  # (the last frame cut short: a hole)
    with Journal.open(store, durability="os", retention=NO_WINDOWS) as j:
        fixed = j.verify(fix=True)
        assert fixed.fixed
        assert "were cut off: the loss is accepted" in fixed.problems[0].what
        assert f"events {first} to {last} of session 's' are missing" in fixed.problems[1].what
        assert "verify --fix again" in fixed.problems[1].what
        [problem] = j.verify().problems  # (the missing events only: no damage)
        assert f"events {first} to {last}" in problem.what
        j.append("s", [EventIn("m", b"after")])
        with pytest.raises(JournalCorrupt):  # (not accepted yet)
            list(j.replay("s"))
        assert [e.data for e in j.replay("s", CURSORS[last + 1])][-3:] == [
            b"tail 0",
            b"tail 1",
            b"after",
        ]
        again = j.verify(fix=True)
        assert "the loss is accepted (a trim record" in again.problems[0].what
        assert j.verify().ok
    shutil.rmtree(store / "index")
    with Journal.open(store, durability="os", retention=NO_WINDOWS) as j:
        assert j.verify().ok
        assert [e.data for e in j.replay("s")][-1] == b"after"


# A read-only journal that cannot use the writer's view builds a private one, holding no
# lock on the segment files: it lists them, then reads them. Between the two, the writer
# may rotate, record a snapshot in the new active segment, and compact an older sealed
# segment in place (the same file name, `.seg.zst`, now without the frames that became
# dead). A build that read the new file and not the record looked at a lost segment and
# logged a false alarm on a healthy store (a review; fixed by f5fbdfb: the build is
# tried again while the files change, and only a settled build's findings are logged).


def _bases(store: Path) -> list[int]:
    names = (p.name for p in (store / "segments").iterdir())
    return sorted({int(n.split(".")[0]) for n in names if n.endswith((".seg", ".seg.zst"))})


class _OnFirstSegment(FileOps):
    """Runs `step` once, when a projection opens its first segment after listing them
    (the fault point "projection.segment"); `opened`: the bases opened since."""

    def __init__(self, step: Callable[[int], None]) -> None:
        self.step: Callable[[int], None] | None = step
        self.opened: list[int] = []

    def point(self, name: str, detail: object = None) -> None:
        assert name in FAULT_POINTS, name
        if name != "projection.segment":
            return
        assert isinstance(detail, int)
        self.opened.append(detail)
        step, self.step = self.step, None
        if step is not None:
            step(detail)


def test_a_read_only_build_does_not_take_a_segment_compacted_after_its_listing_for_a_lost_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    segments = store / "segments"
    with Journal.open(
        store, durability="os", segment_bytes=SEGMENT_BYTES, retention=NO_WINDOWS
    ) as writer:
        writer.create_session("s")
        while len(_bases(store)) < 2:  # (segment A sealed, B active)
            writer.append("s", [EventIn("m", b"x" * 700)])
        a, b = _bases(store)
        in_a = b - 2  # (the last ordinal in A: one session, its ordinals are positions - 1)
        writer.compact()  # (A compressed: A.seg.zst)
        packed = segments / f"{a:020d}.seg.zst"
        before = packed.stat().st_ino
        for _ in range(3):
            writer.append("s", [EventIn("m", b"y" * 700)])  # (in B)
        # A without its sidecar (a swap whose sidecar write failed: "readers scan, the
        # next catch-up writes it"): the build reads A's file rather than its summary.
        # (With the sidecar, the window is between the listing and the sidecar's read,
        # where no fault point is: the first segment the build opens is then B.)
        (segments / f"{a:020d}.idx").unlink()

        def rotate_snapshot_and_compact(base: int) -> None:
            assert base == a and _bases(store) == [a, b]
            while len(_bases(store)) < 3:  # (B sealed, C active)
                writer.append("s", [EventIn("m", b"z" * 700)])
            # The snapshot record goes into C; most of A dies (some events stay live).
            writer.compact_session("s", in_a - 3, b"snapshot")
            writer.compact()
            assert packed.stat().st_ino != before  # (A swapped in place: the same name)
            assert _bases(store)[:2] == [a, b]

        ops = _OnFirstSegment(rotate_snapshot_and_compact)
        with (
            caplog.at_level(logging.ERROR, logger="journal"),
            Journal.open(store, readonly=True, file_ops=ops) as reader,
        ):
            assert ops.step is None  # (the writer's steps ran, once, during the build)
            expected = [(e.ordinal, e.data) for e in writer.replay("s")]
            assert expected[0][0] == in_a - 2
            got = [(e.ordinal, e.data) for e in reader.replay("s")]
            report = writer.verify()
        assert report.ok, report.problems
        logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert not [m for m in logged if "are missing from the log" in m], logged
        assert got == expected  # (before the fix too: the open's refresh read C's record)


def test_a_read_through_a_view_that_places_events_in_a_lost_file_says_what_verify_says(
    tmp_path: Path,
) -> None:
    # A sealed segment deleted by hand while `index/` stays: the view still places the
    # session's events in it. The read said "corrupt journal view (index/): the events
    # index of session 's' points at ...seg.zst, which does not exist; ... `journal verify
    # --fix` rebuilds it, and so does the next writable open", a file name the store never
    # had and two ways out that do neither (verify --fix keeps the view, so as not to drop
    # the events as trimmed; a writer's open keeps it too): a trial of the README's
    # restore paragraph. It names the segment and the ways out as `verify` does.
    store = tmp_path / "store"
    _one_session_over_segments(store).close()
    lost = _sealed(store)[1]
    lost.unlink()
    (store / "segments" / lost.name.replace(".seg", ".idx")).unlink(missing_ok=True)
    for readonly in (False, True):
        with Journal.open(store, readonly=readonly, retention=None) as j:
            with pytest.raises(JournalCorrupt) as raised:
                list(j.replay("s"))
            [problem] = j.verify().problems
            assert problem.segment == lost.name
            assert raised.value.segment == lost.name, raised.value
            assert "missing: the index places" in str(raised.value)
            assert "session 's'" in str(raised.value)
            assert "deleting index/ rebuilds it without them" in str(raised.value)
            assert "verify --fix` (Journal.verify(fix=True)) rebuilds it" not in str(raised.value)
