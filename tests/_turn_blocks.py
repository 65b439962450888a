"""A turn's block run in a thread of its own, for the tests of what other threads do
while it runs (a release, a close); and another process's journal, for the tests of what
a close does at interpreter exit or in a signal handler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from engines import EngineFactory, JetStreamEngineFactory

from journal import EventIn, Owner

TURN_WAIT_S = 30.0  # a bound for liveness only
ROOT = Path(__file__).resolve().parent.parent


class TurnBlock:
    """A turn's block in a thread of its own: it appends, says it has begun (`entered`),
    waits for `go`, then appends again; what it raised is kept in `raised`."""

    def __init__(self, owner: Owner, request_id: str = "r1") -> None:
        self.entered, self.go = threading.Event(), threading.Event()
        self.raised: list[BaseException] = []
        self._owner, self._request_id = owner, request_id
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert self.entered.wait(TURN_WAIT_S)

    def _run(self) -> None:
        try:
            with self._owner.turn(self._request_id) as turn:
                turn.append([EventIn("message", b'{"n": 1}')])
                self.entered.set()
                self.go.wait()
                turn.append([EventIn("message", b'{"n": 2}')])
        except BaseException as error:  # (kept for the assertions)
            self.raised.append(error)

    def finish(self) -> None:
        self.go.set()
        self.thread.join(TURN_WAIT_S)
        assert not self.thread.is_alive()


def journal_arguments(engine: EngineFactory, store: Path) -> list[str]:
    """What another process passes to `Journal.open` for the store `store` of `engine`:
    its location, and its keywords as JSON."""
    if isinstance(engine, JetStreamEngineFactory):
        keywords = {"store": engine.store_name(store), "replicas": engine.replicas}
        return [engine.url(), json.dumps(keywords)]
    return [str(store), "{}"]


def run_child(script: str, arguments: list[str]) -> tuple[bool, str]:
    """Run `script` (`python -c`) with `arguments`: whether it exited 0 within
    `TURN_WAIT_S` (a bound for liveness only: a hung one is killed), and its output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    child = subprocess.Popen(
        [sys.executable, "-c", script, *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        output, _ = child.communicate(timeout=TURN_WAIT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        output, _ = child.communicate()
        return False, "hung; killed: " + output
    return child.returncode == 0, output
