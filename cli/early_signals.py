"""Stop signals (Ctrl+C, SIGTERM, SIGHUP) that come while the command is still starting:
Python imports click, msgspec, lmdb and the library for 0.3 to 1 s before a command
runs. `install` (the first thing `cli.run` does, before those imports) puts handlers in
place that only note the signal; then the command takes it over. A watch does
(`take_over` and `first_noted`, cli/watching.py): it stops before it began, with its end object (the
cursor it was given, null without one) and exit 130, 143 or 129, as a watch stopped
later does. Any other command gets it as if it came then (`release`): Ctrl+C raises
KeyboardInterrupt (exit 130), SIGTERM and SIGHUP have their default action.

Until 2026-12-06 SIGTERM and SIGHUP had their default action
until the watch installed its handlers (at about 0.4 s on a 2-core machine): a
supervisor stopping a watch that had just started saw it killed with no end object, as
a watch killed while printing a line is.

Only this module's own imports run before `install` (`signal`: about a millisecond).
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

__all__ = ["first_noted", "install", "note", "release", "take_over"]

_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_noted: list[int] = []
# signal -> what the noting handler replaced (only a default: one ignored, as SIGINT in
# a background job or SIGHUP under nohup, or a caller's own handler is left alone)
_replaced: dict[int, Any] = {}


def note(signum: int, frame: FrameType | None) -> None:
    """The handler `install` puts in place."""
    _noted.append(signum)


def install() -> None:
    """Note stop signals from now until `take_over` or `release` (main thread only)."""
    for signum in _STOPS:
        default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        if signal.getsignal(signum) is not default:
            continue
        try:
            _replaced[signum] = signal.signal(signum, note)
        except ValueError:  # (not the main thread: its handlers are not this command's)
            return


def take_over() -> dict[int, Any]:
    """For a command that handles the stop signals itself: the handlers the noting ones
    replaced, to put back when it is done. It installs its own, then asks `first_noted`
    (a signal that came until then was noted)."""
    replaced = dict(_replaced)
    _replaced.clear()
    return replaced


def first_noted() -> int | None:
    """The first stop signal noted, if one was (forgotten: the caller acts on it)."""
    first = _noted[0] if _noted else None
    _noted.clear()
    return first


def release() -> None:
    """Put the replaced handlers back (those still noting: not taken over), then act on
    the first signal noted as it would have acted had it come now."""
    for signum, handler in list(_replaced.items()):
        if signal.getsignal(signum) is note:
            signal.signal(signum, handler)
    _replaced.clear()
    noted = first_noted()
    if noted == signal.SIGINT:
        raise KeyboardInterrupt
    if noted is not None:
        signal.raise_signal(noted)  # (its default action: the process ends)
