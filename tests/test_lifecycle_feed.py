"""The lifecycle feed is pruned with the records it came from (SPEC 7.7): when retention
deletes a segment or compaction drops a frame, their feed entries go, and a lifecycle
cursor from before them fails with `CursorExpired` (with a `resume_cursor` that accepts
the gap) instead of resuming past changes it never saw. A view rebuilt from a log that
lost records makes the cursors from before them expire the same way."""

from __future__ import annotations

import base64
import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _nats import stream_messages
from _view_entries import entry_counts, feed_positions
from _waiting import first_of
from engines import EngineFactory, JetStreamEngineFactory

from journal import (
    CursorExpired,
    EventIn,
    Journal,
    LifecycleEvent,
    LifecycleEventType,
    RetentionPolicy,
)
from journal._local.files import FileOps

SMALL_SEGMENTS = 4096
# Ended sessions are evicted an hour after they end: only by the passes the tests run
# with a clock two hours ahead (`evict_all`), never by the automatic ones meanwhile.
EVICT_LATER = RetentionPolicy(max_history_bytes=None, session_retention_ms=3_600_000)


def open_store(path: Path, **options: Any) -> Journal:
    if not options.get("readonly"):  # (a reader takes the policy the store records)
        options.setdefault("retention", EVICT_LATER)
    return Journal.open(path, durability="os", segment_bytes=SMALL_SEGMENTS, **options)


def next_of(feed: Iterator[LifecycleEvent], timeout: float = 10.0) -> LifecycleEvent:
    event = first_of(feed, timeout)
    assert isinstance(event, LifecycleEvent)
    return event


def anchor_cursor(j: Journal) -> str:
    """A lifecycle cursor at the store's head now (from a startup snapshot's last event:
    the others resume with a fresh snapshot)."""
    sessions = max(1, len(list(j.list_sessions())))
    with j.watch_sessions(stop=threading.Event()) as feed:
        return [next_of(feed) for _ in range(sessions)][-1].cursor


def live_and_ended(j: Journal, prefix: str, count: int) -> None:
    """Sessions created, given an event and resolved: each leaves CREATED and RESOLVED
    feed entries, and is evicted by `evict_all`."""
    for i in range(count):
        session = f"{prefix}{i}"
        j.create_session(session)
        j.append(session, [EventIn("m", b"x" * 200)])
        j.resolve_session(session)


def evict_all(j: Journal) -> list[str]:
    return j.apply_retention(now_ms=time.time_ns() // 1_000_000 + 7_200_000).evicted_sessions


def test_retention_prunes_the_feed_entries_of_deleted_segments(store: Path) -> None:
    with open_store(store) as j:
        j.create_session("anchor")  # stays open: its segment stays
        before = anchor_cursor(j)
        live_and_ended(j, "s", 60)
        evicted = evict_all(j)
        assert len(evicted) == 60
        deleted = j.apply_retention().deleted_segments  # (the pass above deleted them)
        assert deleted == []
        after = anchor_cursor(j)
        # The old cursor would miss CREATED and RESOLVED entries of deleted segments.
        with pytest.raises(CursorExpired) as info:
            j.watch_sessions(cursor=before)
        expired = info.value
        assert expired.code == "CURSOR_EXPIRED"
        assert expired.earliest_ordinal > 1
        assert "without a cursor" in str(expired)
        # Its resume cursor accepts the gap: what is still kept follows, in order.
        assert expired.resume_cursor is not None
        stop = threading.Event()
        resumed = j.watch_sessions(cursor=expired.resume_cursor, stop=stop)
        first = next_of(resumed)
        assert first.event_type in (LifecycleEventType.EVICTED, LifecycleEventType.RESOLVED)
        stop.set()
        # A cursor taken after the pruning resumes with no gap.
        j.create_session("late")
        with j.watch_sessions(cursor=after, stop=threading.Event()) as feed:
            late = next_of(feed)
        assert (late.event_type, late.session.session_id) == (LifecycleEventType.CREATED, "late")
    positions = feed_positions(store)
    # What is left is the anchor's CREATED and what the newest segments hold; without
    # pruning, 60 x 3 entries (CREATED, RESOLVED, EVICTED) plus the anchor's stay.
    assert len(positions) < 60 * 3 + 2 - 40, len(positions)


def _position(cursor: str) -> int:
    """The position a lifecycle cursor carries, read by its documented layout (SPEC 5):
    version 1 a u64 at byte 12, version 2 a u48 there."""
    raw = base64.urlsafe_b64decode(cursor + "=")
    width = 8 if raw[0] == 1 else 6
    return int.from_bytes(raw[12 : 12 + width], "big")


def test_a_cursor_just_below_the_feed_floor_is_expired_and_one_at_it_is_not(
    store: Path,
) -> None:
    # The boundary of the feed's CursorExpired: a follower after `floor - 1` would miss
    # the pruned entry at `floor`; one after `floor` misses nothing.
    with open_store(store) as j:
        j.create_session("anchor")
        before = anchor_cursor(j)
        for i in range(150):  # no events: every record is a feed entry, so floor - 1 is one
            j.create_session(f"s{i}")
            j.resolve_session(f"s{i}")
        with j.watch_sessions(cursor=before, stop=threading.Event()) as feed:
            changes = [next_of(feed) for _ in range(300)]
        cursors = {_position(change.cursor): change.cursor for change in changes}
        assert len(evict_all(j)) == 150
        with pytest.raises(CursorExpired) as info:
            j.watch_sessions(cursor=before)
        floor = info.value.earliest_ordinal - 1
        assert floor - 1 in cursors and floor in cursors, (floor, min(cursors), max(cursors))
        with pytest.raises(CursorExpired) as below:
            j.watch_sessions(cursor=cursors[floor - 1])
        assert below.value.earliest_ordinal == floor + 1
        j.watch_sessions(cursor=cursors[floor]).close()  # nothing missed: no error
        # (A rebuild lacks transitions pruned below the floor: an EVICTED entry after it
        # carries a row a rebuild cannot know, which verify does not compare.)
        assert j.verify().ok, j.verify().problems


def _feed_size(engine: EngineFactory, store: Path) -> int:
    """How many feed entries a closed store holds: its view's on the local engine, its
    stream's `lc.*` messages on JetStream."""
    if isinstance(engine, JetStreamEngineFactory):
        return stream_messages(engine.url(), engine.store_name(store), "lc.*")
    return len(feed_positions(store))


def test_the_feed_stays_bounded_over_many_session_lifetimes(
    engine: EngineFactory, store: Path
) -> None:
    def reopen() -> Journal:
        options = {"durability": "os", "segment_bytes": SMALL_SEGMENTS}
        return engine.open(store, retention=EVICT_LATER, **options)

    sizes = []
    j = reopen()
    for round_ in range(6):
        live_and_ended(j, f"r{round_}-", 40)
        # (A day and two hours ahead: JetStream prunes an eviction a day after it.)
        j.apply_retention(now_ms=time.time_ns() // 1_000_000 + 26 * 3_600_000)
        j.close()
        sizes.append(_feed_size(engine, store))
        j = reopen()
    j.close()
    # Each round adds 120 entries; pruning keeps the count from growing with the rounds.
    assert max(sizes[2:]) <= max(sizes[:2]) + 40, sizes


def test_the_feed_of_a_live_session_stays_bounded_over_many_suspensions(
    engine: EngineFactory, store: Path
) -> None:
    """A session that never ends adds a feed entry with each suspension and resumption:
    the entries its later changes superseded go (with their records on the local engine,
    a day after on JetStream), and a cursor from before them expires."""

    def reopen() -> Journal:
        options = {"durability": "os", "segment_bytes": SMALL_SEGMENTS}
        return engine.open(store, retention=EVICT_LATER, **options)

    sizes = []
    j = reopen()
    j.create_session("live")
    before = anchor_cursor(j)
    for _ in range(8):
        for _ in range(40):
            j.suspend_session("live")
            j.resume_session("live")
        # (A day and two hours ahead: JetStream prunes an entry a day after the change
        # that superseded it.)
        j.apply_retention(now_ms=time.time_ns() // 1_000_000 + 26 * 3_600_000)
        j.close()
        sizes.append(_feed_size(engine, store))
        j = reopen()
    with j:
        # Each round adds 80 entries (640 in all); the local engine keeps those of its
        # active segment (a sawtooth of 80 to 210), JetStream the CREATED entry and the
        # newest.
        assert max(sizes) <= 3 * 80, sizes
        with pytest.raises(CursorExpired):
            j.watch_sessions(cursor=before)


def test_a_watcher_that_falls_behind_pruning_gets_cursor_expired(
    engine: EngineFactory, store: Path
) -> None:
    options = {"durability": "os", "segment_bytes": SMALL_SEGMENTS}
    with engine.open(store, retention=EVICT_LATER, **options) as j:
        j.create_session("anchor")
        before = anchor_cursor(j)
        live_and_ended(j, "s", 150)  # 300 entries: more than one read of the feed (256)
        stop = threading.Event()
        feed = j.watch_sessions(cursor=before, stop=stop)
        first = next_of(feed)
        assert (first.event_type, first.session.session_id) == (LifecycleEventType.CREATED, "s0")
        # (A day and two hours ahead: JetStream prunes an eviction a day after it.)
        j.apply_retention(now_ms=time.time_ns() // 1_000_000 + 26 * 3_600_000)
        delivered = [first]
        with pytest.raises(CursorExpired) as info:
            while True:
                delivered.append(next_of(feed))
        stop.set()
        # Everything delivered before the error came in order, with no gap.
        expected = [
            (kind, f"s{i}")
            for i in range(128)
            for kind in (LifecycleEventType.CREATED, LifecycleEventType.RESOLVED)
        ]
        assert [(e.event_type, e.session.session_id) for e in delivered] == expected
        assert info.value.resume_cursor is not None


def test_compaction_prunes_the_feed_entries_of_dropped_frames(store: Path) -> None:
    with open_store(store) as j:
        # Evicted sessions share segments with a long-lived one: the segments stay, and
        # compaction drops the dead frames (and their feed entries) from them.
        j.create_session("keep")
        before = anchor_cursor(j)
        for i in range(40):
            j.append("keep", [EventIn("m", b"k" * 300)])
            session = f"s{i}"
            j.create_session(session)
            j.append(session, [EventIn("m", b"x" * 300)])
            j.resolve_session(session)
        evict_all(j)
        with j.watch_sessions(cursor=before, stop=threading.Event()) as feed:
            assert next_of(feed).event_type is LifecycleEventType.CREATED  # nothing pruned yet
        report = j.compact(dead_share=0.0)
        assert report.segments_rewritten
        with pytest.raises(CursorExpired):
            j.watch_sessions(cursor=before)
        j.close()
        kept = feed_positions(store)
        assert len(kept) < 40 * 3, len(kept)


def test_a_rebuilt_view_expires_cursors_from_before_records_the_log_lost(store: Path) -> None:
    with open_store(store) as j:
        j.create_session("anchor")
        before = anchor_cursor(j)
        live_and_ended(j, "s", 60)
        evict_all(j)
        pruned_floor = _floor(j, before)
    shutil.rmtree(store / "index")  # rebuilt from the log at the next open
    with open_store(store) as j:
        with pytest.raises(CursorExpired) as info:
            j.watch_sessions(cursor=before)
        assert info.value.earliest_ordinal >= pruned_floor


def test_a_rebuilt_view_of_a_log_that_lost_nothing_keeps_every_cursor(store: Path) -> None:
    with open_store(store, retention=RetentionPolicy(max_history_bytes=None)) as j:
        j.create_session("anchor")
        before = anchor_cursor(j)
        live_and_ended(j, "s", 30)  # several segments, nothing deleted
    shutil.rmtree(store / "index")
    with open_store(store) as j, j.watch_sessions(cursor=before, stop=threading.Event()) as feed:
        first = next_of(feed)
    assert (first.event_type, first.session.session_id) == (LifecycleEventType.CREATED, "s0")


def _floor(j: Journal, cursor: str) -> int:
    with pytest.raises(CursorExpired) as info:
        j.watch_sessions(cursor=cursor)
    return info.value.earliest_ordinal


def test_a_rebuild_after_deletions_without_pruned_changes_keeps_every_cursor(
    store: Path,
) -> None:
    # Segments deleted by a byte window held no lifecycle change: the floor stays 0, and
    # a view rebuilt (after a reboot, or `index/` deleted) knows it from the log's
    # `feed-floor` file instead of judging every lost record a lifecycle one.
    window = RetentionPolicy(max_history_bytes=2000)
    with open_store(store, retention=window) as j:
        j.create_session("s")
        cursor = anchor_cursor(j)
        for _ in range(60):
            j.append("s", [EventIn("m", b"x" * 300)])
        assert j.get_session("s").first_ordinal > 1  # segments were deleted
    shutil.rmtree(store / "index")
    with open_store(store, retention=window) as j:
        j.create_session("after")
        with j.watch_sessions(cursor=cursor, stop=threading.Event()) as feed:
            first = next_of(feed)
    assert (first.event_type, first.session.session_id) == (LifecycleEventType.CREATED, "after")


def test_a_store_without_a_recorded_floor_is_judged_from_what_its_log_lost(
    store: Path,
) -> None:
    # A store from before the floor was recorded (no `segments/feed-floor`): a rebuild
    # takes the highest position the log lacks, and records it.
    with open_store(store) as j:
        j.create_session("anchor")
        before = anchor_cursor(j)
        live_and_ended(j, "s", 60)
        evict_all(j)
    (store / "segments" / "feed-floor").unlink()
    shutil.rmtree(store / "index")
    with open_store(store) as j, pytest.raises(CursorExpired):
        j.watch_sessions(cursor=before)
    assert (store / "segments" / "feed-floor").exists()


def test_a_read_only_private_view_expires_cursors_of_changes_pruned_past_its_head(
    store: Path,
) -> None:
    # A reader that cannot use the store's view builds a private one and refreshes it
    # from the log: segments deleted since, past its head, are steps over a gap there.
    with open_store(store) as writer:
        writer.create_session("anchor")
    shutil.rmtree(store / "index")  # (the reader cannot make the shared view: private)
    with open_store(store, readonly=True) as reader:
        before = anchor_cursor(reader)
        with open_store(store) as writer:
            live_and_ended(writer, "s", 60)
            evict_all(writer)
            with pytest.raises(CursorExpired) as by_writer:
                writer.watch_sessions(cursor=before)
        with pytest.raises(CursorExpired) as by_reader:
            reader.watch_sessions(cursor=before)
        assert by_reader.value.earliest_ordinal == by_writer.value.earliest_ordinal


@contextlib.contextmanager
def private_reader(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Journal, Path]]:
    """A read-only journal of `store` (created, with one session) reading through a
    private view, and that view's directory."""
    with open_store(store) as writer:
        writer.create_session("anchor")
    shutil.rmtree(store / "index")  # (the reader cannot make the shared view: private)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the private view goes
    with open_store(store, readonly=True) as reader:
        (private,) = scratch.glob("journal-readonly-*")
        yield reader, private


def test_a_read_only_private_view_drops_the_entries_the_writer_pruned(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long-lived reader's private view must not keep every change ever made: what the
    # writer pruned goes from it too when it catches up.
    with private_reader(store, tmp_path, monkeypatch) as (reader, private):
        rounds = 4
        with open_store(store) as writer:
            for round_ in range(rounds):
                live_and_ended(writer, f"r{round_}-", 40)
                anchor_cursor(reader)  # (the reader catches up: it has their entries)
                evict_all(writer)
            writer.create_session("late")  # (a frame after the pruning)
        anchor_cursor(reader)
        # (Entries at or below the floor are never read: verify compares the feed after
        # it, where the private view holds what a rebuild does.)
        assert reader.verify().ok, reader.verify().problems
        shutil.copytree(private, tmp_path / "copy")  # (read below, the reader idle)
    in_private = feed_positions(tmp_path, "copy")
    in_writer = feed_positions(store)
    # Each round made 120 changes; the writer pruned most, and so did the reader.
    assert len(in_writer) < rounds * 120 // 2, len(in_writer)
    assert set(in_private) <= set(in_writer), sorted(set(in_private) - set(in_writer))


def test_a_read_only_private_view_forgets_the_tombstones_the_writer_forgot(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An evicted session leaves a tombstone (with its incarnation's id and the pin of its
    # eviction record) until its creation record leaves the log; the writer then forgets
    # them. A long-lived reader's private view kept every one ever made (found by a soak:
    # 27,000 of each after 75 s of session churn beside the writer's 700, its data.mdb
    # growing by 3 MB a minute), so its file and memory grew without bound.
    with private_reader(store, tmp_path, monkeypatch) as (reader, private):
        rounds = 6
        with open_store(store) as writer:
            for round_ in range(rounds):
                live_and_ended(writer, f"r{round_}-", 40)
                anchor_cursor(reader)  # (the reader catches up: it has their creations)
                evict_all(writer)
                anchor_cursor(reader)  # (their evictions, and the segments deleted)
            live_and_ended(writer, "late-", 40)  # (frames after the last deletion)
            evict_all(writer)
        anchor_cursor(reader)
        shutil.copytree(private, tmp_path / "copy")  # (read below, the reader idle)
    in_private = entry_counts(tmp_path, "copy")
    in_writer = entry_counts(store)
    # 280 sessions were evicted; the writer forgot most of their tombstones, and so must
    # the reader (it looked when the last pass deleted segments).
    assert in_writer["tombstones"] < 280 // 2, in_writer
    assert in_private == in_writer


def test_verify_of_a_private_view_beside_a_writers_expiry_thread_is_ok(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A private view forgets tombstones (and prunes the feed) when it projects new frames;
    # the expiry thread's compactions after evictions and the pass after them write none,
    # and run while verify does. verify() catches the view up at the start of each of its
    # runs, under its retries: before, it caught up once before them, and a pass that
    # deleted a segment afterwards made it compare a view of the old files with a rebuild
    # of the new ones ("tombstones table differs from the log (32 entries, a rebuilt view
    # has 9)", 4 runs of 6).
    with private_reader(store, tmp_path, monkeypatch) as (reader, _), open_store(store) as writer:
        for round_ in range(4):
            live_and_ended(writer, f"r{round_}-", 40)
            anchor_cursor(reader)
            evict_all(writer)
            anchor_cursor(reader)
            assert reader.verify().ok, (round_, reader.verify().problems)
        writer.compact(0.0)
        assert reader.verify().ok, reader.verify().problems


def test_verify_of_a_private_view_whose_catch_up_met_a_retention_pass_is_ok(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer's pass evicts and deletes segments while the reader's verify catches its
    # view up (fault point `projection.segment`): that catch-up listed the files before
    # the pass, so its view keeps the tombstones of sessions whose creation records went.
    # The files changed during the run, so verify runs again, catching up again; when it
    # caught up once before its runs, it reported the tombstones as differences.
    writer_box: list[Journal] = []

    class PassInTheCatchUp(FileOps):
        armed = False

        def point(self, name: str, detail: object = None) -> None:
            if self.armed and name == "projection.segment":
                self.armed = False
                assert len(evict_all(writer_box[0])) == 40

    ops = PassInTheCatchUp()
    with open_store(store) as writer:
        writer.create_session("anchor")
    shutil.rmtree(store / "index")  # (the reader cannot make the shared view: private)
    with open_store(store, readonly=True, file_ops=ops) as reader, open_store(store) as writer:
        writer_box.append(writer)
        live_and_ended(writer, "s", 40)
        anchor_cursor(reader)
        ops.armed = True
        report = reader.verify()
        assert not ops.armed
        assert report.ok, report.problems


def test_a_read_only_private_view_forgets_tombstones_after_a_second_compaction_of_a_segment(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A private view looked for tombstones to forget only when the listing of segment
    # bases (and which were compressed) changed. Compacting an already compressed segment
    # again keeps its name: the creation records it dropped went unnoticed, and the view
    # kept those sessions' tombstones, ids and pins for good (found by verify comparing
    # the tombstones: 20 in the private view, 9 in a rebuilt one).
    with private_reader(store, tmp_path, monkeypatch) as (reader, private):
        with open_store(store) as writer:
            for i in range(3):
                writer.create_session(f"first{i}")
                writer.create_session(f"second{i}")
                writer.resolve_session(f"first{i}")
            writer.create_session("filler")
            for _ in range(2):
                writer.append("filler", [EventIn("m", b"f" * 3000)])  # (seals their segment)
            writer.create_session("active")
            assert sorted(evict_all(writer)) == ["first0", "first1", "first2"]
            writer.compact(0.0)  # (their creations go: the segment is compressed)
            writer.append("active", [EventIn("m", b"a")])
            # (The reader forgets their tombstones, a second after the files changed: it
            # takes what it saw as settled.)
            time.sleep(1.1)
            anchor_cursor(reader)
            listed = sorted(p.name for p in (store / "segments").glob("*.seg*"))
            for i in range(3):
                writer.resolve_session(f"second{i}")
            assert sorted(evict_all(writer)) == ["second0", "second1", "second2"]
            writer.compact(0.0)  # (the compressed segment again, without their creations)
            writer.append("active", [EventIn("m", b"a")])
            # (The same segment files by name: only the compressed one's content changed.)
            assert sorted(p.name for p in (store / "segments").glob("*.seg*")) == listed
            anchor_cursor(reader)
        anchor_cursor(reader)
        shutil.copytree(private, tmp_path / "copy")  # (read below, the reader idle)
    in_private = entry_counts(tmp_path, "copy")
    in_writer = entry_counts(store)
    assert in_writer["tombstones"] == 0, in_writer
    assert in_private == in_writer


def test_a_listing_iterated_while_sessions_are_evicted_goes_on(store: Path) -> None:
    """`list_sessions()` went from page to page by page tokens, and the token of a page
    whose last session was evicted meanwhile (its records gone with their segments)
    failed (InvalidPageToken, "start again without a token"), which the iterator's caller
    cannot act on."""
    with open_store(store) as j:
        for i in range(50):
            j.create_session(f"s{i:02d}")
        listing = j.list_sessions(page_size=10)
        seen = [next(listing).session_id for _ in range(15)]  # (two pages read: s00-s19)
        for i in range(50):
            j.resolve_session(f"s{i:02d}")
        assert len(evict_all(j)) == 50
        for i in range(50, 60):
            j.create_session(f"s{i:02d}")
        seen += [m.session_id for m in listing]
    assert seen == [f"s{i:02d}" for i in range(20)] + [f"s{i:02d}" for i in range(50, 60)]
