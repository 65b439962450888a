"""A journal on the local engine together with that engine, for the tests (and nothing
else) that look at the engine's parts: its view, its summary cache, its compactions, the
private view of a read-only journal. The engine is opened by the test and the journal
laid over it (`Journal.over`), so no test reaches into the facade's private attributes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from journal import Journal
from journal._local.engine import LocalEngine, LocalOptions

__all__ = ["open_local"]


def open_local(path: Path | str, **options: Any) -> tuple[Journal, LocalEngine]:
    """Open (creating when missing) the store at `path` with the keywords of
    `Journal.open`; the journal and its engine."""
    engine = LocalEngine.open(str(path), LocalOptions(**options))
    return Journal.over(engine), engine
