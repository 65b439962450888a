"""Real processes on one store: kill -9 of a writer, several writer processes at once, and a
watcher in another process following a session to its end.

The children are `tests/_procs.py` commands; payloads check themselves, so a partial or
mixed-up event is caught wherever it shows up.
"""

from __future__ import annotations

import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _procs import batch_digest, payload_id, payload_ok, writer_batches

from journal import Event, EventIn, Journal, JournalError

ROOT = Path(__file__).resolve().parent.parent
PROCS = Path(__file__).resolve().parent / "_procs.py"
SEGMENT_BYTES = 256 << 10
# The crash test rotates every batch or two, so many kills land in or near a rotation.
CRASH_SEGMENT_BYTES = 32 << 10
START_S = 60.0  # generous: interpreter start and journal import on a loaded 2-core box


class Child:
    """A `_procs.py` subprocess with its stdout lines collected by a reader thread."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, str(PROCS), *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        self.readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put)),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append)),
        ]
        for reader in self.readers:
            reader.daemon = True
            reader.start()

    @staticmethod
    def _pump(stream: object, sink: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            sink(line)  # type: ignore[operator]

    def expect(self, text: str, timeout: float = START_S) -> None:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            pytest.fail(f"child did not print {text!r} within {timeout}s: {self.err()}")
        assert line == text + "\n", (line, self.err())

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def kill(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        return self.wait(START_S)

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.join_readers()
            pytest.fail(f"child still running after {timeout}s: {self.err()}")
        self.join_readers()
        return code

    def join_readers(self) -> None:
        for reader in self.readers:
            reader.join(10)

    def complete_lines(self) -> list[str]:
        """Every whole line printed (a line cut short by SIGKILL was never acknowledged)."""
        lines = []
        while not self.lines.empty():
            line = self.lines.get_nowait()
            if line.endswith("\n"):
                lines.append(line[:-1])
        return lines

    def err(self) -> str:
        return "".join(self.stderr)[-4000:]


def create_store(path: Path, *session_ids: str, segment_bytes: int = SEGMENT_BYTES) -> None:
    with Journal.open(path, create=True, durability="fsync", segment_bytes=segment_bytes) as j:
        for session_id in session_ids:
            j.create_session(session_id)


def read_session(
    path: Path, session_id: str, segment_bytes: int = SEGMENT_BYTES, when: str = ""
) -> list[Event]:
    try:
        with Journal.open(path, create=False, durability="os", segment_bytes=segment_bytes) as j:
            events = list(j.replay(session_id))
            assert j.get_session(session_id).last_ordinal == len(events)
    except JournalError as error:
        pytest.fail(f"store unreadable {when}: {type(error).__name__}: {error}")
    return events


def check_dense_and_whole(events: list[Event]) -> None:
    assert [e.ordinal for e in events] == list(range(1, len(events) + 1)), "ordinals not dense"
    damaged = [e.ordinal for e in events if not payload_ok(e.data)]
    assert damaged == [], f"partial or damaged events at ordinals {damaged}"
    ids = [payload_id(e.data) for e in events]
    assert len(set(ids)) == len(ids), "an event was stored twice"


def check_acks(events: list[Event], acks: list[tuple[int, int, str]]) -> None:
    for first, last, digest in acks:
        assert last <= len(events), f"acknowledged ordinals {first}..{last} lost"
        got = batch_digest(e.data for e in events[first - 1 : last])
        assert got == digest, f"acknowledged ordinals {first}..{last} changed"


def whole_batches(payloads: list[bytes], tag: str, seed: int) -> int:
    """How many of the writer's batches `payloads` are; fails unless exactly whole ones."""
    count = 0
    taken = 0
    batches: Iterator[list[bytes]] = writer_batches(tag, seed)
    while taken < len(payloads):
        batch = next(batches)
        assert payloads[taken : taken + len(batch)] == batch, (
            f"{tag}: batch {count + 1} is partial or differs"
        )
        taken += len(batch)
        count += 1
    return count


@pytest.mark.parametrize("rounds", [8, pytest.param(60, marks=pytest.mark.slow)])
def test_sigkilled_writer_loses_no_acknowledged_event_and_leaves_no_partial_one(
    tmp_path: Path, rng: random.Random, rounds: int
) -> None:
    store = tmp_path / "store"
    create_store(store, "s1", segment_bytes=CRASH_SEGMENT_BYTES)
    acks: list[tuple[int, int, str]] = []
    acked_rounds = 0
    previous_last = 0
    for round_no in range(rounds):
        tag, seed = f"r{round_no}", rng.randrange(1 << 30)
        child = Child("writer", str(store), "s1", str(CRASH_SEGMENT_BYTES), tag, str(seed))
        if round_no % 3 == 0:
            # Anywhere from interpreter start through open/recovery to mid-append.
            time.sleep(rng.uniform(0.05, 1.2))
        else:
            child.expect("ready")
            time.sleep(rng.uniform(0.0, 0.6))
        killed_after = time.monotonic() - child.started
        code = child.kill()
        lines = child.complete_lines()
        assert code == -signal.SIGKILL, f"writer exited by itself ({code}): {child.err()}"
        round_acks = []
        for line in lines[1:] if lines[:1] == ["ready"] else lines:
            word, first, last, digest = line.split()
            assert word == "ack", line
            round_acks.append((int(first), int(last), digest))
        acks.extend(round_acks)
        acked_rounds += bool(round_acks)

        when = f"after SIGKILL in round {round_no}, {killed_after:.2f}s after start"
        events = read_session(store, "s1", CRASH_SEGMENT_BYTES, when)
        check_dense_and_whole(events)
        check_acks(events, acks)
        assert len(events) >= previous_last, "committed events disappeared"
        this_round = [e.data for e in events[previous_last:]]
        assert all(payload_id(p).startswith(f"{tag}:") for p in this_round)
        whole = whole_batches(this_round, tag, seed)
        assert whole >= len(round_acks), "fewer batches stored than acknowledged"
        previous_last = len(events)
    assert acked_rounds >= rounds // 3, "the writer was killed before appending too often"


@pytest.mark.parametrize("batches", [30, pytest.param(300, marks=pytest.mark.slow)])
def test_writer_processes_on_one_store_keep_ordinals_dense(
    tmp_path: Path, rng: random.Random, batches: int
) -> None:
    store = tmp_path / "store"
    writers = 3
    create_store(store, "shared", *(f"own-{i}" for i in range(writers)))
    children = [
        Child(
            "multi",
            str(store),
            str(SEGMENT_BYTES),
            f"w{i}",
            str(rng.randrange(1 << 30)),
            str(batches),
            f"own-{i}",
            "shared",
        )
        for i in range(writers)
    ]
    for child in children:
        child.expect("ready")
    for child in children:
        child.send("go")
    acks: dict[str, list[tuple[int, int, str]]] = {}
    for child in children:
        code = child.wait(180)
        assert code == 0, child.err()
        lines = child.complete_lines()
        assert len(lines) == batches
        for line in lines:
            word, session_id, first, last, digest = line.split()
            assert word == "ack", line
            acks.setdefault(session_id, []).append((int(first), int(last), digest))

    for session_id, session_acks in sorted(acks.items()):
        events = read_session(store, session_id)
        check_dense_and_whole(events)
        check_acks(events, session_acks)
        # Every event was acknowledged exactly once: the ranges tile 1..last.
        ranges = sorted((first, last) for first, last, _ in session_acks)
        expected_first = 1
        for first, last in ranges:
            assert first == expected_first, f"{session_id}: ranges overlap or leave a gap"
            expected_first = last + 1
        assert expected_first == len(events) + 1, f"{session_id}: unacknowledged events"
        # Each writer's own events keep its order.
        for i in range(writers):
            numbers = [
                int(payload_id(e.data).split(":")[1])
                for e in events
                if payload_id(e.data).startswith(f"w{i}:")
            ]
            assert numbers == sorted(numbers), f"{session_id}: w{i}'s appends reordered"
            if session_id == f"own-{i}":
                assert len(numbers) == len(events)
    shared_tags = {payload_id(e.data).split(":")[0] for e in read_session(store, "shared")}
    assert shared_tags == {f"w{i}" for i in range(writers)}


@pytest.mark.parametrize("total", [200, pytest.param(3000, marks=pytest.mark.slow)])
def test_watcher_in_another_process_sees_every_event_and_ends_after_resolve(
    tmp_path: Path, rng: random.Random, total: int
) -> None:
    store = tmp_path / "store"
    create_store(store, "s1")
    expected: list[str] = []
    with Journal.open(store, durability="fsync", segment_bytes=SEGMENT_BYTES) as j:
        j.append("s1", [EventIn(type="m", data=b"before the watcher")])
        expected.append(batch_digest([b"before the watcher"]))
        child = Child("watcher", str(store), "s1")
        child.expect("ready")
        while len(expected) < total:
            size = min(rng.randint(1, 10), total - len(expected))
            payloads = [rng.randbytes(rng.choice([1, 50, 600])) for _ in range(size)]
            j.append("s1", [EventIn(type="m", data=p) for p in payloads])
            expected.extend(batch_digest([p]) for p in payloads)
            if rng.random() < 0.3:
                time.sleep(rng.uniform(0.001, 0.02))
        j.resolve_session("s1")
        code = child.wait(60)
    lines = child.complete_lines()
    assert code == 0, child.err()
    got = [line.split() for line in lines]  # "ready" was consumed by expect()
    assert [int(ordinal) for ordinal, _ in got] == list(range(1, total + 1))
    assert [digest for _, digest in got] == expected


@pytest.mark.parametrize("kept_bytes", [0, 20])
def test_open_recovers_when_killed_between_creating_a_segment_and_writing_its_header(
    tmp_path: Path, kept_bytes: int
) -> None:
    # Regression (found by the SIGKILL test): a writer killed during rotation left the new
    # segment empty, and every later open raised JournalCorrupt("segment header is
    # truncated"). The unfinished newest segment is a torn tail, not damage. This rebuilds
    # that state: a batch that went alone into a fresh segment, the segment cut back to
    # nothing (or half a header), and the derived index/ view dropped (open rebuilds it).
    store = tmp_path / "store"
    segments = store / "segments"
    payloads: list[bytes] = []
    with Journal.open(store, create=True, durability="os", segment_bytes=16 << 10) as j:
        j.create_session("s1")
        for i in range(100):
            before = sorted(segments.glob("*.seg"))
            payload = f"{i}:".encode() + bytes(3000)
            j.append("s1", [EventIn(type="m", data=payload)])
            payloads.append(payload)
            if len(sorted(segments.glob("*.seg"))) > len(before) and len(before) >= 2:
                break
        else:
            pytest.fail("no rotation happened")
    newest = sorted(segments.glob("*.seg"))[-1]
    header = newest.read_bytes()[:kept_bytes]
    newest.write_bytes(header)
    shutil.rmtree(store / "index")
    survivors = payloads[:-1]

    events = read_session(store, "s1", 16 << 10, "after a kill between segment and header")
    assert [e.data for e in events] == survivors
    with Journal.open(store, create=False, durability="os", segment_bytes=16 << 10) as j:
        assert j.append("s1", [EventIn(type="m", data=b"after")]).first_ordinal == len(events) + 1
    assert [e.data for e in read_session(store, "s1", 16 << 10)] == [*survivors, b"after"]


_KILLED_WHILE_RECORDING = """
import os, signal, sys
from journal import Journal, RetentionPolicy
from journal._local.files import FileOps

class KilledAtRename(FileOps):
    def replace(self, source, destination):
        if source.endswith(".tmp") and os.path.basename(destination) == "store.json":
            os.kill(os.getpid(), signal.SIGKILL)
        super().replace(source, destination)

Journal.open(sys.argv[1], retention=RetentionPolicy(max_history_bytes=12345),
             file_ops=KilledAtRename())
"""


def test_writable_open_deletes_temporary_files_a_killed_process_left_in_the_store(
    tmp_path: Path,
) -> None:
    # Regression (found by a SIGKILL trial that kills openers at random): a process killed
    # while it recorded a new retention policy (or file mode) in store.json left
    # `store.json.<pid>.tmp` in the store's directory, and no later open deleted it; the
    # clean-up of a dead process's temporary files covered `segments/` only.
    store = tmp_path / "store"
    Journal.open(store, create=True).close()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_WHILE_RECORDING, str(store)], env=env, timeout=START_S
    )
    assert child.returncode == -signal.SIGKILL
    assert [p.name for p in store.glob("store.json.*.tmp")], "the child left no temporary file"
    with Journal.open(store) as j:  # a writer's open cleans up after the dead process
        assert j.append("s", [EventIn(type="m", data=b"x")], create=True).first_ordinal == 1
    assert sorted(p.name for p in store.glob("*.tmp")) == []
    assert sorted(p.name for p in store.glob(".*.tmp")) == []


def test_writable_open_deletes_a_view_a_killed_process_moved_aside(tmp_path: Path) -> None:
    # A gap a crash trial noted: a process killed between moving the view aside
    # (from before a reboot: `index.stale-<pid>-<ns>`; damaged: `index.damaged-<pid>-<ns>`) and
    # deleting it left the directory, the size of a whole view, in the store for good.
    store = tmp_path / "store"
    Journal.open(store, create=True).close()
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        timeout=START_S,
        check=True,
    )
    dead = int(gone.stdout)
    for name in (
        f"index.stale-{dead}-1796272208796000000",
        f"index.damaged-{dead}-1796272208796000001",
        f"index.stale-{os.getpid()}-1",  # a live process's
        f"index.stale-{dead}",  # not a name the store makes (a user's)
        "index.stale-9999999999-1",  # no process has that id (os.kill: OverflowError)
    ):
        (store / name).mkdir()
        (store / name / "data.mdb").write_bytes(b"\0" * 4096)
    with Journal.open(store) as j:
        assert j.append("s", [EventIn(type="m", data=b"x")], create=True).first_ordinal == 1
    # (a live process's directory is its own to delete)
    assert sorted(p.name for p in store.glob("index*")) == sorted(
        ["index", f"index.stale-{os.getpid()}-1", f"index.stale-{dead}"]
    )
