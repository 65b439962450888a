"""Checkpoints (`Journal.checkpoint_session`, `Journal.checkpoint`): a snapshot that keeps
history. It changes nothing about ordinals, the retained range or cursors; it survives a
reopen, a rebuild of what the engine derives, compaction and read-only opening; it goes
once history below it has left. Run against every engine in `engines.ENGINES`."""

from __future__ import annotations

from pathlib import Path

import pytest
from engines import EngineFactory

from journal import (
    CursorExpired,
    EventIn,
    InvalidArgument,
    Journal,
    ReadOnlyStore,
    RetentionPolicy,
    SessionNotFound,
)


def fill(j: Journal, session_id: str, count: int, size: int = 10) -> None:
    for i in range(count):
        j.append(session_id, [EventIn(type="n", data=b"%d:" % i + b"x" * size)])


def test_a_checkpoint_changes_no_ordinal_range_or_cursor(j: Journal) -> None:
    j.create_session("s")
    fill(j, "s", 10)
    before = list(j.replay("s"))
    meta_before = j.get_session("s")
    checkpoint = j.checkpoint_session("s", 6, b"state at 6")
    assert (checkpoint.ordinal, checkpoint.data) == (6, b"state at 6")
    after = list(j.replay("s"))
    assert [(e.ordinal, e.data, e.cursor) for e in after] == [
        (e.ordinal, e.data, e.cursor) for e in before
    ]
    meta = j.get_session("s")
    assert (meta.first_ordinal, meta.last_ordinal) == (meta_before.first_ordinal, 10)
    assert j.snapshot("s") is None  # a checkpoint is not the session's snapshot
    # Its cursor resumes after it; older cursors still resume exactly.
    assert [e.ordinal for e in j.replay("s", cursor=checkpoint.cursor)] == [7, 8, 9, 10]
    assert next(e.ordinal for e in j.replay("s", cursor=before[1].cursor)) == 3
    result = j.append("s", [EventIn(type="n", data=b"next")])
    assert result.first_ordinal == 11
    stored = j.checkpoint("s")
    assert stored is not None
    assert (stored.ordinal, stored.data, stored.cursor) == (6, b"state at 6", checkpoint.cursor)


def test_the_latest_checkpoint_replaces_the_earlier_one(j: Journal) -> None:
    j.create_session("s")
    assert j.checkpoint("s") is None
    fill(j, "s", 5)
    j.checkpoint_session("s", 2, b"two")
    j.checkpoint_session("s", 4, b"four")
    j.checkpoint_session("s", 4, b"four again")  # the same ordinal may be stored again
    stored = j.checkpoint("s")
    assert stored is not None and (stored.ordinal, stored.data) == (4, b"four again")
    with pytest.raises(InvalidArgument, match="at least"):
        j.checkpoint_session("s", 3, b"three")
    with pytest.raises(InvalidArgument, match="ends at ordinal 5"):
        j.checkpoint_session("s", 6, b"six")
    with pytest.raises(InvalidArgument):
        j.checkpoint_session("s", 0, b"zero")
    with pytest.raises(InvalidArgument):
        j.checkpoint_session("s", 5, "not bytes")  # type: ignore[arg-type]
    with pytest.raises(SessionNotFound):
        j.checkpoint_session("missing", 1, b"x")
    with pytest.raises(SessionNotFound):
        j.checkpoint("missing")
    stored = j.checkpoint("s")
    assert stored is not None and stored.data == b"four again"


def test_a_checkpoint_below_the_retained_range_is_refused(j: Journal) -> None:
    j.create_session("s")
    fill(j, "s", 10)
    j.compact_session("s", 5, b"snapshot")
    for through in (3, 4):  # 4: just below the range's start (event 5 is gone)
        with pytest.raises(InvalidArgument, match="could never be used"):
            j.checkpoint_session("s", through, b"x")
    stored = j.checkpoint_session("s", 5, b"at the snapshot")  # the range's start: usable
    assert next(e.ordinal for e in j.replay("s", cursor=stored.cursor)) == 6


def test_history_leaving_below_a_checkpoint_removes_it(j: Journal) -> None:
    j.create_session("s")
    fill(j, "s", 10)
    j.checkpoint_session("s", 4, b"four")
    j.compact_session("s", 4, b"snapshot at four")  # events after it all kept: still usable
    kept = j.checkpoint("s")
    assert kept is not None and kept.ordinal == 4
    j.compact_session("s", 7, b"snapshot at seven")
    assert j.checkpoint("s") is None
    # A new checkpoint may start lower than the one that went.
    assert j.checkpoint_session("s", 8, b"eight").ordinal == 8


def test_checkpoints_survive_reopen_rebuild_and_verify(engine: EngineFactory, store: Path) -> None:
    with engine.open(store, durability="os", segment_bytes=16 << 10) as j:
        j.create_session("s")
        fill(j, "s", 60, size=600)  # several sealed segments
        j.checkpoint_session("s", 30, b"thirty")
        fill(j, "s", 60, size=600)
        assert j.verify().ok
    with engine.open(store, durability="os", segment_bytes=16 << 10) as j:
        stored = j.checkpoint("s")
        assert stored is not None and (stored.ordinal, stored.data) == (30, b"thirty")
    engine.discard_derived_state(store)
    with engine.open(store, durability="os", segment_bytes=16 << 10) as j:
        stored = j.checkpoint("s")
        assert stored is not None and (stored.ordinal, stored.data) == (30, b"thirty")
        assert next(e.ordinal for e in j.replay("s", cursor=stored.cursor)) == 31
        assert j.verify().ok
        j.compact(dead_share=0.0)  # rewrites every sealed segment: the record is kept
        stored = j.checkpoint("s")
        assert stored is not None and stored.data == b"thirty"
        assert j.verify().ok
    with engine.open(store, readonly=True) as reader:
        stored = reader.checkpoint("s")
        assert stored is not None and stored.data == b"thirty"
        with pytest.raises(ReadOnlyStore):
            reader.checkpoint_session("s", 40, b"forty")


def test_replaced_checkpoints_are_reclaimed_by_retention(
    engine: EngineFactory, store: Path
) -> None:
    with engine.open(store, durability="os", segment_bytes=16 << 10) as j:
        j.create_session("s")
        fill(j, "s", 3)
        for i in range(60):  # 480 KB of checkpoints, only the last one live
            j.checkpoint_session("s", 3, b"%02d" % i + b"c" * 8000)
        j.apply_retention()
        stats = j.stats()
        assert stats.segment_bytes < 100_000, stats
        stored = j.checkpoint("s")
        assert stored is not None and stored.data.startswith(b"59")
        assert j.verify().ok
    engine.discard_derived_state(store)
    with engine.open(store, durability="os", segment_bytes=16 << 10) as j:
        stored = j.checkpoint("s")
        assert stored is not None and stored.data.startswith(b"59")


def test_a_trim_by_the_history_window_removes_a_checkpoint_it_passes(
    engine: EngineFactory, store: Path
) -> None:
    policy = RetentionPolicy(max_history_bytes=20_000)
    with engine.open(store, durability="os", segment_bytes=16 << 10, retention=policy) as j:
        j.create_session("s")
        fill(j, "s", 5, size=1000)
        checkpoint = j.checkpoint_session("s", 5, b"five")
        fill(j, "s", 60, size=1000)
        j.apply_retention()
        meta = j.get_session("s")
        assert meta.first_ordinal > 6
        assert j.checkpoint("s") is None
        with pytest.raises(CursorExpired):
            list(j.replay("s", cursor=checkpoint.cursor))
    engine.discard_derived_state(store)
    with engine.open(store, durability="os", segment_bytes=16 << 10, retention=policy) as j:
        assert j.checkpoint("s") is None
        assert j.verify().ok


def test_an_evicted_and_recreated_session_has_no_checkpoint(
    engine: EngineFactory, store: Path
) -> None:
    policy = RetentionPolicy(session_retention_ms=1)
    with engine.open(store, durability="os", retention=policy) as j:
        j.create_session("s")
        fill(j, "s", 3)
        j.checkpoint_session("s", 3, b"three")
        j.resolve_session("s")
        report = j.apply_retention(now_ms=j.get_session("s").ended_at_ms + 10)  # type: ignore[operator]
        assert report.evicted_sessions == ["s"]
        j.create_session("s")
        assert j.checkpoint("s") is None
        assert j.verify().ok


def test_two_checkpoints_of_one_ordinal_in_one_commit_read_back_the_later(
    tmp_path: Path,
) -> None:
    """Two checkpoints through the same ordinal planned into one group commit (one frame)
    on the local engine: the row names the later one, and reading it back gave the
    earlier one's data (the frame's first checkpoint record of that session and ordinal).
    Found by a review. The commit of an append is held at `commit.batch_taken` while the
    two queue behind it, so the next batch takes both."""
    import threading

    from journal._local.files import FileOps
    from journal.engine import Checkpoint

    armed, held, release = threading.Event(), threading.Event(), threading.Event()
    planned: list[tuple[int, bytes]] = []  # (the batch, the checkpoint's data)
    batches = [0]  # batches taken since armed
    queued: dict[str, threading.Event] = {}  # (a thread's name: its request is queued)

    class Hold(FileOps):
        def point(self, name: str, detail: object = None) -> None:
            if name == "plan.operation" and isinstance(detail, Checkpoint):
                planned.append((batches[0], detail.data))
            if name == "commit.queued" and threading.current_thread().name in queued:
                queued[threading.current_thread().name].set()
            if name == "commit.batch_taken" and armed.is_set():
                batches[0] += 1
                if batches[0] == 1:
                    held.set()
                    release.wait(10)

    with Journal.open(tmp_path / "s", durability="os", file_ops=Hold()) as j:
        j.create_session("s")
        fill(j, "s", 3)
        armed.set()
        threads = [threading.Thread(target=fill, args=(j, "s", 1))]
        threads += [
            threading.Thread(target=j.checkpoint_session, args=("s", 2, data))
            for data in (b"first", b"second")
        ]
        threads[0].start()
        assert held.wait(10)  # (the append's batch is taken, and held)
        for thread in threads[1:]:  # (queued in this order behind the held commit)
            queued[thread.name] = threading.Event()
            thread.start()
            assert queued[thread.name].wait(10)
        release.set()
        for thread in threads:
            thread.join(10)
        assert sorted(planned) == [(2, b"first"), (2, b"second")], "not one commit"
        later = planned[-1][1]
        assert j.checkpoint("s").data == later
        j.close()
        with Journal.open(tmp_path / "s", readonly=True) as reader:
            assert reader.checkpoint("s").data == later
