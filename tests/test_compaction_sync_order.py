"""The order in which a compaction swap changes the segments directory (SPEC 8,
"Compaction"; SPEC 14.4, "Power cuts").

POSIX keeps no order between a directory's changes that were not synced: a power cut
may keep a later one without an earlier one. So the swap syncs the directory between
its steps: the old sidecar's deletion before the copy is renamed into place (else a
stale sidecar could stay beside the copy, and a view rebuilt from the sidecars would
index frames the copy dropped), and the rename before the plain file's deletion (else
the segment could be gone with its copy still a temporary file, which the next writer
deletes). Until 2026-12-06 one sync followed all three changes; the seal of a segment
with `compress_sealed` already synced between its rename and its deletion.
"""

from __future__ import annotations

import os
from pathlib import Path

from journal import EventIn, Journal
from journal._local.files import FileOps


class Changes(FileOps):
    """Records the directory changes and the syncs made through the seam, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def fsync(self, fd: int) -> None:
        self.seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        super().fsync(fd)

    def unlink(self, path: str) -> None:
        self.seen.append(("unlink", path))
        super().unlink(path)

    def replace(self, source: str, destination: str) -> None:
        self.seen.append(("replace", destination))
        super().replace(source, destination)


def test_a_swap_syncs_the_directory_between_its_changes(tmp_path: Path) -> None:
    store = tmp_path / "s"
    changes = Changes()
    with Journal.open(store, segment_bytes=16 << 10, file_ops=changes) as j:
        for n in range(40):
            j.append(f"s{n % 3}", [EventIn("m", os.urandom(1500))], create=True)
        directory = os.path.realpath(store / "segments")
        plain = sorted(n for n in os.listdir(directory) if n.endswith(".seg"))[:-1]
        assert len(plain) >= 2, plain  # sealed, not compressed: compaction compresses them
        changes.seen.clear()
        report = j.compact(dead_share=1.0)
    assert sorted(report.segments_rewritten) == [f"{name}.zst" for name in plain]
    seen = changes.seen
    for name in plain:
        sidecar = ("unlink", os.path.join(directory, name[:20] + ".idx"))
        rename = ("replace", os.path.join(directory, name + ".zst"))
        deletion = ("unlink", os.path.join(directory, name))
        first, second, third = seen.index(sidecar), seen.index(rename), seen.index(deletion)
        assert first < second < third, seen
        for start, end in ((first, second), (second, third), (third, len(seen))):
            assert ("fsync", directory) in seen[start + 1 : end], (name, start, end, seen)
