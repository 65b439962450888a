"""I/O failures (not kills) inside a seal, through the `FileOps` seam (SPEC 3.4, 14.4):
ENOSPC and EIO at each step of an append's rotation (the cut of the sealed segment's
zeros, its sync, the next segment's birth, the compressed copy, the sidecar, the unlink
of the plain file, the directory syncs, the first frame and the commit after it), of the
store's first seal and a later one, and at the steps of `compact()`'s seal and swap.

After each: the failing call raises `StoreUnavailable` with the OS error's number and
nothing it was refused is read back; every acknowledged event is there; a read-only
`verify()` made while the writer is still open (its failure not yet finished by a
commit) reports nothing, since the state is one the next commit finishes, not damage;
the same journal then takes appends without a reopen and finishes the seal (sidecar
written, compressed with `compress_sealed`, no temporary file); a reopen reads and
verifies the same.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path

import msgspec
import pytest
from _cli_runs import run_cli
from _procs_retention import payload as event_payload

from journal import EventIn, Journal, RetentionPolicy, StoreUnavailable
from journal._local.files import FileOps

SEGMENT_BYTES = 4096
NO_WINDOWS = RetentionPolicy(max_history_bytes=None)


def payload(ordinal: int) -> bytes:
    return b"%d:" % ordinal + bytes([0x41 + ordinal % 26]) * 900


def _kind(fd: int) -> str:
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        return "dir"
    name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    if name.endswith(".tmp"):
        return "zst-tmp" if ".seg.zst." in name else name.split(".")[1] + "-tmp"
    return "sealed" if name.endswith(".seg") else name


class FailingStep(FileOps):
    """Once armed, the `occurrence`-th call of step `step` and the `times - 1` calls of
    it after that raise `OSError(code)`. Steps: `cut` (ftruncate of a plain segment),
    `sync <kind>` (sealed, seg-tmp, zst-tmp, idx-tmp, dir), `birth` (rename),
    `publish-zst`, `publish-idx` (replace), `unlink <suffix>`, `frame` (a synced write)
    and the named fault points."""

    def __init__(self) -> None:
        self.step = ""
        self.occurrence = 0
        self.code = 0
        self.left = 0
        self.seen = 0
        self.struck = 0

    def arm(self, step: str, code: int, times: int = 1, occurrence: int = 1) -> None:
        self.step, self.code, self.left, self.occurrence = step, code, times, occurrence
        self.seen = 0

    def _at(self, step: str) -> None:
        if self.left and step == self.step:
            self.seen += 1
            if self.seen >= self.occurrence:
                self.left -= 1
                self.struck += 1
                raise OSError(self.code, os.strerror(self.code))

    def point(self, name: str, detail: object = None) -> None:
        self._at(name)

    def ftruncate(self, fd: int, length: int) -> None:
        self._at("cut" if _kind(fd) == "sealed" else "truncate")
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
        self._at("unlink " + ("plain" if path.endswith(".seg") else path.rsplit(".", 1)[-1]))
        super().unlink(path)

    def pwrite_synced(self, fd: int, data: bytes | bytearray, offset: int) -> int:
        self._at("frame")
        return super().pwrite_synced(fd, data, offset)


def _segment_names(store: Path) -> set[str]:
    return set(os.listdir(store / "segments"))


def _read_only_verify(store: Path) -> list[str]:
    with Journal.open(store, readonly=True) as reader:
        return [str(p) for p in reader.verify().problems]


def _finished(store: Path, compressed: bool) -> None:
    """Every sealed segment has its sidecar (compressed, when `compressed`), and no
    temporary file is left."""
    names = _segment_names(store)
    assert not [name for name in names if name.endswith(".tmp")], names
    bases = sorted({name[:20] for name in names if ".seg" in name and ".swap." not in name})
    assert all(f"{base}.idx" in names for base in bases[:-1]), names
    if compressed:
        assert all(f"{base}.seg" not in names for base in bases[:-1]), names


# (compress, step, its occurrence from the armed append on); the steps of a rotation in
# order. With `compress_sealed` the sealed segment's copy is synced as `zst-tmp`.
ROTATION = [
    ("0", "cut", 1),
    ("0", "sync sealed", 1),
    ("0", "sync seg-tmp", 1),
    ("0", "birth", 1),
    ("0", "sync dir", 1),  # (the birth's)
    ("0", "sync idx-tmp", 1),
    ("0", "publish-idx", 1),
    ("0", "sync dir", 2),  # (the sidecar's)
    ("0", "frame", 1),  # (the first frame of the next segment)
    ("0", "commit.view_commit", 1),
    ("1", "cut", 1),
    ("1", "birth", 1),
    ("1", "sync zst-tmp", 1),
    ("1", "publish-zst", 1),
    ("1", "sync dir", 2),  # (the copy's)
    ("1", "publish-idx", 1),
    ("1", "unlink plain", 1),
    ("1", "sync dir", 4),  # (the plain file's deletion)
    ("1", "commit.view_commit", 1),
]
_CODES = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO}


def _cases() -> list[object]:
    cases = []
    for compress, step, occurrence in ROTATION:
        for seal in (2, 1):
            for name, times in (("ENOSPC", 1), ("EIO", 3)):
                fast = seal == 2 and name == "ENOSPC"
                cases.append(
                    pytest.param(
                        compress,
                        step,
                        occurrence,
                        seal,
                        _CODES[name],
                        times,
                        id=f"{'zst' if compress == '1' else 'plain'}-{step}#{occurrence}-"
                        f"seal{seal}-{name}x{times}",
                        marks=() if fast else pytest.mark.slow,
                    )
                )
    return cases


@pytest.mark.parametrize(("compress", "step", "occurrence", "seal", "code", "times"), _cases())
def test_an_io_failure_inside_a_rotation_fails_the_append_and_the_journal_goes_on(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    compress: str,
    step: str,
    occurrence: int,
    seal: int,
    code: int,
    times: int,
) -> None:
    store = tmp_path / "store"
    ops = FailingStep()
    compressed = compress == "1"
    acked: list[bytes] = []
    with (
        caplog.at_level("WARNING", logger="journal"),
        Journal.open(
            store, segment_bytes=SEGMENT_BYTES, compress_sealed=compressed, file_ops=ops
        ) as j,
    ):
        j.create_session("s")
        ordinal = 0
        # Four events fill a segment: the next append seals the `seal`-th one.
        while len(acked) < 4 * seal:
            ordinal += 1
            j.append("s", [EventIn("m", payload(ordinal))])
            acked.append(payload(ordinal))
        assert sum(name.endswith(".idx") for name in _segment_names(store)) == seal - 1
        ops.arm(step, code, times, occurrence)
        failures = 0
        for _ in range(times + 3):
            ordinal += 1
            try:
                j.append("s", [EventIn("m", payload(ordinal))])
            except StoreUnavailable as e:
                assert e.errno == code, e
                failures += 1
                if failures == 1:
                    # The failure's state, before a commit finishes it: nothing refused
                    # reads back, and verify reports nothing (any process's).
                    assert [e.data for e in j.replay("s")] == acked
                    assert _read_only_verify(store) == []
                    assert j.verify().problems == []
            else:
                acked.append(payload(ordinal))
        assert ops.struck == times and failures >= 1, (ops.struck, failures)
        # (The fault cleared: this commit's catch-up finishes what a failure left.)
        j.append("s", [EventIn("m", b"cleared")])
        acked.append(b"cleared")
        assert [e.data for e in j.replay("s")] == acked
        assert j.verify().problems == []
    # With `compress_sealed`, a segment whose copy failed again when the catch-up
    # retried it stays plain, saying so (SPEC 3.4); the others are compressed.
    _finished(store, compressed and "could not compress the sealed segment" not in caplog.text)
    assert _read_only_verify(store) == []
    with Journal.open(store, segment_bytes=SEGMENT_BYTES, compress_sealed=compressed) as j:
        assert [e.data for e in j.replay("s")] == acked
        j.append("s", [EventIn("m", b"after")])
        assert j.verify().problems == []


# -- compact(): its seal and its swap --------------------------------------------------


def _compactable(store: Path, ops: FileOps, *, segment_bytes: int) -> Journal:
    """A store of sessions `s` (200 events of 4,000 bytes) and `t`, whose window was
    lowered so `compact()` has dead frames to drop (the active segment's too, with 1 MiB
    segments, so `compact()` seals it)."""
    j = Journal.open(
        store, durability="os", segment_bytes=segment_bytes, retention=NO_WINDOWS, file_ops=ops
    )
    j.create_session("s")
    j.create_session("t")
    for ordinal in range(1, 201):
        j.append("s", [EventIn("m", event_payload("s", ordinal, 4000))])
    j.change_retention_policy(lambda p: msgspec.structs.replace(p, max_history_bytes=100_000))
    return j


def test_a_swap_whose_sidecar_fails_is_not_reported_as_damage_while_its_writer_lives(
    tmp_path: Path,
) -> None:
    """A compaction swap renames its copy into place, then writes the new sidecar: on a
    full disk `compact()` raises and the segment stays without a sidecar until the next
    commit's catch-up writes it (SPEC 14.4). Until 2026-12-06 a `verify()` or `journal
    verify` meanwhile (while the process that failed lived: its swap mark was taken for
    one in progress) reported "sidecar missing or bad", exit 7, "restore damaged segments
    from a backup", on a store that lost nothing and needed only a commit."""
    store = tmp_path / "store"
    ops = FailingStep()
    with _compactable(store, ops, segment_bytes=64 << 10) as j:
        j.apply_retention()
        before = [e.data for e in j.replay("s")]
        ops.arm("publish-idx", errno.ENOSPC, occurrence=1)
        with pytest.raises(StoreUnavailable) as failed:
            j.compact()
        assert failed.value.errno == errno.ENOSPC and ops.struck == 1
        names = _segment_names(store)
        assert "00000000000000000001.seg.zst" in names, names
        assert "00000000000000000001.idx" not in names, names  # (the state under test)
        assert _read_only_verify(store) == []
        assert j.verify().problems == []
        done = run_cli(store, "verify")
        assert done.returncode == 0 and "0 problems" in done.stdout, (done.stdout, done.stderr)
        assert [e.data for e in j.replay("s")] == before
        j.append("t", [EventIn("m", b"after")])  # (its catch-up writes the sidecar)
        assert "00000000000000000001.idx" in _segment_names(store)
        assert j.verify().problems == []
        rewritten = j.compact().segments_rewritten  # (the segments the failure left)
        assert "00000000000000000001.seg.zst" not in rewritten, rewritten
        assert j.verify().problems == []
    with Journal.open(store) as j:
        assert [e.data for e in j.replay("s")] == before
        assert [e.data for e in j.replay("t")] == [b"after"]
        assert j.verify().problems == []
    _finished(store, compressed=False)


class _SealBatchedWithAnAppend(FailingStep):
    """Makes `compact()`'s seal of the active segment (`SealActive`) share its batch with
    another thread's append, then fails step `step` inside it: thread A's append is
    held in its commit while the seal queues, and thread B's append joins the queue
    behind the seal."""

    def __init__(self, step: str) -> None:
        super().__init__()
        self.failing = step
        self.phase = 0
        self.start_a = threading.Event()
        self.a_held = threading.Event()
        self.two_queued = threading.Event()

    def point(self, name: str, detail: object = None) -> None:
        thread = threading.current_thread()
        if name == "segments.tail_read" and self.phase == 1 and thread is threading.main_thread():
            # `compact()` reads the active segment before it asks for the seal.
            self.phase = 2
            self.start_a.set()
            assert self.a_held.wait(30)
        elif name == "commit.view_commit" and self.phase == 2 and thread.name == "A":
            self.phase = 3
            self.a_held.set()
            assert self.two_queued.wait(30)
        elif name == "commit.queued" and self.phase == 3 and isinstance(detail, int):
            if detail >= 2:  # (the seal, then B's append)
                self.phase = 4
                self.two_queued.set()
        elif name == "plan.operation" and self.phase == 4:
            self.phase = 5
            self.arm(self.failing, errno.ENOSPC)
        super().point(name, detail)


@pytest.mark.parametrize("step", ["publish-idx", "sync idx-tmp", "birth", "cut"])
def test_compact_s_failed_seal_batched_with_appends_leaves_no_sealed_segment_without_sidecar(
    tmp_path: Path, step: str
) -> None:
    """`compact()` seals the active segment as an operation of a batch, which appends of
    other threads may share. Until 2026-12-06 a seal that failed after the next
    segment's birth (its sidecar not written) failed alone, and the batch's appends
    committed into the new segment: the sealed segment then lacked its sidecar with the
    view's head past the new segment's start, which `verify()` (and `journal verify`,
    exit 7) reported as damage until the writer's next commit. Now the seal's OS error
    fails its batch, as a rotation inside an append does: nothing of it is committed,
    the appends raise `StoreUnavailable`, and the next commit finishes the seal."""
    store = tmp_path / "store"
    ops = _SealBatchedWithAnAppend(step)
    with _compactable(store, ops, segment_bytes=1 << 20) as j:
        results: dict[str, str] = {}

        def append(name: str, wait: threading.Event) -> None:
            assert wait.wait(30)
            try:
                j.append("t", [EventIn("m", name.encode())])
                results[name] = "ok"
            except StoreUnavailable as e:
                results[name] = f"errno {e.errno}"

        a = threading.Thread(target=append, args=("A", ops.start_a), name="A")
        # (B queues behind the seal: it starts once A's commit is held and the seal queued.)
        b_start = threading.Event()
        b = threading.Thread(target=append, args=("B", b_start), name="B")
        a.start()
        b.start()
        ops.phase = 1
        watcher = threading.Thread(target=lambda: (ops.a_held.wait(30), b_start.set()))
        watcher.start()
        try:
            j.compact()
            results["compact"] = "ok"
        except StoreUnavailable as e:
            results["compact"] = f"errno {e.errno}"
        a.join()
        b.join()
        watcher.join()
        assert ops.phase == 5 and ops.struck == 1, (ops.phase, ops.struck, results)
        assert results["A"] == "ok", results
        appended = [e.data for e in j.replay("t")]
        # (B shared the seal's batch: it failed with it, and nothing of it was committed.)
        assert results["B"] == f"errno {errno.ENOSPC}", results
        assert appended == [b"A"], (appended, results)
        assert _read_only_verify(store) == [], results
        assert j.verify().problems == []
        j.append("t", [EventIn("m", b"C")])
        assert j.verify().problems == []
        assert j.compact() is not None
        assert j.verify().problems == []
    _finished(store, compressed=False)
    assert _read_only_verify(store) == []
