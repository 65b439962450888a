"""Ctrl+C during the long store commands (`verify`, `compact`, `export`, `import`,
`import --list`), through real processes (SPEC.md section 13)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _cli_runs import ROOT, cli_env, run_cli

from journal import EventIn, Journal

# The command runs in this process; a thread runs the SIGINT handler the command has in
# place (the first handler other than Python's default one, or the default one after
# 5 s) and swallows its KeyboardInterrupt: what happens when the handler runs while
# the main thread runs a finalizer ("Exception ignored in"). Then it says so on stderr.
_LOST_RAISE = """
import signal, sys, threading, time
from cli import run

def lose() -> None:
    began = time.monotonic()
    while signal.getsignal(signal.SIGINT) is signal.default_int_handler:
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
    "args",
    [
        ["verify"],
        ["compact", "--dead-share", "0"],
        ["export", "--all", "-o", "{tmp}/all.archive"],
        ["export", "--all", "-o", "-", "--format", "ndjson"],
    ],
)
def test_a_ctrl_c_whose_raise_is_lost_still_ends_a_store_command(
    store: Path, tmp_path: Path, args: list[str]
) -> None:
    """Until 2026-12-04 the command ran on to its end and exited 0 (only `watch` noted
    its signals): a Ctrl+C whose KeyboardInterrupt Python swallowed, because it came
    while the main thread ran a finalizer (the library lets segment readers go as it
    reads), was lost."""
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in args]
    status, stderr = _ended(_lost_raise(store, *args))
    assert status == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.splitlines()[0] == "lost", stderr


def test_a_lost_ctrl_c_ends_import_list_and_import_before_anything_is_imported(
    store: Path, tmp_path: Path
) -> None:
    archive = tmp_path / "all.archive"
    assert run_cli(store, "export", "--all", "-o", str(archive)).returncode == 0
    data = archive.read_bytes()
    target = tmp_path / "target"
    assert run_cli(target, "init").returncode == 0
    for args in (["import", "--list", "-"], ["import", "-"]):
        process = _lost_raise(target, *args, stdin=subprocess.PIPE)
        assert process.stdin is not None and process.stderr is not None
        process.stdin.write(data[:4096])  # (the rest after the Ctrl+C)
        process.stdin.flush()
        assert process.stderr.readline() == b"lost\n"
        status, stderr = _ended(process, data[4096:])
        assert status == 130, (args, stderr)
        assert "Traceback" not in stderr, stderr
    assert stderr.splitlines()[0].startswith("journal: interrupted: nothing was imported")
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
    assert "Traceback" not in stderr, stderr
