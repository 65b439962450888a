"""Owners and turns: the exclusive lease a runtime process holds on a session, and the
turns it runs under it (`turn_started` ... `turn_result`). Engine-neutral: the engine
takes, checks and releases the lease (`Engine.acquire`, `Engine.owner_alive`) and commits
turn events (`AppendTurnEvent`); this layer is what callers hold.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import partial
from types import TracebackType

from .abandoned import close_when_dropped
from .arguments import batch_refused, check_request_id, check_seconds, not_a_batch
from .engine import Engine, Lease, TurnGuard
from .errors import (
    InvalidArgument,
    JournalClosed,
    OutcomeUnknown,
    OwnerBusy,
    SessionNotFound,
    SessionNotWritable,
)
from .models import AppendResult, EventIn, OwnerInfo
from .records import TURN_RESULT, TURN_STARTED
from .sessions import SessionRow, recorded_owner
from .turn_slots import TurnSlot, must_not_wait
from .turn_writers import OUTCOME_UNKNOWN_RESULT, TurnWriter, failed_result, result_data

__all__ = [
    "Owner",
    "Turn",
    "check_lease",
    "check_turn",
    "check_unsettled",
    "open_turn_after",
    "take_over",
]


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
                outcome = failed_result(error)
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
