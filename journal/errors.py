"""The journal's error hierarchy: every error has a stable `code`, a gRPC-style `status`
and a message that says what to do next.

The root class `JournalError` and the cursor/page-token errors live in `cursors` (the bottom
of the dependency graph) and are re-exported here, so `except journal.JournalError` catches
every error the distribution raises.
"""

from __future__ import annotations

from cursors import (
    CursorExpired,
    CursorForeign,
    CursorFuture,
    CursorMalformed,
    InvalidPageToken,
    JournalError,
    KeyRingError,
    TokenError,
)

__all__ = [
    "CursorExpired",
    "CursorForeign",
    "CursorFuture",
    "CursorMalformed",
    "InvalidPageToken",
    "JournalCorrupt",
    "JournalError",
    "KeyRingError",
    "StoreIncompatible",
    "TokenError",
]


class JournalCorrupt(JournalError):
    """Bytes the log already committed no longer verify (checksum, framing or header).

    Raised where a reader meets damage it must not skip: anywhere except the unfinished tail
    of the active segment, which is "not yet written" rather than corrupt. `segment` is the
    file name and `offset` the byte offset (in the uncompressed segment) of the damage.
    """

    code = "JOURNAL_CORRUPT"
    status = "DATA_LOSS"

    def __init__(self, segment: str, offset: int, detail: str) -> None:
        self.segment = segment
        self.offset = offset
        self.detail = detail
        super().__init__(
            f"corrupt journal data in segment {segment} at byte offset {offset}: {detail}; "
            "run `journal verify` to list all damage, and restore the segment from a backup"
        )


class StoreIncompatible(JournalError):
    """The files belong to another store or to a format version this code cannot read."""

    code = "STORE_INCOMPATIBLE"
    status = "FAILED_PRECONDITION"
