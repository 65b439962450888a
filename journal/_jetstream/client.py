"""The NATS connection of one journal: a nats-py client on its own event-loop thread, and
the few JetStream requests the engine makes (stream API calls, direct gets, atomic batch
publishes) written against the wire protocol, since nats-py 2.16 has only the header
names of atomic batches and no batched direct get.

Synchronous callers run coroutines on the loop with `call`; nothing here blocks the loop.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import functools
import json
import random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, TypeVar

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError, NoRespondersError, NoServersError
from nats.errors import TimeoutError as NatsTimeout

from ..engine import READ_SCOPE
from ..errors import StoreNotFound, StoreUnavailable
from ..remote import without_password
from ..short_of import short_of
from .cut_off import CutOff
from .loop_calls import LoopCall

__all__ = [
    "ANOTHER_CAME_FIRST",
    "PASS_RETRY_S",
    "REQUEST_S",
    "WRITE_TOKEN",
    "ApiError",
    "BatchMessage",
    "Closed",
    "Connection",
    "Found",
    "Unavailable",
    "asked_again",
    "failure",
]

T = TypeVar("T")

# How long one request waits for its reply. A leader election in an R3 cluster was
# measured at about 6 s (SPEC 16): writers retry across it (see `writes.py`).
REQUEST_S: Final = 5.0
# How long a direct get waits for its answer to begin before it is sent again (to whichever
# replica the servers pick then: one may hang), the wait doubling each time, within
# REQUEST_S (`Connection.direct`). A live replica begins within milliseconds.
DIRECT_FIRST_S: Final = 0.5
# How long a batch waits for its ack before the writer settles what became of it (short:
# an ack lost in a failover is found out sooner; a late ack is settled just the same).
ACK_S: Final = 2.0
# How often the client pings its server, and how many pings may go unanswered before it
# takes the connection for dead and reconnects (to another server of the list): nats-py's
# 120 s and 2 left a client on a server that hung (stopped, or cut off with its TCP
# connection open) for 4 to 6 minutes, every request unanswered though the rest of the
# cluster served (until 2026-12-05: a runtime-author trial pausing a node with SIGSTOP;
# now 4 to 6 s).
PING_S: Final = 2
MAX_PINGS_OUT: Final = 2
# How long a read, and a maintenance pass's read, is asked again while the servers do not
# answer or refuse for want of a leader (a leader election takes seconds): one window,
# the engine's READ_RETRY_S.
PASS_RETRY_S: Final = 30.0
# JetStream's "temporarily unavailable": the stream (or the meta group) has no leader.
_NO_LEADER: Final = 10008
# A write's refusals of its compare-and-set (wrong last sequence; another write of the
# subject in process): counted as no answer (`cut_off`).
# A write's compare-and-set refused: the subject's last sequence is not the one expected
# (10071), or a write of it is in process at a clustered stream's leader (10164).
ANOTHER_CAME_FIRST: Final = frozenset({10071, 10164})
# JetStream's "stream not found" (`Connection.api`).
_STREAM_NOT_FOUND: Final = 10059
# JetStream's 503s that say the account has no JetStream (no account; not enabled for the
# account; not enabled): a misconfiguration, not a leader election (`ApiError.transient`).
_NOT_ENABLED: Final = frozenset({10035, 10039, 10076})
# Status headers that end a batched direct get (503: no responders, nobody serves it).
_END_STATUSES: Final = frozenset({"204", "404", "408", "413", "503"})

# (subject, payload, headers) of one message of an atomic batch.
BatchMessage = tuple[str, bytes, dict[str, str]]

# Errors of the connection itself (not of a request's content): the server may or may not
# have acted on what was sent.
# The header of a write's token, by which a write whose reply was lost is found.
WRITE_TOKEN: Final = "Journal-Write"
Unavailable: Final = (
    NatsTimeout,
    NoRespondersError,
    ConnectionClosedError,
    NoServersError,
    asyncio.TimeoutError,
)


async def _cancel_tasks(loop: _Loop) -> None:
    """Cancel every other task of the running loop and wait for them to end; then close
    the connections nats-py left open (`_Loop`)."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await loop.close_dropped()


class _Loop(asyncio.SelectorEventLoop):
    """The event loop of one connection, which closes the sockets nats-py drops.

    nats-py 2.16 leaves open the socket of a connection attempt whose server accepted it
    and never said INFO (a server that hangs, stopped or stalled: its kernel still
    accepts): a reconnect's next attempt replaces it unclosed (`TcpTransport.connect`),
    and a first connect given up on (`Connection._connect`'s timeout) drops it with the
    client. The garbage collector closed each, with a ResourceWarning ("unclosed
    <StreamWriter ...>"): one for every 2 s attempt of an outage, 29 in the 65 s of an
    import's unanswered commit (until 2026-12-07). Only nats-py makes connections on this
    loop, and it uses one at a time, the last it made: one made before that and still
    open when it makes another was dropped, and is closed then; what is left when the
    connection closes, by `close_dropped`."""

    def __init__(self) -> None:
        super().__init__()
        self._made: list[asyncio.BaseTransport] = []

    async def create_connection(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        await self.close_dropped()
        transport, protocol = await super().create_connection(*args, **kwargs)
        self._made.append(transport)
        return transport, protocol

    async def close_dropped(self) -> None:
        """Close every connection made on the loop that is still open (on the loop)."""
        made, self._made = self._made, []
        closing = [t for t in made if not t.is_closing()]
        for transport in closing:
            transport.close()
        if closing:
            await asyncio.sleep(0)  # (the socket itself is closed on the loop's next turn)


class _DirectTry:
    """One request of a batched direct get (`Connection.direct`): its inbox's
    subscription, the messages it brought, `begun` once anything came, `done` with the
    end-of-batch marker's headers (only its `Status` when it is not 204)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.found: list[Found] = []
        self.begun: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[dict[str, str]] = loop.create_future()
        self.sub: Any = None

    @classmethod
    async def send(cls, nc: Client, stream: str, payload: bytes) -> _DirectTry:
        attempt = cls(asyncio.get_running_loop())
        inbox = nc.new_inbox()
        attempt.sub = await nc.subscribe(inbox, cb=attempt.collect)
        try:
            await nc.publish(f"$JS.API.DIRECT.GET.{stream}", payload, reply=inbox)
        except BaseException:
            with contextlib.suppress(Exception):
                await attempt.sub.unsubscribe()
            raise
        return attempt

    async def collect(self, msg: Msg) -> None:
        if not self.begun.done():
            self.begun.set_result(None)
        headers = dict(msg.headers or {})
        status = headers.get("Status")
        if status is not None:
            if status in _END_STATUSES and not self.done.done():
                self.done.set_result(headers if status == "204" else {"Status": status})
            return
        self.found.append(_found(msg, headers))


class Closed(Exception):
    """The connection was closed (by another thread) before the call's answer came."""


class ApiError(Exception):
    """A JetStream API error reply (`err_code` is JetStream's, e.g. 10071 for a wrong last
    sequence)."""

    def __init__(self, code: int, err_code: int, description: str) -> None:
        super().__init__(f"{description} (JetStream error {err_code})")
        self.code = code
        self.err_code = err_code
        self.description = description

    @property
    def no_leader(self) -> bool:
        """JetStream's "temporarily unavailable": the stream (or the meta group) has no
        leader (a majority of the servers down, or electing one)."""
        return self.err_code == _NO_LEADER

    @property
    def transient(self) -> bool:
        """A refusal that passes once the stream has a leader again (or a batch cut short
        by a failover: 10077, 10201)."""
        if self.err_code in _NOT_ENABLED:  # (503s that no retry mends)
            return False
        return self.code >= 500 or self.err_code in (_NO_LEADER, 10077, 10201)


class Found:
    """One stored message as a direct get returns it."""

    __slots__ = ("data", "headers", "seq", "subject")

    def __init__(self, subject: str, seq: int, data: bytes, headers: dict[str, str]) -> None:
        self.subject = subject
        self.seq = seq
        self.data = data
        self.headers = headers


def failure(error: BaseException) -> str:
    """What a request that failed met, for messages: the refusal (an `ApiError`), or the
    servers' silence (one of `Unavailable`)."""
    if isinstance(error, ApiError):
        if error.no_leader:
            # (a read asked again for 30 s ends here: until 2026-12-05 it said only the
            # refusal, "JetStream system temporarily unavailable (JetStream error 10008)",
            # nothing of what it means or what to do: a runtime-author trial with two of
            # a cluster's three nodes down)
            return (
                f"JetStream refused a request: {error}: it has no leader to answer it "
                "(a majority of the servers is down, or still electing one): check that "
                "they run and reach each other, then retry"
            )
        return f"JetStream refused a request: {error}"
    return f"the NATS servers did not answer ({type(error).__name__})"


async def asked_again(read: Callable[[], Awaitable[T]]) -> T:
    """A read of a maintenance pass, asked again for up to PASS_RETRY_S while the servers
    do not answer or refuse for want of a leader (a failover), as every read is (SPEC
    16.4); until 2026-12-05 `expire_due()` asked once and raised `StoreUnavailable` after
    5 s right after a stream leader's kill (a crash trial)."""
    deadline = time.monotonic() + PASS_RETRY_S
    while True:
        try:
            return await read()
        except (ApiError, *Unavailable) as e:
            if (isinstance(e, ApiError) and not e.transient) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


class Connection:
    """A nats-py client running on a private event-loop thread (see the module docstring)."""

    def __init__(self, servers: list[str], stream: str, connect_s: float = 5.0) -> None:
        self.stream = stream
        try:
            self.loop = _Loop()
        except OSError as e:  # (its selector and self-pipe: raised bare from open)
            raise StoreUnavailable(
                f"cannot connect to NATS at {', '.join(map(without_password, servers))} "
                f"({e.strerror or e}); {short_of(e) or 'the OS refused an event loop'}",
                errno=e.errno,
            ) from e
        # The calls waiting for an answer: `cut` (the journal closing) cancels them and
        # refuses new ones (their callers get `Closed`), so no thread waits on a stopped
        # loop, nor, in an outage, for a request nobody needs any more.
        self._calls_lock = threading.RLock()  # (`call`)
        self._calls: set[LoopCall[Any]] = set()
        self._stopped = False
        # Every call waited for (the close's own too): the loop's thread releases those
        # left as it ends (`_run`), and nobody waits for a loop that will not run them.
        self._waits: set[LoopCall[Any]] = set()
        # Set by the engine once the store is open (`_still_not_found`).
        self.opened = False
        # The last "Permissions Violation" the servers reported (nats-py tells it to the
        # error callback only; the request it refused waits for its timeout): no retry
        # mends it, so an open that asks again stops at it (`denied`).
        self.denied: str | None = None
        # What the requests met: the connection moves off a server cut off from its
        # cluster (`cut_off.py`).
        self.cut_off = CutOff()
        self._thread = threading.Thread(target=self._run, name="journal-nats", daemon=True)
        self._thread.start()
        self.nc: Client
        try:
            self.nc = self.call(self._connect(servers, connect_s), connect_s + 5)
        except BaseException:
            self._stop_loop()
            raise

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # (Closed here, once stopped, not by the closing thread: a Ctrl+C inside
            # `loop.close()` in the main thread left the loop half closed, and the next
            # close raised AttributeError from asyncio; no signal handler runs here.)
            try:
                self.loop.close()
            finally:
                # (A close cut short after it asked the loop to stop: the next one's
                # request would wait its 5 s for a loop that ran it no more.)
                for running in list(self._waits):
                    running.end()

    async def _connect(self, servers: list[str], connect_s: float) -> Client:
        # nats-py retries a refused (or unauthorised) first connect until the timeout
        # below and reports each failure only here: the last one names the cause, but a
        # server's answer ("Authorization Violation") is not replaced by the reset of
        # the connection the server closed after it (CI run 88 said only that).
        last: list[Exception] = []

        async def quiet(error: Exception) -> None:
            # (reconnects are handled; failed requests raise on their own)
            if "permissions violation" in str(error).lower():
                self.denied = str(error).removeprefix("nats: ")
            if not (isinstance(error, OSError) and last and not isinstance(last[0], OSError)):
                last[:] = [error]

        try:
            # (nats-py retries a first connect as long as reconnects: bounded here.)
            return await asyncio.wait_for(
                nats.connect(
                    # (Taken in turn, from a random first: a reconnect goes to the next
                    # server, never back to the one it leaves while others are left, as
                    # nats-py's own pick at random may: `cut_off.py`.)
                    servers=random.sample(servers, len(servers)),
                    dont_randomize=True,
                    connect_timeout=min(connect_s, 2.0),
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.2,
                    allow_reconnect=True,
                    ping_interval=PING_S,
                    max_outstanding_pings=MAX_PINGS_OUT,
                    error_cb=quiet,
                    name="session-journal",
                ),
                connect_s,
            )
        except Exception as e:
            cause = last[0] if last and isinstance(e, asyncio.TimeoutError) else e
            detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
            shown = ", ".join(without_password(server) for server in servers)
            # (Out of descriptors, it said to check the URL and the credentials.)
            advice = short_of(cause) or (
                "check the URL, the credentials and that the servers run with JetStream enabled"
            )
            raise StoreUnavailable(
                f"cannot connect to NATS at {shown} ({detail}); {advice}",
                errno=cause.errno if short_of(cause) and isinstance(cause, OSError) else None,
            ) from None

    @property
    def connected(self) -> bool:
        """Whether the client is connected now (not reconnecting: a request sent meanwhile
        waits its whole timeout for an answer)."""
        return bool(self.nc.is_connected)

    def on_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the connection's loop and wait for its result (`TimeoutError`
        after `timeout` seconds; `Closed` when the connection closed first)."""
        if self.on_loop():
            coro.close()
            raise RuntimeError("a synchronous journal call from the journal's own loop")
        with self._calls_lock:
            if self._stopped:
                coro.close()
                raise Closed("the journal's NATS connection is closed")
            try:
                running = self._start(coro)
            except RuntimeError:
                if self._stopped:  # (its loop closed since the check: see below)
                    raise Closed("the journal's NATS connection is closed") from None
                raise
            self._calls.add(running)
        scope = READ_SCOPE.get()
        try:
            if self._stopped:
                # (A reentrant lock, and this check: a signal handler's close in this
                # thread while it held the lock took it again and waited for itself for
                # good; run before the call was added, it did not cancel it.)
                raise concurrent.futures.CancelledError
            if scope is None:
                return self._wait(running, timeout)
            # (an asyncio follower's read: cancelling its task cancels the request)
            with scope.on_cancel(functools.partial(self._cancel, running)):
                return self._wait(running, timeout)
        except concurrent.futures.CancelledError:
            if self._stopped:
                self._cancel(running)
                raise Closed("the journal's NATS connection was closed during the call") from None
            raise
        except BaseException:
            self._cancel(running)
            raise
        finally:
            with self._calls_lock:
                self._calls.discard(running)

    def _start(self, coro: Coroutine[Any, Any, T]) -> LoopCall[T]:
        """`coro` started on the loop (RuntimeError, `coro` closed: the loop is closed).
        Waited for on a lock of its own, not on a `concurrent.futures.Future`, whose
        condition a Ctrl+C in the waiting thread could leave held, the loop's thread
        blocked on it for good (`loop_calls.py`)."""
        running = LoopCall(coro)
        self._waits.add(running)
        try:
            self.loop.call_soon_threadsafe(running.start)
        except RuntimeError:
            self._waits.discard(running)
            running.end()
            raise
        return running

    def _wait(self, running: LoopCall[T], timeout: float | None) -> T:
        try:
            return running.wait(timeout)
        finally:
            self._waits.discard(running)

    def _cancel(self, running: LoopCall[Any]) -> None:
        """Cancel a call, on the loop's thread (where no signal handler runs)."""
        try:
            if self.on_loop():
                running.cancel()
            else:
                self.loop.call_soon_threadsafe(running.cancel)
        except RuntimeError:  # (the loop closed: nothing runs there any more)
            running.end()

    def cut(self) -> None:
        """Refuse new calls and cancel those in flight (their callers get `Closed`): the
        journal is closing, and nobody is to wait for a request (up to 5 s in an outage:
        the waiter thread's head read, which the close waits for, say)."""
        with self._calls_lock:
            self._stopped = True
            calls = list(self._calls)
        for running in calls:
            self._cancel(running)

    def close(self) -> None:
        """Idempotent: a close cut short (a Ctrl+C) is finished by the next one (the loop
        stopped but not closed yet: its thread, which closes it, is joined)."""
        if self.loop.is_closed():
            return
        if not self.loop.is_running():
            self._stop_loop()
            return
        # A call in flight (a read of another thread, say) would otherwise wait for good
        # on a loop that no longer runs: it is cancelled, and raises `Closed`. (Its thread
        # may be a worker of an `awatch`: left waiting, the watch never ended and
        # `asyncio.run` never returned.) The tasks left (heartbeats, the expiry timer) are
        # cancelled once the client closed (`_stop_loop`).
        self.cut()  # (again in `_stop_loop`: idempotent)
        with contextlib.suppress(Exception):
            self._wait(self._start(self._close_client()), 5)
        self._stop_loop()

    async def _close_client(self) -> None:
        # (Two loop steps first: the calls `cut` cancels on the loop end as cancelled,
        # before the client's close would end them with its error, which nobody reads.)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await self.nc.close()

    def _stop_loop(self) -> None:
        self.cut()  # (no call is scheduled from now on; none waits on the stopped loop)
        if self.loop.is_running() and not self.on_loop():
            # Every task still on the loop: calls waiting for an answer (their callers get
            # `Closed`) and tasks a call started as close() began (an owner's heartbeat),
            # which the stopped loop would destroy pending.
            with contextlib.suppress(Exception):
                self._wait(self._start(_cancel_tasks(self.loop)), 5)
        with contextlib.suppress(RuntimeError):  # (closed: by a close cut short after)
            self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.on_loop():
            self._thread.join(5)  # (the loop's thread closes it as it ends: `_run`)

    # -- requests (on the loop) ------------------------------------------------------------

    async def api(
        self, subject: str, body: dict[str, Any] | None = None, timeout: float = REQUEST_S
    ) -> dict[str, Any]:
        """A JetStream API request; its JSON reply (ApiError when it is an error)."""
        payload = b"" if body is None else json.dumps(body).encode()
        reply, sent = await self._answer(
            lambda: self.nc.request(subject, payload, timeout=timeout), False
        )
        result: dict[str, Any] = json.loads(reply.data) if reply.data else {}
        error = result.get("error")
        self._heard(error, False, sent)
        if error:
            refusal = ApiError(
                int(error.get("code", 0)),
                int(error.get("err_code", 0)),
                str(error.get("description", "")),
            )
            ours = subject.rpartition(".")[2] == self.stream
            if (
                refusal.err_code == _STREAM_NOT_FOUND
                and ours
                and (not self.opened or await self._still_not_found())
            ):
                raise self.stream_gone() from None
            raise refusal
        return result

    async def _answer(
        self, request: Callable[[], Awaitable[Msg]], write: bool, sent_already: bool = False
    ) -> tuple[Msg, float]:
        """The reply `request()` awaits (a 503 status, nobody serving it, raised as no
        answer), noted as unanswered (`cut_off`) when it does not come, and when it was
        asked. (The request goes out after a move that requests with no answer at all
        called for, `CutOff.before`, and is made only then: one made first and cancelled
        during the wait was never awaited, which Python warns of; not `sent_already`,
        whose messages went out after that look, and a move now would only lose their
        answer.)"""
        if not sent_already:
            await self.cut_off.before(self.nc)
        sent = time.monotonic()
        try:
            reply = await request()
            if reply.headers and reply.headers.get("Status") == "503":
                raise NoRespondersError
        except Unavailable:
            self.cut_off.unanswered(self.nc, write, sent, silent=True)
            raise
        return reply, sent

    def no_answer(self, asked: float) -> None:
        """A read asked at `asked` (`time.monotonic()`) whose answer the engine takes for
        none (`cut_off`); on the loop."""
        self.cut_off.unanswered(self.nc, False, asked)

    def _heard(self, error: dict[str, Any] | None, write: bool, sent: float) -> None:
        """Note an answer (`cut_off`): a refusal for want of a leader counts as none, so
        does a write's refusal of its compare-and-set, and its other refusals as
        neither."""
        code = int(error.get("err_code", 0)) if error else 0
        if code == _NO_LEADER or (write and code in ANOTHER_CAME_FIRST):
            self.cut_off.unanswered(self.nc, write, sent, silent=code == _NO_LEADER)
        elif not (error and write):  # (a write's other refusals tell nothing)
            self.cut_off.answered(write)

    async def _still_not_found(self) -> bool:
        """Whether the stream's information, asked twice more half a second apart, is
        "not found" each time: a replica restarted in a cluster answers it so while it
        loads the stream, and a stream that is there must not be taken for a deleted one
        (a review: it is asked again as any refusal then). A journal being opened
        takes one answer (`opened`): `bootstrap` creates the stream or says it is missing."""
        for _ in range(2):
            await asyncio.sleep(0.5)
            try:
                reply = await self.nc.request(
                    f"$JS.API.STREAM.INFO.{self.stream}", b"", timeout=REQUEST_S
                )
                error = (json.loads(reply.data) if reply.data else {}).get("error") or {}
            except (*Unavailable, ValueError):
                return False
            if int(error.get("err_code", 0)) != _STREAM_NOT_FOUND:
                return False
        return True

    def stream_gone(self) -> StoreNotFound:
        """The error of a request on the store's own stream that JetStream answers "stream
        not found" (10059): the stream was deleted while the journal was open, which no
        retry mends, so it is said at once and not as the servers' silence (until
        2026-12-05 it was `StoreUnavailable`, after 30 s of asking again for a read or a
        write with a lost reply). Nothing recreates the stream: a new one would be another
        store (a new identity and cursor key: every cursor of this one foreign to it).
        Opening a store whose stream is missing says it in its own words
        (`opening.bootstrap`). A direct get nobody answers asks the stream's information
        (`direct`); a write's batch, which nobody acknowledges either, meets it at the
        read that settles the batch."""
        return StoreNotFound(
            f"the journal store's stream {self.stream} no longer exists: it was deleted "
            "while this journal was open (`nats stream rm`?), and the store's sessions "
            "with it; the journal does not recreate it. Close this journal, then restore "
            "the stream from a backup of it (`nats stream restore`: the same store, its "
            "cursors valid), or create a new, empty store (`journal init`, or "
            "Journal.open(..., create=True): the old store's cursors are foreign to it) "
            "and import an archive of its sessions (`journal import`)"
        )

    async def direct(self, body: dict[str, Any]) -> tuple[list[Found], dict[str, str]]:
        """A batched direct get (`batch` or `multi_last` in `body`): the messages and the
        headers of the end-of-batch marker (only its `Status` when it is not 204: 404
        when nothing matched).

        Any replica of the stream may answer, and the servers pick one for each request
        at random, a replica that hangs too (a stopped process, a partition that leaves
        its routes open: the others take it for gone only after minutes of unanswered
        route pings). A request whose answer has not begun within `DIRECT_FIRST_S` is
        therefore sent again, the wait doubling each time, and the first to begin
        answering is taken, within `REQUEST_S` in all. Until 2026-12-06 one request
        waited its 5 s: with one node of three hung, about half the direct gets went
        unanswered, a page of several gets seldom completed, and watchers on the two
        live nodes fell behind for as long as the node hung (an operator trial pausing a
        node with SIGSTOP: 4,320 events behind after 25 s)."""
        payload = json.dumps(body).encode()
        deadline = self.loop.time() + REQUEST_S
        tries: list[_DirectTry] = []
        try:
            wait = DIRECT_FIRST_S
            while True:
                tries.append(await _DirectTry.send(self.nc, self.stream, payload))
                left = deadline - self.loop.time()
                begun, _ = await asyncio.wait(
                    [t.begun for t in tries],
                    timeout=max(min(wait, left), 0),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if begun or left <= wait:
                    break
                wait *= 2
            answering = next((t for t in tries if t.begun.done()), None)
            if answering is None:
                raise TimeoutError
            left = max(deadline - self.loop.time(), DIRECT_FIRST_S)
            end = await asyncio.wait_for(answering.done, left)
            found = answering.found
        finally:
            for attempt in tries:
                with contextlib.suppress(Exception):
                    await attempt.sub.unsubscribe()
        if end.get("Status") == "503":
            # No server serves the stream's direct gets: the stream is gone (`api` raises
            # `stream_gone`), or none of its servers answers now (the servers' silence,
            # whatever the stream's information says). (Until 2026-12-05 the answer was
            # passed over and the get waited 5 s for nothing.)
            with contextlib.suppress(ApiError, *Unavailable):
                await self.api(f"$JS.API.STREAM.INFO.{self.stream}")
            raise NoRespondersError
        return found, end

    async def msg_get(self, body: dict[str, Any]) -> Found | None:
        """One message read through the stream leader (`seq`, `last_by_subj`, or `seq` with
        `next_by_subj`), or None: unlike a direct get, never answered by a lagging replica."""
        try:
            reply = await self.api(f"$JS.API.STREAM.MSG.GET.{self.stream}", body)
        except ApiError as e:
            if e.err_code == 10037:  # no message found
                return None
            raise
        message = reply["message"]
        headers = _parse_headers(base64.b64decode(message["hdrs"])) if message.get("hdrs") else {}
        data = base64.b64decode(message["data"]) if message.get("data") else b""
        if message.get("time"):  # (when it was stored, as a direct get's header says)
            headers.setdefault("Nats-Time-Stamp", str(message["time"]))
        return Found(message["subject"], int(message["seq"]), data, headers)

    async def publish_batch(self, messages: list[BatchMessage]) -> int:
        """Publish `messages` as one atomic batch; the stream sequence of the last one
        (ApiError when the server refused the batch, nothing of it stored)."""
        await self.cut_off.before(self.nc)  # (the messages go out before the ack is awaited)
        batch_id = uuid.uuid4().hex
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox, max_msgs=1)
        try:
            last = len(messages) - 1
            for index, (subject, payload, headers) in enumerate(messages):
                batch_headers = {
                    "Nats-Batch-Id": batch_id,
                    "Nats-Batch-Sequence": str(index + 1),
                    **headers,
                }
                if index == last:
                    batch_headers["Nats-Batch-Commit"] = "1"
                await self.nc.publish(
                    subject, payload, reply=inbox if index == last else "", headers=batch_headers
                )
            reply, sent = await self._answer(lambda: sub.next_msg(timeout=ACK_S), True, True)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        ack: dict[str, Any] = json.loads(reply.data)
        error = ack.get("error")
        self._heard(error, True, sent)
        if error:
            raise ApiError(
                int(error.get("code", 0)),
                int(error.get("err_code", 0)),
                str(error.get("description", "")),
            )
        return int(ack["seq"])

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> int:
        """Publish one message to the stream and wait for its ack; its sequence."""
        reply, sent = await self._answer(
            lambda: self.nc.request(subject, payload, timeout=REQUEST_S, headers=headers), True
        )
        ack: dict[str, Any] = json.loads(reply.data)
        error = ack.get("error")
        self._heard(error, True, sent)
        if error:
            raise ApiError(
                int(error.get("code", 0)),
                int(error.get("err_code", 0)),
                str(error.get("description", "")),
            )
        return int(ack["seq"])


def _parse_headers(block: bytes) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in block.decode(errors="replace").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip()] = value.strip()
    return headers


def _found(msg: Msg, headers: dict[str, str]) -> Found:
    return Found(
        headers.get("Nats-Subject", msg.subject),
        int(headers.get("Nats-Sequence", "0")),
        msg.data,
        headers,
    )
