"""The retention pass a seal triggers reads only the rows that can have changed (SPEC 8,
"What a pass reads"): sessions with events in a segment sealed since the last committed
pass, and sessions with an age window of their own. A full pass (an explicit
`apply_retention`, the first pass of a process, or a policy with time rules) reads every
row.

How many rows a pass read is counted at the engine's fault point `retention.rows`. The
property that matters: after the narrow passes, a full pass finds nothing more to trim
than the narrow passes would once the active segment is sealed.
"""

from __future__ import annotations

import contextlib
import os
import random
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import lmdb
import pytest

from journal import EventIn, Journal, RetentionPolicy, SessionExists
from journal._local.files import FileOps

SEGMENT = 64 << 10
WINDOW = 8 << 10


class Probe(FileOps):
    """Records the rows each retention pass read; can fail the next narrow pass once."""

    def __init__(self) -> None:
        self.passes: list[int] = []
        self.fail_next_sidecar_read = False

    def point(self, name: str, detail: object = None) -> None:
        if name == "retention.rows":
            assert isinstance(detail, int)
            self.passes.append(detail)
        elif name == "retention.read_sidecar" and self.fail_next_sidecar_read:
            self.fail_next_sidecar_read = False
            raise OSError(5, "injected: sidecar unreadable")


def _open(path: Path, probe: FileOps, window: int = WINDOW) -> Journal:
    return Journal.open(
        path,
        durability="os",
        segment_bytes=SEGMENT,
        retention=RetentionPolicy(max_history_bytes=window),
        file_ops=probe,
    )


def _seal(j: Journal) -> None:
    """Append to a session with a window of its own until the active segment is sealed
    (its appends exceed no window, so they make no trim of their own)."""
    with contextlib.suppress(SessionExists):
        j.create_session("sealer", max_history_bytes=1 << 40)
    before = j.stats().segments
    while j.stats().segments == before:
        j.append("sealer", [EventIn("pad", b"p" * 4000)])


def test_a_pass_after_a_seal_reads_the_rows_of_the_sessions_that_appended(tmp_path: Path) -> None:
    probe = Probe()
    with _open(tmp_path / "store", probe) as j:
        for n in range(300):
            j.create_session(f"idle{n:03d}")
        j.create_session("hot")
        for _ in range(3):  # the first sweep of this process reads every row
            _seal(j)
        probe.passes.clear()
        for _ in range(40):
            j.append("hot", [EventIn("m", b"h" * 3000)])
        _seal(j)
        assert probe.passes, "no retention pass ran after the seals"
        assert max(probe.passes) <= 2, f"passes read {probe.passes} rows: not only hot, sealer"
        assert j.get_session("hot").first_ordinal > 1, "hot's window was not applied"
        probe.passes.clear()
        j.apply_retention()  # explicit: a full pass
        assert probe.passes == [302]


def test_the_first_pass_of_a_process_reads_every_row_for_a_narrower_policy(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    with _open(store, Probe(), window=1 << 30) as j:
        j.create_session("old")
        for _ in range(10):
            j.append("old", [EventIn("m", b"o" * 3000)])
        _seal(j)
        assert j.get_session("old").first_ordinal == 1
    probe = Probe()
    with _open(store, probe) as j:  # a window of 8 KiB now: "old" no longer appends
        _seal(j)
        assert probe.passes[0] == 2
        assert j.get_session("old").first_ordinal > 1, "the reopened policy was not applied"


@pytest.mark.parametrize("seed", range(4))
def test_narrow_passes_leave_nothing_for_a_full_pass(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    probe = Probe()
    with _open(tmp_path / "store", probe) as j:
        sessions = [f"s{n}" for n in range(12)]
        for session_id in sessions:
            j.create_session(session_id)
        own = {"s0": 20 << 10, "s1": 2 << 10}  # windows of their own
        for session_id, window in own.items():
            j.create_session(f"{session_id}w", max_history_bytes=window)
            sessions.append(f"{session_id}w")
        for step in range(700):
            session_id = rng.choice(sessions)
            size = rng.choice((100, 900, 2500))
            j.append(session_id, [EventIn("m", bytes([65 + step % 26]) * size)])
            if step == 350:
                probe.fail_next_sidecar_read = True  # one pass fails: the next covers it
        _seal(j)
        trimmed = [s for s in sessions if j.get_session(s).first_ordinal > 1]
        assert len(trimmed) >= 6, "the run trimmed too little to test anything"
        report = j.apply_retention()
        assert report.trimmed_sessions == [], "a narrow pass missed a session over its window"
        assert max(probe.passes[1:-1]) < len(sessions) + 1


def test_a_narrow_pass_applies_a_sessions_own_age_window_without_new_events(
    tmp_path: Path,
) -> None:
    probe = Probe()
    with _open(tmp_path / "store", probe, window=1 << 30) as j:
        # (A window of 2 s: with 300 ms a loaded machine took longer than that from the
        # appends to the second seal, which then applied it already.)
        j.create_session("aged", max_history_age_ms=2000)
        for n in range(200):
            j.create_session(f"idle{n:03d}")
        for _ in range(3):
            j.append("aged", [EventIn("m", b"a" * 1000)])
        _seal(j)  # the first sweep: nothing is old yet
        _seal(j)
        assert j.get_session("aged").first_ordinal == 1
        time.sleep(2.1)
        probe.passes.clear()
        _seal(j)  # "aged" has no events in the segment sealed now
        assert probe.passes and max(probe.passes) <= 2
        assert j.get_session("aged").first_ordinal == 4, "its own age window was not applied"


def test_a_failed_pass_leaves_its_segments_to_the_next_one(tmp_path: Path) -> None:
    probe = Probe()
    with _open(tmp_path / "store", probe) as j:
        j.create_session("burst")
        for _ in range(3):
            _seal(j)  # (the first sweep, and a segment for the cache)
        for _ in range(20):
            j.append("burst", [EventIn("m", b"b" * 1000)])
        probe.fail_next_sidecar_read = True
        _seal(j)  # its pass fails reading the sealed segment's sidecar
        assert not probe.fail_next_sidecar_read, "the injected failure did not happen"
        assert j.get_session("burst").first_ordinal == 1
        for _ in range(2):
            _seal(j)  # "burst" appends no more: only the segment it left names it
        assert j.get_session("burst").first_ordinal > 1, "the failed pass's segment was skipped"


def test_a_view_without_the_aged_index_is_rebuilt_with_it(tmp_path: Path) -> None:
    """A view of format 3 (before the `aged` database): the first writer rebuilds it, and
    the rebuilt index names the session with an age window of its own."""
    store = tmp_path / "store"
    with _open(store, Probe(), window=1 << 30) as j:
        j.create_session("aged", max_history_age_ms=300)
        j.append("aged", [EventIn("m", b"a" * 1000)])
        j.append("aged", [EventIn("m", b"a" * 1000)])
    env = lmdb.open(str(store / "index"), max_dbs=16, map_size=1 << 36)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"aged", txn=txn), delete=True)
        payload = b"3"
        seal = payload + struct.pack(">I", zlib.crc32(payload, zlib.crc32(b"format")))
        txn.put(b"format", seal, db=env.open_db(b"meta", txn=txn))
    env.close()
    probe = Probe()
    with _open(store, probe, window=1 << 30) as j:
        _seal(j)  # (the first sweep)
        time.sleep(0.4)
        probe.passes.clear()
        _seal(j)
        assert probe.passes and max(probe.passes) <= 2
        assert j.get_session("aged").first_ordinal == 3


_OTHER_POLICY = """
import sys
from journal import EventIn, Journal, RetentionPolicy
from test_retention_narrow import SEGMENT, WINDOW, _seal
policy = RetentionPolicy(max_history_bytes=1 << 30)
with Journal.open(sys.argv[1], durability="os", segment_bytes=SEGMENT, retention=policy) as j:
    j.create_session("S")
    for _ in range(10):
        j.append("S", [EventIn("m", b"s" * 3000)])
    for _ in range(4):
        _seal(j)  # its passes, under its own (wider) window, cover these segments
# The 8 KiB window recorded again (the last recording is every writer's: SPEC 8), by an
# open that runs no pass.
policy = RetentionPolicy(max_history_bytes=WINDOW)
Journal.open(sys.argv[1], durability="os", segment_bytes=SEGMENT, retention=policy).close()
"""


def test_passes_under_another_processs_policy_do_not_count_as_this_ones(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    env = dict(os.environ)
    tests = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, os.getcwd(), env.get("PYTHONPATH")]))
    with _open(store, Probe()) as j:  # an 8 KiB window
        for _ in range(3):
            _seal(j)  # (this process's first sweep is behind it)
        subprocess.run([sys.executable, "-c", _OTHER_POLICY, str(store)], check=True, env=env)
        _seal(j)
        assert j.get_session("S").first_ordinal > 1, "S was never checked against 8 KiB"
        assert j.apply_retention().trimmed_sessions == []


def test_narrow_passes_apply_the_window_to_imported_sessions(tmp_path: Path) -> None:
    """An import adds a session's bytes without an append to the active segment: its
    events were staged in segments that sealed (and that narrow passes covered, skipping
    the invisible staged rows) before the commit. No narrow pass looked at that session
    again: an imported session of 5 MB stayed whole under a window of 8 KiB through
    every later seal, until an explicit pass (found by an adversarial trial). The commit
    of an import makes the next pass cover every sealed segment."""
    import io

    with Journal.open(tmp_path / "source", durability="os") as source:
        for session_id in ("A", "B"):
            source.create_session(session_id)
            for _ in range(5):
                source.append(session_id, [EventIn("m", os.urandom(10_000)) for _ in range(100)])
        archive = io.BytesIO()
        source.export_sessions(None, archive)
    probe = Probe()
    with _open(tmp_path / "store", probe) as j:
        for _ in range(2):  # the first pass of this process reads every row
            _seal(j)
        j.import_sessions(io.BytesIO(archive.getvalue()))
        for _ in range(3):
            _seal(j)
        kept = {s: j.get_session(s).first_ordinal for s in ("A", "B")}
        assert all(first > 1 for first in kept.values()), kept
        assert j.apply_retention().trimmed_sessions == []


def test_a_pass_after_an_import_reads_the_imported_sessions_not_every_row(
    tmp_path: Path,
) -> None:
    """An import's commit made the next pass cover every sealed segment (so that it
    looked at the imported sessions, whose events lie in segments passes covered while
    they were staged), and so read every row with events in any of them: each import,
    even of one small session, made the next sealing append wait for what a full pass
    costs (measured: 5.5 ms without an import, 337-370 ms after one, 50,000 sessions;
    found by review). The pass after an import now covers the sealed segments from the
    one holding the first imported session's staging record on."""
    import io

    with Journal.open(tmp_path / "source", durability="os") as source:
        for session_id in ("A", "B"):
            source.create_session(session_id)
            for _ in range(5):  # over 4 MiB: staged in several frames, so a window can cut
                source.append(session_id, [EventIn("m", os.urandom(10_000)) for _ in range(100)])
        archive = io.BytesIO()
        source.export_sessions(None, archive)
    probe = Probe()
    with _open(tmp_path / "store", probe) as j:
        for n in range(300):
            j.create_session(f"idle{n:03d}")
            j.append(f"idle{n:03d}", [EventIn("m", b"i")])
        for _ in range(3):  # the first pass of this process reads every row
            _seal(j)
        probe.passes.clear()
        j.import_sessions(io.BytesIO(archive.getvalue()))
        for _ in range(2):
            _seal(j)
        assert all(j.get_session(s).first_ordinal > 1 for s in ("A", "B"))
        assert probe.passes and max(probe.passes) <= 4, f"passes read {probe.passes} rows"
        assert j.apply_retention().trimmed_sessions == []
