"""A refused frame that cannot be cut off again (SPEC 7.1, 14.4).

A batch's frame is written and synced, its view commit fails (EIO), and the cut that
takes the frame off again fails too (a second EIO). The frame stays in the segment: if
this journal makes the owed cut before anything else (its next commit, once the disk
works) it was never committed; if the process ends first, the next writer's catch-up
indexes it and it is. The caller is not told "nothing was committed, retry" (a retry
would then store it twice) but `WriteOutcomeUnknown`: look before writing it again. The
faults come through the engine's `FileOps` seam; the fresh open is a real process. And a
frame whose sync failed, indexed by the next writer (or read by its rebuild of a deleted
or damaged view), is made durable before it is (the simulated disk's power cut).
"""

from __future__ import annotations

import base64
import errno
import json
import os
import random
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from _cli_runs import ROOT, cli_env, json_error, run_cli
from _disk import SimulatedDisk
from click.testing import CliRunner

from cli.main import main
from cli.output import EXIT_OUTCOME_UNKNOWN, EXIT_UNAVAILABLE, exit_status
from journal import (
    CursorForeign,
    CursorFuture,
    EventIn,
    Journal,
    StoreUnavailable,
    WriteOutcomeUnknown,
)
from journal._local.files import FileOps
from journal.engine import Append


class ViewCommitThenCutFail(FileOps):
    """EIO at the fault point `at` (after the frame is synced) once armed, then EIO on
    the next `cuts` truncations (the undo's cut, and the owed cut's later tries)."""

    def __init__(
        self, at: str = "commit.view_commit", cuts: int = 1, error: BaseException | None = None
    ) -> None:
        self.at = at
        self.cuts = cuts
        self.error = error  # (raised at `at` instead of the EIO)
        self.armed = False
        self.refusing = 0

    def point(self, name: str, detail: object = None) -> None:
        if name == self.at and self.armed:
            self.armed = False
            self.refusing = self.cuts
            raise self.error or OSError(errno.EIO, os.strerror(errno.EIO))

    def ftruncate(self, fd: int, length: int) -> None:
        if self.refusing:
            self.refusing -= 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().ftruncate(fd, length)


def _data(j: Journal, session: str = "a") -> list[bytes]:
    return [e.data for e in j.replay(session)]


def _consistent(j: Journal, expected: list[bytes]) -> None:
    """The session holds `expected`, ordinals 1.., cursors resume where they should, and
    verify finds nothing wrong."""
    events = list(j.replay("a"))
    assert [e.data for e in events] == expected
    assert [e.ordinal for e in events] == list(range(1, len(expected) + 1))
    assert j.get_session("a").last_ordinal == len(expected)
    for i, event in enumerate(events):
        assert [e.data for e in j.replay("a", event.cursor)] == expected[i + 1 :]
    assert j.verify().problems == []


@pytest.mark.parametrize("at", ["commit.view_flush", "commit.view_commit"])
def test_an_uncut_refused_frame_is_outcome_unknown_and_indexed_by_the_next_process(
    tmp_path: Path, at: str
) -> None:
    """The process that met both EIOs ends (as `journal append` does) with the cut owed:
    the next process's writer indexes the frame. So the append's outcome was not "nothing
    committed" (StoreUnavailable, the CLI's exit 9 "retry": a retry appended it twice)
    but unknown (WRITE_OUTCOME_UNKNOWN, exit 8: look first)."""
    path = tmp_path / "s"
    child = (
        "import json, sys\n"
        "from test_commit_undo_faults import ViewCommitThenCutFail\n"
        "from cli.output import exit_status\n"
        "from journal import EventIn, Journal, JournalError\n"
        "ops = ViewCommitThenCutFail(sys.argv[2])\n"
        "with Journal.open(sys.argv[1], create=True, file_ops=ops) as j:\n"
        "    j.append('a', [EventIn('m', b'before')], create=True)\n"
        "    ops.armed = True\n"
        "    try:\n"
        "        j.append('a', [EventIn('m', b'refused?')])\n"
        "    except JournalError as e:\n"
        "        seen = [x.data.decode() for x in j.replay('a')]\n"
        "        print(json.dumps([type(e).__name__, e.status, getattr(e, 'errno', None),\n"
        "                          exit_status(e), str(e), seen]))\n"
        "    else:\n"
        "        print(json.dumps(['acknowledged']))\n"
    )
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env["PYTHONPATH"]])
    done = subprocess.run(
        [sys.executable, "-c", child, str(path), at],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    name, status, number, exit_code, message, seen = json.loads(done.stdout)
    # Not acknowledged; and the view of the failing process does not show it.
    assert seen == ["before"]
    assert (name, status, number) == ("WriteOutcomeUnknown", "UNKNOWN", errno.EIO), message
    assert exit_code == EXIT_OUTCOME_UNKNOWN
    assert "look" in message and "idempotency key" in message, message
    # A fresh process (the CLI) finds the frame committed by its catch-up.
    read = run_cli(path, "--format", "json", "read", "-s", "a")
    assert read.returncode == 0, read.stderr
    lines = [json.loads(line) for line in read.stdout.splitlines()]
    events = [line["message"]["base64"] for line in lines if "message" in line]
    assert [base64.b64decode(data) for data in events] == [b"before", b"refused?"]
    assert run_cli(path, "append", "-s", "a", "after").returncode == 0
    with Journal.open(path) as j:
        _consistent(j, [b"before", b"refused?", b"after"])


def test_the_owed_cut_is_made_by_the_same_journal_before_its_next_commit(
    tmp_path: Path,
) -> None:
    """The same journal goes on: while the cut still fails, every commit fails with a
    plain `StoreUnavailable` (nothing of those calls was written) and the frame stays
    unindexed; once the disk works the cut is made first, the refused event is gone for
    good (a reopen does not find it), and nothing is doubled or missing."""
    path = tmp_path / "s"
    ops = ViewCommitThenCutFail(cuts=3)
    with Journal.open(path, create=True, file_ops=ops) as j:
        j.append("a", [EventIn("m", b"before")], create=True)
        ops.armed = True
        with pytest.raises(WriteOutcomeUnknown) as refused:
            j.append("a", [EventIn("m", b"refused?")])
        assert refused.value.errno == errno.EIO
        for _ in range(2):  # the owed cut fails again: nothing else is written
            with pytest.raises(StoreUnavailable) as later:
                j.append("a", [EventIn("m", b"not written")])
            assert type(later.value) is StoreUnavailable
            assert exit_status(later.value) == EXIT_UNAVAILABLE
            assert _data(j) == [b"before"]
        assert ops.refusing == 0
        assert j.append("a", [EventIn("m", b"after")]).first_ordinal == 2
        _consistent(j, [b"before", b"after"])
    with Journal.open(path) as j:
        _consistent(j, [b"before", b"after"])


@pytest.mark.parametrize("view", ["kept", "deleted", "damaged"])
def test_a_frame_whose_sync_and_cut_failed_is_made_durable_by_the_writer_that_indexes_it(
    tmp_path: Path, view: str
) -> None:
    """The frame's sync fails (the simulated disk, as Linux, then never writes those
    bytes: their pages are clean) and so does its cut; the process ends. The next writer
    reads the frame (from the page cache) and indexes it, then acknowledges an append
    after it, synced. A power cut used to leave zeros where the indexed frame was, before
    the acknowledged append: the store was unreadable (JournalCorrupt, a zero frame).
    The frames a catch-up indexes are now written again and synced first; and so are
    those of the active segment when the next writer rebuilds the view from the log
    (`index/` deleted, or damaged: until 2026-12-06 that path did not, and the store read
    as corrupt after the power cut)."""
    path = tmp_path / "s"
    disk = SimulatedDisk(str(path), random.Random(1))
    with Journal.open(path, create=True, file_ops=disk) as j:
        j.append("a", [EventIn("m", b"before")], create=True)
        disk.settle()
        disk.fail("fdatasync", errno.EIO)
        disk.fail("ftruncate", errno.EIO)
        with pytest.raises(WriteOutcomeUnknown):
            j.append("a", [EventIn("m", b"x" * 300)])
    if view == "deleted":
        shutil.rmtree(path / "index")
    elif view == "damaged":
        with open(path / "index" / "data.mdb", "r+b") as f:
            f.write(b"\xff" * 4096)
    with Journal.open(path, file_ops=disk) as j:  # (the next process's writer)
        assert _data(j) == [b"before", b"x" * 300]
        j.append("a", [EventIn("m", b"after")])
    disk.power_cut()
    with Journal.open(path) as j:
        _consistent(j, [b"before", b"x" * 300, b"after"])


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (KeyboardInterrupt(), "the commit was interrupted (KeyboardInterrupt)"),
        (ValueError("no such value"), "the commit failed: no such value"),
    ],
)
def test_an_uncut_frame_after_a_failure_not_of_the_disk_says_what_failed(
    tmp_path: Path, error: BaseException, said: str
) -> None:
    """The commit failed after its frame was written with something other than the disk
    refusing (a second Ctrl+C runs the held handler inside the commit, SPEC 7.1; a
    failure of the code), and the cut failed (EIO). The error said "the store's files
    could not be written: ;" (the interrupt's empty message), which they could; it says
    what failed, and the cut's error and its remedy."""
    ops = ViewCommitThenCutFail(error=error)
    with Journal.open(tmp_path / "s", create=True, file_ops=ops) as j:
        j.append("a", [EventIn("m", b"before")], create=True)
        ops.armed = True
        with pytest.raises(WriteOutcomeUnknown) as unknown:
            j.append("a", [EventIn("m", b"refused?")])
        message = str(unknown.value)
        assert message.startswith(said + "; cutting"), message
        assert "failed too (Input/output error)" in message, message
        assert "free space, replace the disk" in message, message
        assert unknown.value.errno == errno.EIO


def test_the_cli_names_its_commands_in_an_uncut_frames_error(tmp_path: Path) -> None:
    """`journal append` meets both EIOs: exit 8, and the error says how to look with the
    CLI's commands and option, not the library's calls (get_session, read), as the
    JetStream engine's unknown outcome does."""
    path = tmp_path / "s"
    with Journal.open(path, create=True) as j:
        j.append("a", [EventIn("m", b"before")], create=True)

    class AtTheAppend(ViewCommitThenCutFail):
        def point(self, name: str, detail: object = None) -> None:
            self.armed = self.armed or (name == "plan.operation" and isinstance(detail, Append))
            super().point(name, detail)

    args = ["--store", str(path), "append", "-s", "a", "refused?"]
    result = CliRunner().invoke(main, args, obj={"file_ops": AtTheAppend()})
    assert result.exit_code == EXIT_OUTCOME_UNKNOWN, result.output
    message = result.stderr
    assert "get_session" not in message and "(get_session, read)" not in message, message
    command = f"journal --store {path}"  # (the store as given: runs as printed)
    assert f"`{command} sessions show ID`, `{command} read`" in message, message
    assert "--idempotency-key" in message, message


# A writer whose refused frame's cut is owed (the cut's `ftruncate` fails until told),
# then, when told, makes the cut with its next commit: `append` (two events after the
# cut, in one batch) or `create` (another session: the refused session ends before it).
# With a second argument, the writer's host clock stands still (a clock stepped back, or
# one too coarse): every commit is stamped the same millisecond.
_OWED_CUT_WRITER = """
import sys
import time
if len(sys.argv) > 2:
    still = time.time_ns()
    time.time_ns = lambda: still
from test_commit_undo_faults import ViewCommitThenCutFail
from journal import EventIn, Journal, WriteOutcomeUnknown
ops = ViewCommitThenCutFail(cuts=1 << 30)
with Journal.open(sys.argv[1], create=True, file_ops=ops) as j:
    j.append("a", [EventIn("m", b"before")], create=True)
    ops.armed = True
    try:
        j.append("a", [EventIn("m", b"refused?")])
    except WriteOutcomeUnknown:
        print("owed", flush=True)
    then = sys.stdin.readline().strip()
    ops.refusing = 0
    if then == "append":
        j.append("a", [EventIn("m", b"after"), EventIn("m", b"later")])
    else:
        j.create_session("b")
    print("cut", flush=True)
    sys.stdin.readline()
"""

_CUT_UNDER_READS = "cut off the log after this read-only journal read"


def _owed_cut_writer(path: Path, clock_still: bool = False) -> subprocess.Popen[str]:
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env["PYTHONPATH"]])
    still = ["still"] if clock_still else []
    writer = subprocess.Popen(
        [sys.executable, "-c", _OWED_CUT_WRITER, str(path), *still],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert writer.stdout is not None
    assert writer.stdout.readline() == "owed\n"
    return writer


def _cut(writer: subprocess.Popen[str], then: str) -> None:
    assert writer.stdin is not None and writer.stdout is not None
    writer.stdin.write(then + "\n")
    writer.stdin.flush()
    assert writer.stdout.readline() == "cut\n"


def _done(writer: subprocess.Popen[str]) -> None:
    assert writer.stdin is not None
    writer.stdin.write("done\n")
    writer.stdin.close()
    assert writer.wait(60) == 0


@pytest.mark.parametrize("then", ["append", "create"])
def test_a_cursor_of_an_event_a_reader_read_before_its_owed_cut_says_it_was_cut(
    tmp_path: Path, then: str
) -> None:
    """A read-only journal opens while the writer (a live process) owes the cut of a
    refused frame: the store's view is behind the log and nothing moves it, as after a
    crash, so the reader projects the frame (the event whose outcome is unknown: a look
    before a retry must find what the next writer would index). The writer then cuts it
    and commits again. The cursor the reader issued for the cut event said the store
    was "restored from an older copy" (`CursorForeign`; `CursorFuture`, "restored ... or
    a hole accepted by `verify --fix`", when the session ends before it): it says that
    the event was cut off after this journal read it, and where to resume."""
    path = tmp_path / "s"
    writer = _owed_cut_writer(path)
    try:
        with Journal.open(path, readonly=True) as reader:
            read = list(reader.replay("a"))
            assert [e.data for e in read] == [b"before", b"refused?"]
            _cut(writer, then)
            expected = [b"before", b"after", b"later"] if then == "append" else [b"before"]
            assert _data(reader) == expected
            assert [e.data for e in reader.replay("a", read[0].cursor)] == expected[1:]
            error = CursorForeign if then == "append" else CursorFuture
            with pytest.raises(error) as refused:
                list(reader.replay("a", read[1].cursor))
            message = str(refused.value)
            assert _CUT_UNDER_READS in message, message
            assert "WRITE_OUTCOME_UNKNOWN" in message, message
            assert "restored from an older copy" not in message, message
        _done(writer)
    finally:
        writer.kill()
        writer.wait()


def test_a_follower_that_delivered_an_event_cut_off_since_is_told_not_given_the_next(
    tmp_path: Path,
) -> None:
    """A read-only journal's follower delivered the refused event (ordinal 2); the writer
    then cuts it and commits two events, ordinals 2 and 3, in one batch. The follower
    went on after ordinal 2: it delivered "later" (3), and "after", the event now at 2,
    never (a silent gap, and an event delivered that was never committed). It raises
    `CursorForeign` saying that the event it delivered was cut off."""
    path = tmp_path / "s"
    writer = _owed_cut_writer(path)
    try:
        with Journal.open(path, readonly=True) as reader:
            stop = threading.Event()
            stream = reader.watch("a", stop=stop)
            delivered = [next(stream).data, next(stream).data]
            assert delivered == [b"before", b"refused?"]
            _cut(writer, "append")
            # (`CursorFuture` if the view was rebuilt between the cut and the commit.)
            with pytest.raises((CursorForeign, CursorFuture)) as refused:
                delivered.append(next(stream).data)
            stop.set()
            assert delivered == [b"before", b"refused?"]
            message = str(refused.value)
            assert _CUT_UNDER_READS in message and "ordinal 2" in message, message
            stream.close()
        _done(writer)
    finally:
        writer.kill()
        writer.wait()


class _CutAfterRead(FileOps):
    """Once armed, the first read of the armed thread that returns `marker` has the writer
    cut the refused frame and commit (`cut`), and another thread of the reader's process
    rebuild the view (`rebuild`), before it returns: a follower's page read from the view
    before the rebuild, the rebuild done before the page's caller goes on."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.thread: threading.Thread | None = None
        self.cut: Callable[[], object] = lambda: None
        self.rebuild: Callable[[], object] = lambda: None

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        data = super().pread(fd, length, offset)
        if self.thread is threading.current_thread() and self.marker in data:
            self.thread = None
            self.cut()
            other = threading.Thread(target=self.rebuild)
            other.start()
            other.join()
        return data


def test_a_follower_whose_page_was_read_before_a_rebuild_under_it_is_still_told(
    tmp_path: Path,
) -> None:
    """The follower's page holds the refused event (ordinal 2) read from the view before
    its rebuild; another thread's read rebuilds the view (the writer cut the frame and
    committed "after" and "later") before the page is delivered. The follower must not
    go on after ordinal 2 as if nothing happened: it delivered "later" (3), and "after",
    the event now at 2, never, when it took the count of rebuilds after the page as the
    one its delivered events were read under."""
    path = tmp_path / "s"
    writer = _owed_cut_writer(path)
    ops = _CutAfterRead(b"refused?")
    try:
        with Journal.open(path, readonly=True, file_ops=ops) as reader:
            ops.cut = lambda: _cut(writer, "append")
            ops.rebuild = lambda: reader.get_session("a")
            stop = threading.Event()
            stream = reader.watch("a", stop=stop)
            ops.thread = threading.current_thread()
            delivered = [next(stream).data, next(stream).data]
            assert ops.thread is None  # (the page read the frame, and the view was rebuilt)
            assert delivered == [b"before", b"refused?"]
            with pytest.raises((CursorForeign, CursorFuture)) as refused:
                delivered.append(next(stream).data)
            stop.set()
            assert delivered == [b"before", b"refused?"]
            message = str(refused.value)
            assert _CUT_UNDER_READS in message and "ordinal 2" in message, message
            stream.close()
        _done(writer)
    finally:
        writer.kill()
        writer.wait()


def test_a_follower_is_told_of_a_cut_event_replaced_within_the_same_millisecond(
    tmp_path: Path,
) -> None:
    """As above, with the writer's clock standing still: the event that replaces the cut
    one at ordinal 2 ("after") has its timestamp, and its position in the log. The
    follower's recheck compared the timestamp only, found it unchanged, and went on
    after ordinal 2: it delivered "later" and never "after"."""
    path = tmp_path / "s"
    writer = _owed_cut_writer(path, clock_still=True)
    try:
        with Journal.open(path, readonly=True) as reader:
            stop = threading.Event()
            stream = reader.watch("a", stop=stop)
            delivered = [next(stream), next(stream)]
            assert [e.data for e in delivered] == [b"before", b"refused?"]
            _cut(writer, "append")
            with pytest.raises(CursorForeign) as refused:
                delivered.append(next(stream))
            stop.set()
            assert [e.data for e in delivered] == [b"before", b"refused?"]
            message = str(refused.value)
            assert _CUT_UNDER_READS in message and "ordinal 2" in message, message
            stream.close()
            now = list(reader.replay("a"))
            assert [e.data for e in now] == [b"before", b"after", b"later"]
            # (The replacement is stamped as the cut event was, and takes its position.)
            assert now[1].timestamp_ms == delivered[1].timestamp_ms
            assert now[1].position == delivered[1].position
        _done(writer)
    finally:
        writer.kill()
        writer.wait()


@pytest.mark.parametrize("rebuilt", ["at the first page", "before the first page"])
def test_a_follower_started_from_the_cursor_of_an_event_cut_off_since_is_told(
    tmp_path: Path, rebuilt: str
) -> None:
    """A follower started from the cursor of the refused event (ordinal 2) before the
    writer cut it has delivered nothing yet; the writer then cuts it and commits
    "after" and "later" (2 and 3). The follower went on after ordinal 2, as its cursor
    said: it delivered "later" and never "after", since only a follower that had
    delivered an event rechecked it. The view is rebuilt by the follower's first page,
    or before it by another read of the journal (its count of rebuilds then changed
    before the follower's pager was made)."""
    path = tmp_path / "s"
    writer = _owed_cut_writer(path)
    try:
        with Journal.open(path, readonly=True) as reader:
            read = list(reader.replay("a"))
            assert [e.data for e in read] == [b"before", b"refused?"]
            stop = threading.Event()
            stream = reader.watch("a", read[1].cursor, stop=stop)
            resumed = reader.watch("a", read[0].cursor, stop=stop)  # (not cut: goes on)
            _cut(writer, "append")
            if rebuilt == "before the first page":
                assert reader.get_session("a").last_ordinal == 3  # (rebuilt the view)
            with pytest.raises((CursorForeign, CursorFuture)) as refused:
                next(stream)
            message = str(refused.value)
            assert _CUT_UNDER_READS in message and "ordinal 2" in message, message
            assert [next(resumed).data, next(resumed).data] == [b"after", b"later"]
            stop.set()
            stream.close()
            resumed.close()
        _done(writer)
    finally:
        writer.kill()
        writer.wait()


@pytest.mark.parametrize("then", ["append", "create"])
def test_a_cursor_of_a_cut_event_taken_to_another_process_names_the_cut_too(
    tmp_path: Path, then: str
) -> None:
    """The cursor a read-only journal issued for the refused event, used in another
    process (`journal read --cursor`) after the writer cut the event: that process saw no
    cut, and nothing durable records one (the log is as it was before the frame), so it
    cannot tell the cut from a store restored from an older copy. Its error blamed the
    restored store alone; it names both."""
    path = tmp_path / "s"
    writer = _owed_cut_writer(path)
    try:
        with Journal.open(path, readonly=True) as reader:
            read = list(reader.replay("a"))
        assert [e.data for e in read] == [b"before", b"refused?"]
        _cut(writer, then)
        done = run_cli(path, "--format", "json", "read", "-s", "a", "--cursor", read[1].cursor)
        assert done.returncode != 0, done.stdout
        message = json_error(done)["message"]
        assert "restored from an older copy" in message, message
        assert "cut off the log after a read-only journal read" in message, message
        assert "WRITE_OUTCOME_UNKNOWN" in message, message
        _done(writer)
    finally:
        writer.kill()
        writer.wait()
