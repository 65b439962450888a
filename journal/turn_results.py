"""The recorded results of a session's ended turns, by request id (SPEC section 7.8, "A
request id runs once"): what an owner reads of them from the session's history, and what
a journal keeps of that read between the session's owners, so that an owner taken per
prompt reads only the events written since the last one's read, not the whole history."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from cursors import CursorExpired, CursorForeign, CursorFuture

from .models import Event
from .records import TURN_RESULT
from .sessions import SessionRow

__all__ = ["EndedTurns", "KeptRead", "KeptTurnResults"]

# An owner reads the history again once it keeps more than twice the results its last
# read found (at least its events / _EVENTS_PER_TURN_READ), plus _REREAD_SLACK: at most
# about 16 events read again per turn.
_REREAD_SLACK: Final = 64
_EVENTS_PER_TURN_READ: Final = 16
# How many times a whole read is made when a cut passed it while it read (each starts
# where the history begins then).
_CUT_READ_TRIES: Final = 5
# What a journal keeps between owners: the reads of at most this many results in all
# (about 300 bytes each), and of at most this many sessions (a read that found no result
# counts too), holding at most KEPT_DATA_BYTES of result data, request ids and cursors
# (a failed turn's result holds its exception's message, of any length; a request id may
# be 64 KiB), the least recently read sessions' dropped first.
KEPT_RESULTS: Final = 16_384
KEPT_DATA_BYTES: Final = 4 << 20

# request id -> (result data, its cursor); the data None when an owner dropped it to hold
# at most KEPT_DATA_BYTES (read again from the history when the request id is asked for)
Results = dict[str, tuple[bytes | None, str]]


@dataclass(frozen=True, slots=True)
class KeptRead:
    """One read of a session's results: the history it read was the one below `cursor`
    (its last event; None: it read none) while the row's incarnation, first ordinal and
    snapshot ordinal are `marker` (a trim or snapshot since changes the marker: the
    results it dropped from the readable history are then still here)."""

    marker: tuple[int, int, int]
    cursor: str | None
    results: Results
    events: int


def _marker(row: SessionRow) -> tuple[int, int, int]:
    return (row.incarnation, row.first_ordinal, row.snapshot_ordinal)


class KeptTurnResults:
    """A journal's last read of each session's results (bounded: `KEPT_RESULTS` results
    and as many sessions, `KEPT_DATA_BYTES` of result data, request ids and cursors, a
    character counted as a byte)."""

    def __init__(self, limit: int = KEPT_RESULTS, limit_bytes: int = KEPT_DATA_BYTES) -> None:
        self._limit = limit
        self._limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._reads: OrderedDict[str, tuple[KeptRead, int]] = OrderedDict()  # (, its bytes)
        self._count = 0
        self._bytes = 0

    def get(self, session_id: str) -> KeptRead | None:
        with self._lock:
            found = self._reads.get(session_id)
            return None if found is None else found[0]

    def put(self, session_id: str, read: KeptRead) -> None:
        size = 0
        for request_id, (data, cursor) in read.results.items():
            # (a result whose data the read dropped: it found more than limit_bytes)
            size += self._limit_bytes + 1 if data is None else len(data)
            size += len(request_id) + len(cursor)
        with self._lock:
            old = self._reads.pop(session_id, None)
            if old is not None:
                self._count -= len(old[0].results)
                self._bytes -= old[1]
            if len(read.results) > self._limit or size > self._limit_bytes:
                return
            self._reads[session_id] = (read, size)
            self._count += len(read.results)
            self._bytes += size
            while (
                self._count > self._limit
                or len(self._reads) > self._limit
                or self._bytes > self._limit_bytes
            ):
                _, (dropped, dropped_size) = self._reads.popitem(last=False)
                self._count -= len(dropped.results)
                self._bytes -= dropped_size


class _HeldResults:
    """Results by request id holding the data of the most recently added ones within
    `limit_bytes`, the oldest ones' dropped first (their data None: read again from the
    history when their request id is asked for). A failed turn's result holds its
    exception's message, of any length."""

    def __init__(self, limit_bytes: int, results: Results | None = None) -> None:
        self.results: Results = {}
        self._limit_bytes = limit_bytes
        self._sizes: OrderedDict[str, int] = OrderedDict()  # those holding data, oldest first
        self._bytes = 0
        for request_id, (data, cursor) in (results or {}).items():
            self.add(request_id, data, cursor)

    def add(self, request_id: str, data: bytes | None, cursor: str) -> None:
        size = self._sizes.pop(request_id, None)
        if size is not None:
            self._bytes -= size
        self.results[request_id] = (data, cursor)
        if data is None:
            return
        self._sizes[request_id] = len(data)
        self._bytes += len(data)
        while self._bytes > self._limit_bytes:
            oldest, size = self._sizes.popitem(last=False)
            self._bytes -= size
            self.results[oldest] = (None, self.results[oldest][1])


@dataclass(slots=True)
class _Reading:
    """A read of the session's results in progress: what it found so far (of request id
    `only`, when given), the events it read and where it goes on from."""

    marker: tuple[int, int, int]
    held: _HeldResults
    cursor: str | None = None
    events: int = 0
    only: str | None = None


class EndedTurns:
    """The recorded results of the session's ended turns by request id: read from its
    retained events when first asked (`replay(cursor)` replays those after `cursor`),
    then kept up to date with the results this owner records, since only the lease's
    holder writes turn events. The read starts after the journal's last read of the
    session (`kept`) when the session's readable history still begins where it did then
    (`row()` tells), else from the beginning. A result trimmed or compacted out of the
    history before that read is not known. The results' data is held up to `limit_bytes`
    (the most recent results'); an older one's is read again when its request id is
    asked for."""

    def __init__(
        self,
        session_id: str,
        row: Callable[[], SessionRow],
        replay: Callable[[str | None], Iterable[Event]],
        kept: KeptTurnResults,
        limit_bytes: int = KEPT_DATA_BYTES,
    ) -> None:
        self._session_id = session_id
        self._row = row
        self._replay = replay
        self._kept = kept
        self._limit_bytes = limit_bytes
        self._held: _HeldResults | None = None
        self._read = 0  # the results the last read found (or its events / 16)
        # (a result recorded by the turn's thread while another thread's owner.turn()
        # reads the history waits for the read, so that it is not lost)
        self._lock = threading.Lock()

    def find(self, request_id: str) -> tuple[bytes, str] | None:
        with self._lock:
            held = self._held
            if held is None:
                last = self._kept.get(self._session_id)
                reading = None if last is None else self._read_since(last)
                if reading is None:
                    reading = self._read_whole(_HeldResults(self._limit_bytes))
                held = reading.held
                kept = KeptRead(reading.marker, reading.cursor, dict(held.results), reading.events)
                self._kept.put(self._session_id, kept)
                self._held = held
                # (a long history of few turns is not read again every few turns)
                self._read = max(len(held.results), reading.events // _EVENTS_PER_TURN_READ)
            found = held.results.get(request_id)
            if found is None:
                return None
            data, cursor = found
            if data is not None:
                return data, cursor
            return self._read_again(held, request_id)

    def _read_again(self, held: _HeldResults, request_id: str) -> tuple[bytes, str] | None:
        """The result of `request_id`, whose data `held` dropped, read from the whole
        retained history again (None once it was trimmed away: forgotten, as a whole read
        would): what a retry of it gets, not a second run."""
        # (no bound: the one result is held, however large)
        reading = self._read_whole(_HeldResults(1 << 62), request_id)
        data, cursor = reading.held.results.get(request_id, (None, ""))
        if data is None:
            del held.results[request_id]
            return None
        held.add(request_id, data, cursor)
        return data, cursor

    def _read_whole(self, held: _HeldResults, only: str | None = None) -> _Reading:
        """The results of the whole retained history (of request id `only`, when given).
        A trim that passes the read while it reads makes it go on from the history's new
        beginning: what it read before is trimmed away, so the next owner reads the whole
        history again (the kept read's marker is the one before). A cut that passes it (a
        hole `verify(fix=True)` accepted) makes it read again from the beginning (a few
        times)."""
        for attempt in range(1, _CUT_READ_TRIES + 1):
            reading = _Reading(_marker(self._row()), held, only=only)
            try:
                while True:
                    try:
                        self._read_into(reading)
                        return reading
                    except CursorExpired as expired:
                        reading.cursor = expired.resume_cursor
            except CursorFuture:
                if attempt == _CUT_READ_TRIES:
                    raise
                held = _HeldResults(self._limit_bytes if only is None else 1 << 62)
        raise AssertionError("unreachable")

    def _read_since(self, last: KeptRead) -> _Reading | None:
        """The results after `last` added to it; None when the history no longer begins
        where it did for `last`."""
        held = _HeldResults(self._limit_bytes, last.results)
        reading = _Reading(last.marker, held, last.cursor, last.events)
        try:
            self._read_into(reading)
        except (CursorExpired, CursorForeign, CursorFuture):
            # (trimmed or re-created past it, which the marker check would say too, or its
            # end cut off: a hole `verify(fix=True)` accepted, SPEC 9)
            return None
        if _marker(self._row()) != last.marker:
            return None  # (after the read: a trim before it, or during it, is seen)
        return reading

    def _read_into(self, reading: _Reading) -> None:
        """Read the history after `reading.cursor` into `reading`."""
        held, only = reading.held, reading.only
        last_read: Event | None = None
        # (the last result of a request id wins: a turn whose start failed and was
        # settled as failed may have been run again, by an older release)
        for e in self._replay(reading.cursor):
            reading.events += 1
            last_read = e  # (its cursor is signed once, below: an HMAC each)
            request_id = e.request_id
            if e.type == TURN_RESULT and request_id is not None and only in (None, request_id):
                held.add(request_id, e.data, e.cursor)
        if last_read is not None:
            reading.cursor = last_read.cursor

    def recorded(self, request_id: str, data: bytes, cursor: str) -> None:
        with self._lock:
            held = self._held
            if held is not None:
                held.add(request_id, data, cursor)
                if len(held.results) > 2 * self._read + _REREAD_SLACK:
                    # Forget, and read the history again at the next find: the results
                    # trimmed away since go (a held owner's memory follows the retained
                    # history, not every turn it ever ran).
                    self._held = None

    def forget(self) -> None:
        """Read the history again at the next find (a result this owner wrote whose reply
        was lost is in it, not here)."""
        with self._lock:
            self._held = None
