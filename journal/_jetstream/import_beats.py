"""The heartbeat of an engine's importer (SPEC 16.5): beaten every `heartbeat_s` on a
subject of its own while the engine has sessions staged (or a first batch in flight),
so that other hosts judge its staged rows alive as they judge an owner's lease; its one
rolled-up message is purged once the import ended, or by the journal's close."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Final

from ..errors import StoreUnavailable
from .client import ApiError, Unavailable
from .layout import ENCODER, Heartbeat, Subjects
from .reads import StoreReader

__all__ = ["ImporterBeat", "beat_session"]

# How long a closing journal waits for the purge of its importer's heartbeat.
_CLOSE_PURGE_S: Final = 2.0


def beat_session(beat_id: str) -> str:
    """The id whose heartbeat subject an importer beats on (no session can take it: ids
    hold no NUL)."""
    return f"\x00import\x00{beat_id}"


class ImporterBeat:
    """One engine's importer heartbeat: `beat_id` names it on every staged row
    (`IMPORTER_HEADER`); `busy()` says whether sessions are staged."""

    def __init__(
        self,
        reader: StoreReader,
        pid: int,
        host: str,
        heartbeat_s: float,
        busy: Callable[[], bool],
    ) -> None:
        self._reader = reader
        self._conn = reader.conn
        self._pid = pid
        self._host = host
        self._heartbeat_s = heartbeat_s
        self._busy = busy
        self.beat_id = uuid.uuid4().hex
        self._beating: asyncio.Task[None] | None = None
        self._left = False  # (the last purge failed: the journal's close tries it again)

    def subject(self, beat_id: str) -> str:
        """The subject an importer beats on (`beat_id`: its `IMPORTER_HEADER`)."""
        return self._reader.subjects.heartbeat(Subjects.token(beat_session(beat_id)))

    def start(self) -> None:
        """Beat (on the loop) while the engine has sessions staged."""
        if self._beating is None or self._beating.done():
            self._beating = asyncio.get_running_loop().create_task(self._beats())

    async def _beats(self) -> None:
        subject = self.subject(self.beat_id)
        while self._busy():
            while self._busy():
                beat = Heartbeat(0, 0, self._pid, self._host, time.time_ns() // 1_000_000)
                with contextlib.suppress(ApiError, *Unavailable):
                    await self._conn.publish(subject, ENCODER.encode(beat), {"Nats-Rollup": "sub"})
                await asyncio.sleep(self._heartbeat_s)
            await self._purge()
            # (An import begun during the purge found this task running and started none:
            # it beats on here, or its sessions would be judged dead 10 s after staging.)

    def close(self) -> None:
        """The journal closes: a heartbeat task still running (an import ended less than
        a beat ago: every `journal import`) is stopped and its subject purged here,
        waiting up to `_CLOSE_PURGE_S` (until 2026-12-06 the task was cancelled before its
        own purge, and each such journal left one message for good); so is a subject
        whose purge failed (unanswered while the stream's leader hung: until 2026-12-06
        left for good)."""
        task = self._beating
        if task is None or (task.done() and not self._left):
            return
        if not self._conn.on_loop():
            with contextlib.suppress(Exception):
                self._conn.call(self._stop(task), _CLOSE_PURGE_S)
                return
        with contextlib.suppress(RuntimeError):
            self._conn.loop.call_soon_threadsafe(task.cancel)

    async def _stop(self, task: asyncio.Task[None]) -> None:
        task.cancel()
        await asyncio.wait({task})  # (no beat is published after the purge)
        await self._purge()

    async def _purge(self) -> None:
        try:
            await self._reader.purge(self.subject(self.beat_id), 1 << 62)
            self._left = False
        except (StoreUnavailable, *Unavailable):
            self._left = True
