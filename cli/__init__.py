"""The `journal` command line: a thin click layer over the public `journal` API."""

from __future__ import annotations


def run(prog_name: str | None = None) -> None:
    """The `journal` console script. A Ctrl+C while the command is still being imported
    (the first few tenths of a second) ends it with exit 130 and no traceback, as a
    Ctrl+C at any later point does."""
    try:
        from .main import main
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    main(prog_name=prog_name)
