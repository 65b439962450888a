"""The local engine: a store on disk, segment files plus an LMDB view (private package;
the public API is `journal.Journal`)."""

from __future__ import annotations

from cursors import KeyRing

from ..models import RetentionPolicy
from .engine import Durability, LocalEngine
from .files import FileOps

__all__ = ["FileOps", "LocalEngine", "open_local"]


def open_local(
    path: str,
    *,
    create: bool,
    readonly: bool,
    durability: Durability,
    segment_bytes: int,
    retention: RetentionPolicy,
    compress_sealed: bool,
    key_ring: KeyRing | None,
    file_ops: FileOps | None,
) -> LocalEngine:
    """Open the store at `path` on the local engine (`Journal.open` calls this)."""
    if file_ops is not None and not isinstance(file_ops, FileOps):
        from ..errors import InvalidArgument

        raise InvalidArgument("file_ops must be a journal._local.files.FileOps (a test seam)")
    return LocalEngine.open(
        path,
        create=create,
        readonly=readonly,
        durability=durability,
        segment_bytes=segment_bytes,
        retention=retention,
        compress_sealed=compress_sealed,
        key_ring=key_ring,
        file_ops=file_ops,
    )
