"""The servers' time as this process can tell it (SPEC 8, "Clock steps", and 16.5): the
offset of the local clock from the time the stream's information says it was gathered
(`ts`), measured around one request. One clock per engine, shared by everything of it
that records or judges a time: the commits' times (creations, events, suspensions, ends,
leases taken), the deadlines the expiry timer, `expire_due` and every commit judge, the
history windows and session retention, imports, the lifecycle feed's pruning and the
owner and importer heartbeats (by when the server stored them), so hosts whose clocks
disagree record and judge alike. Until 2026-12-06 only the heartbeats were judged so: a
writable journal on a host 2 hours ahead expired at once a session with a 1-hour ttl
created by a host with the right time, and a host 2 hours behind created sessions whose
deadlines every other host judged 2 hours early.

Writes make no request for the time, but the one that finds a measurement due waits for
it (one round trip): the offset is measured again once it is `MEASURE_S` old, or
at once when the local clock moved more than `_STEP_MS` from the monotonic one since (a
step of the local clock, or the host slept). Only the first measurement must answer (its
failure is the caller's, asked again as a read is); a later one that fails (an outage)
keeps the offset it has, is asked again `RETRY_S` later, and waits at most `_AGAIN_S`
for its answer, so a write that would succeed is neither failed nor held long by it.
Across a step not measured yet (its measurement in flight, or failed), the time goes on
from the last measurement with the monotonic clock."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import Final

from ..errors import JournalError, StoreUnavailable
from .client import REQUEST_S, ApiError, Connection, Found, Unavailable

__all__ = ["ServerClock", "parse_server_time_ms", "stored_ms"]

# The offset is measured again once it is this old (s), and after a failed measurement
# this much later.
MEASURE_S: Final = 60.0
RETRY_S: Final = 10.0
# The local clock moved this far (ms) from the monotonic one since the measurement: it
# was stepped (or the host slept), and the offset is measured again at once.
_STEP_MS: Final = 1_000
# How long a measurement after the first waits for its answer (s).
_AGAIN_S: Final = 1.0


def _local_ms() -> int:
    return time.time_ns() // 1_000_000


class ServerClock:
    """`now_ms()`: the servers' time now, from the local clock and the measured offset."""

    def __init__(self, conn: Connection, point: Callable[[str, object], None]) -> None:
        self._conn = conn
        self._point = point  # the engine's fault points (SPEC 1.3)
        self._offset_ms: int | None = None
        # The local and monotonic times of the last measurement; when the next is due,
        # and when one may be tried again (monotonic); whether one is in flight.
        self._local_at = 0
        self._mono_at = 0.0
        self._due = self._again = 0.0
        self._measuring = False

    async def now_ms(self, fresh: bool = False) -> int:
        """The servers' time now (ms since the epoch). `fresh`: measured by this call,
        whose failure is raised, as the first measurement's is (`ApiError`, the client's
        `Unavailable`, `StoreUnavailable`)."""
        if self._offset_ms is None or fresh:
            await self._measure(REQUEST_S)
        elif not self._measuring:
            mono = time.monotonic()
            if mono >= self._again and (mono >= self._due or self._stepped() is not None):
                self._measuring = True
                try:
                    await self._measure(_AGAIN_S)
                except (ApiError, JournalError, *Unavailable):
                    self._due = self._again = mono + RETRY_S  # (the offset kept meanwhile)
                finally:
                    self._measuring = False
        stepped = self._stepped()
        assert self._offset_ms is not None
        return (_local_ms() if stepped is None else stepped) + self._offset_ms

    def _stepped(self) -> int | None:
        """What the local time would be now had it not moved from the monotonic clock
        since the measurement; None when it moved no more than `_STEP_MS` (no step)."""
        since = round((time.monotonic() - self._mono_at) * 1000)
        if abs(_local_ms() - self._local_at - since) <= _STEP_MS:
            return None
        return self._local_at + since

    async def _measure(self, wait_s: float) -> None:
        """The offset from one request's answer, taken as gathered halfway through it."""
        self._point("clock.measure", self._offset_ms is None)
        sent = time.monotonic()
        info = await self._conn.api(f"$JS.API.STREAM.INFO.{self._conn.stream}", timeout=wait_s)
        local, mono = _local_ms(), time.monotonic()
        at = parse_server_time_ms(str(info.get("ts", "")), "the stream information's `ts`")
        self._offset_ms = at - (local - round((mono - sent) * 500))
        self._local_at, self._mono_at, self._due = local, mono, mono + MEASURE_S


# RFC 3339 with up to nanoseconds, as the server writes its times.
_SERVER_TIME: Final = re.compile(
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)"
)


def parse_server_time_ms(text: str, what: str) -> int:
    """A time the server gives (RFC 3339, e.g. `2026-12-05T04:25:52.457856779Z`) in ms
    since the epoch; `StoreUnavailable` if it gives none (an older server)."""
    matched = _SERVER_TIME.fullmatch(text.strip())
    if matched is None:
        raise StoreUnavailable(
            f"the NATS server gave no usable time for {what} ({text!r}): the journal "
            "follows the servers' clock; upgrade nats-server (2.15 is tested)"
        )
    seconds, fraction, zone = matched.groups()
    at = datetime.fromisoformat(seconds + ("+00:00" if zone == "Z" else zone))
    return int(at.timestamp()) * 1000 + int((fraction or "0").ljust(9, "0")[:3])


def stored_ms(message: Found) -> int:
    """When the server stored `message` (its `Nats-Time-Stamp`: a direct get's, or a
    leader get's stored time), in ms; `StoreUnavailable` if it gives none."""
    return parse_server_time_ms(
        message.headers.get("Nats-Time-Stamp", ""), f"the stored time of {message.subject}"
    )
