"""The state index: the view's `states` database, the sessions of each lifecycle state in
session-id order, so a listing filtered by state reads only the rows it returns (SPEC 7.2,
7.7) instead of every row.

    states   u8 state (its wire number) + session id (utf-8) -> u64 incarnation + CRC32

One entry per visible session (a staged import has none until it is imported), written
and deleted in the write transaction that writes or deletes the session's row (the
projector's flush), so it is rebuilt with the rows and never lags them. Within a state the
keys sort as the `sessions` keys do (byte order of the id): a filtered listing returns the
rows the unfiltered listing would, filtered, in the same order, and a page token (the id
of the page's last session) resumes it the same way.

An entry is trusted only as far as it agrees with the row it names: a row that is missing,
in another state or of another incarnation is damage (`JournalCorrupt` naming `index`),
never a wrong listing. An entry missing for a row cannot be seen from the listing; the
file check at open checks every entry's CRC, and `verify()` compares the whole index with
one rebuilt from the log.
"""

from __future__ import annotations

from collections.abc import Iterator

import lmdb

from ..models import SessionState
from ..sessions import SessionRow
from .view_codec import U64, corrupt, listed_row, seal, u64_value

__all__ = ["StateIndex"]


def _prefix(state: int) -> bytes:
    if not 0 <= state <= 0xFF:
        raise corrupt(f"a session row in state {state}, which has no states entry")
    return bytes((state,))


class StateIndex:
    """The `states` database of one LMDB environment (and its `sessions`, which the
    entries name). Every method works in the caller's transaction."""

    __slots__ = ("_db", "_sessions")

    def __init__(self, db: lmdb._Database, sessions: lmdb._Database) -> None:
        self._db = db
        self._sessions = sessions

    def put(self, txn: lmdb.Transaction, state: int, session_id: str, incarnation: int) -> None:
        key = _prefix(state) + session_id.encode()
        txn.put(key, seal(key, U64.pack(incarnation)), db=self._db)

    def delete(self, txn: lmdb.Transaction, state: int, session_id: str) -> None:
        txn.delete(_prefix(state) + session_id.encode(), db=self._db)

    def rows(
        self, txn: lmdb.Transaction, state: int, after_id: str | None = None
    ) -> Iterator[SessionRow]:
        """The rows of the sessions in `state`, in session-id order, after `after_id` when
        given: one index entry and one row read per row yielded."""
        prefix = _prefix(state)
        cursor = txn.cursor(db=self._db)
        start = prefix if after_id is None else prefix + after_id.encode()
        positioned = cursor.set_range(start)
        if positioned and after_id is not None and cursor.key() == start:
            positioned = cursor.next()
        while positioned:
            key = cursor.key()
            if key[:1] != prefix:
                return
            incarnation = u64_value(key, cursor.value(), "states")
            session_key = key[1:]
            raw = txn.get(session_key, db=self._sessions)
            row = None if raw is None else listed_row(session_key, raw)
            if row is None or row.state != state or row.incarnation != incarnation or row.staged:
                found = "no row" if row is None else f"incarnation {row.incarnation}"
                raise corrupt(
                    f"the states entry {key[:40]!r} names incarnation {incarnation} in "
                    f"state {state}, but the session's row says "
                    + (found if row is None else f"{found} in state {row.state}")
                )
            yield row
            positioned = cursor.next()

    def counts(self, txn: lmdb.Transaction) -> dict[str, int]:
        """How many sessions each state has (its value -> count, states with none left
        out), from the keys alone: no row is read (`stats`)."""
        by_wire: dict[int, int] = {}
        for key in txn.cursor(db=self._db).iternext(keys=True, values=False):
            if not key:
                raise corrupt("an empty states key")
            by_wire[key[0]] = by_wire.get(key[0], 0) + 1
        found: dict[str, int] = {}
        for wire, count in sorted(by_wire.items()):
            try:
                found[SessionState.from_wire(wire).value] = count
            except KeyError:
                raise corrupt(f"states entries of state {wire}, which does not exist") from None
        return found

    def entries(self, txn: lmdb.Transaction) -> dict[tuple[int, bytes], int]:
        """(state, session id bytes) -> incarnation of every entry (for `verify`)."""
        found: dict[tuple[int, bytes], int] = {}
        for key, raw in txn.cursor(db=self._db):
            if not key:
                raise corrupt("an empty states key")
            found[key[0], bytes(key[1:])] = u64_value(key, raw, "states")
        return found
