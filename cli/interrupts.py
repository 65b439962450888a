"""Ctrl+C during the long store commands (`verify`, `compact`, `export`, `import`): noted
as well as raised, so one whose raise Python swallowed still ends the command.

Python runs a signal handler between two bytecodes of the main thread; when those are a
finalizer's (`__del__`, a `weakref.finalize` callback: the library lets segment readers
go as it reads), the handler's KeyboardInterrupt is printed as "Exception ignored in" and
dropped, and the command ran on to its end and exited 0. Here the handler also notes the
Ctrl+C, and the command raises it again at its next progress report and once its work is
done (`journal watch` does the same with its stop event, cli/watching.py).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["CtrlC", "ctrl_c_noted"]

Progress = Callable[[int, int], None]


class CtrlC:
    """Whether a Ctrl+C came while a command ran (its raise may have been lost)."""

    def __init__(self) -> None:
        self.came = False

    def check(self) -> None:
        """Raise the Ctrl+C that came, if one did."""
        if self.came:
            raise KeyboardInterrupt

    def progress(self, bar: Progress | None, final_is_done: bool = False) -> Progress:
        """A progress callback for the library that raises a Ctrl+C that came (then
        passes the report on to `bar`, a progress bar's, if any). With `final_is_done`
        it raises none at a report of all done (`done == total > 0`): an import makes it
        after its commit (and may just before), and the CLI says an interrupted import
        imported nothing."""

        def report(done: int, total: int) -> None:
            if not (final_is_done and 0 < total <= done):
                self.check()
            if bar is not None:
                bar(done, total)

        return report


@contextmanager
def ctrl_c_noted() -> Iterator[CtrlC]:
    """While the block runs, Ctrl+C raises KeyboardInterrupt as usual and is noted in the
    `CtrlC` yielded (left as it is where SIGINT is ignored or handled by someone else,
    or off the main thread)."""
    ctrl_c = CtrlC()
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield ctrl_c
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        ctrl_c.came = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield ctrl_c
    finally:
        signal.signal(signal.SIGINT, previous)
