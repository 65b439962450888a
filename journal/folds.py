"""Folds: a session's state as a pure reducer applied to its events, restored by reading
(from the session's latest usable snapshot or checkpoint, then the events after it) and
changed by appending (`update`: an atomic read-modify-write on `expected_last_ordinal`).

A fold uses only the public `Journal` API (`get_session`, `snapshot`, `checkpoint`,
`replay`, `append`, `compact_session`, `checkpoint_session`, `subscribe`), so it works
over every engine. SPEC section 7.11 states the guarantees.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Generic, TypeAlias, TypeVar, overload

import msgspec

from .abandoned import Detachable, close_when_dropped
from .arguments import MAX_BATCH_BYTES
from .errors import CursorExpired, InvalidArgument, JournalClosed, JournalError, OrdinalConflict
from .fold_codecs import Codec, JsonCodec, same_json
from .models import Event, EventIn, Snapshot

if TYPE_CHECKING:
    from .facade import Journal
    from .subscriptions import ErrorHandler, Subscription

__all__ = ["STATE_CHANGED", "Fold"]

StateT = TypeVar("StateT")
ResultT = TypeVar("ResultT")
# What an update's `fn` returns as its events (see `Fold.update`).
UpdateEvents: TypeAlias = "list[EventIn] | tuple[EventIn, ...] | EventIn | None"

# The event `Fold.set` appends; a JSON fold merges it into a dict state by itself.
STATE_CHANGED: Final = "state_changed"
DEFAULT_TRIES: Final = 64
# Backoff between tries after a conflict: uniform in [0, min(cap, base * 2**try)].
_BACKOFF_BASE_S: Final = 0.0005
_BACKOFF_CAP_S: Final = 0.05
# How long an update waits for reads to show what the session is known to hold.
_CATCH_UP_S: Final = 5.0
_CATCH_UP_STEP_S: Final = 0.001
# How many times `snapshot()` stores again after another process stored a newer one.
_STORE_TRIES: Final = 4
# How many restores in a row without progress a following fold makes when the history
# after it was compacted away before its subscription began.
_RESTORE_TRIES: Final = 4

_log: Final = logging.getLogger("journal")


class _Envelope(msgspec.Struct, array_like=True, frozen=True):
    """What a fold stores as snapshot or checkpoint data: whose it is, and its state."""

    magic: str
    version: int | str
    state: bytes


_MAGIC: Final = "journal.fold/1"
_envelope_encoder: Final = msgspec.msgpack.Encoder()
_envelope_decoder: Final = msgspec.msgpack.Decoder(_Envelope)
_json_object: Final = msgspec.json.Decoder(dict[str, Any])
_json_encoder: Final = msgspec.json.Encoder()


def _encodable(version: int | str) -> bool:
    try:
        _envelope_encoder.encode(version)
    except (OverflowError, ValueError):  # a huge int, a lone surrogate
        return False
    return True


def _envelope(data: bytes) -> _Envelope | None:
    """The fold envelope in snapshot data (None: not a fold's)."""
    try:
        envelope = _envelope_decoder.decode(data)
    except msgspec.DecodeError:
        return None
    return envelope if envelope.magic == _MAGIC else None


class _Turnstile:
    """A lock granted in the order it was asked for (`update`s of one process are
    applied in the order they were called). Not reentrant: an update's `fn` that calls
    `update` again is refused. An asker interrupted while waiting gives its turn away."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._next = 0
        self._serving = 0
        self._abandoned: set[int] = set()
        self._owner: int | None = None

    def __enter__(self) -> None:
        with self._cv:
            if self._owner == threading.get_ident():
                raise InvalidArgument(
                    "update() or set() was called from inside an update's fn: return the "
                    "events instead (an update appends what fn returns)"
                )
            ticket = self._next
            self._next += 1
            try:
                while self._serving != ticket:
                    self._cv.wait()
            except BaseException:
                self._abandoned.add(ticket)
                self._advance()
                raise
            self._owner = threading.get_ident()

    def __exit__(self, *exc: object) -> None:
        with self._cv:
            self._owner = None
            self._serving += 1
            self._advance()

    def _advance(self) -> None:
        while self._serving in self._abandoned:
            self._abandoned.discard(self._serving)
            self._serving += 1
        self._cv.notify_all()


def _outcome(value: object) -> tuple[list[EventIn], object]:
    """An update's `fn` result as (events, result)."""
    result: object = None
    paired = False
    if (
        type(value) is tuple
        and len(value) == 2
        and not (isinstance(value[0], EventIn) and isinstance(value[1], EventIn))
    ):
        paired = True
        value, result = value  # (events, result); two EventIns are two events
    if value is None:
        return [], result
    if isinstance(value, EventIn):
        return [value], result
    if isinstance(value, (list, tuple)) and all(isinstance(e, EventIn) for e in value):
        return list(value), result
    what = type(value).__name__
    raise InvalidArgument(
        "an update's fn must return the events to append (a list or tuple of EventIn, one "
        "EventIn, or [] or None for none), or a pair (events, result); it returned "
        + (f"a pair whose events are a {what}" if paired else f"a {what}")
    )


class Fold(Generic[StateT]):
    """A session's state: `apply(state, event) -> state` over its events from `initial`
    (made by `Journal.fold`; see there for the arguments).

    `state` is the state after every event up to `ordinal` (treat it as read-only:
    reducers return new states). `refresh()` catches up with events appended since;
    `follow=True` keeps it current on the journal's delivery thread. `update(fn)` and
    `set(partial)` change the session; `snapshot()` stores the state so the next fold of
    the session starts there. Thread-safe.
    """

    def __init__(
        self,
        journal: Journal,
        session_id: str,
        apply: Callable[[StateT, Event], StateT] | None,
        initial: StateT,
        codec: Codec[StateT] | None,
        version: int | str,
        follow: bool,
        snapshot_every: int | None,
        tries: int,
        on_error: ErrorHandler | None,
    ) -> None:
        if apply is not None and not callable(apply):
            raise InvalidArgument(f"apply must be a callable or None, got {type(apply).__name__}")
        if codec is None:
            codec = JsonCodec()
        elif not (
            callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))
        ):
            raise InvalidArgument(
                "codec must have encode(state) -> bytes and decode(bytes) -> state methods "
                "(journal.JsonCodec, for example)"
            )
        if type(version) not in (int, str) or not _encodable(version):
            raise InvalidArgument(
                f"version must be an int (below 2^63 in size) or a str (of UTF-8), got {version!r}"
            )
        if type(follow) is not bool:
            raise InvalidArgument(f"follow must be a bool, got {follow!r}")
        if snapshot_every is not None and (type(snapshot_every) is not int or snapshot_every < 1):
            raise InvalidArgument(
                f"snapshot_every must be an int >= 1 or None, got {snapshot_every!r}"
            )
        if snapshot_every is not None and journal.readonly:
            raise InvalidArgument("snapshot_every needs a writable journal (it writes checkpoints)")
        if type(tries) is not int or tries < 1:
            raise InvalidArgument(f"tries must be an int >= 1, got {tries!r}")
        if on_error is not None and not callable(on_error):
            raise InvalidArgument("on_error must be a callable or None")
        self._journal = journal
        self.session_id = session_id
        self.version = version
        self._apply = apply
        self._initial = initial
        self._codec = codec
        self._json = isinstance(codec, JsonCodec)
        self._every = snapshot_every
        self._tries = tries
        self._lock = threading.RLock()
        self._turnstile = _Turnstile()
        self._state = initial
        self._ordinal = 0
        self._start_cursor: str | None = None
        self._last: Event | None = None
        self._stored_at = 0  # the ordinal of the last snapshot or checkpoint seen or made
        self._failed_at = 0  # the ordinal an automatic checkpoint last failed at
        self._subscription: Subscription[Event] | None = None
        # The follow subscription as the dropped-fold finalizer sees it (a restart after
        # CursorExpired replaces it): the finalizer may not refer to the fold itself.
        self._followed: list[Subscription[Event] | None] = [None]
        self._dropped: Detachable | None = None
        self._on_error = on_error
        self._following = follow  # (until closed, or an error ends it: `following`)
        with self._lock:
            self._load()
            due = self._due()
        if due:
            self._auto_checkpoint()  # restored from far behind: the next fold starts here
        if follow:
            with self._lock:  # (a restart on the delivery thread waits for this)
                self._subscription = self._follow_restored()
            followed = self._followed
            # Dropped while following: stop (the delivery thread would fold every later
            # event into a state nobody can read, for the life of the process).
            self._dropped = close_when_dropped(
                self,
                lambda: _close_followed(followed),
                f"the fold of {session_id!r} was dropped while following and stops "
                "following now: close() it, or use `with journal.fold(...) as fold:`",
                lambda: _open_followed(followed),
            )

    def __repr__(self) -> str:
        return f"<Fold of {self.session_id!r} at ordinal {self._ordinal}, version {self.version!r}>"

    @property
    def state(self) -> StateT:
        """The state after every event up to `ordinal`."""
        return self._state

    @property
    def ordinal(self) -> int:
        """The last event folded into `state` (0: none)."""
        return self._ordinal

    @property
    def following(self) -> bool:
        """Whether the fold follows the session now (`follow=True`, not closed, and not
        ended by an error it reported to `on_error`)."""
        subscription = self._subscription
        # (A subscription that ended with an error is being replaced, unless that error
        # ended the following; one that ended without one reached the session's end.)
        return (
            self._following
            and subscription is not None
            and (not subscription.closed or subscription.error is not None)
        )

    @property
    def cursor(self) -> str | None:
        """The cursor after `ordinal` (None when the fold starts at the session's start)."""
        last = self._last
        return self._start_cursor if last is None else last.cursor

    # -- reading ---------------------------------------------------------------------------

    def refresh(self) -> StateT:
        """Fold in the events appended since (by anyone); the new state."""
        with self._lock:
            try:
                self._catch_up()
            except CursorExpired:
                # History after `ordinal` left meanwhile (compacted under a newer snapshot):
                # start again from the newest one this fold can use, or say it cannot.
                self._load()
            state, due = self._state, self._due()
        if due:
            self._auto_checkpoint()
        return state

    def _load(self) -> None:
        """Start from the newest usable snapshot or checkpoint of this version (or from
        `initial`), then fold every retained event after it (under the lock)."""
        journal = self._journal
        for attempt in range(4):
            meta = journal.get_session(self.session_id)
            found: list[tuple[Snapshot, StateT]] = []
            not_a_folds = ""  # the kind of a stored record that is not a fold envelope
            other_version: tuple[str, int | str] | None = None  # (kind, version)
            for kind, stored in (
                ("checkpoint", journal.checkpoint(self.session_id)),
                ("snapshot", journal.snapshot(self.session_id)),
            ):
                if stored is None:
                    continue
                envelope = _envelope(stored.data)
                if envelope is None:
                    not_a_folds = kind
                    continue
                if envelope.version != self.version:
                    other_version = (kind, envelope.version)
                    continue
                found.append((stored, self._decode(envelope.state, kind, stored.ordinal)))
            found.sort(key=lambda item: item[0].ordinal, reverse=True)
            for stored, state in found:
                self._reset(state, stored.ordinal, stored.cursor)
                try:
                    self._catch_up()
                except CursorExpired:
                    continue  # the history after it left (a stale checkpoint)
                return
            if meta.first_ordinal <= 1:
                self._reset(self._initial, 0, None)
                try:
                    self._catch_up()
                except CursorExpired:
                    continue  # trimmed meanwhile: look for the snapshot that says why
                return
            if attempt == 3 or not found:
                break
        # The way out depends on what stands for the lost events (a version that wrote
        # them applies only to a fold's record of another version).
        if other_version is not None:
            kind, version = other_version
            why = (
                f"its {kind} is of version {version!r}: fold with version={version!r}, or "
                "keep history (a checkpoint) when you snapshot a fold whose reducer may change"
            )
        elif not_a_folds:
            why = (
                f"its {not_a_folds} is not a fold's (compact_session's own data): start from "
                "that data yourself (snapshot() and a replay from its cursor), or snapshot "
                "the session with a fold's snapshot(compact=True)"
            )
        else:
            why = (
                "no snapshot or checkpoint of this fold stands for them: let a fold store "
                "checkpoints (snapshot_every=, or snapshot()) before history leaves, or keep "
                "more of it (the session's history window)"
            )
        raise CursorExpired(
            f"the fold of session {self.session_id!r} (version {self.version!r}) cannot be "
            f"restored: events before ordinal {meta.first_ordinal} are no longer retained "
            f"and {why}",
            earliest_ordinal=meta.first_ordinal,
        )

    def _decode(self, data: bytes, kind: str, ordinal: int) -> StateT:
        try:
            return self._codec.decode(data)
        except Exception as error:
            raise InvalidArgument(
                f"the {kind} of session {self.session_id!r} through ordinal {ordinal} "
                f"(version {self.version!r}) does not decode with this fold's codec "
                f"({error}): give the codec that wrote it, or another version= to refold"
            ) from error

    def _reset(self, state: StateT, ordinal: int, cursor: str | None) -> None:
        self._state = state
        self._ordinal = ordinal
        self._start_cursor = cursor
        self._last = None
        self._stored_at = ordinal
        self._failed_at = 0

    def _catch_up(self) -> None:
        """Fold every retained event after `ordinal` (under the lock). The state kept is
        the one after the last event applied, also when the reducer raises."""
        state = self._state
        ordinal = self._ordinal
        last = self._last
        step = self._step
        try:
            for event in self._journal.replay(self.session_id, cursor=self.cursor):
                if event.ordinal != ordinal + 1:
                    # (Only from the session's start: a cursor resumes exactly.)
                    raise CursorExpired(
                        f"events {ordinal + 1}..{event.ordinal - 1} of session "
                        f"{self.session_id!r} left the retained range while it was folded",
                        earliest_ordinal=event.ordinal,
                    )
                state = step(state, event)
                ordinal = event.ordinal
                last = event
        finally:
            self._state, self._ordinal, self._last = state, ordinal, last

    def _step(self, state: StateT, event: Event) -> StateT:
        if self._json and event.type == STATE_CHANGED and isinstance(state, dict):
            try:
                changes = _json_object.decode(event.data)
            except msgspec.DecodeError:
                changes = None  # not one `set` wrote: the reducer's business
            if changes is not None:
                merged = dict(state)
                merged.update(changes)
                return merged  # type: ignore[return-value]
        if self._apply is None:
            return state
        return self._apply(state, event)

    def _follow(self) -> Subscription[Event]:
        # The listener refers to the fold weakly, so a fold dropped without close() is
        # collected (and its subscription closed: `close_when_dropped` above).
        listener = weakref.WeakMethod(self._deliver)
        handler = weakref.WeakMethod(self._follow_failed)

        def deliver(event: Event) -> None:
            method = listener()
            if method is not None:
                method(event)

        def failed(error: BaseException) -> None:
            method = handler()
            if method is not None:
                method(error)

        subscription = self._journal.subscribe(
            self.session_id, deliver, cursor=self.cursor, on_error=failed
        )
        self._followed[0] = subscription
        return subscription

    def _follow_restored(self) -> Subscription[Event]:
        """Follow from `cursor` (under the lock). History after `ordinal` compacted away
        between the restore and the subscription is refused at the call
        (`CursorExpired`): restore again from the newer snapshot and subscribe from there,
        as long as each restore gets further (a follower slower than the writers that
        compact under it keeps up by jumps, as it does when its pages are compacted
        away); after `_RESTORE_TRIES` restores in a row that did not, or a restore that
        cannot be done, it raises."""
        stuck = 0
        while True:
            try:
                return self._follow()
            except CursorExpired:
                stuck += 1
                if stuck >= _RESTORE_TRIES:
                    raise
                before = self._ordinal
                self._load()
                if self._ordinal > before:
                    stuck = 0

    def _follow_failed(self, error: BaseException) -> None:
        """The follow subscription ended with `error` (on the delivery thread). History
        after `ordinal` compacted away under a newer snapshot (`CursorExpired`): start
        again from the newest usable one and follow on, as `refresh` does. Anything else
        (or a restart that fails) goes to `on_error`, or is logged."""
        if isinstance(error, CursorExpired):
            try:
                with self._lock:
                    if not self._following:
                        return  # (closed meanwhile)
                    self._load()
                    self._subscription = self._follow_restored()
                return
            except JournalClosed:
                self._following = False
                return  # (the journal is closing: its subscriptions end without an error)
            except Exception as failed:  # (the reducer's own error included)
                error = failed
        self._following = False
        if self._on_error is not None:
            self._on_error(error)
        else:
            _log.error("the fold of %r stopped following: %s", self.session_id, error)

    def _deliver(self, event: Event) -> None:
        """The follow subscription's listener (on the delivery thread)."""
        with self._lock:
            if event.ordinal <= self._ordinal:
                return  # folded already (by refresh or update)
            if event.ordinal != self._ordinal + 1:
                self._catch_up()
                return
            self._state = self._step(self._state, event)
            self._ordinal = event.ordinal
            self._last = event
            due = self._due()
        if due:
            self._auto_checkpoint()

    # -- writing ---------------------------------------------------------------------------

    def _refresh_through(self, ordinal: int) -> None:
        """Refresh until the fold reached `ordinal`, which the session is known to hold
        (an append's or a conflict's answer): an engine whose reads may lag its commits
        for a moment (a JetStream replica) would otherwise hand `fn` the same stale state
        again. Bounded: after `_CATCH_UP_S` the fold goes on from where it got."""
        self.refresh()
        deadline = time.monotonic() + _CATCH_UP_S
        while self._ordinal < ordinal and time.monotonic() < deadline:
            time.sleep(_CATCH_UP_STEP_S)
            self.refresh()

    @overload
    def update(self, fn: Callable[[StateT], UpdateEvents], *, tries: int | None = None) -> None: ...

    @overload
    def update(
        self, fn: Callable[[StateT], tuple[UpdateEvents, ResultT]], *, tries: int | None = None
    ) -> ResultT: ...

    def update(self, fn: Callable[[StateT], object], *, tries: int | None = None) -> object:
        """Atomic read-modify-write: `fn(state)` returns the events to append (a list of
        `EventIn`; [] or None for none) or a tuple `(events, result)`. They are appended
        with `expected_last_ordinal=ordinal`; if another writer got there first
        (`OrdinalConflict`) the fold refreshes and calls `fn` again on the new state, up to
        `tries` times (default: the fold's), then raises `OrdinalConflict`. Returns
        `result` (None without one), once the fold has folded the events in.

        Updates from threads of this process are queued and applied in the order they
        were called. `fn` may be called several times: keep it free of side effects.
        """
        if not callable(fn):
            raise InvalidArgument(f"fn must be a callable, got {type(fn).__name__}")
        limit = self._tries if tries is None else tries
        if type(limit) is not int or limit < 1:
            raise InvalidArgument(f"tries must be an int >= 1, got {tries!r}")
        conflict: OrdinalConflict | None = None
        with self._turnstile:
            for attempt in range(limit):
                with self._lock:
                    state, ordinal = self._state, self._ordinal
                events, result = _outcome(fn(state))
                if not events:
                    return result
                try:
                    appended = self._journal.append(
                        self.session_id, events, expected_last_ordinal=ordinal
                    )
                except OrdinalConflict as error:
                    conflict = error
                    if attempt + 1 < limit:
                        cap = min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * (1 << min(attempt, 16)))
                        time.sleep(random.uniform(0, cap))
                    self._refresh_through(error.actual)
                    continue
                self._refresh_through(appended.last_ordinal)
                return result
        assert conflict is not None
        raise OrdinalConflict(
            f"update() of the fold of session {self.session_id!r} lost the race to other "
            f"writers {limit} times in a row (last: {conflict}): try again, or pass a "
            "larger tries=",
            expected=conflict.expected,
            actual=conflict.actual,
        )

    def set(self, partial: Mapping[str, Any]) -> None:
        """Set keys of a dict state (a fold with a JSON codec): appends one
        `state_changed` event holding the keys whose values change (nothing when none
        does), atomically like `update`."""
        if not self._json:
            raise InvalidArgument("set() needs a fold with a JSON codec (journal.JsonCodec)")
        if not isinstance(partial, Mapping) or not all(type(k) is str for k in partial):
            raise InvalidArgument("set() takes a mapping of str keys to JSON values")
        changes = dict(partial)

        def change(state: StateT) -> list[EventIn]:
            if not isinstance(state, dict):
                raise InvalidArgument(
                    f"set() needs a dict state; this fold's state is of type {type(state).__name__}"
                )
            changed = {k: v for k, v in changes.items() if k not in state or state[k] != v}
            if not changed:
                return []
            try:
                data = _json_encoder.encode(changed)
            except (TypeError, ValueError, msgspec.EncodeError) as error:
                raise InvalidArgument(
                    f"set() takes str keys and JSON-encodable values (UTF-8 text): {error}"
                ) from error
            for key, value in _json_object.decode(data).items():
                if not same_json(value, changed[key]):  # (NaN -> null, bytes -> base64...)
                    raise InvalidArgument(
                        f"set() takes JSON values: {key!r} is {changed[key]!r}, which JSON "
                        f"would store as {value!r}; convert it first"
                    )
            return [EventIn(type=STATE_CHANGED, data=data)]

        self.update(change)

    def snapshot(self, compact: bool = False) -> Snapshot | None:
        """Store the state at `ordinal` so that the next fold of this session (of this
        version) starts there: as a checkpoint, keeping every event (default), or with
        `compact=True` as the session's snapshot, dropping the events up to `ordinal`
        (`compact_session`; folds of another version can then no longer refold). None
        when there is nothing to store (no event folded yet)."""
        if type(compact) is not bool:
            raise InvalidArgument(f"compact must be a bool, got {compact!r}")
        for attempt in range(_STORE_TRIES):
            with self._lock:
                ordinal = self._ordinal
                if ordinal == 0:
                    return None
                data = self._encoded()
            try:
                if compact:
                    stored = self._journal.compact_session(self.session_id, ordinal, data)
                else:
                    stored = self._journal.checkpoint_session(self.session_id, ordinal, data)
            except InvalidArgument:
                # Another process (or fold) stored a newer snapshot or checkpoint since
                # this fold last read (or compacted the history after it away): the store
                # refuses one below it. Fold in what came since and store from there.
                if attempt == _STORE_TRIES - 1 or not self._overtaken(ordinal, compact):
                    raise
                with self._lock:
                    try:
                        self._catch_up()
                    except CursorExpired:
                        self._load()
                continue
            with self._lock:
                self._stored_at = max(self._stored_at, ordinal)
            return stored
        raise AssertionError("unreachable")  # (the last try returns or raises)

    def _overtaken(self, ordinal: int, compact: bool) -> bool:
        """Whether a snapshot (`compact`) or checkpoint through `ordinal` is refused
        because the session already has a newer one, or (a checkpoint) has no history
        right after `ordinal` any more."""
        journal = self._journal
        if compact:
            snapshot = journal.snapshot(self.session_id)
            return snapshot is not None and snapshot.ordinal > ordinal
        checkpoint = journal.checkpoint(self.session_id)
        if checkpoint is not None and checkpoint.ordinal > ordinal:
            return True
        return journal.get_session(self.session_id).first_ordinal - 1 > ordinal

    def _encoded(self) -> bytes:
        try:
            state = self._codec.encode(self._state)
        except Exception as error:
            raise InvalidArgument(
                f"the state of {self!r} does not encode with its codec ({error}): give "
                "fold() a codec that can store it"
            ) from error
        if type(state) is not bytes:
            raise InvalidArgument(
                f"the codec of {self!r} encoded the state as a {type(state).__name__}, not bytes"
            )
        data = _envelope_encoder.encode(_Envelope(_MAGIC, self.version, state))
        if len(data) > MAX_BATCH_BYTES:
            raise InvalidArgument(
                f"the state of {self!r} encodes to {len(data)} bytes, over the "
                f"{MAX_BATCH_BYTES} (64 MiB) a snapshot or checkpoint holds: keep a smaller "
                "state (large data in events, or outside the journal), or give fold() a "
                "codec that stores it smaller"
            )
        return data

    def _due(self) -> bool:
        since = max(self._stored_at, self._failed_at)
        return self._every is not None and self._ordinal - since >= self._every

    def _auto_checkpoint(self) -> None:
        """The `snapshot_every` policy: a checkpoint that fails is logged, never raised
        (it only saves reading; the update it follows is committed), and tried again
        `snapshot_every` events later, not at every event."""
        try:
            self.snapshot()
        except JournalError as error:
            with self._lock:
                self._failed_at = self._ordinal
            _log.warning("checkpoint of %r failed: %s", self, error)

    # -- ending ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop following (`follow=True`); the state stays readable. Idempotent."""
        with self._lock:
            self._following = False
            subscription = self._subscription
        if self._dropped is not None:
            self._dropped.detach()
        if subscription is not None:
            subscription.close()

    def __enter__(self) -> Fold[StateT]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_followed(followed: list[Subscription[Event] | None]) -> None:
    subscription = followed[0]
    if subscription is not None:
        subscription.close()


def _open_followed(followed: list[Subscription[Event] | None]) -> bool:
    subscription = followed[0]
    return subscription is not None and not subscription.closed
