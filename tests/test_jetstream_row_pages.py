"""Listing every session of a JetStream store past one page of row subjects (the server
gives at most 100,000 a page, at an offset into the sorted subjects as they are when each
page is asked for): sessions created and gone between two pages move the next page's
window, and a session that exists throughout must still be listed once."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path

import nats
import pytest
from _nats import HoldingProxy, shared_server

from journal import Journal
from journal._jetstream.engine import JetStreamEngine, JetStreamOptions

PAGE = 100_000  # (the server's page of subjects)


def _subject(name: str, number: int) -> str:
    return f"j.{name}.s.{f'p{number:07d}'.encode().hex()}.row"


def _publish(url: str, name: str, numbers: range) -> None:
    async def run() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            for number in numbers:
                await js.publish_async(_subject(name, number), b"")
            await js.publish_async_completed()
        finally:
            await nc.close()

    asyncio.run(run())


def _purge(url: str, name: str, numbers: range) -> None:
    async def run() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            for number in numbers:
                await js.purge_stream(f"JOURNAL_{name}", subject=_subject(name, number))
        finally:
            await nc.close()

    asyncio.run(run())


@pytest.mark.slow  # (a store of 102,000 row subjects: 18 s)
def test_sessions_gone_or_created_between_two_pages_leave_none_out_and_none_twice(
    tmp_path: Path,
) -> None:
    """Between the first page and the second, 1,500 sessions below the second page's
    offset go (more than the pages' overlap) and 700 come: before, the second page began
    1,500 - 700 subjects late and that many sessions that existed throughout were left
    out (with only creations, sessions came twice)."""
    url = shared_server().url
    name = "t" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    Journal.open(url, store=name).close()  # (the store's stream)
    count = PAGE + 2_000
    # Even numbers now; odd ones below the offset come between the pages.
    _publish(url, name, range(0, 2 * count, 2))
    proxy = HoldingProxy(shared_server().port)
    engine = JetStreamEngine.open(JetStreamOptions(servers=[proxy.url], store=name))
    got: list[list[str]] = []
    try:
        proxy.hold(lambda m: b"STREAM.INFO" in m and b'"offset"' in m and b'"offset": 0}' not in m)
        lister = threading.Thread(
            target=lambda: got.append(engine.conn.call(engine.reader.tokens())), daemon=True
        )
        lister.start()
        assert proxy.held.wait(60), "no second page asked for"
        _purge(url, name, range(0, 3_000, 2))  # 1,500 gone, all below the offset
        _publish(url, name, range(10_001, 11_401, 2))  # 700 new
        proxy.release()
        lister.join(60)
    finally:
        engine.close()
        proxy.close()
    (tokens,) = got
    assert len(tokens) == len(set(tokens)), "a session listed twice"
    throughout = {f"p{n:07d}".encode().hex() for n in range(3_000, 2 * count, 2)}
    came = {f"p{n:07d}".encode().hex() for n in range(10_001, 11_401, 2)}
    left_out = throughout - set(tokens)
    assert not left_out, f"{len(left_out)} sessions that existed throughout left out"
    gone = {f"p{n:07d}".encode().hex() for n in range(0, 3_000, 2)}
    assert set(tokens) <= throughout | came | gone
