"""A supervisor written in shell, through real processes (SPEC.md section 13): it finds a
dead worker's session with `journal sessions list` and settles the worker's turn with
`journal sessions own ID`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _cli_runs import ROOT, cli_env, json_error, run_cli

from cli.output import EXIT_OUTCOME_UNKNOWN
from journal import Journal

# A worker: owns the session, starts a turn, says so, then waits to be killed.
_WORKER = """
import sys, time
from journal import Journal
with Journal.open(sys.argv[1], durability="os") as j:
    owner = j.own("w")
    turn = owner.turn("r1")
    turn.__enter__()
    print("in turn", flush=True)
    time.sleep(60)
"""


def _worker(store: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(store)],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "in turn\n"
    return process


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    with Journal.open(path, create=True) as j:
        j.create_session("w")
    return path


def test_sessions_own_settles_a_killed_workers_turn(store: Path) -> None:
    """Before 2026-12-04 the CLI had no command for `own()`: a shell supervisor saw
    `open-turn=r1 (no owner)` and could not settle the dead worker's turn."""
    worker = _worker(store)
    try:
        busy = run_cli(store, "--format", "json", "sessions", "own", "w")
        assert busy.returncode == 5, busy.stderr  # the worker lives: OWNER_BUSY
        assert json_error(busy)["code"] == "OWNER_BUSY"
        assert json_error(busy)["pid"] == worker.pid
        assert "--wait" in busy.stderr and "wait_s" not in busy.stderr
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    finally:
        worker.kill()
        worker.wait(10)
    listed = run_cli(store, "sessions", "list")
    assert "open-turn=r1 (no owner)" in listed.stdout, listed.stdout

    done = run_cli(store, "--format", "json", "sessions", "own", "w")
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert json.loads(line) == {
        "session_id": "w",
        "generation": 2,
        "recovered_turn": "r1",
        "released": True,
    }
    text = run_cli(store, "sessions", "own", "w")  # nothing left to settle now
    assert text.returncode == 0, text.stderr
    assert text.stdout == "took over w (lease 3): no unsettled turn; released\n"

    with Journal.open(store) as j:
        with j.own("w") as owner:
            assert owner.recovered_turn is None
            assert owner.generation == 4
        assert j.get_session("w").open_turn is None
        result = [event for event in j.replay("w") if event.type == "turn_result"]
        assert len(result) == 1
        assert json.loads(result[0].data)["error"]["code"] == "WATCH_OUTCOME_UNKNOWN"


def test_sessions_own_text_names_the_recovered_turn(store: Path) -> None:
    worker = _worker(store)
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    done = run_cli(store, "sessions", "own", "w")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "took over w (lease 2): turn r1 recorded as failed (WATCH_OUTCOME_UNKNOWN"
    )
    assert done.stdout.endswith("; released\n")
    quiet = run_cli(store, "--format", "quiet", "sessions", "own", "w")
    assert (quiet.returncode, quiet.stdout) == (0, "")


@pytest.mark.parametrize(
    ("prepare", "session", "status", "code", "says"),
    [
        (None, "nope", 3, "SESSION_NOT_FOUND", "journal sessions create"),
        ("resolve_session", "w", 5, "SESSION_NOT_WRITABLE", "ended session"),
    ],
)
def test_sessions_own_refuses_a_missing_or_ended_session(
    store: Path, prepare: str | None, session: str, status: int, code: str, says: str
) -> None:
    if prepare is not None:
        with Journal.open(store) as j:
            getattr(j, prepare)("w")
    done = run_cli(store, "--format", "json", "sessions", "own", session)
    assert done.returncode == status, done.stderr
    assert json_error(done)["code"] == code
    # (A suggested command names the store as given: it runs as printed.)
    assert says.replace("journal ", f"journal --store {store} ") in done.stderr, done.stderr


def test_sessions_own_of_a_suspended_session_with_a_dead_turn_says_to_resume(
    store: Path,
) -> None:
    worker = _worker(store)
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    with Journal.open(store) as j:
        j.suspend_session("w")
    done = run_cli(store, "sessions", "own", "w")
    assert done.returncode == 5, done.stderr
    assert f"`journal --store {store} sessions resume ID`" in done.stderr, done.stderr
    assert "resume_session" not in done.stderr and "own()" not in done.stderr
    assert run_cli(store, "sessions", "resume", "w").returncode == 0
    again = run_cli(store, "--format", "json", "sessions", "own", "w")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["recovered_turn"] == "r1"


def _blocked_writing(pid: int, since: float) -> bool:
    """The process sleeps in a write to a pipe (`pipe_write`, `anon_pipe_write`), or,
    where the kernel does not say (`0`), still sleeps 3 s after `since`."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        wchan, state = "0", "S"
    if wchan.endswith("pipe_write"):
        return True
    return wchan == "0" and state == "S" and time.monotonic() - since > 3


def test_every_page_is_listed_when_a_pages_last_session_is_evicted_while_the_reader_stalls(
    tmp_path: Path,
) -> None:
    # `journal sessions list` (every page) whose reader stalls: the command blocks on a
    # full pipe after a page or two; meanwhile sessions end, are evicted and compacted
    # away, the last one of the page being printed among them. Until 2026-12-05 the
    # command went on by page token, which names that session: INVALID_PAGE_TOKEN
    # ("start again without a token", though none was given), exit 4, and the sessions
    # left alone after it were never listed (a supervisor trial).
    from journal import RetentionPolicy

    store = tmp_path / "store"
    retention = RetentionPolicy(session_retention_ms=1)
    with Journal.open(store, retention=retention, segment_bytes=64 << 10) as j:
        for n in range(1000):
            j.create_session(f"s{n:04d}")
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "--store", str(store), "--format=json", "sessions", "list"],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        first = process.stdout.readline()
        since = time.monotonic()
        deadline = since + 30
        while not _blocked_writing(process.pid, since):
            assert process.poll() is None, "the listing ended before its reader stalled"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with Journal.open(store, segment_bytes=64 << 10) as j:
            for n in range(100, 900):
                j.resolve_session(f"s{n:04d}")
            time.sleep(0.01)
            j.apply_retention()
            j.compact(dead_share=0.0)
            j.compact(dead_share=0.0)
            assert [m.session_id for m in j.list_sessions()][99:101] == ["s0099", "s0900"]
        rest = process.stdout.read()
        errors = process.stderr.read().decode()
        assert process.wait(30) == 0, errors
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    ids = [json.loads(line)["session_id"] for line in [first, *rest.splitlines()]]
    assert ids == sorted(set(ids))  # (each once, in id order)
    assert ids[0] == "s0000"
    assert [i for i in ids if i < "s0100" or i >= "s0900"] == [
        f"s{n:04d}" for n in (*range(100), *range(900, 1000))
    ]


@pytest.mark.parametrize("output", ["text", "json"])
def test_a_watch_of_a_killed_workers_turn_names_the_command_that_settles_it(
    store: Path, output: str
) -> None:
    """`journal watch` of a session whose owner was killed mid-turn ends with
    WATCH_OUTCOME_UNKNOWN (exit 8). Its message said the next owner records the turn as
    failed "(`own()`, `journal sessions own ID`)": the library's call, and a command
    without the store the watch was given or the session's id. It names the command as
    it runs here, and keeps the error's fields (the cursor to resume from)."""
    worker = _worker(store)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    watched = run_cli(store, "--format", output, "watch", "-s", "w")
    assert watched.returncode == EXIT_OUTCOME_UNKNOWN, watched.stderr
    command = f"`journal --store {store} sessions own w`"
    if output == "json":
        error = json_error(watched)
        message = error["message"]
        assert error["code"] == "WATCH_OUTCOME_UNKNOWN" and error["request_id"] == "r1"
        cursor = error["cursor"]
        assert cursor and error["session_ended"] is False
    else:
        message = watched.stderr
        cursor = watched.stdout.split("cursor=")[-1].strip()
        assert f"(resume with --cursor {cursor})" in message, message
    assert "own()" not in message and command in message, message
    owned = run_cli(store, "sessions", "own", "w")  # (the command as the message gives it)
    assert owned.returncode == 0, owned.stderr
    resumed = run_cli(store, "--format", "json", "read", "-s", "w", "--cursor", cursor)
    assert resumed.returncode == 0, resumed.stderr
    (result,) = [json.loads(line) for line in resumed.stdout.splitlines()[:1]]
    assert result["result"]["error"]["code"] == "WATCH_OUTCOME_UNKNOWN", result
