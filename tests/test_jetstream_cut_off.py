"""The JetStream connection's record of unanswered requests (`journal/_jetstream/cut_off.py`,
SPEC 16): when it moves a connection to another server of the list, on a real client
connected to the shared 3-node cluster (`-m cluster`), its time given by a clock of the
test's."""

from __future__ import annotations

import asyncio

import nats
import pytest
from _nats import shared_cluster

from journal._jetstream.cut_off import CUT_OFF_S, CutOff

pytestmark = pytest.mark.cluster


def test_a_failure_long_after_the_other_kinds_last_does_not_move_at_once() -> None:
    """Writes and reads each start a new window when a failure comes long after their
    last (2 * CUT_OFF_S), but the move took the earliest window of both kinds as it was:
    a write refused once (its compare-and-set lost to another writer, then its operation
    planned to nothing) and never acknowledged after left the writes' window open for
    good, and a single read unanswered a minute later moved the connection at once (a
    review, 2026-12-06). Reads that then go unanswered for CUT_OFF_S still move it."""

    servers = [s.url for s in shared_cluster().servers]

    async def run() -> None:
        nc = await nats.connect(servers=servers)
        try:
            now = [1000.0]
            cut_off = CutOff(clock=lambda: now[0])
            cut_off.unanswered(nc, True, now[0])  # (a write refused; no ack after)
            now[0] += 60.0
            cut_off.unanswered(nc, False, now[0] - 1.0)  # (one read unanswered)
            assert cut_off.moves == 0
            while now[0] < 1060.0 + CUT_OFF_S + 1.0:  # (reads unanswered from then on)
                now[0] += 0.5
                cut_off.unanswered(nc, False, now[0] - 0.5)
            assert cut_off.moves == 1
        finally:
            await asyncio.sleep(0.5)  # (the move's reconnect under way)
            await nc.close()

    asyncio.run(run())


def test_requests_with_no_answer_at_all_move_before_the_next_goes_out() -> None:
    """A window was looked at only when a failure was noted, for a request with no answer
    at all when it timed out (5 s): an owner's beats, a second apart, were noted 5 s and
    11 s after the first went out, and the move came 11 s in, past the lease (a review,
    2026-12-06). The next request now moves the connection before it goes out once the
    first had no answer CUT_OFF_S before; refusals of a compare-and-set, ordinary under
    contention, do not."""

    servers = [s.url for s in shared_cluster().servers]

    async def run() -> None:
        nc = await nats.connect(servers=servers, dont_randomize=True, reconnect_time_wait=0.2)
        try:
            now = [1000.0]
            cut_off = CutOff(clock=lambda: now[0])
            refused = CutOff(clock=lambda: now[0])
            now[0] += 5.0
            cut_off.unanswered(nc, True, 1000.0, silent=True)  # (a beat timed out)
            refused.unanswered(nc, True, 1000.0)  # (a write refused for its compare-and-set)
            now[0] += 1.0
            await refused.before(nc)
            assert refused.moves == 0
            await cut_off.before(nc)  # (the next beat)
            assert cut_off.moves == 1
            assert nc.is_connected  # (waited for: the beat goes out on the new connection)
        finally:
            await nc.close()

    asyncio.run(run())
