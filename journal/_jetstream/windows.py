"""A session's history windows on JetStream (SPEC 8, 16): the first ordinal its byte and
age windows keep (an append is never cut; the newest is kept whatever its size), the
trim of its history to it, and the purge of the events and idempotency markers below a
trim or a snapshot, after its commit. `HistoryWindows` is the base of the planning
`Writer` (`writes.py`), whose appends and retention passes trim."""

from __future__ import annotations

import msgspec

from ..sessions import SessionRow
from .commit import Committer, Plan, done
from .layout import StoredEvent, Subjects
from .reads import RowState

__all__ = ["HistoryWindows", "without_dead_checkpoint"]

# An event read on the way, and its sequence (None: none).
_Read = tuple[int, StoredEvent] | None


class HistoryWindows(Committer):
    """Where a session's history windows start, and the trims to them (see the module
    docstring)."""

    async def purge_trimmed(self, token: str, keep_from: int) -> None:
        """After a trim or compaction committed: the session's events below `keep_from`
        (the sequence of its first retained event) and the idempotency markers of the
        appends trimmed with them, whose keys are forgotten (SPEC section 8). A marker
        follows its append's events in their batch, and a window never splits an
        append, so a marker below `keep_from` is a trimmed append's. (Until 2026-12-05
        only the events were purged: a long-lived session's markers stayed in the stream
        until its eviction, one a keyed append, whatever its windows: a soak.)"""
        await self.reader.purge_or_leave(self.subjects.events(token), keep_from)
        await self.reader.purge_or_leave(self.subjects.markers(token), keep_from)

    async def cut_at(
        self, row: SessionRow, token: str, first: int, at: _Read = None
    ) -> tuple[int, int]:
        """(retained bytes, sequence to purge the events below) for a history starting at
        ordinal `first` (`at`: the event there and its sequence, when read already)."""
        if first > row.last_ordinal:
            return 0, row.last_event_position + 1
        if first <= row.first_ordinal:
            return row.retained_bytes, 0
        if at is not None and at[1].ordinal == first:
            return row.appended_bytes - at[1].bytes_before, at[0]
        seq = await self.reader.seq_of(row, token, first)
        if seq is None:
            return row.retained_bytes, 0
        probe = await self.reader.first_event_at(token, seq)
        if probe is None:
            return row.retained_bytes, 0
        return row.appended_bytes - probe[1].bytes_before, seq

    async def trim_to_window(self, session_id: str, now: int) -> bool:
        cut: list[int] = []

        async def plan(state: RowState, _now: int) -> Plan:
            row = state.row
            if row is None:
                return done(False)
            first, at = await self._window_start(row, state.token, now)
            if first <= row.first_ordinal:
                return done(False)
            retained, keep_from = await self.cut_at(row, state.token, first, at)
            cut[:] = [keep_from]
            new = without_dead_checkpoint(
                msgspec.structs.replace(row, first_ordinal=first, retained_bytes=retained)
            )
            return Plan([self.row_message(state, new)], new, lambda _seq: True)

        trimmed: bool = await self.write(session_id, plan, expire_first=False)
        if trimmed and cut and cut[0]:
            await self.purge_trimmed(Subjects.token(session_id), cut[0])
        return trimmed

    async def _window_start(self, row: SessionRow, token: str, now: int) -> tuple[int, _Read]:
        """The first ordinal the history windows keep (an append is never cut, and the
        newest one is kept whatever its size), as the local engine's `window_start`; and
        the event at it with its sequence when it was read on the way (for `_cut_at`)."""
        limit_bytes = row.max_history_bytes or self.policy.max_history_bytes
        limit_age = row.max_history_age_ms or self.policy.max_history_age_ms
        over_bytes = limit_bytes is not None and row.retained_bytes > limit_bytes
        kept: tuple[int, _Read] = (row.first_ordinal, None)
        if row.last_ordinal < row.first_ordinal:
            return kept
        if over_bytes and limit_bytes is not None:
            floor = row.appended_bytes - limit_bytes
            probe = await self.reader.event_where(
                row, token, lambda e: e.batch_bytes_before >= floor
            )
            if probe is None:  # the newest append is kept
                probe = await self.reader.first_event_at(token, row.last_event_position)
            if probe is not None:
                kept = _later(kept, _batch_of(row, probe))
        if limit_age is not None:
            kept = _later(kept, await self._age_window_start(row, token, now - limit_age))
        return kept

    async def _age_window_start(
        self, row: SessionRow, token: str, horizon: int
    ) -> tuple[int, _Read]:
        """The first ordinal an age window keeps (SPEC 8): the first of the batch holding
        the session's first event, in ordinal order, committed at `horizon` or later;
        past the newest when none is. Commit times follow the wall clock, which may step
        back, so they grow only from the row's `stamped_in_order_from` on: the events
        before it are read in order (those the pass trims, and the first one kept), the
        ones after it bisected. The common case reads one event: the first retained one,
        within the window (nothing leaves), or older than it with the row's newest time
        too (all leave). Until 2026-12-05 the newest event older than the window trimmed
        every event, and a bisection over the whole history took its times to grow."""
        first, last = row.first_ordinal, row.last_ordinal
        if last < first:
            return first, None
        probe = await self.reader.first_event_at(token, row.incarnation)
        if probe is not None and probe[1].ordinal < first:  # (left by a purge that failed)
            seq = await self.reader.seq_of(row, token, first)
            probe = None if seq is None else await self.reader.first_event_at(token, seq)
        if probe is None or probe[1].ordinal != first:
            # (Trimmed meanwhile by another process, whose commit refuses this plan's, or
            # missing: nothing leaves by age.)
            return first, None
        if probe[1].timestamp_ms >= horizon:
            return first, probe
        lo = probe[0] + 1
        # (A row an older release wrote does not say: all its events are read in order.)
        in_order_from = row.stamped_in_order_from if row.last_event_ms else last + 1
        if in_order_from > first + 1:
            scanned = await self.reader.scan_events(
                token,
                lo,
                first + 1,
                min(in_order_from, last + 1),
                row.last_event_position,
                lambda e: e.timestamp_ms >= horizon,
            )
            if scanned is None:
                return first, None
            lo, within = scanned
            if within is not None:
                return _batch_of(row, (lo, within))
        start = max(first + 1, in_order_from)
        if start > last or row.last_event_ms < horizon:
            return last + 1, None  # (none within the window)
        found = await self.reader.event_where(
            row, token, lambda e: e.ordinal >= start and e.timestamp_ms >= horizon, lo
        )
        return (first, None) if found is None else _batch_of(row, found)


def _batch_of(row: SessionRow, read: tuple[int, StoredEvent]) -> tuple[int, _Read]:
    """The first ordinal of the batch holding the event `read` (not below the row's
    first), with that event when it is the one there."""
    first = max(row.first_ordinal, read[1].batch_first)
    return first, read if read[1].ordinal == first else None


def _later(a: tuple[int, _Read], b: tuple[int, _Read]) -> tuple[int, _Read]:
    """The later of two first ordinals kept, and the event read at it (either's)."""
    if a[0] != b[0]:
        return max(a, b, key=lambda kept: kept[0])
    return a[0], a[1] or b[1]


def without_dead_checkpoint(row: SessionRow) -> SessionRow:
    """The row without its checkpoint once history below it left (the events after it
    are gone: it can never be used again), as the local engine's projection does."""
    if row.checkpoint_position and row.checkpoint_ordinal < row.first_ordinal - 1:
        row.checkpoint_ordinal = row.checkpoint_position = 0
    return row
