"""The retention index (`View.retention`): what lets the retention pass a seal triggers
read the rows of a few sessions instead of every row (SPEC 8, "What a pass reads").

    aged     u64 incarnation -> b"" + CRC32   sessions created with an age window of
                                              their own (`max_history_age_ms`)
    meta     b"retained" -> u64, u64 + CRC32  the base of the newest sealed segment the
                                              last committed retention pass covered, and
                                              the mark of the policy it applied

A session's retained bytes grow only by appending, and an append lands in the active
segment: so a byte window can only be newly exceeded by a session with events in a segment
sealed since the last pass, which the pass finds in those segments' summaries. An import
is the exception (its sessions' events were staged in segments that may have sealed, and
been covered, before its commit): its commit removes `retained`. Age windows
are exceeded by time alone: sessions with one of their own are listed here. Both are
written in the writer's transaction (the projector, and the pass itself), so a pass that
fails or is never run (a crash after a seal) leaves `retained` where it was, and the next
pass covers the segments it missed. A stale `aged` entry (a session that is gone) names no
row and is skipped; the view is rebuilt with it.
"""

from __future__ import annotations

import lmdb

from .view_codec import U64, U64X2, corrupt, key_u64, seal, unseal

__all__ = ["RetentionIndex"]

_COVERED_KEY = b"retained"


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

    def uncover(self, txn: lmdb.Transaction) -> None:
        """Make the next pass cover every sealed segment (an import added sessions whose
        events lie in segments earlier passes covered)."""
        txn.delete(_COVERED_KEY, db=self._meta)

    def cover_through(self, txn: lmdb.Transaction, base: int, mark: int) -> None:
        txn.put(_COVERED_KEY, seal(_COVERED_KEY, U64X2.pack(base, mark)), db=self._meta)
