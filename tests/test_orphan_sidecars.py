"""A sidecar whose segment is gone (SPEC 3.6, 8).

A retention pass deletes a dead segment's files one after another: the segment, then its
sidecar. A pass stopped between the two (killed, a power cut, or an I/O error on the
second deletion, which the pass logs and does not return) left the sidecar for good:
nothing read it, nothing deleted it, and the store's size (`stats`, `journal stats`)
counted it. A writable open deletes such sidecars now, with what else it finishes.
"""

from __future__ import annotations

import errno
from pathlib import Path

from journal import EventIn, Journal, RetentionPolicy
from journal._local.files import FileOps

_EVICT = RetentionPolicy(session_retention_ms=1)


class _SidecarsStay(FileOps):
    """Once `armed`, deleting a sidecar fails with EIO (the segment's deletion before it
    goes through)."""

    armed = False

    def unlink(self, path: str) -> None:
        if self.armed and path.endswith(".idx"):
            raise OSError(errno.EIO, "Input/output error", path)
        super().unlink(path)


def _sidecars(store: Path) -> set[str]:
    return {p.name for p in (store / "segments").glob("*.idx")}


def _segments(store: Path) -> set[str]:
    return {p.name[:20] for p in (store / "segments").glob("*.seg*")}


def test_a_writable_open_deletes_the_sidecars_of_segments_a_pass_deleted(
    tmp_path: Path,
) -> None:
    store = tmp_path / "s"
    ops = _SidecarsStay()
    with Journal.open(
        store, segment_bytes=4096, durability="os", retention=_EVICT, file_ops=ops
    ) as j:
        j.create_session("gone")
        for _ in range(8):
            j.append("gone", [EventIn("m", b"g" * 1500)])
        ended = j.resolve_session("gone").ended_at_ms
        assert ended is not None
        j.append("kept", [EventIn("m", b"k")], create=True)
        ops.armed = True
        report = j.apply_retention(now_ms=ended + 10)
        assert report.evicted_sessions == ["gone"] and report.deleted_segments
        orphans = {name[:20] for name in _sidecars(store)} - _segments(store)
        assert orphans, "the failed deletions left no sidecar behind"
    # A read-only journal changes nothing in the store.
    with Journal.open(store, readonly=True) as reader:
        assert [e.data for e in reader.replay("kept")] == [b"k"]
    assert {name[:20] for name in _sidecars(store)} - _segments(store) == orphans
    with Journal.open(store) as j:
        assert {name[:20] for name in _sidecars(store)} - _segments(store) == set()
        # The sidecars of the segments still there are kept.
        sealed = sorted(_segments(store))[:-1]
        assert sealed and {f"{base}.idx" for base in sealed} <= _sidecars(store)
        assert [e.data for e in j.replay("kept")] == [b"k"]
        assert j.verify().ok
