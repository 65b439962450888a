"""The retention policy a local journal applies: the one `store.json` records now (SPEC 8,
"The store records its policy").

A writer that opened with one policy applies the one another process records later, from
its next retention pass on: each pass compares `store.json`'s stat (inode, mtime in ns,
size: the file is replaced atomically, so a new recording is a new inode) with the one it
last read, and reads the file again only when that changed. A recorded policy found
damaged at a pass is logged and the previous one kept: appends must not stop over it
(opening the store still raises `StoreIncompatible`).
"""

from __future__ import annotations

import logging
import os
from typing import Final

from ..errors import StoreIncompatible
from ..models import RetentionPolicy
from .store_file import load_store

__all__ = ["RecordedPolicy"]

_log: Final = logging.getLogger("journal")
_Stamp = tuple[int, int, int]


class RecordedPolicy:
    """The policy in force (`policy`) and the stamp of the `store.json` it came from."""

    __slots__ = ("_stamp", "_store_file", "policy")

    def __init__(self, store_file: str, policy: RetentionPolicy | None) -> None:
        self._store_file = store_file
        self.policy = policy or RetentionPolicy()
        # None: not compared yet. The first refresh reads the file again, so a policy
        # another process recorded while this journal opened is not missed.
        self._stamp: _Stamp | None = None

    def refresh(self) -> bool:
        """Read the recorded policy again if `store.json` changed since it was last read;
        whether the policy in force changed. The default policy where none is recorded."""
        try:
            found = os.stat(self._store_file)
        except OSError as e:
            self._keep((0, 0, -(e.errno or 1)), f"cannot stat it: {e}")  # (logged once)
            return False
        stamp = (found.st_ino, found.st_mtime_ns, found.st_size)
        if stamp == self._stamp:
            return False
        try:
            recorded = load_store(self._store_file).retention or RetentionPolicy()
        except (StoreIncompatible, OSError) as e:
            self._keep(stamp, str(e))
            return False
        self._stamp = stamp
        if recorded == self.policy:
            return False
        _log.info("%s: applying the retention policy recorded now: %s", self._store_file, recorded)
        self.policy = recorded
        return True

    def current(self) -> RetentionPolicy:
        """The recorded policy now (refreshed)."""
        self.refresh()
        return self.policy

    def _keep(self, stamp: _Stamp, why: str) -> None:
        if stamp == self._stamp:
            return
        self._stamp = stamp  # (logged once per version of the file, or per error)
        _log.warning(
            "%s: the recorded retention policy cannot be read (%s); keeping the one in force: %s",
            self._store_file,
            why,
            self.policy,
        )
