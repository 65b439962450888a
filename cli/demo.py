"""`journal demo`: an agent runtime in a child process writes sessions while this process
follows them live, then resumes from a saved cursor and checks the resume is exact.

Threads here: one follows the lifecycle feed, one watches the first session, two relay the
child's stdout (its step reports) and stderr. Each ends through a stop event or when its
stream ends; the main thread supervises the child and raises what any thread hit.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import site
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

import click

import journal
from journal.arguments import check_store_path

from .interrupts import said_if_stopped
from .output import (
    CommandFailed,
    NumberOption,
    Output,
    Settings,
    WholeNumber,
    is_nats,
    pass_settings,
)
from .rendering import event_record, event_text, lifecycle_record, lifecycle_text, plural

# (subprocess and the restart's module are imported by the demo as it runs: every command
# of the `journal` process imports this module, for the demo's options and help.)
if TYPE_CHECKING:
    import subprocess

RUNTIME_TIMEOUT = 25.0  # seconds; the default run takes about 5
_MODES = ("review", "chat", "plan")
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_pythonpath(package_root: str, pythonpath: str | None, site_dirs: set[str]) -> str | None:
    """The runtime child's PYTHONPATH (None: leave it as it is): the directory this `cli`
    was imported from first, unless the child finds it by itself (a site directory: an
    installed wheel). A site directory in PYTHONPATH would come before the standard
    library, where a package named like a standard module (an `enum` or `typing`
    backport) would shadow it (until 2026-12-06 it was put there for an installed wheel
    too: a trial of the release)."""
    if package_root in site_dirs:
        return None
    return package_root + (os.pathsep + pythonpath if pythonpath else "")


def found_by_a_child(path: list[str], pythonpath: str | None) -> set[str]:
    """The directories a child of this interpreter finds by itself: the site directories
    and what this process's `sys.path` (`path`) got from them (.pth files, a
    `--system-site-packages` venv's system site-packages, which `getsitepackages()` does
    not list: until 2026-12-06 a wheel installed there was put in PYTHONPATH, a review),
    not its first entry (the script's directory or the working one) nor PYTHONPATH's."""
    given = {os.path.abspath(p) for p in (pythonpath or "").split(os.pathsep) if p}
    found = {*site.getsitepackages(), site.getusersitepackages(), *path[1:]}
    return {os.path.abspath(directory) for directory in found if directory} - given


_TERMINAL = frozenset(
    {
        journal.LifecycleEventType.RESOLVED,
        journal.LifecycleEventType.CANCELLED,
        journal.LifecycleEventType.EXPIRED,
        journal.LifecycleEventType.EVICTED,
    }
)


@click.command()
@click.option(
    "--store",
    "store_path",
    type=click.Path(file_okay=False),
    default=None,
    metavar="STORE",
    help="Run on this store (a directory, or nats://HOST:PORT/NAME; kept afterwards) instead "
    "of a temporary one (removed). The global --store is not used: the demo writes only "
    "where asked.",
)
@click.option(
    "--sessions",
    "session_count",
    cls=NumberOption,
    type=WholeNumber(1, 10),
    metavar="N",
    default=3,
    show_default=True,
    help="Sessions the runtime creates.",
)
@click.option(
    "--events",
    "event_count",
    cls=NumberOption,
    type=WholeNumber(2, 100),
    metavar="N",
    default=5,
    show_default=True,
    help="Messages per session.",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "jetstream"]),
    default="local",
    show_default=True,
    help="`jetstream`: start a 3-node NATS JetStream cluster from the installed nats-server "
    "(removed at the end), run the demo on a replicas=3 store there, and kill the stream's "
    "leader midway.",
)
@pass_settings
def demo(
    settings: Settings,
    store_path: str | None,
    session_count: int,
    event_count: int,
    engine: str,
) -> None:
    """Watch an agent runtime (a child process) write sessions, live.

    The runtime creates sessions, owns each and runs a turn of JSON-RPC-like messages in
    it, suspends and resumes one, completes and resolves some, cancels one. This process
    follows the lifecycle feed and the first session as it happens, saves the cursor of
    an event in the middle, and at the end resumes from it to show it gets exactly the
    events after that one. Then a second runtime is killed mid-turn: its watcher gets
    WATCH_OUTCOME_UNKNOWN and a new owner records the turn as failed. Last, a supervisor
    runtime is killed and restarted: one fold() restores its state and its subscription
    resumes from the cursor saved in it, so each task is handled exactly once.
    """
    if engine == "jetstream":
        if store_path is not None:
            raise click.UsageError(
                "--store and --engine jetstream: the jetstream demo makes its own cluster"
            )
        from .demo_cluster import Cluster

        with (
            _stopping(lambda: "its runtimes and its cluster's servers are stopped"),
            Cluster() as cluster,
        ):
            url = f"{cluster.url}/demo"
            with journal.Journal.open(url, create=True, replicas=3) as store:
                runner = Demo(store, url, settings.output, session_count, event_count, True)
                runner.cluster = cluster
                runner.run()
        return
    temporary = store_path is None
    path = ""  # (a temporary one: made below, where its removal is sure)
    if store_path is not None:
        path = store_path
        if not is_nats(path):  # (a URL is no path: it named a directory `nats:` here)
            path = os.path.abspath(check_store_path(path))  # (as given: see `init`)

    def kept() -> str:
        """What became of the store (said after the clean-up: the runtimes stopped, the
        store removed, or not when its removal failed)."""
        if not temporary:
            return f"the store {path} is kept"
        if path and os.path.exists(path):
            return f"its temporary store {path} was left behind"
        return "its temporary store was removed"

    with _stopping(lambda: f"its runtimes are stopped and {kept()}"):
        try:
            if temporary:
                # (Named before it is made: `tempfile.mkdtemp`, before the clean-up was in
                # place, made it and then returned its name, and a Ctrl+C in between left
                # it in the temporary directory.)
                path = os.path.join(tempfile.gettempdir(), f"journal-demo-{secrets.token_hex(6)}")
                try:
                    os.mkdir(path, 0o700)
                except FileExistsError:
                    path = ""  # (not this demo's)
                    raise
            with journal.Journal.open(path, create=True) as store:
                Demo(store, path, settings.output, session_count, event_count, temporary).run()
        finally:
            if temporary and path:
                shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _stopping(left: Callable[[], str]) -> Iterator[None]:
    """Ctrl+C, SIGTERM and SIGHUP end the block's demo with its clean-up (its runtimes
    stopped, its temporary store removed: their default action ended it at once, and its
    supervisor runtime ran on for good), then say on stderr what it `left` (asked after
    the clean-up) and exit 130, 143 or 129."""
    with said_if_stopped(lambda how: f"demo {how}: {left()}"):
        yield


class Demo:
    """One run of the demo against an open store."""

    def __init__(
        self,
        store: journal.Journal,
        path: str,
        output: Output,
        session_count: int,
        event_count: int,
        temporary: bool,
    ) -> None:
        self.store = store
        self.path = path
        self.output = output
        self.event_count = event_count
        self.temporary = temporary
        self.names = self._session_names(session_count)
        self.target = self.names[0]
        self.middle = (event_count + 1) // 2
        # about 2.5 s of appends whatever the sizes, but never slower than 5 per second
        self.delay = min(0.2, max(0.005, 2.5 / (session_count * (event_count + 1))))
        self.stop = threading.Event()
        self.target_created = threading.Event()
        self.all_ended = threading.Event()
        self.ended: dict[str, str] = {}
        self.lifecycle_seen = 0
        self.watched: list[journal.Event] = []
        self.saved: tuple[int, str] | None = None
        self.runtime_events = 0
        self.unknown_outcome: str | None = None
        self.restart_tasks = 0
        self.crash_name = self._crash_name()
        self.runtime_stderr: list[str] = []
        self.failures: list[BaseException] = []
        self.threads: list[threading.Thread] = []
        # The jetstream demo's cluster (`demo_cluster.Cluster`): a node is killed midway.
        self.cluster: Any = None
        self.killed: str | None = None
        self.resumed_after_loss = 0

    def _crash_name(self) -> str:
        name = f"crash-{len(self.names) + 1}"
        while True:
            try:
                self.store.get_session(name)
            except journal.SessionNotFound:
                return name
            name = f"crash-{len(self.names) + 1}-{os.urandom(2).hex()}"

    def _session_names(self, count: int) -> list[str]:
        names = [f"{_MODES[i % len(_MODES)]}-{i + 1}" for i in range(count)]
        # a kept store may hold an earlier run's sessions: make this run's ids new
        for name in names:
            try:
                self.store.get_session(name)
            except journal.SessionNotFound:
                continue
            suffix = os.urandom(2).hex()
            return [f"{name}-{suffix}" for name in names]
        return names

    # -- printing --------------------------------------------------------------------------

    def say(self, source: str, record: dict[str, Any], text: str, *, session: bool = False) -> None:
        """One line: `[source] text`, or `[source session] text` for one session's lines."""
        label = f"{source} {self.target}" if session else source
        if session:
            record = {"session_id": self.target, **record}
        self.output.emit({"source": source, **record}, f"[{label}] {text}")

    # -- threads ---------------------------------------------------------------------------

    def _start(self, name: str, target: Callable[..., None], *args: Any) -> threading.Thread:
        def guarded() -> None:
            try:
                target(*args)
            except BaseException as error:  # handed to the main thread, which raises it
                self.failures.append(error)
                self.stop.set()

        thread = threading.Thread(target=guarded, name=f"demo-{name}", daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def _follow_lifecycle(self) -> None:
        cursor: str | None = None
        while True:
            try:
                for event in self.store.watch_sessions(cursor=cursor, stop=self.stop):
                    cursor = event.cursor
                    self._lifecycle_event(event)
                return
            except journal.StoreUnavailable as error:
                cursor = self._carry_on("lifecycle", error, cursor)

    def _carry_on(
        self, source: str, error: journal.StoreUnavailable, cursor: str | None
    ) -> str | None:
        """A watcher lost its server: it resumes from its last cursor (nothing missed)."""
        if cursor is None or self.stop.is_set():
            raise error
        self.resumed_after_loss += 1
        self.say(
            source,
            {"resumed": True, "cursor": cursor},
            f"{error.message}: resuming from its last cursor",
        )
        return cursor

    def _lifecycle_event(self, event: journal.LifecycleEvent) -> None:
        session_id = event.session.session_id
        if session_id not in self.names:
            return  # a kept store's older sessions
        self.lifecycle_seen += 1
        self.say("lifecycle", lifecycle_record(event), lifecycle_text(event))
        if event.event_type is journal.LifecycleEventType.CREATED:
            if session_id == self.target:
                self.target_created.set()
        elif event.event_type in _TERMINAL:
            self.ended[session_id] = event.event_type.value
            if len(self.ended) == len(self.names):
                self.all_ended.set()

    def _watch_target(self) -> None:
        source = "watch"
        while not self.target_created.wait(0.05):
            if self.stop.is_set():
                return
        self.say(source, {"following": True}, "following live", session=True)
        cursor: str | None = None
        while True:
            try:
                for event in self.store.watch(self.target, cursor=cursor, stop=self.stop):
                    cursor = event.cursor
                    self._watched_event(event)
                break
            except journal.StoreUnavailable as error:
                cursor = self._carry_on(source, error, cursor)
        if not self.stop.is_set():
            state = self.store.get_session(self.target).state.value
            self.say(
                source,
                {"state": state, "ended": True},
                f"{self.target} is {state}: the watch ended by itself after the last event",
                session=True,
            )

    def _watched_event(self, event: journal.Event) -> None:
        source = "watch"
        self.watched.append(event)
        text = event_text(event, 90)
        self.say(source, {"ordinal": event.ordinal, **event_record(event)}, text, session=True)
        if event.ordinal == self.middle:
            self.saved = (event.ordinal, event.cursor)
            self.say(
                source,
                {"saved_ordinal": event.ordinal, "cursor": event.cursor},
                f"saved the cursor of #{event.ordinal} to resume from later",
                session=True,
            )
        if self.cluster is not None and self.killed is None and event.ordinal >= 2:
            self._kill_leader()

    def _kill_leader(self) -> None:
        """Midway, SIGKILL the server leading the store's stream (the jetstream demo)."""
        store = self.path.rsplit("/", 1)[-1]
        name = self.cluster.stream_leader(store)
        pid = self.cluster.kill(name)
        self.killed = name
        self.say(
            "cluster",
            {"killed": name, "pid": pid, "stream_leader": True},
            f"killed NATS server {name} (pid {pid}), the leader of the store's stream, while "
            "the runtime appends and the watchers follow",
        )

    def _relay_runtime(self, stream: IO[str]) -> None:
        for line in stream:
            try:
                step = json.loads(line)
            except ValueError:
                self.say("runtime", {"message": line.rstrip()}, line.rstrip())
                continue
            action, session_id = step.get("action"), step.get("session_id")
            if action == "created":
                text = f"created {session_id} (mode={step.get('mode')})"
            elif action == "appended":
                text = f"{session_id} <- #{step.get('ordinal')} {step.get('summary')}"
            elif action == "turn_started":
                text = (
                    f"{session_id}: owned by pid {step.get('pid')}, turn {step.get('request_id')}"
                )
            elif action == "turn_result":
                text = f"{session_id}: turn {step.get('request_id')} {step.get('status')}"
            elif action == "done":
                self.runtime_events = int(step.get("events", 0))
                text = f"finished: {self.runtime_events} events appended"
            else:
                text = f"{action} {session_id}"
            self.say("runtime", step, text)

    def _collect_stderr(self, stream: IO[str]) -> None:
        self.runtime_stderr.extend(line.rstrip() for line in stream)

    def _raise_failures(self) -> None:
        if self.output.broken:
            raise BrokenPipeError  # the reader of our output is gone: end quietly
        if self.failures:
            raise self.failures[0]

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> None:
        import subprocess

        from .demo_restart import Restart

        started = time.monotonic()
        kind = "temporary, removed at the end" if self.temporary else "kept"
        shown = self.store.path  # (a nats:// URL's password masked)
        self.say("demo", {"store": shown, "temporary": self.temporary}, f"store {shown} ({kind})")
        self._start("lifecycle", self._follow_lifecycle)
        self._start("watch", self._watch_target)
        command = [
            sys.executable,
            "-m",
            "cli.demo_runtime",
            "-",  # ($JOURNAL_STORE below: a URL's password stays out of `ps`)
            "--events",
            str(self.event_count),
            "--delay",
            f"{self.delay:.4f}",
            *self.names,
        ]
        env = {**os.environ, "JOURNAL_STORE": self.path}
        pythonpath = child_pythonpath(
            _PACKAGE_ROOT, env.get("PYTHONPATH"), found_by_a_child(sys.path, env.get("PYTHONPATH"))
        )
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,  # (held open: it ends when this process does)
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        restart = Restart(self.store, env, self.say)
        try:
            restart.begin()
            self.say(
                "demo",
                {"runtime_pid": process.pid, "sessions": self.names},
                f"runtime started as child process {process.pid}: sessions "
                f"{', '.join(self.names)}, {self.event_count} messages each",
            )
            assert process.stdout is not None and process.stderr is not None
            relay = self._start("runtime", self._relay_runtime, process.stdout)
            errors = self._start("runtime-stderr", self._collect_stderr, process.stderr)
            self._supervise(process, started)
            relay.join(5)
            errors.join(5)
            self._raise_failures()
            if process.returncode != 0:
                detail = self.runtime_stderr[-1] if self.runtime_stderr else "no message"
                raise CommandFailed(
                    f"the demo runtime (child process) exited with status "
                    f"{process.returncode}: {detail}"
                )
            self._wait_for_observers()
            self._resume()
            self._owner_dies_mid_turn(env)
            self.restart_tasks = restart.run()
            self._summary(time.monotonic() - started)
        finally:
            self.stop.set()
            restart.close()
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if process.stdin is not None:
                process.stdin.close()
            for thread in self.threads:
                thread.join(2)
            for pipe in (process.stdout, process.stderr):
                if pipe is not None:
                    pipe.close()

    def _supervise(self, process: subprocess.Popen[str], started: float) -> None:
        while process.poll() is None:
            self._raise_failures()
            if time.monotonic() - started > RUNTIME_TIMEOUT:
                raise CommandFailed(
                    f"the demo runtime did not finish within {RUNTIME_TIMEOUT:.0f} s; stopped it"
                )
            time.sleep(0.05)

    def _wait_for_observers(self) -> None:
        """The runtime is done: the watch ends by itself (its session is resolved) and the
        lifecycle feed delivers the last changes within moments."""
        watch = next(t for t in self.threads if t.name == "demo-watch")
        watch.join(5)
        self._raise_failures()
        if watch.is_alive():
            raise CommandFailed(
                f"the watch of {self.target} did not end after the session was resolved"
            )
        if not self.all_ended.wait(5):
            self._raise_failures()
            missing = sorted(set(self.names) - set(self.ended))
            raise CommandFailed(f"the lifecycle feed never reported the end of {missing}")
        self.stop.set()
        lifecycle = next(t for t in self.threads if t.name == "demo-lifecycle")
        lifecycle.join(5)
        self._raise_failures()

    def _resume(self) -> None:
        source = "resume"
        if self.saved is None:
            raise CommandFailed(f"the watch of {self.target} never reached #{self.middle}")
        saved_ordinal, cursor = self.saved
        meta = self.store.get_session(self.target)
        live = [event.ordinal for event in self.watched]
        if live != list(range(meta.first_ordinal, meta.last_ordinal + 1)):
            raise CommandFailed(
                f"the live watch of {self.target} delivered ordinals {live}, not "
                f"#{meta.first_ordinal}..#{meta.last_ordinal} once each"
            )
        self.say(
            source,
            {"saved_ordinal": saved_ordinal, "cursor": cursor},
            f"replaying from the cursor saved at #{saved_ordinal}",
            session=True,
        )
        resumed = list(self.store.replay(self.target, cursor=cursor))
        for event in resumed:
            text = event_text(event, 90)
            self.say(source, {"ordinal": event.ordinal, **event_record(event)}, text, session=True)
        got = [(event.ordinal, event.data) for event in resumed]
        after = [(event.ordinal, event.data) for event in self.watched]
        expected = [item for item in after if item[0] > saved_ordinal]
        if got != expected:
            raise CommandFailed(
                f"resuming {self.target} after #{saved_ordinal} gave ordinals "
                f"{[ordinal for ordinal, _ in got]}, expected {[o for o, _ in expected]}"
            )
        span = f"#{got[0][0]}..#{got[-1][0]}" if got else "nothing"
        self.say(
            source,
            {
                "saved_ordinal": saved_ordinal,
                "resumed_ordinals": [ordinal for ordinal, _ in got],
                "exclusive": True,
            },
            f"got {span} ({_events(len(got))}): exactly the events after #{saved_ordinal}, "
            f"in order, none missing, none repeated (exclusive resume OK)",
            session=True,
        )

    def _owner_dies_mid_turn(self, env: dict[str, str]) -> None:
        """A second runtime owns a session, starts a turn and is killed mid-turn: its
        watcher gets WATCH_OUTCOME_UNKNOWN, a new owner records the turn as failed, and
        resuming from the error's cursor shows exactly that result."""
        import subprocess

        source = "crash"
        name = self.crash_name
        command = [sys.executable, "-m", "cli.demo_runtime", "-", "--hang", name]
        child = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,  # (held open: it ends when this process does)
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        try:
            assert child.stdout is not None
            step = json.loads(child.stdout.readline() or "{}")
            if step.get("action") != "mid-turn":
                raise CommandFailed(f"the runtime owning {name} did not start its turn")
            self.say(
                source,
                {"session_id": name, "owner_pid": child.pid, "request_id": step["request_id"]},
                f"runtime {child.pid} owns {name} and is mid-turn {step['request_id']}",
            )
            delivered: list[journal.Event] = []
            outcome: list[journal.OutcomeUnknown] = []

            def watch() -> None:
                try:
                    for event in self.store.watch(name):
                        delivered.append(event)
                except journal.OutcomeUnknown as error:
                    outcome.append(error)

            watcher = threading.Thread(target=watch, name="demo-crash-watch", daemon=True)
            watcher.start()
            deadline = time.monotonic() + 5
            while len(delivered) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            child.kill()
            child.wait(5)
            self.say(source, {"killed": child.pid}, f"killed runtime {child.pid} (SIGKILL)")
            watcher.join(5)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(5)
            for pipe in (child.stdin, child.stdout):
                if pipe is not None:
                    pipe.close()
        if not outcome:
            raise CommandFailed(f"the watch of {name} did not report the unknown outcome")
        error = outcome[0]
        self.say(
            source,
            {"error": error.code, "request_id": error.request_id, "cursor": error.cursor},
            f"watch of {name}: {error.code} for turn {error.request_id} after "
            f"{_events(len(delivered))}",
        )
        with self.store.own(name) as owner:
            self.say(
                source,
                {"session_id": name, "owner_generation": owner.generation},
                f"a new owner (this process) took {name}: it records the turn as failed",
            )
        self.store.resolve_session(name)
        resumed = list(self.store.replay(name, cursor=error.cursor))
        for event in resumed:
            self.say(source, {"session_id": name, **event_record(event)}, event_text(event, 90))
        first = resumed[0] if resumed else None
        if first is None or first.type != journal.TURN_RESULT:
            raise CommandFailed(f"resuming {name} from the error's cursor gave no turn result")
        self.unknown_outcome = json.loads(first.data).get("error", {}).get("code")

    def _summary(self, elapsed: float) -> None:
        outcomes = sorted(self.ended.values())
        counts = ", ".join(f"{outcomes.count(o)} {o}" for o in sorted(set(outcomes)))
        where = "temporary store removed" if self.temporary else f"store kept at {self.store.path}"
        record = {
            "elapsed_s": round(elapsed, 2),
            "sessions": len(self.names),
            "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
            "events_appended": self.runtime_events,
            "lifecycle_events": self.lifecycle_seen,
            "watched_events": len(self.watched),
            "unknown_outcome": self.unknown_outcome,
            "restart_tasks": self.restart_tasks,
            "store": self.store.path,
            "temporary": self.temporary,
            "killed_server": self.killed,
        }
        self.say(
            "demo",
            record,
            f"done in {elapsed:.1f} s: {plural(len(self.names), 'session')} ({counts}), "
            f"{plural(self.runtime_events, 'event')} appended by the runtime, "
            f"{plural(self.lifecycle_seen, 'lifecycle event')} and "
            f"{plural(len(self.watched), 'event')} of {self.target} followed live, "
            f"{plural(self.restart_tasks, 'task')} handled once each across a restart; {where}",
        )
        if self.killed is not None:
            self.say(
                "cluster",
                {"killed": self.killed, "watcher_resumes": self.resumed_after_loss},
                f"with NATS server {self.killed} killed midway the watchers carried on: every "
                f"event followed once, in order ({plural(self.resumed_after_loss, 'resume')} "
                "from a cursor); the cluster is stopped and removed",
            )


def _events(count: int) -> str:
    return "1 event" if count == 1 else f"{count} events"
