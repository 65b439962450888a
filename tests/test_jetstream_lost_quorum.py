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
from pathlib import Path
from typing import Any

import pytest
from _nats import NatsCluster
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


def test_a_stopped_follow_ends_a_confirmation_waiting_on_a_leader_out_of_touch(
    tmp_path: Path,
) -> None:
    """Before a refusal a stale copy could cause, a follower's step has the engine confirm
    that the stream's leader is in touch with a quorum (`confirm_current`, SPEC 16.4),
    asked again for up to 30 s while it is not. A `watch`'s `stop` ends the step's other
    reads asked again in an outage (its read scope, `ReadScope.stop_with`), but the
    confirmation went on: a step stopped 1 s into it raised `StoreUnavailable` 29 s later
    (a review, 2026-12-06). The confirmation now looks at the step's read scope before
    each ask, and ends as a stopped read does (`CancelledError`, which ends the follow).
    The leader's two followers are stopped (SIGSTOP): it hears from neither."""
    cluster = NatsCluster(tmp_path)  # (its own: two of its nodes are stopped for a while)
    cluster.start()
    name = "t" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    said: list[str] = []
    try:
        with Journal.open(cluster.url, store=name, replicas=3) as j:
            j.create_session("s")
        leader = cluster.server_named(str(_stream(cluster, name)["leader"]))
        engine = JetStreamEngine.open(JetStreamOptions(servers=[leader.url], store=name))
        stop = threading.Event()
        scope = ReadScope()
        scope.stop_with(stop)  # (as `follow` does for a `watch(..., stop=stop)` step)

        def step() -> None:
            READ_SCOPE.set(scope)  # (this thread's own context)
            started = time.monotonic()
            try:
                engine.confirm_current()
                said.append("confirmed")
            except (concurrent.futures.CancelledError, StoreUnavailable) as e:
                said.append(type(e).__name__)
            print(f"\n{said[-1]} {time.monotonic() - started:.1f} s after it was asked")

        with Journal.over(engine):
            paused = [s for s in cluster.servers if s is not leader]
            for server in paused:
                os.kill(server.pid, signal.SIGSTOP)
            try:
                # (Heard from neither since: past reads.CURRENT_MS, 3 s, from now on.)
                time.sleep(4)
                stepping = threading.Thread(target=step)
                stepping.start()
                time.sleep(1)  # (the confirmation asks again meanwhile)
                stop.set()
                stepping.join(60)
            finally:
                for server in paused:
                    os.kill(server.pid, signal.SIGCONT)
        assert said == ["CancelledError"], said
    finally:
        cluster.stop()
