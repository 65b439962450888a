"""Threads of the journal that use a store, made safe across `fork()`.

Each such object (the expiry timer, the zero-filler, the shared waiter) holds its `busy`
lock while its thread uses the store. A `ForkPause` registry, one per kind of object,
makes `fork()` take every member's lock first, so the child's copies of the store's files
and environments are idle; both sides release them afterwards (the child may first run
`in_child` on each member: closing its copies of descriptors only the parent's thread
used).

Then `TRANSACTIONS`, the gate every LMDB transaction of the process passes (`View.begin`),
makes `fork()` wait until no other thread is inside one, holding new ones out meanwhile:
the child inherits no LMDB operation in flight, so it can close its copies of the
environments (py-lmdb's close waits for in-flight operations, which never end in a child)
and open the store again. Its hooks are registered when this module is imported, before
any registry's, so they run after every registry's pause and before their resumption.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Final, Generic, Protocol, TypeVar

__all__ = ["INHERITED", "TRANSACTIONS", "ForkGate", "ForkPause", "Inheritable", "Pausable"]


class ForkGate:
    """A section threads enter and leave (nesting within a thread counts once), which
    `fork()` waits to be empty of other threads. The forking thread may be inside itself
    (a callback that forks): it is not waited for.

    No lock is taken on the way in or out, so a KeyboardInterrupt landing there cannot
    leave one held: a thread puts its id in a set (one atomic operation under the GIL)
    and then looks whether a fork is under way (if so it steps out and waits); the forking
    side first marks the fork, then waits for the set to hold no other live thread. An
    entry an interrupt left behind is dropped by that thread's next leave, as the thread
    drops the holder it did not leave (`_dropped`), or when the thread is gone; a fork
    waits for it `_WAIT_S` at most."""

    def __init__(self) -> None:
        self._inside: set[int] = set()
        self._forking = False
        self._local = threading.local()
        # In a forked child: whether a thread was inside at the fork (the forking one, in
        # a callback; or another that outlasted the wait): the child's copies then hold a
        # transaction of the parent's.
        self.held_at_fork = False
        self._timed_out = False
        os.register_at_fork(
            before=self._pause, after_in_parent=self._resume, after_in_child=self._child
        )

    def enter(self, holder: object) -> None:
        """Count this thread inside for `holder` (weakly referenced: a `_Transaction`),
        until `leave(holder)`, or until `holder` is garbage: a KeyboardInterrupt at the
        start of the `__exit__` that leaves (a check point the `with` statement calls
        outside the block it protects) skips that leave, and the holder, dropped with the
        interrupt's traceback, no longer counts; dropped in this thread, it leaves then
        (`_dropped`: the actions deferred to its end run).

        The holder is stored before the thread is counted in: a signal handler or a
        holder's drop running in between then sees this thread inside, and does not
        count it out under this entry; whether to wait for a fork is told by the thread
        being counted in already, not by its holders."""
        self._local.held = [*self._held(), weakref.ref(holder, self._dropped)]
        me = threading.get_ident()
        # (Counted in already: inside a transaction, which a fork waits for. Not counted
        # yet, also when another holder of this thread waits here for a fork to end: a
        # signal handler's transaction, which waits for the fork too.)
        while me not in self._inside:
            self._inside.add(me)
            if not self._forking:
                break
            self._inside.discard(me)
            while self._forking:
                time.sleep(_STEP_S)

    def _dropped(self, ref: weakref.ref[object]) -> None:
        # (A weakref callback: runs in the thread that dropped the holder, wherever it
        # was. A holder left as it should be is no longer stored; another thread's is not
        # in this thread's list, and waits for that thread's next leave.)
        if any(mine is ref for mine in getattr(self._local, "held", ())):
            self.leave(None)

    def _held(self) -> list[weakref.ref[object]]:
        """This thread's holders inside (those that are garbage left out). Each change
        stores a new list, never changes one: a signal handler of this thread (a close
        that defers, a read) may run in the middle of another change."""
        held: list[weakref.ref[object]] = getattr(self._local, "held", [])
        return [ref for ref in held if ref() is not None]

    def leave(self, holder: object) -> None:
        """`holder`'s section ends (also when an exception cut its `enter` short, before
        or after it counted this thread in); once no holder of this thread is inside, the
        thread is out and its deferred actions run.

        Asking again after an exception finishes what an interrupted call left: a
        KeyboardInterrupt can land at any check point in here (before the holder is
        dropped, inside a deferred action), and a thread left counted inside deferred
        every later close of its journal to a leave that never came. So each caller asks
        again on any exception (`_local/view.py`); an action an interrupt cut short runs
        again (deferred actions are idempotent), one that raised an error does not."""
        held = self._local.held = [
            ref
            for ref in getattr(self._local, "held", ())
            if (alive := ref()) is not None and alive is not holder
        ]  # (one pass: `_held` and the holder's removal, once per transaction)
        if held:
            return
        self._inside.discard(threading.get_ident())
        # (Each change stores a new list, as for `held`: a leave nested in an action, a
        # signal handler's or a holder's drop, may run the same actions meanwhile.)
        local = self._local
        while deferred := getattr(local, "deferred", []):
            try:
                deferred[0]()
            except Exception:
                if local.deferred is deferred:
                    local.deferred = deferred[1:]
                raise
            if local.deferred is deferred:
                local.deferred = deferred[1:]

    def defer(self, action: Callable[[], None]) -> bool:
        """Run `action` (idempotent) as this thread leaves the section, if it is inside
        (True), else not at all (False: the caller runs it now). A signal handler runs in the thread
        it interrupts, between any two steps: one that closes a journal while that
        thread is inside an LMDB transaction closes the environments once it leaves, so
        the transaction goes on (and ends) on an environment still open."""
        if not self._held():
            return False
        local = self._local
        local.deferred = [*getattr(local, "deferred", []), action]
        return True

    def _pause(self) -> None:
        self._forking = True
        self._timed_out = False
        me = threading.get_ident()
        deadline = time.monotonic() + _WAIT_S
        while time.monotonic() < deadline:
            others = self._inside - {me}
            if not others:
                return
            alive = {thread.ident for thread in threading.enumerate()}
            self._inside -= others - alive  # (threads that ended inside: interrupted)
            time.sleep(_STEP_S)
        # Still inside (a verify of a large store): the child must not close its copies.
        self._timed_out = bool(self._inside - {me})

    def _resume(self) -> None:
        self._forking = False

    def _child(self) -> None:
        # The other threads are gone: only this one can be inside.
        me = threading.get_ident()
        mine = bool(self._held())
        self.held_at_fork = mine or self._timed_out
        self._inside = {me} if mine else set()
        self._forking = False
        self._local.deferred = []  # (the parent's closes: not the child's to run)


# A fork waits this long at most for another thread to leave, polling every step.
_WAIT_S: Final = 30.0
_STEP_S: Final = 0.0002


TRANSACTIONS: Final = ForkGate()


class Pausable(Protocol):
    busy: threading.Lock


MemberT = TypeVar("MemberT", bound=Pausable)


class ForkPause(Generic[MemberT]):
    """The members fork() waits for (held weakly: a member that is gone is not waited for)."""

    def __init__(self, in_child: Callable[[MemberT], None] | None = None) -> None:
        self._members: weakref.WeakSet[MemberT] = weakref.WeakSet()
        self._paused: list[MemberT] = []
        self._in_child = in_child
        os.register_at_fork(
            before=self._pause, after_in_parent=self._resume, after_in_child=self._child
        )

    def add(self, member: MemberT) -> None:
        self._members.add(member)

    def _pause(self) -> None:
        for member in list(self._members):
            member.busy.acquire()
            self._paused.append(member)

    def _resume(self) -> None:
        while self._paused:
            self._paused.pop().busy.release()

    def _child(self) -> None:
        if self._in_child is not None:
            for member in self._paused:
                self._in_child(member)
        self._resume()


class Inheritable(Protocol):
    def inherited(self) -> bool:
        """Whether a parent process opened it (this process is a forked child) and it is
        still open here."""

    def close(self) -> None: ...


class Inherited:
    """The journals this process (or the parent it was forked from) opened: a forked
    child's open of a store that its parent's journal holds closes the inherited ones
    first (none can be used in the child, and LMDB refuses a second open of the same
    files; which store a journal holds is not compared: a relative path and a `chdir`
    since would defeat that)."""

    def __init__(self) -> None:
        self._open: weakref.WeakSet[Inheritable] = weakref.WeakSet()
        self._closing = threading.Lock()
        # (A child gets its own: the parent's may be held by a thread at the fork.)
        os.register_at_fork(after_in_child=self._new_lock)

    def _new_lock(self) -> None:
        self._closing = threading.Lock()

    def add(self, member: Inheritable) -> None:
        self._open.add(member)

    def close_all(self) -> bool:
        """Close every inherited journal; whether there was any."""
        with self._closing:  # (two threads of a child opening at once close each once)
            inherited = [member for member in list(self._open) if member.inherited()]
            for member in inherited:
                member.close()
        return bool(inherited)


INHERITED: Final = Inherited()
