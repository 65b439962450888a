"""Owners and turns: the exclusive lease a runtime process holds on a session, and the
turns it runs under it (`turn_started` ... `turn_result`). Engine-neutral: the engine
takes, checks and releases the lease (`Engine.acquire`, `Engine.owner_alive`) and commits
turn events (`AppendTurnEvent`); this layer is what callers hold.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from types import TracebackType

from .abandoned import close_when_dropped
from .arguments import batch_refused, check_request_id, check_seconds, not_a_batch
from .engine import (
    Append,
    AppendTurnEvent,
    Engine,
    Lease,
    TurnGuard,
)
from .errors import (
    InvalidArgument,
    JournalClosed,
    OutcomeUnknown,
    OwnerBusy,
    SessionNotFound,
    SessionNotWritable,
    StoreUnavailable,
    TurnSettled,
)
from .models import AppendResult, Event, EventIn, OwnerInfo
from .records import TURN_RESULT, TURN_STARTED
from .sessions import SessionRow, recorded_owner
from .turn_results import EndedTurns, KeptTurnResults
from .turn_slots import TurnSlot, must_not_wait

__all__ = [
    "OUTCOME_UNKNOWN_RESULT",
    "Owner",
    "Turn",
    "TurnWriter",
    "TurnWriters",
    "check_lease",
    "check_turn",
    "check_unsettled",
    "open_turn_after",
    "result_data",
    "take_over",
]


_log = logging.getLogger("journal")

# The result the next owner records for a turn whose owner died before settling it.
OUTCOME_UNKNOWN_RESULT: dict[str, object] = {
    "status": "failed",
    "error": {
        "code": "WATCH_OUTCOME_UNKNOWN",
        "message": "the previous owner ended without recording a settled result; the "
        "prompt may have executed",
    },
}


def result_data(result: dict[str, object]) -> bytes:
    return json.dumps(result, separators=(",", ":")).encode()


# What ended a turn, for the exceptions that say nothing themselves (a Ctrl+C's str() is
# empty, SystemExit's is its exit code): a supervisor reads the message, not the code.
_ENDED_BY: dict[type[BaseException], str] = {
    KeyboardInterrupt: "interrupted",
    SystemExit: "the process exited",
    GeneratorExit: "the generator running the turn was closed",
}
_CANCELLED = "the task running the turn was cancelled"  # (asyncio.CancelledError)


def _ended_by(error: BaseException) -> str | None:
    for kind, ended in _ENDED_BY.items():
        if isinstance(error, kind):
            return ended
    # (asyncio's cancellation is looked for only where asyncio was imported, as it is
    # wherever a task runs: not importing it saves the `journal` command a tenth of its
    # start-up.)
    if "asyncio" in sys.modules:
        import asyncio

        if isinstance(error, asyncio.CancelledError):
            return _CANCELLED
    return None


def _failed_message(error: BaseException) -> str:
    """`str(error)`, or what ended the turn with the class name when that says nothing
    (`interrupted (KeyboardInterrupt)`; an exception with an empty message: its class
    name)."""
    name = type(error).__name__
    said = str(error)
    ended = _ended_by(error)
    if ended is not None:
        return f"{ended} ({name}: {said})" if said else f"{ended} ({name})"
    return said or name


def _failed_result(error: BaseException) -> dict[str, object]:
    """The result of a turn that `error` ended: its `code` if it has a string one, else
    its class name, and its message (`_failed_message`)."""
    # (SystemExit's `code` is the exit status or message passed to sys.exit(), no code)
    code = None if isinstance(error, SystemExit) else getattr(error, "code", None)
    return {
        "status": "failed",
        "error": {
            "code": code if isinstance(code, str) else type(error).__name__,
            "message": _failed_message(error),
        },
    }


def check_unsettled(
    engine: Engine,
    start_cursor: str | None,
    row: SessionRow,
    terminal: bool,
    last_cursor: str | None,
    suspect: SessionRow | None,
) -> SessionRow | None:
    """A live follower delivered everything and the last turn is unsettled: raise
    `OutcomeUnknown` if the session ended, or if the turn's owner is gone (checked
    twice, so an owner just taking over is not mistaken for a dead one; a check that
    cannot tell counts as alive). `row` is the session's fresh row; `suspect` the row of
    the follower's previous check when that found the owner gone (else None). Returns
    the row to check again after `OWNER_RECHECK_S` when the owner seems gone for the
    first time, else None. It never sleeps: the follower waits (an asyncio follower on
    its loop, whose other tasks go on)."""
    request_id = row.turn_request_id
    if request_id is None:
        return None
    cursor = last_cursor if last_cursor is not None else start_cursor
    if terminal:
        raise OutcomeUnknown(
            f"session {row.session_id!r} ended while turn {request_id!r} was unsettled: "
            "whether the prompt executed is unknown, and stays so (an ended session has "
            "no owner to settle it; every event up to here was delivered)",
            request_id=request_id,
            cursor=cursor,
            session_ended=True,
        )
    if engine.owner_alive(row) is not False:
        return None
    if (
        suspect is None
        or suspect.incarnation != row.incarnation
        or suspect.turn_request_id != request_id
        or suspect.last_ordinal != row.last_ordinal
    ):
        return row  # gone at a first look (or something moved since): look again soon
    raise OutcomeUnknown(
        f"the owner of session {row.session_id!r} ended without settling turn "
        f"{request_id!r}: the prompt may have executed; the session's next owner records "
        "it as failed (`own()`, `journal sessions own ID`): resume from this error's "
        "cursor once it has, to see that result (a watch resumed before raises this again "
        "at once)",
        request_id=request_id,
        cursor=cursor,
    )


def open_turn_after(open_turn: str | None, kind: str, request_id: str | None) -> str | None:
    """The session's open turn after a turn event of type `kind` for `request_id`: a
    `turn_started` opens its turn, the result of the open turn closes it (a result of
    another turn changes nothing)."""
    if kind == TURN_STARTED:
        return request_id
    return None if request_id == open_turn else open_turn


def check_lease(
    session_id: str, incarnation: int, generation: int, row: SessionRow, planned: int
) -> None:
    """Refuse a write of the owner holding lease `generation` of incarnation
    `incarnation` unless it still holds it: `row` is the session's row, `planned` its last
    lease generation (counting leases planned before in the same batch)."""
    if row.incarnation != incarnation or planned != generation or not row.owner_pid:
        raise OwnerBusy(
            f"the owner lease (generation {generation}) of session {session_id!r} is no "
            "longer held by this owner (it was released, or it lapsed and another owner "
            "took it): take it again with own() and start a new turn",
            pid=row.owner_pid,
        )


def check_turn(guard: TurnGuard, row: SessionRow, planned: int, open_turn: str | None) -> None:
    """Refuse an append of turn `guard` (`check_lease`) unless the turn's owner still
    holds its lease and the turn is the session's open one, `open_turn` (counting turn
    events planned before in the same batch)."""
    check_lease(row.session_id, guard.incarnation, guard.generation, row, planned)
    if open_turn != guard.request_id:
        raise InvalidArgument(
            f"turn {guard.request_id!r} of session {row.session_id!r} is settled: its "
            "events cannot be appended after its result; start a new turn"
        )


def take_over(engine: Engine, lease: Lease, writer: TurnWriter) -> Owner:
    """The `Owner` of a lease just acquired: checks that the session is still the one
    leased, and records as failed (WATCH_OUTCOME_UNKNOWN) a turn its previous owner left
    unsettled. The lease is released if that fails."""
    try:
        row = engine.session(lease.session_id)
        info = None if row is None else recorded_owner(row)
        if (
            row is None
            or info is None
            or row.incarnation != lease.incarnation
            or info.generation != lease.generation
        ):
            engine.check_usable()
            if not lease.held:  # (the journal's close() released it meanwhile)
                raise JournalClosed.meanwhile("own() took the lease")
            raise SessionNotFound(f"session {lease.session_id!r} was evicted while being owned")
        if row.turn_request_id is not None:
            # The turn's owner is gone (we hold the lease now) and never settled it.
            try:
                writer.turn_event(
                    TURN_RESULT, row.turn_request_id, result_data(OUTCOME_UNKNOWN_RESULT)
                )
            except SessionNotWritable as e:
                raise SessionNotWritable(
                    f"session {lease.session_id!r} is {row.session_state.value} and its "
                    f"previous owner left turn {row.turn_request_id!r} unsettled: a new "
                    "owner records that turn's outcome (failed, WATCH_OUTCOME_UNKNOWN) "
                    "first, which a session that is not open cannot take; resume the "
                    "session (resume_session), then own() it"
                ) from e
    except BaseException:
        lease.release()
        raise
    return Owner(lease, info, writer, row.turn_request_id)


class TurnWriter:
    """How an owner writes, under `lease` (given by the facade): turn events, and
    appends of a turn's events checked against the lease and the open turn
    (`TurnGuard`). `checked_append` validates an append's arguments into its operation;
    `commit` commits an operation and returns the caller's result; `row` reads the
    session's row; `replay(cursor)` replays the session's retained events after `cursor`
    (to find the turns that ended before this owner, from where the journal's last read
    of them, `kept`, ended); `closing()` says whether the journal's close has begun (no
    turn starts then). The journal's close waits on the owner's one turn at a time, its
    slot (`waits_on`, `TurnWriters`)."""

    def __init__(
        self,
        lease: Lease,
        checked_append: Callable[..., Append],
        commit: Callable[[Append | AppendTurnEvent], AppendResult],
        row: Callable[[], SessionRow],
        replay: Callable[[str | None], Iterable[Event]],
        kept: KeptTurnResults,
        closing: Callable[[], bool],
    ) -> None:
        self._closing = closing
        # (weakly: the finalizer of a dropped owner holds its writer, and a slot holds
        # the running turn, which holds the owner: the owner was never collected)
        self._slot: Callable[[], TurnSlot | None] = lambda: None
        self._lease = lease
        self._checked_append = checked_append
        self._commit = commit
        self._row = row  # the session's row, read from the store
        self._ended = EndedTurns(lease.session_id, row, replay, kept)
        # The result of a turn whose start or result write failed: (request id, result
        # data, whether its block ran)
        self._unrecorded: tuple[str, bytes, bool] | None = None
        # (a release from another thread records it too: see `start`)
        self._recording = threading.RLock()

    def check_new(self, request_id: str) -> None:
        """`TurnSettled` when `request_id` names a turn of the session that has ended:
        its result is recorded, or is this owner's result not recorded yet (a turn whose
        start failed never ran: its request id may start it again)."""
        unrecorded = self._unrecorded
        if unrecorded is not None and unrecorded[0] == request_id and unrecorded[2]:
            found: tuple[bytes, str | None] | None = (unrecorded[1], None)
        else:
            found = self._ended.find(request_id)
        if found is None:
            return
        data, cursor = found
        try:
            result = json.loads(data)
        except ValueError:
            result = None
        if not isinstance(result, dict):  # (an imported archive's, not written here)
            result = {"status": "unreadable", "data": data.decode(errors="replace")}
        status = result.get("status")
        error = result.get("error")
        if isinstance(error, dict):
            status = f"{status} ({error.get('code')}: {error.get('message')})"
        where = (
            "its result was not recorded yet (the write failed): this owner records it "
            "before its next turn"
            if cursor is None
            else "read its turn_result at the cursor this error carries"
        )
        raise TurnSettled(
            f"turn {request_id!r} of session {self._lease.session_id!r} has ended already, "
            f"{status}: a request id runs once, so a retry gets the outcome recorded and "
            f"does not run again; {where}, and to run the prompt again start a turn with "
            "a new request id",
            request_id=request_id,
            result=result,
            cursor=cursor,
        )

    def turn_event(self, kind: str, request_id: str, data: bytes) -> AppendResult:
        lease = self._lease
        written = self._commit(
            AppendTurnEvent(
                lease.session_id, lease.incarnation, lease.generation, kind, request_id, data
            )
        )
        if kind == TURN_RESULT:
            self._ended.recorded(request_id, data, written.cursor)
        return written

    def start(self, request_id: str) -> AppendResult:
        """A turn's start, once its owner's slot is the turn's: `check_new` again,
        `record_unrecorded`, then the `turn_started` write, all under the lock that a
        release from another thread takes to record a remembered result: that release
        records it before this check (which then raises `TurnSettled`) or finds it
        recorded or set aside by this start. (Until 2026-12-05 it could record a start
        that raised as failed between this check and the retry's start, and the block
        then ran after its failed result, the request id settled twice.) A start that
        raises is remembered as failed, never run: it may have committed (a Ctrl+C held
        until the commit was done, a lost reply). Once the journal's close has begun it
        raises `JournalClosed` at once: the close waits for the blocks running, and a
        block started after would be cut short by it."""
        with self._recording:
            if self._closing():
                raise JournalClosed.closing(request_id, self._lease.session_id)
            self.check_new(request_id)
            self.record_unrecorded(request_id)
            try:
                return self.turn_event(TURN_STARTED, request_id, b"{}")
            except BaseException as error:
                self.unrecorded(request_id, result_data(_failed_result(error)), ran=False)
                raise

    def unrecorded(self, request_id: str, data: bytes, ran: bool) -> None:
        """A turn's result whose write failed (or whose start failed: its block never
        `ran`): recorded before the owner's next turn."""
        self._unrecorded = (request_id, data, ran)

    def record_unrecorded(self, next_request_id: str | None = None) -> None:
        """Record the result of the owner's last turn whose result write failed, when that
        turn is still the session's open one (the write may have committed after all: a
        lost reply). Only this owner writes turn events while it holds the lease, so the
        open turn cannot change between the read and the write. A turn whose start
        failed, started again as the next (`next_request_id`), gets no result: its block
        never ran, and the new start opens it again. A result that committed after all
        is in the history only: the owner reads that again at its next find. Raises what
        the write raises (the result stays remembered)."""
        with self._recording:
            unrecorded = self._unrecorded
            if unrecorded is None:
                return
            request_id, data, ran = unrecorded
            if (ran or request_id != next_request_id) and self._row().turn_request_id == request_id:
                self.turn_event(TURN_RESULT, request_id, data)
            elif ran:
                # Its result committed after all (the reply was lost): it is in the history
                # only, so the next find reads that again rather than run the turn twice.
                self._ended.forget()
            self._unrecorded = None

    def record_before_release(self) -> bool:
        """Record, as the lease is let go, the result of the owner's last turn whose start
        or result write raised, when that turn is still the session's open one: the owner
        knows that outcome (a start that raised never ran its block), where the next owner
        could only record WATCH_OUTCOME_UNKNOWN ("the prompt may have executed"). A
        write that fails is logged: the release goes on, and the next owner settles the
        turn as before. False when it failed as `StoreUnavailable` (the store does not
        answer: another write would wait as long)."""
        unrecorded = self._unrecorded
        if unrecorded is None or not self._lease.held:
            return True
        try:
            self.record_unrecorded()  # (no next turn)
        except Exception as error:
            _log.warning(
                "could not record the result of turn %r of session %r before releasing "
                "its owner: %s (%s)",
                unrecorded[0],
                self._lease.session_id,
                self._left_to(error),
                error,
            )
            return not isinstance(error, StoreUnavailable)
        return True

    def _left_to(self, error: Exception) -> str:
        """Who settles a turn whose result could not be recorded: the next owner, unless
        the session ended (no owner comes: the turn stays unsettled for good; until
        2026-12-05 the warning said the next owner records it either way: a soak)."""
        if isinstance(error, SessionNotFound):  # (evicted, or deleted and made again)
            return "the session is gone, and the turn with it"
        if isinstance(error, SessionNotWritable):
            with contextlib.suppress(Exception):
                if self._row().session_state.terminal:
                    return "the session has ended, so the turn stays unsettled for good"
        return "the next owner records it as WATCH_OUTCOME_UNKNOWN"

    def append(self, request_id: str, events: Sequence[EventIn]) -> AppendResult:
        lease = self._lease
        guard = TurnGuard(lease.incarnation, lease.generation, request_id)
        operation = self._checked_append(lease.session_id, events, None, None, turn=guard)
        try:
            return self._commit(operation)
        except JournalClosed as error:
            raise self.closed_in_turn(request_id, "its events", error) from error

    def result(self, request_id: str, data: bytes) -> AppendResult:
        """The `turn_result` of a turn whose block has ended."""
        try:
            return self.turn_event(TURN_RESULT, request_id, data)
        except JournalClosed as error:
            raise self.closed_in_turn(request_id, "its result", error) from error

    def waits_on(self, slot: TurnSlot) -> None:
        """`slot` is the owner's one turn at a time (`wait_ended` waits on it)."""
        self._slot = weakref.ref(slot)

    def wait_ended(self) -> None:
        """Until the owner's turn block running in another thread (if any) has ended,
        while the owner holds its lease (one already let go records no result)."""
        slot = self._slot()
        if slot is not None and self._lease.held:
            slot.wait_ended()

    def closed_in_turn(self, request_id: str, what: str, error: JournalClosed) -> JournalClosed:
        """The error of a write of a started turn (`what` it wrote) that the journal's
        close refused or cut short: the close came while the turn ran, which its own
        "open it again" does not say (until 2026-12-06, a new-user trial)."""
        if not self._closing():  # (not closed: a forked child's use, say)
            return error
        return JournalClosed.during_turn(request_id, self._lease.session_id, what)


class TurnWriters:
    """The turn writers of one journal's owners, held weakly: as the journal closes,
    `wait_before_close` waits for their turns' blocks running in other threads, and
    `record_before_close` records, as the journal lets their leases go, each remembered
    result that `release()` would have recorded (a runtime that closes its journal rather
    than each owner; until 2026-12-05 the next owner recorded those turns as
    WATCH_OUTCOME_UNKNOWN)."""

    def __init__(self) -> None:
        # (Reentrant: a signal handler that closes the journal runs between any two
        # steps of its thread, also in `add` here, and the close took it again: it
        # waited for itself for good; a review.)
        self._lock = threading.RLock()
        self._writers: weakref.WeakSet[TurnWriter] = weakref.WeakSet()
        self._closing = False
        self._pid = os.getpid()  # (a forked child's copy has no block to wait for)
        # (Taken once, never let go: which of two concurrent closes closes. A lock's
        # non-blocking acquire, since a flag read and set is two steps.)
        self._closer = threading.Lock()

    def closing(self) -> bool:
        """Whether the journal's close has begun."""
        return self._closing

    def begin_close(self) -> None:
        """The journal's close begins: no turn of its owners starts from now on (their
        start raises `JournalClosed`)."""
        self._closing = True

    def wait_before_close(self, here_exempt: bool = False) -> None:
        """After `begin_close`: until the blocks of the turns that run in other threads
        have ended and recorded their results, as `release()` waits
        for its owner's, with no limit (a Ctrl+C interrupts it: raised). It does not wait
        for a block running in this thread (a close from inside it would wait for
        itself), nor at all on a thread running an asyncio event loop or in the main
        thread at interpreter exit (`must_not_wait`, as `Owner.release`) or in a forked
        child (the blocks ran in the parent, and their slots' copies stay taken for
        good), nor when `here_exempt` (the journal's delivery thread, which a block may
        wait for as for a loop)."""
        if here_exempt or os.getpid() != self._pid or must_not_wait():
            return
        with self._lock:
            writers = list(self._writers)
        for writer in writers:
            writer.wait_ended()

    def claim_close(self) -> bool:
        """True for the first call only: of concurrent closes, the one that closes (the
        others return; one from a listener of the journal's subscriptions must, since the
        closing one joins the delivery thread)."""
        return self._closer.acquire(blocking=False)

    def add(self, writer: TurnWriter) -> None:
        with self._lock:
            self._writers.add(writer)

    def record_before_close(self) -> None:
        """Until one fails as `StoreUnavailable`: while the store does not answer, each
        write waits out its deadlines (a JetStream store whose servers stopped: 30 s for
        the row read, and the release after it 30 s more), so a close with N such owners
        took N minutes (the next owners record the rest as WATCH_OUTCOME_UNKNOWN, as
        they did before 2026-12-05; a review)."""
        with self._lock:
            writers = list(self._writers)
        for writer in writers:
            if not writer.record_before_release():
                return


def _release_recording(writer: TurnWriter, lease: Lease) -> None:
    """An owner's release without the owner (its finalizer's, which must not refer to
    it): the remembered result first, as `Owner.release()`."""
    try:
        writer.record_before_release()
    finally:
        lease.release()


class Turn:
    """One turn of an owner: a context manager (see `Owner.turn`).

    `owner` and `request_id` say whose it is; `started` is the `AppendResult` of its
    `turn_started` event and `result` that of its `turn_result` event (None until each
    is appended: `result` once the block has ended). What the turn's result says
    (`{"status": ...}`) is that event's data, read as any event's; a retry of a settled
    request id raises `TurnSettled` with it in `.result`."""

    def __init__(self, owner: Owner, request_id: str, writer: TurnWriter, slot: TurnSlot) -> None:
        self.owner = owner
        self.request_id = request_id
        self._writer = writer
        self._slot = slot
        self._cancelled = False
        self._entered = False
        self._ended = False
        # `cancel()` from another thread against the block's end: the outcome is decided
        # once, under this lock, so cancel() can say whether it changed it; both notify
        # the waiters of `wait_cancelled`.
        self._end_lock = threading.Condition(threading.Lock())
        self.started: AppendResult | None = None
        self.result: AppendResult | None = None

    def __enter__(self) -> Turn:
        # A Turn runs once: entered again, it would append a second `turn_started` for
        # its request id, outside the owner's one-turn-at-a-time guard.
        if self._entered:
            raise InvalidArgument(
                f"turn {self.request_id!r} was entered already: a Turn runs once; start "
                "the next one with owner.turn(request_id)"
            )
        self._slot.start(self)
        self._entered = True
        try:
            # Checked again, now that the slot is this turn's: another thread's turn of
            # the same request id may have ended since `owner.turn()` checked (it would
            # run again). A start that raises may have committed though its caller got
            # an error: if it did, the owner's next turn (or its release) records this
            # one as failed first, as for a lost result (unless that next turn is this
            # one again).
            self.started = self._writer.start(self.request_id)
        except BaseException:
            with self._end_lock:
                self._ended = True  # (not started here: it has no result to change)
                self._end_lock.notify_all()
            self._slot.free(self)
            raise
        return self

    def append(self, events: Sequence[EventIn]) -> AppendResult:
        """Append events of this turn (their request id becomes the turn's; an event that
        names another request id is refused). Refused once the turn has ended, or when
        its owner no longer holds the lease (released, taken over, the session evicted)."""
        if self._ended:
            raise InvalidArgument(
                f"turn {self.request_id!r} has ended: its events cannot be appended after "
                "its result; start a new turn"
            )
        if not self._entered:
            raise InvalidArgument(
                f"turn {self.request_id!r} has not started: use it as `with "
                "owner.turn(request_id) as turn:`, which appends its turn_started first"
            )
        if not_a_batch(events):
            raise batch_refused(events)
        tagged = []
        for e in events:
            if isinstance(e, EventIn):
                if e.request_id is not None and e.request_id != self.request_id:
                    raise InvalidArgument(
                        f"an event of turn {self.request_id!r} names request id "
                        f"{e.request_id!r}: a turn's events carry the turn's id (leave it None)"
                    )
                e = EventIn(e.type, e.data, self.request_id)
            tagged.append(e)
        return self._writer.append(self.request_id, tagged)

    def cancel(self) -> bool:
        """Record the turn as cancelled when its block ends (failed if the block raises)
        and return True; from any thread. Once the turn has ended (its result is decided,
        see `result`) it changes nothing and returns False, as `Future.cancel()` does:
        a cancel racing the block's end is not an error."""
        with self._end_lock:
            if self._ended:
                return False
            self._cancelled = True
            self._end_lock.notify_all()
            return True

    @property
    def cancelled(self) -> bool:
        """Whether a `cancel()` was accepted (returned True): the turn's result is or will
        be cancelled (failed, if its block raises). Read-only, from any thread: a
        runtime's loop checks it to stop early (`if turn.cancelled: break`). Once True it
        stays True; a `cancel()` after the turn's end (False) leaves it False."""
        # (a bool set once, under `_end_lock`, while the outcome is undecided)
        return self._cancelled

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Wait until the turn is cancelled or has ended, at most `timeout` seconds
        (None: no limit), and return `cancelled`: True at once if it already is; False
        once the turn ended uncancelled (a thread that waits to abort the turn's work
        ends with it), or after the timeout."""
        wait_s = None if timeout is None else check_seconds("timeout", timeout)
        with self._end_lock:
            self._end_lock.wait_for(lambda: self._cancelled or self._ended, wait_s)
            return self._cancelled

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with self._end_lock:
            self._ended = True
            cancelled = self._cancelled
            self._end_lock.notify_all()
        try:
            outcome: dict[str, object]
            if error is not None:
                outcome = _failed_result(error)
            elif cancelled:
                outcome = {"status": "cancelled"}
            else:
                outcome = {"status": "completed"}
            data = result_data(outcome)
            try:
                self.result = self._writer.result(self.request_id, data)
            except BaseException:
                self._writer.unrecorded(self.request_id, data, ran=True)
                raise
        finally:
            self._slot.free(self)

    def __repr__(self) -> str:
        state = "ended" if self._ended else "open" if self._entered else "not started"
        if self.cancelled:
            state += ", cancelled"
        return (
            f"Turn(request_id={self.request_id!r}, session_id={self.owner.session_id!r}, {state})"
        )


class Owner:
    """This process's lease on one session, from `Journal.own()`; a context manager.

    While it is held, `own()` of the same session anywhere raises `OwnerBusy`; leaving
    the block (or `release()`) records the release. If the process dies, the lease is
    free again at once (the local engine's lock dies with the process), the session's
    metadata stops reporting it, and an unsettled turn of it is settled by the next owner
    as failed with WATCH_OUTCOME_UNKNOWN. An owner dropped without a release (no `with`,
    no `release()`) is released when it is garbage-collected, with a `ResourceWarning`,
    as an unclosed file is.

    `recovered_turn` is the request id of the turn a previous owner left unsettled, which
    this `own()` recorded as failed (WATCH_OUTCOME_UNKNOWN); None when there was none. A
    runtime restarting after a crash learns from it which turn's outcome is unknown.
    """

    def __init__(
        self,
        lease: Lease,
        info: OwnerInfo,
        writer: TurnWriter,
        recovered_turn: str | None = None,
    ) -> None:
        self._lease = lease
        self._writer = writer
        # Released when garbage-collected without a release (SPEC 7.8), its remembered
        # turn result recorded first (until 2026-12-05 it was left for the next owner).
        self._abandoned = close_when_dropped(
            self,
            partial(_release_recording, writer, lease),
            f"the owner lease of session {lease.session_id!r} was dropped without a release "
            "and is released now: use `with journal.own(session_id) as owner:`",
            lambda: lease.held,
        )
        self._turn_slot = TurnSlot()
        writer.waits_on(self._turn_slot)
        self.session_id = lease.session_id
        self.generation = lease.generation
        self.info = info
        self.recovered_turn = recovered_turn

    def turn(self, request_id: str) -> Turn:
        """`with owner.turn(request_id) as turn:` appends `turn_started`; `turn.append`
        appends the turn's events; leaving the block appends `turn_result`: completed,
        cancelled (after `turn.cancel()`), or failed with the exception's code and message
        (the exception propagates). One turn at a time per owner: this call raises while
        a turn's block runs, and replaces a turn made and not started yet (entering that
        one then raises); a Turn is entered once, and `turn.append` works only inside it.

        A request id runs once: `TurnSettled` (with the recorded result) when the session's
        retained history holds a result for it, or this owner's result of it is not
        recorded yet (entering the turn checks again). The first call of an owner reads
        the session's retained events for that (those after this journal's last read of
        them, while the history begins where it did then: `turn_results.py`); a turn
        whose start raised may be started again with its request id."""
        request_id = check_request_id("request_id", request_id)
        if not request_id:
            raise InvalidArgument("request_id must be a non-empty str")
        self._writer.check_new(request_id)
        turn = Turn(self, request_id, self._writer, self._turn_slot)
        self._turn_slot.claim(turn)
        return turn

    def release(self) -> None:
        """Record the release and let the lease go; idempotent. The result of a turn whose
        start or result write raised (a Ctrl+C held until its commit was done), which the
        owner's next turn would record first, is recorded before. From another thread
        while a turn's block runs, it waits for the block to end and record its result,
        with no limit: a block that never ends holds it, and the lease (`turn.cancel()`
        first to end it sooner; a Ctrl+C that interrupts the wait lets go at once, and is
        raised). From inside the block, on a thread running an asyncio event loop (a
        block in a worker thread may wait for that loop), or at interpreter exit (an
        `atexit` function: the block runs in a daemon thread, which Python does not wait
        for either) it lets go at once: the block's next append and its result are
        refused (`OwnerBusy`), and the next owner records the turn as failed with
        WATCH_OUTCOME_UNKNOWN."""
        # Until 2026-12-06 it let the lease go under the running block, whose next append
        # and result were refused (`OwnerBusy`): the turn of a live process that shut
        # down cleanly stayed unsettled, and its next owner recorded WATCH_OUTCOME_UNKNOWN.
        if must_not_wait():
            # (A block in a worker thread that asks the loop for something, as a runtime
            # streaming to its client does, would wait for a loop waiting for it: both for
            # good. Found by a review, the day the wait came. At interpreter exit, a
            # block in a daemon thread waiting for the ended main thread: a review.)
            self._let_go()
            return
        try:
            self._turn_slot.wait_ended()
        except BaseException:
            # (a Ctrl+C while it waits: it lets go at once, as it did before, and the
            # interrupt goes on; the lease is not left to expire)
            self._let_go()
            raise
        self._let_go()

    def _let_go(self) -> None:
        self._abandoned.detach()
        try:
            self._writer.record_before_release()
        finally:
            self._lease.release()

    def __enter__(self) -> Owner:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"Owner(session_id={self.session_id!r}, generation={self.generation}, "
            f"pid={self.info.pid})"
        )
