"""Opaque, HMAC-signed tokens for resuming reads: session cursors, lifecycle cursors and
page tokens.

A token is a short base64url string (59 characters) that carries a kind, the id of the key
that signed it, a scope digest (store, session, session incarnation) and a position. Callers
treat it as opaque; the journal decodes it with `TokenCodec.decode`, which rejects anything
altered, issued by another store or key ring, bound to another session or incarnation, or of
another kind, each with a distinct error (`CursorMalformed`, `CursorForeign`,
`InvalidPageToken`). Keys live in a `KeyRing`: a checksummed file in the store (0600 unless
the store is shared with a group) that supports rotation and retirement, or an external
key shared by replicas (`JOURNAL_CURSOR_KEY` or `JOURNAL_CURSOR_KEY_FILE`).

This package sits at the bottom of the dependency graph and owns `JournalError`, the root of
every error the distribution raises.
"""

from ._codec import TOKEN_LENGTH as TOKEN_LENGTH
from ._codec import Claims as Claims
from ._codec import TokenCodec as TokenCodec
from ._codec import TokenKind as TokenKind
from ._codec import scope_digest as scope_digest
from ._errors import CursorExpired as CursorExpired
from ._errors import CursorForeign as CursorForeign
from ._errors import CursorFuture as CursorFuture
from ._errors import CursorMalformed as CursorMalformed
from ._errors import InvalidPageToken as InvalidPageToken
from ._errors import JournalError as JournalError
from ._errors import KeyRingError as KeyRingError
from ._errors import TokenError as TokenError
from ._keyring import KEY_ENV as KEY_ENV
from ._keyring import KEY_FILE_ENV as KEY_FILE_ENV
from ._keyring import KeyRing as KeyRing

__all__ = [
    "KEY_ENV",
    "KEY_FILE_ENV",
    "TOKEN_LENGTH",
    "Claims",
    "CursorExpired",
    "CursorForeign",
    "CursorFuture",
    "CursorMalformed",
    "InvalidPageToken",
    "JournalError",
    "KeyRing",
    "KeyRingError",
    "TokenCodec",
    "TokenError",
    "TokenKind",
    "scope_digest",
]

# Public classes report the package users import them from (pickle, repr, docs).
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("cursors."):
        _obj.__module__ = "cursors"
del _name, _obj
