"""In-process subscriptions: listeners called with a session's events (or the lifecycle
feed's changes), replay first and then live, on one delivery thread per journal however
many subscriptions it has (`Deliveries`), which sleeps on the journal's shared waiter.

A subscription is a pager (`follow.Pager`, the same page step `watch` and
`watch_sessions` use) and a listener. The delivery thread steps every subscription's
pager in turn, calls its listener once per item in order, and when no pager has anything
more waits on the shared waiter for the committed head to move (or for a pager's own
timeout: the owner check of an unsettled turn). SPEC section 7.10 states the guarantees.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final, Generic, Protocol, TypeVar

from .engine import READ_SCOPE, ReadScope
from .errors import InvalidArgument, JournalClosed
from .follow import Pager
from .waiter import Notifier

__all__ = ["Deliveries", "ErrorHandler", "Subscription", "check_listener"]

_log: Final = logging.getLogger("journal")


class _HasCursor(Protocol):
    @property
    def cursor(self) -> str: ...


ItemT = TypeVar("ItemT", bound=_HasCursor)
ErrorHandler = Callable[[BaseException], object]


def check_listener(listener: object) -> None:
    if not callable(listener):
        raise InvalidArgument(f"listener must be a callable, got {type(listener).__name__}")


def _log_error(subscription: Subscription[ItemT], error: BaseException) -> None:
    _log.error("%r ended by an error: %s", subscription, error, exc_info=error)


class Subscription(Generic[ItemT]):
    """A listener called with every item after a cursor, in order, exactly once, on the
    journal's delivery thread: what `Journal.subscribe` and `Journal.subscribe_sessions`
    return.

    `sub()` or `sub.close()` unsubscribes (idempotent). Called from another thread it
    waits for a listener call of this subscription in progress to return, so no call
    starts after it returns; called from inside the listener it returns at once and no
    further item is delivered. `cursor` is the cursor of the last item whose listener
    call returned (the cursor subscribed from before any): subscribe again from it after
    a restart and the next item is the one after it. A listener that raises ends its own
    subscription (the item it raised on is not counted as delivered) and the error goes
    to `on_error`, as do the errors that end the follow itself (`CursorExpired`,
    `OutcomeUnknown`, `SessionNotFound`, ...). A subscription to a session ends by itself,
    with no error, once the session is terminal and every event was delivered.
    """

    __slots__ = (
        "_between",
        "_call_lock",
        "_closed",
        "_ended",
        "_error",
        "_last",
        "_listener",
        "_on_error",
        "_on_thread",
        "_pager",
        "_release",
        "_scope",
        "_start_cursor",
        "_wake",
        "_woken",
        "session_id",
    )

    def __init__(
        self,
        session_id: str | None,
        pager: Pager[ItemT],
        listener: Callable[[ItemT], object],
        on_error: ErrorHandler | None,
        cursor: str | None,
        release: Callable[[], None],
        wake: Callable[[], None],
        between: Callable[[], None] | None = None,
        on_thread: Callable[[], bool] = lambda: False,
    ) -> None:
        self.session_id = session_id
        self._wake = wake
        self._woken = False  # (the delivery thread was woken by a close)
        # Whether the caller is the journal's delivery thread (see `wait`).
        self._on_thread = on_thread
        # None once ended (`_finish`): what the pager holds goes with it.
        self._pager: Pager[ItemT] | None = pager
        self._listener = listener
        self._on_error = on_error
        self._start_cursor = cursor
        self._release = release
        # Called after a page that leaves more to read (`Deliveries.add`).
        self._between = between
        self._last: ItemT | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._ended = threading.Event()
        # Held by the delivery thread while it calls the listener (see `close`).
        self._call_lock = threading.RLock()
        # The read scope of the page step in progress (None: none): `close` cancels it,
        # so an engine that waits on the network (an outage: up to 30 s) stops at once.
        self._scope: ReadScope | None = None

    def __repr__(self) -> str:
        what = "the lifecycle feed" if self.session_id is None else repr(self.session_id)
        state = "ended" if self._ended.is_set() else "closed" if self._closed else "active"
        return f"<Subscription to {what}, {state}>"

    @property
    def cursor(self) -> str | None:
        """The cursor of the last item delivered (None: none yet, subscribed without)."""
        last = self._last
        return self._start_cursor if last is None else last.cursor

    @property
    def closed(self) -> bool:
        """Whether it was closed, or ended (by an error or at the session's end)."""
        return self._closed

    @property
    def error(self) -> BaseException | None:
        """The error that ended it (None: still active, closed, or the session ended)."""
        return self._error

    def close(self) -> None:
        """Unsubscribe (idempotent; see the class docstring)."""
        self._stop()
        with self._call_lock:
            pass  # a listener call in progress on the delivery thread returns first
        if not (self._woken or self._ended.is_set()):
            # The thread releases what it holds now, not at the next commit. (Until the
            # wake-up returned: a close that a Ctrl+C cut short before it is woken by the
            # next close; until 2026-12-05 only the first close woke it, and the
            # subscription stayed until the journal's next commit: a review.)
            self._wake()
            self._woken = True

    __call__ = close

    def _stop(self) -> None:
        """No further item is delivered, and a page read in progress is cut."""
        self._closed = True
        scope = self._scope
        if scope is not None:
            scope.cancel()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the subscription has ended and released what it held (True), or
        `timeout` seconds passed (False)."""
        if timeout is not None and (
            type(timeout) not in (int, float) or not timeout >= 0 or timeout == float("inf")
        ):
            raise InvalidArgument(
                f"timeout must be None or a finite number of seconds >= 0, got {timeout!r}"
            )
        if timeout != 0 and self._on_thread() and not self._ended.is_set():
            # (It waited for itself: the thread that would end the subscription is the
            # one waiting, and every other subscription of the journal stalled with it.
            # `wait(0)` waits for nothing: it answers, False here, as it always did.)
            raise InvalidArgument(
                "wait() was called from a listener or on_error, on the journal's delivery "
                "thread, which ends subscriptions and delivers to all of them: it would "
                "wait for itself; call close() there (it returns at once), and wait() "
                "from another thread"
            )
        return self._ended.wait(timeout)

    def __enter__(self) -> Subscription[ItemT]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- on the delivery thread ------------------------------------------------------------

    def _step(self) -> tuple[bool, int | None, float | None]:
        """One page step: (still active, head to wait past or None to step again at once,
        the longest such a wait may last)."""
        scope = self._scope = ReadScope()
        token = READ_SCOPE.set(scope)
        pager = self._pager
        try:
            # (After `_scope` is set: a close from now on cancels it.)
            if self._closed or pager is None:
                return False, None, None
            items, wait_past, done = pager.step()
        except Exception as error:
            if not self._closed:  # (closed meanwhile: its read was cut, nothing to report)
                self._fail(error)
            return False, None, None
        finally:
            READ_SCOPE.reset(token)
            self._scope = None
        for item in items:
            with self._call_lock:
                if self._closed:
                    return False, None, None
                try:
                    self._listener(item)
                except BaseException as error:
                    # (SystemExit and the like too: raised here they would end the
                    # delivery thread, and with it every subscription of the journal.)
                    self._fail(error)
                    return False, None, None
                self._last = item
        if done:
            self._closed = True
            return False, None, None
        return True, wait_past, pager.wait_timeout

    def _wait_key(self) -> int | None:
        """The key of the commits that concern it (`Pager.wait_key`)."""
        pager = self._pager
        return None if pager is None else pager.wait_key

    def _fail(self, error: BaseException) -> None:
        self._closed = True
        self._error = error
        handler = self._on_error
        try:
            if handler is None:
                _log_error(self, error)
            else:
                handler(error)
        except Exception as failure:  # the handler's own error: logged, never raised
            _log.exception("on_error of %r raised %s", self, failure)

    def _finish(self) -> None:
        """Release what the pager holds and report the end (once, on the thread)."""
        self._closed = True
        # Drop the pager: the caller may keep the Subscription for long, and the pager
        # holds, besides its last event, its registration with the journal's owner
        # checks (`owner_watch`), which kept that owner checked every 100 ms and the
        # journal-owners thread running as long as the Subscription lived.
        self._pager = None
        try:
            self._release()
        except Exception:  # the journal may be closing under it: nothing to release then
            _log.debug("releasing %r failed", self, exc_info=True)
        self._ended.set()


class Deliveries:
    """The delivery thread of one journal and its subscriptions. The thread starts with
    the first subscription, ends when none is left, and is joined by `close`."""

    def __init__(self, waiter: Notifier) -> None:
        self._waiter = waiter
        self._lock = threading.Lock()
        self._subscriptions: list[Subscription[_HasCursor]] = []
        self._thread: threading.Thread | None = None
        self._closing = False

    def add(
        self,
        session_id: str | None,
        pager: Pager[ItemT],
        listener: Callable[[ItemT], object],
        on_error: ErrorHandler | None,
        cursor: str | None,
        release: Callable[[], None],
        between: Callable[[], None] | None = None,
    ) -> Subscription[ItemT]:
        """Start delivering `pager`'s items to `listener` (`release` is called once when
        the subscription ends, on the delivery thread; `between`, when given, after each
        page that leaves more to read while other subscriptions take their turn)."""
        subscription = Subscription(
            session_id,
            pager,
            listener,
            on_error,
            cursor,
            release,
            self._waiter.recheck,
            between,
            self._on_thread,
        )
        with self._lock:
            if self._closing:
                release()
                raise JournalClosed.already()
            self._subscriptions.append(subscription)  # type: ignore[arg-type]
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="journal-deliveries", daemon=True
                )
                self._thread.start()
        self._waiter.recheck()  # the thread may be waiting for the head: replay now
        return subscription

    def on_thread(self) -> bool:
        """Whether the caller is the delivery thread."""
        return self._on_thread()

    def _on_thread(self) -> bool:
        """Whether the caller is the delivery thread."""
        thread = self._thread
        return thread is not None and thread is threading.current_thread()

    def count(self) -> int:
        """Subscriptions not yet ended."""
        with self._lock:
            return len(self._subscriptions)

    def begin_close(self) -> None:
        """The journal's close begins: every subscription ends (no error is reported;
        the thread ends them, and each one's `wait()` returns), no new one starts, and
        every waiter of the journal's shared waiter looks again (live follows end). It
        does not join the thread: the close waits for turn blocks next, and a listener
        may be waiting for one. (Until 2026-12-07 they ended only once the close was past
        that wait: a block waiting in `sub.wait()` and the close waited for each other
        for good; a review.)"""
        with self._lock:
            self._closing = True
            for subscription in self._subscriptions:
                # No further item is delivered, also from the page a listener that
                # closes the journal is in (as `sub.close()` there); a read in progress
                # is cut (it may wait 30 s on the network: `close` joins the thread).
                subscription._stop()
        self._waiter.recheck()

    def close(self) -> None:
        """End every subscription (`begin_close`, if it was not called) and join the
        thread."""
        self.begin_close()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        # What each subscription waits for since its last step: (its key, the head it
        # saw, when its own timeout ends). One that nothing new concerns is not stepped
        # (no page read), so a commit to one session costs the others a look-up each.
        waits: dict[Subscription[_HasCursor], tuple[int | None, int, float | None]] = {}
        last_epoch = -1
        try:
            while True:
                # Read before the list is taken: a subscription added or closed from now
                # on makes the wait below return at once. (Read after it until
                # 2026-12-05: one added in between was in neither, and its replay began
                # only at the journal's next commit; a review.)
                epoch = self._waiter.epoch
                with self._lock:
                    if self._closing:
                        return
                    if not self._subscriptions:
                        # Under the lock that `add` takes: a subscription added from now
                        # on starts a new thread.
                        self._thread = None
                        return
                    subscriptions = list(self._subscriptions)
                everyone = epoch != last_epoch  # (a recheck: each looks again)
                last_epoch = epoch
                again = False
                wait_past: int | None = None
                timeout: float | None = None
                now = time.monotonic()
                for subscription in subscriptions:
                    if self._closing:
                        return
                    pending = None if everyone else waits.get(subscription)
                    if pending is not None:
                        key, seen, ends = pending
                        head = self._waiter.unmoved(key, seen)
                        if head is not None and (ends is None or now < ends):
                            waits[subscription] = (key, head, ends)
                            wait_past = head if wait_past is None else min(wait_past, head)
                            if ends is not None:
                                left = ends - now
                                timeout = left if timeout is None else min(timeout, left)
                            continue
                    active, past, limit = subscription._step()
                    if not active:
                        waits.pop(subscription, None)
                        self._remove(subscription)
                        continue
                    if past is None:
                        waits.pop(subscription, None)
                        again = True
                        if subscription._between is not None and len(subscriptions) > 1:
                            # Others take their turn before its next page: it keeps no
                            # read-ahead meanwhile (300 subscriptions catching up held a
                            # 1 MiB buffer each at once: 354 MB).
                            subscription._between()
                        continue
                    ends = None if limit is None else time.monotonic() + limit
                    waits[subscription] = (subscription._wait_key(), past, ends)
                    wait_past = past if wait_past is None else min(wait_past, past)
                    if limit is not None:
                        timeout = limit if timeout is None else min(timeout, limit)
                if len(waits) > len(subscriptions):  # (ended meanwhile another way)
                    current = set(subscriptions)
                    waits = {sub: wait for sub, wait in waits.items() if sub in current}
                if again or wait_past is None:
                    continue
                self._waiter.wait(wait_past, None, timeout, epoch, followers=len(waits))
        finally:
            with self._lock:
                remaining: list[Subscription[_HasCursor]] = []
                if self._closing:
                    # (`_thread` stays: `close` joins it, also when the loop ended while
                    # the close waited for turn blocks after `begin_close`; until
                    # 2026-12-07 it was cleared here, and such a close went on to close
                    # the engine while this thread still released the readers: a review.)
                    remaining, self._subscriptions = self._subscriptions, []
            for subscription in remaining:
                subscription._finish()

    def _remove(self, subscription: Subscription[_HasCursor]) -> None:
        with self._lock:
            self._subscriptions.remove(subscription)
        subscription._finish()
