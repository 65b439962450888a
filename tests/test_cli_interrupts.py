"""Ctrl+C during the long store commands (`verify`, `compact`, `export`, `import`,
`import --list`, `sessions own --wait`), through real processes (SPEC.md section 13):
each ends with exit 130 and says on stderr what state it left."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _cli_runs import ROOT, cli_env, run_cli

from journal import EventIn, Journal
from journal._local.leases import lock_path

# The command runs in this process; a thread runs the SIGINT handler the command has in
# place (the first handler other than Python's default one and the one that notes a
# Ctrl+C during the imports, or the default one after 5 s) and swallows its
# KeyboardInterrupt: what happens when the handler runs while the main thread runs a
# finalizer ("Exception ignored in"). Then it says so on stderr.
_LOST_RAISE = """
import signal, sys, threading, time
from cli import early_signals, run

def lose() -> None:
    began = time.monotonic()
    while signal.getsignal(signal.SIGINT) in (signal.default_int_handler, early_signals.note):
        if time.monotonic() - began > 5:
            break
        time.sleep(0.001)
    try:
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
    except KeyboardInterrupt:
        pass
    print("lost", file=sys.stderr, flush=True)

threading.Thread(target=lose, daemon=True).start()
run(prog_name="journal")
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("interrupts") / "store"
    with Journal.open(path, create=True, durability="os") as j:
        for number in range(20):
            session_id = f"s{number}"
            j.create_session(session_id)
            for _ in range(100):
                j.append(session_id, [EventIn("m", os.urandom(100)) for _ in range(50)])
    return path


def _lost_raise(store: Path, *args: str, stdin: int | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", _LOST_RAISE, "--store", str(store), *args],
        cwd=ROOT,
        env=cli_env(),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _ended(process: subprocess.Popen[bytes], stdin: bytes | None = None) -> tuple[int, str]:
    try:
        _, stderr = process.communicate(stdin, timeout=60)
    finally:
        process.kill()  # (a command a failure left running)
        process.wait(10)
    return process.returncode, stderr.decode()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["verify"],
            "journal: interrupted: the check stopped with 100% of the log checked; nothing in "
            "the store was changed; run `journal verify` again for a full check",
        ),
        (
            ["verify", "--fix"],
            "journal: interrupted: the check stopped with 100% of the log checked; nothing in "
            "the store was changed; run `journal verify --fix` again for a full check",
        ),
        (
            # (one active segment: nothing sealed, the Ctrl+C is raised once it is done)
            ["compact", "--dead-share", "0"],
            "journal: interrupted after the compaction finished (its report was not printed)",
        ),
        (
            ["export", "--all", "-o", "{tmp}/all.archive"],
            "journal: interrupted: no archive was written ({tmp}/all.archive was not "
            "created; the partial copy was removed)",
        ),
        (
            ["export", "--all", "-o", "-", "--format", "ndjson"],
            "journal: interrupted: the NDJSON written to stdout is incomplete (it lacks the "
            "footer record, and may be empty); export again",
        ),
    ],
)
def test_a_ctrl_c_whose_raise_is_lost_still_ends_a_store_command(
    store: Path, tmp_path: Path, args: list[str], says: str
) -> None:
    """Until 2026-12-04 the command ran on to its end and exited 0 (only `watch` noted
    its signals): a Ctrl+C whose KeyboardInterrupt Python swallowed, because it came
    while the main thread ran a finalizer (the library lets segment readers go as it
    reads), was lost. Until 2026-12-05 the command then said nothing of what it left
    (the Ctrl+C comes here at its first progress report)."""
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in args]
    status, stderr = _ended(_lost_raise(store, *args))
    assert status == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.splitlines() == ["lost", says.replace("{tmp}", str(tmp_path))], stderr
    assert list(tmp_path.iterdir()) == []  # (no archive, no temporary file)


def test_an_interrupted_export_leaves_the_file_it_would_replace_as_it_was(
    store: Path, tmp_path: Path
) -> None:
    archive = tmp_path / "all.archive"
    archive.write_bytes(b"the archive of yesterday")
    status, stderr = _ended(_lost_raise(store, "export", "--all", "-o", str(archive), "--force"))
    assert status == 130, stderr
    assert stderr.splitlines()[1:] == [
        f"journal: interrupted: {archive} was left as it was (the new archive was not "
        "complete; its partial copy was removed)"
    ]
    assert archive.read_bytes() == b"the archive of yesterday"
    assert [path.name for path in tmp_path.iterdir()] == ["all.archive"]


@pytest.fixture(scope="module")
def sealed_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of many sealed segments, most of each dead (compacted sessions)."""
    path = tmp_path_factory.mktemp("sealed") / "store"
    with Journal.open(path, create=True, durability="os", segment_bytes=256 << 10) as j:
        for number in range(4):
            session_id = f"s{number}"
            j.create_session(session_id)
            for _ in range(40):
                j.append(session_id, [EventIn("m", os.urandom(100)) for _ in range(50)])
            j.compact_session(session_id, 1900, b"snapshot")
    return path


def test_an_interrupted_compaction_says_how_far_it_got(sealed_store: Path) -> None:
    status, stderr = _ended(_lost_raise(sealed_store, "compact"))
    assert status == 130, stderr
    (said,) = stderr.splitlines()[1:]
    assert said.startswith("journal: interrupted after 1 of "), said
    assert said.endswith(
        " sealed segments: each was rewritten whole or left as it was, so the store is "
        "consistent; run `journal compact` again to finish"
    ), said
    assert run_cli(sealed_store, "verify").returncode == 0


def test_a_lost_ctrl_c_ends_import_list_and_import_before_anything_is_imported(
    store: Path, tmp_path: Path
) -> None:
    archive = tmp_path / "all.archive"
    assert run_cli(store, "export", "--all", "-o", str(archive)).returncode == 0
    data = archive.read_bytes()
    target = tmp_path / "target"
    assert run_cli(target, "init").returncode == 0
    said = []
    for args in (["import", "--list", "-"], ["import", "-"]):
        process = _lost_raise(target, *args, stdin=subprocess.PIPE)
        assert process.stdin is not None and process.stderr is not None
        process.stdin.write(data[:4096])  # (the rest after the Ctrl+C)
        process.stdin.flush()
        assert process.stderr.readline() == b"lost\n"
        status, stderr = _ended(process, data[4096:])
        assert status == 130, (args, stderr)
        assert "Traceback" not in stderr, stderr
        said.append(stderr.splitlines()[0])
    assert said[0] == "journal: interrupted: the archive was not checked whole"
    assert said[1].startswith("journal: interrupted: nothing was imported")
    with Journal.open(target, readonly=True) as j:
        assert list(j.list_sessions()) == []


def test_ctrl_c_ends_a_store_command_with_130_and_no_traceback(store: Path) -> None:
    """A Ctrl+C (SIGINT from outside) while `export` waits for its reader to take the
    archive (stdout a pipe nobody reads yet)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "--store", str(store), "export", "--all", "-o", "-"],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.read(1)  # it writes: the pipe is full now
        process.send_signal(signal.SIGINT)
        status = process.wait(30)
        assert process.stderr is not None
        stderr = process.stderr.read().decode()
    finally:
        process.kill()
        process.wait(10)
    assert status == 130, stderr
    assert stderr.splitlines() == [
        "journal: interrupted: the archive written to stdout is incomplete (`journal import` "
        "refuses it); export again"
    ]


@pytest.mark.parametrize(
    ("session_id", "quoted"), [("s", "s"), ("w $x", "'w $x'"), ("-x", "-- -x")]
)
def test_ctrl_c_while_own_waits_for_the_lease_says_none_is_held(
    tmp_path: Path, session_id: str, quoted: str
) -> None:
    """`sessions own --wait` ended on Ctrl+C with exit 130 and nothing said. The command
    it names runs as printed: it quotes the id for a shell (until 2026-12-06 as the CLI
    shows ids, `"w $x"`, which a shell expands: a review), puts `--` before an id that
    starts with `-`, and names the store given with `--store` (until 2026-12-06 it did
    neither: `-x` was taken for an option, and the command looked in ./.journal; a new
    user's trial)."""
    store = tmp_path / "store"
    with Journal.open(store, create=True) as j:
        j.create_session(session_id)
        with j.own(session_id):
            status, stdout, stderr = _interrupted(
                store,
                ["sessions", "own", "--wait", "60", "--", session_id],
                lambda process: _wait_until_it_opened(
                    process.pid, lock_path(str(store), session_id)
                ),
            )
    assert status == 130, stderr
    assert stdout == b""
    assert stderr.decode().splitlines() == [
        "journal: interrupted: no lease is held (none was taken, or the one taken was let "
        f"go); `journal --store {shlex.quote(str(store))} sessions show {quoted}` shows "
        "whether a turn is still open"
    ]


def _interrupted(
    store: Path, args: list[str], when: Callable[[subprocess.Popen[bytes]], None]
) -> tuple[int, bytes, bytes]:
    """`journal --store STORE ARGS...` in a process of its own, sent SIGINT once
    `when(process)` returned: its exit status, stdout and stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "--store", str(store), *args],
        cwd=ROOT,
        env=cli_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        when(process)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait(10)
    return process.returncode, stdout, stderr


def _wait_until_it_opened(pid: int, path: str, every: float = 0.01) -> None:
    """Until process `pid` has the file at `path` open (the lease's lock file: it waits;
    an archive read back for its digest: look `every` so many seconds)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) == os.path.realpath(path):
                    return
            except OSError:
                pass  # (closed meanwhile)
        time.sleep(every)
    raise AssertionError(f"process {pid} did not open {path}")


def test_ctrl_c_while_export_reads_its_file_back_says_the_archive_is_whole(
    tmp_path: Path,
) -> None:
    """Once the archive was renamed into place, `export -o FILE` reads it back for its
    sha256 (a while, for a large one); a Ctrl+C then ended it with exit 130 and nothing
    said, as if the export had failed (found by a review sending SIGINT at fractions of
    an export's time). The file is whole, and the command says so."""
    store = tmp_path / "store"
    with Journal.open(store, create=True, durability="os") as j:
        for _ in range(96):  # (96 MiB zstd cannot shrink: a read-back of some time)
            j.append("s", [EventIn("m", os.urandom(1 << 20))], create=True)
    archive = tmp_path / "out" / "all.archive"
    archive.parent.mkdir()
    status, stdout, stderr = _interrupted(
        store,
        ["export", "--all", "-o", str(archive)],
        lambda process: _wait_until_it_opened(process.pid, str(archive), every=0),  # (read-back)
    )
    assert status == 130, stderr
    assert stdout == b""
    assert stderr.decode().splitlines() == [
        f"journal: interrupted after the archive was written: {archive} holds it whole"
    ]
    with Journal.open(tmp_path / "target", create=True) as j:
        assert j.import_sessions(archive).events == 96


def _holds_a_deleted_file(pid: int) -> bool:
    """Whether process `pid` has a file open that was unlinked (a descriptor closed while
    it is listed is passed over)."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):
            if os.readlink(fd).endswith(" (deleted)"):
                return True
    return False


def test_ctrl_c_while_import_as_copies_stdin_says_nothing_was_imported(tmp_path: Path) -> None:
    """`import - --as NEW` copies stdin (to read it twice) before the import itself; a
    Ctrl+C there ended it with exit 130 and nothing said (found by a review)."""
    store = tmp_path / "store"
    Journal.open(store, create=True).close()

    def copying(process: subprocess.Popen[bytes]) -> None:
        assert process.stdin is not None
        process.stdin.write(b"\x28\xb5\x2f\xfd" + bytes(1000))  # (a zstd start, then waits)
        process.stdin.flush()
        deadline = time.monotonic() + 30
        while not _holds_a_deleted_file(process.pid):  # (its copy of stdin, unlinked)
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.01)

    status, stdout, stderr = _interrupted(store, ["import", "-", "--as", "new"], copying)
    assert status == 130, stderr
    assert stdout == b""
    assert stderr.decode().splitlines() == [
        "journal: interrupted: nothing was imported (`journal compact` reclaims what was staged)"
    ]
    with Journal.open(store, readonly=True) as j:
        assert list(j.list_sessions()) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_verify_stopped_while_it_rebuilds_leaves_no_temporary_directory(
    store: Path, tmp_path: Path, signum: int
) -> None:
    """`journal verify` rebuilds a view from the log in a temporary directory (SPEC
    section 9). Until 2026-12-07 SIGTERM and SIGHUP (`timeout`, `kill`, a closed
    terminal) had their default action there: the process ended at once and left the
    directory, a copy of the store's index, in /tmp for good. They now stop it as Ctrl+C
    does (its clean-up, then what it left said on stderr), with exit 143 or 129."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "--store", str(store), "verify"],
        cwd=ROOT,
        env={**cli_env(), "TMPDIR": str(scratch)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(p.name.startswith("journal-verify-") for p in scratch.iterdir()):
            assert process.poll() is None, "verify ended before its rebuild was seen"
            assert time.monotonic() < deadline, "verify never rebuilt"
            time.sleep(0.001)
        process.send_signal(signum)
    finally:
        status, stderr = _ended(process)
    assert list(scratch.iterdir()) == [], stderr
    assert status == 128 + signum, stderr
    name = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    assert stderr.splitlines() == [
        f"journal: {name}: the check stopped with 100% of the log checked; nothing in the "
        "store was changed; run `journal verify` again for a full check"
    ], stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_demo_stopped_as_it_makes_its_store_leaves_no_temporary_directory(
    tmp_path: Path, signum: int
) -> None:
    """`journal demo` made its temporary store (`tempfile.mkdtemp`) before its clean-up
    was in place: a Ctrl+C (or SIGTERM) just after, as the store appeared, ended it with
    exit 130 and the empty store left in /tmp (4 of 10 such runs). Three runs each."""
    for run in range(3):
        scratch = tmp_path / f"tmp{run}"
        scratch.mkdir()
        process = subprocess.Popen(
            [sys.executable, "-m", "cli", "demo"],
            cwd=ROOT,
            env={**cli_env(), "TMPDIR": str(scratch)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # (its runtimes are in its process group)
        )
        try:
            deadline = time.monotonic() + 60
            while not any(p.name.startswith("journal-demo-") for p in scratch.iterdir()):
                assert process.poll() is None, "the demo ended before it made its store"
                assert time.monotonic() < deadline, "the demo never made its store"
                time.sleep(0.0002)
            process.send_signal(signum)
            status, stderr = _ended(process)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        assert list(scratch.iterdir()) == [], stderr
        assert status == 128 + signum, stderr
        assert "Traceback" not in stderr, stderr
