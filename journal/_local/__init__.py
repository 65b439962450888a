"""The local engine: a store on disk, segment files plus an LMDB view (private package;
the public API is `journal.Journal`)."""

from __future__ import annotations

from ..errors import InvalidArgument
from .compaction import DEFAULT_DEAD_SHARE
from .engine import Durability, LocalEngine, LocalOptions
from .files import FileOps
from .frames import DEFAULT_SEGMENT_BYTES

__all__ = [
    "DEFAULT_DEAD_SHARE",
    "DEFAULT_SEGMENT_BYTES",
    "Durability",
    "FileOps",
    "LocalEngine",
    "LocalOptions",
    "open_local",
]


def open_local(path: str, options: LocalOptions) -> LocalEngine:
    """Open the store at `path` on the local engine (`Journal.open` calls this)."""
    if options.file_ops is not None and not isinstance(options.file_ops, FileOps):
        raise InvalidArgument("file_ops must be a journal._local.files.FileOps (a test seam)")
    return LocalEngine.open(path, options)
