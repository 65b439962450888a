"""`verify()` compares the view's head with a rebuild of the log as of that head (SPEC 9).

`compact()` may seal the active segment and then compact it, dropping its dead frames at
the end too; the view's head is then at the start of the new, empty active segment, past
positions no frame holds any more. The rebuild stopped before any segment starting at or
after the head's next position, that one included, and ended in the compacted segment:
verify reported "head Head(segment=15, ...) but the log ends Head(segment=1, ...)" on a
sound store until the next append (found while testing verify beside compactions: 39 of
90 verifies of one test's store)."""

from __future__ import annotations

import time
from pathlib import Path

from journal import EventIn, Journal, RetentionPolicy

_AN_HOUR = RetentionPolicy(max_history_bytes=None, session_retention_ms=3_600_000)


def test_verify_after_compaction_dropped_the_sealed_segments_last_frames_is_ok(
    tmp_path: Path,
) -> None:
    with Journal.open(
        tmp_path / "store", durability="os", segment_bytes=8192, retention=_AN_HOUR
    ) as j:
        j.create_session("kept")
        j.append("kept", [EventIn("m", b"k")])
        j.create_session("gone")
        for _ in range(9):
            j.append("gone", [EventIn("m", b"x" * 600)])  # (half the segment, dead later)
        j.resolve_session("gone")
        later = time.time_ns() // 1_000_000 + 7_200_000
        assert j.apply_retention(now_ms=later).evicted_sessions == ["gone"]
        j.compact(0.0)  # (seals the active segment, compacts it: the eviction stays)
        j.compact(0.0)  # (its tombstone forgotten, the eviction record goes too)
        segments = sorted(p.name for p in (tmp_path / "store" / "segments").glob("*.seg*"))
        assert segments == ["00000000000000000001.seg.zst", "00000000000000000015.seg"]
        assert j.verify().ok, j.verify().problems
        j.append("kept", [EventIn("m", b"k")])
        assert j.verify().ok, j.verify().problems
        assert [e.data for e in j.replay("kept")] == [b"k", b"k"]
