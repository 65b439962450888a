"""Writer processes for tests/test_concurrent_writer_crashes.py (run as
`python tests/_procs_writers.py ...`).

    append STORE TAG SEED DURABILITY STATE_DIR CRASH[@POINT] SESSION...
        Open STORE (STATE_DIR: "-" for the real disk, else a `SharedDisk`'s state), print
        `ready`, then append forever: single events and batches of up to 6, to a random
        one of the SESSIONs, and now and then to a new session of its own (created by the
        append); print `ack SESSION FIRST LAST DIGEST CURSOR` after each acknowledged
        append (CURSOR: the one it returned, after its last event). On
        the shared disk an append that fails (the power is off) is retried after a pause;
        on the real disk any error ends the process (the parent expects SIGKILL). With
        probability CRASH at each of the fault points `commit.view_flush` (its frame
        written and synced) and `commit.view_commit` (the view's LMDB commit next) the
        writer SIGKILLs itself: a crash in the window where the frame is in the log and
        no view holds it. With `@POINT`, at that fault point instead.
    export STORE DEST
        `Journal.export_sessions(None, DEST)`, then print `done`.
    import STORE SOURCE
        `Journal.import_sessions(SOURCE)`, then print `done`.
    maintain STORE SEED CRASH ARCHIVE STATE_DIR [POINT]
        Open STORE (STATE_DIR as for `append`), print `ready`, then run maintenance
        forever, one random step at a time, printing a line after each: `snap SESSION
        THROUGH` (`compact_session`, its snapshot's data `SESSION:THROUGH`; `snap? SESSION
        THROUGH` is printed before it, `snap-refused` when a trim overtook it), `drained`
        (a snapshot of the 3 longest sessions through their last events, then
        `compact(dead_share=0.0)`), `compacted`, `retained`, `exported` (`export_sessions`
        of every session to ARCHIVE, replaced whole), `verified PROBLEMS` (`verify()`),
        `fixed PROBLEMS` (`verify(fix=True)`), `rotated KEY` (the key file's
        `KeyRing.edit` rotation). With probability CRASH at each of the maintenance fault
        points (`MAINTENANCE`; only POINT, when given) it SIGKILLs itself: a crash
        mid-step. On the shared disk a step that fails (the power is off) waits for
        SIGKILL, and the key is not rotated (`KeyRing` replaces its file with `os`, which the
        simulated disk does not see: a power cut would put back under its name the bytes
        last synced at the inode it had before, which a sidecar may have taken since).

Payloads check themselves (`tests/_procs.py`) and name their batch: `TAG:NUMBER:FIRST-LAST:`
where FIRST..LAST are the numbers of the batch they were appended in, so the parent sees a
partial batch wherever one turns up, acknowledged or not.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for place in (ROOT, ROOT / "tests"):
    if str(place) not in sys.path:
        sys.path.insert(0, str(place))

from _procs import CHECK_BYTES, batch_digest, emit  # noqa: E402


def batch_payloads(tag: str, first: int, size: int, rng: random.Random) -> list[bytes]:
    last = first + size - 1
    payloads = []
    for number in range(first, last + 1):
        body = f"{tag}:{number}:{first}-{last}:".encode()
        body += rng.randbytes(rng.choice([0, 10, 100, 400, 1500]))
        payloads.append(body + hashlib.sha256(body).digest()[:CHECK_BYTES])
    return payloads


_WINDOW = ("commit.view_flush", "commit.view_commit")


def _crashing(base: type, points: tuple[str, ...], crash: float, rng: random.Random) -> type:
    """`base` (a `FileOps`) whose `point` SIGKILLs the process at `points` with probability
    `crash`, once `armed` (after the open)."""

    class Crashing(base):  # type: ignore[misc, valid-type]
        armed = False

        def point(self, name: str, detail: object = None) -> None:
            if self.armed and name in points and rng.random() < crash:
                os.kill(os.getpid(), signal.SIGKILL)
            super().point(name, detail)

    return Crashing


def append(
    store: str, tag: str, seed: str, durability: str, state_dir: str, crash: str, *sessions: str
) -> None:
    from journal import EventIn, Journal, StoreUnavailable
    from journal._local.files import FileOps

    rng = random.Random(int(seed))
    crashes = random.Random(int(seed) + 1)
    probability, _, at = crash.partition("@")
    points = (at,) if at else _WINDOW
    file_ops: FileOps
    if state_dir == "-":
        file_ops = _crashing(FileOps, points, float(probability), crashes)()
    else:
        from _shared_disk import SharedDisk

        shared = _crashing(SharedDisk, points, float(probability), crashes)
        file_ops = shared(store, state_dir, random.Random(int(seed)))
    options = {"durability": durability, "segment_bytes": 16 << 10, "file_ops": file_ops}
    while True:
        try:
            j = Journal.open(store, **options)  # type: ignore[arg-type]
            break
        except StoreUnavailable:
            if state_dir == "-":
                raise
            time.sleep(0.01)
    emit("ready")
    file_ops.armed = True  # type: ignore[attr-defined]
    number = 0
    own = 0
    while True:
        create = rng.random() < 0.05
        if create:
            own += 1
            session_id = f"{tag}-own{own}"
        else:
            session_id = rng.choice(sessions)
        size = 1 if rng.random() < 0.5 else rng.randint(2, 6)
        payloads = batch_payloads(tag, number + 1, size, rng)
        number += size
        events = [EventIn(type="m", data=p) for p in payloads]
        try:
            result = j.append(session_id, events, create=create)
        except StoreUnavailable:
            if state_dir == "-":
                raise
            time.sleep(3600)  # the power is off: wait for SIGKILL
        first, last = result.first_ordinal, result.last_ordinal
        emit(f"ack {session_id} {first} {last} {batch_digest(payloads)} {result.cursor}")


def export(store: str, dest: str) -> None:
    from journal import Journal

    with Journal.open(store) as j:
        j.export_sessions(None, dest)
    emit("done")


def import_(store: str, source: str) -> None:
    from journal import Journal

    with Journal.open(store) as j:
        j.import_sessions(source)
    emit("done")


MAINTENANCE = (
    "compaction.live_frames",
    "compaction.rewritten",
    "compaction.replaced",
    "compaction.sealed",
    "retention.read_sidecar",
    "retention.rows",
    "retention.delete",
    "retention.deleted",
    "commit.batch_taken",
    "commit.view_flush",
    "commit.view_commit",
)


def maintain(store: str, seed: str, crash: str, archive: str, state_dir: str, *point: str) -> None:
    from journal import Journal, StoreUnavailable
    from journal._local.files import FileOps

    rng = random.Random(int(seed))
    points = point or MAINTENANCE
    crashes = random.Random(int(seed) + 1)
    file_ops: FileOps
    if state_dir == "-":
        file_ops = _crashing(FileOps, points, float(crash), crashes)()
    else:
        from _shared_disk import SharedDisk

        shared = _crashing(SharedDisk, points, float(crash), crashes)
        file_ops = shared(store, state_dir, random.Random(int(seed)))
    while True:
        try:
            j = Journal.open(store, segment_bytes=16 << 10, file_ops=file_ops)
            break
        except StoreUnavailable:
            if state_dir == "-":
                raise
            time.sleep(0.01)
    emit("ready")
    file_ops.armed = True  # type: ignore[attr-defined]
    while True:
        try:
            _maintenance_step(j, store, archive, rng, rotate=state_dir == "-")
        except (StoreUnavailable, OSError):
            if state_dir == "-":
                raise
            time.sleep(3600)  # the power is off: wait for SIGKILL
        time.sleep(rng.uniform(0.0, 0.05))


def _snapshot(j: Any, session_id: str, through: int) -> None:
    """`compact_session` through `through`, saying so before and after."""
    from journal import InvalidArgument, SessionNotFound

    emit(f"snap? {session_id} {through}")
    try:
        j.compact_session(session_id, through, f"{session_id}:{through}".encode())
    except (InvalidArgument, SessionNotFound):
        emit("snap-refused")  # (a window's trim went past it meanwhile)
        return
    emit(f"snap {session_id} {through}")


def _maintenance_step(
    j: Any, store: str, archive: str, rng: random.Random, *, rotate: bool
) -> None:
    """One random step of `maintain` (`rotate`: the key's rotation among them)."""
    from cursors import KeyRing
    from journal import ExportIncomplete

    steps = ["snap", "snap", "drain", "compact", "retain", "export", "verify", "fix"]
    step = rng.choice(steps + ["rotate"] * rotate)
    if step == "snap":
        sessions = [m for m in j.list_sessions() if m.last_ordinal >= m.first_ordinal]
        if sessions:
            sizes = [m.last_ordinal - m.first_ordinal + 1 for m in sessions]
            meta = rng.choices(sessions, sizes)[0]
            _snapshot(j, meta.session_id, rng.randint(meta.first_ordinal, meta.last_ordinal))
    elif step == "drain":  # (most of the active segment dead: compact() seals it)
        sessions = sorted(j.list_sessions(), key=lambda m: m.first_ordinal - m.last_ordinal)
        for meta in sessions[:3]:
            if meta.last_ordinal >= meta.first_ordinal:
                _snapshot(j, meta.session_id, meta.last_ordinal)
        j.compact(dead_share=0.0)
        emit("drained")
    elif step == "compact":
        j.compact(dead_share=rng.choice([0.0, 0.2, 0.6]))
        emit("compacted")
    elif step == "retain":
        j.apply_retention()
        emit("retained")
    elif step == "export":
        try:
            j.export_sessions(None, archive)
            emit("exported")
        except ExportIncomplete:
            # (A writer's retention trimmed a session the export was reading: the answer
            # SPEC 12 gives, "export again"; the next export step does.)
            emit("export-incomplete")
    elif step == "verify":
        emit(f"verified {len(j.verify().problems)}")
    elif step == "fix":
        emit(f"fixed {len(j.verify(fix=True).problems)}")
    else:
        with KeyRing.edit(os.path.join(store, "keys")) as ring:
            key = ring.rotate()
        emit(f"rotated {key}")


COMMANDS = {"append": append, "export": export, "import": import_, "maintain": maintain}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
