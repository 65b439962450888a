"""The retention index (`View.retention`): what lets the retention pass a seal triggers
read the rows of a few sessions instead of every row (SPEC 8, "What a pass reads").

    aged     u64 incarnation -> b"" + CRC32   sessions created with an age window of
                                              their own (`max_history_age_ms`)
    meta     b"retained" -> u64, u64 + CRC32  the base of the newest sealed segment the
                                              last committed retention pass covered, and
                                              the mark of the policy it applied
             b"imported" -> u64 + CRC32       the lowest staging record's position of the
                                              sessions imported since that pass

A session's retained bytes grow only by appending, and an append lands in the active
segment: so a byte window can only be newly exceeded by a session with events in a segment
sealed since the last pass, which the pass finds in those segments' summaries. An import
is the exception (its sessions' events were staged in segments that may have sealed, and
been covered, before its commit): its commit records `imported`, and the next pass also
covers the sealed segments from the one holding that position on. Age windows
are exceeded by time alone: sessions with one of their own are listed here. Both are
written in the writer's transaction (the projector, and the pass itself), so a pass that
fails or is never run (a crash after a seal) leaves `retained` where it was, and the next
pass covers the segments it missed. A stale `aged` entry (a session that is gone) names no
row and is skipped; the view is rebuilt with it.
"""

from __future__ import annotations

import lmdb

from .view_codec import U64, U64X2, corrupt, key_u64, seal, u64_value, unseal

__all__ = ["RetentionIndex"]

_COVERED_KEY = b"retained"
_IMPORTED_KEY = b"imported"


class RetentionIndex:
    """The `aged` database and the `retained` meta entry of one LMDB environment. Every
    method works in the caller's transaction."""

    __slots__ = ("_aged", "_meta")

    def __init__(self, aged: lmdb._Database, meta: lmdb._Database) -> None:
        self._aged = aged
        self._meta = meta

    def add_aged(self, txn: lmdb.Transaction, incarnation: int) -> None:
        key = U64.pack(incarnation)
        txn.put(key, seal(key, b""), db=self._aged)

    def drop_aged(self, txn: lmdb.Transaction, incarnation: int) -> None:
        txn.delete(U64.pack(incarnation), db=self._aged)

    def aged(self, txn: lmdb.Transaction) -> list[int]:
        """The incarnations of sessions with an age window of their own."""
        cursor = txn.cursor(db=self._aged)
        return [key_u64(key, "aged") for key in cursor.iternext(keys=True, values=False)]

    def covered_through(self, txn: lmdb.Transaction, mark: int) -> int:
        """The newest sealed segment's base the last pass covered under the policy `mark`
        names (0: none, or a pass under another policy)."""
        raw = txn.get(_COVERED_KEY, db=self._meta)
        if raw is None:
            return 0
        payload = unseal(_COVERED_KEY, raw, "meta")
        if len(payload) != U64X2.size:
            raise corrupt(f"the meta entry {_COVERED_KEY!r} has {len(payload)} bytes, not 16")
        base, covered_mark = U64X2.unpack(payload)
        return int(base) if covered_mark == mark else 0

    def uncover(self, txn: lmdb.Transaction, position: int) -> None:
        """Make the next pass also cover the sealed segments from the one holding
        `position` on (an import's commit: its session, staged at `position`, has its
        events after it, in segments earlier passes may have covered)."""
        since = self.imported_since(txn)
        if since is None or position < since:
            txn.put(_IMPORTED_KEY, seal(_IMPORTED_KEY, U64.pack(position)), db=self._meta)

    def imported_since(self, txn: lmdb.Transaction) -> int | None:
        """The lowest staging position of the sessions imported since the last pass."""
        raw = txn.get(_IMPORTED_KEY, db=self._meta)
        return None if raw is None else u64_value(_IMPORTED_KEY, raw, "meta")

    def cover_through(self, txn: lmdb.Transaction, base: int, mark: int) -> None:
        txn.put(_COVERED_KEY, seal(_COVERED_KEY, U64X2.pack(base, mark)), db=self._meta)
        txn.delete(_IMPORTED_KEY, db=self._meta)
