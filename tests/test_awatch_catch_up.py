"""An `awatch` catching up on a backlog yields to its event loop between pages (SPEC 7.6).

Found by an asyncio-server trial: with the local engine every page is read
on the loop, and a follower whose consumer did not suspend (socket writes the kernel took
at once) held the loop from its first event to the head: the server's other streams got
nothing meanwhile, and a cancellation or `asyncio.timeout` took effect only at the head
(`asyncio.timeout(0.05)` around a 50,000-event catch-up fired after 1.09 s, with every
event delivered)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from journal import EventIn, Journal

EVENTS = 200
PAGE_BYTES = 10_000  # 10 events of 1,000 bytes a page: 20 pages


def backlog(path: Path) -> Journal:
    j = Journal.open(path / "store", durability="os")
    j.create_session("big")
    j.append("big", [EventIn(type="m", data=b"x" * 1_000) for _ in range(EVENTS)])
    return j


def test_other_tasks_run_between_the_pages_of_a_catch_up(tmp_path: Path) -> None:
    async def turns_of_another_task_during_the_catch_up(j: Journal) -> int:
        turns = 0

        async def other() -> None:
            nonlocal turns
            while True:
                await asyncio.sleep(0)
                turns += 1

        task = asyncio.create_task(other())
        await asyncio.sleep(0)
        before, delivered = turns, 0
        async for _ in j.awatch("big", max_bytes=PAGE_BYTES):
            delivered += 1
            if delivered == EVENTS:
                break
        task.cancel()
        return turns - before

    with backlog(tmp_path) as j:
        # (one turn a page but the last; none at all before)
        assert asyncio.run(turns_of_another_task_during_the_catch_up(j)) >= EVENTS // 10 - 1


def test_a_timeout_ends_a_catch_up_at_the_next_page(tmp_path: Path) -> None:
    async def delivered_before_the_timeout(j: Journal) -> int:
        delivered = 0
        try:
            async with asyncio.timeout(0):
                async for _ in j.awatch("big", max_bytes=PAGE_BYTES):
                    delivered += 1
        except TimeoutError:
            return delivered
        raise AssertionError("the watch ended without the timeout")

    with backlog(tmp_path) as j:
        # (the whole backlog, 200 events, before: the timeout came at the head)
        assert asyncio.run(delivered_before_the_timeout(j)) == PAGE_BYTES // 1_000
