"""`compact()` and the active segment: the space of history that retention gave up comes
back even when it lies in the active segment (SPEC 8, "Compaction").

Until 2026-12-04 the active segment was never sealed by `compact()`, so a store of one
segment (64 MiB for `journal` commands) kept its whole size after its window was lowered
and `journal compact` ran: found by a new-user trial (a 34 MB store kept its 34 MB). Now
`compact()` seals it first when it holds at least `SEAL_DEAD_BYTES` dead and at least
`dead_share` of it is dead, and compacts it as a sealed one. These tests check the space
comes back (API and CLI), that no segment is sealed for nothing, that followers in this
process and in another see every event once across the seal, that cursors into the
dropped history fail as documented, and that a crash right after the seal loses nothing.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import lmdb
import msgspec
import pytest
from _local_engine import open_local
from _procs_retention import Child, payload
from click.testing import CliRunner

from cli.main import main as journal_cli
from journal import CursorExpired, EventIn, Journal, JournalCorrupt, RetentionPolicy
from journal._local.compaction import SEAL_DEAD_BYTES
from journal._local.files import FAULT_POINTS, FileOps

NO_WINDOWS = RetentionPolicy(max_history_bytes=None)
EVENT_BYTES = 4000
WINDOW = 200_000
WAIT_S = 60.0


def open_store(path: Path, **options: Any) -> Journal:
    """A store as `journal` commands open it: 64 MiB segments (the default)."""
    return Journal.open(path, durability="os", **options)


def fill(j: Journal, session_id: str, count: int, size: int = EVENT_BYTES) -> int:
    """Append `count` batches of one incompressible event; returns the last ordinal."""
    last = j.get_session(session_id).last_ordinal
    for ordinal in range(last + 1, last + count + 1):
        j.append(session_id, [EventIn(type="m", data=payload(session_id, ordinal, size))])
    return last + count


def segment_files(store: Path) -> list[str]:
    return sorted(n for n in os.listdir(store / "segments") if n.endswith((".seg", ".seg.zst")))


def segments_bytes(store: Path) -> int:
    """What the segment directory takes (files' sizes: preallocated zeros are written)."""
    directory = store / "segments"
    return sum((directory / name).stat().st_size for name in os.listdir(directory))


def lower_window(j: Journal, limit: int = WINDOW) -> None:
    j.change_retention_policy(lambda p: msgspec.structs.replace(p, max_history_bytes=limit))


def check_retained(j: Journal, session_id: str, last: int) -> int:
    """The retained range reads back whole and right; returns its first ordinal."""
    meta = j.get_session(session_id)
    events = list(j.replay(session_id))
    assert [e.ordinal for e in events] == list(range(meta.first_ordinal, last + 1))
    assert all(e.data == payload(session_id, e.ordinal, len(e.data)) for e in events)
    return meta.first_ordinal


def check_followed(lines: list[str], last: int) -> None:
    """A follower's `ev ORDINAL OK` lines are dense from 1 to `last`, but for jumps to the
    earliest retained event after `expired EARLIEST` when it fell behind the window."""
    previous = 0
    for line in lines:
        word, number, *rest = line.split()
        if word == "expired":
            assert int(number) > previous + 1, f"expired although {previous + 1} was next"
            previous = int(number) - 1
            continue
        assert (word, rest) == ("ev", ["OK"]), line
        assert int(number) == previous + 1, f"after {previous} came {number}: gap or duplicate"
        previous = int(number)
    assert previous == last, f"the follower ended at {previous}, not {last}"


def test_compact_returns_the_space_a_lowered_window_gave_up_in_the_active_segment(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    with open_store(store, retention=NO_WINDOWS) as j:
        j.create_session("s")
        last = fill(j, "s", 2500)  # 10 MB, all in the active segment
        before = segments_bytes(store)
        lower_window(j)
        report = j.compact()
        after = segments_bytes(store)
        first = check_retained(j, "s", last)
        assert first > 2400
        # What is left: the live window compressed, and the new active segment's zeros.
        assert after < before / 2, (before, after, report)
        assert report.segments_rewritten == ["00000000000000000001.seg.zst"], report
        assert report.bytes_before >= 2500 * EVENT_BYTES > 40 * report.bytes_after, report
        assert j.verify().ok
        # Appends go on in the new segment; a second compact has nothing more to seal.
        fill(j, "s", 3)
        files = segment_files(store)
        j.compact()
        assert segment_files(store) == files
    with Journal.open(store, readonly=True) as j:
        assert check_retained(j, "s", last + 3) == j.get_session("s").first_ordinal


def test_journal_compact_after_journal_retention_brings_a_one_segment_store_down(
    tmp_path: Path,
) -> None:
    # The new-user trial: one segment of the `journal` commands' 64 MiB, its window lowered
    # with `journal retention`, then `journal compact`.
    store = tmp_path / "store"
    with open_store(store, retention=NO_WINDOWS) as j:
        j.create_session("s")
        last = fill(j, "s", 2500)
    before = segments_bytes(store)
    runner = CliRunner()
    args = ["--store", str(store), "--format", "json"]
    result = runner.invoke(journal_cli, [*args, "retention", "--max-history-bytes", str(WINDOW)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(journal_cli, [*args, "compact"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output.splitlines()[-1])
    assert record["bytes_before"] > 40 * record["bytes_after"], record
    assert segments_bytes(store) < before / 2, (before, segments_bytes(store))
    with Journal.open(store, readonly=True) as j:
        assert check_retained(j, "s", last) > 2400
        assert j.verify().ok


@pytest.mark.parametrize(
    ("events", "window", "dead_share", "sealed"),
    [
        (500, None, 0.5, False),  # 2 MB, nothing dead
        (400, 1_000_000, 0.0, False),  # 600 KB dead: under SEAL_DEAD_BYTES
        (1000, 2_200_000, 0.5, False),  # 1.8 MB dead of 4 MB: under the dead share
        (1000, 2_200_000, 0.4, True),  # ... over this one
    ],
)
def test_compact_seals_the_active_segment_only_when_enough_of_it_is_dead(
    tmp_path: Path, events: int, window: int | None, dead_share: float, sealed: bool
) -> None:
    store = tmp_path / "store"
    with open_store(store, retention=NO_WINDOWS) as j:
        j.create_session("s")
        last = fill(j, "s", events)
        if window is not None:
            lower_window(j, window)
        report = j.compact(dead_share=dead_share)
        assert (len(segment_files(store)) == 2) is sealed, (segment_files(store), report)
        assert (report.segments_rewritten != []) is sealed, report
        if window is not None:
            dead = (j.get_session("s").first_ordinal - 1) * EVENT_BYTES
            assert (dead >= SEAL_DEAD_BYTES) is (window != 1_000_000)
        check_retained(j, "s", last)
        # Asked again, nothing is sealed: the active segment holds nothing dead now.
        j.compact(dead_share=dead_share)
        assert len(segment_files(store)) == (2 if sealed else 1)


def test_with_small_segments_half_a_segment_dead_is_enough_to_seal(tmp_path: Path) -> None:
    # (1 MiB dead could never be reached in a 64 KiB segment.)
    store = tmp_path / "store"
    with open_store(store, retention=NO_WINDOWS, segment_bytes=64 << 10) as j:
        j.create_session("s")
        last = fill(j, "s", 12)  # 48 KB
        lower_window(j, 12_000)  # 9 events dead: 36 KB
        j.compact(dead_share=0.9)
        assert len(segment_files(store)) == 1  # 75% dead: under the share asked for
        report = j.compact()
        assert report.segments_rewritten == ["00000000000000000001.seg.zst"], report
        assert check_retained(j, "s", last) == 10
        assert j.verify().ok


def test_damage_in_the_active_segment_is_raised_after_the_sealed_ones_are_compacted(
    tmp_path: Path,
) -> None:
    # As for damaged sealed segments (SPEC 8, "Compaction"): the damage is left for verify
    # and a restore, nothing is sealed, and the other segments still get their space back.
    store = tmp_path / "store"
    with open_store(store, retention=NO_WINDOWS, segment_bytes=64 << 10) as j:
        j.create_session("s")
        fill(j, "s", 30)  # one sealed plain segment, and 14 events in the active one
        files = segment_files(store)
        assert len(files) == 2 and files[0].endswith(".seg"), files
        lower_window(j, 8000)
        with open(store / "segments" / files[1], "r+b") as segment:
            segment.seek(100)  # in the body of its first frame (at offset 64)
            byte = segment.read(1)[0]
            segment.seek(100)
            segment.write(bytes([byte ^ 4]))
        with pytest.raises(JournalCorrupt) as damage:
            j.compact()
        assert (damage.value.segment, damage.value.offset) == (files[1], 64)
        assert segment_files(store) == [files[0] + ".zst", files[1]]  # compacted, not sealed


def test_cursors_into_history_the_seal_dropped_raise_cursor_expired(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with open_store(store, retention=NO_WINDOWS) as j:
        j.create_session("s")
        last = fill(j, "s", 1500)
        events = list(j.replay("s"))
        old = events[9].cursor  # after ordinal 10: dropped by the window
        kept = events[-20].cursor  # after ordinal last - 19: retained
        at = events[-30].cursor
        page = j.read("s", cursor=at, max_bytes=5 * EVENT_BYTES)
        with Journal.open(store, readonly=True) as reader:
            seen = [(e.ordinal, e.position, e.data) for e in reader.replay("s", cursor=kept)]
            lower_window(j)
            report = j.compact()
            assert report.segments_rewritten == ["00000000000000000001.seg.zst"], report
            first = j.get_session("s").first_ordinal
            for handle in (j, reader):  # (the reader opened before the seal)
                with pytest.raises(CursorExpired) as expired:
                    list(handle.replay("s", cursor=old))
                assert expired.value.earliest_ordinal == first
                resumed = list(handle.replay("s", cursor=expired.value.resume_cursor))
                assert [e.ordinal for e in resumed] == list(range(first, last + 1))
                again = [(e.ordinal, e.position, e.data) for e in handle.replay("s", cursor=kept)]
                assert again == seen
                assert handle.read("s", cursor=at, max_bytes=5 * EVENT_BYTES) == page


def test_a_follower_sees_every_event_once_while_appends_and_sealing_compactions_overlap(
    tmp_path: Path, rng: random.Random
) -> None:
    # An appender thread and `compact()` in this one share commits (a seal may be planned
    # in the batch of an append); a watcher in a third thread follows the session.
    store = tmp_path / "store"
    with open_store(store, retention=RetentionPolicy(max_history_bytes=WINDOW)) as j:
        j.create_session("s")
        received: list[str] = []
        errors: list[BaseException] = []

        def follow() -> None:
            cursor = None
            try:
                while True:
                    try:
                        for event in j.watch("s", cursor=cursor):
                            ok = event.data == payload("s", event.ordinal, len(event.data))
                            received.append(f"ev {event.ordinal} {'OK' if ok else 'BAD'}")
                            cursor = event.cursor
                        return
                    except CursorExpired as e:  # (fell behind the window: allowed)
                        received.append(f"expired {e.earliest_ordinal}")
                        cursor = e.resume_cursor
            except BaseException as e:
                errors.append(e)

        def append() -> None:
            try:
                fill(j, "s", 3000)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=follow), threading.Thread(target=append)]
        for thread in threads:
            thread.start()
        rewritten: list[str] = []
        try:
            while threads[1].is_alive():
                rewritten += j.compact(dead_share=rng.choice([0.0, 0.5])).segments_rewritten
                threads[1].join(rng.uniform(0.01, 0.1))
        finally:
            threads[1].join(WAIT_S)
            last = fill(j, "s", 5)
            j.resolve_session("s")
            threads[0].join(WAIT_S)
        assert not any(t.is_alive() for t in threads) and errors == [], errors
        check_followed(received, last)
        assert len(rewritten) >= 3, rewritten  # sealed and compacted again and again
        check_retained(j, "s", last)
        assert j.verify().ok


@pytest.mark.parametrize("mode", ["watch", "replay"])
def test_a_reader_process_sees_no_gap_or_duplicate_across_sealing_compactions(
    tmp_path: Path, rng: random.Random, mode: str
) -> None:
    store = tmp_path / "store"
    with open_store(store, retention=RetentionPolicy(max_history_bytes=WINDOW)) as j:
        j.create_session("s")
        fill(j, "s", 5)
        reader = Child("reader", str(store), "s", mode, str(1 << 20), str(rng.randrange(1 << 30)))
        try:
            assert reader.next_line() == "ready"
            rewritten: list[str] = []
            for _ in range(4):
                fill(j, "s", rng.randint(400, 700))
                rewritten += j.compact().segments_rewritten
            last = fill(j, "s", 5)
            j.resolve_session("s")
            assert reader.wait(120) == 0, reader.err()
        finally:
            reader.kill()
        assert len(rewritten) >= 3, rewritten
    lines = reader.seen
    assert lines[0] == "ready" and lines[-1] == "done", (lines[:2], lines[-2:])
    check_followed(lines[1:-1], last)


def test_a_writer_process_appends_on_in_the_new_segment_after_another_sealed_its_own(
    tmp_path: Path,
) -> None:
    # `journal compact` run beside a long-lived writer: the seal is the compacting
    # process's commit, and the writer's next commit catches up to the new segment.
    store = tmp_path / "store"
    with open_store(store, retention=NO_WINDOWS):
        pass
    writer = Child("writer", str(store), str(64 << 20))
    try:
        assert writer.next_line() == "ready"
        writer.send("append 5000")  # 300-byte events: 1.5 MB
        assert writer.next_line(120) == "s 1 5000"
        with open_store(store) as j:
            lower_window(j, 50_000)
            report = j.compact()
            assert report.segments_rewritten == ["00000000000000000001.seg.zst"], report
            first = j.get_session("s").first_ordinal
            writer.send("append 100")
            assert writer.next_line() == f"s {first} 5100"
            events = list(j.replay("s"))
            assert [e.ordinal for e in events] == list(range(first, 5101))
            assert all(e.data == payload("s", e.ordinal, 300) for e in events)
            # (Positions: the creation, 5000 events, the window's trim, then the new ones.)
            assert [e.position for e in events[-100:]] == list(range(5003, 5103))
            new_segment = f"{5003:020d}.seg"
            assert segment_files(store) == ["00000000000000000001.seg.zst", new_segment]
            assert j.verify().ok
        writer.proc.stdin.close()  # type: ignore[union-attr]
        assert writer.wait(60) == 0, writer.err()
    finally:
        writer.kill()


def test_a_crash_right_after_compact_sealed_the_active_segment_loses_nothing(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    with open_store(store, retention=NO_WINDOWS) as j:
        j.create_session("s")
        last = fill(j, "s", 1500)
        lower_window(j)
    child = Child("compact_paused", str(store), "compaction.sealed")
    try:
        assert child.next_line() == "ready"
        child.send("go")
        assert child.next_line() == "paused"  # rotated; the view's head not yet moved
    finally:
        child.kill()
    assert segment_files(store) == ["00000000000000000001.seg", f"{last + 3:020d}.seg"]
    with Journal.open(store, readonly=True) as reader:
        first = check_retained(reader, "s", last)
    with open_store(store) as j:
        assert check_retained(j, "s", last) == first
        assert j.append("s", [EventIn(type="m", data=payload("s", last + 1, 10))]).last_ordinal
        report = j.compact()  # the sealed segment is compacted as any sealed one
        assert report.segments_rewritten == ["00000000000000000001.seg.zst"], report
        assert check_retained(j, "s", last + 1) >= first  # (the append moved the window)
        assert j.verify().ok


def test_a_read_only_open_while_compact_seals_reads_the_store_s_view(tmp_path: Path) -> None:
    # Between the seal's rotation and its commit the log has moved past the view's head,
    # as when a writer syncs a frame; the commit moves the head to the new segment but not
    # its next position. Until 2026-12-04 a read-only open there waited for the next
    # position to pass, took the live writer's view for a crashed one's after 250 ms, and
    # read through a private view projected from the whole log.
    store = tmp_path / "store"
    with open_store(store, retention=NO_WINDOWS) as j:
        j.create_session("s")
        last = fill(j, "s", 1500)
        lower_window(j)
    child = Child("compact_paused", str(store), "compaction.sealed")
    behind: list[object] = []

    class SealCommitsMeanwhile(FileOps):
        def point(self, name: str, detail: object = None) -> None:
            assert name in FAULT_POINTS, name
            if name == "open.view_behind" and not behind:
                behind.append(detail)
                child.send("go")  # the seal commits, then the compaction runs
                assert child.next_line() == "rewrote 00000000000000000001.seg.zst"

    try:
        assert child.next_line() == "ready"
        child.send("go")
        assert child.next_line() == "paused"  # rotated; the view's head not yet moved
        reader, engine = open_local(store, readonly=True, file_ops=SealCommitsMeanwhile())
        with reader:
            assert behind == [last + 3], behind
            assert engine.private_dir is None
            assert check_retained(reader, "s", last) > 1400
        assert child.wait(60) == 0, child.err()
    finally:
        child.kill()


class FullMapAfterTheSeal(FileOps):
    """The view's map is full once when the batch of `compact()`'s seal commits, after the
    rotation: the engine grows the map and tries the batch again."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.sealed = 0

    def point(self, name: str, detail: object = None) -> None:
        if name == "compaction.sealed":
            self.sealed += 1
        elif name == "commit.view_commit" and self.armed and self.sealed:
            self.armed = False
            raise lmdb.MapFullError("injected")


def test_a_seal_tried_again_after_a_full_map_is_reported_as_sealed(tmp_path: Path) -> None:
    # The try again found the segment sealed (by its first try) and reported None, so
    # `compact()` counted nothing for it: "sealed bytes 0 -> 102,633", as if compacting
    # had made the store grow, and the retention pass after a seal was not run.
    ops = FullMapAfterTheSeal()
    store = tmp_path / "store"
    with open_store(store, segment_bytes=1 << 20, retention=NO_WINDOWS, file_ops=ops) as j:
        j.create_session("s")
        last = fill(j, "s", 200)  # 800 KB in the active segment
        lower_window(j, 100_000)
        ops.armed = True
        report = j.compact()
        assert not ops.armed, "the map never filled in the seal's batch"
        assert ops.sealed == 1  # (rotated once: the try again found it sealed)
        assert report.segments_rewritten == ["00000000000000000001.seg.zst"], report
        assert report.bytes_before >= 200 * EVENT_BYTES > 5 * report.bytes_after, report
        check_retained(j, "s", last)
        assert j.verify().ok


class CountCopies(FileOps):
    """Counts the compressed segment files renamed into place (a seal's with
    `compress_sealed`, a compaction's swap)."""

    def __init__(self) -> None:
        super().__init__()
        self.compressed: list[str] = []

    def replace(self, src: str, dst: str) -> None:
        if dst.endswith(".seg.zst"):
            self.compressed.append(os.path.basename(dst))
        super().replace(src, dst)


def test_compact_seals_a_compress_sealed_store_s_active_segment_without_compressing_it_twice(
    tmp_path: Path,
) -> None:
    # With `compress_sealed`, the seal compressed the whole segment (dead frames too),
    # and the compaction right after compressed its live frames again: zstd over the
    # segment twice, the first copy thrown away (177 ms against 97 ms for 16 MB).
    ops = CountCopies()
    store = tmp_path / "store"
    with open_store(store, compress_sealed=True, retention=NO_WINDOWS, file_ops=ops) as j:
        j.create_session("s")
        last = fill(j, "s", 500)  # 2 MB in the active segment
        lower_window(j)
        report = j.compact()
        assert report.segments_rewritten == ["00000000000000000001.seg.zst"], report
        assert ops.compressed == ["00000000000000000001.seg.zst"]  # (once)
        assert check_retained(j, "s", last) > 400
        assert j.verify().ok


class SlowSeal(FileOps):
    """Two seconds pass between `compact()`'s seal of the active segment and the
    retention pass that follows it."""

    def point(self, name: str, detail: object = None) -> None:
        if name == "compaction.sealed":
            time.sleep(2.1)


def test_a_session_trimmed_then_evicted_by_one_compaction_is_reported_evicted_only(
    tmp_path: Path,
) -> None:
    """The pass before the seal trims an ended session, the pass after it evicts it (its
    two seconds of retention ran out between them): until 2026-12-05 the report listed
    it as both trimmed and evicted (`journal compact`: "1 session evicted, 1 trimmed")."""
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=2000)
    with open_store(tmp_path / "store", segment_bytes=1 << 20, retention=policy) as j:
        j.create_session("kept")
        j.append("kept", [EventIn("m", b"k")])
        j.create_session("ended", max_history_bytes=10_000)
        fill(j, "ended", 200)  # 800 KB in the active segment, all but 2 events trimmed
        j.resolve_session("ended")
    with open_store(tmp_path / "store", segment_bytes=1 << 20, file_ops=SlowSeal()) as j:
        report = j.compact()
        assert (report.trimmed_sessions, report.evicted_sessions) == ([], ["ended"]), report
        assert [s.session_id for s in j.list_sessions()] == ["kept"]


def append_batches(j: Journal, session_id: str, batches: int, create: bool) -> list[int]:
    """`batches` appends of 150 incompressible 8 KB events (1.2 MB each), the first one
    creating the session when `create`; returns each batch's frame bytes, as written."""
    sizes = []
    for batch in range(batches):
        first = batch * 150 + 1
        events = [EventIn("m", payload(session_id, o, 8000)) for o in range(first, first + 150)]
        j.append(session_id, events, create=create and batch == 0)
        sizes.append(150 * 8000)
    return sizes


def test_compact_seals_an_active_segment_whose_frames_are_half_dead_whatever_its_zeros(
    tmp_path: Path,
) -> None:
    """The new-user trial's store (3 appends of 150 events of 8 KB, a 100 KB window): the
    dead share is of the committed frames' bytes (3.6 MB), not of the file with its
    preallocated zeros (7.8 MB), so 2.4 MB dead is 2/3 and the segment is sealed."""
    store = tmp_path / "store"
    with open_store(store, retention=NO_WINDOWS) as j:
        j.create_session("big")  # (its creation record in a frame of its own)
        append_batches(j, "big", 3, create=False)
        size = os.path.getsize(store / "segments" / "00000000000000000001.seg")
        lower_window(j, 100_000)
        report = j.compact()
        assert report.segments_rewritten == ["00000000000000000001.seg.zst"], report
        assert 3_600_000 < report.active_frame_bytes < 3_700_000 < size, (report, size)
        assert report.active_dead_bytes is not None
        assert report.active_dead_bytes >= 2 * 150 * 8000
        assert report.active_dead_bytes >= 0.5 * report.active_frame_bytes
        assert report.bytes_after < 1_300_000, report  # (the last batch, and its sidecar)
        assert check_retained(j, "big", 450) == 301
        assert j.verify().ok


def test_compact_reports_the_active_segment_s_dead_bytes_a_creating_append_keeps_live(
    tmp_path: Path,
) -> None:
    """The trial as it ran: the first append created the session, so its frame holds the
    session's creation record (pinned while the session lives) beside its 150 trimmed
    events, and stays live: 1.2 MB dead of 3.6 MB, under 0.5, nothing sealed. The report
    says so (until 2026-12-07 `journal compact` said only that it seals once 1 MiB and
    0.5 of the segment are dead, and the trial took its 300 trimmed events for dead)."""
    store = tmp_path / "store"
    with open_store(store, retention=NO_WINDOWS) as j:
        sizes = append_batches(j, "big", 3, create=True)
        lower_window(j, 100_000)
        report = j.compact()
        assert report.segments_rewritten == [] and report.bytes_before == 0, report
        assert sum(sizes) < report.active_frame_bytes < sum(sizes) + 15_000, report  # (+ headers)
        assert report.active_dead_bytes is not None
        assert sizes[1] < report.active_dead_bytes < sizes[1] + 5000, report
        assert j.get_session("big").first_ordinal == 301
        report = j.compact(dead_share=0.3)  # (1/3 dead: sealed)
        assert report.segments_rewritten == ["00000000000000000001.seg.zst"], report
        assert report.bytes_after > sizes[0], report  # (the creating append's frame stays)
        assert check_retained(j, "big", 450) == 301
    with Journal.open(tmp_path / "small", create=True, durability="os") as j:
        j.append("s", [EventIn("m", b"x" * 1000)], create=True)
        report = j.compact()
        assert report.active_dead_bytes is None  # (too few frames to look at)
        assert 1000 < report.active_frame_bytes < 1200, report


def test_journal_compact_says_how_much_of_the_active_segment_s_frames_is_dead(
    tmp_path: Path,
) -> None:
    """The trial's commands: three `journal append -s big --create` of 150 events of 8 KB
    base64, `journal retention --max-history-bytes 100000`, `journal compact`."""
    store = tmp_path / "store"
    runner = CliRunner()
    args = ["--store", str(store)]
    assert runner.invoke(journal_cli, [*args, "init"]).exit_code == 0
    for batch in range(3):
        lines = "".join(
            json.dumps({"data": payload("big", batch * 150 + i, 6000).hex()[:8000]}) + "\n"
            for i in range(1, 151)
        )
        result = runner.invoke(journal_cli, [*args, "append", "-s", "big", "--create"], lines)
        assert result.exit_code == 0, result.output
    result = runner.invoke(journal_cli, [*args, "retention", "--max-history-bytes", "100000"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(journal_cli, [*args, "compact"])
    assert result.exit_code == 0, result.output
    reason = result.output.splitlines()[-1]
    assert reason.startswith("nothing reclaimed: there is no sealed segment, only the active one,")
    assert "of them dead (0.33); compact seals it" in reason, reason
    assert "creation record" in reason, reason
    result = runner.invoke(journal_cli, [*args, "--format", "json", "compact"])
    record = json.loads(result.output.splitlines()[-1])
    assert record["active_dead_bytes"] / record["active_frame_bytes"] == pytest.approx(1 / 3, 0.01)
    result = runner.invoke(journal_cli, [*args, "compact", "--dead-share", "0.33"])
    assert "compacted: 1 segment rewritten" in result.output, result.output
