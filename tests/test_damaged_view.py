"""A damaged LMDB view (`STORE/index/data.mdb`): zeroed pages, garbage, bit flips and
truncation give `JournalCorrupt` naming the view, or the right answer after the view is
rebuilt; never a raw exception, a wrong answer or a crash (SPEC "Failure handling: a
damaged view").

The damage trials run in a child process (`_damage_trials.py`): LMDB kills a process
that maps a damaged file (SIGBUS, a failed assertion), and that must fail the test, not
pytest. Heavier sweeps are behind the `slow` marker.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import lmdb
import pytest
from _damage_trials import reads
from _view_entries import read_locations, replace_location, sealed_location

from journal import EventIn, Journal, JournalCorrupt
from journal._local.lmdbfile import pages_in_use
from journal._local.view_file import inspect_view

TRIALS = os.path.join(os.path.dirname(__file__), "_damage_trials.py")
ALLOWED = {"correct", "reported", "JournalCorrupt"}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("pristine") / "s"
    subprocess.run([sys.executable, TRIALS, "build", str(store)], check=True)
    return store


def _run(*args: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, TRIALS, *args], capture_output=True, text=True, timeout=600
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    finished = [line for line in lines if "results" in line]
    assert done.returncode == 0, (
        f"the child died (status {done.returncode}) after {lines[-1:] if lines else 'nothing'}:"
        f"\n{done.stderr[-2000:]}"
    )
    return finished


def _check(trials: list[dict[str, object]], fixed_correct: bool) -> None:
    assert trials
    for trial in trials:
        results = trial["results"]
        assert isinstance(results, dict)
        bad = {name: outcome for name, outcome in results.items() if outcome not in ALLOWED}
        assert not bad, f"{trial['damage']}: {bad}"
        if fixed_correct and "fix" in results:
            after = {n: o for n, o in results.items() if n.startswith("fixed") and o != "correct"}
            assert results["fix"] == "correct" and not after, f"{trial['damage']}: {after}"


def _trials(pristine: Path, tmp_path: Path, mode: str, readonly: bool, count: int) -> None:
    seed = os.environ.get("TEST_SEED", "11")
    trials = _run(
        "trials", str(pristine), str(tmp_path), mode, "1" if readonly else "0", seed, str(count)
    )
    _check(trials, fixed_correct=True)


@pytest.mark.parametrize(
    "readonly",
    # (the read-only trials, 3-4 s each, run under -m slow, as the sweep of both does)
    [False, pytest.param(True, marks=pytest.mark.slow)],
    ids=["writable", "readonly"],
)
@pytest.mark.parametrize("mode", ["zero", "garbage", "flip", "truncate"])
def test_a_damaged_view_is_journal_corrupt_or_rebuilt_never_a_crash(
    pristine: Path, tmp_path: Path, mode: str, readonly: bool
) -> None:
    """Every public read (and, writable, append, create, verify and verify(fix=True))
    on a store whose view was damaged while it was closed. Used to: SIGBUS on every
    truncation, an LMDB assertion (abort) on some zeroed pages, raw CorruptedError,
    DecodeError, struct.error, FileNotFoundError; some flips made sessions vanish."""
    _trials(pristine, tmp_path, mode, readonly, 6 if mode == "flip" else 4)


@pytest.mark.slow
@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "readonly"])
@pytest.mark.parametrize("mode", ["zero", "garbage", "flip", "truncate"])
def test_a_damaged_view_sweep(pristine: Path, tmp_path: Path, mode: str, readonly: bool) -> None:
    _trials(pristine, tmp_path, mode, readonly, 80)


@pytest.mark.parametrize("mode", ["zero", "garbage", "truncate"])
def test_a_view_damaged_while_open_is_reported_and_repaired(
    pristine: Path, tmp_path: Path, mode: str
) -> None:
    """Damage under an open writable journal: verify() reports the view (a VerifyProblem,
    not an exception), every call raises JournalCorrupt, verify(fix=True) rebuilds it in
    place and then everything reads as before."""
    store = tmp_path / "s"
    shutil.copytree(pristine, store)
    [trial] = _run("while-open", str(store), mode)
    results = trial["results"]
    assert isinstance(results, dict)
    assert results["verify"] == "reported", results
    _check([trial], fixed_correct=True)
    assert results["fixed append"] == "correct"


def _seal(key: bytes, payload: bytes) -> bytes:
    """A view value with a valid checksum (SPEC section 7.2): damage no checksum sees."""
    return payload + struct.pack(">I", zlib.crc32(payload, zlib.crc32(key)))


def _rewrite(store: Path, db: bytes, key: bytes, payload: bytes) -> None:
    env = lmdb.open(str(store / "index"), max_dbs=16, map_size=1 << 36)
    try:
        with env.begin(write=True) as txn:
            txn.put(key, _seal(key, payload), db=env.open_db(db, txn=txn))
    finally:
        env.close()


def _two_sessions(store: Path) -> None:
    with Journal.open(store) as j:
        j.create_session("a")
        j.create_session("b")
        j.append("a", [EventIn("m", b"a1")])
        j.append("b", [EventIn("m", b"b1")])


def test_an_index_entry_naming_a_missing_segment_is_journal_corrupt(tmp_path: Path) -> None:
    """Used to escape as a raw FileNotFoundError after the reader's retries."""
    store = tmp_path / "s"
    _two_sessions(store)
    payload = struct.pack(">QQQQQ", 1, 99999, 64, 0, 0)
    replace_location(store, 1, 1, sealed_location(1, payload))
    with Journal.open(store, readonly=True) as j, pytest.raises(JournalCorrupt) as caught:
        j.read("a")
    assert caught.value.segment == "index"
    assert "does not exist" in caught.value.detail


def test_the_cli_names_its_own_command_for_a_damaged_view(tmp_path: Path) -> None:
    """The view's damage through `journal read`: exit 7, and the way out as a command that
    runs as printed (until 2026-12-06 the CLI's message also named the library's
    `Journal.verify(fix=True)`, and `journal verify --fix` without the store given)."""
    from _cli_runs import run_cli

    store = tmp_path / "s"
    _two_sessions(store)
    payload = struct.pack(">QQQQQ", 1, 99999, 64, 0, 0)
    replace_location(store, 1, 1, sealed_location(1, payload))
    done = run_cli(store, "read", "-s", "a")
    assert done.returncode == 7, (done.stdout, done.stderr)
    assert "Journal.verify" not in done.stderr, done.stderr
    assert f"`journal --store {store} verify --fix`" in done.stderr, done.stderr


def test_an_index_entry_naming_another_sessions_frame_is_journal_corrupt(tmp_path: Path) -> None:
    """The entry of a's first event, pointed at b's frame (checksum intact): the reader
    must not answer with b's events or an empty page."""
    store = tmp_path / "s"
    _two_sessions(store)
    b_location = read_locations(store)[2, 1]
    replace_location(store, 1, 1, sealed_location(1, b_location[:40]))
    with Journal.open(store, readonly=True) as j, pytest.raises(JournalCorrupt) as caught:
        j.replay("a").__next__()
    assert caught.value.segment == "index"


def test_a_row_whose_incarnation_the_index_does_not_know_is_journal_corrupt(
    tmp_path: Path,
) -> None:
    """A row that decodes and passes its checksum but names an incarnation the
    `incarnations` database does not map back to it."""
    store = tmp_path / "s"
    _two_sessions(store)
    env = lmdb.open(str(store / "index"), max_dbs=16, map_size=1 << 36, readonly=True)
    with env.begin() as txn:
        raw = txn.get(b"b", db=env.open_db(b"sessions", txn=txn, create=False))
    env.close()
    import msgspec

    row = msgspec.msgpack.decode(raw[:-4])
    row[1] = 1  # b's row claims a's incarnation
    _rewrite(store, b"sessions", b"b", msgspec.msgpack.encode(row))
    with Journal.open(store, readonly=True) as j, pytest.raises(JournalCorrupt) as caught:
        j.get_session("b")
    assert caught.value.segment == "index"
    assert "incarnation" in caught.value.detail


def _as_format_1(store: Path) -> None:
    """Make the store's view what code before view formats wrote (format 1, before
    2026-12-01): values without checksums, no `format` entry."""
    env = lmdb.open(str(store / "index"), max_dbs=16, map_size=1 << 36)
    with env.begin(write=True) as txn:
        for name in (b"meta", b"sessions", b"incarnations", b"pins", b"feed"):
            db = env.open_db(name, txn=txn)
            for key, value in list(txn.cursor(db=db)):
                txn.put(key, value[:-4], db=db)
        # (Then, the events index was keyed by incarnation and first ordinal.)
        events = env.open_db(b"events", txn=txn)
        entries = list(txn.cursor(db=events))
        txn.drop(events)
        events = env.open_db(b"events", txn=txn)
        for key, value in entries:
            txn.put(key + value[:8], value[8:-4], db=events)
        txn.delete(b"format", db=env.open_db(b"meta", txn=txn))
    env.close()


def test_a_view_written_before_checksums_is_rebuilt(tmp_path: Path) -> None:
    """A view of format 1 (values without checksums, no `format` entry: what earlier
    code wrote) is rebuilt by a writer and read through a private view by a reader, never
    taken for damage an answer can come from."""
    store = tmp_path / "s"
    _two_sessions(store)
    _as_format_1(store)
    with Journal.open(store, readonly=True) as j:
        assert [e.data for e in j.replay("a")] == [b"a1"]
    with Journal.open(store) as j:
        assert [e.data for e in j.replay("b")] == [b"b1"]
        assert j.verify().ok


@pytest.mark.parametrize("recorded", ["1", "4", "7"])
def test_a_view_of_another_release_is_not_reported_as_damage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, recorded: str
) -> None:
    """A user who upgrades (or goes back) and runs `journal verify` before anything else
    finds a store whose view another release wrote: a read-only verify reported it as a
    damaged view (exit 7: "restore damaged segments from a backup"; a view of format 1,
    without checksums, as "the ... entry fails its checksum"), and the first writer
    logged the same. Found by an upgrade trial with stores of earlier commits. It is no
    problem (the next writer rebuilds it, as after a reboot), and the writer says what
    it is."""
    store = tmp_path / "s"
    _two_sessions(store)
    if recorded == "1":
        _as_format_1(store)
    else:
        _rewrite(store, b"meta", b"format", recorded.encode())
    with Journal.open(store, readonly=True) as j:
        assert [e.data for e in j.replay("a")] == [b"a1"]
        assert j.verify().problems == []
    with caplog.at_level(logging.WARNING, logger="journal"), Journal.open(store) as j:
        assert [e.data for e in j.replay("b")] == [b"b1"]
        assert j.verify().ok
    said = [r.getMessage() for r in caplog.records if "index" in r.getMessage()]
    release = "a newer" if recorded == "7" else "an older"
    assert len(said) == 1 and f"view format {recorded}, of {release} release" in said[0], said
    assert "damaged" not in said[0]


def test_a_checksummed_view_without_its_format_entry_is_damage(tmp_path: Path) -> None:
    """Not taken for another release's view: a view of format 1 has no checksums."""
    store = tmp_path / "s"
    _two_sessions(store)
    env = lmdb.open(str(store / "index"), max_dbs=16, map_size=1 << 36)
    with env.begin(write=True) as txn:
        txn.delete(b"format", db=env.open_db(b"meta", txn=txn))
    env.close()
    with Journal.open(store, readonly=True) as j:
        assert [e.data for e in j.replay("a")] == [b"a1"]
        [problem] = j.verify().problems
    assert "damaged" in problem.what and "format entry" in problem.what


def _pages(data: Path) -> tuple[int, int]:
    """(pages the file holds whole, the last used page its current meta page records):
    LMDB 0.9's meta pages 0 and 1, page size in the free database's record, last used
    page and transaction id after the two database records (lmdbfile.py's layout)."""
    raw = data.read_bytes()
    page_size = struct.unpack_from("<I", raw, 16 + 24)[0]
    metas = [struct.unpack_from("<QQ", raw, at + 16 + 24 + 96) for at in (0, page_size)]
    last_page = max(metas, key=lambda meta: meta[1])[0]
    return len(raw) // page_size, last_page


_FREE_TAIL = """
import lmdb, sys
env = lmdb.open(sys.argv[1], max_dbs=16, map_size=1 << 36)
with env.begin(write=True) as txn:
    db = env.open_db(b"meta", txn=txn)
    txn.put(b"\\xfftemporary", bytes(100_000), db=db)
    txn.delete(b"\\xfftemporary", db=db)
env.close()
"""


def test_a_view_ending_on_free_pages_is_sound(tmp_path: Path, caplog: Any) -> None:
    """LMDB does not write a page freed by the transaction that allocated it, so a sound
    data file can end before the last used page its meta page records, on free pages.
    Session churn with eviction made that happen about once per 1,000 sessions: the
    check before every transaction (file size >= last used page) called the file cut,
    raised JournalCorrupt and refused every later call of the journal, and the next open
    rebuilt the whole view. Made here at will by another process: a value of 25 pages
    written and deleted in one transaction."""
    store = tmp_path / "s"
    data = store / "index" / "data.mdb"
    with Journal.open(store) as j:
        j.create_session("a")
        j.append("a", [EventIn("m", b"1")])
        subprocess.run([sys.executable, "-c", _FREE_TAIL, str(data.parent)], check=True)
        whole, last_page = _pages(data)
        assert whole <= last_page  # (it ends on free pages)
        j.append("a", [EventIn("m", b"2")])
        assert [e.data for e in j.replay("a")] == [b"1", b"2"]
    assert inspect_view(str(data.parent)) is None
    subprocess.run([sys.executable, "-c", _FREE_TAIL, str(data.parent)], check=True)
    whole, last_page = _pages(data)
    assert whole <= last_page
    with caplog.at_level(logging.WARNING, logger="journal"), Journal.open(store) as j:
        j.append("a", [EventIn("m", b"3")])
        assert [e.data for e in j.replay("a")] == [b"1", b"2", b"3"]
        assert j.verify().ok
    assert not [r for r in caplog.records if "damaged" in r.getMessage()]


def test_a_view_cut_inside_pages_in_use_is_damage(tmp_path: Path) -> None:
    """The other side of the rule above: a file that ends before a page in use is damage
    at open (not only a file shorter than its last used page)."""
    store = tmp_path / "s"
    _two_sessions(store)
    data = store / "index" / "data.mdb"
    used = max(pages_in_use(str(data)))
    with open(data, "r+b") as f:
        f.truncate(used * 4096 + 100)  # (the last page in use, cut short)
    problem = inspect_view(str(store / "index"))
    assert problem is not None and "past the end" in problem.what


def test_threads_checking_the_view_while_it_grows_see_no_cut(tmp_path: Path) -> None:
    """The check before each transaction reads the size last seen, then the file's: the
    other order let a thread whose `stat` predates another thread's commits compare it
    with the size those commits had already recorded, and call the growing file cut
    (JournalCorrupt in the expiry timer, then in every call of the journal)."""
    failures: list[BaseException] = []
    done = threading.Event()
    with Journal.open(tmp_path / "s", durability="os") as j:
        j.create_session("reader")

        def read() -> None:
            try:
                while not done.is_set():
                    j.get_session("reader")
            except BaseException as e:  # (reported by the main thread)
                failures.append(e)

        readers = [threading.Thread(target=read) for _ in range(3)]
        for thread in readers:
            thread.start()
        try:
            for i in range(3000):
                j.create_session(f"s{i}", tags={"pad": "x" * 200})
                if failures:
                    break
        finally:
            done.set()
            for thread in readers:
                thread.join()
    assert not failures, failures[0]


def test_a_damaged_view_problem_names_the_way_out_once() -> None:
    # "... rebuilds it, and so does the next writable open); verify --fix rebuilds it"
    # (operator trial): a finding of the view's own checks names the way out already.
    from journal._local.verify import view_problem
    from journal._local.view_codec import corrupt

    for detail in (corrupt("a row fails its checksum").detail, "its data file is short"):
        assert view_problem(detail).what.count("verify --fix") == 1, detail


class _Unhurried:
    """A journal whose `watch_sessions` returns 0.5 s late: the trials' process as a
    loaded machine may run it."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def watch_sessions(self, cursor: str | None = None, stop: Any = None) -> Any:
        time.sleep(0.5)
        return self.journal.watch_sessions(cursor, stop)


def test_the_trials_lifecycle_read_waits_for_its_snapshot(tmp_path: Path) -> None:
    """The damage trials' lifecycle read (watch_sessions until a timer sets `stop`) timed
    its stop from the call: a process not run for that long (0.3 s, the sweep on a loaded
    machine) had `stop` set before the startup snapshot was read and got [] from a sound
    private view, reported as "garbage in page 8: {'lifecycle': 'wrong []'}" although the
    open had found the damage (page 8 is always an `events` page there, and garbage in it
    fails the page-number check) and read through a private view, which answered right."""
    store = tmp_path / "s"
    _two_sessions(store)
    with Journal.open(store, readonly=True) as j:
        assert reads(j)["lifecycle"]() == ["a", "b"]
        assert reads(_Unhurried(j))["lifecycle"]() == ["a", "b"]  # type: ignore[arg-type]
