"""A stream leader that has heard from no quorum: owner judgment by it (SPEC 16.5, "owner
liveness") and a confirmation waiting on it (SPEC 16.4), on a cluster of the test's own
(`-m cluster`): nodes are killed or stopped."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _nats import NatsCluster, NatsServer
from _remote_turns import OWNER_MID_TURN, WATCHER_OF_THE_TURN

from journal import Journal, StoreUnavailable
from journal._jetstream.engine import JetStreamEngine, JetStreamOptions
from journal.engine import READ_SCOPE, ReadScope

pytestmark = pytest.mark.cluster


def _line(process: subprocess.Popen[str], timeout: float) -> str:
    """The child's next line of output ("" after `timeout` seconds or at its end)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    return process.stdout.readline().strip() if ready else ""


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    root = Path(__file__).resolve().parent.parent
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )


def _stream(cluster: NatsCluster, name: str) -> dict[str, Any]:
    """The `cluster` part of the stream's information."""
    import nats

    async def ask() -> dict[str, Any]:
        nc = await nats.connect(servers=[s.url for s in cluster.servers if s.process])
        try:
            reply = await nc.request(f"$JS.API.STREAM.INFO.JOURNAL_{name}", b"", timeout=5)
            return dict(json.loads(reply.data).get("cluster") or {})
        finally:
            await nc.close()

    return asyncio.run(ask())


def _new_leader(cluster: NatsCluster, name: str, old: str) -> dict[str, Any]:
    """The stream's information once another leader than `old` is elected."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.5)
        with contextlib.suppress(Exception):  # (no answer yet)
            info = _stream(cluster, name)
            if info.get("leader") not in (old, None, ""):
                return info
    raise AssertionError(f"no leader elected after {old} was killed")


def test_a_leader_that_never_heard_from_a_dead_replica_does_not_count_it_in_touch(
    tmp_path: Path,
) -> None:
    """A leader elected after a replica died lists that replica with `active` 0 (it has
    never heard from it) for as long as it stays away. With the stream's other follower
    then gone too, the leader, which had heard from no quorum, kept its term for 10 to
    20 s and took the 0 for a replica heard from just now: it judged the owner, alive on
    another host but unable to store a beat anywhere, dead 10 s after its last beat, a
    watcher on it was told `OutcomeUnknown` and the session's metadata showed no owner
    (a review, 2026-12-06). A replica never heard from is not in touch. Five nodes, the
    stream on three: the cluster's metadata keeps a majority and answers throughout."""
    cluster = NatsCluster(tmp_path, size=5)  # (its own: two of its nodes are killed)
    cluster.start()
    name = "t" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    children: list[subprocess.Popen[str]] = []
    try:
        with Journal.open(cluster.url, store=name, replicas=3) as j:
            j.create_session("s")
        info = _stream(cluster, name)
        first = str(info["leader"])
        peers = {first} | {str(r["name"]) for r in info["replicas"]}
        cluster.server_named(first).kill()
        info = _new_leader(cluster, name, first)
        print(f"\n{first} killed; {info['leader']} leads: {info['replicas']}")
        leader = cluster.server_named(str(info["leader"]))
        follower = cluster.server_named(next(iter(peers - {first, leader.name})))
        owner = _child(OWNER_MID_TURN, cluster.url, name)
        children.append(owner)
        assert _line(owner, 60) == "mid-turn"
        watcher = _child(WATCHER_OF_THE_TURN, leader.url, name, "30")
        children.append(watcher)
        assert _line(watcher, 60) == "watching"
        shown: list[tuple[float, bool]] = []
        with Journal.open(leader.url, store=name) as j:
            follower.kill()  # (the leader keeps its term for 10 to 20 s, heard from no one)
            killed = time.monotonic()
            while time.monotonic() - killed < 24:  # (past the leader's step-down)
                with contextlib.suppress(StoreUnavailable):
                    owned = j.get_session("s").owner is not None
                    shown.append((round(time.monotonic() - killed, 1), owned))
                time.sleep(0.2)
        said = _line(watcher, 60)
        print(f"{said}; no owner shown at {[at for at, owned in shown if not owned]}")
        assert said == "no outcome told", said
        assert len(shown) > 50 and all(owned for _, owned in shown), shown
        assert owner.poll() is None
    finally:
        for child in children:
            child.kill()
            child.wait(10)
        cluster.stop()


@contextlib.contextmanager
def _store_on_a_cluster(tmp_path: Path) -> Iterator[tuple[str, NatsServer, list[NatsServer]]]:
    """A cluster of the test's own (two of its nodes are stopped for a while) with an R3
    store holding the session `s`: the store's name, its stream's leader, the others."""
    cluster = NatsCluster(tmp_path)
    cluster.start()
    try:
        name = "t" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
        with Journal.open(cluster.url, store=name, replicas=3) as j:
            j.create_session("s")
        leader = cluster.server_named(str(_stream(cluster, name)["leader"]))
        yield name, leader, [s for s in cluster.servers if s is not leader]
    finally:
        cluster.stop()


@contextlib.contextmanager
def _out_of_touch(followers: list[NatsServer]) -> Iterator[None]:
    """The stream's followers stopped (SIGSTOP): its leader, heard from neither since,
    is past reads.CURRENT_MS (3 s) out of touch from when this is entered."""
    for server in followers:
        os.kill(server.pid, signal.SIGSTOP)
    try:
        time.sleep(4)
        yield
    finally:
        for server in followers:
            os.kill(server.pid, signal.SIGCONT)


def _stopped_1_s_in(run: Callable[[threading.Event], str]) -> str:
    """What `run(stop)` says, run in a thread whose `stop` is set 1 s in."""
    stop = threading.Event()
    said: list[str] = []
    started = time.monotonic()

    def running() -> None:
        said.append(run(stop))
        print(f"\n{said[-1]} {time.monotonic() - started:.1f} s after it began")

    thread = threading.Thread(target=running)
    thread.start()
    time.sleep(1)
    stop.set()
    thread.join(60)
    return said[0] if said else "still running"


def test_a_stopped_watch_ends_while_its_leader_is_out_of_touch(tmp_path: Path) -> None:
    """A lifecycle watch's snapshot lists the sessions, and a listing through a leader
    that has heard from no quorum waits for one in touch, asking again for up to 30 s
    (SPEC 16.4): a `watch_sessions` stopped 1 s into that wait went on, and raised
    `StoreUnavailable` 30 s after it began (a review, 2026-12-06), where its other reads
    asked again in an outage end once stopped. The wait now looks at the follower's
    read scope before each ask: the watch ends, with no error."""
    with (
        _store_on_a_cluster(tmp_path) as (name, leader, followers),
        Journal.open(leader.url, store=name) as j,
    ):
        # (The first snapshot records the feed's floor, a write; the next only reads.)
        with j.watch_sessions() as first:
            next(first)

        def watch(stop: threading.Event) -> str:
            try:
                return str([e.session.session_id for e in j.watch_sessions(stop=stop)])
            except StoreUnavailable as e:
                return type(e).__name__

        with _out_of_touch(followers):
            said = _stopped_1_s_in(watch)
    assert said == "[]", said


def test_a_stopped_follow_ends_a_confirmation_waiting_on_a_leader_out_of_touch(
    tmp_path: Path,
) -> None:
    """Before a refusal a stale copy could cause, a follower's step has the engine confirm
    that the stream's leader is in touch with a quorum (`confirm_current`, SPEC 16.4),
    asked again for up to 30 s while it is not; a step stopped 1 s into it raised
    `StoreUnavailable` 30 s after it began (a review, 2026-12-06). It now ends as a
    stopped read does (`CancelledError`, which ends the follow). At the engine: the
    public calls that reach it in a step with a `stop` need a leader cut off by a
    partition, and the follower's connection moved onto it mid-watch."""
    with _store_on_a_cluster(tmp_path) as (name, leader, followers):
        engine = JetStreamEngine.open(JetStreamOptions(servers=[leader.url], store=name))

        def step(stop: threading.Event) -> str:
            scope = ReadScope()
            scope.stop_with(stop)  # (as `follow` does for a `watch(..., stop=stop)` step)
            READ_SCOPE.set(scope)  # (this thread's own context)
            try:
                engine.confirm_current()
                return "confirmed"
            except (concurrent.futures.CancelledError, StoreUnavailable) as e:
                return type(e).__name__

        with Journal.over(engine), _out_of_touch(followers):
            said = _stopped_1_s_in(step)
    assert said == "CancelledError", said
