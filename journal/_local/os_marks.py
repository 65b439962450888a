"""Marks of the segments that a writer with durability "os" wrote (SPEC 3.3, "Who wrote
the active segment").

A writer with durability "fsync" syncs each frame as it commits it; one with "os" syncs
none, so after a power cut the disk may hold a later frame of the active segment and not
an earlier one. Damage before whole frames in an active segment that no "os" writer
wrote is therefore no power cut's: it is damage to the disk, and the frames after it
were acknowledged and durable. `verify(fix=True)` does not cut those
(`cut_tails.cut_at_damage`) unless the journal was opened with `repair="cut-durable"`.

The mark is an empty file, `segments/<base>.os`, made by an "os" writer before its first
frame in the segment and made durable first (the file and the directory synced), so it
is on disk before any frame that could need it. Once per segment and writer (the writer
remembers it): no commit after the first pays anything for it. Versions that kept no
marks pass over the file (they list segments by their own suffixes). It goes with its
segment: a retention pass deletes it with the segment's files, and a writer's open
deletes the marks of segments that are gone, as it does their sidecars. A segment
without a mark was written by "fsync" writers only, or by an "os" writer of a version
that kept none: both are refused by the fix, which says so (the safe reading: nothing
acknowledged is cut without the operator's word).
"""

from __future__ import annotations

import os
from typing import Final

from .files import FileOps, Permissions, fsync_dir
from .frames import segment_name

__all__ = ["MARK_SUFFIX", "mark_base", "mark_name", "mark_os_writer", "os_wrote"]

MARK_SUFFIX: Final = ".os"


def mark_name(base: int) -> str:
    """The mark's file name of segment `base`: `<20 digits>.os`."""
    return segment_name(base).partition(".")[0] + MARK_SUFFIX


def mark_base(name: str) -> int | None:
    """The base of the segment whose mark `name` is (None: not a mark's name)."""
    digits, suffix = name[:20], name[20:]
    return int(digits) if suffix == MARK_SUFFIX and digits.isdigit() else None


def os_wrote(directory: str, base: int) -> bool:
    """Whether a writer with durability "os" wrote frames of segment `base` (its mark is
    in the segments directory `directory`)."""
    return os.path.lexists(os.path.join(directory, mark_name(base)))


def mark_os_writer(directory: str, base: int, ops: FileOps, permissions: Permissions) -> None:
    """Make the mark of segment `base` durable (made, or found: a writer killed after
    making it may have synced neither it nor its directory entry), before a writer with
    durability "os" writes its first frame there."""
    path = os.path.join(directory, mark_name(base))
    ops.point("segments.mark_os", path)
    fd = permissions.open_or_create(path, os.O_RDONLY)
    try:
        ops.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(directory, ops)
