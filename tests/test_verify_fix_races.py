"""`verify(fix=True)` while another process's retention pass deletes segment files (SPEC 8,
9). The pass deletes them after its commit, outside the writer lock the fix holds, so a
fix that listed the segments before the deletion meets files that are gone; a plain
`verify()` repeats such a run, and the fix must not fail on a sound store with
`StoreUnavailable` (No such file or directory) either. Found by
tests/test_maintenance_under_writers.py (a maintainer's fix beside writers' passes)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from _procs_retention import Child

from journal import EventIn, Journal
from journal._local.files import FileOps

SEGMENT_BYTES = 16 << 10


def _files_lock_free(store: Path) -> bool:
    """Whether nobody holds the segment-files lock (this process's fix included: flock
    locks of two descriptions of one file exclude each other)."""
    fd = os.open(store / "segments" / ".files.lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # (releases it)
    return True


class DeletionAtTheFirstRead(FileOps):
    """Once a `verify(fix=True)` is planned, its first read lets the paused retention
    pass of `other` delete its dead segments and, unless the segment-files lock keeps it
    from them, waits until it has."""

    def __init__(self, other: Child, store: Path) -> None:
        self.other = other
        self.store = store
        self.armed = False

    def point(self, name: str, detail: object = None) -> None:
        if name == "plan.operation" and type(detail).__name__ == "VerifyFix":
            self.armed = True

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        if self.armed:
            self.armed = False
            self.other.send("go")
            if _files_lock_free(self.store):
                assert self.other.next_line().startswith("deleted "), self.other.err()
        return super().pread(fd, length, offset)


def test_verify_fix_carries_on_when_another_process_deletes_segments_it_listed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s"
    with Journal.open(path, create=True, segment_bytes=SEGMENT_BYTES) as j:
        j.create_session("a")
        for _ in range(60):  # (several sealed segments)
            j.append("a", [EventIn("m", b"x" * 1000)])
        j.compact_session("a", 60, b"snap")  # (they hold nothing live now)
        j.append("b", [EventIn("m", b"kept")], create=True)
    other = Child("retention_paused", str(path), "retention.delete")
    try:
        assert other.next_line() == "ready", other.err()
        other.send("go")
        assert other.next_line() == "paused", other.err()  # (its pass committed)
        ops = DeletionAtTheFirstRead(other, path)
        with Journal.open(path, segment_bytes=SEGMENT_BYTES, file_ops=ops) as j:
            report = j.verify(fix=True)
            assert report.problems == []
            assert [e.data for e in j.replay("b")] == [b"kept"]
            assert j.verify().problems == []
        assert other.wait(60) == 0, other.err()  # (its deletion, after the fix if not before)
        with Journal.open(path, segment_bytes=SEGMENT_BYTES) as j:
            assert j.verify().problems == []
            assert [e.data for e in j.replay("b")] == [b"kept"]
    finally:
        other.kill()
