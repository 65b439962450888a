"""The zeros a segment writer writes ahead of its frames cost no buffer of their size
(SPEC 8, "Writer memory"): they are written from one shared block of zeros, a piece at a
time, never from a copy of a piece.

A copy of up to 1 MiB, made by whichever appending thread created a segment or
preallocated one, was freed at once, but it raised glibc's mmap threshold (a freed mmap'd
block of 1 MiB moves it there), so every later copy came from that thread's malloc arena,
which kept about 1.2 MiB free for good: with 16 appending threads, 12 to 15 MiB of RssAnon
(`benchmarks/memory.py`). Measured here with tracemalloc, which sees the copy.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

from journal._local.frames import FRAME_HEADER_SIZE
from journal._local.log import SegmentLog
from journal._local.writer import SegmentWriter
from journal._local.zerofill import INLINE_BYTES

STORE_ID = b"S" * 16
# What making or growing a segment may allocate at its peak (the zeros are MiBs).
PEAK_BYTES = 64 << 10


def _peak_of(action: Callable[[], object]) -> int:
    """Bytes traced at the peak of `action()` above what was traced before it."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        action()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_a_new_segments_zeros_are_not_copied(tmp_path: Path) -> None:
    # Born with 3.5 MiB of zeros: three whole pieces of 1 MiB and a part of one.
    log = SegmentLog(str(tmp_path), STORE_ID, segment_bytes=(7 << 20) // 2, sync=False)
    try:
        peak = _peak_of(log.start_first_segment)
    finally:
        log.close()
    assert peak < PEAK_BYTES, f"{peak} bytes allocated to make a segment"


def test_zeros_preallocated_by_an_append_are_not_copied(tmp_path: Path) -> None:
    # No filler (none given): an append past the zeros the segment was born with writes
    # the next ones itself, up to the segment's size, which ends with a part of a piece.
    size = (8 << 20) - 1000
    writer = SegmentWriter.create(str(tmp_path), STORE_ID, 1, sync=False, segment_bytes=size)
    try:
        frame = bytearray(FRAME_HEADER_SIZE + INLINE_BYTES)
        peak = _peak_of(lambda: writer.append_frame(frame, 1, 1, None))
        assert writer.end_offset > INLINE_BYTES
    finally:
        writer.close()
    assert peak < PEAK_BYTES, f"{peak} bytes allocated to preallocate zeros"
