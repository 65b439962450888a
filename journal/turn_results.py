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
# How many times a whole read is made when a trim passed it while it read (each starts
# where the history begins then).
_WHOLE_READ_TRIES: Final = 5
# What a journal keeps between owners: the reads of at most this many results in all
# (about 300 bytes each), and of at most this many sessions (a read that found no result
# counts too), holding at most KEPT_DATA_BYTES of result data (a failed turn's holds its
# exception's message, of any length), the least recently read sessions' dropped first.
KEPT_RESULTS: Final = 16_384
KEPT_DATA_BYTES: Final = 4 << 20

Results = dict[str, tuple[bytes, str]]  # request id -> (result data, its cursor)


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
    and as many sessions, `KEPT_DATA_BYTES` of result data)."""

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
        size = sum(len(data) for data, _ in read.results.values())
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


class EndedTurns:
    """The recorded results of the session's ended turns by request id: read from its
    retained events when first asked (`replay(cursor)` replays those after `cursor`),
    then kept up to date with the results this owner records, since only the lease's
    holder writes turn events. The read starts after the journal's last read of the
    session (`kept`) when the session's readable history still begins where it did then
    (`row()` tells), else from the beginning. A result trimmed or compacted out of the
    history before that read is not known."""

    def __init__(
        self,
        session_id: str,
        row: Callable[[], SessionRow],
        replay: Callable[[str | None], Iterable[Event]],
        kept: KeptTurnResults,
    ) -> None:
        self._session_id = session_id
        self._row = row
        self._replay = replay
        self._kept = kept
        self._results: Results | None = None
        self._read = 0  # the results the last read found (or its events / 16)
        # (a result recorded by the turn's thread while another thread's owner.turn()
        # reads the history waits for the read, so that it is not lost)
        self._lock = threading.Lock()

    def find(self, request_id: str) -> tuple[bytes, str] | None:
        with self._lock:
            if self._results is None:
                last = self._kept.get(self._session_id)
                read = None if last is None else self._read_since(last)
                if read is None:
                    read = self._read_whole()
                self._kept.put(self._session_id, read)
                self._results = dict(read.results)
                # (a long history of few turns is not read again every few turns)
                self._read = max(len(read.results), read.events // _EVENTS_PER_TURN_READ)
            return self._results.get(request_id)

    def _read_whole(self) -> KeptRead:
        """The results of the whole retained history, read again from its new beginning
        when it was trimmed (or cut) past the read while it read (a few times)."""
        for attempt in range(1, _WHOLE_READ_TRIES + 1):
            try:
                read = self._read_since(None)
            except (CursorExpired, CursorFuture):
                if attempt == _WHOLE_READ_TRIES:
                    raise
                continue
            assert read is not None
            return read
        raise AssertionError("unreachable")

    def _read_since(self, last: KeptRead | None) -> KeptRead | None:
        """The results after `last` added to it (None: from the beginning); None when
        the history no longer begins where it did for `last`."""
        if last is None:
            marker = _marker(self._row())  # (before: a trim during the read changes it)
            results: Results = {}
            cursor = None
            events = 0
        else:
            marker, results, cursor, events = (
                last.marker,
                dict(last.results),
                last.cursor,
                last.events,
            )
        last_read: Event | None = None
        try:
            # (the last result of a request id wins: a turn whose start failed and was
            # settled as failed may have been run again, by an older release)
            for e in self._replay(cursor):
                events += 1
                last_read = e  # (its cursor is signed once, below: an HMAC each)
                if e.type == TURN_RESULT and e.request_id is not None:
                    results[e.request_id] = (e.data, e.cursor)
        except (CursorExpired, CursorForeign, CursorFuture):
            if last is None:
                raise
            # (trimmed or re-created past it, which the marker check would say too, or its
            # end cut off: a hole `verify(fix=True)` accepted, SPEC 9)
            return None
        if last is not None and _marker(self._row()) != marker:
            return None  # (after the read: a trim before it, or during it, is seen)
        if last_read is not None:
            cursor = last_read.cursor
        return KeptRead(marker, cursor, results, events)

    def recorded(self, request_id: str, data: bytes, cursor: str) -> None:
        with self._lock:
            results = self._results
            if results is not None:
                results[request_id] = (data, cursor)
                if len(results) > 2 * self._read + _REREAD_SLACK:
                    # Forget, and read the history again at the next find: the results
                    # trimmed away since go (a held owner's memory follows the retained
                    # history, not every turn it ever ran).
                    self._results = None

    def forget(self) -> None:
        """Read the history again at the next find (a result this owner wrote whose reply
        was lost is in it, not here)."""
        with self._lock:
            self._results = None
