"""What a start-up imports: the `journal` command on a store on disk, and a program that
uses the library on one, load neither asyncio nor the JetStream engine, the export and
import machinery or the demo's child processes. Each is paid by every command at its
start (asyncio alone, with the ssl module it brings, was about a tenth of it), and the
modules that use them import them when they run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _cli_runs import cli_env

NOT_AT_START_UP = (
    "asyncio",
    "nats",
    "journal._jetstream",
    "journal.transfer",
    "cli.demo_restart",
)


def _imported(*args: str, stdin: str | None = None) -> set[str]:
    """The modules a real process of `python -X importtime ARGS` imported, all of them
    (importtime names each on stderr as it is first imported), once it succeeded."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        input=stdin,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    return {line.rsplit("|", 1)[-1].strip() for line in lines}


def _heavy(modules: set[str]) -> list[str]:
    return sorted(
        name
        for name in modules
        if any(name == heavy or name.startswith(heavy + ".") for heavy in NOT_AT_START_UP)
    )


@pytest.fixture(scope="module")
def resolved_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store on disk with a resolved session `done` (its watch ends after its event)."""
    path = str(tmp_path_factory.mktemp("start-up") / "store")
    journal = [sys.executable, "-m", "cli", "--store", path]
    for setup in (
        ["init"],
        ["append", "-s", "done", "--create", "x"],
        ["sessions", "resolve", "done"],
    ):
        subprocess.run([*journal, *setup], env=cli_env(), capture_output=True, check=True)
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["--help"],
        ["init"],
        ["append", "-s", "s", "--create", "hello"],
        ["read", "-s", "done"],
        ["watch", "-s", "done"],
        ["sessions", "list"],
        ["sessions", "show", "done"],
        ["stats"],
        ["verify"],
        ["compact"],
    ],
    ids=" ".join,
)
def test_a_command_on_a_store_on_disk_imports_nothing_it_does_not_use(
    resolved_store: str, command: list[str]
) -> None:
    imported = _imported("-m", "cli", "--store", resolved_store, *command)
    assert "journal._local.engine" in imported  # (the names were read from stderr)
    assert _heavy(imported) == []


def test_a_program_using_the_library_on_disk_imports_none_of_them(tmp_path: Path) -> None:
    program = (
        "import sys\n"
        "import journal\n"
        "with journal.Journal.open(sys.argv[1], create=True) as j:\n"
        "    j.append('s', [journal.EventIn('m', b'x')], create=True)\n"
        "    assert [e.data for e in j.read('s').events] == [b'x']\n"
        "    j.resolve_session('s')\n"
        "    assert [e.data for e in j.watch('s')] == [b'x']\n"
    )
    imported = _imported("-c", program, str(tmp_path / "store"))
    assert "journal._local.engine" in imported
    assert _heavy(imported) == []
