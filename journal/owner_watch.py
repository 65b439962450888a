"""The owner checks of a journal's live followers (SPEC 7.8): one check per unsettled
turn every `OWNER_CHECK_S`, however many followers wait on it.

A live follower that has delivered everything while its session's last turn is unsettled
waits for the turn's owner to settle it or to die. It registers the turn's row here and
waits on the journal's shared waiter like an idle follower (no timer of its own); one
daemon thread per journal, `journal-owners`, checks every registered owner once a round
(one call of the engine's `owners_alive`: the local engine reads each
owner process's start time once a round, not once per turn) and, when one is gone (or a
check fails), wakes every follower of the journal to look again itself (each then
checks twice, as before, and raises `OutcomeUnknown`). Until 2026-12-03
every such follower woke every 100 ms to read a page and check the owner itself: 1,000
`awatch` tasks of one session mid-turn used 94% of a core.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

from .engine import start_thread
from .sessions import SessionRow

__all__ = ["OwnerChecks", "OwnerWatch", "Watching"]

_log: Final = logging.getLogger("journal")

# How often each registered owner is checked.
OWNER_CHECK_S: Final = 0.1
# How long the thread stays once nothing is registered.
LINGER_S: Final = 1.0

# What identifies one owner of one unsettled turn: session, incarnation, the turn's
# request id and the lease (generation, pid, host, boot id).
_Key = tuple[str, int, str | None, int, int, str, str]


# A round's checks: whether the owner of each row is alive (None: cannot tell), in order;
# raises when a check fails (its followers then look themselves).
OwnerChecks = Callable[[list[SessionRow]], Sequence[bool | None]]


def _key(row: SessionRow) -> _Key:
    return (
        row.session_id,
        row.incarnation,
        row.turn_request_id,
        row.owner_generation,
        row.owner_pid,
        row.owner_host,
        row.owner_boot_id,
    )


class Watching:
    """A follower's registration (`OwnerWatch.watch`): it lasts until the object is
    dropped (the follower steps again, or ends). Held weakly by the owner checks, whose
    reference's callback is a deque's C `append`: dropping one runs no Python code, which
    a Ctrl+C could cut short, and the next look counts out only the registrations so
    dropped. (Until 2026-12-07 its `__del__` counted it out: a SIGINT at that function's
    start, which Python then drops with whatever a finalizer raises, left the owner
    counted, and checked every 100 ms, for good.)"""

    __slots__ = ("__weakref__",)


class OwnerWatch:
    """The owner checks of one journal (see the module docstring). `owners_alive` checks
    a round's rows (the engine's `owners_alive`: None, cannot tell, counts as alive);
    `wake` wakes every follower of the journal to look again (the shared waiter's
    `recheck`)."""

    def __init__(self, owners_alive: OwnerChecks, wake: Callable[[], None]) -> None:
        self._owners_alive = owners_alive
        self._wake = wake
        # Entered as `with self._lock`, the C lock's own `__enter__` (see `watch`).
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        self._rows: dict[_Key, SessionRow] = {}
        # The registrations (`Watching`, weakly) and the owner each waits on; those
        # dropped since, put in `_dropped` by their references' callback.
        self._watchers: dict[weakref.ref[Watching], _Key] = {}
        self._dropped: deque[weakref.ref[Watching]] = deque()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.checks = 0  # owner checks made so far (for tests and benchmarks)

    def watch(self, row: SessionRow) -> Watching:
        """Register a follower waiting for the unsettled turn of `row` (a fresh row).

        Called by a sync watch in the main thread, where a Ctrl+C lands at any call's
        return: the lock is entered as the C lock itself (`with condition:` runs
        `Condition.__enter__`, Python code, and one landing right after its acquire
        left the lock held by the main thread for good: this journal's owner checks
        stopped, so its followers waited for good on a dead owner's turn, and a close
        from another thread hung; until 2026-12-05, a review), and the registration is
        held weakly: one a Ctrl+C cut short, or whose object is gone, is counted out at
        the next look."""
        key = _key(row)
        watching = Watching()
        with self._lock:
            self._count_out()
            if self._thread is None and not self._closed:
                self._start()
            if not self._rows:
                self._cv.notify()  # (ends the lingering of a thread with nothing to check)
            if key not in self._rows:
                self._rows[key] = row
            self._watchers[weakref.ref(watching, self._dropped.append)] = key
        return watching

    def _start(self) -> None:
        """Start the thread (under the lock, which it waits for before it looks). Raises
        when no thread can start: nothing is registered, the follower gets the error
        instead of waiting for checks that never come. A start cut short by a Ctrl+C
        leaves no thread recorded: one that began takes the place itself (`_run`)."""
        thread = self._thread = threading.Thread(
            target=self._run, name="journal-owners", daemon=True
        )
        try:
            start_thread(thread)
        except BaseException:
            self._thread = None
            raise

    def registered(self) -> int:
        """How many followers' registrations are counted now (for tests)."""
        with self._lock:
            self._count_out()
            return len(self._watchers)

    def close(self) -> None:
        """End the thread (the journal is closing); idempotent. A check in progress
        finishes on its own (not waited for)."""
        with self._lock:
            self._closed = True
            self._cv.notify()

    def _count_out(self) -> None:
        """Count out the registrations dropped since the last look (under the lock): as
        many steps as were dropped, not one per registration (each follower registers
        again at each step)."""
        dropped, watchers = self._dropped, self._watchers
        while dropped:
            ref = dropped[0]  # (removed once counted out: a Ctrl+C between loses none)
            try:  # noqa: SIM105 (no Python-level `__exit__` for a Ctrl+C to land in)
                del watchers[ref]
            except (KeyError, TypeError):  # (never stored: a Ctrl+C cut its `watch` short)
                pass
            dropped.popleft()

    def _checked(self) -> list[tuple[_Key, SessionRow]]:
        """The owners to check (under the lock): those of a registration still held (an
        owner nobody waits on, or whose registration a Ctrl+C cut short, no longer)."""
        self._count_out()
        waited = set(self._watchers.values())
        for key in [key for key in self._rows if key not in waited]:
            del self._rows[key]
        return list(self._rows.items())

    def _run(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.current_thread()
            if self._thread is not threading.current_thread():
                return
        try:
            while self._look():
                pass
        finally:
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None

    def _look(self) -> bool:
        """Wait a period, then check every registered owner once; False to end."""
        with self._lock:
            if not self._closed:
                self._cv.wait(OWNER_CHECK_S)
            rows = self._checked()
            if not rows and not self._closed:
                self._cv.wait(LINGER_S)
                rows = self._checked()
            if self._closed or not rows:
                if self._thread is threading.current_thread():
                    self._thread = None
                return False
        self.checks += len(rows)
        try:
            alive = self._owners_alive([row for _, row in rows])
            gone = [key for (key, _), check in zip(rows, alive, strict=True) if check is False]
            failed = False
        except Exception:  # (closed meanwhile, an outage): the followers look themselves
            _log.debug("an owner check failed; waking every follower", exc_info=True)
            gone, failed = [], True
        if gone or failed:
            with self._lock:
                # Gone for good: its followers look twice and end (or, if a new owner
                # took over meanwhile, register that one).
                for key in gone:
                    self._rows.pop(key, None)
            self._wake()
        return True
