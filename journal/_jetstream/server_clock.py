"""The servers' time as this process can tell it (SPEC 16.5, "owner liveness"): the
offset of the local clock from the time the stream's information says it was gathered
(`ts`), measured around one request and again once it is a minute old. An owner's
heartbeat is judged by when the server stored it against this time, so hosts whose
clocks disagree judge a lease alike (until 2026-12-06 a beat's own time, from its
writer's clock, was compared with the judge's: a live owner whose host ran 20 s behind
was taken over at once, and a dead one whose host ran a day ahead kept the session for a
day)."""

from __future__ import annotations

import time
from typing import Final

from .client import Connection, Found
from .feed_pruning import parse_server_time_ms

__all__ = ["ServerClock"]

# The offset is measured again once it is this old (a local clock may be stepped).
MEASURE_S: Final = 60.0


def _local_ms() -> int:
    return time.time_ns() // 1_000_000


class ServerClock:
    """`now_ms()`: the servers' time now, from the local clock and the measured offset;
    `stored_ms(message)`: when the server stored a message (None: no time given)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._offset_ms = 0
        self._measured = -MEASURE_S

    async def now_ms(self) -> int:
        if time.monotonic() - self._measured >= MEASURE_S:
            sent = _local_ms()
            info = await self._conn.api(f"$JS.API.STREAM.INFO.{self._conn.stream}")
            answered = _local_ms()
            at = parse_server_time_ms(str(info.get("ts", "")), "the stream information's `ts`")
            self._offset_ms = at - (sent + answered) // 2
            self._measured = time.monotonic()
        return _local_ms() + self._offset_ms

    @staticmethod
    def stored_ms(message: Found) -> int | None:
        text = message.headers.get("Nats-Time-Stamp")
        return (
            None
            if not text
            else parse_server_time_ms(text, f"the stored time of {message.subject}")
        )
