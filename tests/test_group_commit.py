"""The commit path's shortcuts stay invisible: a writer reuses the rows its last batch of
appends wrote only while nothing else committed (in any process), and a leader that
gathers stragglers still gives every caller its own result."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from journal import EventIn, Journal, OrdinalConflict, SessionNotWritable
from journal._local.files import FileOps

ROOT = Path(__file__).resolve().parent.parent

_OTHER = """
import sys
sys.path.insert(0, sys.argv[1])
from journal import EventIn, Journal
with Journal.open(sys.argv[2]) as j:
    action = sys.argv[3]
    if action == "append":
        j.append("s", [EventIn("other", b"x")] * 3)
    elif action == "suspend":
        j.suspend_session("s")
    elif action == "compact":
        j.compact_session("s", 2, b"snap")
"""


def _other_process(store: Path, action: str) -> None:
    subprocess.run(
        [sys.executable, "-c", _OTHER, str(ROOT), str(store), action], check=True, timeout=60
    )


def test_a_writer_sees_what_another_process_appended_between_its_batches(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "s", durability="os") as j:
        j.create_session("s")
        j.append("s", [EventIn("mine", b"a")])
        j.append("s", [EventIn("mine", b"b")])  # the row of "s" is now known to the writer
        _other_process(tmp_path / "s", "append")
        with pytest.raises(OrdinalConflict):
            j.append("s", [EventIn("mine", b"c")], expected_last_ordinal=2)
        result = j.append("s", [EventIn("mine", b"c")], expected_last_ordinal=5)
        assert (result.first_ordinal, result.last_ordinal) == (6, 6)
        ordinals = [e.ordinal for e in j.replay("s")]
        assert ordinals == [1, 2, 3, 4, 5, 6]
        assert j.get_session("s").last_ordinal == 6


def test_a_writer_sees_a_transition_made_by_another_process(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "s", durability="os") as j:
        j.create_session("s")
        j.append("s", [EventIn("mine", b"a")])
        j.append("s", [EventIn("mine", b"b")])
        _other_process(tmp_path / "s", "suspend")
        with pytest.raises(SessionNotWritable):
            j.append("s", [EventIn("mine", b"c")])
        assert j.get_session("s").state.value == "suspended"


def test_a_writer_sees_a_snapshot_taken_by_another_process(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "s", durability="os") as j:
        j.create_session("s")
        for body in (b"a", b"b", b"c"):
            j.append("s", [EventIn("mine", body)])
        _other_process(tmp_path / "s", "compact")
        j.append("s", [EventIn("mine", b"d")])
        row = j.get_session("s")
        assert (row.first_ordinal, row.last_ordinal) == (3, 4)
        assert [e.ordinal for e in j.replay("s")] == [3, 4]


def test_a_failed_batch_leaves_no_stale_row_behind(tmp_path: Path) -> None:
    class FailOnce(FileOps):
        armed = False

        def point(self, name: str, detail: object = None) -> None:
            if name == "commit.view_flush" and self.armed:
                self.armed = False
                raise OSError(28, "No space left on device")

    ops = FailOnce()
    with Journal.open(tmp_path / "s", durability="os", file_ops=ops) as j:
        j.create_session("s")
        j.append("s", [EventIn("mine", b"a")])
        ops.armed = True
        with pytest.raises(Exception):  # noqa: B017 - StoreUnavailable
            j.append("s", [EventIn("mine", b"lost")])
        result = j.append("s", [EventIn("mine", b"b")])
        assert (result.first_ordinal, result.last_ordinal) == (2, 2)
        assert [e.data for e in j.replay("s")] == [b"a", b"b"]


def test_gathered_batches_give_each_caller_its_own_dense_result(tmp_path: Path) -> None:
    class CountBatches(FileOps):
        sizes: list[int]

        def __init__(self) -> None:
            self.sizes = []

        def point(self, name: str, detail: object = None) -> None:
            if name == "commit.batch_taken" and isinstance(detail, int):
                self.sizes.append(detail)

    ops = CountBatches()
    threads, per_thread = 12, 60
    results: dict[int, list[tuple[int, int]]] = {t: [] for t in range(threads)}
    with Journal.open(tmp_path / "s", durability="fsync", file_ops=ops) as j:
        for t in range(threads):
            j.create_session(f"t{t}")
        j.create_session("shared")
        barrier = threading.Barrier(threads)

        def work(t: int) -> None:
            barrier.wait()
            for i in range(per_thread):
                session = "shared" if i % 3 == 0 else f"t{t}"
                r = j.append(session, [EventIn("e", f"{t}:{i}".encode())])
                results[t].append((r.first_ordinal, r.last_ordinal))

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for t in range(threads):
            own = [e.data.decode() for e in j.replay(f"t{t}")]
            assert own == [f"{t}:{i}" for i in range(per_thread) if i % 3 != 0]
        shared = [e.ordinal for e in j.replay("shared")]
        assert shared == list(range(1, threads * (per_thread // 3) + 1))
    every = sorted(r for rs in results.values() for r in rs)
    assert len(every) == threads * per_thread
    assert sum(ops.sizes) == threads * per_thread + threads + 1
