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
import weakref
from collections.abc import Callable
from typing import Final, Generic, Protocol, TypeVar

__all__ = ["TRANSACTIONS", "ForkGate", "ForkPause", "Pausable"]


class ForkGate:
    """A section threads enter and leave (nesting within a thread counts once), which
    `fork()` waits to be empty of other threads. The forking thread may be inside itself
    (a callback that forks): it is not waited for."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._inside = 0
        self._closed = False
        self._local = threading.local()
        # In a forked child: whether the forking thread was inside (a callback that
        # forked): the child's copies then hold a transaction of the parent's.
        self.held_at_fork = False
        os.register_at_fork(
            before=self._pause, after_in_parent=self._resume, after_in_child=self._child
        )

    def enter(self) -> None:
        local = self._local
        depth: int = getattr(local, "depth", 0)
        if not depth:
            with self._cv:
                while self._closed:
                    self._cv.wait()
                self._inside += 1
        local.depth = depth + 1

    def leave(self) -> None:
        local = self._local
        local.depth -= 1
        if not local.depth:
            with self._cv:
                self._inside -= 1
                if self._closed:
                    self._cv.notify_all()

    def _mine(self) -> int:
        return 1 if getattr(self._local, "depth", 0) else 0

    def _pause(self) -> None:
        # Held across the fork, so the child's copy of the condition is not mid-use.
        self._cv.acquire()
        self._closed = True
        mine = self._mine()
        while self._inside > mine:
            self._cv.wait()

    def _resume(self) -> None:
        self._closed = False
        self._cv.notify_all()
        self._cv.release()

    def _child(self) -> None:
        # The other threads are gone: only this one can be inside.
        self._cv = threading.Condition(threading.Lock())
        self._inside = self._mine()
        self._closed = False
        self.held_at_fork = bool(self._inside)


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
