"""Threads of the journal that use a store, made safe across `fork()`.

Each such object (the expiry timer, the zero-filler, the shared waiter) holds its `busy`
lock while its thread uses the store. A `ForkPause` registry, one per kind of object,
makes `fork()` take every member's lock first, so the child's copies of the store's files
and environments are idle; both sides release them afterwards (the child may first run
`in_child` on each member: closing its copies of descriptors only the parent's thread
used).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["ForkPause", "Pausable"]


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
