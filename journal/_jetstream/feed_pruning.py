"""The JetStream engine's pruning of its lifecycle feed (SPEC 16.2, 7.7): the feed entries
(`lc.<id>`) and claim (`in.<id>`) of a session evicted at least `FEED_KEEP_MS` ago leave
the stream, and the feed's floor, recorded on `j.<store>.ff`, rises to the highest
sequence pruned, so a lifecycle cursor below it expires as on the local engine.

A retention pass walks the feed in sequence order from where the passes before stopped
(`FeedFloor.examined`), takes the EVICTED entries stored at least `FEED_KEEP_MS` before
the servers' time now (the servers' clock on both sides: no host's clock judges), and
stops at the first younger one: every entry after the floor is then kept, and an operator
knows that a lifecycle cursor of a change less than `FEED_KEEP_MS` old always resumes.
Each batch is recorded first (the new floor, how far it looked, the sessions to purge:
a compare-and-set on the floor subject, since two processes' passes may race; the loser
reads the record again and goes on from it), then purged, then recorded done. A pass
stopped in between leaves its batch in the record (`pending`) and the next pass purges
it first: a crash there only makes cursors expire early, never skips an entry.

A session's entries are purged below its EVICTED entry, so an incarnation created (or
an import staged: its claim) after that eviction is kept; an import in flight has no
EVICTED entry after its claim, so its claim is never pruned. So is the heartbeat an owner
wrote after the eviction (it held the lease meanwhile: the eviction's purge took the
beats before its tombstone, a beat is written outside the compare-and-set), found by the
incarnation it names: an owner of an incarnation created since keeps its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

import msgspec

from ..errors import StoreUnavailable
from ..models import LifecycleEventType
from .client import ANOTHER_CAME_FIRST, ApiError
from .layout import ENCODER, HEARTBEAT_DECODER, PRUNED_FORMAT, FeedFloor
from .reads import StoreReader, decode_feed, decode_meta
from .server_clock import ServerClock, stored_ms

__all__ = ["FEED_KEEP_MS", "FeedPruner"]

# How long an evicted session's feed entries stay (SPEC 16.2): a day, whatever the
# retention policy, so that a watcher away for less than that resumes from its cursor.
FEED_KEEP_MS: Final = 24 * 3_600_000
# A pass examines at most this many feed entries and prunes at most this many sessions
# (a store with 100,000 evicted sessions is worked through over several passes), in
# batches of `_BATCH_SESSIONS` sessions a record; entries are read `_READ` at a time.
_PASS_ENTRIES: Final = 50_000
_PASS_SESSIONS: Final = 4_096
_BATCH_SESSIONS: Final = 512
_READ: Final = 1_000
# (Records written a pass at most: other passes' records coming first, again and again,
# end it; theirs went on meanwhile.)
_PASS_RECORDS: Final = 4 * _PASS_SESSIONS // _BATCH_SESSIONS + 16
_READ_BYTES: Final = 4 << 20
_EVICTED: Final = LifecycleEventType.EVICTED.value
_MARK_TRIES: Final = 100


class FeedPruner:
    """Prunes the lifecycle feed of one store (see the module docstring)."""

    def __init__(
        self, reader: StoreReader, point: Callable[[str, object], None], clock: ServerClock
    ) -> None:
        self._reader = reader
        self._clock = clock
        self._conn = reader.conn
        self._subjects = reader.subjects
        self._point = point
        self._marked = False  # (the store's format says its feed is pruned)

    async def prune(self, now_ms: int | None) -> int:
        """One bounded pass at time `now_ms` on the servers' clock (None: the servers'
        time now, measured by this pass: the engine's clock, asked once); how many
        sessions it pruned."""
        now = await self._clock.now_ms(fresh=True) if now_ms is None else now_ms
        pruned = examined = 0
        for _ in range(_PASS_RECORDS):
            if pruned >= _PASS_SESSIONS or examined >= _PASS_ENTRIES:
                break
            record, seq = await self._reader.feed_record()
            if record.pending:
                # (A pass stopped between its record and its purges, or runs now.)
                await self._purge(record.pending)
                await self._record(msgspec.structs.replace(record, pending=[]), seq)
                continue
            batch, reach, count, young = await self._choose(
                record.examined, now, _PASS_ENTRIES - examined
            )
            examined += count
            if reach == record.examined:
                break
            floor = max(record.floor, *(evicted for _, evicted in batch), 0)
            written = await self._record(FeedFloor(floor, reach, batch), seq)
            if written is None:
                continue  # (another pass recorded first: go on from its record)
            if batch:
                self._point("feed.floor_recorded", floor)
                await self._purge(batch)
                pruned += len(batch)
                await self._record(FeedFloor(floor, reach, []), written)
            if young:
                break
        return pruned

    async def _choose(
        self, examined: int, now_ms: int, most: int
    ) -> tuple[list[tuple[str, int]], int, int, bool]:
        """The sessions to prune after `examined` (token, its EVICTED entry's sequence),
        how far that decides (every EVICTED entry up to it is taken), how many entries
        were read, and whether it stopped at an eviction younger than `FEED_KEEP_MS`."""
        batch: list[tuple[str, int]] = []
        reach, count = examined, 0
        horizon = now_ms - FEED_KEEP_MS
        while count < most and len(batch) < _BATCH_SESSIONS:
            found, _ = await self._conn.direct(
                {
                    "seq": reach + 1,
                    "next_by_subj": self._subjects.feed,
                    "batch": min(_READ, most - count),
                    "max_bytes": _READ_BYTES,
                }
            )
            if not found:
                break
            for message in found:
                count += 1
                entry = decode_feed(message)
                if entry.event_type == _EVICTED:
                    # (The time the server stored it, not the writer's clock in it: a
                    # writer a day behind made fresh evictions look old.)
                    if stored_ms(message) > horizon:
                        return batch, reach, count, True
                    token = message.subject.rsplit(".", 1)[1]
                    batch.append((token, message.seq))
                reach = message.seq
                if len(batch) == _BATCH_SESSIONS or count == most:
                    break
        return batch, reach, count, False

    async def _purge(self, sessions: list[tuple[str, int]]) -> None:
        """Purge each session's feed entries and claim up to its EVICTED entry."""
        if not self._marked:
            await self._mark_pruned()
            self._marked = True
        for token, evicted in sessions:
            await self._reader.purge(self._subjects.feed_and_claim(token), evicted + 1)
        await self._purge_late_beats(sessions)

    async def _purge_late_beats(self, sessions: list[tuple[str, int]]) -> None:
        """Purge each session's heartbeat written by an owner of the evicted incarnation
        (or an earlier one) after the eviction, up to that beat: a later one (an owner of
        an incarnation created since) is kept. Until 2026-12-06 such beats stayed for
        good, one message a session evicted while its owner held it (a soak)."""
        evicted_at = {self._subjects.heartbeat(token): evicted for token, evicted in sessions}
        found = await self._reader.last_messages(sorted(evicted_at))
        for subject, message in found.items():
            try:
                beat = HEARTBEAT_DECODER.decode(message.data)
            except msgspec.DecodeError:
                continue  # (not an owner's beat: left as it is)
            if beat.incarnation < evicted_at[subject]:
                await self._reader.purge(subject, message.seq + 1)

    async def _mark_pruned(self) -> None:
        """Give the store's identity record `PRUNED_FORMAT` before anything is purged: a
        release that reads format 1 only (it knows no floor, and would resume a lifecycle
        cursor past the pruned entries without a word) then refuses to open the store."""
        for _ in range(_MARK_TRIES):
            message = await self._conn.msg_get({"last_by_subj": self._subjects.meta})
            if message is None:
                raise StoreUnavailable("the store's identity record is gone: nothing pruned")
            meta = decode_meta(message)  # (JournalCorrupt naming it, if it no longer decodes)
            if meta.format >= PRUNED_FORMAT:
                return
            marked = msgspec.structs.replace(meta, format=PRUNED_FORMAT)
            if await self._replace(self._subjects.meta, marked, message.seq) is not None:
                return
            await asyncio.sleep(0.01)  # (another process marked it, or is marking it)
        raise StoreUnavailable(
            "the store's format could not be marked as holding a pruned lifecycle feed "
            "(its identity record kept changing): nothing pruned; apply retention again"
        )

    async def _record(self, record: FeedFloor, seq: int) -> int | None:
        """Record `record` on the floor subject if its last sequence is still `seq`; the
        new sequence, None when another record came first."""
        return await self._replace(self._subjects.feed_floor, record, seq)

    async def _replace(self, subject: str, record: object, seq: int) -> int | None:
        """Roll `subject` up to `record` if its last sequence is still `seq`; the new
        sequence, None when another message came first."""
        headers = {"Nats-Rollup": "sub", "Nats-Expected-Last-Subject-Sequence": str(seq)}
        try:
            return await self._conn.publish(subject, ENCODER.encode(record), headers)
        except ApiError as e:
            if e.err_code in ANOTHER_CAME_FIRST:
                return None
            raise
