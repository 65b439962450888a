"""Power cuts and injected faults while maintenance runs (SPEC 7.1, 8, 14.4).

The power-cut rounds of `test_io_faults.py` append only (with rotation, compressed
sealing and a history window). Here appends interleave with what rewrites and deletes
the log's files: `compact()` (its seal, its copies, the swap's three directory changes
and their syncs), `apply_retention()` (evicting ended sessions, deleting dead segments,
recording `segments/feed-floor`), `compact_session()`, `verify(fix=True)`; and a fault
(EIO, ENOSPC) strikes at random before the power goes. Then a second power cut strikes
the recovery from the first (the rebuild, the copy and cut of a torn tail, a marked swap
finished, a compaction and a retention pass). And the disk calls of one compaction, one
seal and one retention pass are each struck in turn: the power goes there, or an EIO,
or two in a row (a frame's sync, then the cut that would take it off); the journal is
then reopened, as a process ending on the error would be, and goes on until the power
goes. After each cut the store is opened again: every append
acknowledged before it is there, in order, with no gap and no duplicate, and `verify()`
reports nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
from pathlib import Path

import pytest
from _disk import SimulatedDisk

from journal import EventIn, Journal, RetentionPolicy, StoreUnavailable, WriteOutcomeUnknown
from journal._local.frames import FRAME_HEADER_SIZE, segment_name
from journal._local.log import SegmentLog

KEPT = ("k0", "k1")
TRIMMED = "t"  # a session with its own history window (bytes)
POLICY = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)
SEGMENT_BYTES = 4096
FAULTS = [
    ("fsync", errno.EIO),
    ("fdatasync", errno.EIO),
    ("pwrite", errno.ENOSPC),
    ("replace", errno.EIO),
    ("unlink", errno.EIO),
    ("ftruncate", errno.EIO),
]


def _open(path: Path, disk: SimulatedDisk, compress: bool) -> Journal:
    return Journal.open(
        path,
        segment_bytes=SEGMENT_BYTES,
        file_ops=disk,
        compress_sealed=compress,
        retention=POLICY,
    )


class Acked:
    """What was acknowledged per session, and what may be there or not (refused, or of
    unknown outcome: a frame synced before the power went is there after the reboot)."""

    def __init__(self) -> None:
        self.events: dict[str, list[bytes]] = {s: [] for s in (*KEPT, TRIMMED)}
        self.maybe: set[bytes] = set()

    def copy(self) -> Acked:
        other = Acked()
        other.events = {s: list(events) for s, events in self.events.items()}
        other.maybe = set(self.maybe)
        return other

    def append(self, j: Journal, session: str, batch: list[bytes]) -> None:
        try:
            j.append(session, [EventIn("m", data) for data in batch])
        except StoreUnavailable:
            self.maybe.update(batch)
            raise
        self.events[session].extend(batch)

    def check(self, path: Path) -> None:
        """After the power cut: every acknowledged event is read back, in order, once."""
        with Journal.open(path, retention=POLICY) as j:
            for session, acked in self.events.items():
                events = list(j.replay(session))
                ordinals = [e.ordinal for e in events]
                first = ordinals[0] if ordinals else 1
                assert ordinals == list(range(first, first + len(ordinals))), session
                found = [e.data for e in events if e.data not in self.maybe]
                if session == TRIMMED:  # (its window trims from the front)
                    assert found == acked[len(acked) - len(found) :], session
                    assert first > 1 or found == acked, session
                else:
                    assert first == 1, session
                    assert found == acked, (session, len(found), len(acked))
            assert j.verify().problems == []


class _Round:
    """Appends, churned sessions and maintenance on the simulated disk until the power
    goes, at a random disk call (after a random fault, in half the rounds)."""

    def __init__(self, path: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.path = path
        self.disk = SimulatedDisk(str(path), self.rng)
        self.acked = Acked()
        self.n = 0
        self.churn = 0
        self.compress = self.rng.random() < 0.5

    def payload(self, session: str) -> bytes:
        self.n += 1
        return f"{session}:{self.n}:".encode() + b"x" * self.rng.randrange(0, 700)

    def churn_session(self, j: Journal) -> None:
        """A session that gets history, maybe a snapshot, and an end: dead frames for
        compaction, an eviction and dead segments for retention."""
        self.churn += 1
        name = f"d{self.churn}"
        j.create_session(name)
        for _ in range(self.rng.randrange(2, 8)):
            j.append(name, [EventIn("m", self.payload(name))])
        if self.rng.random() < 0.5:
            j.compact_session(name, 1, b"snap")
        j.cancel_session(name)

    def step(self, j: Journal) -> None:
        roll = self.rng.random()
        if roll < 0.55:
            session = self.rng.choice((*KEPT, TRIMMED))
            batch = [self.payload(session) for _ in range(self.rng.randrange(1, 4))]
            self.acked.append(j, session, batch)
        elif roll < 0.7:
            self.churn_session(j)
        elif roll < 0.8:
            j.apply_retention()
        elif roll < 0.93:
            j.compact(dead_share=self.rng.choice([0.0, 0.2, 0.5]))
        else:
            j.verify(fix=True)

    def run(self) -> None:
        j = _open(self.path, self.disk, self.compress)
        try:
            for s in KEPT:
                j.create_session(s)
            j.create_session(TRIMMED, max_history_bytes=3000)
            self.disk.settle()
            self.disk.cut_at = self.disk.calls + self.rng.randrange(1, 1500)
            fault_at = self.rng.randrange(0, 60) if self.rng.random() < 0.5 else -1
            for count in range(100_000):
                if count == fault_at:
                    operation, code = self.rng.choice(FAULTS)
                    self.disk.fail(operation, code, self.rng.choice([1, 1, 3]))
                try:
                    self.step(j)
                except WriteOutcomeUnknown:
                    pass
                except StoreUnavailable:
                    if self.disk.dead:
                        break
        finally:
            with contextlib.suppress(Exception):
                j.close()
        self.disk.power_cut()


@pytest.mark.parametrize("seed", range(16))
def test_a_power_cut_amid_maintenance_loses_nothing_acknowledged(tmp_path: Path, seed: int) -> None:
    r = _Round(tmp_path / "s", seed)
    r.run()
    r.acked.check(r.path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(16, 400))
def test_a_power_cut_amid_maintenance_loses_nothing_acknowledged_many(
    tmp_path: Path, seed: int
) -> None:
    r = _Round(tmp_path / "s", seed)
    r.run()
    r.acked.check(r.path)


def _recover(path: Path, acked: Acked, compress: bool, cut: int, seed: int) -> int:
    """Open the store after a power cut, append, compact and apply retention, with the
    power going again at disk call `cut` of that (0: not); the disk calls it made."""
    disk = SimulatedDisk(str(path), random.Random(seed * 1000 + cut))
    disk.settle()
    start = disk.calls
    if cut:
        disk.cut_at = start + cut
    j = None
    try:
        j = _open(path, disk, compress)
        for k in range(4):
            session = KEPT[k % 2]
            acked.append(j, session, [f"{session}:after:{k}:".encode() + b"y" * 800])
        j.compact(dead_share=0.0)
        j.apply_retention()
    except StoreUnavailable:
        assert disk.dead
    finally:
        if j is not None:
            with contextlib.suppress(Exception):
                j.close()
    disk.power_cut()
    return disk.calls - start


def _second_cuts(tmp_path: Path, seed: int, stride: int) -> None:
    first = tmp_path / "first"
    r = _Round(first, seed)
    r.run()
    work = tmp_path / "s"
    shutil.copytree(first, work, symlinks=True)
    calls = _recover(work, r.acked.copy(), r.compress, 0, seed)
    for cut in range(1 + seed % stride, calls, stride):
        shutil.rmtree(work)
        shutil.copytree(first, work, symlinks=True)
        acked = r.acked.copy()
        _recover(work, acked, r.compress, cut, seed)
        acked.check(work)


@pytest.mark.parametrize("seed", range(4))
def test_a_power_cut_during_the_recovery_from_one_loses_nothing_acknowledged(
    tmp_path: Path, seed: int
) -> None:
    _second_cuts(tmp_path, seed, stride=11)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4, 40))
def test_a_power_cut_during_the_recovery_from_one_loses_nothing_acknowledged_many(
    tmp_path: Path, seed: int
) -> None:
    _second_cuts(tmp_path, seed, stride=1)


class StrikingDisk(SimulatedDisk):
    """A simulated disk whose disk calls from number `strike_at` on fail with EIO,
    `strikes` of them (two: a frame's sync, then the cut that would take it off)."""

    strike_at = -1
    strikes = 1

    def _enter(self, operation: str) -> None:
        super()._enter(operation)
        if self.strike_at <= self.calls < self.strike_at + self.strikes:
            raise OSError(errno.EIO, os.strerror(errno.EIO))


def _prepare(j: Journal, acked: Acked, what: str) -> None:
    """Sessions whose ended neighbours leave dead frames (compaction) or whole dead
    segments (retention) between acknowledged events."""
    rng = random.Random(what)
    for s in KEPT:
        j.create_session(s)
    j.create_session(TRIMMED)
    for n in range(6):
        j.create_session(f"d{n}")
        for k in range(12):
            j.append(f"d{n}", [EventIn("m", b"d" * 500)])
            if k % 4 == 0:
                session = KEPT[k // 4 % 2]
                acked.append(
                    j, session, [f"{session}:{n}:{k}:".encode() + b"x" * rng.randrange(600)]
                )
        j.cancel_session(f"d{n}")
    if what == "retention":
        j.create_session("whole")
        for _ in range(20):
            j.append("whole", [EventIn("m", b"z" * 700)])
        j.cancel_session("whole")


def _reopen(j: Journal, path: Path, disk: SimulatedDisk, compress: bool) -> Journal:
    """The journal of a process that ended on the error, opened again (as many times as
    the faults left fail it)."""
    with contextlib.suppress(StoreUnavailable):
        j.close()
    for _ in range(3):
        try:
            return _open(path, disk, compress)
        except StoreUnavailable:
            pass
    return _open(path, disk, compress)


def _struck(path: Path, what: str, compress: bool, how: str, at: int) -> int:
    """`what` (compact, seal, retention) with disk call `at` of it and of the appends
    after it struck (`how`: the power goes, or EIO then a reopen, or EIO at two calls in
    a row then a reopen); the calls made."""
    disk = StrikingDisk(str(path), random.Random(at))
    acked = Acked()
    j = _open(path, disk, compress)
    try:
        _prepare(j, acked, what)
        disk.settle()
        start = disk.calls
        if at and how == "cut":
            disk.cut_at = start + at
        elif at:
            disk.strike_at = start + at
            disk.strikes = 2 if how == "eio2" else 1
        try:
            if what == "compact":
                j.compact(dead_share=0.0)
            elif what == "retention":
                j.apply_retention()
        except StoreUnavailable:
            if how != "cut" and not disk.dead:
                j = _reopen(j, path, disk, compress)
        for k in range(3 if what == "seal" else 6):
            session = KEPT[k % 2]
            # (a seal: the first of these fills the active segment, and one rotates it)
            data = f"{session}:after:{k}:".encode() + b"p" * (1500 if what == "seal" else 900)
            try:
                acked.append(j, session, [data])
            except StoreUnavailable:
                if disk.dead:
                    break
                if how != "cut":
                    j = _reopen(j, path, disk, compress)
        calls = disk.calls - start
    finally:
        with contextlib.suppress(Exception):
            j.close()
    disk.power_cut()
    acked.check(path)
    return calls


def _strike_each(tmp_path: Path, what: str, compress: bool, how: str, stride: int) -> None:
    calls = _struck(tmp_path / "none", what, compress, how, 0)
    for at in range(1 + ("cut", "eio", "eio2").index(how) * stride // 3, calls + 1, stride):
        _struck(tmp_path / str(at), what, compress, how, at)
        shutil.rmtree(tmp_path / str(at))


STRUCK = [
    pytest.param(what, compress, how, id=f"{what}-{'compressed' if compress else 'plain'}-{how}")
    for what in ("compact", "seal", "retention")
    for compress in (False, True)
    for how in ("cut", "eio", "eio2")
]


@pytest.mark.parametrize(("what", "compress", "how"), STRUCK)
def test_each_disk_call_of_a_maintenance_step_struck_loses_nothing_acknowledged(
    tmp_path: Path, what: str, compress: bool, how: str
) -> None:
    """Every few disk calls (of a seal: every call), a different one each way."""
    _strike_each(tmp_path, what, compress, how, stride=2 if what == "seal" else 19)


@pytest.mark.slow
@pytest.mark.parametrize(("what", "compress", "how"), STRUCK)
def test_each_disk_call_of_a_maintenance_step_struck_loses_nothing_acknowledged_all(
    tmp_path: Path, what: str, compress: bool, how: str
) -> None:
    _strike_each(tmp_path, what, compress, how, stride=1)


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "compressed"])
def test_a_seal_after_a_failed_sync_with_os_durability_writes_its_frames_again(
    tmp_path: Path, compress: bool
) -> None:
    """Durability "os" writes frames without a sync; a rotation's sync of the segment it
    seals fails (EIO): Linux marks the pages clean without writing them. The next append
    seals the segment again and its sync "succeeds", writing nothing: a power cut then
    left the sealed segment's frames zeros, read as `JournalCorrupt`, with later segments
    intact. Sealed segments are taken as durable (their records may make other frames
    dead), so the sync after a failed one writes the frames again first. (Compressed:
    the copy, made from the page cache, is synced before it replaces the plain file.)"""
    path = tmp_path / "s"
    disk = SimulatedDisk(str(path), random.Random(7))
    acked: list[bytes] = []
    with Journal.open(
        path,
        segment_bytes=SEGMENT_BYTES,
        durability="os",
        compress_sealed=compress,
        file_ops=disk,
    ) as j:
        j.create_session("a")
        disk.settle()
        for n in range(3):  # (the fourth frame does not fit: its append seals)
            acked.append(b"%d:" % n + b"x" * 1000)
            j.append("a", [EventIn("m", acked[-1])])
        disk.fail("fsync", errno.EIO)
        with pytest.raises(StoreUnavailable):
            j.append("a", [EventIn("m", b"refused" + b"y" * 1000)])
        assert disk.faults.pop("fsync")[1] == 0
        for n in range(3, 6):
            acked.append(b"%d:" % n + b"x" * 1000)
            j.append("a", [EventIn("m", acked[-1])])
        sealed = sorted(os.listdir(path / "segments"))
    _power_cut_keeps_the_sealed_frames(disk, path, sealed, acked)


def test_a_failed_sync_of_a_torn_tails_cut_with_os_durability_is_remembered(
    tmp_path: Path,
) -> None:
    """Durability "os": a catch-up finds a torn frame past the head (another process's
    writer, killed mid-write: written here as such) and cuts it; the cut's sync fails
    (EIO), and Linux marks the segment's pages clean without writing them, this writer's
    acknowledged frames among them. The seal that follows must write them again, as
    after any failed sync of the segment: else the sealed segment's frames are zeros
    after a power cut."""
    path = tmp_path / "s"
    disk = SimulatedDisk(str(path), random.Random(7))
    acked: list[bytes] = []
    with Journal.open(path, segment_bytes=SEGMENT_BYTES, durability="os", file_ops=disk) as j:
        j.create_session("a")
        disk.settle()
        for n in range(2):
            acked.append(b"%d:" % n + b"x" * 1000)
            j.append("a", [EventIn("m", acked[-1])])
        log = SegmentLog(str(path / "segments"), b"", sync=False)
        last = list(log.frames())[-1][0]
        segment = path / "segments" / segment_name(last.segment)
        with open(segment, "r+b") as f:  # (the start of a frame, its writer killed)
            f.seek(last.offset)
            head = f.read(FRAME_HEADER_SIZE + 100)
            f.seek(last.end_offset)
            f.write(head)
        disk.fail("fsync", errno.EIO)
        with pytest.raises(StoreUnavailable):
            j.append("a", [EventIn("m", b"refused")])
        assert disk.faults.pop("fsync")[1] == 0
        for n in range(2, 6):  # (the third frame does not fit: its append seals)
            acked.append(b"%d:" % n + b"x" * 1000)
            j.append("a", [EventIn("m", acked[-1])])
        sealed = sorted(os.listdir(path / "segments"))
    _power_cut_keeps_the_sealed_frames(disk, path, sealed, acked)


def _power_cut_keeps_the_sealed_frames(
    disk: SimulatedDisk, path: Path, sealed: list[str], acked: list[bytes]
) -> None:
    """A segment was sealed (its sidecar among `sealed`); after a power cut the store
    opens with a prefix of `acked` holding at least the sealed segment's 3 frames: what
    "os" acknowledged in the active segment may be lost, the sealed one's not."""
    assert [name for name in sealed if name.endswith(".idx")], sealed
    disk.power_cut()
    with Journal.open(path) as j:
        found = [e.data for e in j.replay("a")]
        assert found == acked[: len(found)]
        assert len(found) >= 3
        assert j.verify().problems == []
