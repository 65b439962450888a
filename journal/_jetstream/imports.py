"""Imports on the JetStream engine (SPEC 12.3 and 16.5): `StageSessions`, `StageEvents`,
`CommitImport` and `AbortImport`, coroutines on the connection's loop.

A session is staged under the id it will take, in atomic batches that each end with its
*staged row* (`SessionRow.staged`), written with the compare-and-set on the row subject
as every commit is. Its first batch begins with its *claim* (`j.<store>.in.<id>`, kept
for good like the lifecycle feed): the claim's sequence is the session's incarnation, so
its events lie above it as any session's lie above its creation, and `session_id_of`
finds its id. The first batch also holds the snapshot, the checkpoint and the first
events; later batches hold more events (at most 999 messages and 4 MiB of events each).
Each event records where its staging step began (its first ordinal and the data before
it: what a history window trims by), so one operation's steps share batches
(`StageEvents.steps`, `StagedSession.steps`).
Readers take a staged row for no row (`reads.decode_row`): listings, gets, reads,
watches, expiry, retention and verify see nothing of it, and nothing is written to the
lifecycle feed before the commit. A writer that creates the id meanwhile writes over the
staged row (it reads as no row), and the import's next batch or its commit is then
refused: `SessionExists`, and the import is rolled back. A rollback replaces the staged
row with a tombstone (compare-and-set) before it purges: a commit whose wait a Ctrl+C
cancelled may still land, and one that lands first keeps its sessions; a staging batch
that lands first is rolled back in turn, and a first batch not known to be stored is
fenced off by a tombstone with its compare-and-set.

The commit is one atomic batch: for each session its CREATED feed entry, its state's
entry when it is not open, and its visible row with the compare-and-set on its staged
row; so every session becomes visible at once, or none does. A batch holds 1,000
messages: an import takes at most `MAX_IMPORT_SESSIONS` sessions (3 messages each), and
the check pass refuses an archive of more before anything is written
(`transfer.import_sessions`, the engine's `max_import_sessions`). A commit left without
an answer is rolled back at once: `StoreUnavailable` when that fenced it (nothing was
imported), else `WriteOutcomeUnknown` (`_fenced`).

Each staged row records its importer as an owner lease records its holder (pid, start
time, host, boot id), and names the importer's heartbeat (`IMPORTER_HEADER`): an engine
beats every second while it has sessions staged, as an owner does. A staged row whose
importer is dead (judged as owners are: SPEC 16.5, owner liveness) is rolled back by the
next import of its id and by every retention pass: a tombstone with the compare-and-set
on the staged row first, so an importer only late to beat whose commit lands first keeps
its sessions (and one whose commit comes after is refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec

from ..archive import ArchiveEvent
from ..engine import AbortImport, CommitImport, StagedSession, StageEvents, StageSessions
from ..errors import (
    InvalidArgument,
    JournalError,
    SessionExists,
    SessionNotFound,
    StoreUnavailable,
    WriteOutcomeUnknown,
)
from ..models import LifecycleEventType, SessionState
from ..sessions import FeedEntry, SessionRow, lifecycle_event_of
from .client import WRITE_TOKEN, ApiError, BatchMessage, Found, Unavailable, asked_again
from .import_batches import WRITE_S as _WRITE_S
from .import_batches import WRONG_LAST_SEQUENCE as _WRONG_LAST_SEQUENCE
from .import_batches import send_batch
from .import_beats import ImporterBeat, beat_session
from .layout import (
    ENCODER,
    StoredEvent,
    StoredFeed,
    StoredSnapshot,
    Subjects,
    resolve,
    stamps_recorded,
)
from .owners import LEASE_S
from .reads import StoreReader, decode_feed, stored_row
from .server_clock import ServerClock

__all__ = ["MAX_IMPORT_SESSIONS", "Imports"]

# One atomic batch makes an import visible: 1,000 messages, 3 a session at most (its
# CREATED entry, its state's entry, its row).
MAX_IMPORT_SESSIONS: Final = 333
_BATCH: Final = 1000
_BATCH_BYTES: Final = 4 << 20
# Headers of staging messages: the staged session's token (on its claim and its staged
# rows), and the heartbeat id of the importing engine (on its staged rows).
STAGE_HEADER: Final = "Journal-Stage"
IMPORTER_HEADER: Final = "Journal-Importer"
# On a rollback's tombstone: the claim's sequence, deleted by whoever finds the tombstone
# (its own rollback first, else the next retention pass or import of the id).
CLAIM_HEADER: Final = "Journal-Claim"
_ROLL_BACK_TRIES: Final = 5

# This process's staged incarnations, per store id, across its journals, and how many
# first batches (whose incarnation is not known yet) are in flight: a staged row naming
# this process is alive while it is here.
_LOCK: Final = threading.Lock()
_STAGING: Final[set[tuple[bytes, int]]] = set()
_IN_FLIGHT: Final[dict[bytes, int]] = {}

Alive = Callable[[SessionRow, int], Awaitable[bool | None]]
Committed = Callable[[int, SessionRow | None, int], None]


class _Staged:
    """One session this engine staged: its row (None until its first batch landed) and
    that row message's sequence (the next batch's compare-and-set)."""

    __slots__ = ("row", "sent", "seq", "session_id", "stamp", "token")

    def __init__(self, session_id: str, seq: int) -> None:
        self.session_id = session_id
        self.token = Subjects.token(session_id)
        self.stamp = uuid.uuid4().hex
        self.seq = seq
        self.row: SessionRow | None = None
        self.sent = False  # (a first batch was sent: it may land, the rollback fences it)


class Imports:
    """The import operations of one engine (see the module docstring)."""

    def __init__(
        self,
        reader: StoreReader,
        store_id: bytes,
        importer: tuple[int, int, str, str],
        owner_alive: Alive,
        committed: Committed,
        heartbeat_s: float,
        point: Callable[[str, object], None],
        clock: ServerClock,
    ) -> None:
        self._conn = reader.conn
        self._clock = clock  # (the times recorded: the servers'; the beats' are judged so)
        self._reader = reader
        self._subjects = reader.subjects
        self._store_id = store_id
        self._pid, self._start_time, self._host, self._boot = importer
        self._owner_alive = owner_alive
        self._committed = committed
        self._point = point  # the engine's fault points (SPEC 1.3)
        self._staged: dict[int, _Staged] = {}
        self._fences: dict[int, asyncio.Future[int]] = {}  # (`_fenced`)
        self._in_flight = 0
        busy = lambda: bool(self._staged or self._in_flight)  # noqa: E731
        self._beats = ImporterBeat(reader, self._pid, self._host, heartbeat_s, busy)

    async def submit(self, operation: Any) -> Any:
        match operation:
            case StageSessions():
                return await self._stage_sessions(operation)
            case StageEvents():
                entry = self._staged.get(operation.incarnation)
                if entry is None or entry.row is None:
                    raise SessionNotFound(
                        f"no import in progress at incarnation {operation.incarnation}"
                    )
                row = await self._write(entry, entry.row, [], operation.events, operation.steps)
                return row.last_ordinal
            case CommitImport():
                return await self._commit(operation)
            case AbortImport():
                return await self._abort(operation.incarnations)
        raise TypeError(f"not an import operation: {type(operation).__name__}")

    # -- staging ---------------------------------------------------------------------------

    async def _stage_sessions(self, op: StageSessions) -> list[SessionRow]:
        begun: list[_Staged] = []
        try:
            rows = []
            for item in op.sessions:
                rows.append(await self._begin(item, op.source_store, op.exported_at_ms, begun))
            return rows
        except BaseException as error:
            # (The caller knows none of these incarnations: they are rolled back here;
            # asked once after an outage the staging waited out already.)
            window = 0.0 if isinstance(error, StoreUnavailable) else _WRITE_S
            with contextlib.suppress(Exception):
                await self._roll_back_all(begun, window)
            raise

    async def _begin(
        self, item: StagedSession, source_store: str, exported_at_ms: int, begun: list[_Staged]
    ) -> SessionRow:
        meta = item.session
        session_id = item.target or meta.session_id
        entry = _Staged(session_id, 0)
        # (Asked again as a write's reads are, SPEC 16.3: one request waits only 5 s.)
        entry.seq = await asked_again(lambda: self._free(entry))
        begun.append(entry)
        now = await asked_again(self._clock.now_ms)  # (its first measurement asks)
        row = SessionRow(
            session_id=session_id,
            incarnation=0,
            state=SessionState.OPEN.wire,
            mode=meta.mode,
            context_id=meta.context_id,
            tags=dict(meta.tags),
            extensions=dict(meta.extensions),
            created_at_ms=meta.created_at_ms,
            ended_at_ms=None,
            first_ordinal=meta.first_ordinal,
            last_ordinal=meta.first_ordinal - 1,
            ttl_ms=meta.ttl_ms,
            max_suspend_ms=meta.max_suspend_ms,
            suspended_at_ms=None,
            lifecycle_position=0,
            max_history_bytes=meta.max_history_bytes,
            max_history_age_ms=meta.max_history_age_ms,
            owner_pid=self._pid,
            owner_start_time=self._start_time,
            owner_host=self._host,
            owner_boot_id=self._boot,
            owner_since_ms=now,
            turn_request_id=meta.turn_request_id,
            staged=True,
            imported_store=source_store,
            imported_exported_at_ms=exported_at_ms,
        )
        token = entry.token
        stamp = {STAGE_HEADER: entry.stamp}
        prefix: list[tuple[BatchMessage, tuple[str, ...]]] = [
            ((self._subjects.claim(token), entry.stamp.encode(), stamp), ("incarnation",))
        ]
        rollup = {"Nats-Rollup": "sub"}
        # (A stored snapshot's incarnation is not read: 0, the claim's not known yet.)
        if item.snapshot is not None:
            through = item.snapshot.through_ordinal
            stored = StoredSnapshot(0, through, now, item.snapshot.data)
            row.snapshot_ordinal = through
            subject = self._subjects.snapshot(token)
            prefix.append(((subject, ENCODER.encode(stored), rollup), ("snapshot_position",)))
        if item.checkpoint is not None:
            through = item.checkpoint.through_ordinal
            stored = StoredSnapshot(0, through, now, item.checkpoint.data)
            row.checkpoint_ordinal = through
            subject = self._subjects.checkpoint(token)
            prefix.append(((subject, ENCODER.encode(stored), rollup), ("checkpoint_position",)))
        self._started(1)
        try:
            row = await self._write(entry, row, prefix, item.events, item.steps)
        finally:
            self._started(-1)
        return msgspec.structs.replace(row)

    def _started(self, change: int) -> None:
        """Count a first batch in flight (`change` 1) or no longer (-1)."""
        self._in_flight += change
        with _LOCK:
            _IN_FLIGHT[self._store_id] = _IN_FLIGHT.get(self._store_id, 0) + change
        if change > 0:
            self._beats.start()

    async def _free(self, entry: _Staged) -> int:
        """The compare-and-set value of the id's row subject when no session has it
        (`SessionExists` otherwise): a staged row of a dead importer is rolled back first."""
        subject = self._subjects.row(entry.token)
        while True:
            message = await self._conn.msg_get({"last_by_subj": subject})
            if message is None:
                return 0
            row = stored_row(message)
            if row is None:
                await self.finish_roll_back(entry.token, message)
                return message.seq  # (an eviction's tombstone, or a rollback's)
            if not row.staged:
                raise self._taken(entry.session_id)
            if not await self.roll_back_if_dead(entry.token, message):
                raise SessionExists(
                    f"session {entry.session_id!r} is being imported by another process "
                    f"(pid {row.owner_pid} on {row.owner_host}): import it under another "
                    "id, or wait for that import to end"
                )
            # Judged again: a writer may have created the id (or another importer staged
            # it) over the staged row before the rollback's tombstone, which then failed.

    def _taken(self, session_id: str) -> SessionExists:
        return SessionExists(
            f"session {session_id!r} exists in this store (created meanwhile by another "
            "writer): nothing was imported; import it under another id (rename=, or "
            "`journal import --as NEW_ID` / `--rename OLD=NEW`)"
        )

    def _moved(self, session_id: str, found: Found | None) -> JournalError:
        """Why a staged row this import wrote is no longer the id's last row message
        (`found`): a session created meanwhile (`_taken`), another importer's staged
        row, or none: another process judged this importer dead and rolled it back."""
        row = None if found is None else stored_row(found)
        if row is None:
            return StoreUnavailable(
                f"the import's staged session {session_id!r} was rolled back meanwhile by "
                "another process, which judged this importer dead (no heartbeat for "
                f"{LEASE_S:g} s: SPEC 16.5), or the id was created and evicted since: "
                "nothing was imported; check the servers and retry"
            )
        if row.staged:
            return SessionExists(
                f"session {session_id!r} is being imported by another process (pid "
                f"{row.owner_pid} on {row.owner_host}): nothing was imported; import it "
                "under another id, or wait for that import to end"
            )
        return self._taken(session_id)

    async def _write(
        self,
        entry: _Staged,
        row: SessionRow,
        prefix: list[tuple[BatchMessage, tuple[str, ...]]],
        events: list[ArchiveEvent],
        steps: tuple[int, ...] = (),
    ) -> SessionRow:
        """Write `prefix` (messages, and the row fields naming their positions) and
        `events` in batches, each ending with the staged row. Each of `steps` (an index
        in `events`) begins a staging step: its events record it as where their append
        began, so a history window trims each step as an append of its own (SPEC 8),
        whichever batches hold it (several steps share a batch up to its limits)."""
        expected = row.last_ordinal + 1
        for offset, event in enumerate(events):
            if event.ordinal != expected + offset:
                raise InvalidArgument(
                    f"imported event ordinal {event.ordinal} where {expected + offset} was due"
                )
        if list(steps) != sorted(set(steps)) or any(not 0 < at < len(events) for at in steps):
            raise InvalidArgument(f"staging steps {steps!r} do not begin within the events")
        bounds = set(steps)
        batch_first = expected
        batch_before = row.appended_bytes
        subject = self._subjects.events(entry.token)
        taken = 0
        first = True
        while first or taken < len(events):
            messages = [message for message, _ in prefix] if first else []
            fields = [names for _, names in prefix] if first else []
            new = msgspec.structs.replace(row)
            running = new.appended_bytes
            size = 0
            staged_from = taken
            while taken < len(events) and len(messages) < _BATCH - 1:
                event = events[taken]
                weight = len(event.data) + len(event.request_id or "")
                if size and size + weight > _BATCH_BYTES:
                    break
                if taken in bounds:
                    batch_first, batch_before = event.ordinal, running
                stored = StoredEvent(
                    event.ordinal,
                    event.timestamp_ms,
                    event.type,
                    event.data,
                    event.request_id,
                    batch_first,
                    batch_before,
                    running,
                )
                running += len(event.data)
                size += weight
                messages.append((subject, ENCODER.encode(stored), {}))
                fields.append(("last_event_position",))
                new.last_ordinal = event.ordinal
                taken += 1
            new.retained_bytes += running - new.appended_bytes
            new.appended_bytes = running
            if taken > staged_from:
                new.last_event_ms, new.stamped_in_order_from = stamps_recorded(
                    row,
                    events[staged_from].ordinal,
                    (event.timestamp_ms for event in events[staged_from:taken]),
                )
            count = len(messages) + 1
            for index, names in enumerate(fields):
                for name in names:
                    setattr(new, name, index - (count - 1))
            if first:
                new.lifecycle_position = new.incarnation
            messages.append((self._subjects.row(entry.token), ENCODER.encode(new), {}))
            seq = await self._publish_staged(entry, messages)
            row = resolve(new, seq)
            entry.seq, entry.row = seq, row
            if first:
                self._staged[row.incarnation] = entry
                with _LOCK:
                    _STAGING.add((self._store_id, row.incarnation))
            first = False
        return row

    async def _publish_staged(self, entry: _Staged, messages: list[BatchMessage]) -> int:
        batch = uuid.uuid4().hex
        entry.sent = True
        subject, payload, headers = messages[-1]
        messages[-1] = (
            subject,
            payload,
            {
                **headers,
                STAGE_HEADER: entry.stamp,
                IMPORTER_HEADER: self._beats.beat_id,
                WRITE_TOKEN: batch,
                "Nats-Expected-Last-Subject-Sequence": str(entry.seq),
                "Nats-Rollup": "sub",
            },
        )

        async def landed() -> int | None:
            found = await self._conn.msg_get({"last_by_subj": subject})
            if found is not None and found.headers.get(WRITE_TOKEN) == batch:
                return found.seq
            if (0 if found is None else found.seq) == entry.seq:
                return None  # (not stored: it may be sent again)
            raise self._moved(entry.session_id, found)

        return await send_batch(self._conn, messages, landed, entry.session_id)

    # -- commit and rollback ---------------------------------------------------------------

    async def _commit(self, op: CommitImport) -> list[SessionRow]:
        if len(op.targets) > MAX_IMPORT_SESSIONS:
            raise InvalidArgument(  # (the import's check pass refuses such an archive)
                f"one commit makes at most {MAX_IMPORT_SESSIONS} sessions visible, not "
                f"{len(op.targets)}"
            )
        entries: list[_Staged] = []
        for target in op.targets:
            entry = self._staged.get(target.incarnation)
            if entry is None or entry.row is None:
                raise SessionNotFound(f"no import in progress at incarnation {target.incarnation}")
            if entry.session_id != target.session_id:
                raise InvalidArgument(
                    f"incarnation {target.incarnation} was staged as {entry.session_id!r}, "
                    f"not {target.session_id!r}"
                )
            entries.append(entry)
        if not entries:
            return []
        self._point("import.commit", [entry.session_id for entry in entries])
        now = await self._clock.now_ms()
        batch = uuid.uuid4().hex
        messages: list[BatchMessage] = []
        finals: list[tuple[int, SessionRow]] = []
        for target, entry in zip(op.targets, entries, strict=True):
            assert entry.row is not None
            state = SessionState.from_wire(target.state)
            count = 2 if state is SessionState.OPEN else 3
            opened = msgspec.structs.replace(
                entry.row,
                staged=False,
                state=SessionState.OPEN.wire,
                suspended_at_ms=None,
                ended_at_ms=None,
                lifecycle_position=1 - count,
                name_position=1 - count,
                owner_pid=0,
                owner_start_time=0,
                owner_host="",
                owner_boot_id="",
                owner_since_ms=0,
            )
            feed = self._subjects.lifecycle(entry.token)
            created = FeedEntry(LifecycleEventType.CREATED.value, now, opened)
            headers = {WRITE_TOKEN: batch} if not messages else {}
            messages.append((feed, ENCODER.encode(StoredFeed(created, count - 1)), headers))
            final = opened
            if state is not SessionState.OPEN:
                final = msgspec.structs.replace(
                    opened,
                    state=target.state,
                    lifecycle_position=-1,
                    suspended_at_ms=target.state_at_ms if state is SessionState.SUSPENDED else None,
                    ended_at_ms=target.state_at_ms if state.terminal else None,
                )
                change = FeedEntry(lifecycle_event_of(state).value, target.state_at_ms, final)
                messages.append((feed, ENCODER.encode(StoredFeed(change, 1)), {}))
            cas = {"Nats-Expected-Last-Subject-Sequence": str(entry.seq), "Nats-Rollup": "sub"}
            messages.append((self._subjects.row(entry.token), ENCODER.encode(final), cas))
            finals.append((len(messages) - 1, final))

        async def landed() -> int | None:
            # The first session's CREATED entry (the feed keeps it for good) says whether
            # the batch is stored; else a row that moved says which id was taken.
            first = entries[0]
            found = await self._conn.msg_get(
                {"seq": first.seq + 1, "next_by_subj": self._subjects.lifecycle(first.token)}
            )
            if found is not None and found.headers.get(WRITE_TOKEN) == batch:
                return found.seq + len(messages) - 1
            rows = await self._reader.last_messages([self._subjects.row(e.token) for e in entries])
            for entry in entries:
                now_at = rows.get(self._subjects.row(entry.token))
                if (0 if now_at is None else now_at.seq) != entry.seq:
                    raise self._moved(entry.session_id, now_at)
            return None

        try:
            first_id = entries[0].session_id
            last = await send_batch(self._conn, messages, landed, first_id, committing=True)
        except WriteOutcomeUnknown as unknown:
            raise await self._fenced(entries, unknown) from None
        self._reader.saw(last)
        start = last - len(messages) + 1
        for entry in entries:
            self._forget(entry)
        rows: list[SessionRow] = []
        for index, final in finals:
            row = resolve(msgspec.structs.replace(final), start + index)
            self._committed(start + index, row, start)
            rows.append(row)
        return rows

    async def _fenced(self, entries: list[_Staged], unknown: WriteOutcomeUnknown) -> JournalError:
        """What a commit left without an answer raises, once rolled back: its batch may
        land yet, unless a tombstone of the rollback comes first. One session rolled
        back fences the whole batch for good (its compare-and-set on that staged row can
        no longer pass, however late it comes), so nothing was imported: StoreUnavailable.
        Else (the rollback failed, or rolled nothing back: committed, or not known):
        `unknown`. The rollback goes on when a Ctrl+C cancels the commit, and the
        caller's `AbortImport` waits for it and counts what it rolled back."""
        fence = asyncio.ensure_future(self._roll_back_all(entries, _WRITE_S))
        for entry in entries:
            assert entry.row is not None
            self._fences[entry.row.incarnation] = fence
        try:
            rolled = await asyncio.shield(fence)
        except Exception:
            return unknown
        if not rolled:
            return unknown
        return StoreUnavailable(
            f"no answer from JetStream for {_WRITE_S:g} s committing the import (of "
            f"{entries[0].session_id!r} and the others); its rollback went through, and "
            "the commit can no longer land: nothing was imported; check the servers and retry"
        )

    async def _abort(self, incarnations: list[int]) -> int:
        entries = [self._staged.get(incarnation) for incarnation in incarnations]
        count = await self._roll_back_all([e for e in entries if e is not None], _WRITE_S)
        for fence in {self._fences.pop(i) for i in incarnations if i in self._fences}:
            count += await fence  # (an unanswered commit's rollback: `_fenced`)
        return count

    async def _roll_back_all(self, entries: list[_Staged], window: float) -> int:
        """Roll back `entries`; how many were (not a session whose commit landed first:
        0 says it committed). Asked again while the servers do not answer or have no
        leader, for up to `window` in all, as the import's writes are (until 2026-12-06
        asked once: an import failing while the stream's leader hung left its staged
        messages, and another process of the host could not import the ids while it
        lived). A rollback done again finds what its first try did. A failed one is
        raised after the others were tried, each entry forgotten: one left is a dead
        importer's (until 2026-12-06 those after a failure stayed staged, alive)."""
        deadline = time.monotonic() + window
        count = 0
        failed: Exception | None = None
        try:
            for entry in entries:
                try:
                    count += await self._roll_back_again(entry, deadline)
                except Exception as e:
                    failed = failed or e
        finally:
            for entry in entries:
                self._forget(entry)
        if failed is not None:
            raise failed
        return count

    async def _roll_back_again(self, entry: _Staged, deadline: float) -> bool:
        """`_roll_back`, asked again until `deadline` while the servers do not answer or
        have no leader."""
        while True:
            try:
                return await self._roll_back(entry)
            except (ApiError, *Unavailable) as e:
                if (isinstance(e, ApiError) and not e.transient) or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    def _forget(self, entry: _Staged) -> None:
        if entry.row is not None and self._staged.get(entry.row.incarnation) is entry:
            del self._staged[entry.row.incarnation]
            with _LOCK:
                _STAGING.discard((self._store_id, entry.row.incarnation))

    async def _roll_back(self, entry: _Staged) -> bool:
        """Purge what `entry` staged; whether it did (not when its session committed).
        A commit or staging batch sent before an interrupt cancelled its wait may land
        during the rollback: a staged row of this import that lands after the one read is
        rolled back in turn, and a first batch not known to be stored is fenced off."""
        self._forget(entry)
        subject = self._subjects.row(entry.token)
        for _ in range(_ROLL_BACK_TRIES):
            message = await self._conn.msg_get({"last_by_subj": subject})
            row = None if message is None else stored_row(message)
            if message is not None and row is not None and row.staged:
                if message.headers.get(STAGE_HEADER) != entry.stamp:
                    return False
                # The tombstone's compare-and-set decides, as for a dead importer; when
                # the row moved first (a commit, or a later staging batch), look again.
                self._point("import.abort", entry.session_id)
                if await self._roll_back_row(entry.token, message, row, leave=False):
                    return True
                continue
            if entry.row is None:
                if not entry.sent or (0 if message is None else message.seq) != entry.seq:
                    return False  # (never sent, or the row moved: its compare-and-set fails)
                # A first batch whose answer is not known may land yet: a tombstone with
                # its compare-and-set goes first (then it is refused), or it landed.
                if await self._tombstone(entry.token, entry.seq) is not None:
                    return False
                continue
            if row is not None and row.incarnation == entry.row.incarnation:
                return False  # committed
            if await self._committed_since(entry.token, entry.seq, entry.row.incarnation):
                return False  # (committed, then evicted: its claim is kept for good)
            if message is None or message.seq > entry.seq:
                # Taken (or rolled back) since: what this import staged lies at or below
                # its last staged row; a session created since lies above it.
                await self._purge(
                    entry.token, entry.seq, entry.row.incarnation, entry.stamp, leave=False
                )
                return True
            return False
        return False  # (a tombstone's answer lost each time: left to a retention pass)

    async def _purge(
        self, token: str, row_seq: int, claim: int, stamp: str, leave: bool = True
    ) -> None:
        """Purge a staged session: its claim, then its subjects up to its staged row (a
        process killed between the two leaves the tombstone, whose claim header names
        the claim: `finish_roll_back`). Not `leave`: a purge unanswered is raised (the
        import's own rollback asks it again)."""
        await self._drop_claim(token, claim, stamp, leave)
        subjects = self._subjects.session_all(token)
        if leave:
            await self._reader.purge_or_leave(subjects, row_seq + 1)
            return
        try:  # (a refusal no retry mends is left unsaid, as `purge_or_leave` leaves it)
            await self._conn.api(
                f"$JS.API.STREAM.PURGE.{self._conn.stream}",
                {"filter": subjects, "seq": row_seq + 1},
            )
        except ApiError as e:
            if e.transient:
                raise

    async def finish_roll_back(self, token: str, message: Found) -> None:
        """Finish the rollback whose tombstone is `message` (the id's last row message),
        in case its process died before it was done (a retention pass's, or an import's
        of the same id): delete the claim the tombstone names, and purge the subjects
        below it (the tombstone, a compare-and-set's base, is kept: a retention pass
        purges it as any)."""
        claim = message.headers.get(CLAIM_HEADER, "")
        if not message.data and claim.isdigit():
            await self._drop_claim(token, int(claim), message.headers.get(STAGE_HEADER, ""))
            await self._reader.purge_or_leave(self._subjects.session_all(token), message.seq)

    async def _drop_claim(self, token: str, claim: int, stamp: str, leave: bool = True) -> None:
        """Delete the claim; not `leave`: a refusal for want of a leader is raised (the
        import's own rollback asks again; until 2026-12-06 it was left unsaid, and a
        rollback during an election kept the claim for good)."""
        found = await self._conn.msg_get({"seq": claim})
        if (
            found is not None
            and found.subject == self._subjects.claim(token)
            and found.headers.get(STAGE_HEADER) == stamp
        ):
            try:
                self._point("import.drop_claim", claim)
                await self._conn.api(
                    f"$JS.API.STREAM.MSG.DELETE.{self._conn.stream}", {"seq": claim}
                )
            except ApiError as e:
                if e.transient and not leave:
                    raise

    async def roll_back_if_dead(self, token: str, message: Found) -> bool:
        """Roll back the staged row `message` holds when its importer is dead (a retention
        pass's, or an import's of the same id); whether it did."""
        row = stored_row(message)
        if row is None or not row.staged or await self._importer_alive(row, message):
            return False
        self._point("import.roll_back", row.session_id)
        # The importer may live after all (its heartbeat only late) and commit or stage
        # more meanwhile.
        rolled = await self._roll_back_row(token, message, row)
        beat = message.headers.get(IMPORTER_HEADER, "")
        if rolled and beat:  # (its last beat, else kept for good; a late one beats again)
            await self._reader.purge_or_leave(self._beats.subject(beat), 1 << 62)
        return rolled

    async def _roll_back_row(
        self, token: str, message: Found, row: SessionRow, leave: bool = True
    ) -> bool:
        """Roll back the staged session whose row `message` holds: a tombstone with the
        compare-and-set on that row first (purged with the rest), so a commit (or staging
        batch) that won keeps its events; whether it rolled back."""
        stamp = message.headers.get(STAGE_HEADER, "")
        upto = await self._tombstone(token, message.seq, stamp, row.incarnation)
        if upto is None:
            now_at = await self._conn.msg_get({"last_by_subj": self._subjects.row(token)})
            current = None if now_at is None else stored_row(now_at)
            if current is not None and current.incarnation == row.incarnation:
                return False  # (committed, or staged further: left to a retention pass)
            if now_at is not None and now_at.seq == message.seq:
                return False  # (the tombstone's answer was lost: left to the next pass)
            if await self._committed_since(token, message.seq, row.incarnation):
                return False  # (committed, then evicted: its claim is kept for good)
            upto = message.seq  # (taken by a creator since: its messages lie above)
        await self._purge(token, upto, row.incarnation, stamp, leave)
        return True

    async def _committed_since(self, token: str, staged_seq: int, incarnation: int) -> bool:
        """Whether the staged session of `incarnation` committed after its staged row at
        `staged_seq` (and was evicted since, or its row would say so): its CREATED entry
        is the id's first feed entry after that row (a creator's, had it come first)."""
        found = await self._conn.msg_get(
            {"seq": staged_seq + 1, "next_by_subj": self._subjects.lifecycle(token)}
        )
        return found is not None and decode_feed(found).row.incarnation == incarnation

    async def _tombstone(
        self, token: str, staged_seq: int, stamp: str = "", claim: int = 0
    ) -> int | None:
        """Replace the staged row at `staged_seq` with a tombstone (compare-and-set) naming
        the staged session's claim, if any; its sequence, None when the row moved first
        (or the answer was lost)."""
        subject = self._subjects.row(token)
        mark = uuid.uuid4().hex
        headers = {
            WRITE_TOKEN: mark,
            "Nats-Expected-Last-Subject-Sequence": str(staged_seq),
            "Nats-Rollup": "sub",
        }
        if claim:
            headers |= {STAGE_HEADER: stamp, CLAIM_HEADER: str(claim)}
        try:
            return await self._conn.publish(subject, b"", headers)
        except ApiError as e:
            if e.err_code != _WRONG_LAST_SEQUENCE and not e.transient:
                raise
        except Unavailable:
            pass
        found = await self._conn.msg_get({"last_by_subj": subject})
        return found.seq if found is not None and found.headers.get(WRITE_TOKEN) == mark else None

    async def _importer_alive(self, row: SessionRow, message: Found) -> bool:
        if (row.owner_pid, row.owner_host, row.owner_boot_id) == (
            os.getpid(),
            self._host,
            self._boot,
        ):
            with _LOCK:
                return (self._store_id, row.incarnation) in _STAGING or bool(
                    _IN_FLIGHT.get(self._store_id)
                )
        beat = message.headers.get(IMPORTER_HEADER, "")
        judged = msgspec.structs.replace(
            row,
            session_id=beat_session(beat),
            incarnation=0,
            owner_generation=0,
            staged=False,
        )
        return await self._owner_alive(judged, 0) is not False

    def close(self) -> None:
        """The journal closes: its staged sessions are no longer alive (a retention pass
        rolls them back), and it beats no more (`ImporterBeat.close`)."""
        with _LOCK:
            for incarnation in self._staged:
                _STAGING.discard((self._store_id, incarnation))
        self._staged.clear()
        self._fences.clear()
        self._beats.close()
