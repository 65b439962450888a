"""What a caller dropped without closing it (an `Owner` not released, a `Journal` not
closed) is closed when it is garbage-collected, as an unclosed file is, with a
`ResourceWarning` saying how to close it instead.

The closing runs in a short thread of its own: a collection may run anywhere, also
inside a commit of the same journal, which the closing's own work would wait for. The
thread starts before the warning is issued, so a filter that makes warnings errors
cannot keep the resource held. At interpreter exit nothing is started (the process
takes its locks and files with it).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Final, Protocol

__all__ = ["Detachable", "close_when_dropped", "wait_for_dropped"]

_log: Final = logging.getLogger("journal")
# The closing threads still running (a deliberate module-level set: an open of a store a
# dropped journal of this process still holds waits for them, `wait_for_dropped`).
_CLOSING: Final[set[threading.Thread]] = set()
# (Reentrant: a closing thread starts under it, and a cycle collection during that start
# may finalize another dropped journal in the same thread, whose closing takes it too:
# with a plain lock that thread waited for itself for good; a review.)
_CLOSING_LOCK: Final = threading.RLock()


class Detachable(Protocol):
    """What `close_when_dropped` returns (a `weakref.finalize`)."""

    def detach(self) -> object:
        """Closed properly: nothing is to be done when the owner is collected."""


def wait_for_dropped(timeout: float) -> bool:
    """Wait up to `timeout` seconds for the closing of dropped resources in flight;
    whether there was any."""
    with _CLOSING_LOCK:
        threads = list(_CLOSING)
    for thread in threads:
        thread.join(timeout)
    return bool(threads)


def close_when_dropped(
    owner: object,
    close: Callable[[], object],
    warning: str,
    held: Callable[[], bool] = lambda: True,
) -> Detachable:
    """Arrange for `close()` once `owner` is garbage-collected, if `held()` then says it
    is still open. Neither callable may refer to `owner` (it would never be collected).
    Returns the finalizer: `detach()` it when the owner is closed properly."""
    finalizer = weakref.finalize(owner, _dropped, close, warning, held)
    finalizer.atexit = False
    return finalizer


def _dropped(close: Callable[[], object], warning: str, held: Callable[[], bool]) -> None:
    if not held():
        return  # closed meanwhile some other way (or a forked child's copy)
    thread = threading.Thread(
        target=_close_quietly, args=(close, warning), name="journal-close", daemon=True
    )
    try:
        # (Started under the lock: `wait_for_dropped` in another thread joined one it
        # listed before its start, and raised RuntimeError "cannot join thread before it
        # is started" out of `Journal.open`; a trial.)
        with _CLOSING_LOCK:
            _CLOSING.add(thread)
            try:
                thread.start()
            except RuntimeError:
                _CLOSING.discard(thread)
                raise
    except RuntimeError as e:
        if not sys.is_finalizing():  # (exiting: the process takes its resources along)
            _log.warning("%s; it could not be closed: %s", warning, e)
        return
    with contextlib.suppress(Exception):  # (raised as an error here, it reaches nobody)
        warnings.warn(warning, ResourceWarning, stacklevel=1)


def _close_quietly(close: Callable[[], object], warning: str) -> None:
    try:
        close()
    except Exception as e:  # (no caller to report to: a thread of its own)
        _log.warning("%s; closing it failed: %s", warning, e)
    finally:
        with _CLOSING_LOCK:
            _CLOSING.discard(threading.current_thread())
