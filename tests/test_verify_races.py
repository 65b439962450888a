"""`verify()` while a compaction swaps a segment (SPEC 9): a run that finds a problem is
repeated under the segment-files lock before the problem is reported.

A compaction swap deletes the segment's sidecar, renames its copy into place and writes
the new sidecar, all under the segment-files lock. A verify run that began after the
rename and read the sidecar before it was written saw the same segment files before and
after (sidecars are not among them), so it reported "sidecar missing or bad" on a sound
store (found as a flaky verify beside a writer's expiry thread, 3 runs of 20)."""

from __future__ import annotations

import threading
from pathlib import Path

from journal import EventIn, Journal, RetentionPolicy, VerifyReport
from journal._local.files import FileOps

_POLICY = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)


class VerifyInTheSwap(FileOps):
    """Runs `verify()` on another thread once the compacted copy is in place and its
    sidecar is not written yet, and waits for it up to `wait_s` (the swap holds the
    segment-files lock meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.journal: Journal | None = None
        self.reports: list[VerifyReport] = []
        self.finished_in_the_swap: bool | None = None

    def point(self, name: str, detail: object = None) -> None:
        if name != "compaction.replaced" or self.journal is None:
            return
        journal, self.journal = self.journal, None
        thread = threading.Thread(target=lambda: self.reports.append(journal.verify()))
        thread.start()
        thread.join(1.0)
        self.finished_in_the_swap = not thread.is_alive()
        self.thread = thread


def test_a_verify_between_a_swaps_rename_and_its_sidecar_reports_nothing(
    tmp_path: Path,
) -> None:
    ops = VerifyInTheSwap()
    with Journal.open(
        tmp_path / "store", durability="os", segment_bytes=4096, retention=_POLICY, file_ops=ops
    ) as j:
        j.create_session("kept")
        j.create_session("gone")
        for n in range(12):
            j.append("kept" if n % 3 == 0 else "gone", [EventIn("m", b"x" * 600)])
        j.cancel_session("gone")
        j.compact_session("gone", 6, b"")
        ops.journal = j
        assert j.compact(0.0).segments_rewritten
        ops.thread.join(10)
        (report,) = ops.reports
        assert report.ok, report.problems
        assert ops.finished_in_the_swap is False  # (it waited for the lock)
