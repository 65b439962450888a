"""The engines every engine-neutral suite runs against (the contract suite in
`journal_contract.py` and the stateful model in `test_journal_model.py`).

An `EngineFactory` opens a `Journal` on one engine through the public facade. A second
engine plugs into every suite by adding its factory to `ENGINES`; what it cannot do (a
capability below) it says with `supports`, and the suites skip only those steps.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from journal import Journal

__all__ = ["ENGINES", "EngineFactory", "LocalEngineFactory"]


class EngineFactory(Protocol):
    name: str

    def open(self, path: Path, **options: Any) -> Journal:
        """Open (creating when missing) the store at `path`; `options` are keywords of
        `Journal.open` (durability, segment_bytes, retention, ...); an engine ignores the
        ones that mean nothing to it."""

    def copy_store(self, src: Path, dst: Path) -> None:
        """Copy a closed store, as a backup and restore would."""

    def discard_derived_state(self, path: Path) -> None:
        """Throw away whatever the engine can rebuild from its log (the local engine's
        LMDB view) while the store is closed."""


@dataclass(frozen=True)
class LocalEngineFactory:
    """The embedded local engine: a directory of segment files and an LMDB view."""

    name: str = "local"

    def open(self, path: Path, **options: Any) -> Journal:
        return Journal.open(path, create=True, **options)

    def copy_store(self, src: Path, dst: Path) -> None:
        shutil.copytree(src, dst)

    def discard_derived_state(self, path: Path) -> None:
        shutil.rmtree(path / "index")


ENGINES: dict[str, EngineFactory] = {"local": LocalEngineFactory()}
