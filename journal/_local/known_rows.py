"""The rows a writer's last batch of plain appends wrote, kept for its next batch (SPEC 7.1,
"Rows between batches"): valid only while nothing else committed in between, so a batch of
appends reads no row from LMDB; and which committed batches those are (`remember`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from ..engine import Append
from ..records import IdempotencyKeyUsed
from ..sessions import SessionRow

if TYPE_CHECKING:
    from .planner import Planner, Request
    from .projector import Projection
    from .view import View

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

    def remember(
        self,
        batch: list[Request],
        planner: Planner,
        projection: Projection,
        txn_id: int,
        view: View,
    ) -> None:
        """Keep the rows a committed batch of plain appends wrote in write transaction
        `txn_id`. Any other operation, or a frame with records other than events and
        idempotency keys (a creation, an expiry), forgets them: only appends are known to
        change nothing but what the projection wrote."""
        if (
            not planner.records
            or planner.rebuilt
            or any(type(r.operation) is not Append for r in batch)
            or any(type(record) is not IdempotencyKeyUsed for _, record in planner.others)
        ):
            self.forget()
            return
        self.keep(projection.rows.values(), txn_id, projection.head.next_position, id(view.env))

    def keep(
        self, written: Iterable[SessionRow], txn_id: int, next_position: int, env_id: int
    ) -> None:
        """Keep the rows a committed batch of plain appends wrote in write transaction
        `txn_id` (`remember` decides that it was one)."""
        rows = self._rows
        if len(rows) > _LIMIT:
            rows.clear()
            return
        for row in written:
            rows[row.session_id] = row
        self._valid_for = (txn_id + 1, next_position, env_id)

    def forget(self) -> None:
        self._rows.clear()
