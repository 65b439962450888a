"""A journal inherited across fork(): the child can close its copy at any moment, without
hanging and without taking anything from the parent (SPEC 7, "Across fork()").

Closing an inherited LMDB environment waits for the operations the parent's threads had
in flight when it forked, which never finish in the child; so the child's close leaves the
environments alone. Each round forks while the parent's threads commit and read, so some
fork lands inside an LMDB call (before the fix, 21 children of 30 hung in close()); fork()
waits for transactions in flight, so the child can also open the store again itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from journal import EventIn, Journal, JournalClosed, StoreUnavailable

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

ROUNDS = 12
CHILD_S = 20.0  # a bound for liveness only: a hung child is killed and the test fails


def _wait_child(pid: int) -> int | None:
    """The child's exit code, or None if it had to be killed (it hung)."""
    deadline = time.monotonic() + CHILD_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def _fork_and_close(j: Journal, reopen: Path | None = None) -> int | None:
    """Fork; the child closes its copy of `j` (and, with `reopen`, then opens the store
    there itself and appends one event to session "s")."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            j.close()
            j.close()  # (idempotent)
            if reopen is not None:
                with Journal.open(reopen, durability="os") as own:
                    own.append("s", [EventIn("child", str(os.getpid()).encode())])
            code = 0
        finally:
            os._exit(code)
    return _wait_child(pid)


def test_a_child_closes_its_copy_while_the_parent_commits_and_reads(tmp_path: Path) -> None:
    j = Journal.open(tmp_path / "store", durability="os")
    j.create_session("s")
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            while not stop.is_set():
                j.append("s", [EventIn("m", b"x" * 500)] * 10)
        except BaseException as e:
            errors.append(e)

    def read() -> None:
        try:
            while not stop.is_set():
                j.read("s", cursor=None, max_bytes=1 << 16)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write) for _ in range(2)]
    threads.append(threading.Thread(target=read))
    for t in threads:
        t.start()
    try:
        codes = []
        for n in range(ROUNDS):
            time.sleep(0.02)
            codes.append(_fork_and_close(j, reopen=tmp_path / "store" if n % 2 else None))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert codes == [0] * ROUNDS, "a child hung (None) or failed closing its copy"
    assert errors == []
    # The parent's journal is whole and still takes appends.
    j.append("s", [EventIn("m", b"last")])
    ordinals = [e.ordinal for e in j.replay("s")]
    assert ordinals == list(range(1, len(ordinals) + 1))
    assert len([e for e in j.replay("s") if e.type == "child"]) == ROUNDS // 2
    j.close()
    with Journal.open(tmp_path / "store") as again:
        assert [e.ordinal for e in again.replay("s")] == ordinals


def test_a_child_leaves_the_parents_private_view_of_a_read_only_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
        j.append("s", [EventIn("m", b"one")])
    shutil.rmtree(store / "index")  # no shared view: a read-only journal builds a private one
    private_root = tmp_path / "tmp"
    private_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_root))
    reader = Journal.open(store, readonly=True)
    private = list(private_root.iterdir())
    assert len(private) == 1, "expected one private view directory"
    assert _fork_and_close(reader) == 0
    assert private[0].is_dir(), "the child deleted the parent's private view"
    with Journal.open(store, durability="os") as j:
        j.append("s", [EventIn("m", b"two")])
    assert [e.data for e in reader.replay("s")] == [b"one", b"two"]
    reader.close()
    assert not private[0].exists(), "the parent's close removes its private view"


_READERS = """
import sys, lmdb
env = lmdb.open(sys.argv[1], readonly=True, max_dbs=16)
print(env.readers())
"""


def _reader_pids(store: Path) -> list[str]:
    """The pids in the store's LMDB reader table, as another process lists them."""
    out = subprocess.run(
        [sys.executable, "-c", _READERS, str(store / "index")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.split()[0] for line in out.splitlines()[1:] if line.strip()]


def test_the_parents_reader_slots_survive_a_childs_close(tmp_path: Path) -> None:
    """LMDB frees, in the shared reader table, the slots of the transactions a closing
    copy of an environment holds. The parent's reads after a child closed its copy must
    still be registered there (or a writer may reuse the pages they read)."""
    store = tmp_path / "store"
    j = Journal.open(store, durability="os")
    j.create_session("s")
    j.append("s", [EventIn("m", b"x")])
    for _ in range(3):
        j.read("s", cursor=None, max_bytes=1 << 16)
    assert _fork_and_close(j) == 0
    listed: list[str] = []

    def during_verify(done: int, total: int) -> None:  # (inside verify's read transaction)
        if not listed:
            listed.extend(_reader_pids(store))

    assert j.verify(progress=during_verify).ok
    assert listed, "verify reported no progress"
    assert str(os.getpid()) in listed, f"the parent's read is not in the reader table: {listed}"
    j.close()


def test_a_fork_from_inside_a_transaction_leaves_the_parents_transaction_registered(
    tmp_path: Path,
) -> None:
    """A callback that forks while the journal is inside a read transaction (verify's
    progress): the child's close leaves its copies of the environments alone, so the
    parent's transaction keeps its reader slot; opening the store again in that child is
    refused with an error saying why."""
    store = tmp_path / "store"
    j = Journal.open(store, durability="os")
    j.create_session("s")
    j.append("s", [EventIn("m", b"x")])
    seen: list[object] = []

    def fork_inside(done: int, total: int) -> None:
        if seen:
            return
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                j.close()
                try:
                    Journal.open(store, durability="os").close()
                    code = 2  # (it must be refused here)
                except StoreUnavailable as e:
                    code = 0 if "inherited across fork()" in str(e) else 3
            finally:
                os._exit(code)
        seen.append(_wait_child(pid))
        seen.append(_reader_pids(store))

    assert j.verify(progress=fork_inside).ok
    assert seen[0] == 0, "the child failed (2: reopened, 3: another error)"
    assert str(os.getpid()) in seen[1], "the child's close freed the parent's reader slot"
    j.close()


def test_a_child_iterating_an_inherited_watch_gets_journal_closed_and_harms_nothing(
    tmp_path: Path,
) -> None:
    """A stream inherited across fork() and iterated in the child took reader slots of
    the store's lock file until every process's reads failed (MDB_READERS_FULL): the
    child's page read refuses instead, and the parent reads and writes on."""
    store = tmp_path / "store"
    j = Journal.open(store, durability="os")
    j.append("s", [EventIn("m", b"0")], create=True)
    stop = threading.Event()
    for stream in (j.watch("s", stop=stop), j.watch_sessions(stop=stop)):
        next(stream)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                try:
                    for _ in stream:
                        pass
                except JournalClosed as e:
                    code = 0 if "forked child" in str(e) else 2
            finally:
                os._exit(code)
        assert _wait_child(pid) == 0
        stream.close()
    j.append("s", [EventIn("m", b"1")])
    assert [e.data for e in j.read("s").events] == [b"0", b"1"]
    with Journal.open(store, readonly=True) as other:  # (a second open)
        assert other.get_session("s").last_ordinal == 2
    j.close()


def test_a_child_opens_a_store_its_inherited_journal_holds(tmp_path: Path) -> None:
    """`Journal.open` in a forked child (a multiprocessing worker, say) refused the store
    while the parent's journal, unusable there, still held it, and that journal's error
    told it to open its own: the child's open closes the inherited one first."""
    store = tmp_path / "store"
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with Journal.open(store, durability="os") as own:
                    own.append("s", [EventIn("child", b"")])
                try:
                    j.get_session("s")
                except JournalClosed:
                    code = 0
            finally:
                os._exit(code)
        assert _wait_child(pid) == 0
        j.append("s", [EventIn("parent", b"")])
        assert [e.type for e in j.replay("s")] == ["child", "parent"]


def test_a_child_opens_the_store_after_a_chdir_of_a_relatively_opened_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which store an inherited journal holds is not compared by path (a relative one
    and a chdir since would defeat it): the child closes every inherited journal."""
    monkeypatch.chdir(tmp_path)
    with Journal.open("store", durability="os") as j:
        j.create_session("s")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.chdir("/")
                with Journal.open(tmp_path / "store", durability="os") as own:
                    own.append("s", [EventIn("child", b"")])
                code = 0
            finally:
                os._exit(code)
        assert _wait_child(pid) == 0
        assert [e.type for e in j.replay("s")] == ["child"]


_HANDLER_DURING_A_FORKS_WAIT = """
import os, signal, threading, time
from journal.forking import TRANSACTIONS as gate

class Holder:
    __slots__ = ("__weakref__",)

inside, release = threading.Event(), threading.Event()

def holds():  # (inside the gate until `release`: the fork waits for it)
    held = Holder()
    gate.enter(held)
    inside.set()
    release.wait()
    gate.leave(held)

def forks():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)

entered = []

def on_usr1(signum, frame):  # (a read of the handler's own: a transaction)
    held = Holder()
    gate.enter(held)
    entered.append(("handler", release.is_set()))
    gate.leave(held)

signal.signal(signal.SIGUSR1, on_usr1)
holder = threading.Thread(target=holds)
holder.start()
inside.wait()
forker = threading.Thread(target=forks)
forker.start()
time.sleep(0.2)  # (the fork waits for the holder now)
threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
threading.Timer(0.6, release.set).start()
held = Holder()
gate.enter(held)  # (waits for the fork: the handler runs in that wait)
entered.append(("main", release.is_set()))
gate.leave(held)
forker.join()
holder.join()
print(entered)
"""


def test_a_signal_handlers_transaction_during_a_wait_for_a_fork_waits_too(
    tmp_path: Path,
) -> None:
    """A thread waiting at the transactions' gate for a fork (another thread is still
    inside) runs a signal handler whose read enters a transaction of its own: that one
    waits for the fork too (it is not nested in a transaction in flight: the waiting
    one has not begun), or the child would inherit it in flight."""
    out = subprocess.run(
        [sys.executable, "-c", _HANDLER_DURING_A_FORKS_WAIT],
        capture_output=True,
        text=True,
        timeout=CHILD_S,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert out.stdout.splitlines() == ["[('handler', True), ('main', True)]"], out
