"""The JetStream engine's commit loop: an operation is planned against a session's row
and committed as one atomic batch ending with the new row, with a compare-and-set on the
row subject (SPEC 16). A stale row (another writer committed first) is read again and the
operation planned again; a lost reply is settled by looking for the commit's write token.

Coroutines on the connection's loop; writers of one session in this process take turns
(a per-session lock), so they do not compete for the compare-and-set among themselves.
The operations themselves are planned in `writes.py`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from nats.errors import MaxPayloadError

from ..errors import (
    InvalidArgument,
    JournalClosed,
    JournalError,
    StoreIncompatible,
    StoreUnavailable,
    WriteOutcomeUnknown,
)
from ..models import LifecycleEventType, RetentionPolicy, SessionState
from ..sessions import FeedEntry, SessionRow, lifecycle_event_of
from .client import WRITE_TOKEN, ApiError, BatchMessage, Unavailable, failure
from .layout import (
    ENCODER,
    StoredFeed,
    resolve,
)
from .opening import change_recorded_policy, decode_policy
from .reads import RowState, StoreReader
from .server_clock import ServerClock

__all__ = ["Committer", "Plan", "done", "rel", "resolved"]

# JetStream refuses an atomic batch of more than 1,000 messages (error 10199); an append
# also writes its row, and may write a creation record and an idempotency marker.
MAX_APPEND_EVENTS: Final = 997
_log: Final = logging.getLogger("journal")
# How long a write keeps trying across a lost connection or a leader election.
WRITE_S: Final = 30.0
_WRONG_LAST_SEQUENCE: Final = 10071
# A clustered stream refuses an expected-last-subject-sequence while another write of
# that subject is in process at its leader (proposed, not applied yet): "wrong last
# sequence" without a sequence. It is not a refusal of the compare-and-set value: the
# write in process may be this one, sent before a reply was lost.
_IN_PROCESS: Final = 10164
_TOO_LARGE: Final = frozenset({10054, 10199})

# Whether a row's owner is alive (None: cannot tell); the int is 1 when an own() of the
# session asks (its own call in flight does not count as the owner).
Owner = Callable[[SessionRow, int], Awaitable[bool | None]]


def _transient(error: ApiError) -> bool:
    return error.transient


def _unread(session_id: str, error: BaseException) -> str:
    """Why a write whose read of the session's row failed for WRITE_S was not committed,
    and what to do. (A refusal for want of a leader is an answer, and says what it means
    as a read's does: until 2026-12-06 every such write said "no answer from JetStream
    ... (JetStream system temporarily unavailable)", a crash trial.)"""
    detail = failure(error)
    if not (isinstance(error, ApiError) and error.no_leader):
        detail += ": check the servers and retry"
    return (
        f"this write was not committed: session {session_id!r} could not be read to "
        f"write to it for {WRITE_S:g} s: {detail}"
    )


class _CannotTell(Exception):
    """Settling a lost reply could not read what won the compare-and-set (no leader, no
    answer): the batch may be stored, so it is neither planned again nor reported."""


class Plan:
    """What one planned commit writes (`messages`, the row last; none: nothing to write),
    and how its result follows from the sequence its row got."""

    __slots__ = ("messages", "result", "row")

    def __init__(
        self,
        messages: list[BatchMessage],
        row: SessionRow | None,
        result: Callable[[int], Any],
    ) -> None:
        self.messages = messages
        self.row = row
        self.result = result


def done(value: Any) -> Plan:
    return Plan([], None, lambda _seq: value)


def resolved(row: SessionRow, seq: int) -> SessionRow:
    return resolve(msgspec.structs.replace(row), seq)


def rel(index: int, count: int) -> int:
    """The relative position of message `index` of a batch of `count` (row last)."""
    return -(count - 1 - index)


class Committer:
    """Commits planned operations (see the module docstring)."""

    def __init__(
        self,
        reader: StoreReader,
        policy: RetentionPolicy,
        owner_alive: Owner,
        committed: Callable[[int, SessionRow | None, int], None],
        point: Callable[[str, object], None],
        clock: ServerClock,
    ) -> None:
        self.reader = reader
        self.point = point  # the engine's fault points (SPEC 1.3)
        # The servers' time, which every commit records and judges deadlines by (SPEC 8).
        self.clock = clock
        self.conn = reader.conn
        self.subjects = reader.subjects
        self.policy = policy
        # The policy message's sequence `policy` came from (0: not read here yet) and when
        # it was last compared (`policy_now`).
        self._policy_seq = 0
        self._policy_checked = -math.inf
        self.owner_alive = owner_alive
        self._committed = committed
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # Rows this engine committed last, per session: the next write starts from them
        # (a compare-and-set failure means they are stale: read again).
        self.last_rows: dict[str, RowState] = {}

    async def policy_now(self, at_most_every_s: float = 0.0) -> RetentionPolicy:
        """The store's policy as recorded now, whoever recorded it (SPEC 8): the policy
        message is read again when its sequence changed. A damaged one is logged and the
        policy in force kept (writes go on). `at_most_every_s`: compare no more often."""
        checked = time.monotonic()
        if checked - self._policy_checked < at_most_every_s:
            return self.policy
        self._policy_checked = checked
        found = await self.conn.msg_get({"last_by_subj": self.subjects.policy})
        if found is None or found.seq == self._policy_seq:
            return self.policy
        self._policy_seq = found.seq
        try:
            self.policy = decode_policy(found.data, self.subjects)
        except StoreIncompatible as e:
            _log.warning("%s; keeping the retention policy in force: %s", e, self.policy)
        return self.policy

    async def change_policy(
        self, change: Callable[[RetentionPolicy], RetentionPolicy]
    ) -> RetentionPolicy:
        """Record `change(the recorded policy)` (compare-and-set: SPEC 16.5)."""
        self.policy, self._policy_seq = await change_recorded_policy(
            self.conn, self.subjects, change, self.point
        )
        self._policy_checked = time.monotonic()
        return self.policy

    # -- the commit loop -------------------------------------------------------------------

    def lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    async def _state(self, session_id: str, fresh: bool) -> tuple[RowState, bool]:
        """The row to plan on, and whether it is this engine's own last copy (another
        process may have written since) rather than one read from the store."""
        if not fresh:
            cached = self.last_rows.get(session_id)
            if cached is not None:
                return cached, True
        return await self.reader.row(session_id), False

    async def write(
        self,
        session_id: str,
        plan: Callable[[RowState, int], Awaitable[Plan]],
        expire_first: bool = True,
    ) -> Any:
        """Plan and commit one operation on one session, again on a stale row."""
        lock = self.lock(session_id)
        async with lock:
            fresh = False
            confirmed = False  # (a refusal on a stored row: `reader.in_touch` asked)
            deadline = time.monotonic() + WRITE_S
            while True:
                cached = False
                try:
                    state, cached = await self._state(session_id, fresh)
                    now = await self.clock.now_ms()
                    row = state.row
                    due = None if row is None or not expire_first else row.deadline()
                    if due is not None and due <= now:
                        # Past its deadline: expired first, whatever is asked (as every
                        # commit of the local engine expires what is due).
                        expired = self.state_change(state, SessionState.EXPIRED, now)
                        fresh = await self.commit(session_id, state, expired) is None
                        continue
                    planned = await plan(state, now)
                except (ApiError, *Unavailable) as e:
                    # No leader for a moment (an election), or the connection is away:
                    # nothing was written yet, so the attempt starts again.
                    if isinstance(e, ApiError) and not _transient(e):
                        raise
                    if time.monotonic() > deadline:
                        raise StoreUnavailable(_unread(session_id, e)) from None
                    await asyncio.sleep(0.1)
                    fresh = True
                    continue
                except JournalError as e:
                    if isinstance(e, StoreUnavailable | JournalClosed):
                        raise  # (no answer for 30 s, or closed: not a refusal of a copy)
                    if not cached:
                        if confirmed:
                            raise
                        # Refused on a stored row: judged again once the stream's leader
                        # is known to hold every commit (one cut off from its cluster
                        # answers from a stale copy: `SessionNotFound` for a session
                        # created through the others, `OrdinalConflict` for the true end).
                        await self.reader.in_touch()
                        confirmed = True
                    # Refused on this engine's own copy of the row: another process may
                    # have changed the session since (appended, resumed, released its
                    # lease, evicted it). Judge it again on the stored row.
                    fresh = True
                    continue
                if not planned.messages:
                    if cached:
                        fresh = True  # (an answer from a copy: read it from the store)
                        continue
                    return planned.result(0)
                seq = await self.commit(session_id, state, planned)
                if seq is None:
                    fresh = True
                    if time.monotonic() > deadline:
                        raise StoreUnavailable(
                            f"session {session_id!r} kept changing under this write for "
                            f"{WRITE_S:g} s: retry"
                        )
                    continue
                return planned.result(seq)

    async def commit(self, session_id: str, state: RowState, plan: Plan) -> int | None:
        """Publish the plan's batch with the compare-and-set on the row subject; the row's
        sequence, or None when the row was stale (nothing written)."""
        token = uuid.uuid4().hex
        messages = self._stamped(state, plan.messages, token)
        deadline = time.monotonic() + WRITE_S
        uncertain = False
        busy = 0  # answers "another write of the row is in process" in a row
        seq: int | None
        while True:
            try:
                self.point("commit.publish", session_id)
                seq = await self.conn.publish_batch(messages)
            except ApiError as e:
                if e.err_code == _IN_PROCESS:
                    # Sent again (same compare-and-set) once that write is applied: then
                    # it lands, or the server says who won (10071, settled below). Never
                    # planned again meanwhile: the write in process may be this one.
                    if uncertain:
                        seq = await self._settle_or_none(session_id, state, messages, token)
                        if seq is not None:
                            break
                    if time.monotonic() > deadline:
                        raise self._unanswered(session_id, uncertain) from None
                    await asyncio.sleep(min(0.002 * 2**busy, 0.1))
                    busy += 1
                    continue
                if e.err_code == _WRONG_LAST_SEQUENCE:
                    if uncertain:
                        # Another batch, or this one sent before, took the CAS value:
                        # which one must be known before this write is planned again
                        # (planned again, a batch of ours that landed is written twice).
                        seq = await self._settle_surely(
                            session_id, state, messages, token, deadline
                        )
                        if seq is not None:
                            break
                    self.last_rows.pop(session_id, None)
                    return None
                if e.err_code in _TOO_LARGE:
                    raise InvalidArgument(
                        f"JetStream refused this write to session {session_id!r}: "
                        f"{e.description} (a message is limited by the stream's max_msg_size "
                        "and the server's max_payload, a batch to 1,000 messages): write "
                        "less at once"
                    ) from None
                if _transient(e):
                    uncertain = True  # no leader yet (or a batch cut by a failover)
                else:
                    raise StoreUnavailable(
                        f"JetStream refused the write to session {session_id!r}: "
                        f"{e.description} (error {e.err_code})"
                    ) from None
            except MaxPayloadError:
                raise InvalidArgument(
                    f"a message of this write to session {session_id!r} is larger than the "
                    "NATS server's max_payload: raise max_payload in the server's "
                    "configuration (SPEC 16), or write smaller events"
                ) from None
            except Unavailable:
                uncertain = True
            if uncertain:
                # The batch may have been stored without its reply reaching us.
                seq = await self._settle_or_none(session_id, state, messages, token)
                if seq is not None:
                    break
                if time.monotonic() > deadline:
                    raise self._unanswered(session_id, True)
                await asyncio.sleep(0.1)
                continue
            break
        assert seq is not None
        self.reader.saw(seq)
        if plan.row is None:
            self.last_rows.pop(session_id, None)
            new_state = RowState(None, seq, state.token)
        else:
            new_state = RowState(resolved(plan.row, seq), seq, state.token)
            if len(self.last_rows) >= 4096:
                self.last_rows.clear()
            self.last_rows[session_id] = new_state
        # (The batch's messages are consecutive, its row last: its first position.)
        self._committed(seq, new_state.row, seq - len(messages) + 1)
        return seq

    def _unanswered(self, session_id: str, uncertain: bool) -> StoreUnavailable:
        if not uncertain:  # (every answer was "another write is in process")
            return StoreUnavailable(
                f"another write of session {session_id!r} stayed in process at the stream's "
                f"leader for {WRITE_S:g} s; this write was not committed: check the "
                "servers and retry"
            )
        return WriteOutcomeUnknown(
            f"no reply from JetStream for {WRITE_S:g} s writing to session "
            f"{session_id!r}; the write is not known to have committed (a batch "
            "still in flight may yet commit): check the servers, then look whether it "
            "did (get_session) before writing it again; an append retried with the "
            "same idempotency key is safe (it returns the committed result)"
        )

    def _stamped(
        self, state: RowState, messages: list[BatchMessage], token: str
    ) -> list[BatchMessage]:
        """The batch with the row's compare-and-set and the write token on every message
        of the session's own subjects but its events after the first."""
        session_prefix = self.subjects.session_wide(state.token)[:-1]
        stamped: list[BatchMessage] = []
        first_event = True
        last = len(messages) - 1
        for index, (subject, payload, headers) in enumerate(messages):
            headers = dict(headers)
            is_event = subject.endswith(".ev")
            if subject.startswith(session_prefix) and (not is_event or first_event):
                headers[WRITE_TOKEN] = token
            if is_event:
                first_event = False
            if index == last:
                headers["Nats-Expected-Last-Subject-Sequence"] = str(state.seq)
                headers["Nats-Rollup"] = "sub"
            stamped.append((subject, payload, headers))
        return stamped

    async def _settle_or_none(
        self, session_id: str, state: RowState, messages: list[BatchMessage], token: str
    ) -> int | None:
        """`_settle`, None when it cannot tell (the same batch is sent again next: at
        most one of them can take the compare-and-set value)."""
        try:
            return await self._settle(session_id, state, messages, token, False)
        except _CannotTell:
            return None

    async def _settle_surely(
        self,
        session_id: str,
        state: RowState,
        messages: list[BatchMessage],
        token: str,
        deadline: float,
    ) -> int | None:
        """`_settle` after the compare-and-set value was taken, asked again until it can
        tell (until the write's `deadline`; then the write is reported as not known to
        have committed)."""
        while True:
            try:
                return await self._settle(session_id, state, messages, token, True)
            except _CannotTell:
                if time.monotonic() > deadline:
                    raise self._unanswered(session_id, True) from None
                await asyncio.sleep(0.1)

    async def _settle(
        self,
        session_id: str,
        state: RowState,
        messages: list[BatchMessage],
        token: str,
        taken: bool,
    ) -> int | None:
        """Whether a batch whose reply was lost was stored: the first message on the
        session's subjects after the compare-and-set value is the commit that won it (the
        owner's heartbeat, written outside the compare-and-set, is passed over); the row's
        sequence if that is ours, else None. `_CannotTell` when the leader does not
        answer, or (`taken`: the server said the value was taken) shows nothing there
        yet (a new leader that has not applied everything)."""
        heartbeat = self.subjects.heartbeat(state.token)
        after = state.seq
        asked = time.monotonic()
        try:
            self.point("commit.settle", session_id)
            while True:
                first = await self.conn.msg_get(
                    {"seq": after + 1, "next_by_subj": self.subjects.session_wide(state.token)}
                )
                if first is None or first.subject != heartbeat:
                    break
                after = first.seq
        except (ApiError, *Unavailable):
            raise _CannotTell from None
        if first is None and taken:
            # (no answer, as the servers' silence is: a leader cut off by a partition
            # answers so from its stale copy, and the connection moves off it, `cut_off`)
            self.conn.no_answer(asked)
            raise _CannotTell
        if first is None or first.headers.get(WRITE_TOKEN) != token:
            return None
        session_prefix = self.subjects.session_wide(state.token)[:-1]
        index = next(
            i for i, (subject, _, _) in enumerate(messages) if subject.startswith(session_prefix)
        )
        return first.seq - index + len(messages) - 1

    # -- batch pieces ----------------------------------------------------------------------

    def row_message(self, state: RowState, row: SessionRow | None) -> BatchMessage:
        payload = b"" if row is None else ENCODER.encode(row)
        return (self.subjects.row(state.token), payload, {})

    def feed_message(
        self, state: RowState, event: LifecycleEventType, now: int, row: SessionRow, anchor: int
    ) -> BatchMessage:
        entry = FeedEntry(event.value, now, row)
        return (
            self.subjects.lifecycle(state.token),
            ENCODER.encode(StoredFeed(entry, anchor)),
            {},
        )

    def state_change(self, state: RowState, target: SessionState, now: int) -> Plan:
        assert state.row is not None
        row = msgspec.structs.replace(
            state.row,
            state=target.wire,
            lifecycle_position=-1,
            suspended_at_ms=now if target is SessionState.SUSPENDED else None,
            ended_at_ms=now if target.terminal else state.row.ended_at_ms,
        )
        messages = [
            self.feed_message(state, lifecycle_event_of(target), now, row, 1),
            self.row_message(state, row),
        ]
        return Plan(messages, row, lambda seq: resolved(row, seq))
