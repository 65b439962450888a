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
import tempfile
import threading
import time
from pathlib import Path

import pytest

from journal import EventIn, Journal

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
