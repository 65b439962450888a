"""Several writer processes appending to one store at once, killed (SPEC 7.1, 14.4).

Two to four processes (`tests/_procs_writers.py append`) append with durability "fsync" to
the same sessions and to their own, single events and batches, and now and then create a
session with their append; one in three also SIGKILLs itself now and then at the fault
points between its frame's write and its view's commit. They are SIGKILLed one by one at
random moments while the others go on (and started again), or, on the simulated disk
every writer shares (`tests/_shared_disk.py`), the power goes at a random moment and
every writer is killed with it (there also with writers of durability "os", alone or
mixed with "fsync" ones). After each round the store is opened again and read whole:

- every acknowledged append is there at the ordinals it was acknowledged with (its
  payloads' digest), so in acknowledged order per session;
- ordinals are dense from 1; no payload is there twice or damaged; every batch there
  (acknowledged or not) is whole; each writer's events keep its order in every session;
- what the previous check read is still there, at the same ordinals;
- the cursor each acknowledged append returned resumes right after its last event, and
  a cursor of an event the previous check read (taken before the kills) resumes with
  exactly the events after it;
- `verify()` reports nothing.

And an export and an import (through the library, and `journal export` / `journal
import`) killed with SIGKILL at a random moment: no archive or a whole one, the
destination holds every session of the archive whole or none of them, and a retry
completes.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _procs import batch_digest, payload_ok
from _shared_disk import SharedDisk

from journal import (
    Event,
    EventIn,
    Journal,
    JournalCorrupt,
    SessionExists,
    read_archive_contents,
)

ROOT = Path(__file__).resolve().parent.parent
WRITERS = Path(__file__).resolve().parent / "_procs_writers.py"
SHARED = "shared"
START_S = 60.0  # interpreter start and journal import on a loaded 2-core machine


class Child:
    """A `_procs_writers.py` process whose stdout lines a thread collects."""

    def __init__(self, *args: str, command: bool = False) -> None:
        """`_procs_writers.py ARGS`, or the `journal` command's (`command`)."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env.pop("JOURNAL_STORE", None)
        # (What a child killed by the test leaves in its temporary directory, a `verify`'s
        # rebuilt view say, stays beside its store, under the test's tmp_path: ARGS name
        # the store first, after the command or `--store`.)
        scratch = Path(args[1]).parent / "child-tmp"
        scratch.mkdir(exist_ok=True)
        env["TMPDIR"] = str(scratch)
        program = ["-m", "cli"] if command else [str(WRITERS)]
        self.proc = subprocess.Popen(
            [sys.executable, *program, *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
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

    def expect(self, text: str) -> None:
        try:
            line = self.lines.get(timeout=START_S)
        except queue.Empty:
            self.kill()
            pytest.fail(f"child did not print {text!r} within {START_S}s: {self.err()}")
        assert line == text + "\n", (line, self.err())

    def kill(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        code = self.proc.wait(START_S)
        for reader in self.readers:
            reader.join(10)
        return code

    def whole_lines(self) -> list[str]:
        """Every whole line printed (one cut short by SIGKILL was never acknowledged)."""
        lines = []
        while not self.lines.empty():
            line = self.lines.get_nowait()
            if line.endswith("\n"):
                lines.append(line[:-1])
        return lines

    def err(self) -> str:
        return "".join(self.stderr)[-4000:]


def parse_payload(payload: bytes) -> tuple[str, int, int, int]:
    """(tag, number, first, last) of a `_procs_writers` payload."""
    tag, number, numbers, _ = payload.split(b":", 3)
    first, last = numbers.split(b"-")
    return tag.decode(), int(number), int(first), int(last)


@dataclass
class Ledger:
    """What the writers acknowledged since the last check, what that check read, and
    cursors it took."""

    acks: dict[str, list[tuple[int, int, str, str]]] = field(default_factory=dict)
    seen: dict[str, list[bytes]] = field(default_factory=dict)
    cursors: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    acknowledged: int = 0
    killed: int = 0  # writers killed before the power went
    lossy: bool = False  # (durability "os" alone: the last appends may be lost)
    lost: int = 0  # acknowledged appends lost so

    def take(self, child: Child) -> int:
        """The acknowledgements `child` printed; how many."""
        count = 0
        for line in child.whole_lines():
            if line == "ready":
                continue
            word, session_id, first, last, digest, cursor = line.split()
            assert word == "ack", line
            ack = (int(first), int(last), digest, cursor)
            self.acks.setdefault(session_id, []).append(ack)
            count += 1
        self.acknowledged += count
        return count


def _check_session(session_id: str, events: list[Event], ledger: Ledger) -> None:
    payloads = [e.data for e in events]
    assert [e.ordinal for e in events] == list(range(1, len(events) + 1)), session_id
    assert all(payload_ok(p) for p in payloads), f"{session_id}: a damaged event"
    parsed = [parse_payload(p) for p in payloads]
    ids = [(tag, number) for tag, number, _, _ in parsed]
    assert len(set(ids)) == len(ids), f"{session_id}: an event stored twice"
    i = 0
    while i < len(parsed):  # every batch whole, in its order
        tag, number, first, last = parsed[i]
        assert number == first, f"{session_id}: a batch starts at {tag}:{number} (partial)"
        want = [(tag, n, first, last) for n in range(first, last + 1)]
        assert parsed[i : i + len(want)] == want, f"{session_id}: batch {tag}:{first} partial"
        i += len(want)
    order: dict[str, int] = {}
    for tag, number, _, _ in parsed:
        assert number > order.get(tag, 0), f"{session_id}: {tag}'s appends reordered"
        order[tag] = number
    for first, last, digest, _ in ledger.acks.get(session_id, []):
        if ledger.lossy and last > len(events):
            ledger.lost += 1
            continue
        assert last <= len(events), f"{session_id}: acknowledged {first}..{last} lost"
        assert batch_digest(payloads[first - 1 : last]) == digest, (
            f"{session_id}: acknowledged {first}..{last} changed"
        )
    before = ledger.seen.get(session_id, [])
    assert payloads[: len(before)] == before, f"{session_id}: what was read before changed"


def check_store(path: Path, ledger: Ledger, rng: random.Random, disk: SharedDisk | None) -> None:
    """Open the store (on the shared disk: as one more process of it) and check it."""
    with Journal.open(path, file_ops=disk, segment_bytes=16 << 10) as j:
        listed = {m.session_id for m in j.list_sessions()}
        missing = [] if ledger.lossy else sorted(set(ledger.acks) - listed)
        assert not missing, f"sessions acknowledged but gone: {missing}"
        seen: dict[str, list[bytes]] = {}
        for session_id in sorted(listed):
            events = list(j.replay(session_id))
            assert j.get_session(session_id).last_ordinal == len(events), session_id
            _check_session(session_id, events, ledger)
            seen[session_id] = [e.data for e in events]
            for _, last, _, cursor in ledger.acks.get(session_id, []):
                if last <= len(events):  # (a writer's cursor, from before its crash)
                    page = j.read(session_id, cursor, max_bytes=1)
                    assert [e.ordinal for e in page.events] == list(
                        range(last + 1, min(last + 2, len(events) + 1))
                    ), f"{session_id}: the cursor of {last} resumed elsewhere"
            if session_id in ledger.cursors:
                k, cursor = ledger.cursors[session_id]
                after = [e.data for e in j.replay(session_id, cursor)]
                assert after == seen[session_id][k:], f"{session_id}: cursor of {k} resumed"
            k = rng.randint(0, len(events))
            ledger.cursors[session_id] = (k, events[k - 1].cursor if k else None)
        assert j.verify().problems == []
    ledger.seen = seen
    ledger.acks = {}  # (checked: from now on, part of what was seen)


def _create(path: Path, writers: int) -> list[str]:
    sessions = [SHARED, *(f"own-{i}" for i in range(writers))]
    with Journal.open(path, create=True, segment_bytes=16 << 10) as j:
        for session_id in sessions:
            j.create_session(session_id)
    return sessions


def _writer(
    path: Path,
    tag: str,
    rng: random.Random,
    state: str,
    sessions: list[str],
    durability: str = "fsync",
) -> Child:
    """A writer; one in three SIGKILLs itself now and then between its frame's write and
    its view's commit (`_procs_writers.py`)."""
    seed = str(rng.randrange(1 << 30))
    crash = rng.choice(["0", "0", "0.03"])
    return Child("append", str(path), tag, seed, durability, state, crash, *sessions)


def _sessions_of(i: int, sessions: list[str], writers: int) -> list[str]:
    """The sessions writer `i` appends to: the shared one, its own, and the next one's."""
    return [SHARED, f"own-{i}", f"own-{(i + 1) % writers}"]


@pytest.mark.parametrize("rounds", [4, pytest.param(30, marks=pytest.mark.slow)])
def test_writer_processes_killed_one_by_one_lose_no_acknowledged_append(
    tmp_path: Path, rng: random.Random, rounds: int
) -> None:
    """Each round starts 2-4 writers, then kills them one at a time at random moments
    (the others appending on), starting a new one in the place of some; then checks."""
    path = tmp_path / "s"
    writers = 4
    sessions = _create(path, writers)
    ledger = Ledger()
    kills = 0
    for round_no in range(rounds):
        count = rng.randint(2, writers)
        children = {
            i: _writer(path, f"r{round_no}w{i}", rng, "-", _sessions_of(i, sessions, writers))
            for i in range(count)
        }
        for child in children.values():
            child.expect("ready")
        restarts = 0
        while children:
            time.sleep(rng.uniform(0.0, 0.4))
            i = rng.choice(sorted(children))
            child = children.pop(i)
            code = child.kill()
            assert code == -signal.SIGKILL, f"writer ended by itself ({code}): {child.err()}"
            ledger.take(child)
            kills += 1
            if restarts < 2 and rng.random() < 0.5:
                restarts += 1
                tag = f"r{round_no}w{i}x{restarts}"
                children[i] = _writer(path, tag, rng, "-", _sessions_of(i, sessions, writers))
        check_store(path, ledger, rng, None)
    assert kills >= 2 * rounds
    assert ledger.acknowledged >= rounds * 10, "the writers were killed before appending"


@pytest.mark.parametrize("rounds", [2, pytest.param(25, marks=pytest.mark.slow)])
@pytest.mark.parametrize("durability", ["fsync", "mixed", "os"])
def test_writer_processes_on_one_store_lose_no_acknowledged_append_to_a_power_cut(
    tmp_path: Path, rng: random.Random, rounds: int, durability: str
) -> None:
    """Each round starts 2-4 writers on the shared simulated disk (maybe kills one and
    goes on); the power goes at a random moment (every writer killed with it), the store
    is rebuilt from what the disk held, and checked by one more process of the disk (its
    recovery's writes tracked too, for the next cut).

    "mixed": each writer appends with "os" or "fsync" at random. The "os" writers are
    killed first (a crash they survive), then a new "fsync" writer appends once, and only
    then the power goes: its append survives with everything committed before it, the
    "os" writers' appends included (SPEC 14.4 "Power cuts"). (What "os" writers commit
    after the last durable commit may be lost, and a power cut that kept a later page of
    theirs but not an earlier one leaves zeros before frames: `JournalCorrupt`, loud.)

    "os": every writer appends with "os". The last acknowledged appends of a session may
    be lost, nothing before them; or the store reads as corrupt (`JournalCorrupt`, loud),
    and the next round starts on a new store."""
    path = tmp_path / "s"
    writers = 4
    sessions = _create(path, writers)
    state = str(tmp_path / "disk")
    disk = SharedDisk(str(path), state, rng)
    disk.settle()
    ledger = Ledger(lossy=durability == "os")
    corrupt = 0
    for round_no in range(rounds):
        count = rng.randint(2, writers)
        durable = [
            durability == "fsync" or (durability == "mixed" and rng.random() < 0.5)
            for _ in range(count)
        ]
        children = [
            _writer(
                path,
                f"r{round_no}w{i}",
                rng,
                state,
                _sessions_of(i, sessions, writers),
                "fsync" if durable[i] else "os",
            )
            for i in range(count)
        ]
        for child in children:
            child.expect("ready")
        time.sleep(rng.uniform(0.2, 1.5))
        if rng.random() < 0.5:  # a writer killed first: the others index or cut its frame
            _kill(children[rng.randrange(count)], ledger)
            ledger.killed += 1
            time.sleep(rng.uniform(0.2, 1.0))
        if durability == "mixed":
            for i, child in enumerate(children):
                if not durable[i]:
                    _kill(child, ledger)
            closer = Child("append", str(path), f"r{round_no}c", "1", "fsync", state, "0", SHARED)
            children.append(closer)
            closer.expect("ready")
            line = closer.lines.get(timeout=START_S)
            closer.lines.put(line)  # (taken with the others below)
        disk.power_off()
        for child in children:
            _kill(child, ledger)
        disk.power_cut()
        disk.power_on()
        if durability != "os":
            check_store(path, ledger, rng, disk)
            continue
        try:
            check_store(path, ledger, rng, disk)
        except JournalCorrupt:
            corrupt += 1
            shutil.rmtree(path)
            shutil.rmtree(state)
            _create(path, writers)
            disk = SharedDisk(str(path), state, rng)
            disk.settle()
            ledger.seen, ledger.cursors, ledger.acks = {}, {}, {}
    assert ledger.acknowledged >= rounds * 5, "the power went before the writers appended"


def _kill(child: Child, ledger: Ledger) -> None:
    """SIGKILL `child` (unless it is gone: killed before, or by itself) and take its
    acknowledgements."""
    code = child.kill()
    assert code == -signal.SIGKILL, f"writer ended by itself ({code}): {child.err()}"
    ledger.take(child)


def _source(path: Path, rng: random.Random) -> dict[str, list[bytes]]:
    """A store of a few sessions, large enough that an export or import takes a while."""
    sessions: dict[str, list[bytes]] = {}
    with Journal.open(path, create=True, durability="os") as j:
        for s in range(5):
            session_id = f"src-{s}"
            sessions[session_id] = []
            for b in range(rng.randint(10, 30)):
                batch = [rng.randbytes(rng.choice([10, 500, 4000])) for _ in range(40)]
                j.append(session_id, [EventIn("m", p) for p in batch], create=b == 0)
                sessions[session_id].extend(batch)
    return sessions


def _killed(child: Child, after_s: float) -> bool:
    """Kill `child` `after_s` after its start unless it ended first; whether it ended."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.proc.wait(after_s)
    code = child.kill()  # (it may end by itself just before)
    assert code in (0, -signal.SIGKILL), child.err()
    return code == 0


def _start(how: str, command: str, store: Path, file: Path) -> Child:
    if how == "journal":  # the command line
        if command == "export":
            return Child(
                "--store", str(store), "export", "--all", "-o", str(file), "--force", command=True
            )
        return Child("--store", str(store), "import", str(file), command=True)
    return Child(command, str(store), str(file))


def _timed(how: str, command: str, store: Path, file: Path) -> float:
    started = time.monotonic()
    child = _start(how, command, store, file)
    assert child.proc.wait(START_S) == 0, child.err()
    child.kill()
    return time.monotonic() - started


def _whole_archive(archive: Path, expected: dict[str, list[bytes]]) -> None:
    contents = read_archive_contents(archive)
    got = {a.session_id: (a.first_ordinal, a.last_ordinal) for a in contents.sessions}
    assert got == {s: (1, len(events)) for s, events in expected.items()}


def _imported(path: Path, expected: dict[str, list[bytes]]) -> bool:
    """Whether the store holds the archive's sessions: all whole, or none (asserted)."""
    with Journal.open(path) as j:
        listed = {m.session_id for m in j.list_sessions()}
        there = sorted(listed & set(expected))
        assert there in ([], sorted(expected)), f"an import left some sessions: {there}"
        for session_id in there:
            assert [e.data for e in j.replay(session_id)] == expected[session_id], session_id
        assert listed - set(expected) == {"local"}
        assert [e.data for e in j.replay("local")] == [b"kept"]
        assert j.verify().problems == []
    return bool(there)


@pytest.mark.parametrize("rounds", [4, pytest.param(24, marks=pytest.mark.slow)])
@pytest.mark.parametrize("how", ["library", "journal"])
def test_an_export_or_import_killed_midway_leaves_all_or_nothing_and_a_retry_works(
    tmp_path: Path, rng: random.Random, rounds: int, how: str
) -> None:
    """An export killed with SIGKILL leaves no archive or a whole one (a retry replaces
    it and deletes the dead export's temporary file); an import killed leaves the
    destination with every session of the archive, whole, or none of them, `verify()`
    clean, and a retry imports them (or finds them all there)."""
    source = tmp_path / "source"
    expected = _source(source, rng)
    archive = tmp_path / "out" / "all.jarc"
    archive.parent.mkdir()
    export_s = _timed(how, "export", source, archive)
    timing = tmp_path / "timing"
    Journal.open(timing, create=True).close()
    import_s = _timed(how, "import", timing, archive)
    for _round in range(rounds):
        archive.unlink(missing_ok=True)
        # (the first part of the run is the interpreter's start)
        done = _killed(_start(how, "export", source, archive), rng.uniform(0.3, 1.1) * export_s)
        if archive.exists():  # whole, or not there
            _whole_archive(archive, expected)
        else:
            assert not done
        with Journal.open(source) as j:
            j.export_sessions(None, archive)
        assert [p.name for p in archive.parent.iterdir()] == [archive.name]
        _whole_archive(archive, expected)
    for round_no in range(rounds):
        target = tmp_path / f"target-{round_no}"
        with Journal.open(target, create=True) as j:
            j.append("local", [EventIn("m", b"kept")], create=True)
        done = _killed(_start(how, "import", target, archive), rng.uniform(0.3, 1.1) * import_s)
        there = _imported(target, expected)
        assert there or not done
        with Journal.open(target) as j:
            if there:
                with pytest.raises(SessionExists):
                    j.import_sessions(archive)
            else:
                j.import_sessions(archive)
            j.compact()  # (what a killed import staged is reclaimed)
        assert _imported(target, expected)
