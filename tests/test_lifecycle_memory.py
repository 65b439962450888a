"""What lifecycle follows hold while they deliver their startup snapshot (SPEC 7.7): the
rows are copied once, still encoded, and shared by the follows that start meanwhile;
each builds its events a page (`SNAPSHOT_PAGE`) at a time."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from pathlib import Path

from journal import Journal
from journal.lifecycle import SNAPSHOT_PAGE

SESSIONS = 2_000
FOLLOWS = 40


def test_follows_starting_together_share_one_encoded_copy_of_the_rows(tmp_path: Path) -> None:
    """Each of 40 follows over 2,000 sessions held every row decoded and every event
    built (34.6 MB traced here) until 2026-12-03."""
    with Journal.open(tmp_path / "store", durability="os") as j:
        for i in range(SESSIONS):
            j.create_session(f"s{i:05d}")

        async def hold_first_pages() -> int:
            started = asyncio.Event()
            firsts: list[str] = []

            async def follow() -> None:
                async for event in j.awatch_sessions():
                    firsts.append(event.session.session_id)
                    del event  # (this test's own reference, while it waits)
                    await started.wait()
                    return

            tasks = [asyncio.create_task(follow()) for _ in range(FOLLOWS)]
            try:
                while len(firsts) < FOLLOWS:
                    await asyncio.sleep(0.01)
                gc.collect()
                held, _ = tracemalloc.get_traced_memory()
            finally:
                started.set()
                await asyncio.gather(*tasks, return_exceptions=True)
            assert firsts == ["s00000"] * FOLLOWS
            return held

        gc.collect()
        tracemalloc.start()
        try:
            held = asyncio.run(hold_first_pages())
        finally:
            tracemalloc.stop()
    # One encoded copy (about 160 B a row) and a page of events per follow (about 1.1 KB
    # each): about 0.3 + 40 * 0.07 MB; 4 MB leaves room for the asyncio machinery.
    assert SNAPSHOT_PAGE * 1_100 * FOLLOWS + SESSIONS * 200 < 4_000_000
    assert held < 4_000_000, f"{held / 1e6:.1f} MB traced for {FOLLOWS} follows"
