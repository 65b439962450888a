"""The followers waiting on a journal's shared waiter (`waiter.Notifier`) and their
wake-ups: what each wait registered (counted, its stop event, its key's condition, an
asyncio future by event loop), undone exactly however the wait ends, also by a signal
handler that raises (`Registered`); and how the followers a commit concerns are woken.

`Waits` runs under its notifier's lock, which every caller holds; `wake_loops` without it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection
from typing import Any

__all__ = ["Registered", "Waits", "any_set", "wake", "wake_loops"]


class Registered:
    """What one wait of a follower registered with the waiter (`Waits.enter`), so that
    `Waits.leave` undoes exactly that, however the wait ends. Each change `enter` makes
    is marked here with no call in between, and `leave` makes no call: Python runs a
    signal handler only at a function's start, a call's return or a loop's jump back, so
    a Ctrl+C lands between two changes, never between a change and its mark. (Until
    2026-12-05 one landing between the registration and the `try` whose `finally`
    undid it, or inside that undoing, left a follower counted as waiting for good: the
    waiter thread never went idle, and a stop event kept, once set, woke every follower
    of the journal every 50 ms; a review.)"""

    __slots__ = ("followers", "key", "stop")

    def __init__(self) -> None:
        self.followers: int | None = None  # counted as waiting, for so many followers
        self.stop: int | None = None  # the id of its stop event, counted
        self.key: int | None = None  # its key, counted


class Waits:
    """The followers waiting now on one notifier whose lock is `lock`: `waiting` counts
    them (sync and asyncio), `followers` the same with a delivery thread counting its
    subscriptions. Sync followers sleep on their key's condition, or on the one of
    followers with no key; asyncio followers on a future, kept by event loop."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._cv = threading.Condition(lock)  # (followers waiting with no key)
        self._keyed: dict[int, list[Any]] = {}  # key -> [its Condition, sync waiters]
        # event loop -> its waiting futures -> (key, seen, what the wait registered)
        self._async: dict[Any, dict[Any, tuple[int | None, int, Registered]]] = {}
        self._stops: dict[int, list[Any]] = {}  # id(stop) -> [stop, waiters using it]
        self.waiting = 0  # followers waiting now (sync and asyncio)
        self.followers = 0  # the same, a delivery thread counting its subscriptions

    def counts(self) -> tuple[int, int, int]:
        """(stop events, event loops, keys) kept for the followers waiting now."""
        return len(self._stops), len(self._async), len(self._keyed)

    def stop_events(self) -> list[Any]:
        """The stop events of the followers waiting now."""
        return [stop for stop, _ in self._stops.values()]

    def enter(
        self,
        registered: Registered,
        stop: Any,
        followers: int,
        key: int | None,
        want_stops: Callable[[], None],
    ) -> threading.Condition:
        """A follower starts waiting: counted, its `stop` checked (`want_stops()` when it
        is the first wait with one), and the condition it sleeps on (its key's, else the
        one of followers with no key). What it registers is marked in `registered`,
        which `leave` undoes (see `Registered`: no call between a change and its mark)."""
        condition = self._cv
        if key is not None:
            entry = self._keyed.get(key)
            if entry is None:
                made = threading.Condition(self._lock)
                entry = self._keyed[key] = [made, 0]
            entry[1] += 1
            registered.key = key
            condition = entry[0]
        if stop is not None:
            stop_id = id(stop)
            entry = self._stops.get(stop_id)
            if entry is None:
                entry = self._stops[stop_id] = [stop, 0]
            entry[1] += 1
            registered.stop = stop_id
            if entry[1] == 1:
                want_stops()
        self.waiting += 1
        self.followers += followers
        registered.followers = followers
        return condition

    def leave(self, registered: Registered) -> None:
        """Undo what `enter` registered (idempotent). It makes no call: a Ctrl+C lands
        only at its start, before anything is undone, and its callers call it again
        then."""
        if registered.followers is not None:
            self.waiting -= 1
            self.followers -= registered.followers
            registered.followers = None
        stop_id = registered.stop
        if stop_id is not None:
            entry = self._stops[stop_id]
            entry[1] -= 1
            if entry[1] == 0:
                del self._stops[stop_id]
            registered.stop = None
        key = registered.key
        if key is not None:
            entry = self._keyed[key]
            entry[1] -= 1
            if entry[1] == 0:
                del self._keyed[key]
            registered.key = None

    def add_future(
        self, loop: Any, waiter: Any, key: int | None, seen: int, registered: Registered
    ) -> None:
        """An asyncio follower of `key` that read the head `seen` waits on `waiter`."""
        futures = self._async.get(loop)
        if futures is None:
            futures = self._async[loop] = {}
        futures[waiter] = (key, seen, registered)

    def drop_future(self, loop: Any, waiter: Any) -> None:
        """The asyncio follower's wait on `waiter` ended."""
        futures = self._async.get(loop)
        # (None: `forget_closed_loops` counted it out already.)
        if futures is not None:
            futures.pop(waiter, None)
            if not futures:
                del self._async[loop]

    def has_futures(self) -> bool:
        return bool(self._async)

    def forget_closed_loops(self) -> None:
        """Count out the futures of event loops closed while their followers waited (a
        loop closed with such tasks pending, without cancelling them: their `finally`
        never runs). Kept, they counted as waiting for good (the thread never ended) and
        held the loop, its tasks and what each follower holds."""
        for loop in [loop for loop in self._async if loop.is_closed()]:
            for _, _, registered in self._async.pop(loop).values():
                self.leave(registered)

    def futures_to_wake(
        self, moved: Callable[[int | None, int], bool] | None = None
    ) -> list[tuple[Any, list[Any]]]:
        """The waiting futures to wake, by loop (with `moved`: those it says moved)."""
        if moved is None:
            return [(loop, list(futures)) for loop, futures in self._async.items()]
        woken = []
        for loop, futures in self._async.items():
            due = [future for future, (key, seen, _) in futures.items() if moved(key, seen)]
            if due:
                woken.append((loop, due))
        return woken

    def notify_keys(self, keys: Collection[int]) -> None:
        """Wake the sync waiters with no key and those of `keys`."""
        self._cv.notify_all()
        for key in keys:
            entry = self._keyed.get(key)
            if entry is not None:
                entry[0].notify_all()

    def notify_all(self) -> None:
        """Wake every sync waiter, keyed or not."""
        self._cv.notify_all()
        for entry in self._keyed.values():
            entry[0].notify_all()


def any_set(stops: list[Any]) -> bool:
    for stop in stops:
        try:
            if stop.is_set():
                return True
        except Exception:  # its waiter calls it too, and gets the error
            return True
    return False


def wake(waiter: Any) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _wake_all(futures: list[Any]) -> None:
    for waiter in futures:
        wake(waiter)


def wake_loops(loops: list[tuple[Any, list[Any]]]) -> None:
    """One call into each event loop wakes all its futures (not one call per future)."""
    for loop, futures in loops:
        with contextlib.suppress(RuntimeError):  # that loop closed; its watchers are gone
            loop.call_soon_threadsafe(_wake_all, futures)
