"""A review of "Events the log lacks" (SPEC 9): what a view with a recorded loss does
afterwards (checkpoints, windows, snapshots, readers in other processes, evictions)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_lost_segments import CURSORS, NO_WINDOWS, _store_missing_a_middle_segment

from journal import EventIn, InvalidArgument, Journal, JournalCorrupt, RetentionPolicy


def test_a_checkpoint_before_the_loss_does_not_make_verify_find_the_view_differs(
    tmp_path: Path,
) -> None:
    """After the rebuild the session starts at 1 again, so `checkpoint_session` accepts
    an ordinal before the loss; a rebuild (verify's) must then see the same row."""
    store, _after, first, last = _store_missing_a_middle_segment(tmp_path)
    with Journal.open(store, durability="os", retention=NO_WINDOWS) as j:
        with pytest.raises(InvalidArgument, match="could never be used"):
            j.checkpoint_session("s", first - 2, b"cp")
        j.checkpoint_session("s", last, b"cp")  # (after the loss: usable)
        problems = j.verify().problems
        assert [p for p in problems if "differs" in p.what] == [], problems
        assert len(problems) == 1 and "are missing from the log" in problems[0].what
    shutil.rmtree(store / "index")
    with Journal.open(store, durability="os", retention=NO_WINDOWS) as j:
        assert [p.what for p in j.verify().problems if "differs" in p.what] == []


def test_a_window_trim_past_the_loss_ends_the_refusals(tmp_path: Path) -> None:
    """A byte window trims past the lost run: the log now accounts for it (a rebuild finds
    nothing), and the live view, whose `lost:` key stays, serves reads from the start."""
    store, _after, _first, last = _store_missing_a_middle_segment(tmp_path)
    with Journal.open(store, durability="os", retention=NO_WINDOWS) as j:
        with pytest.raises(JournalCorrupt):
            list(j.replay("s"))
        j.change_retention_policy(lambda _: RetentionPolicy(max_history_bytes=4000))
        j.apply_retention()
        start = j.get_session("s").first_ordinal
        assert start > last + 1
        assert next(iter(j.replay("s"))).ordinal == start
        assert j.verify().ok
        j.compact(dead_share=0.0)
        assert j.verify().ok
    with Journal.open(store, readonly=True) as r:
        assert next(iter(r.replay("s"))).ordinal == start


def test_a_snapshot_past_the_loss_ends_the_refusals(tmp_path: Path) -> None:
    store, _after, _first, last = _store_missing_a_middle_segment(tmp_path)
    with Journal.open(store, durability="os", retention=NO_WINDOWS) as j:
        j.compact_session("s", last, b"snap")
        assert next(iter(j.replay("s"))).ordinal == last + 1
        assert j.verify().ok
        j.compact(dead_share=0.0)
        j.apply_retention()
        assert j.verify().ok


def test_a_long_lived_reader_serves_the_events_again_after_the_file_is_restored_and_fixed(
    tmp_path: Path,
) -> None:
    """A read-only journal opened while the file was lost builds a private view that
    records the loss; the file restored and the writer's verify --fix (which writes no
    frame when nothing is lost any more): does the reader serve them again?"""
    store, *_ = _store_missing_a_middle_segment(tmp_path)
    lost = next(p for p in (tmp_path / "kept").iterdir())
    with (
        Journal.open(store, durability="os", retention=NO_WINDOWS) as j,
        Journal.open(store, readonly=True) as reader,
    ):
        with pytest.raises(JournalCorrupt):
            list(reader.replay("s"))
        shutil.copy(lost, store / "segments" / lost.name)
        assert j.verify(fix=True).fixed
        assert [e.ordinal for e in j.replay("s")] == sorted(CURSORS)
        j.append("s", [EventIn("m", b"after")])
        got = [e.ordinal for e in reader.replay("s")]
        assert got[0] == 1 and len(got) == len(CURSORS) + 1


def test_the_refusal_does_not_tell_to_restore_the_segment_that_holds_the_frame_after(
    tmp_path: Path,
) -> None:
    store, after, first, last = _store_missing_a_middle_segment(tmp_path)
    with (
        Journal.open(store, durability="os", retention=NO_WINDOWS) as j,
        pytest.raises(JournalCorrupt) as raised,
    ):
        list(j.replay("s"))
    message = str(raised.value)
    assert raised.value.segment == after
    assert f"events {first} to {last} of session 's' are missing from the log" in message
    assert "restore the lost segment file (one before this one) from a backup" in message
    assert "restore the segment from a backup" not in message, message


def test_eviction_and_recreation_of_a_session_with_lost_events(tmp_path: Path) -> None:
    """The `lost:` key of the evicted incarnation refuses nothing of the new one; other
    sessions export while the lost one's export is refused."""
    store, *_ = _store_missing_a_middle_segment(tmp_path)
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)
    with Journal.open(store, durability="os", retention=NO_WINDOWS) as j:
        j.create_session("other")
        j.append("other", [EventIn("m", b"o")])
        with pytest.raises(JournalCorrupt):
            j.export_sessions(["s"], tmp_path / "s.jar")
        j.export_sessions(["other"], tmp_path / "o.jar")
        j.resolve_session("s")
        j.change_retention_policy(lambda _: policy)
        assert j.apply_retention(now_ms=2**50).evicted_sessions == ["s"]
        j.append("s", [EventIn("m", b"new")], create=True)
        assert [e.data for e in j.replay("s")] == [b"new"]
        assert j.verify().ok
    shutil.rmtree(store / "index")
    with Journal.open(store, durability="os") as j:
        assert j.verify().ok
        assert [e.data for e in j.replay("s")] == [b"new"]


def test_a_reader_serves_the_events_of_a_file_restored_before_its_first_read(
    tmp_path: Path,
) -> None:
    """The reader's first refresh came after the restore: the file was in the listing it
    took for the one before (a review), and the reader refused the events until it
    reopened."""
    store, *_ = _store_missing_a_middle_segment(tmp_path)
    lost = next(p for p in (tmp_path / "kept").iterdir())
    with (
        Journal.open(store, durability="os", retention=NO_WINDOWS) as j,
        Journal.open(store, readonly=True) as reader,
    ):
        shutil.copy(lost, store / "segments" / lost.name)
        assert j.verify(fix=True).fixed
        got = [e.ordinal for e in reader.replay("s")]
        assert got[0] == 1 and len(got) == len(CURSORS)


def test_a_reader_that_saw_a_restored_file_half_copied_serves_the_events_once_it_is_whole(
    tmp_path: Path,
) -> None:
    """A refresh during the copy rebuilt from a file cut short, which failed: the file was
    then taken as seen, and the reader refused the events until it reopened (a review).
    The view is kept meanwhile (the lost events refused as before, the rest served)."""
    store, *_ = _store_missing_a_middle_segment(tmp_path)
    lost = next(p for p in (tmp_path / "kept").iterdir())
    with Journal.open(store, readonly=True) as reader:
        with pytest.raises(JournalCorrupt):
            list(reader.replay("s"))
        whole = lost.read_bytes()
        target = store / "segments" / lost.name
        target.write_bytes(whole[: len(whole) // 2])  # (a copy caught halfway)
        with pytest.raises(JournalCorrupt, match="are missing from the log"):
            list(reader.replay("s"))
        assert reader.get_session("s").last_ordinal == max(CURSORS)
        target.write_bytes(whole)
        got = [e.ordinal for e in reader.replay("s")]
        assert got[0] == 1 and len(got) == len(CURSORS)
