"""The agent runtime that `journal demo` starts as a child process.

    python -m cli.demo_runtime STORE --events N --delay SECONDS NAME [NAME ...]

    python -m cli.demo_runtime STORE --hang NAME

    python -m cli.demo_runtime STORE --supervise TASKS STATE

It creates the named sessions, owns each and runs one turn in it: JSON-RPC-like messages,
round-robin with a short pause after each append (so the demo visibly happens live). It
suspends and resumes one session, completes the turn and resolves the others, and
cancels the last one's turn and the session midway. With `--hang` it creates NAME, starts
a turn, appends one message, reports `mid-turn` and waits to be killed (an owner dying
mid-turn). With `--supervise` it is a supervisor that survives restarts: one `fold()`
of its STATE session restores the tasks it handled and the cursor of the last one, and
its subscription to TASKS resumes after that cursor; each task handled is one atomic
`update()` (the task and its cursor together). It ends when TASKS ends. It reports each
step as one JSON line on stdout; the parent renders them. The parent keeps its stdin, a
pipe, open: once it reads end of file (the demo is gone, even killed with SIGKILL), it
ends at once instead of waiting for tasks or a kill that never come.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import journal

_PROMPTS = {
    "review": "Review the diff of PR #42 and list the risky changes",
    "chat": "Summarize yesterday's incident for the on-call channel",
    "plan": "Plan the migration of the billing service to v2",
}
_UPDATES: tuple[dict[str, Any], ...] = (
    {"update": "plan", "entries": ["read the code", "check the tests", "write the summary"]},
    {"update": "tool_call", "id": "call-1", "title": "read_file src/app.py", "status": "pending"},
    {"update": "tool_call_update", "id": "call-1", "status": "completed"},
    {"update": "agent_message_chunk", "text": "Two risky changes: the retry loop and the cache."},
)


def report(action: str, **fields: Any) -> None:
    print(json.dumps({"action": action, **fields}), flush=True)


def mode_of(session_id: str) -> str:
    mode = session_id.split("-", 1)[0]
    return mode if mode in _PROMPTS else "review"


def conversation(session_id: str, count: int) -> list[tuple[str, dict[str, Any]]]:
    """`count` messages of one turn: a prompt, updates, and (last) the turn's result."""
    prompt: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "session/prompt",
        "params": {"prompt": _PROMPTS[mode_of(session_id)]},
    }
    messages: list[tuple[str, dict[str, Any]]] = [("session/prompt", prompt)]
    updates = itertools.cycle(_UPDATES)
    for _ in range(count - 2):
        update = next(updates)
        message = {"jsonrpc": "2.0", "method": "session/update", "params": update}
        messages.append((f"session/update {update['update']}", message))
    result = {"jsonrpc": "2.0", "id": 1, "result": {"stopReason": "end_turn"}}
    messages.append(("result end_turn", result))
    return messages[:count]


class Runtime:
    """Plays the sessions' script against the journal."""

    def __init__(
        self, store: journal.Journal, names: Sequence[str], events: int, delay: float
    ) -> None:
        self.store = store
        self.names = list(names)
        self.delay = delay
        self.scripts = {name: conversation(name, events) for name in self.names}
        self.sent = dict.fromkeys(self.names, 0)
        self.owners: dict[str, journal.Owner] = {}
        self.turns: dict[str, journal.Turn] = {}
        # the first session is the one the parent watches: it is never suspended, and
        # with several sessions the last one is cancelled before its turn completes
        self.to_suspend = self.names[1] if len(self.names) > 1 else None
        self.to_cancel = self.names[-1] if len(self.names) > 1 else None
        if self.to_cancel is not None:
            del self.scripts[self.to_cancel][max(1, events - 1) :]

    def run(self) -> None:
        for name in self.names:
            mode = mode_of(name)
            self.store.create_session(name, mode=mode, tags={"demo": "true", "agent": mode})
            report("created", session_id=name, mode=mode)
            owner = self.owners[name] = self.store.own(name)
            request_id = f"{name}/turn-1"
            self.turns[name] = owner.turn(request_id).__enter__()
            report("turn_started", session_id=name, request_id=request_id, pid=owner.info.pid)
            time.sleep(self.delay)
        active = list(self.names)
        suspended: str | None = None
        for tick in itertools.count():
            if tick == 1 and self.to_suspend is not None and self.to_suspend in active:
                suspended = self.to_suspend
                self.store.suspend_session(suspended)
                report("suspended", session_id=suspended)
            elif tick == 3 and suspended is not None:
                self.store.resume_session(suspended)
                report("resumed", session_id=suspended)
                suspended = None
            for name in list(active):
                if name != suspended:
                    self.step(name)
                if self.sent[name] == len(self.scripts[name]):
                    self.finish(name)
                    active.remove(name)
            if not active:
                break
        report("done", events=sum(self.sent.values()))

    def step(self, name: str) -> None:
        summary, message = self.scripts[name][self.sent[name]]
        body = json.dumps(message, separators=(",", ":")).encode()
        result = self.turns[name].append([journal.EventIn("message", body)])
        self.sent[name] += 1
        report("appended", session_id=name, ordinal=result.last_ordinal, summary=summary)
        time.sleep(self.delay)

    def finish(self, name: str) -> None:
        turn = self.turns.pop(name)
        if name == self.to_cancel:
            turn.cancel()
        turn.__exit__(None, None, None)
        status = "cancelled" if name == self.to_cancel else "completed"
        report("turn_result", session_id=name, request_id=turn.request_id, status=status)
        self.owners.pop(name).release()
        if name == self.to_cancel:
            self.store.cancel_session(name)
            report("cancelled", session_id=name)
        else:
            self.store.resolve_session(name)
            report("resolved", session_id=name)


def hang_mid_turn(store: journal.Journal, name: str) -> None:
    """Own `name`, start a turn, append one message, then wait to be killed."""
    store.create_session(name, mode="plan", tags={"demo": "true", "agent": "plan"})
    owner = store.own(name)
    turn = owner.turn(f"{name}/turn-1").__enter__()
    prompt = {"jsonrpc": "2.0", "id": 1, "method": "session/prompt"}
    prompt["params"] = {"prompt": _PROMPTS["plan"]}
    turn.append([journal.EventIn("message", json.dumps(prompt).encode())])
    report("mid-turn", session_id=name, request_id=turn.request_id, pid=owner.info.pid)
    time.sleep(3600)


def _handled(state: dict[str, Any], event: journal.Event) -> dict[str, Any]:
    """The supervisor's reducer: each `handled` event adds its task and cursor."""
    handled = json.loads(event.data)
    return {"tasks": [*state["tasks"], handled["task"]], "cursor": handled["cursor"]}


def supervise(store: journal.Journal, tasks: str, state_session: str) -> None:
    """Restore, resume, handle each task once (see the module docstring)."""
    start: dict[str, Any] = {"tasks": [], "cursor": None}
    fold = store.fold(state_session, _handled, start, snapshot_every=2)
    checkpoint = store.checkpoint(state_session)
    report(
        "restored",
        session_id=state_session,
        ordinal=fold.ordinal,
        checkpoint=checkpoint.ordinal if checkpoint is not None else 0,
        tasks=fold.state["tasks"],
    )
    failures: list[BaseException] = []

    def on_task(event: journal.Event) -> None:
        task = json.loads(event.data)["task"]
        record = json.dumps({"task": task, "cursor": event.cursor}).encode()
        fold.update(lambda state: [journal.EventIn("handled", record)])
        report("handled", session_id=tasks, task=task, ordinal=event.ordinal)

    subscription = store.subscribe(
        tasks, on_task, cursor=fold.state["cursor"], on_error=failures.append
    )
    subscription.wait()  # until TASKS ends (or this process is killed)
    if failures:
        raise failures[0]


def end_with_parent() -> None:
    """End this process as soon as its stdin, a pipe the demo holds open, reads end of
    file: the demo is gone (an orphaned supervisor waited for its tasks for good, and
    `--hang` for an hour). Not when stdin is no pipe (a run by hand)."""
    if not stat.S_ISFIFO(os.fstat(0).st_mode):
        return

    def wait() -> None:
        with contextlib.suppress(OSError):
            while os.read(0, 1 << 16):
                pass
        os._exit(0)  # (a runtime dying mid-turn is what the journal is built for)

    threading.Thread(target=wait, name="demo-parent", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.demo_runtime")
    # ("-": $JOURNAL_STORE, which the demo sets: a nats:// URL's password stays out of
    # the command line, which `ps` shows)
    parser.add_argument("store")
    parser.add_argument("names", nargs="*")
    parser.add_argument("--hang", metavar="NAME", default=None)
    parser.add_argument("--supervise", nargs=2, metavar=("TASKS", "STATE"), default=None)
    parser.add_argument("--events", type=int, default=5)
    parser.add_argument("--delay", type=float, default=0.25)
    args = parser.parse_intermixed_args(argv)
    end_with_parent()
    try:
        path = os.environ.get("JOURNAL_STORE", "") if args.store == "-" else args.store
        with journal.Journal.open(path, create=False) as store:
            if args.hang is not None:
                hang_mid_turn(store, args.hang)
            elif args.supervise is not None:
                supervise(store, *args.supervise)
            else:
                Runtime(store, args.names, max(2, args.events), args.delay).run()
    except KeyboardInterrupt:
        return 130  # the parent was interrupted too and reports it
    except journal.JournalError as error:
        print(f"demo runtime: {error.code}: {error.message}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0  # the parent is gone
    return 0


if __name__ == "__main__":
    sys.exit(main())
