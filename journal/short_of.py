"""What helps when an OS error says this process or the system ran out of descriptors or
memory (EMFILE, ENFILE, ENOMEM): nothing is wrong with the store, its files, the URL or
the credentials, and the same call succeeds once the cause is gone. Both engines say it
(a trial: an open out of descriptors said to restore `store.json` from a
backup, and on JetStream to check the URL and the credentials)."""

from __future__ import annotations

import errno
from typing import Final

__all__ = ["SHORT_OF", "short_of"]

SHORT_OF: Final[dict[int, str]] = {
    errno.EMFILE: "this process has too many files open: close what it does not need, or "
    "raise its limit (`ulimit -n`)",
    errno.ENFILE: "the system has too many files open: close some, or raise its limit",
    errno.ENOMEM: "the system is out of memory",
}


def short_of(error: BaseException) -> str | None:
    """What helps, when `error` is an OS error of running out (None: it is not one)."""
    if isinstance(error, OSError) and error.errno in SHORT_OF:
        return SHORT_OF[error.errno]
    return None
