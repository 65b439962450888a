"""Moving a journal's connection off a server cut off from its cluster.

The client reconnects by itself when its server is gone or hangs (its pings go
unanswered: `client.PING_S`), but a server that runs and answers pings while a network
partition cuts it off from the rest of its cluster keeps the client, though the other
servers of the URL's list, which this host may well reach, serve the stream: its writes
go unanswered or are refused for want of a leader, and so are its reads, except that a
stream leader cut off goes on answering as the leader from its stale copy for about 20 s
(nats-server 2.15.1), refusing writes' compare-and-sets and showing nothing of what the
others stored since. So once no write on the connection has been acknowledged for
`CUT_OFF_S` while writes were asked (a refusal of the compare-and-set counts as no
answer), or no read has had an answer for as long while reads were asked (the engine
tells `Connection.no_answer` of a settling read's "nothing there yet"; direct gets are not
counted, a server's own replica answers them), the connection moves to the next server
of the list (the client takes them in turn, `client.Connection`), again while it lands on
the server it left, at most `MOVE_TRIES` times a move. A window is looked at when a failure
is noted, which for a request that had no answer at all is when it timed out
(`client.REQUEST_S`, 5 s): an owner's heartbeats, one at a time a second apart, were noted
5 s and 11 s after the first went out, so the move came 11 s in, past the lease (until
2026-12-06: a review, an owner whose server, not the stream's leader, was cut off). So
a window opened by requests that had no answer at all (timed out, nobody serving, or
refused for want of a leader; not a compare-and-set refused, which is ordinary under
contention) is also looked at before the next request goes out (`before`), and once it
has been open `CUT_OFF_S` the move is made, and waited for (at most `MOVE_WAIT_S`), first:
the request goes out on the new connection. A move that finds no other server (the
others down or unreachable) changes nothing, and the next waits twice as long, up to
`MAX_WAIT_S`; the requests fail as they would have. A quorum loss among servers the
host still reaches is not that: each move lands, and the connection moves every 6 to
12 s while it lasts (measured, and kept: SPEC 16). (Until
2026-12-06 the client stayed: a writer whose server was cut off from the two others
appended nothing for as long as the partition lasted, and an owner there was judged
dead; a partition trial, SPEC 16.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

from nats.aio.client import Client

__all__ = ["CUT_OFF_S", "MAX_WAIT_S", "MOVE_TRIES", "MOVE_WAIT_S", "CutOff"]

# How long writes (or reads) may go unanswered, from when the first of them was sent,
# before the connection moves: within an owner's lease (10 s, `owners.LEASE_S`), so that
# an owner whose server is cut off beats again through another before it is judged dead
# (its next beat, a second after one timed out, moves first: `CutOff.before`).
# (A move during a leader election, which takes up to about 10 s here, costs a reconnect.)
CUT_OFF_S: Final = 6.0
MAX_WAIT_S: Final = 80.0
# How many reconnects a move makes while the client lands on the server it left.
MOVE_TRIES: Final = 3
# How long a request waits for a move made before it goes out (`CutOff.before`): a
# reconnect to a server that is there takes milliseconds.
MOVE_WAIT_S: Final = 2.0


class CutOff:
    """The connection's record of answers (see the module docstring); on its loop only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # Since when writes, and reads, have gone unanswered (None: the last had an answer).
        self._since: dict[bool, float | None] = {True: None, False: None}
        # Since when they have had no answer at all (None: the last had a reply, which
        # may be a refusal of its compare-and-set).
        self._silent: dict[bool, float | None] = {True: None, False: None}
        self._last = {True: 0.0, False: 0.0}  # (when the last failure was noted)
        self._wait = CUT_OFF_S
        self._moved_at = -MAX_WAIT_S
        self._moving: asyncio.Task[None] | None = None
        self.moves = 0

    def answered(self, write: bool) -> None:
        self._since[write] = None
        self._silent[write] = None

    def unanswered(self, nc: Client, write: bool, sent: float, silent: bool = False) -> None:
        """A request sent at `sent` (on `clock`) that the servers did not answer, refused
        for want of a leader, or (a write) refused for its compare-and-set: a leader cut
        off answers a writer so from its stale copy, and a writer refused so for the whole
        window gains nothing where it is either. `silent`: it had no answer at all (timed
        out, nobody serving it, or refused for want of a leader)."""
        now = self._clock()
        self._forget_old(sent)
        if self._since[write] is None:
            self._since[write] = sent
        if not silent:
            self._silent[write] = None
        elif self._silent[write] is None:
            self._silent[write] = sent
        self._last[write] = now
        since = min(t for t in self._since.values() if t is not None)
        if now - since >= self._wait:
            self._start_move(nc, now)

    async def before(self, nc: Client) -> None:
        """Before a request goes out: when requests have had no answer at all for
        `CUT_OFF_S`, move the connection (or wait for a move underway), waiting at most
        `MOVE_WAIT_S` for it, so that the request goes out on the new connection."""
        now = self._clock()
        self._forget_old(now)
        silent = [t for t in self._silent.values() if t is not None]
        if silent and now - min(silent) >= self._wait:
            self._start_move(nc, now)
        moving = self._moving
        if moving is not None and not moving.done():
            await asyncio.wait({moving}, timeout=MOVE_WAIT_S)

    def _forget_old(self, now: float) -> None:
        """A failure long after the last starts anew, for either kind: until 2026-12-06
        only its own, and a window the other kind left open, a write refused once and
        never acknowledged after, moved at once (a review)."""
        for kind in (True, False):
            if now - self._last[kind] > 2 * CUT_OFF_S:
                self._since[kind] = None
                self._silent[kind] = None

    def _start_move(self, nc: Client, now: float) -> None:
        if now - self._moved_at < self._wait:
            return
        if self._moving is not None and not self._moving.done():
            return
        if not nc.is_connected or len(nc.servers) < 2 or nc.connected_url is None:
            return  # (reconnecting already, or nowhere else to go)
        self._moved_at = now
        self._since = {True: None, False: None}
        self._silent = {True: None, False: None}
        self.moves += 1
        self._moving = asyncio.get_running_loop().create_task(self._move(nc))

    async def _move(self, nc: Client) -> None:
        left = nc.connected_url.netloc if nc.connected_url else ""
        for _ in range(MOVE_TRIES):
            await nc.force_reconnect()
            deadline = time.monotonic() + CUT_OFF_S
            while not nc.is_connected and not nc.is_closed and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            landed = nc.connected_url
            if nc.is_connected and landed is not None and landed.netloc != left:
                self._wait = CUT_OFF_S
                return
        self._wait = min(self._wait * 2, MAX_WAIT_S)
