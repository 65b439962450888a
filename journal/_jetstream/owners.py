"""The owner leases this process holds (`PROCESS_LEASES`, across its journals), and
whether the owner a session's row records is alive (SPEC 16.5, "owner liveness"): on
this machine, in this pid namespace, by the owner's pid and start time (this process:
by its own leases); elsewhere by the lease's heartbeat message, which the holder writes
every `HEARTBEAT_S` and which is older than `LEASE_S` once its holder died: by when the
server stored it, against the servers' time (`server_clock.py`), so that the hosts'
clocks need not agree.

A round of checks of a journal's live followers (`owners_alive`, SPEC 7.8) reads every
heartbeat it needs in batched direct gets, not one leader get per row: 200 turns in
progress owned on another host took 190 ms a round, and a round comes every 100 ms.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

from .._local.leases import process_start_time
from ..sessions import SessionRow
from .client import Connection, Found
from .layout import HEARTBEAT_DECODER, Subjects
from .reads import StoreReader, view_lag_ms
from .server_clock import ServerClock, parse_server_time_ms, stored_ms

if TYPE_CHECKING:
    from .leases import JetStreamLease

__all__ = ["HEARTBEAT_S", "LEASE_S", "PROCESS_LEASES", "OwnerJudge", "ProcessLeases"]

# An owner lease whose heartbeat is older than this is a dead owner (there is no flock
# across machines); the holder beats every HEARTBEAT_S.
LEASE_S: Final = 10.0
HEARTBEAT_S: Final = 1.0


class ProcessLeases:
    """The owner leases of this process, across all its journals: the generations held
    by live `JetStreamLease`s and the `own()` calls in flight, per (store id, session). A
    row that names this very process as owner with neither is a lease nobody holds: an
    `own()` that committed it and then failed (its first heartbeat and its release both
    unanswered in an outage, or its commit unanswered for 30 s and stored after all)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[tuple[bytes, str, int, int]] = set()
        self._taking: dict[tuple[bytes, str], int] = {}

    @contextlib.contextmanager
    def taking(self, store_id: bytes, session_id: str) -> Iterator[None]:
        key = (store_id, session_id)
        with self._lock:
            self._taking[key] = self._taking.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._taking[key] - 1
                if left:
                    self._taking[key] = left
                else:
                    del self._taking[key]

    def hold(self, store_id: bytes, lease: JetStreamLease, held: bool) -> None:
        key = (store_id, lease.session_id, lease.incarnation, lease.generation)
        with self._lock:
            if held:
                self._held.add(key)
            else:
                self._held.discard(key)

    def alive(self, store_id: bytes, row: SessionRow, taking: int) -> bool:
        """Whether this process holds the lease `row` records (or may be about to: an
        `own()` of the session in flight besides the `taking` asking)."""
        key = (store_id, row.session_id, row.incarnation, row.owner_generation)
        with self._lock:
            return key in self._held or self._taking.get(key[:2], 0) > taking


PROCESS_LEASES: Final = ProcessLeases()


class OwnerJudge:
    """The owner checks of one engine: `mine(row, taking)` says whether this process
    holds the lease a row of its own pid records (or may be about to: `taking`, as
    `ProcessLeases.alive`)."""

    def __init__(
        self,
        conn: Connection,
        reader: StoreReader,
        subjects: Subjects,
        here: tuple[str, str, int],
        mine: Callable[[SessionRow, int], bool],
        clock: ServerClock,
    ) -> None:
        self._conn = conn
        self._reader = reader
        self._subjects = subjects
        self._host, self._boot, self._pid = here
        self._mine = mine
        self._clock = clock

    def _by_process(self, row: SessionRow, taking: int) -> bool | None:
        """What this machine tells of the owner (None: its heartbeat must tell)."""
        if not row.owner_pid:
            return False
        if row.owner_host != self._host or row.owner_boot_id != self._boot or not self._boot:
            return None  # another host, boot or pid namespace
        if row.owner_pid == os.getpid() == self._pid:
            # This process: alive only while one of its leases holds it (a lease an own()
            # committed and then failed to start or release is nobody's).
            return self._mine(row, taking)
        started = process_start_time(row.owner_pid)
        if started < 0:
            return False
        if started and row.owner_start_time:
            return started == row.owner_start_time  # (another: the pid was reused)
        return None  # (its start time is not known: no /proc)

    @staticmethod
    def _last_sign(row: SessionRow, message: Found | None) -> int:
        """When the lease last showed its holder alive, on the servers' clock: its last
        heartbeat by when the server stored it, else its taking by the time its commit
        recorded."""
        if message is not None:
            beat = HEARTBEAT_DECODER.decode(message.data)
            if beat.incarnation == row.incarnation and beat.generation == row.owner_generation:
                return stored_ms(message)
        return row.owner_since_ms

    async def _recent(self, signs: list[int]) -> list[bool]:
        """Whether each last sign is recent: less than `LEASE_S` old, not counting the
        time before the stream's leader was elected, as the leader that answers knows.
        A stream without a leader stores no heartbeat, and the election after its leader
        hung or died takes several seconds (a node stopped with SIGSTOP: about 10 s
        without one): a beat older than the lease is judged against the leader's election
        too, asked of the servers then. Until 2026-12-06 it was not, and a live owner on
        another host whose stream's leader hung for 15 s was taken over 11 s into the
        hang, its watchers told `OutcomeUnknown` and its next turn refused with
        `OwnerBusy` (an operator trial). And a leader cut off from its cluster goes on
        answering from its stale copy for about 20 s: a beat is judged as of when it last
        heard from a quorum of the stream's replicas (`reads.view_lag_ms`), and while the
        stream has no leader nothing is judged dead (until 2026-12-06 a watcher whose
        connection was on such a leader judged a live owner dead 10 s into the partition:
        `-m cluster`,
        `test_a_watcher_on_a_cut_off_stream_leader_does_not_judge_a_live_owner_dead`)."""
        lease_ms = LEASE_S * 1000
        servers_now = await self._clock.now_ms()
        if all(servers_now - sign < lease_ms for sign in signs):
            return [True] * len(signs)
        info = await self._conn.api(f"$JS.API.STREAM.INFO.{self._conn.stream}")
        cluster = info.get("cluster") or {}
        lag_ms = view_lag_ms(cluster)
        if lag_ms is None:
            return [True] * len(signs)  # (cannot tell: no leader, or none in touch)
        leader_since = str(cluster.get("leader_since") or "")
        elected = (
            parse_server_time_ms(leader_since, "the stream leader's election")
            if leader_since
            else 0
        )
        seen_ms = servers_now - lag_ms
        return [seen_ms - max(sign, elected) < lease_ms for sign in signs]

    async def alive(self, row: SessionRow, taking: int = 0) -> bool:
        """One owner's check; its heartbeat is read through the stream's leader."""
        judged = self._by_process(row, taking)
        if judged is not None:
            return judged
        subject = self._subjects.heartbeat(Subjects.token(row.session_id))
        message = await self._conn.msg_get({"last_by_subj": subject})
        return (await self._recent([self._last_sign(row, message)]))[0]

    async def all_alive(self, rows: list[SessionRow]) -> list[bool | None]:
        """A round's checks, in order: the heartbeats of the rows this machine cannot
        judge are read together (a replica that answers has every message this engine
        saw committed; a beat it lacks is at most a moment old)."""
        judged: list[bool | None] = [self._by_process(row, 0) for row in rows]
        beats = {
            self._subjects.heartbeat(Subjects.token(row.session_id))
            for row, known in zip(rows, judged, strict=True)
            if known is None
        }
        if not beats:
            return judged
        found = await self._reader.last_messages(sorted(beats))
        unknown = [i for i, known in enumerate(judged) if known is None]
        signs = [
            self._last_sign(
                rows[i],
                found.get(self._subjects.heartbeat(Subjects.token(rows[i].session_id))),
            )
            for i in unknown
        ]
        for i, recent in zip(unknown, await self._recent(signs), strict=True):
            judged[i] = recent
        return judged
