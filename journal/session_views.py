"""The public view of the store's sessions: a row's metadata (with its owner while that
is alive), the session listings (a page by page token, or every session lazily), and a
session's latest snapshot and checkpoint with the cursors to resume after them.

The `Journal` checks that it is open and delegates here; page tokens are signed and
checked with the journal's `TokenCodec` under a scope of the store and the state listed.
"""

from collections.abc import Callable, Generator

from cursors import TokenCodec, TokenKind, scope_digest

from .arguments import check_listing
from .engine import Engine
from .errors import InvalidPageToken, JournalCorrupt, StoreUnavailable
from .models import SessionMetadata, SessionPage, SessionState, Snapshot
from .session_cursors import SessionCursors
from .sessions import SessionRow, metadata, metadata_page, recorded_owner

__all__ = ["SessionViews"]


class SessionViews:
    """Sessions as the public API shows them, read from one engine."""

    def __init__(
        self, engine: Engine, codec: TokenCodec, store_id: bytes, cursors: SessionCursors
    ) -> None:
        self._engine = engine
        self._codec = codec
        self._store_id = store_id
        self._cursors = cursors

    def metadata(self, row: SessionRow) -> SessionMetadata:
        """Public metadata with the owner only while it is alive (uncertain is alive)."""
        owner = recorded_owner(row)
        if owner is not None and self._engine.owner_alive(row) is False:
            owner = None
        return metadata(row, owner)

    def page(
        self, page_size: int, page_token: str | None, state: SessionState | None
    ) -> SessionPage:
        """One page of sessions in session-id order (`Journal.list_sessions_page`)."""
        page_size = check_listing(page_size, state)
        engine = self._engine
        scope = scope_digest(self._store_id, purpose="list:" + (state.value if state else "*"))
        after: str | None = None
        if isinstance(page_token, SessionState):  # (`list_sessions_page(10, OPEN)`)
            raise InvalidPageToken("the page token must be a str: pass the state as state=...")
        if page_token is not None and page_token != "":
            # (Any other type too, 0 or b"" as well: the codec names it and what to pass,
            # where until 2026-12-05 a falsy one got "page_token must be a str" alone.)
            claims = self._codec.decode(page_token, TokenKind.PAGE, scope)
            after = engine.session_id_of(claims.position)
            if after is None:
                raise InvalidPageToken(
                    "this page token does not match this store's sessions (stale or "
                    "from a restored copy): start again without a token"
                )
        rows, more = engine.sessions(after, state, page_size)
        token = ""
        if more and rows:
            token = self._codec.encode(TokenKind.PAGE, scope, rows[-1].incarnation)
        return SessionPage(metadata_page(rows, engine.owners_alive), token)

    def every(
        self, state: SessionState | None, page_size: int, check_open: Callable[[], None]
    ) -> Generator[SessionMetadata, None, None]:
        """Every session (in `state`, if given), lazily; `check_open()` before each page."""
        # Pages after the last id seen, not after a page token: a token names a session,
        # and when that one is evicted meanwhile the token fails, which an iterator's
        # caller could do nothing about (id order says where to go on anyway).
        engine = self._engine
        after: str | None = None
        while True:
            check_open()
            rows, more = engine.sessions(after, state, page_size)
            yield from metadata_page(rows, engine.owners_alive)
            if not (more and rows):
                return
            after = rows[-1].session_id

    def snapshot(self, row: SessionRow) -> Snapshot | None:
        """The session's latest snapshot (`Journal.snapshot`)."""
        if not row.snapshot_position:
            return None
        stored = self._engine.snapshot(row)
        if stored is None:
            return None
        return Snapshot(
            row.session_id,
            stored.through_ordinal,
            stored.data,
            self._cursors.cursor(
                row.session_id, row.incarnation, stored.position, stored.through_ordinal
            ),
        )

    def checkpoint(self, session_id: str, row_of: Callable[[str], SessionRow]) -> Snapshot | None:
        """The session's latest checkpoint (`Journal.checkpoint`); `row_of(session_id)`
        reads the session's row (`SessionNotFound` if it is gone)."""
        row = row_of(session_id)
        try:
            stored = self._engine.checkpoint(row)
        except (JournalCorrupt, StoreUnavailable):
            # Replaced by a newer one whose writer deleted its file meanwhile? Only then
            # look again (real damage raises again).
            if self._engine.session(session_id) == row:
                raise
            row = row_of(session_id)
            stored = self._engine.checkpoint(row)
        if stored is None:
            return None
        cursor = self._cursors.cursor(
            row.session_id, row.incarnation, stored.position, stored.through_ordinal
        )
        return Snapshot(row.session_id, stored.through_ordinal, stored.data, cursor)
