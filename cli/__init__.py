"""The `journal` command line: a thin click layer over the public `journal` API."""

from __future__ import annotations

import sys
from typing import Any


def run(prog_name: str | None = None) -> None:
    """The `journal` console script. Its first step notes the stop signals that come
    while the command is still being imported (the first few tenths of a second), for
    the command to act on (`early_signals`): a watch ends as a stopped watch does, any
    other command as if the signal came as it starts (Ctrl+C: exit 130).

    Where Ctrl+C raises KeyboardInterrupt during the imports all the same (SIGINT had a
    handler other than Python's default before `run`), it ends the command with exit
    130 and no traceback; also one whose KeyboardInterrupt Python swallowed there (the
    handler ran in a finalizer, "Exception ignored in": the command then ran on, and a
    watch followed for good; found by a supervisor trial), which Python reports to
    `sys.unraisablehook` as it drops it: that one exits 130 too, after Python's own
    "Exception ignored" report on stderr."""
    from . import early_signals

    early_signals.install()
    lost: list[BaseException] = []
    report = sys.unraisablehook

    def dropped(unraisable: Any) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            lost.append(unraisable.exc_value)
        report(unraisable)

    sys.unraisablehook = dropped
    try:
        from .main import main
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    finally:
        sys.unraisablehook = report
    if lost:
        raise SystemExit(130)
    try:
        main(prog_name=prog_name)
    except KeyboardInterrupt:  # (noted while importing, acted on as the command starts)
        raise SystemExit(130) from None
