"""Readers in other processes while history leaves and segments are deleted or rewritten.

A reader process follows one session (a watch, or repeated replays) while this process
appends, takes snapshots (`compact_session`), applies retention (trims and evictions, so
sealed segments get deleted) and compacts, and a compactor process runs `compact()` and
`apply_retention()` in a loop (segments rewritten under the reader's feet). The reader is
also frozen (on SIGUSR1 it stops itself between bytecodes) while the history it still
needs is dropped, so it must meet `CursorExpired`. Whatever happens, every event it
receives is the right one (payloads are derived from ordinals), in strictly increasing
dense order between restarts from a `resume_cursor`, and it ends only by completion after
the session is resolved.

The last tests pin down, deterministically, interleavings that test found by chance: a
segment deleted by another process's retention pass while `compact()` is about to rewrite
it, while it swaps its copy into place, or while another retention pass reads its sidecar.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _dead_files import EVICT_AT_ONCE, KeepDeadFiles, evict_keeping_dead_files
from _procs_retention import Child, payload

from journal import EventIn, Journal, RetentionPolicy
from journal._local.files import FAULT_POINTS, FileOps

SEGMENT_BYTES = 16 << 10


class Hooks(FileOps):
    """Fault points that run a test's function the first time they are reached."""

    def __init__(self) -> None:
        self.once: dict[str, Callable[[], None]] = {}

    def at(self, name: str, action: Callable[[], None]) -> None:
        assert name in FAULT_POINTS, name
        self.once[name] = action

    def point(self, name: str, detail: object = None) -> None:
        action = self.once.pop(name, None)
        if action is not None:
            action()


POLICY = RetentionPolicy(max_history_bytes=None, session_retention_ms=3600_000)
WINDOW_BYTES = 40_000  # the watched session's own history window


def check_reader_output(lines: list[str], last_ordinal: int) -> tuple[int, int]:
    """Check a reader's lines; returns (events received, CursorExpired met)."""
    assert lines[0] == "ready", lines[:3]
    assert lines[-1] == "done", lines[-3:]
    previous = 0
    # A read from no cursor starts at whatever is retained then; after `expired E`, the
    # next event is at least E.
    floor, restarted = 1, True
    received = expired = 0
    for line in lines[1:-1]:
        word, number, *rest = line.split()
        if word == "expired":
            earliest = int(number)
            assert earliest > previous + 1, f"expired although {previous + 1} was next: {line}"
            floor, restarted = earliest, True
            expired += 1
            continue
        assert word == "ev", line
        ordinal = int(number)
        assert rest == ["OK"], f"wrong payload for ordinal {ordinal}"
        if restarted:
            assert ordinal >= floor and ordinal > previous, (line, previous, floor)
        else:
            assert ordinal == previous + 1, f"after {previous} came {ordinal}: gap or duplicate"
        previous, restarted = ordinal, False
        received += 1
    assert previous == last_ordinal, f"the reader ended at {previous}, not {last_ordinal}"
    return received, expired


def append(j: Journal, session_id: str, rng: random.Random, count: int) -> None:
    first = j.get_session(session_id).last_ordinal + 1
    batch = [
        EventIn(type="m", data=payload(session_id, first + i, rng.choice([40, 300, 1500])))
        for i in range(count)
    ]
    result = j.append(session_id, batch)
    assert result.first_ordinal == first


def freeze_reader(store: Path) -> None:
    # The reader freezes itself on SIGUSR1 while this file exists (between bytecodes: a
    # SIGSTOP could land inside LMDB while it held the reader table's lock, and then every
    # process of the store hung on that lock).
    Path(f"{store}.freeze").touch()


def wait_until_frozen(store: Path) -> None:
    deadline = time.monotonic() + 30
    while not Path(f"{store}.frozen").exists():
        assert time.monotonic() < deadline, "the reader did not freeze"
        time.sleep(0.001)


def thaw_reader(store: Path) -> None:
    Path(f"{store}.freeze").unlink()


@pytest.mark.parametrize("mode", ["watch", "replay"])
@pytest.mark.parametrize("rounds", [400, pytest.param(4000, marks=pytest.mark.slow)])
def test_reader_gets_only_correct_events_while_history_is_trimmed_and_compacted(
    tmp_path: Path, rng: random.Random, mode: str, rounds: int
) -> None:
    store = tmp_path / "store"
    budget = rng.choice([1, 2000, 1 << 20])
    with Journal.open(store, durability="os", segment_bytes=SEGMENT_BYTES, retention=POLICY) as j:
        j.create_session("s", max_history_bytes=WINDOW_BYTES)
        append(j, "s", rng, 5)
        reader = Child("reader", str(store), "s", mode, str(budget), str(rng.randrange(1 << 30)))
        compactor = Child("compactor", str(store), str(SEGMENT_BYTES), str(rng.randrange(1 << 30)))
        try:
            assert reader.next_line() == "ready"
            assert compactor.next_line() == "ready"
            noise = 0
            deleted = 0
            freezes = 0
            j.create_session(f"noise-{noise}")
            for round_no in range(rounds):
                append(j, "s", rng, rng.randint(1, 8))
                append(j, f"noise-{noise}", rng, rng.randint(1, 4))
                action = rng.random()
                if action < 0.08:
                    meta = j.get_session("s")
                    snapshot = j.snapshot("s")
                    low = max(meta.first_ordinal - 1, snapshot.ordinal if snapshot else 1, 1)
                    through = rng.randint(low, meta.last_ordinal)
                    j.compact_session("s", through, f"through {through}".encode())
                elif action < 0.16:
                    # The noise session ends and is evicted: its segments die.
                    ended = j.resolve_session(f"noise-{noise}").ended_at_ms
                    assert ended is not None
                    report = j.apply_retention(now_ms=ended + 3600_000)
                    assert report.evicted_sessions == [f"noise-{noise}"]
                    deleted += len(report.deleted_segments)
                    noise += 1
                    j.create_session(f"noise-{noise}")
                elif action < 0.2:
                    deleted += len(j.compact(dead_share=rng.random()).segments_deleted)
                elif action < 0.23 or round_no == rounds // 2:
                    # Freeze the reader, move the session on, and drop everything it has
                    # not read yet: when it thaws, its next page must be CursorExpired.
                    freeze_reader(store)
                    reader.signal(signal.SIGUSR1)
                    try:
                        wait_until_frozen(store)
                        append(j, "s", rng, 20)
                        j.compact_session("s", j.get_session("s").last_ordinal, b"all")
                    finally:
                        thaw_reader(store)
                    freezes += 1
                if rng.random() < 0.1:
                    time.sleep(rng.uniform(0.0, 0.01))
            append(j, "s", rng, 3)  # the end of the session is retained
            last = j.get_session("s").last_ordinal
            j.resolve_session("s")
            code = reader.wait(120)
            assert code == 0, reader.err()
            assert compactor.proc.poll() is None, f"the compactor died: {compactor.err()}"
            compactor.send("stop")
            assert compactor.wait(60) == 0, compactor.err()
        finally:
            reader.kill()
            compactor.kill()
        received, expired = check_reader_output(reader.seen, last)
        assert expired >= 1 and freezes >= 1, "the reader never met CursorExpired"
        assert received > 0
        word, rewrote, _, also_deleted = compactor.seen[-1].split()
        assert word == "rewrote" and int(rewrote) > 0, compactor.seen[-1]
        assert deleted + int(also_deleted) > 0, "no segment was ever deleted"
        # The store itself agrees: the retained range reads back whole and verifies.
        meta = j.get_session("s")
        events = list(j.replay("s"))
        assert [e.ordinal for e in events] == list(range(meta.first_ordinal, last + 1))
        assert all(e.data == payload("s", e.ordinal, len(e.data)) for e in events)
        report = j.verify()
        assert report.ok, report.problems


DAY = 24 * 3600 * 1000
RETAIN_DAY = RetentionPolicy(max_history_bytes=None, session_retention_ms=DAY)


@contextlib.contextmanager
def ended_and_kept(store: Path, rng: random.Random) -> Iterator[tuple[Journal, Hooks, int]]:
    """A journal (8 KiB segments, a day's retention of ended sessions, `Hooks` as its file
    operations) with a session "x" of 30 appends, ended (its end time given), then "keep"
    of 10: the first segments hold only x's frames."""
    hooks = Hooks()
    with Journal.open(
        store, durability="os", segment_bytes=8192, retention=RETAIN_DAY, file_ops=hooks
    ) as j:
        j.create_session("x")
        for _ in range(30):
            append(j, "x", rng, 2)
        ended = j.resolve_session("x").ended_at_ms
        assert ended is not None
        j.create_session("keep")
        for _ in range(10):
            append(j, "keep", rng, 2)
        yield j, hooks, ended


def test_compact_carries_on_when_another_process_deletes_a_segment_it_is_about_to_rewrite(
    tmp_path: Path, rng: random.Random
) -> None:
    # compact() decides what to rewrite from a read snapshot, without the writer lock; a
    # retention pass in another process may delete that segment before it is read. Here
    # the other process runs exactly then (from the point where compact() has computed a
    # segment's live frames).
    store = tmp_path / "store"
    with ended_and_kept(store, rng) as (j, hooks, ended):
        segments = sorted((store / "segments").glob("*.seg"))
        assert len(segments) >= 4
        expected = [(e.ordinal, e.data) for e in j.replay("keep")]
        outputs: list[str] = []

        def evict_from_another_process() -> None:
            other = Child("retention", str(store), str(ended + DAY), str(DAY))
            assert other.wait(60) == 0, other.err()
            outputs.extend(other.seen)

        hooks.at("compaction.live_frames", evict_from_another_process)
        report = j.compact()
        assert outputs and outputs[0].startswith("evicted x deleted "), outputs
        assert int(outputs[0].split()[-1]) >= 1
        assert not (store / "segments" / segments[0].name).exists()
        assert segments[0].name + ".zst" not in report.segments_rewritten
        assert [(e.ordinal, e.data) for e in j.replay("keep")] == expected
        assert j.verify().ok


def test_compaction_swap_and_a_retention_pass_deleting_that_segment_do_not_collide(
    tmp_path: Path, rng: random.Random
) -> None:
    # A compactor process copied a live segment; then this process's retention pass
    # finds the segment dead, commits, and deletes its files (after the commit, outside
    # the writer lock) exactly while the compactor swaps its copy into place. Neither
    # process may fail, and the dead segment must not come back.
    store = tmp_path / "store"
    with ended_and_kept(store, rng) as (j, hooks, ended):
        first = sorted((store / "segments").glob("*.seg"))[0].name
        expected = [(e.ordinal, e.data) for e in j.replay("keep")]
        compactor = Child("compact_interleaved", str(store))
        try:
            assert compactor.next_line() == "ready", compactor.err()
            compactor.send("go")
            assert compactor.next_line() == "rewritten", compactor.err()

            def delete_during_the_swap() -> None:
                compactor.send("go")  # it swaps now (we no longer hold the writer lock)
                assert compactor.next_line() == "replaced", compactor.err()
                # The swap holds the segment-files lock until it is done: let it finish;
                # the deletion then waits for that lock instead of interleaving.
                compactor.send("go")

            hooks.at("retention.delete", delete_during_the_swap)
            report = j.apply_retention(now_ms=ended + DAY)
            assert report.evicted_sessions == ["x"]
            assert first in report.deleted_segments
            code = compactor.wait(60)
        finally:
            compactor.kill()
        assert code == 0, compactor.err()
        assert compactor.seen[-1].startswith("rewrote ")
        base = first.split(".")[0]
        assert sorted(p.name for p in (store / "segments").glob(base + ".*")) == []
        assert [(e.ordinal, e.data) for e in j.replay("keep")] == expected
        report = j.verify()
        assert report.ok, report.problems
    with Journal.open(store, durability="os", segment_bytes=8192, retention=RETAIN_DAY) as j:
        assert [(e.ordinal, e.data) for e in j.replay("keep")] == expected


def test_retention_pass_carries_on_when_another_process_deletes_a_segment_meanwhile(
    tmp_path: Path, rng: random.Random
) -> None:
    # This process's retention pass committed (the view forgot a dead segment) and deletes
    # its files after the commit; another process's retention pass, under the writer
    # lock, listed that segment just before and reads its sidecar just after.
    store = tmp_path / "store"
    with ended_and_kept(store, rng) as (j, hooks, ended):
        expected = [(e.ordinal, e.data) for e in j.replay("keep")]
        other = Child("retention_paused", str(store))
        try:
            assert other.next_line() == "ready", other.err()

            def let_the_other_pass_list() -> None:
                other.send("go")
                assert other.next_line() == "listed", other.err()

            hooks.at("retention.delete", let_the_other_pass_list)
            hooks.at("retention.deleted", lambda: other.send("go"))
            report = j.apply_retention(now_ms=ended + DAY)
            assert report.evicted_sessions == ["x"] and report.deleted_segments
            code = other.wait(60)
        finally:
            other.kill()
        assert code == 0, other.err()
        assert other.seen[-1].startswith("deleted ")
        assert [(e.ordinal, e.data) for e in j.replay("keep")] == expected
        assert j.verify().ok


def test_writable_open_carries_on_when_another_process_deletes_a_segment_meanwhile(
    tmp_path: Path,
) -> None:
    # A writable open finishes what a crashed writer interrupted (`finish_interrupted`):
    # it lists the sealed segments and checks each one's sidecar, rewriting a missing one
    # from its segment. Another writer's committed retention pass deletes dead segments'
    # files after its commit, outside the writer lock (under the segment-files lock);
    # when that deletion came between the listing and the check, the open read a segment
    # that was gone and failed with StoreUnavailable (found by a soak with four writer
    # processes reopening their journals). Here the other process's deletion is played at
    # that very moment (fault point open.sidecar_check), as that process would: only if it
    # can take the segment-files lock.
    import fcntl

    store = tmp_path / "store"
    ops = KeepDeadFiles()
    with Journal.open(
        store, durability="os", segment_bytes=4096, retention=EVICT_AT_ONCE, file_ops=ops
    ) as j:
        report, ended = evict_keeping_dead_files(j, ops)  # (the files stay: logged)
    segments = store / "segments"
    dead = {int(name.split(".")[0]) for name in report.deleted_segments}
    assert all(any(segments.glob(f"{base:020d}.*")) for base in dead)  # committed, not deleted
    deleted: list[int] = []

    class OtherProcessDeletesFirst(FileOps):
        def point(self, name: str, detail: object = None) -> None:
            if name == "open.sidecar_check" and isinstance(detail, int):
                other_process_deletes_first(str(segments), detail)

    def other_process_deletes_first(directory: str, base: int) -> None:
        if base in dead and base not in deleted:
            fd = os.open(os.path.join(directory, ".files.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass  # the open holds it: the other process waits its turn
                else:
                    for path in segments.glob(f"{base:020d}.*"):
                        path.unlink()
                    deleted.append(base)
            finally:
                os.close(fd)

    with Journal.open(
        store,
        durability="os",
        segment_bytes=4096,
        retention=EVICT_AT_ONCE,
        file_ops=OtherProcessDeletesFirst(),
    ) as j:
        assert [e.data for e in j.replay("kept")] == [b"k"]
        j.apply_retention(now_ms=ended + 10)  # deletes what is left of the dead segments
        assert not any(p for base in dead for p in segments.glob(f"{base:020d}.*"))
        assert j.verify().ok
