"""Helper processes for tests/test_seal_crashes.py (run as `python tests/_procs_seals.py ...`).

    writer STORE COMPRESS STEP OCCURRENCE [SEAL]
        Open the store (4 KiB segments, `compress_sealed` when COMPRESS is 1), create
        session `s`, print `ready`, wait for a line on stdin, then append one ~900-byte
        event per batch, printing `ack ORDINAL` after each. From the SEAL-th seal of a
        segment on (its cut of the preallocated zeros; 2 unless given: the second), every
        file operation and commit fault point is named as a step (`STEPS`); the
        OCCURRENCE-th step named STEP (1 for the first) SIGKILLs the process before it is
        made.
    watcher STORE CURSOR
        Open the store read-only, print `ready`, then watch session `s` after CURSOR (`-`:
        from the start), printing `ev ORDINAL CURSOR` per event (after checking its
        payload); `done` when the watch ends by itself (the session resolved).

Payloads are derived from the ordinal (`payload`), so a reader recognises a wrong event.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from journal import EventIn, Journal  # noqa: E402
from journal._local.files import FileOps  # noqa: E402

SEGMENT_BYTES = 4096

# What each step of a seal does (the names the writer's STEP argument takes):
STEPS = {
    "cut": "ftruncate of the sealed segment (its preallocated zeros)",
    "sync": "fsync of a file (`sync <kind>`: sealed, next-tmp, zst-tmp, idx-tmp, dir)",
    "birth": "rename of the next segment's temporary file to its name",
    "publish-zst": "replace of the compressed copy's temporary file to `<base>.seg.zst`",
    "publish-idx": "replace of the sidecar's temporary file to `<base>.idx`",
    "unlink-plain": "unlink of the plain file beside its compressed copy",
    "frame": "the synced write of a frame",
    "commit.view_flush": "fault point: the frame is synced, the view update starts",
    "commit.view_commit": "fault point: the view is updated, LMDB commits next",
}


def payload(ordinal: int) -> bytes:
    return b"%d:" % ordinal + bytes([0x41 + ordinal % 26]) * 900


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _kind(fd: int) -> str:
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        return "dir"
    name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    if name.endswith(".tmp"):
        return name.split(".")[1] + "-tmp"  # (seg, zst, idx)
    return "sealed" if name.endswith(".seg") else name


class KilledAtStep(FileOps):
    """SIGKILLs the process before the `occurrence`-th step named `step` of the `seal`-th
    seal and after (the first seal makes the store's first sidecar; the second, one
    beside an earlier segment's)."""

    def __init__(self, step: str, occurrence: int, seal: int = 2) -> None:
        self.step = step
        self.occurrence = occurrence
        self.seal = seal
        self.cuts = 0
        self.seen = 0

    def _at(self, step: str) -> None:
        if self.cuts >= self.seal and (step == self.step or step.split()[0] == self.step):
            self.seen += 1
            if self.seen == self.occurrence:
                os.kill(os.getpid(), signal.SIGKILL)

    def point(self, name: str, detail: object = None) -> None:
        self._at(name)

    def ftruncate(self, fd: int, length: int) -> None:
        if self.cuts < self.seal and _kind(fd) == "sealed":
            self.cuts += 1
        self._at("cut")
        super().ftruncate(fd, length)

    def fsync(self, fd: int) -> None:
        self._at(f"sync {_kind(fd)}")
        super().fsync(fd)

    def rename(self, source: str, destination: str) -> None:
        self._at("birth")
        super().rename(source, destination)

    def replace(self, source: str, destination: str) -> None:
        self._at("publish-zst" if destination.endswith(".zst") else "publish-idx")
        super().replace(source, destination)

    def unlink(self, path: str) -> None:
        self._at("unlink-plain")
        super().unlink(path)

    def pwrite_synced(self, fd: int, data: bytes | bytearray, offset: int) -> int:
        self._at("frame")
        return super().pwrite_synced(fd, data, offset)


def writer(store: str, compress: str, step: str, occurrence: str, seal: str = "2") -> None:
    ops = KilledAtStep(step, int(occurrence), int(seal))
    with Journal.open(
        store, segment_bytes=SEGMENT_BYTES, compress_sealed=compress == "1", file_ops=ops
    ) as j:
        j.create_session("s")
        emit("ready")
        sys.stdin.readline()
        for ordinal in range(1, 1000):
            j.append("s", [EventIn("m", payload(ordinal))])
            emit(f"ack {ordinal}")
    emit("never killed")


def watcher(store: str, cursor: str) -> None:
    with Journal.open(store, readonly=True) as j:
        events = j.watch("s", None if cursor == "-" else cursor)
        emit("ready")
        for event in events:
            if event.data != payload(event.ordinal):
                emit(f"bad {event.ordinal}")
            emit(f"ev {event.ordinal} {event.cursor}")
    emit("done")


if __name__ == "__main__":
    {"writer": writer, "watcher": watcher}[sys.argv[1]](*sys.argv[2:])
