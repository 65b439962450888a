"""The library's log records on the CLI's stderr: `journal: warning: MESSAGE`, like its
errors' `journal: error: MESSAGE`, so a script or a reader tells them from a command's
own output (until 2026-12-06 they came bare, through Python's last-resort handler: a new
user's trial met "no zeros are written ahead of the writer ..." on every write command
of a nearly full disk, with nothing saying what it was)."""

from __future__ import annotations

import logging
import sys

__all__ = ["show_warnings"]


class _Stderr(logging.Handler):
    """Writes to the `sys.stderr` of the moment (a test runner swaps it); a stderr that
    cannot be written (closed, a reader gone) drops the line: a log call never raises."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = f"journal: {record.levelname.lower()}: {self.format(record)}\n"
            sys.stderr.write(line)
            sys.stderr.flush()
        except Exception:  # (ValueError for a closed file, OSError, ...)
            pass


def show_warnings() -> None:
    """Print the `journal` logger's warnings and errors on stderr, prefixed (once per
    process; a program that configured logging for it keeps its own handlers too)."""
    logger = logging.getLogger("journal")
    if not any(isinstance(handler, _Stderr) for handler in logger.handlers):
        handler = _Stderr()
        handler.setLevel(logging.WARNING)
        logger.addHandler(handler)
