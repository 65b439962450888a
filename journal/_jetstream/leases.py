"""The owner leases one JetStream engine takes (SPEC 16.5): an `own()`'s taking of one,
recorded in the session's row; its heartbeats, a message every `heartbeat_s` on the
session's heartbeat subject; its release, and a release that went unanswered asked
again on the engine's loop until it is recorded or the journal closes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..engine import AcquireLease, Operation, ReleaseLease
from ..errors import JournalClosed, JournalError, OwnerBusy, StoreUnavailable
from ..sessions import SessionRow
from .client import ANOTHER_CAME_FIRST, ApiError, Connection, Unavailable
from .layout import ENCODER, Heartbeat, Subjects
from .owners import PROCESS_LEASES
from .reads import stored_row

__all__ = ["JetStreamLease", "Leases", "boot_id", "start_time"]


def boot_id() -> str:
    """The machine's boot id and this process's pid namespace (`PROCESS_BOOT`): a row of
    another namespace is judged by its heartbeat, as one of another host is."""
    from .._local.leases import PROCESS_BOOT

    return PROCESS_BOOT


def start_time(pid: int) -> int:
    from .._local.leases import process_start_time

    return process_start_time(pid)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class JetStreamLease:
    """This process's hold on a session's owner lease: recorded in the session's row, kept
    alive by a heartbeat message every `heartbeat_s` (`JetStreamOptions`)."""

    def __init__(self, leases: Leases, session_id: str, incarnation: int, generation: int) -> None:
        self.session_id = session_id
        self.incarnation = incarnation
        self.generation = generation
        self._leases = leases
        self._beat: asyncio.Task[None] | None = None
        # The sequence of its last beat, which the next expects to be the heartbeat
        # subject's last (0: not known, the next beat expects nothing).
        self._beat_seq = 0
        # (Emptied by the release's one `pop()`: once, by whichever comes first, and with
        # no lock, which a signal handler's close in the thread that was releasing it
        # would wait for, for good.)
        self._unreleased = [True]

    @property
    def held(self) -> bool:
        return bool(self._unreleased)

    async def start(self) -> asyncio.Task[None]:
        """The first beat, then the task that beats on (on the engine's loop)."""
        self._beat_seq = await self._leases.beat(self, 0)
        return asyncio.get_running_loop().create_task(self._beating())

    def beating(self, task: asyncio.Task[None]) -> None:
        self._beat = task

    async def _beating(self) -> None:
        """Each beat expects its own last beat to be the subject's last message. When
        another came since (the owner of an incarnation created after an eviction, or
        one that took the lease over), or the subject was purged (an eviction), the beats
        stop once the row no longer records this lease: until 2026-12-06 they went on,
        each rolling up the other owner's beat, and a live owner on another host was
        judged dead about half the time (a soak), and the beats after an eviction stayed
        in the stream for good."""
        while True:
            await asyncio.sleep(self._leases.heartbeat_s)
            try:
                self._beat_seq = await self._leases.beat(self, self._beat_seq)
            except ApiError as e:
                self._beat_seq = 0  # (asked again without the expectation)
                if e.err_code in ANOTHER_CAME_FIRST and not await self._leases.recorded(self):
                    return
            except Unavailable:
                self._beat_seq = 0  # (it may have landed: its sequence is not known)

    def release(self) -> None:
        leases = self._leases
        beat = self._beat
        release = ReleaseLease(self.session_id, self.incarnation, self.generation)
        # (Once, whichever thread comes first: taken with no call between it and the
        # `try`, as `LocalLease.release` takes its fd, so no Ctrl+C lands in between; one
        # that cuts the release short puts it back for the next one, the journal's close
        # say: the lease was otherwise held until it lapsed; a review.)
        unreleased, self._unreleased = self._unreleased, []
        if not unreleased:
            return
        try:
            if beat is not None and not leases.loop.is_closed():
                leases.loop.call_soon_threadsafe(beat.cancel)
            leases.submit(release)
        except JournalClosed:
            pass  # closing: the heartbeat stops and the lease lapses
        except StoreUnavailable:
            leases.release_later(release)  # (another process would wait for our exit)
            raise StoreUnavailable(
                f"no reply from JetStream releasing the lease of session "
                f"{self.session_id!r}: the release is asked again every second until it is "
                "recorded (or this journal closes), so there is nothing to retry"
            ) from None
        except JournalError:
            raise  # (the store's answer: not asked again)
        except BaseException:
            self._unreleased = unreleased
            raise
        finally:
            if not self._unreleased:
                leases.forget(self)


class Leases:
    """The leases of one engine. It gives what the leases need: `submit` (the engine's,
    a sync commit), `run` (runs a coroutine on the engine's loop, as its requests are),
    `resubmit` (the writer's, on the loop), `closed` (whether the journal closed) and
    `point` (its fault points); `here` is this host's name and boot id."""

    def __init__(
        self,
        conn: Connection,
        subjects: Subjects,
        store_id: bytes,
        here: tuple[str, str],
        heartbeat_s: float,
        submit: Callable[[Operation[SessionRow]], SessionRow],
        run: Callable[[Coroutine[Any, Any, Any]], Any],
        resubmit: Callable[[Operation[SessionRow]], Coroutine[Any, Any, Any]],
        closed: Callable[[], bool],
        point: Callable[[str, object], None],
    ) -> None:
        self._conn = conn
        self._subjects = subjects
        self._store_id = store_id
        self._host, self._boot = here
        self.heartbeat_s = heartbeat_s
        self.submit = submit
        self._run = run
        self._resubmit = resubmit
        self._closed = closed
        self._point = point
        self._held: set[JetStreamLease] = set()
        self._retries: set[asyncio.Task[None]] = set()  # (releases asked again)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._conn.loop

    def acquire(self, session_id: str, wait_s: float) -> JetStreamLease:
        """Takes the lease, waiting up to `wait_s` while another owner holds it (the
        engine checked that the journal is usable and writable)."""
        deadline = time.monotonic() + wait_s
        pid = os.getpid()
        operation = AcquireLease(session_id, pid, max(start_time(pid), 0), self._host, self._boot)
        with PROCESS_LEASES.taking(self._store_id, session_id):
            while True:
                try:
                    row = self.submit(operation)
                    break
                except OwnerBusy:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.05)
            lease = JetStreamLease(self, session_id, row.incarnation, row.owner_generation)
            self._held.add(lease)
            PROCESS_LEASES.hold(self._store_id, lease, True)
        try:
            self._point("lease.taken", session_id)  # (on the caller's thread)
            # (Through the engine's `_run`: a close by another thread meanwhile is
            # JournalClosed.)
            lease.beating(self._run(lease.start()))
        except BaseException:
            lease.release()
            raise
        return lease

    async def beat(self, lease: JetStreamLease, after: int) -> int:
        """Publish a beat of `lease` (expecting the subject's last sequence to be `after`,
        unless 0); its sequence."""
        beat = Heartbeat(lease.incarnation, lease.generation, os.getpid(), self._host, _now_ms())
        token = Subjects.token(lease.session_id)
        headers = {"Nats-Rollup": "sub"}
        if after:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(after)
        return await self._conn.publish(
            self._subjects.heartbeat(token), ENCODER.encode(beat), headers
        )

    async def recorded(self, lease: JetStreamLease) -> bool:
        """Whether the session's row may still record `lease` (read through the stream's
        leader; a read that fails or a row that does not decode says it may, and so does
        a row older than the lease: a stream leader cut off from its cluster answers from
        its stale copy for a while, and refuses the beat's expectation there too. Until
        2026-12-06 such an answer stopped the beats of a live owner whose connection had
        moved onto that node, and a third host took its lease over once the partition
        healed: a review, `-m cluster`,
        `test_an_owner_whose_connection_lands_on_a_stale_leader_keeps_beating`)."""
        subject = self._subjects.row(Subjects.token(lease.session_id))
        try:
            found = await self._conn.msg_get({"last_by_subj": subject})
            row = None if found is None else stored_row(found)
        except (JournalError, ApiError, *Unavailable):
            return True
        if found is None:
            return True  # (no row at all: a copy older than the session's creation)
        if row is None:
            # A tombstone: of this incarnation (or a later one), or an earlier one's seen
            # by a copy older than this incarnation's creation.
            return found.seq < lease.incarnation
        # (A session's incarnations, and an incarnation's generations, only grow.)
        return (row.incarnation, row.owner_generation) <= (lease.incarnation, lease.generation)

    def release_later(self, operation: ReleaseLease) -> None:
        """A release that went unanswered (an outage) is asked again on the loop, every
        second until it is recorded or the journal closes: the lease stays recorded till
        then, and another process of this host judges it by this process's pid."""

        async def again() -> None:
            while not self._closed():
                await asyncio.sleep(1.0)
                with contextlib.suppress(JournalError, ApiError, *Unavailable):
                    await self._resubmit(operation)
                    return

        def start() -> None:
            task = self._conn.loop.create_task(again())
            self._retries.add(task)
            task.add_done_callback(self._retries.discard)

        with contextlib.suppress(RuntimeError):  # (a closed loop: nothing to retry on)
            self._conn.loop.call_soon_threadsafe(start)

    def forget(self, lease: JetStreamLease) -> None:
        self._held.discard(lease)
        PROCESS_LEASES.hold(self._store_id, lease, False)

    def release_all(self) -> None:
        """Releases every lease still held (the journal closes)."""
        for lease in list(self._held):
            with contextlib.suppress(Exception):
                lease.release()
