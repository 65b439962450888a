"""The engines every engine-neutral suite runs against (the contract suite in
`journal_contract.py` and the stateful model in `test_journal_model.py`).

An `EngineFactory` opens a `Journal` on one engine through the public facade. A second
engine plugs into every suite by adding its factory to `ENGINES`; what it cannot do (a
capability below) it says with `supports`, and the suites skip only those steps. `marks`
are pytest marks its tests carry (the 3-node cluster runs under `-m cluster`).

Capabilities:
    "copy_store"   a closed store can be copied as a backup (the restore-from-an-older-
                   copy case: CursorFuture); on JetStream the copy is the server's
                   snapshot of the stream, and opening it restores it in place of the
                   stream, as an operator restores a backup
    "segments"     segment sizes and durability modes mean something (the configuration
                   with small segments runs it again)
    "import"       `import_sessions` (archives: tests/test_archives.py)
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from journal import Journal

__all__ = ["ENGINES", "EngineFactory", "JetStreamEngineFactory", "LocalEngineFactory"]


class EngineFactory(Protocol):
    name: str
    supports: frozenset[str]
    marks: tuple[pytest.MarkDecorator, ...]

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
    supports: frozenset[str] = frozenset({"copy_store", "segments", "import"})
    marks: tuple[pytest.MarkDecorator, ...] = ()

    def open(self, path: Path, **options: Any) -> Journal:
        return Journal.open(path, create=True, **options)

    def copy_store(self, src: Path, dst: Path) -> None:
        shutil.copytree(src, dst)

    def discard_derived_state(self, path: Path) -> None:
        shutil.rmtree(path / "index")


# A JetStream backup's files (JetStreamEngineFactory.copy_store): the snapshot before and
# after its first open restored it, and the store it was taken of.
_SNAPSHOT = "stream-snapshot"
_RESTORED = "stream-snapshot-restored"
_BACKUP_OF = "backup-of"

# Keywords of Journal.open that only mean something to a store on disk.
_DISK_ONLY = ("compress_sealed", "file_ops", "file_mode")


@dataclass(frozen=True)
class JetStreamEngineFactory:
    """The JetStream engine on a NATS server the tests start (`tests/_nats.py`): a single
    node, or a 3-node cluster with replicas=3. A test's store path names a stream of
    its own (a digest of the path), so tests never share a store."""

    name: str = "jetstream"
    replicas: int = 1
    supports: frozenset[str] = frozenset({"copy_store", "import"})
    marks: tuple[pytest.MarkDecorator, ...] = field(default=())

    def url(self) -> str:
        from _nats import shared_cluster, shared_server

        return shared_cluster().url if self.replicas > 1 else shared_server().url

    def store_name(self, path: Path) -> str:
        """The store `path` names: a digest of the path, or for a backup (`copy_store`)
        the store it was taken of."""
        of = path / _BACKUP_OF
        if of.exists():
            return of.read_text()
        return "t" + hashlib.sha256(str(path).encode()).hexdigest()[:24]

    def open(self, path: Path, **options: Any) -> Journal:
        for name in _DISK_ONLY:
            options.pop(name, None)
        pending = path / _SNAPSHOT
        if pending.exists():  # a backup's first open: the stream is put back from it
            from _nats import restore_stream

            restore_stream(self.url(), f"JOURNAL_{self.store_name(path)}", pending)
            pending.rename(path / _RESTORED)
        return Journal.open(
            self.url(),
            store=self.store_name(path),
            replicas=self.replicas,
            create=True,
            **options,
        )

    def copy_store(self, src: Path, dst: Path) -> None:
        """A backup as an operator takes one: the server's snapshot of the store's stream
        (same messages, same sequences), saved in `dst`. The first open of `dst` restores
        it in place of the store's stream (the only name its subjects fit), so the
        store taken at `src` is then the restored copy."""
        from _nats import back_up_stream

        name = self.store_name(src)
        back_up_stream(self.url(), f"JOURNAL_{name}", dst / _SNAPSHOT)
        (dst / _BACKUP_OF).write_text(name)

    def discard_derived_state(self, path: Path) -> None:
        """Nothing is derived: every row, marker and feed entry is a message of the
        stream itself."""


ENGINES: dict[str, EngineFactory] = {
    "local": LocalEngineFactory(),
    "jetstream": JetStreamEngineFactory(),
    "jetstream-r3": JetStreamEngineFactory(
        name="jetstream-r3", replicas=3, marks=(pytest.mark.cluster,)
    ),
}


def engine_params(capability: str | None = None) -> list[Any]:
    """The `ENGINES` as pytest params carrying their marks (those with `capability`)."""
    return [
        pytest.param(name, marks=ENGINES[name].marks, id=name)
        for name in sorted(ENGINES)
        if capability is None or capability in ENGINES[name].supports
    ]
