"""Watching from the command line: `journal watch -s ID`, `journal sessions watch [-s ID]`.

A watch ends by itself when its session ends (every event printed), and on Ctrl+C,
SIGTERM or SIGHUP (exit 130, 143, 129), closing the journal first so nothing is left
behind. With `--format json` the last line says how it ended: `{"end": "resolved" |
"cancelled" | "expired"}`, or `{"end": "stopped", "cursor": LAST}` (nothing when the
reader of stdout went away); in text a stopped watch says on stderr which cursor resumes.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import partial
from types import FrameType

import click

import journal

from . import early_signals
from .hints import argument, journal_command
from .interrupts import Signalled
from .output import (
    EXIT_INTERRUPTED,
    Output,
    Settings,
    stop_when_reader_leaves,
)
from .rendering import lifecycle_record, lifecycle_text, shown

__all__ = ["watch_events", "watch_lifecycle"]


@contextmanager
def _ending_on_signals(output: Output, halt: threading.Event) -> Iterator[list[BaseException]]:
    """SIGTERM and SIGHUP raise `Signalled`, Ctrl+C KeyboardInterrupt, between printed
    lines: one that comes while a line is printed is held until the line is whole and
    its cursor noted (`Output.raise_held`; a line longer than the pipe holds was cut
    short before, and the end object glued to its half, not JSON). A second one while
    the line is still printed (its reader does not read) is raised at once, and nothing
    more is printed. Each signal also sets `halt` (the watch's stop event) and is noted in
    the list yielded, raised again once the watch ended: a handler that runs while the
    main thread runs a finalizer (a reader let go of) has its raise swallowed by Python,
    and the watch went on for good."""
    caught: list[BaseException] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught  # signal handlers belong to the main thread (an embedding caller's)
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        error = KeyboardInterrupt() if signum == signal.SIGINT else Signalled(signum)
        caught.append(error)
        halt.set()
        if output.printing:
            if output.held is None:
                output.held = error
                return
            output.broken = True  # (the line stays cut: nothing more goes after it)
        raise error

    # (The handlers that noted a signal while the command was imported: `early_signals`.)
    replaced = early_signals.take_over()

    def inherited(signum: int) -> object:
        return replaced.get(signum, signal.getsignal(signum))

    # Not one the command inherited ignored (SIGHUP under `nohup`: until 2026-12-06 a
    # hangup stopped a watch started so), nor a caller's own SIGINT handler.
    signals = [s for s in (signal.SIGTERM, signal.SIGHUP) if inherited(s) is not signal.SIG_IGN]
    if inherited(signal.SIGINT) is signal.default_int_handler:
        signals.append(signal.SIGINT)
    previous = {s: signal.signal(s, stop) for s in signals}
    previous.update((s, replaced[s]) for s in signals if s in replaced)
    try:
        early = early_signals.first_noted()
        if early is not None:
            stop(early, None)  # (it came before the watch began: it ends before it begins)
        yield caught
    finally:
        output.held = None
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stopped(output: Output, code: int, cursor: str | None) -> None:
    """End a watch that was stopped: say where to resume (JSON: the end object carries
    the last cursor; text: a line on stderr) and exit with `code`."""
    if output.json and not output.broken:
        with suppress(BrokenPipeError):
            output.emit({"end": "stopped", "cursor": cursor}, None)
    elif output.format == "text":
        # `cursor` is that of the last event whose printing completed: resuming from it
        # neither skips nor repeats one (`Output._print` notes it as the line ends).
        hint = f"resume with --cursor {cursor}" if cursor else "start again without --cursor"
        click.echo(f"-- stopped; {hint}", err=True)
    raise click.exceptions.Exit(code)


class _Last:
    """The cursor of the last event whose printing completed, and the signals caught."""

    cursor: str | None = None
    caught: list[BaseException]

    def note(self, cursor: str) -> None:
        """The line of the event whose cursor this is was printed whole (`Output._print`
        calls this while a signal is still held)."""
        self.cursor = cursor

    def raise_caught(self) -> None:
        """Raise the first signal caught (its handler's own raise may have been lost)."""
        if self.caught:
            raise self.caught[0]


@contextmanager
def _watching(output: Output, cursor: str | None, halt: threading.Event) -> Iterator[_Last]:
    """Signals end the watch (after the journal closed, in the body) with their status."""
    last = _Last()
    last.cursor = cursor
    try:
        with _ending_on_signals(output, halt) as last.caught:
            yield last
    except KeyboardInterrupt:
        _stopped(output, EXIT_INTERRUPTED, last.cursor)
    except Signalled as e:
        _stopped(output, 128 + e.signum, last.cursor)


def watch_events(settings: Settings, session_id: str, cursor: str | None) -> None:
    output = settings.output
    reader_gone = threading.Event()
    stop = threading.Event()  # (set when the reader leaves, or by a signal)
    stop_when_reader_leaves(reader_gone, stop)
    printed = False
    with _watching(output, cursor, stop) as last, settings.open(write=False) as store:
        try:
            for event in store.watch(session_id, cursor=cursor, stop=stop):
                printed = True
                output.event(event, partial(last.note, event.cursor))
                output.raise_held()
        except journal.OutcomeUnknown as e:
            raise _outcome_unknown(e, session_id) from None
        except journal.SessionNotFound as e:
            if printed or cursor is not None:
                raise  # (evicted while watched, or a cursor's session gone)
            # An observer started before its runtime: say how to wait for the session.
            raise journal.SessionNotFound(
                f"{e.message}; to wait for a session not created yet, follow `journal "
                "sessions watch` until its `created` line, then watch it"
            ) from None
        last.raise_caught()
        if reader_gone.is_set():
            raise BrokenPipeError  # ends quietly with status 0, like a failed write
        state = store.get_session(session_id).state.value
    output.emit({"end": state}, f"-- session {shown(session_id)} is {state}: watch ended")


def watch_lifecycle(settings: Settings, cursor: str | None) -> None:
    output = settings.output
    reader_gone = threading.Event()
    stop = threading.Event()  # (set when the reader leaves, or by a signal)
    stop_when_reader_leaves(reader_gone, stop)
    with _watching(output, cursor, stop) as last, settings.open(write=False) as store:
        for change in store.watch_sessions(cursor=cursor, stop=stop):
            noted = partial(last.note, change.cursor)
            output.emit(lifecycle_record(change), lifecycle_text(change), printed=noted)
            output.raise_held()
        last.raise_caught()
    if reader_gone.is_set():
        raise BrokenPipeError  # ends quietly with status 0, like a failed write


# The library's way to settle a dead owner's turn, as its OutcomeUnknown names it.
_OWN_CALL = "(`own()`, `journal sessions own ID`)"


def _outcome_unknown(error: journal.OutcomeUnknown, session_id: str) -> journal.OutcomeUnknown:
    """The watch's WATCH_OUTCOME_UNKNOWN with the command that settles the turn, as it runs
    here (the store as given, the session's id), in place of the library's `own()` call:
    until 2026-12-06 the CLI printed "(`own()`, `journal sessions own ID`)"."""
    own = f"`{journal_command()} sessions own {argument(session_id)}`"
    return journal.OutcomeUnknown(
        error.message.replace(_OWN_CALL, f"({own})"),
        request_id=error.request_id,
        cursor=error.cursor,
        session_ended=error.session_ended,
    )
