"""A committed retention pass whose deletion of the dead segments' files fails: the files
stay (logged) until a later pass, while the view already forgot them."""

from __future__ import annotations

from journal import EventIn, Journal, RetentionPolicy, RetentionReport
from journal._local.files import FileOps

# Ended sessions are evicted at once (passes run with `now_ms` past their end).
EVICT_AT_ONCE = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)


class KeepDeadFiles(FileOps):
    """Once `armed`, deleting dead segments' files fails with EIO (fault point
    `retention.delete`)."""

    armed = False

    def point(self, name: str, detail: object = None) -> None:
        if self.armed and name == "retention.delete":
            raise OSError(5, "Input/output error")


def evict_keeping_dead_files(j: Journal, ops: KeepDeadFiles) -> tuple[RetentionReport, int]:
    """Session "gone" (8 events of 1,500 bytes: whole 4 KiB segments) ended and evicted
    beside an open "kept" by a pass whose deletion of the dead files fails: its report,
    and when "gone" ended (the time of the pass is 10 ms after it)."""
    j.create_session("gone")
    for _ in range(8):
        j.append("gone", [EventIn("m", b"g" * 1500)])
    ended = j.resolve_session("gone").ended_at_ms
    assert ended is not None
    j.create_session("kept")
    j.append("kept", [EventIn("m", b"k")])
    ops.armed = True
    report = j.apply_retention(now_ms=ended + 10)
    assert report.evicted_sessions == ["gone"] and report.deleted_segments
    return report, ended
