"""session-journal: an event-sourced journal and replay engine for agent runtimes.

The public API is what this module exports; every other module is private.
"""

from __future__ import annotations

from .errors import CursorExpired as CursorExpired
from .errors import CursorForeign as CursorForeign
from .errors import CursorFuture as CursorFuture
from .errors import CursorMalformed as CursorMalformed
from .errors import InvalidPageToken as InvalidPageToken
from .errors import JournalCorrupt as JournalCorrupt
from .errors import JournalError as JournalError
from .errors import KeyRingError as KeyRingError
from .errors import StoreIncompatible as StoreIncompatible
from .errors import TokenError as TokenError

__version__ = "0.1.0"

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
    "__version__",
]
