"""Files of a store replaced by something that is no file (SPEC 14.1, "Other files").

A FIFO (a mistaken or hostile `mkfifo`) in place of a store file made every open of it
block in open() for ever, waiting for a writer: no error, no timeout. Every file of the
store is now opened with O_NONBLOCK and checked to be a regular file (`files.open_regular`;
LMDB's files are checked before LMDB opens them), so each call returns or raises a
`JournalError` that names the file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

from journal import EventIn, Journal, JournalError

_WAIT_S = 5.0


def _filled(path: Path, events: int = 60) -> None:
    """A store whose session 'a' spans several sealed segments (with sidecars), a view,
    a view-boot marker, a key file and a feed floor."""
    with Journal.open(path, create=True, segment_bytes=8192) as j:
        for i in range(events):
            j.append("a", [EventIn("e", bytes([i]) * 500)], create=True)


def _sealed(path: Path, suffix: str) -> str:
    names = sorted(n for n in os.listdir(path / "segments") if n.endswith(suffix))
    return str(path / "segments" / names[0 if suffix == ".idx" else 1])


def _active(path: Path) -> str:
    names = sorted(n for n in os.listdir(path / "segments") if n.endswith(".seg"))
    return str(path / "segments" / names[-1])


def _unblock(fifo: str) -> None:
    """Let an open() of `fifo` blocked for its other end go: a reader end appears (for a
    writer waiting), then a writer end (for a reader waiting), and both close."""
    with contextlib.ExitStack() as ends:
        for flags in (os.O_RDONLY, os.O_WRONLY):
            with contextlib.suppress(OSError):
                end = os.open(fifo, flags | os.O_NONBLOCK)
                ends.callback(os.close, end)


def _outcome(fifo: str, call: Callable[[], object]) -> object:
    """What `call` returned or raised; fails when it was still blocked after 5 s."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(_WAIT_S)
    hung = thread.is_alive()
    for _ in range(20):  # (code that opens the FIFO again and again is left blocked)
        if not thread.is_alive():
            break
        _unblock(fifo)
        thread.join(0.5)
    assert not hung, f"blocked for {_WAIT_S} s on the FIFO in place of {fifo}"
    return outcome[0]


def _use(path: Path, readonly: bool) -> list[object]:
    """Open the store, replay, read the registry and verify: what each gave."""
    with Journal.open(path, readonly=readonly) as j:
        return [len(list(j.replay("a"))), len(list(j.list_sessions())), j.verify().problems]


_CHILD = r"""
import sys
from journal import Journal, JournalError
try:
    with Journal.open(sys.argv[1], readonly=sys.argv[2] == "1") as j:
        print([len(list(j.replay("a"))), len(list(j.list_sessions())), j.verify().problems])
except JournalError as e:
    print("error", e)
"""


def _outcome_in_a_child(fifo: str, store: Path, readonly: bool) -> object:
    """`_use` in a child process: LMDB's open of a FIFO blocks holding the interpreter
    lock, so a thread of this process could not even time it out. A list means it
    worked; else the error's text."""
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(store), "1" if readonly else "0"],
            capture_output=True,
            text=True,
            timeout=_WAIT_S * 4,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"blocked for {_WAIT_S * 4} s on the FIFO in place of {fifo}")
    assert done.returncode == 0, done.stderr[-2000:]
    if done.stdout.startswith("error "):
        return JournalError(done.stdout[len("error ") :])
    return list(done.stdout)


# file -> where it is (relative to the store, or found by a function)
_VICTIMS: dict[str, Callable[[Path], str]] = {
    "sealed segment": lambda p: _sealed(p, ".seg"),
    "sidecar": lambda p: _sealed(p, ".idx"),
    "active segment": _active,
    "store.json": lambda p: str(p / "store.json"),
    "keys": lambda p: str(p / "keys"),
    "view-boot": lambda p: str(p / "view-boot"),
    "feed-floor": lambda p: str(p / "segments" / "feed-floor"),
    "index/data.mdb": lambda p: str(p / "index" / "data.mdb"),
    "index/lock.mdb": lambda p: str(p / "index" / "lock.mdb"),
}


@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "readonly"])
@pytest.mark.parametrize("victim", list(_VICTIMS))
def test_a_fifo_in_place_of_a_store_file_is_reported_not_waited_on(
    tmp_path: Path, victim: str, readonly: bool
) -> None:
    """SPEC 14.1: a file that is no file is damage like bad bytes (`JournalCorrupt`, or
    `StoreUnavailable` / the error of the file it replaced, naming it), or is taken as
    missing where a missing file is fine (a sidecar, the feed floor, the view's files:
    rebuilt); never a hang."""
    store = tmp_path / "s"
    _filled(store)
    fifo = _VICTIMS[victim](store)
    os.unlink(fifo)
    os.mkfifo(fifo)
    if victim.startswith("index/"):
        got = _outcome_in_a_child(fifo, store, readonly)
    else:
        got = _outcome(fifo, lambda: _use(store, readonly))
    if isinstance(got, list):
        return  # used through a rebuilt or private view, or around the missing file
    assert isinstance(got, JournalError), repr(got)
    name = os.path.basename(fifo)
    assert name in str(got), got
    assert "FIFO" in str(got), got


@pytest.mark.parametrize("call", ["replay", "verify", "watch"])
def test_a_fifo_in_place_of_a_sealed_segment_is_reported_not_waited_on(
    tmp_path: Path, call: str
) -> None:
    """Reads that meet it (a read-only journal's replay, verify and watch from the start)
    raise `JournalCorrupt` naming the segment, or verify reports it."""
    store = tmp_path / "s"
    _filled(store)
    victim = _sealed(store, ".seg")
    os.unlink(victim)
    os.mkfifo(victim)

    def run() -> object:
        with Journal.open(store, readonly=True) as j:
            if call == "replay":
                return list(j.replay("a"))
            if call == "watch":
                return next(iter(j.watch("a", stop=threading.Event())), None)
            return j.verify().problems

    got = _outcome(victim, run)
    if call == "verify":
        assert isinstance(got, list) and got, got
        assert any(os.path.basename(victim) in str(p) for p in got), got
    else:
        assert isinstance(got, JournalError) and got.code == "JOURNAL_CORRUPT", repr(got)
        assert os.path.basename(victim) in str(got) and "FIFO" in str(got), got


def test_a_dangling_symlink_in_place_of_a_sealed_segment_is_named_for_itself(
    tmp_path: Path,
) -> None:
    """A replay that met it said the compressed form (`.seg.zst`) of the segment was
    missing (the plain file "did not exist", so the reader looked for the other form);
    it names the `.seg` as a symbolic link now (found by an adversarial trial)."""
    store = tmp_path / "s"
    _filled(store)
    victim = _sealed(store, ".seg")
    os.unlink(victim)
    os.symlink(str(tmp_path / "nowhere"), victim)
    with Journal.open(store, readonly=True) as j, pytest.raises(JournalError) as caught:
        list(j.replay("a"))
    assert caught.value.code == "JOURNAL_CORRUPT", repr(caught.value)
    message = str(caught.value)
    assert os.path.basename(victim) in message and ".seg.zst" not in message, message
    assert "symbolic link" in message, message


@pytest.mark.parametrize("keep_index", [True, False])
def test_a_read_only_open_that_fails_on_a_damaged_segment_leaves_nothing_open(
    tmp_path: Path, keep_index: bool
) -> None:
    """A read-only open whose private view could not be built (the active segment is not
    a segment file) raised `JournalCorrupt` but left the private view's LMDB environment
    open (3 descriptors after 3 failed opens), and its files stayed registered as open in
    this process, so a later store whose files got the same inode numbers was refused as
    "open already" (found by the hostile-files fuzz test)."""
    store = tmp_path / "s"
    _filled(store)
    with open(_active(store), "wb") as f:
        f.write(b"not a segment" * 10)
    if not keep_index:
        shutil.rmtree(store / "index")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(JournalError) as caught:
            Journal.open(store, readonly=True)
        assert caught.value.code == "JOURNAL_CORRUPT", repr(caught.value)
    assert len(os.listdir("/proc/self/fd")) == before


def test_an_lmdb_error_of_a_writable_open_gives_no_read_only_advice() -> None:
    """'a store that was never opened for writing cannot be opened read-only' came with
    every LMDB error of an open (a FIFO in place of index/lock.mdb opened writable said
    it): that advice belongs to read-only opens only."""
    from journal._local.failures import open_failure

    error = lmdb.Error("/s/index: Invalid argument")
    writable = open_failure(error, "/s", readonly=False)
    readonly = open_failure(error, "/s", readonly=True)
    assert writable is not None and readonly is not None
    assert "read-only" not in writable.message, writable.message
    assert "never opened for writing" in readonly.message, readonly.message


_DANGLING_CHILD = r"""
import sys
from journal import Journal, JournalError
try:
    with Journal.open(sys.argv[1]) as j:
        if sys.argv[2] == "compact":
            j.compact(dead_share=0.0)
        elif sys.argv[2] == "own":
            with j.own("a"):
                pass
    print("ok")
except JournalError as e:
    print("error", type(e).__name__, e)
"""


def _owner_lock(path: Path) -> str:
    import hashlib

    return str(path / "locks" / f"owner-{hashlib.sha256(b'a').hexdigest()[:32]}.lock")


@pytest.mark.parametrize(
    ("victim", "call"),
    [
        ("index/lock.mdb", "open"),
        ("index/data.mdb", "open"),
        ("locks/open.lock", "open"),
        ("segments/.files.lock", "compact"),
        ("owner lock", "own"),
    ],
)
def test_a_dangling_symlink_in_place_of_a_lock_file_is_reported_not_spun_on(
    tmp_path: Path, victim: str, call: str
) -> None:
    """A lock file is opened, or created when missing: O_CREAT | O_EXCL refuses the name
    of a dangling symbolic link (EEXIST) and the open of it finds nothing (ENOENT), so
    the create-or-open loop spun at full CPU for ever (a writable open, compact(),
    own()). Now it is `StoreUnavailable` naming the file; in the view (`index/`) it is
    a damaged view, which a writable open replaces (before, a dangling `data.mdb` made
    every writable open fail: LMDB could not create the link's target)."""
    store = tmp_path / "s"
    _filled(store)
    path = _owner_lock(store) if victim == "owner lock" else str(store / victim)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(str(tmp_path / "gone" / "lock"), path)
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(
            [sys.executable, "-c", _DANGLING_CHILD, str(store), call],
            capture_output=True,
            text=True,
            timeout=_WAIT_S * 4,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"spun for {_WAIT_S * 4} s on the dangling symlink at {path}")
    assert done.returncode == 0, done.stderr[-2000:]
    if victim.startswith("index/"):
        assert done.stdout == "ok\n", done.stdout
        assert "symbolic link to a missing file" in done.stderr, done.stderr
        with Journal.open(store) as j:
            assert len(list(j.replay("a"))) == 60
            assert j.verify().problems == []
        return
    assert done.stdout.startswith("error StoreUnavailable"), done.stdout
    assert os.path.basename(path) in done.stdout, done.stdout
    assert "symbolic link" in done.stdout, done.stdout


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_an_owner_lock_file_that_is_no_file_is_store_unavailable(tmp_path: Path, kind: str) -> None:
    """own() let the OS error of its lock file escape (IsADirectoryError, the raw
    `NotRegularFile` of a FIFO): every other call makes it `StoreUnavailable` naming the
    file (SPEC 14.1), and so does own() now; nothing is recorded."""
    from journal import StoreUnavailable

    store = tmp_path / "s"
    _filled(store, events=3)
    path = _owner_lock(store)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mkdir(path) if kind == "directory" else os.mkfifo(path)
    with Journal.open(store) as j:
        with pytest.raises(StoreUnavailable) as caught:
            j.own("a")
        assert os.path.basename(path) in str(caught.value), caught.value
        assert "move the file named away" in str(caught.value), caught.value  # (not disk)
        assert j.get_session("a").owner is None
        os.rmdir(path) if kind == "directory" else os.unlink(path)
        with j.own("a") as owner:
            assert owner.generation == 1
