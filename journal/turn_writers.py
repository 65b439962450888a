"""How an owner writes its turns: the turn events under its lease, the results it records
(completed, cancelled, failed with what ended the turn; WATCH_OUTCOME_UNKNOWN for a turn
a dead owner left unsettled), a result whose write failed recorded before the next turn
or the release, a request id that ran refused (`TurnSettled`), and a journal's writers,
whose turns its close waits for (`TurnWriters`). Engine-neutral: `Owner` and `Turn`
(`journal.turns`) are what callers hold; this is what they write through.
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

from .engine import (
    Append,
    AppendTurnEvent,
    Lease,
    TurnGuard,
)
from .errors import (
    JournalClosed,
    SessionNotFound,
    SessionNotWritable,
    StoreUnavailable,
    TurnSettled,
)
from .models import AppendResult, Event, EventIn
from .records import TURN_RESULT, TURN_STARTED
from .sessions import SessionRow
from .turn_results import EndedTurns, KeptTurnResults
from .turn_slots import TurnSlot, must_not_wait

__all__ = [
    "OUTCOME_UNKNOWN_RESULT",
    "TurnWriter",
    "TurnWriters",
    "failed_result",
    "result_data",
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


def failed_result(error: BaseException) -> dict[str, object]:
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
                self.unrecorded(request_id, result_data(failed_result(error)), ran=False)
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
