"""Owners: the exclusive lease a runtime process holds on a session while it runs the
session's prompts. Engine-neutral: the engine takes, checks and releases the lease
(`Engine.acquire`, `Engine.owner_alive`); this layer is what callers hold.
"""

from __future__ import annotations

from types import TracebackType

from .engine import Lease
from .models import OwnerInfo

__all__ = ["Owner"]


class Owner:
    """This process's lease on one session, from `Journal.own()`; a context manager.

    While it is held, `own()` of the same session anywhere raises `OwnerBusy`; leaving
    the block (or `release()`) records the release. If the process dies, the lease is
    free again at once (the local engine's lock dies with the process) and the session's
    metadata stops reporting it.
    """

    def __init__(self, lease: Lease, info: OwnerInfo) -> None:
        self._lease = lease
        self.session_id = lease.session_id
        self.generation = lease.generation
        self.info = info

    def release(self) -> None:
        """Record the release and let the lease go; idempotent."""
        self._lease.release()

    def __enter__(self) -> Owner:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"Owner(session_id={self.session_id!r}, generation={self.generation}, "
            f"pid={self.info.pid})"
        )
