"""A step of `awatch` / `awatch_sessions` cancelled from outside leaves the follow usable
(SPEC 7.6): the next step goes on after the last item delivered.

Found by an asyncio-service trial: a server that sends keep-alives while a
session is quiet waits for each event with a timeout, `asyncio.wait_for(anext(it), 15)`.
The first timeout cancelled the async generator's step, which ends an async generator,
and the next step raised `StopAsyncIteration`: the stream ended as if the session had
ended (it was still open), on both engines."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import os
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from journal import EventIn, Journal, LifecycleEventType


async def _next_within(it: AsyncIterator[Any], seconds: float) -> Any:
    """The next item, or None when none came within `seconds` (the step is cancelled)."""
    try:
        return await asyncio.wait_for(anext(it), seconds)
    except TimeoutError:
        return None


def test_a_step_timed_out_at_the_head_leaves_the_watch_going(j: Journal) -> None:
    j.create_session("quiet")
    j.append("quiet", [EventIn(type="m", data=b"1")])

    async def main() -> list[Any]:
        it = j.awatch("quiet")
        seen: list[Any] = [(await _next_within(it, 5)).ordinal]
        for _ in range(3):  # three keep-alives while nothing comes
            seen.append(await _next_within(it, 0.02))
        await asyncio.to_thread(j.append, "quiet", [EventIn(type="m", data=b"2")])
        event = await _next_within(it, 5)
        seen.append(None if event is None else event.ordinal)
        await asyncio.to_thread(j.resolve_session, "quiet")
        try:
            await anext(it)
        except StopAsyncIteration:
            seen.append("end")
        return seen

    assert asyncio.run(main()) == [1, None, None, None, 2, "end"]


def test_steps_cancelled_during_a_catch_up_skip_and_repeat_nothing(j: Journal) -> None:
    events = 300
    j.create_session("long")
    for _ in range(events // 100):
        j.append("long", [EventIn(type="m", data=b"x" * 200) for _ in range(100)])
    j.resolve_session("long")
    rng = random.Random(23)

    async def main() -> list[int]:
        it = j.awatch("long", max_bytes=800)  # 4 events a page
        seen: list[int] = []
        timeouts = 0
        while True:
            # (0 and tiny timeouts: cancelled before, during and after a page's read)
            try:
                event = await _next_within(it, rng.choice([0, 0, 0.0001, 0.001, 0.003, 5]))
            except StopAsyncIteration:  # (resolved: every event was delivered)
                break
            if event is None:
                timeouts += 1
            else:
                seen.append(event.ordinal)
        assert timeouts > 10
        return seen

    assert asyncio.run(main()) == list(range(1, events + 1))


def test_a_lifecycle_step_timed_out_leaves_the_feed_going(j: Journal) -> None:
    j.create_session("a")

    async def main() -> list[Any]:
        it = j.awatch_sessions()
        first = await _next_within(it, 5)
        seen: list[Any] = [(first.event_type, first.session.session_id)]
        seen.append(await _next_within(it, 0.02))
        await asyncio.to_thread(j.create_session, "b")
        change = await _next_within(it, 5)
        seen.append(None if change is None else (change.event_type, change.session.session_id))
        return seen

    assert asyncio.run(main()) == [
        (LifecycleEventType.CREATED, "a"),
        None,
        (LifecycleEventType.CREATED, "b"),
    ]


def test_a_cancelled_task_still_ends_its_watch(j: Journal) -> None:
    """Cancelling the task that iterates stops the follow, as before (nothing waits)."""
    j.create_session("s")

    async def main() -> int:
        async def follow() -> None:
            async for _ in j.awatch("s"):
                pass

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
        return j._engine.waiter.waiting  # noqa: SLF001

    assert asyncio.run(main()) == 0


def test_a_page_read_before_its_step_was_cancelled_is_delivered_next(j: Journal) -> None:
    """With JetStream a page is read in a worker thread: a step cancelled after the read
    finished, before the loop took its result, has moved the pager on; the next step
    delivers that page (not the one after it: a gap)."""
    j.create_session("long")
    j.append("long", [EventIn(type="m", data=b"x" * 200) for _ in range(20)])
    j.resolve_session("long")

    async def main() -> list[int]:
        it = j.awatch("long", max_bytes=800)  # 4 events a page
        seen = [(await anext(it)).ordinal for _ in range(4)]  # the first page
        step = asyncio.create_task(anext(it))  # reads the second page
        await asyncio.sleep(0)
        time.sleep(0.3)  # (the loop is held: the read finishes, its result waits)
        step.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            seen.append((await step).ordinal)  # (the local engine read it on the loop)
        seen += [event.ordinal async for event in it]  # (ends: resolved)
        return seen

    assert asyncio.run(main()) == list(range(1, 21))


def test_steps_cancelled_before_they_began_keep_the_rest_of_the_page(j: Journal) -> None:
    """`asyncio.wait_for(anext(it), 0)` cancels the step before it runs, which throws
    the cancellation into the generator where it last yielded, mid-page."""
    j.create_session("s")
    j.append("s", [EventIn(type="m", data=b"x" * 200) for _ in range(12)])
    j.resolve_session("s")

    async def main() -> list[Any]:
        it = j.awatch("s", max_bytes=800)  # 4 events a page
        seen: list[Any] = [(await anext(it)).ordinal]
        seen += [await _next_within(it, 0) for _ in range(3)]
        seen += [event.ordinal async for event in it]
        return seen

    assert asyncio.run(main()) == [1, None, None, None, *range(2, 13)]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_cancelled_tasks_kept_by_the_application_hold_no_segment_file(tmp_path: Path) -> None:
    """A cancelled task keeps its exception's traceback, whose frames keep its `awatch`
    (a server that keeps its tasks until it reaps them): the follow may go on, but its
    segment file is closed at the cancellation, as the old generator's `with` did (until
    the fix, the first version of `AsyncFollow` kept it open until the task was dropped:
    a follower at the head keeps its reader open while 32 or fewer do)."""
    store = tmp_path / "store"
    with Journal.open(store, durability="os") as j:
        for n in range(10):
            j.create_session(f"s{n}")
            j.append(f"s{n}", [EventIn(type="m", data=b"x")])

        writer = _segment_files(store)  # (the writer's active segment)

        async def main() -> list[asyncio.Task[None]]:
            async def follow(session_id: str) -> None:
                async for _ in j.awatch(session_id):
                    pass

            tasks = [asyncio.create_task(follow(f"s{n}")) for n in range(10)]
            waiter = j._engine.waiter  # noqa: SLF001
            for _ in range(500):  # (until each waits at the head, its segment open)
                if waiter.waiting == 10:
                    break
                await asyncio.sleep(0.01)
            assert len(_segment_files(store)) == len(writer) + 10
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return tasks  # (kept: their tracebacks keep their follows)

        tasks = asyncio.run(main())
        gc.collect()
        assert _segment_files(store) == writer
        del tasks


def _segment_files(store: Path) -> list[str]:
    targets = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            targets.append(os.readlink(f"/proc/self/fd/{name}"))
    prefix = os.path.realpath(store / "segments") + os.sep
    return [target for target in targets if target.startswith(prefix)]


def test_aclose_closes_the_follower_itself(j: Journal) -> None:
    # `aclose()` mid-page ends the generator that reads the pages at once, not when the
    # loop's finalizer gets to it (until 2026-12-06 it read the follower after the step's
    # end had dropped it, and left it to the finalizer, holding its pager meanwhile).
    j.create_session("s")
    j.append("s", [EventIn(type="m", data=b"x") for _ in range(5)])

    async def main() -> list[str]:
        it = j.awatch("s")
        await anext(it)  # (four more of the page wait in the follower)
        await it.aclose()
        return [
            agen.__name__
            for agen in gc.get_objects()
            if inspect.isasyncgen(agen) and agen.__name__ == "afollow" and agen.ag_frame
        ]

    assert asyncio.run(main()) == []
