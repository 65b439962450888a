"""Helper processes for tests/test_journal_processes.py (run as `python tests/_procs.py ...`).

    writer STORE SESSION SEGMENT_BYTES TAG SEED
        Append random batches to SESSION forever (durability "fsync") and print
        `ack FIRST LAST DIGEST` after each acknowledged append. The parent SIGKILLs it.
    multi STORE SEGMENT_BYTES TAG SEED BATCHES SESSION...
        Print `ready`, wait for a line on stdin, then append BATCHES batches, cycling over
        the SESSIONs, printing `ack SESSION FIRST LAST DIGEST` after each; exit 0.
    watcher STORE SESSION
        Print `ready`, then watch SESSION from the start and print `ORDINAL DIGEST` per
        event; exit 0 when the watch ends by itself.

Payloads check themselves (`payload_ok`): a body then the first 8 bytes of its SHA-256, so a
partial or mixed-up event is recognised wherever it turns up.
"""

from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHECK_BYTES = 8


def make_payload(tag: str, number: int, rng: random.Random) -> bytes:
    body = f"{tag}:{number}:".encode() + rng.randbytes(rng.choice([0, 10, 100, 700, 3000]))
    return body + hashlib.sha256(body).digest()[:CHECK_BYTES]


def payload_ok(payload: bytes) -> bool:
    body, check = payload[:-CHECK_BYTES], payload[-CHECK_BYTES:]
    return len(payload) > CHECK_BYTES and hashlib.sha256(body).digest()[:CHECK_BYTES] == check


def payload_id(payload: bytes) -> str:
    """`TAG:NUMBER`, unique per payload ever produced by a test."""
    tag, number, _ = payload.split(b":", 2)
    return f"{tag.decode()}:{number.decode()}"


def batch_digest(payloads: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    for payload in payloads:
        digest.update(len(payload).to_bytes(8, "big"))
        digest.update(payload)
    return digest.hexdigest()[:32]


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def writer_batches(tag: str, seed: int) -> Iterator[list[bytes]]:
    """The batches `writer TAG SEED` appends, in order; the parent regenerates them to check
    that what survived a crash is exactly a prefix of whole batches."""
    rng = random.Random(seed)
    number = 0
    while True:
        batch = []
        for _ in range(rng.randint(1, 24)):
            number += 1
            batch.append(make_payload(tag, number, rng))
        yield batch


def writer(store: str, session_id: str, segment_bytes: str, tag: str, seed: str) -> None:
    from journal import EventIn, Journal

    options = {"create": False, "durability": "fsync", "segment_bytes": int(segment_bytes)}
    with Journal.open(store, **options) as j:
        emit("ready")
        for payloads in writer_batches(tag, int(seed)):
            result = j.append(session_id, [EventIn(type="m", data=p) for p in payloads])
            emit(f"ack {result.first_ordinal} {result.last_ordinal} {batch_digest(payloads)}")


def multi(
    store: str, segment_bytes: str, tag: str, seed: str, batches: str, *sessions: str
) -> None:
    from journal import EventIn, Journal

    rng = random.Random(int(seed))
    number = 0
    options = {"create": False, "durability": "fsync", "segment_bytes": int(segment_bytes)}
    with Journal.open(store, **options) as j:
        emit("ready")
        sys.stdin.readline()
        for i in range(int(batches)):
            session_id = sessions[i % len(sessions)]
            payloads = []
            for _ in range(rng.randint(1, 5)):
                number += 1
                payloads.append(make_payload(tag, number, rng))
            result = j.append(session_id, [EventIn(type="m", data=p) for p in payloads])
            emit(
                f"ack {session_id} {result.first_ordinal} {result.last_ordinal} "
                f"{batch_digest(payloads)}"
            )


def watcher(store: str, session_id: str) -> None:
    from journal import Journal

    with Journal.open(store, create=False, durability="os") as j:
        emit("ready")
        for event in j.watch(session_id):
            emit(f"{event.ordinal} {batch_digest([event.data])}")


COMMANDS = {"writer": writer, "multi": multi, "watcher": watcher}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
