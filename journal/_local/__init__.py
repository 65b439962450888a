"""The local engine: a store on disk, segment files plus an LMDB view (private package;
the public API is `journal.Journal`)."""

from __future__ import annotations

import os
from typing import Any

from ..arguments import check_open_options, check_store_path
from ..errors import InvalidArgument
from .compaction import DEFAULT_DEAD_SHARE
from .engine import LocalEngine
from .files import FileOps
from .frames import DEFAULT_SEGMENT_BYTES
from .opening import Durability, LocalOptions, Repair

__all__ = [
    "DEFAULT_DEAD_SHARE",
    "DEFAULT_SEGMENT_BYTES",
    "Durability",
    "FileOps",
    "LocalEngine",
    "LocalOptions",
    "Repair",
    "open_local",
]


def open_local(
    path: str | os.PathLike[str],
    given: tuple[Any, Any, Any, Any, Any, Any],
    key_ring: Any,
    file_ops: Any,
    file_mode: Any,
    repair: Repair = False,
) -> LocalEngine:
    """Open the store at `path` on the local engine with the keywords of `Journal.open`
    (create, readonly, durability, segment_bytes, retention, compress_sealed in `given`),
    each checked first."""
    create, readonly, durability, segment_bytes, retention, compress_sealed = given
    store_path = check_store_path(path)
    mode = check_open_options(
        create, readonly, durability, segment_bytes, retention, compress_sealed, key_ring, file_mode
    )
    if file_ops is not None and not isinstance(file_ops, FileOps):
        raise InvalidArgument("file_ops must be a journal._local.files.FileOps (a test seam)")
    options = LocalOptions(
        create=create,
        readonly=readonly,
        durability=durability,
        segment_bytes=segment_bytes,
        retention=retention,
        compress_sealed=compress_sealed,
        key_ring=key_ring,
        file_ops=file_ops,
        file_mode=mode,
        repair=repair,
    )
    return LocalEngine.open(store_path, options)
