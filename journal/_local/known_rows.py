"""The rows a writer's last batch of plain appends wrote, kept for its next batch (SPEC 7.1,
"Rows between batches"): valid only while nothing else committed in between, so a batch of
appends reads no row from LMDB."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from ..sessions import SessionRow

__all__ = ["KnownRows"]

# At most this many rows are kept (a batch that touched more forgets them).
_LIMIT: Final = 4096


class KnownRows:
    """The rows, and the (next write transaction id, next position, environment) they are
    valid for."""

    __slots__ = ("_rows", "_valid_for")

    def __init__(self) -> None:
        self._rows: dict[str, SessionRow] = {}
        self._valid_for: tuple[int, int, int] = (0, 0, 0)

    def valid(self, txn_id: int, next_position: int, env_id: int) -> dict[str, SessionRow]:
        """The rows, if nothing committed since they were written (in any process: LMDB
        numbers write transactions) and the view is the same file; else none."""
        rows = self._rows
        if rows and self._valid_for != (txn_id, next_position, env_id):
            rows.clear()
        return rows

    def keep(
        self, written: Iterable[SessionRow], txn_id: int, next_position: int, env_id: int
    ) -> None:
        """Keep the rows a committed batch of plain appends wrote in write transaction
        `txn_id` (the caller decides that it was one)."""
        rows = self._rows
        if len(rows) > _LIMIT:
            rows.clear()
            return
        for row in written:
            rows[row.session_id] = row
        self._valid_for = (txn_id + 1, next_position, env_id)

    def forget(self) -> None:
        self._rows.clear()
