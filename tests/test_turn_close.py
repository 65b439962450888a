"""A journal closed while a turn's block runs in another thread (SPEC.md section 7.8)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import pytest
from _turn_blocks import TURN_WAIT_S, TurnBlock, journal_arguments, run_child
from engines import EngineFactory

from journal import Event, EventIn, Journal, JournalClosed


def _results(j: Journal, session_id: str = "s") -> list[object]:
    return [json.loads(e.data) for e in j.replay(session_id) if e.type == "turn_result"]


def test_a_close_from_another_thread_leaves_the_running_turn_settled(
    engine: EngineFactory, store: Path
) -> None:
    """A runtime that shuts down by leaving `with Journal.open(...)` while a worker
    thread runs a turn's block: `close()` returned at once, the block's next append
    raised `JournalClosed`, and the turn stayed unsettled, so the next start recorded
    WATCH_OUTCOME_UNKNOWN for a turn a live process could have run to its end (as
    `Owner.release()` from another thread did until 2026-12-06; a runtime-author trial).
    The close waits for the block, whose result is recorded before the journal closes.
    (Both engines: the close is the facade's.)"""
    with engine.open(store, durability="os") as j:
        j.create_session("s")
        owner = j.own("s")
        block = TurnBlock(owner)
        close = threading.Thread(target=j.close)
        close.start()
        close.join(0.5)  # (done at once, unless it waits for the block)
        block.finish()
        close.join(TURN_WAIT_S)
        assert not close.is_alive()
    assert block.raised == []
    with engine.open(store, durability="os") as j:
        assert j.get_session("s").open_turn is None
        assert _results(j) == [{"status": "completed"}]


def test_a_close_from_inside_a_block_does_not_wait_for_it_and_the_block_is_told(
    tmp_path: Path,
) -> None:
    """A close from inside a turn's block would wait for itself: it closes at once (it
    still waits for another owner's block in another thread, whose result is recorded).
    The block's next append raises `JournalClosed` saying the journal was closed while
    the turn ran, not only "open it again" (until 2026-12-06: a new-user trial)."""
    path = tmp_path / "store"
    with Journal.open(path, durability="os") as j:
        for session_id in ("s", "t"):
            j.create_session(session_id)
        other = TurnBlock(j.own("t"))
        closing = threading.Event()
        raised: list[BaseException] = []

        def close_when_waiting() -> None:
            assert closing.wait(TURN_WAIT_S)
            threading.Event().wait(0.5)  # (the close has begun: it waits for this block)
            other.finish()

        finisher = threading.Thread(target=close_when_waiting)
        finisher.start()
        with j.own("s") as owner:
            try:
                with owner.turn("r1") as turn:
                    turn.append([EventIn("message", b'{"n": 1}')])
                    closing.set()
                    j.close()  # (here: it would wait for itself)
                    assert j.closed
                    turn.append([EventIn("message", b'{"n": 2}')])
            except JournalClosed as error:
                raised.append(error)
        finisher.join(TURN_WAIT_S)
    assert len(raised) == 1
    message = str(raised[0])
    assert "closed while turn 'r1' of session 's' ran" in message
    assert "WATCH_OUTCOME_UNKNOWN" in message
    assert other.raised == []
    with Journal.open(path, durability="os") as j:
        assert _results(j, "t") == [{"status": "completed"}]
        assert j.get_session("s").open_turn == "r1"  # (its next owner settles it)


def test_a_ctrl_c_while_a_close_waits_for_a_turn_closes_at_once(tmp_path: Path) -> None:
    """The close's wait for a block in another thread is cut by a Ctrl+C, as a
    release's is: the journal closes at once and the interrupt is raised; the block's
    next append raises `JournalClosed` saying so."""
    with Journal.open(tmp_path / "store", durability="os") as j:
        j.create_session("s")
        block = TurnBlock(j.own("s"))
        target = threading.Condition.wait_for.__code__  # (the close's wait for the block)
        fired: list[bool] = []

        def tracer(frame: FrameType, event: str, arg: object) -> None:
            if event == "call" and frame.f_code is target and not fired:
                fired.append(True)
                signal.raise_signal(signal.SIGINT)  # (Python's handler: KeyboardInterrupt)

        _interrupted(j.close, tracer)
        assert fired
        assert j.closed
        block.finish()
    assert [type(e) for e in block.raised] == [JournalClosed]
    assert "closed while turn 'r1'" in str(block.raised[0])


def test_a_close_on_an_event_loop_does_not_wait_for_a_block_that_needs_the_loop(
    tmp_path: Path,
) -> None:
    """`with Journal.open(...)` left in a coroutine while a turn's block runs in a worker
    thread and asks the loop for something: a close that waited would wait for a block
    that waits for the loop, both for good. There it closes at once, as a release does."""
    with Journal.open(tmp_path / "store", durability="os") as j:
        j.create_session("s")
        owner = j.own("s")
        raised: list[BaseException] = []
        answers: list[str] = []

        async def answer() -> str:
            return "sent"

        def run(loop: asyncio.AbstractEventLoop, entered: threading.Event) -> None:
            try:
                with owner.turn("r1") as turn:
                    entered.set()
                    # (bounded for liveness only: a hung loop fails the test, not the run)
                    sent = asyncio.run_coroutine_threadsafe(answer(), loop)
                    answers.append(sent.result(TURN_WAIT_S))
                    turn.append([EventIn("message", b'{"n": 1}')])
            except BaseException as error:  # (kept for the assertion below)
                raised.append(error)

        async def main() -> None:
            entered = threading.Event()
            loop = asyncio.get_running_loop()
            block = loop.run_in_executor(None, run, loop, entered)
            assert entered.wait(TURN_WAIT_S)
            j.close()  # (on the loop's thread)
            await block

        asyncio.run(main())
        assert answers == ["sent"]
        assert [type(e) for e in raised] == [JournalClosed]


def test_no_turn_starts_once_a_close_has_begun(tmp_path: Path) -> None:
    """While a close waits for a running block, another owner's turn does not start
    (nothing is written: the close would cut it short) and says the journal is closing;
    two closes at once both wait, and the journal is closed once."""
    path = tmp_path / "store"
    with Journal.open(path, durability="os") as j:
        for session_id in ("s", "t"):
            j.create_session(session_id)
        block = TurnBlock(j.own("s"))
        late = j.own("t")
        closes = [threading.Thread(target=j.close) for _ in range(2)]
        for close in closes:
            close.start()
        started = 0  # (the turns that started before the close began: they end here)
        while True:
            try:
                with late.turn(f"r{started}"):
                    pass
            except JournalClosed as error:
                refused = error
                break
            started += 1
            closes[0].join(0.01)
        assert "did not start: this journal is closing" in str(refused)
        assert j.closed  # (from its start: a watch it ended tells so)
        assert all(close.is_alive() for close in closes)  # (they wait for the block)
        block.finish()
        for close in closes:
            close.join(TURN_WAIT_S)
            assert not close.is_alive()
        assert j.closed
    assert block.raised == []
    with Journal.open(path, durability="os") as j:
        assert _results(j) == [{"status": "completed"}]
        assert _results(j, "t") == [{"status": "completed"}] * started
        assert j.get_session("t").open_turn is None


def test_a_forked_child_closes_its_copy_while_a_block_runs_in_the_parent(
    engine: EngineFactory, store: Path
) -> None:
    """A child forked while a turn's block runs in another thread of the parent closes
    its copy of the journal at once: the block runs in the parent, and the child's copy
    of its owner's slot stays taken for good (a close that waited for it hung; the
    child's copy of a local lease is let go at the fork, a JetStream one is not)."""
    with engine.open(store, durability="os") as j:
        j.create_session("s")
        block = TurnBlock(j.own("s"))
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                j.close()
                code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + TURN_WAIT_S  # (a bound for liveness only)
        done, status = os.waitpid(pid, os.WNOHANG)
        while not done and time.monotonic() < deadline:
            block.thread.join(0.01)
            done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        block.finish()
        assert done and os.waitstatus_to_exitcode(status) == 0
        assert block.raised == []
        assert _results(j) == [{"status": "completed"}]


def _interrupted(
    call: Callable[[], None], tracer: Callable[[FrameType, str, object], None]
) -> None:
    """`call()` under the profile function `tracer`, which raises SIGINT, with Python's
    own SIGINT handler: the call raises KeyboardInterrupt."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sys.setprofile(tracer)
        try:
            with pytest.raises(KeyboardInterrupt):
                call()
        finally:
            sys.setprofile(None)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_close_ends_the_watch_a_running_block_waits_in(
    engine: EngineFactory, store: Path
) -> None:
    """A turn's block in a worker thread that waits in `j.watch(...)` for an event (a
    user's approval, a tool's answer): `close()` ends pending watches, so the block goes
    on and ends; a close that waited for the block before ending the watches waited for
    good (each for the other). (Both engines: the watch's end is the facade's.)"""
    with engine.open(store, durability="os") as j:
        for session_id in ("s", "t"):
            j.create_session(session_id)
        owner = j.own("s")
        entered = threading.Event()
        raised: list[BaseException] = []
        told: list[bool] = []  # (whether the watch ended for the close: `closed` says)

        def run() -> None:
            try:
                with owner.turn("r1"):
                    entered.set()
                    for event in j.watch("t"):
                        if event.type == "approval":
                            break
                    else:
                        told.append(j.closed)
            except BaseException as error:  # (kept for the assertion below)
                raised.append(error)

        block = threading.Thread(target=run)
        block.start()
        assert entered.wait(TURN_WAIT_S)
        close = threading.Thread(target=j.close)
        close.start()
        close.join(TURN_WAIT_S)  # (a bound for liveness only)
        hung = close.is_alive()
        if hung:  # (let both go, so the run goes on)
            j.append("t", [EventIn("approval", b"{}")])
            close.join(TURN_WAIT_S)
        block.join(TURN_WAIT_S)
        assert not hung
    assert raised == []
    assert told == [True]


def test_a_close_from_a_listener_does_not_wait_for_a_block_that_waits_for_a_delivery(
    tmp_path: Path,
) -> None:
    """A subscription's listener that closes the journal, while a turn's block in another
    thread waits for what the listener does (on the journal's one delivery thread): a
    close there that waited for the block waited for good (the block for the delivery
    thread, that thread for the block), as one on an asyncio event loop would."""
    with Journal.open(tmp_path / "store", durability="os") as j:
        for session_id in ("s", "t"):
            j.create_session(session_id)
        owner = j.own("s")
        closed = threading.Event()
        waited: list[bool] = []

        def listener(event: Event) -> None:
            j.close()
            closed.set()

        j.subscribe("t", listener)

        def run() -> None:
            # (its result is refused: the journal closed under it)
            with contextlib.suppress(JournalClosed), owner.turn("r1"):
                j.append("t", [EventIn("shutdown", b"{}")])
                waited.append(closed.wait(TURN_WAIT_S))  # (a bound for liveness only)

        block = threading.Thread(target=run)
        block.start()
        block.join(TURN_WAIT_S * 2)
        assert closed.wait(TURN_WAIT_S)
    assert waited == [True]


def test_a_close_ends_the_subscription_a_running_block_waits_for(
    engine: EngineFactory, store: Path
) -> None:
    """A turn's block that waits for a subscription to end (`sub.wait()`: a listener
    collects what the block waits for) while another thread closes the journal: the
    subscription ended only once the close was past its wait for the block, which waited
    for it for good (each for the other, as with a `watch` in a block). Subscriptions end
    as the close begins, as live follows do. (Both engines: the delivery is the
    facade's.)"""
    with engine.open(store, durability="os") as j:
        for session_id in ("s", "t"):
            j.create_session(session_id)
        owner = j.own("s")
        entered = threading.Event()
        raised: list[BaseException] = []
        ended: list[tuple[bool, bool, BaseException | None]] = []
        subscription = j.subscribe("t", lambda event: None)

        def run() -> None:
            try:
                with owner.turn("r1"):
                    entered.set()
                    ended.append((subscription.wait(), j.closed, subscription.error))
            except BaseException as error:  # (kept for the assertion below)
                raised.append(error)

        block = threading.Thread(target=run)
        block.start()
        assert entered.wait(TURN_WAIT_S)
        close = threading.Thread(target=j.close)
        close.start()
        close.join(TURN_WAIT_S)  # (a bound for liveness only)
        hung = close.is_alive()
        if hung:  # (let both go, so the run goes on)
            subscription.close()
            close.join(TURN_WAIT_S)
        block.join(TURN_WAIT_S)
        assert not hung
    assert raised == []
    assert ended == [(True, True, None)]
    with engine.open(store, durability="os") as j:
        assert _results(j) == [{"status": "completed"}]


# A process whose daemon thread runs a turn's block that never ends by itself (a worker
# waiting for work), and whose main thread ends, so the interpreter exits: its `atexit`
# function closes the journal (argv[3] "close") or releases the owner ("release").
_EXITS_MID_TURN = """
import atexit, json, sys, threading
from journal import Journal
j = Journal.open(sys.argv[1], durability="os", **json.loads(sys.argv[2]))
owner = j.own("s")
entered = threading.Event()

def work():
    with owner.turn("r1"):
        entered.set()
        threading.Event().wait()

threading.Thread(target=work, daemon=True).start()
entered.wait()
atexit.register(j.close if sys.argv[3] == "close" else owner.release)
print("exiting", flush=True)
"""


@pytest.mark.parametrize("how", ["close", "release"])
def test_at_interpreter_exit_a_close_does_not_wait_for_a_daemon_threads_block(
    engine: EngineFactory, store: Path, how: str
) -> None:
    """`atexit.register(journal.close)` (or `owner.release`) in a process whose daemon
    thread runs a turn's block: the interpreter had joined every non-daemon thread
    already, and the close waited for that block with no limit, so the process never
    exited (the block waited for work that the ended main thread would have given it).
    From the main thread at exit nothing waits for a block (Python does not wait for its
    daemon threads either): the lease goes at once, and the next owner records the turn
    as WATCH_OUTCOME_UNKNOWN. A real process; both engines (the wait is the facade's)."""
    with engine.open(store, durability="os") as j:
        j.create_session("s")
    exited, output = run_child(_EXITS_MID_TURN, [*journal_arguments(engine, store), how])
    assert exited, output
    assert output.splitlines() == ["exiting"]
    with engine.open(store, durability="os") as j:
        assert j.get_session("s").open_turn == "r1"
        with j.own("s") as owner:  # (released: not OwnerBusy)
            assert owner.recovered_turn == "r1"


# A process whose SIGTERM handler closes the journal, the signal raised (by a profile
# function) while the main thread holds a lock of its turns: the slot of the owner's one
# turn at a time (argv[3] "slot": as the turn's block ends) or the journal's set of turn
# writers ("writers": as own() adds its owner's).
_SIGNAL_CLOSES = """
import json, signal, sys, threading, weakref
from journal import Journal, JournalClosed
from journal.turn_slots import TurnSlot
from journal.turn_writers import TurnWriters
j = Journal.open(sys.argv[1], durability="os", **json.loads(sys.argv[2]))
closed = []

def on_sigterm(signum, frame):
    j.close()
    closed.append(j.closed)

signal.signal(signal.SIGTERM, on_sigterm)
caller, callee = {
    "slot": (TurnSlot.free.__code__, threading.Condition.notify_all.__code__),
    "writers": (TurnWriters.add.__code__, weakref.WeakSet.add.__code__),
}[sys.argv[3]]

def profile(frame, event, arg):
    if event == "call" and frame.f_code is callee and frame.f_back.f_code is caller:
        if not closed:
            signal.raise_signal(signal.SIGTERM)  # (its handler runs here, at once)

sys.setprofile(profile)
try:
    with j.own("s") as owner, owner.turn("r1"):
        pass
except JournalClosed as error:
    print("refused:", type(error).__name__)
sys.setprofile(None)
print("closed:", closed, flush=True)
"""


@pytest.mark.parametrize("held", ["slot", "writers"])
def test_a_signal_handler_closes_while_its_thread_holds_a_lock_of_the_turns(
    engine: EngineFactory, store: Path, held: str
) -> None:
    """A SIGTERM handler that closes the journal runs in the main thread, between any
    two of its steps, also while it holds a lock of its owners' turns (its turn's block
    ending; `own()` adding the owner): the close took that lock again and waited for
    itself for good. It closes (a block of this thread is not waited for), and what the
    main thread was doing goes on: the turn that ended is recorded, an `own()` under way
    is refused with `JournalClosed`. A real process and a real signal, raised where the
    lock is held; both engines (the close is the facade's)."""
    with engine.open(store, durability="os") as j:
        j.create_session("s")
    exited, output = run_child(_SIGNAL_CLOSES, [*journal_arguments(engine, store), held])
    assert exited, output
    refused = ["refused: JournalClosed"] if held == "writers" else []
    assert output.splitlines() == [*refused, "closed: [True]"]
    with engine.open(store, durability="os") as j:
        assert _results(j) == ([{"status": "completed"}] if held == "slot" else [])
        assert j.get_session("s").open_turn is None


class _HeldReaders:
    """A subscription's page readers whose `close` (called once, on the delivery thread,
    as the subscription ends) says it began and waits for `gate` (a bound) first."""

    def __init__(self, inner: object, entered: threading.Event, gate: threading.Event) -> None:
        self.inner, self._entered, self._gate = inner, entered, gate
        self.finished = threading.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def __enter__(self) -> _HeldReaders:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()  # type: ignore[attr-defined]

    def close(self) -> None:
        self._entered.set()
        self._gate.wait(1.0)  # (a bound: the close below must wait this long for it)
        self.inner.close()  # type: ignore[attr-defined]
        self.finished.set()


class _HeldReadersEngine:
    """A local engine whose `readers()` for a subscription are `_HeldReaders`."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.entered, self.gate = threading.Event(), threading.Event()
        self.held: list[_HeldReaders] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def readers(self) -> object:
        readers = _HeldReaders(self._inner.readers(), self.entered, self.gate)  # type: ignore[attr-defined]
        self.held.append(readers)
        return readers

    def read(self, *args: object) -> object:
        *rest, readers = args
        inner = readers.inner if isinstance(readers, _HeldReaders) else readers
        return self._inner.read(*rest, inner)  # type: ignore[attr-defined]


def test_a_close_joins_the_delivery_thread_that_ended_while_it_waited_for_a_block(
    tmp_path: Path,
) -> None:
    """The delivery thread ends the subscriptions as a close begins (before its wait for
    turn blocks), and is joined in the close's last step, before the engine closes: one
    that had ended its loop during the wait was no longer known there and not joined,
    so the close returned (and closed the engine) while the thread still released the
    subscriptions' readers, and `wait()` of one was not yet true after `close()`."""
    from journal._local import open_local

    store = str(tmp_path / "store")
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
        j.create_session("t")
    engine = _HeldReadersEngine(
        open_local(store, (False, False, "os", 1 << 26, None, False), None, None, None)
    )
    j = Journal.over(engine)  # type: ignore[arg-type]
    subscription = j.subscribe("t", lambda event: None)
    block = TurnBlock(j.own("s"))
    after_close: list[bool] = []

    def close() -> None:
        j.close()
        after_close.append(subscription.wait(0))

    closing = threading.Thread(target=close)
    closing.start()
    assert engine.entered.wait(TURN_WAIT_S)  # (the delivery thread ends the subscription)
    block.finish()  # (the close goes on past its wait for the block)
    closing.join(TURN_WAIT_S)
    engine.gate.set()
    assert not closing.is_alive()
    assert block.raised == []
    assert after_close == [True]
