"""The staging steps of an import (SPEC 12.3) for the sessions' byte windows. A history
window trims a staging step whole (one frame on the local engine; on JetStream the events
marked with the step's first ordinal, several steps to an atomic batch: SPEC 8, 12.3), and
an archive does not record the source's appends: so the events a session's
byte window may still cut are staged in steps of at most 1/16 of the window's data or
64 KiB, the larger, and the window trims them as the source's appends, within that (until
2026-12-07 they were staged in steps of up to 4 MiB, and under a smaller window the first
append after an import trimmed every imported event at once; a window of 64 KiB or less
still trims them so).
"""

from __future__ import annotations

from array import array
from typing import Final

from .archive import ArchiveEvent, ArchiveSession

__all__ = ["MIN_STEP", "WINDOW_STEPS", "StagingWindows"]

# The steps a session's byte window's data is staged in, at least (an event larger than a
# step is one alone). The events before its last `max_history_bytes` of data (by its own
# window or else the store's), which the next pass trims, go in steps as large as usual.
# Each step is a commit on the local engine: 100 sessions of 1 MiB under a 1 MiB window,
# 1 KiB events, were imported in 0.7-1.0 s in steps of 4 MiB, 1.4-1.6 s with 16 steps a
# window, 3.4-4.4 s with 64 (durability "fsync", a busy machine). JetStream joins steps
# in its batches (the engine's `joins_staging_steps`): 201 batches under any window, 6 s
# (one server, sync always); a batch a step took 1,701 under a 1 MiB window, 33-44 s.
WINDOW_STEPS: Final = 16
# A step may hold `MIN_STEP` of data under any window: under a window of less than 1 MiB
# a step is that, not 1/16 of the window, so a session of up to 64 KiB within its window
# is one step, staged in a group with others (SPEC 12.3), and a session's steps over its
# window are at most 2 for each 64 KiB of its data there (two in a row hold more), plus
# one. Until 2026-12-07 steps were 1/16 of any window: 333 sessions of 16 KiB under a
# 64 KiB window were each staged alone in 4 steps (JetStream, see SPEC 12.3).
MIN_STEP: Final = 64 << 10


class StagingWindows:
    """Where the staging steps of each session's events end for its byte window
    (`WINDOW_STEPS`, `MIN_STEP`; the store's is `store_window`), given the data of each session's
    events (`data_bytes`, in archive order)."""

    def __init__(self, store_window: int | None, data_bytes: array[int]) -> None:
        self._store_window = store_window
        self._data_bytes = data_bytes
        self._from: int | None = None  # the data before the first event a window may cut
        self._step = self._before = 0  # (`_before`: the session's data before the next)
        self._fine: int | None = None  # the data of the step being built, when cut so

    def begin(self, index: int, meta: ArchiveSession) -> None:
        """Session `index` of the archive begins."""
        window = meta.max_history_bytes or self._store_window
        self._from = None if window is None else self._data_bytes[index] - window
        self._step = max(MIN_STEP, (window or 0) // WINDOW_STEPS)
        self._before, self._fine = 0, None

    def ends_before(self, event: ArchiveEvent, building: bool, ends: bool) -> bool:
        """Whether the step being built (`building`: it holds events) ends before `event`
        (`ends`: it does for another reason), which then joins it or begins the next."""
        data = len(event.data)
        fine = self._from is not None and self._before >= self._from
        self._before += data
        if fine and building and (self._fine is None or self._fine + data > self._step):
            ends = True
        if not fine:
            self._fine = None
        elif ends or not building or self._fine is None:
            self._fine = data
        else:
            self._fine += data
        return ends
