"""An owner's heartbeats on JetStream (SPEC 16.5): a lease whose row no longer records it
(its session evicted and created again, or the lease taken over) stops beating, rather
than rolling up the heartbeats of the session's owner now."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _nats import shared_server

from journal import Journal, RetentionPolicy
from journal._jetstream.layout import HEARTBEAT_DECODER, Subjects


@pytest.fixture
def url() -> str:
    return shared_server().url


@pytest.fixture
def name(tmp_path: Path) -> str:
    return "t" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]


@pytest.fixture
def j(url: str, name: str) -> Iterator[Journal]:
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)
    with Journal.open(url, store=name, retention=policy) as opened:
        yield opened


def _last_beats(url: str, name: str, session_id: str, seconds: float) -> list[int]:
    """The incarnation named by the session's last heartbeat, read every 0.1 s."""
    import nats

    async def read() -> list[int]:
        nc = await nats.connect(servers=url.removeprefix("nats://").split(","))
        try:
            js = nc.jetstream()
            subject = f"j.{name}.s.{Subjects.token(session_id)}.hb"
            seen = []
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                message = await js.get_last_msg(f"JOURNAL_{name}", subject)
                seen.append(HEARTBEAT_DECODER.decode(message.data or b"").incarnation)
                await asyncio.sleep(0.1)
            return seen
        finally:
            await nc.close()

    return asyncio.run(read())


def test_an_owner_of_an_evicted_incarnation_stops_beating_over_the_next_owner(
    j: Journal, url: str, name: str
) -> None:
    """An owner holding its lease while its session was resolved, evicted and created
    again beat on the session's one heartbeat subject, rolling up the new owner's beats:
    a judge on another host read the stale beat about half the time and took the new
    owner, alive, for dead (a soak: 21 of 40 reads of its metadata showed no owner)."""
    j.create_session("x")
    stale = j.own("x")
    j.resolve_session("x")
    assert j.apply_retention().evicted_sessions == ["x"]
    j.create_session("x")
    with j.own("x") as owner:
        time.sleep(2.5)  # (the stale owner's next beat meets the new owner's)
        incarnations = set(_last_beats(url, name, "x", 3.0))
        assert len(incarnations) == 1, incarnations
        assert owner.generation == 1
    stale.release()
