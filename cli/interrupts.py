"""Ctrl+C during the long store commands (`verify`, `compact`, `export`, `import`,
`sessions own --wait`): noted as well as raised, so one whose raise Python swallowed still
ends the command, and said: each command says on stderr what state it left
(`said_if_interrupted`) before it ends with exit 130.

Python runs a signal handler between two bytecodes of the main thread; when those are a
finalizer's (`__del__`, a `weakref.finalize` callback: the library lets segment readers
go as it reads), the handler's KeyboardInterrupt is printed as "Exception ignored in" and
dropped, and the command ran on to its end and exited 0. Here the handler also notes the
Ctrl+C, and the command raises it again at its next progress report and once its work is
done (`journal watch` does the same with its stop event, cli/watching.py).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import click

__all__ = [
    "CtrlC",
    "Signalled",
    "ctrl_c_noted",
    "said_if_interrupted",
    "said_if_stopped",
    "stopped_by_term_and_hup",
]

Progress = Callable[[int, int], None]


class Signalled(BaseException):
    """SIGTERM or SIGHUP arrived where a command turns them into a clean stop (`journal
    watch`, `journal demo`): a BaseException, like KeyboardInterrupt; the command exits
    with 128 + `signum`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class CtrlC:
    """Whether a Ctrl+C came while a command ran (its raise may have been lost)."""

    def __init__(self) -> None:
        self.came = False
        # The last progress report (done, total) the library made: how far the work got;
        # and whether a Ctrl+C was raised there (the work stopped just at that report).
        self.reported: tuple[int, int] | None = None
        self.raised_at_report = False

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
            self.reported = (done, total)
            if not (final_is_done and 0 < total <= done):
                self.raised_at_report = self.came
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


@contextmanager
def said_if_interrupted(say: Callable[[KeyboardInterrupt], str]) -> Iterator[None]:
    """On Ctrl+C in the block, print `journal: ` and what `say(interrupt)` tells about the
    state the command left (what was done, what was not, what to run next) on stderr,
    then let the KeyboardInterrupt end the command (exit 130): exit 130 alone left a user
    to guess whether an archive was half written or a compaction half done. `say` runs
    after the block's own clean-up (put the `with` outside the store's)."""
    try:
        yield
    except KeyboardInterrupt as interrupt:
        with contextlib.suppress(OSError):  # (stderr full or closed: nothing to tell)
            click.echo(f"journal: {say(interrupt)}", err=True)
        raise


@contextmanager
def said_if_stopped(say: Callable[[str], str]) -> Iterator[None]:
    """`said_if_interrupted` for a command that SIGTERM and SIGHUP stop as Ctrl+C does
    (`journal demo`, `journal verify`): in the block they raise `Signalled`, so the
    command cleans up (its temporary directories removed) as on Ctrl+C. Then it prints
    `journal: ` and `say(how)` on stderr, `how` being "interrupted" (Ctrl+C, exit 130)
    or "stopped by SIGTERM" ("SIGHUP": exit 143, 129)."""
    try:
        with stopped_by_term_and_hup(), said_if_interrupted(lambda _: say("interrupted")):
            yield
    except Signalled as stopped:
        name = signal.Signals(stopped.signum).name
        with contextlib.suppress(OSError):  # (stderr closed: nothing to tell)
            click.echo(f"journal: {say(f'stopped by {name}')}", err=True)
        raise click.exceptions.Exit(128 + stopped.signum) from None


@contextmanager
def stopped_by_term_and_hup() -> Iterator[None]:
    """SIGTERM and SIGHUP (`timeout`, `kill`, a closed terminal) raise `Signalled` in the
    block, where their default action ended the process at once, its clean-up undone. A
    signal ignored (`nohup`) stays ignored; off the main thread nothing changes. Only the
    first one raises: those after it (a supervisor signalling until the command exits,
    SIGHUP then SIGTERM from a closing terminal) are ignored until the process exits,
    since one raised in the clean-up cut it short (a temporary directory left behind)
    or, once the handlers were restored, ended the process with -15 (SIGKILL still ends
    it; a child started after it would inherit SIG_IGN, but none starts in a clean-up).
    Should Python drop the first one's raise (a handler that lands in a finalizer, see
    the module's docstring), the command runs on to its end, bounded, and cleans up as
    usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        # (SIG_IGN, not a handler that does nothing: Python's exit puts its handlers
        # back to SIG_DFL while it ends the threads)
        for other in previous:
            signal.signal(other, signal.SIG_IGN)
        came.append(signum)
        raise Signalled(signum)

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, stop)
    try:
        yield
    finally:
        if not came:  # (else the process is ending: the later ones stay ignored)
            for signum, handler in previous.items():
                if handler is not None:
                    signal.signal(signum, handler)
