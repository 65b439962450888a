"""A refused frame whose cut cannot begin: the view is damaged, or gone (SPEC 7.1, 14.4).

A batch's frame is written and synced, then LMDB reports damage (MDB_CORRUPTED) before
the view commits, and the view refuses every transaction from then on: the cut that
takes the frame off again needs a write transaction, and cannot begin. The frame stays,
and the rebuild of the view from the log (`verify --fix`, the next writable open)
indexes it: the call is committed. The caller is not told `JournalCorrupt` as if nothing
were written (a retry stored the event twice) but `WriteOutcomeUnknown`: look before
writing it again. The same when the store was moved away between the failed commit and
its cut (`StoreUnavailable`: its index is gone). Faults come through the engine's
`FileOps` fault points; the failing journal and the fresh opens are real processes.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import lmdb
import pytest
from _cli_runs import ROOT, cli_env, run_cli
from click.testing import CliRunner

from cli.main import main
from cli.output import EXIT_OTHER, EXIT_OUTCOME_UNKNOWN
from journal import EventIn, Journal, JournalCorrupt, WriteOutcomeUnknown
from journal._local.files import FileOps
from journal.engine import Append


class RefuseAtFlush(FileOps):
    """Once armed: LMDB's damage error (or `error`) at the fault point `at`, after the
    batch's frame was written and synced; and with `move_to`, the store's directory moved
    there just before the failed commit's cut (the fault point `commit.refused`)."""

    def __init__(
        self,
        at: str = "commit.view_flush",
        error: BaseException | None = None,
        store: str | None = None,
        move_to: str | None = None,
    ) -> None:
        self.at = at
        self.error = error
        self.store = store
        self.move_to = move_to
        self.armed = False
        self.refused = False

    def point(self, name: str, detail: object = None) -> None:
        if name == self.at and self.armed:
            self.armed = False
            self.refused = True
            raise self.error or lmdb.CorruptedError(
                "mdb_get: MDB_CORRUPTED: Located page was wrong type"
            )
        if name == "commit.refused" and self.refused and self.move_to is not None:
            assert self.store is not None
            os.rename(self.store, self.move_to)


def _events(store: Path) -> list[bytes]:
    """Session "a"'s events, as a fresh `journal read` process finds them."""
    read = run_cli(store, "--format", "json", "read", "-s", "a")
    assert read.returncode == 0, read.stderr
    lines = [json.loads(line) for line in read.stdout.splitlines()]
    return [base64.b64decode(line["message"]["base64"]) for line in lines if "message" in line]


def _consistent(j: Journal, expected: list[bytes]) -> None:
    events = list(j.replay("a"))
    assert [e.data for e in events] == expected
    assert [e.ordinal for e in events] == list(range(1, len(expected) + 1))
    assert j.get_session("a").last_ordinal == len(expected)
    assert j.verify().problems == []


_CHILD = (
    "import json, sys\n"
    "from test_commit_damaged_view import RefuseAtFlush\n"
    "from cli.output import exit_status\n"
    "from journal import EventIn, Journal, JournalError\n"
    "store, at, move_to = sys.argv[1], sys.argv[2], sys.argv[3] or None\n"
    "error = OSError(5, 'Input/output error') if move_to else None\n"
    "ops = RefuseAtFlush(at, error, store, move_to)\n"
    "j = Journal.open(store, create=True, file_ops=ops)\n"
    "j.append('a', [EventIn('m', b'before')], create=True)\n"
    "ops.armed = True\n"
    "try:\n"
    "    j.append('a', [EventIn('m', b'refused?')])\n"
    "except JournalError as e:\n"
    "    print(json.dumps([type(e).__name__, e.status, getattr(e, 'errno', None),\n"
    "                      exit_status(e), str(e)]))\n"
    "else:\n"
    "    print(json.dumps(['acknowledged']))\n"
    "j.close()\n"
)


def _run_child(store: Path, at: str, move_to: Path | None = None) -> list[object]:
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env["PYTHONPATH"]])
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(store), at, str(move_to or "")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: list[object] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("at", ["commit.view_flush", "commit.view_commit"])
def test_a_frame_the_damaged_view_cannot_cut_is_outcome_unknown_and_indexed_by_the_fix(
    tmp_path: Path, at: str
) -> None:
    """The process that met the damage ends (as `journal append` does): `verify --fix`
    rebuilds the view and the frame is committed, once. The caller was told
    `JournalCorrupt` (the CLI's exit 7, "run verify --fix"), as if nothing were written,
    and a retry stored the event twice; it is told `WriteOutcomeUnknown` (exit 8): the
    frame stays, the fix indexes it, look before writing it again."""
    store = tmp_path / "s"
    name, status, number, exit_code, message = _run_child(store, at)
    assert (name, status, number) == ("WriteOutcomeUnknown", "UNKNOWN", None), message
    assert exit_code == EXIT_OUTCOME_UNKNOWN
    assert isinstance(message, str)
    assert "MDB_CORRUPTED" in message, message
    assert "`journal verify --fix`" in message and "indexes it" in message, message
    assert "look whether it committed (get_session, read)" in message, message
    assert "idempotency key is safe" in message, message
    fixed = run_cli(store, "verify", "--fix")
    assert fixed.returncode == 0, fixed.stderr
    assert _events(store) == [b"before", b"refused?"]
    assert run_cli(store, "append", "-s", "a", "after").returncode == 0
    with Journal.open(store) as j:
        _consistent(j, [b"before", b"refused?", b"after"])


def test_the_same_journal_refuses_until_the_fix_which_commits_the_frame(
    tmp_path: Path,
) -> None:
    """The journal goes on: its view is damaged, so every commit is `JournalCorrupt`
    (nothing of those calls was written) until `verify(fix=True)`, which rebuilds the
    view from the log and indexes the frame: what the `WriteOutcomeUnknown` said."""
    ops = RefuseAtFlush()
    with Journal.open(tmp_path / "s", create=True, file_ops=ops) as j:
        j.append("a", [EventIn("m", b"before")], create=True)
        ops.armed = True
        with pytest.raises(WriteOutcomeUnknown) as unknown:
            j.append("a", [EventIn("m", b"refused?")])
        assert "verify(fix=True)" in str(unknown.value), str(unknown.value)
        with pytest.raises(JournalCorrupt):
            j.append("a", [EventIn("m", b"not written")])
        j.verify(fix=True)
        assert [e.data for e in j.replay("a")] == [b"before", b"refused?"]
        assert j.append("a", [EventIn("m", b"after")]).first_ordinal == 3
        _consistent(j, [b"before", b"refused?", b"after"])
    with Journal.open(tmp_path / "s") as j:
        _consistent(j, [b"before", b"refused?", b"after"])


class CorruptASecondBatch(RefuseAtFlush):
    """Holds the first batch taken once `go` is set (`held`) until two more requests wait
    in the queue, then arms the damage for the batch of those two."""

    def __init__(self) -> None:
        super().__init__()
        self.go = False
        self.held = threading.Event()
        self.two_waiting = threading.Event()
        self.sizes: list[int] = []

    def point(self, name: str, detail: object = None) -> None:
        if self.go and name == "commit.queued" and detail == 2:
            self.two_waiting.set()
        if self.go and name == "commit.batch_taken" and isinstance(detail, int):
            self.sizes.append(detail)
            if len(self.sizes) == 1:
                self.held.set()
                assert self.two_waiting.wait(20)
            elif detail == 2:
                self.armed = True
        super().point(name, detail)


def test_every_request_of_the_damaged_batch_is_outcome_unknown(tmp_path: Path) -> None:
    """Both requests of the batch whose frame was written get `WriteOutcomeUnknown`. The
    `JournalCorrupt` was not a store-wide error: the batch was committed request by
    request, and each met the damaged view (`JournalCorrupt` each), the frame holding both
    left for the fix to commit."""
    ops = CorruptASecondBatch()
    with Journal.open(tmp_path / "s", create=True, file_ops=ops) as j:
        j.append("a", [EventIn("m", b"before")], create=True)
        errors: dict[str, BaseException | None] = {}

        def append(data: bytes) -> None:
            try:
                j.append("a", [EventIn("m", data)])
                errors[data.decode()] = None
            except BaseException as e:
                errors[data.decode()] = e

        ops.go = True
        first = threading.Thread(target=append, args=(b"first",))
        first.start()
        assert ops.held.wait(20)  # (its batch taken: the others queue behind it)
        others = [threading.Thread(target=append, args=(d,)) for d in (b"x", b"y")]
        for thread in others:
            thread.start()
        for thread in [first, *others]:
            thread.join(60)
        assert ops.sizes[:2] == [1, 2], ops.sizes
        assert errors["first"] is None
        assert {type(errors[d]) for d in ("x", "y")} == {WriteOutcomeUnknown}, errors
        j.verify(fix=True)
        data = [e.data for e in j.replay("a")]
        assert data[:2] == [b"before", b"first"] and sorted(data[2:]) == [b"x", b"y"]


def test_journal_append_meeting_a_damaged_view_exits_8_and_names_the_commands(
    tmp_path: Path,
) -> None:
    """`journal append` meets the damage after its frame was synced: exit 8 (it was 7,
    "run `journal verify --fix`", and the fix committed the event), the error naming the
    CLI's commands to look with; the fix then shows the event, once."""
    store = tmp_path / "s"
    with Journal.open(store, create=True) as j:
        j.append("a", [EventIn("m", b"before")], create=True)

    class AtTheAppend(RefuseAtFlush):
        def point(self, name: str, detail: object = None) -> None:
            self.armed = self.armed or (name == "plan.operation" and isinstance(detail, Append))
            super().point(name, detail)

    args = ["--store", str(store), "append", "-s", "a", "refused?"]
    result = CliRunner().invoke(main, args, obj={"file_ops": AtTheAppend()})
    assert result.exit_code == EXIT_OUTCOME_UNKNOWN, (result.exit_code, result.output)
    assert result.exit_code != EXIT_OTHER
    message = result.stderr
    assert "verify --fix`" in message and "Journal.verify" not in message, message
    command = f"journal --store {store}"  # (the store as given: runs as printed)
    assert f"`{command} sessions show ID`, `{command} read`" in message, message
    assert "--idempotency-key" in message, message
    assert run_cli(store, "verify", "--fix").returncode == 0
    assert _events(store) == [b"before", b"refused?"]


def test_a_store_moved_before_the_cut_is_outcome_unknown_and_indexed_at_its_new_path(
    tmp_path: Path,
) -> None:
    """The commit fails (EIO) and the store is moved away before the cut: the cut's
    transaction cannot begin (`StoreUnavailable`, the index is gone from the path). The
    caller was told that `StoreUnavailable` ("open it again at its new path"), and a
    retry there stored the event twice: the writer that opens it there indexes the
    frame. It is told `WriteOutcomeUnknown`."""
    store, moved = tmp_path / "s", tmp_path / "moved"
    name, status, number, exit_code, message = _run_child(store, "commit.view_flush", moved)
    assert (name, status, number) == ("WriteOutcomeUnknown", "UNKNOWN", errno.EIO), message
    assert exit_code == EXIT_OUTCOME_UNKNOWN
    assert isinstance(message, str)
    assert "no longer holds its index" in message, message
    assert "look whether it committed (get_session, read)" in message, message
    assert _events(moved) == [b"before", b"refused?"]
    with Journal.open(moved) as j:
        j.append("a", [EventIn("m", b"after")])
        _consistent(j, [b"before", b"refused?", b"after"])
