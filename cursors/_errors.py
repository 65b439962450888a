"""The error tree: `JournalError` (root of every error in the distribution) and token errors.

`JournalError` is defined here, not in `journal`, because `cursors` sits at the bottom of the
dependency graph; `journal` re-exports it and derives all of its own errors from it.

Every class carries a stable `code` (for logs, metrics and wire protocols) and a `status`
(a gRPC-style category), and every message says what the caller should do next.
"""

from typing import Any, ClassVar

__all__ = [
    "CursorExpired",
    "CursorForeign",
    "CursorFuture",
    "CursorMalformed",
    "InvalidPageToken",
    "JournalError",
    "KeyRingError",
    "TokenError",
]


class JournalError(Exception):
    """Root of every error raised by `session-journal` (both `journal` and `cursors`).

    Catch this to handle any failure of the library; catch a subclass to handle one case.
    `code` is stable across releases, `status` groups codes by how a caller should react,
    and `message` (also `str(error)`) says what to do next.
    """

    code: ClassVar[str] = "JOURNAL_ERROR"
    status: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take other constructor arguments (offsets, ordinals): rebuild from
        # the message and the instance's attributes instead of calling __init__ again.
        return (_restore, (type(self), self.args, self.__dict__))


def _restore(cls: type[JournalError], args: tuple[Any, ...], state: dict[str, Any]) -> JournalError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class TokenError(JournalError):
    """A cursor or page token supplied by the caller cannot be used.

    Base of the token errors; catch it to handle every rejected token in one place.
    """

    code: ClassVar[str] = "TOKEN_ERROR"
    status: ClassVar[str] = "INVALID_ARGUMENT"


class CursorMalformed(TokenError):
    """The value is not a cursor of the expected kind at all.

    Raised when it is not a string, not canonical base64url of the right length, has an
    unknown format version or kind, or is a valid token of a different kind (for example a
    lifecycle cursor passed to a session watch). Nothing about its origin was checked.
    """

    code: ClassVar[str] = "CURSOR_MALFORMED"
    status: ClassVar[str] = "INVALID_ARGUMENT"


class CursorForeign(TokenError):
    """The cursor is well formed but was not issued for this place by this store.

    Either its signature does not verify under any key in the ring (another store, a
    retired key, or tampering), or it was issued for another store, session or session
    incarnation (a session deleted and re-created under the same name is a new scope).
    """

    code: ClassVar[str] = "CURSOR_FOREIGN"
    status: ClassVar[str] = "INVALID_ARGUMENT"


class CursorFuture(TokenError):
    """The cursor is authentic but points past the session head.

    The store has fewer events than the cursor claims to have seen, typically because it
    was restored from an older copy. `head_ordinal` is the session head now.
    """

    code: ClassVar[str] = "CURSOR_FUTURE"
    status: ClassVar[str] = "OUT_OF_RANGE"

    def __init__(self, message: str, *, head_ordinal: int) -> None:
        super().__init__(message)
        self.head_ordinal = head_ordinal

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only constructor arguments are not in `args`, so the default pickling
        # (cls(*args)) would fail when the error crosses a process boundary.
        return (_rebuild, (type(self), self.message, {"head_ordinal": self.head_ordinal}))


class CursorExpired(TokenError):
    """The cursor is authentic but points below the retained range of the session.

    The events it would resume from were rotated or compacted away. `earliest_ordinal` is
    the first event still retained; `resume_cursor`, when given, resumes reading there, for
    callers who choose to accept the gap explicitly.
    """

    code: ClassVar[str] = "CURSOR_EXPIRED"
    status: ClassVar[str] = "FAILED_PRECONDITION"

    def __init__(
        self, message: str, *, earliest_ordinal: int, resume_cursor: str | None = None
    ) -> None:
        super().__init__(message)
        self.earliest_ordinal = earliest_ordinal
        self.resume_cursor = resume_cursor

    def __reduce__(self) -> tuple[Any, ...]:
        # See CursorFuture.__reduce__.
        keywords = {"earliest_ordinal": self.earliest_ordinal, "resume_cursor": self.resume_cursor}
        return (_rebuild, (type(self), self.message, keywords))


class InvalidPageToken(TokenError):
    """A listing page token is malformed, forged, from another listing, or stale.

    Page tokens are not resumable positions a caller should reason about, so every failure
    to accept one is this single error; restart the listing without a token.
    """

    code: ClassVar[str] = "INVALID_PAGE_TOKEN"
    status: ClassVar[str] = "INVALID_ARGUMENT"


class KeyRingError(JournalError):
    """The cursor key ring cannot be used or changed as asked.

    Raised for a missing, unreadable or invalid key ring file, an external key that is
    unreadable or too short, and invalid operations such as retiring the active key.
    Messages never contain key material.
    """

    code: ClassVar[str] = "KEYRING_INVALID"
    status: ClassVar[str] = "FAILED_PRECONDITION"


def _rebuild(cls: type[JournalError], message: str, keywords: dict[str, Any]) -> JournalError:
    return cls(message, **keywords)
