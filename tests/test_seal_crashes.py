"""A writer SIGKILLed at each step of a seal (SPEC 3.4): cutting the sealed segment's zeros,
the next segment's birth, the compressed copy, the sidecar, deleting the plain file, the
first frame of the next segment and its commit.

After each: every acknowledged event reads back once and in order (read-only and after a
writable open), a read-only `verify()` and `journal verify` report nothing (each state is
one a crash leaves and the next writer finishes, not damage), the writable open finishes
the seal (sidecar written, no temporary file, compressed with `compress_sealed`), and
watchers (one live across the crash and the writer's return, one resumed from a cursor
issued before the crash) deliver every event once. The helper is `tests/_procs_seals.py`;
its steps are the file operations the seal makes through `FileOps` and the commit's
fault points."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest
from _cli_runs import run_cli
from _procs_retention import START_S, Child

from journal import EventIn, Journal
from journal._local.files import FileOps

HELPER = str(Path(__file__).resolve().parent / "_procs_seals.py")
SEGMENT_BYTES = 4096  # (as the helper's)


def payload(ordinal: int) -> bytes:  # (as the helper's)
    return b"%d:" % ordinal + bytes([0x41 + ordinal % 26]) * 900


# (compress, step, occurrence, whether the killed batch's frame was written and synced)
WINDOWS = [
    pytest.param("0", "cut", 1, False, id="plain-before-the-cut", marks=pytest.mark.slow),
    pytest.param("0", "birth", 1, False, id="plain-next-segment-unnamed", marks=pytest.mark.slow),
    pytest.param("0", "sync dir", 1, False, id="plain-born-no-sidecar"),
    pytest.param("0", "publish-idx", 1, False, id="plain-sidecar-unnamed"),
    pytest.param(
        "0", "frame", 1, False, id="plain-sealed-before-the-frame", marks=pytest.mark.slow
    ),
    pytest.param("0", "commit.view_flush", 1, True, id="plain-frame-not-indexed"),
    pytest.param(
        "0", "commit.view_commit", 2, True, id="plain-retention-pass", marks=pytest.mark.slow
    ),
    pytest.param("1", "sync dir", 1, False, id="zst-born-no-copy", marks=pytest.mark.slow),
    pytest.param("1", "publish-zst", 1, False, id="zst-copy-unnamed"),
    pytest.param("1", "publish-idx", 1, False, id="zst-copy-no-sidecar"),
    pytest.param("1", "unlink-plain", 1, False, id="zst-plain-beside-copy", marks=pytest.mark.slow),
    pytest.param("1", "frame", 1, False, id="zst-sealed-before-the-frame", marks=pytest.mark.slow),
    pytest.param(
        "1", "commit.view_flush", 1, True, id="zst-frame-not-indexed", marks=pytest.mark.slow
    ),
]

# The second seal (one beside an earlier segment's sidecar), and the store's first.
SEALS = [pytest.param(2, id="second"), pytest.param(1, id="first", marks=pytest.mark.slow)]


def killed_writer(store: Path, *args: str) -> int:
    """Run the helper's writer on `store` (compress, step, occurrence[, seal]) until it is
    SIGKILLed at its step; the last ordinal it acknowledged."""
    writer = Child("writer", str(store), *args, script=HELPER)
    try:
        assert writer.next_line() == "ready", writer.err()
        writer.send("go")
        assert writer.wait(START_S) == -signal.SIGKILL, (writer.seen, writer.err())
    finally:
        writer.kill()
    return max(int(line.split()[1]) for line in writer.seen if line.startswith("ack"))


def _ordinals(child: Child) -> list[int]:
    assert not [line for line in child.seen if line.startswith("bad")], child.seen
    return [int(line.split()[1]) for line in child.seen if line.startswith("ev ")]


def _watched_through(child: Child, ordinal: int) -> dict[int, str]:
    """The cursors `child` printed, once it printed event `ordinal`."""
    while not any(line.startswith(f"ev {ordinal} ") for line in child.seen):
        child.next_line()
    return {int(o): cursor for _, o, cursor in (line.split() for line in child.seen[1:])}


@pytest.mark.parametrize("seal", SEALS)
@pytest.mark.parametrize(("compress", "step", "occurrence", "framed"), WINDOWS)
def test_a_writer_killed_inside_a_seal_loses_nothing_and_verify_says_so(
    tmp_path: Path, compress: str, step: str, occurrence: int, framed: bool, seal: int
) -> None:
    store = tmp_path / "store"
    children: list[Child] = []
    try:
        writer = Child(
            "writer", str(store), compress, step, str(occurrence), str(seal), script=HELPER
        )
        children.append(writer)
        assert writer.next_line() == "ready", writer.err()
        live = Child("watcher", str(store), "-", script=HELPER)
        children.append(live)
        assert live.next_line() == "ready", live.err()
        writer.send("go")
        assert writer.wait(START_S) == -signal.SIGKILL, (writer.seen, writer.err())
        acked = max(int(line.split()[1]) for line in writer.seen if line.startswith("ack"))
        assert acked >= 1 + 4 * (seal - 1)  # (4 events a segment)
        written = acked + 1 if framed else acked  # (a frame synced is committed)
        expected = [payload(o) for o in range(1, written + 1)]

        with Journal.open(store, readonly=True) as reader:
            assert [e.data for e in reader.replay("s")] == expected
            assert reader.verify().problems == []
        done = run_cli(store, "verify")
        assert done.returncode == 0 and "0 problems" in done.stdout, (done.stdout, done.stderr)

        # A cursor issued before the crash (the live watcher's, of the event before the
        # last acknowledged one), resumed by a read-only watcher before the writer returns.
        cursors = _watched_through(live, acked)
        late = Child("watcher", str(store), cursors[acked - 1], script=HELPER)
        children.append(late)
        assert late.next_line() == "ready", late.err()

        more = written + 5
        with Journal.open(store, segment_bytes=SEGMENT_BYTES, compress_sealed=compress == "1") as j:
            assert [e.data for e in j.replay("s")] == expected
            assert j.verify().problems == []
            for ordinal in range(written + 1, more + 1):
                j.append("s", [EventIn("m", payload(ordinal))])
            after = [e.data for e in j.replay("s", cursors[acked - 1])]
            assert after == [payload(o) for o in range(acked, more + 1)]
            j.resolve_session("s")
            assert j.verify().problems == []
        assert live.wait(START_S) == 0, live.err()
        assert late.wait(START_S) == 0, late.err()
        assert _ordinals(live) == list(range(1, more + 1))
        assert _ordinals(late) == list(range(acked, more + 1))
    finally:
        for child in children:
            child.kill()

    names = set(os.listdir(store / "segments"))
    assert not [name for name in names if name.endswith(".tmp")], names
    segments = sorted(name[:20] for name in names if ".seg" in name)
    assert all(f"{base}.idx" in names for base in segments[:-1]), names
    if compress == "1":  # (the killed seal was finished as it began: compressed)
        assert all(f"{base}.seg" not in names for base in segments[:-1]), names
    done = run_cli(store, "verify")
    assert done.returncode == 0 and "0 problems" in done.stdout, (done.stdout, done.stderr)


class _NoRoomForACopy(FileOps):
    """A disk with no room for a compressed copy: its sync fails (ENOSPC)."""

    def fsync(self, fd: int) -> None:
        if ".seg.zst." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().fsync(fd)


def test_a_killed_seal_whose_copy_finds_no_room_is_finished_plain_and_commits_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The writable open compresses a segment whose seal was killed before its compressed
    copy was in place; on a full disk it writes the sidecar of the plain file instead (a
    warning), so the store takes commits (before the open compressed, it never failed)."""
    store = tmp_path / "store"
    acked = killed_writer(store, "1", "publish-zst", "1")
    segments = store / "segments"
    plain = sorted(name for name in os.listdir(segments) if name.endswith(".seg"))[0]
    with (
        caplog.at_level("WARNING", logger="journal"),
        Journal.open(
            store, segment_bytes=SEGMENT_BYTES, compress_sealed=True, file_ops=_NoRoomForACopy()
        ) as j,
    ):
        assert [e.data for e in j.replay("s")] == [payload(o) for o in range(1, acked + 1)]
        j.append("s", [EventIn("m", b"small")])
        assert j.verify().problems == []
    assert f"could not compress the sealed segment {plain}" in caplog.text
    names = set(os.listdir(segments))
    assert {plain, plain.replace(".seg", ".idx")} <= names
    assert f"{plain}.zst" not in names
    assert not [name for name in names if name.endswith(".tmp")], names
