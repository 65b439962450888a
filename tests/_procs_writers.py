"""Writer processes for tests/test_concurrent_writer_crashes.py (run as
`python tests/_procs_writers.py ...`).

    append STORE TAG SEED DURABILITY STATE_DIR CRASH SESSION...
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
        no view holds it.
    export STORE DEST
        `Journal.export_sessions(None, DEST)`, then print `done`.
    import STORE SOURCE
        `Journal.import_sessions(SOURCE)`, then print `done`.

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


def _crashing(base: type, crash: float, rng: random.Random) -> type:
    """`base` (a `FileOps`) whose `point` SIGKILLs the process at the window's points,
    once `armed` (after the open)."""

    class Crashing(base):  # type: ignore[misc, valid-type]
        armed = False

        def point(self, name: str, detail: object = None) -> None:
            if self.armed and name in _WINDOW and rng.random() < crash:
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
    file_ops: FileOps
    if state_dir == "-":
        file_ops = _crashing(FileOps, float(crash), crashes)()
    else:
        from _shared_disk import SharedDisk

        shared = _crashing(SharedDisk, float(crash), crashes)
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


COMMANDS = {"append": append, "export": export, "import": import_}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
