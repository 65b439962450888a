"""The JetStream engine's pruning of its lifecycle feed (SPEC 16.2, 7.7): the feed entries
(`lc.<id>`) and claim (`in.<id>`) of a session evicted at least `FEED_KEEP_MS` ago leave
the stream, and the feed's floor, recorded on `j.<store>.ff`, rises to the highest
sequence pruned, so a lifecycle cursor below it expires as on the local engine.

A retention pass walks the feed in sequence order from where the passes before stopped
(`FeedFloor.examined`), through the entries stored at least `FEED_KEEP_MS` before the
servers' time now (the servers' clock on both sides: no host's clock judges), takes the
EVICTED ones, and stops at the first younger entry: every entry after the floor is then
kept, and an operator knows that a lifecycle cursor of a change less than `FEED_KEEP_MS`
old always resumes.
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

A session that lives on (suspended and resumed between turns for months) would add an
entry with each change for as long as it lives: a walked entry of a live session (any
but its CREATED or EVICTED one) supersedes the session's entries before it, and those
leave the stream (one delete each: the CREATED entry below them is the incarnation, which
names the session's id, so no purge of the subject below them can be used), as the local
engine drops a live session's transitions but its creation and latest one with their
records. The newest walked entry stays until a later one is walked: a pass looks up what
an earlier pass left of the session below the first entry it walks (its newest then, or
the entries of a batch recorded and not yet deleted when that pass stopped). Only
entries before the first one stored less than `FEED_KEEP_MS` ago are walked, so a change
less than a day old is never pruned, nor is anything after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

import msgspec

from ..errors import StoreUnavailable
from ..models import LifecycleEventType
from .client import ANOTHER_CAME_FIRST, ApiError, Found
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
_CREATED: Final = LifecycleEventType.CREATED.value
# A batch also ends once it holds this many superseded entries of live sessions to delete
# and sessions to look up below its walk (one request each).
_BATCH_CHANGES: Final = 1_024
# JetStream's answer to a delete of a message not there (another pass's delete, or a
# purge, came first): "no message found" (other failures of a delete share the code).
_DELETE_FAILED: Final = 10057
_DELETES_AT_ONCE: Final = 32
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
            walk = await self._choose(record.examined, now, _PASS_ENTRIES - examined)
            examined += walk.count
            if walk.reach == record.examined:
                break
            batch, superseded = walk.batch, walk.superseded
            floor = max(record.floor, *(evicted for _, evicted in batch), *superseded, 0)
            written = await self._record(FeedFloor(floor, walk.reach, batch), seq)
            if written is None:
                continue  # (another pass recorded first: go on from its record)
            if batch or superseded:
                self._point("feed.floor_recorded", floor)
            if batch:
                await self._purge(batch)
                pruned += len(batch)
            # (Not recorded as pending: a pass stopped before these deletes leaves them
            # below the floor, never read, until a later pass walks a later entry of the
            # session and looks below it, or the session's eviction purges them.)
            await self._delete(superseded)
            if batch:
                await self._record(FeedFloor(floor, walk.reach, []), written)
            if walk.young:
                break
        return pruned

    async def _choose(self, examined: int, now_ms: int, most: int) -> _Walk:
        """A walk of at most `most` entries after `examined`, stopped at the first one
        stored less than `FEED_KEEP_MS` before `now_ms`: the sessions to prune (token, its
        EVICTED entry's sequence) and the live sessions' superseded entries (the module
        docstring)."""
        walk = _Walk(examined)
        horizon = now_ms - FEED_KEEP_MS
        changes = 0
        while walk.count < most and len(walk.batch) < _BATCH_SESSIONS and changes < _BATCH_CHANGES:
            found, _ = await self._conn.direct(
                {
                    "seq": walk.reach + 1,
                    "next_by_subj": self._subjects.feed,
                    "batch": min(_READ, most - walk.count),
                    "max_bytes": _READ_BYTES,
                }
            )
            if not found:
                break
            for message in found:
                # (The time the server stored it, not the writer's clock in it: a writer
                # a day behind made fresh evictions look old.)
                if stored_ms(message) > horizon:
                    walk.young = True
                    break
                walk.count += 1
                changes += walk.take(message)
                walk.reach = message.seq
                if len(walk.batch) == _BATCH_SESSIONS or walk.count == most:
                    break
                if changes >= _BATCH_CHANGES:
                    break
            if walk.young:
                break
        walk.superseded = walk.superseded_walked()
        for (token, incarnation), below in walk.first.items():
            walk.superseded += await self._left_below(token, incarnation, below)
        walk.superseded.sort()
        return walk

    async def _left_below(self, token: str, incarnation: int, below: int) -> list[int]:
        """The entries of the session's `incarnation` below sequence `below` but its
        CREATED one: what an earlier pass kept (its newest entry then) or recorded and did
        not delete (it stopped first)."""
        left: list[int] = []
        seq = incarnation + 1
        while seq < below:
            found, _ = await self._conn.direct(
                {
                    "seq": seq,
                    "next_by_subj": self._subjects.lifecycle(token),
                    "batch": 16,
                    "max_bytes": _READ_BYTES,
                }
            )
            for message in found:
                if message.seq >= below:
                    return left
                entry = decode_feed(message)
                if entry.event_type != _CREATED and entry.row.incarnation == incarnation:
                    left.append(message.seq)
                seq = message.seq + 1
            if not found:
                break
        return left

    async def _delete(self, sequences: list[int]) -> None:
        """Delete each superseded entry, `_DELETES_AT_ONCE` requests at a time (one by
        one, 1,000 took 1.5 s). The store is marked first, as for a purge."""
        if sequences:
            await self._ensure_marked()
        for start in range(0, len(sequences), _DELETES_AT_ONCE):
            chunk = sequences[start : start + _DELETES_AT_ONCE]
            done = await asyncio.gather(*map(self._delete_one, chunk), return_exceptions=True)
            for failed in done:
                if isinstance(failed, BaseException):
                    raise failed

    async def _delete_one(self, seq: int) -> None:
        """Delete one superseded entry (one not there any more was deleted first by
        another pass, or purged with its session). A refusal fails the pass with
        `StoreUnavailable` as a refused purge does."""
        try:
            self._point("store.delete", seq)
            await self._conn.api(
                f"$JS.API.STREAM.MSG.DELETE.{self._conn.stream}", {"seq": seq, "no_erase": True}
            )
        except ApiError as e:
            if e.err_code == _DELETE_FAILED and "no message found" in e.description:
                return
            advice = (
                "the stream has no leader now (a failover?): apply retention again shortly"
                if e.transient
                else f"check stream {self._conn.stream} (`nats stream info`) and the "
                "account's JetStream permissions, then apply retention again"
            )
            raise StoreUnavailable(
                "JetStream refused to delete the superseded lifecycle feed entry at "
                f"sequence {seq} ({e.description}, error {e.err_code}): {advice}"
            ) from None

    async def _ensure_marked(self) -> None:
        if not self._marked:
            await self._mark_pruned()
            self._marked = True

    async def _purge(self, sessions: list[tuple[str, int]]) -> None:
        """Purge each session's feed entries and claim up to its EVICTED entry."""
        await self._ensure_marked()
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


class _Walk:
    """What one walk of the feed found (`FeedPruner._choose`): how far it decided
    (`reach`), how many entries it read, whether it stopped at a young one; the sessions
    to prune and the superseded entries of live ones to delete."""

    def __init__(self, examined: int) -> None:
        self.reach = examined
        self.count = 0
        self.young = False
        self.batch: list[tuple[str, int]] = []
        self.superseded: list[int] = []
        # Per session (token, incarnation): its newest entry walked but its CREATED and
        # EVICTED ones, and the entries walked before it; the first entry walked of a
        # session whose CREATED entry was not (`_left_below` looks below it).
        self._newest: dict[tuple[str, int], int] = {}
        self._before: dict[tuple[str, int], list[int]] = {}
        self._created: set[tuple[str, int]] = set()
        self.first: dict[tuple[str, int], int] = {}

    def take(self, message: Found) -> int:
        """Walk one entry; how many deletes and look-ups it adds."""
        entry = decode_feed(message)
        token = message.subject.rsplit(".", 1)[1]
        key = token, entry.row.incarnation
        if entry.event_type == _EVICTED:
            # (Its purge takes every entry of the session below it.)
            self.batch.append((token, message.seq))
            self._newest.pop(key, None)
            looked = 0 if self.first.pop(key, None) is None else 1
            return -len(self._before.pop(key, [])) - looked
        if entry.event_type == _CREATED:
            self._created.add(key)
            return 0
        previous = self._newest.get(key)
        self._newest[key] = message.seq
        if previous is not None:
            self._before.setdefault(key, []).append(previous)
            return 1
        if key not in self._created:
            self.first[key] = message.seq
            return 1
        return 0

    def superseded_walked(self) -> list[int]:
        """The walked entries of live sessions that a later walked entry of theirs
        superseded (those of a session evicted in the walk left out: its purge takes
        them)."""
        return [seq for seqs in self._before.values() for seq in seqs]
