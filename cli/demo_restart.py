"""`journal demo`'s restart: a supervisor runtime (a child process) handles tasks, is
killed, and its restarted process restores its state with one `fold()` and resumes its
subscription from the cursor saved in that state, so every task is handled exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import journal

from .output import CommandFailed

Say = Callable[[str, dict[str, Any], str], None]
SOURCE = "restart"
CHILD_TIMEOUT = 30.0  # seconds a supervisor may live before it is killed


def fresh_name(store: journal.Journal, base: str) -> str:
    """`base`, or `base-` and four random hex digits when a kept store already has a
    session by that name."""
    name = base
    while True:
        try:
            store.get_session(name)
        except journal.SessionNotFound:
            return name
        name = f"{base}-{os.urandom(2).hex()}"


class _Supervisor:
    """One supervisor process and its step reports."""

    def __init__(self, env: dict[str, str], tasks: str, state: str) -> None:
        # ("-": the store is in `env`'s JOURNAL_STORE, a URL's password out of `ps`)
        command = [sys.executable, "-m", "cli.demo_runtime", "-", "--supervise", tasks, state]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,  # (held open: it ends when this process does)
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.pid = self.process.pid
        self._watchdog = threading.Timer(CHILD_TIMEOUT, self.process.kill)
        self._watchdog.daemon = True
        self._watchdog.start()

    def next_step(self, action: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        step: dict[str, Any] = json.loads(line) if line else {}
        if step.get("action") != action:
            self.kill()
            detail = self.process.stderr.read().strip() if self.process.stderr else ""
            raise CommandFailed(
                f"the supervisor runtime {self.pid} reported {step or 'nothing'} instead "
                f"of {action!r}{': ' + detail if detail else ''}"
            )
        return step

    def kill(self) -> None:
        """Kill it (SIGKILL) unless it ended; idempotent."""
        self._watchdog.cancel()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(5)
        self._close()

    def wait(self) -> int:
        try:
            code = self.process.wait(CHILD_TIMEOUT)
        finally:
            self._watchdog.cancel()
            self._close()
        return code

    def _close(self) -> None:
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def _handled(state: dict[str, Any], event: journal.Event) -> dict[str, Any]:
    handled = json.loads(event.data)
    return {"tasks": [*state["tasks"], handled["task"]], "cursor": handled["cursor"]}


class Restart:
    """The restart (see the module docstring). `begin` starts the first supervisor, which
    then waits for tasks (its start-up overlaps the rest of the demo); `run` queues the
    tasks, kills it, restarts it and checks the outcome; `close` kills what is left."""

    def __init__(self, store: journal.Journal, env: dict[str, str], say: Say) -> None:
        self.store = store
        self.env = env
        self.say = say
        self.tasks = fresh_name(store, "tasks")
        self.state = fresh_name(store, "supervisor")
        self._supervisors: list[_Supervisor] = []

    def begin(self) -> None:
        self.store.create_session(self.tasks, mode="tasks", tags={"demo": "true"})
        self.store.create_session(self.state, mode="state", tags={"demo": "true"})
        self._supervisors.append(_Supervisor(self.env, self.tasks, self.state))

    def close(self) -> None:
        for supervisor in self._supervisors:
            supervisor.kill()

    def _queue(self, numbers: range) -> None:
        data = [journal.EventIn("task", json.dumps({"task": n}).encode()) for n in numbers]
        self.store.append(self.tasks, data)

    def run(self) -> int:
        """How many tasks were handled (each exactly once, or `CommandFailed`)."""
        say, state = self.say, self.state
        first = self._supervisors[0]
        restored = first.next_step("restored")
        self._queue(range(1, 4))
        say(
            SOURCE,
            {"runtime_pid": first.pid, "restored_ordinal": restored["ordinal"]},
            f"supervisor runtime {first.pid}: one fold() of {state} restored "
            f"{len(restored['tasks'])} handled tasks; queued 3 tasks in {self.tasks}",
        )
        handled_first = [_report(first, say) for _ in range(3)]
        first.kill()
        say(SOURCE, {"killed": first.pid}, f"killed supervisor runtime {first.pid} (SIGKILL)")
        self._queue(range(4, 7))
        say(SOURCE, {"queued": [4, 5, 6]}, "queued tasks 4, 5, 6 while no supervisor runs")
        second = _Supervisor(self.env, self.tasks, state)
        self._supervisors.append(second)
        restored = second.next_step("restored")
        if restored["tasks"] != handled_first:
            raise CommandFailed(
                f"the restarted supervisor restored tasks {restored['tasks']}, not {handled_first}"
            )
        after = restored["ordinal"] - restored["checkpoint"]
        via = (
            f"checkpoint #{restored['checkpoint']} and {after} event{'s' * (after != 1)} after it"
            if restored["checkpoint"]
            else "its events"
        )
        say(
            SOURCE,
            {
                "runtime_pid": second.pid,
                "restored_ordinal": restored["ordinal"],
                "restored_tasks": restored["tasks"],
                "checkpoint": restored["checkpoint"],
            },
            f"supervisor runtime {second.pid} restarted: one fold() of {state} restored "
            f"tasks {_listed(restored['tasks'])} at #{restored['ordinal']} (from {via}); "
            f"its subscription resumes after the last task handled",
        )
        handled_second = [_report(second, say) for _ in range(3)]
        self.store.resolve_session(self.tasks)  # the subscription ends, and the supervisor
        if second.wait() != 0:
            raise CommandFailed(f"the supervisor runtime {second.pid} failed")
        start: dict[str, Any] = {"tasks": [], "cursor": None}
        final = self.store.fold(state, _handled, start).state["tasks"]
        if handled_first + handled_second != [1, 2, 3, 4, 5, 6] or final != [1, 2, 3, 4, 5, 6]:
            raise CommandFailed(
                f"the supervisor handled tasks {handled_first} then {handled_second} "
                f"(its state holds {final}), not 1..6 once each"
            )
        say(
            SOURCE,
            {"handled": final, "exactly_once": True},
            f"{state} holds tasks 1..6, each handled once across the restart: nothing "
            "missed, nothing twice (restart OK)",
        )
        return len(final)


def _report(supervisor: _Supervisor, say: Say) -> int:
    step = supervisor.next_step("handled")
    say(
        SOURCE,
        {"runtime_pid": supervisor.pid, "task": step["task"], "ordinal": step["ordinal"]},
        f"runtime {supervisor.pid} handled task {step['task']} (event #{step['ordinal']})",
    )
    return int(step["task"])


def _listed(numbers: list[int]) -> str:
    return ", ".join(str(n) for n in numbers) or "none"
