"""Traps a new user of the `journal` command met in trials (SPEC.md section 13), through
real processes as the user runs them: usage errors, cursors and page tokens passed back
from a script, the listing's columns and cut archives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from journal import EventIn, Journal

ROOT = Path(__file__).resolve().parent.parent


def _cli(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("JOURNAL_STORE", None)
    return subprocess.run(
        [sys.executable, "-m", "cli", "--store", str(store), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def _error(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"error"')]
    assert lines, (done.stdout, done.stderr)
    error: dict[str, Any] = json.loads(lines[-1])["error"]
    return error


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    with Journal.open(path, create=True) as j:
        j.create_session("s")
        j.append("s", [EventIn("message", b"one"), EventIn("message", b"two")])
    return path


# -- usage errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "usage", "says"),
    [
        # click's parser raises these without the command's context: they printed the
        # error line alone, where other usage errors print the usage line first.
        (("read", "--session"), "journal read [OPTIONS]", "Option '--session' requires"),
        (("read", "-s", "s", "--cursor"), "journal read [OPTIONS]", "Option '--cursor'"),
        (("read", "-s", "s", "--format"), "journal read [OPTIONS]", "Option '--format'"),
        (("sessions", "watch", "--cursor"), "journal sessions watch [OPTIONS]", "Option"),
        (("sessions", "create", "x", "--tag"), "journal sessions create [OPTIONS] ID", "Option"),
        # The command's own usage errors printed no usage line either.
        (("cursor-key", "--new", "--rotate"), "journal cursor-key [OPTIONS]", "--new, --rotate"),
        (("init", "--replicas", "2"), "journal init [OPTIONS]", "--replicas is for nats://"),
        # click's usage errors printed the usage line but not where help is.
        (("read", "--bogus"), "journal read [OPTIONS]", "No such option '--bogus'"),
    ],
)
def test_every_usage_error_prints_the_usage_and_where_help_is(
    store: Path, args: tuple[str, ...], usage: str, says: str
) -> None:
    done = _cli(store, *args)
    assert done.returncode == 2, done.stderr
    command = usage.split(" [")[0]
    assert done.stderr.splitlines() == [
        f"Usage: {usage}",
        f"Try '{command} --help' for help.",
        done.stderr.splitlines()[-1],
    ], done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"journal: error: {says}"), done.stderr
    # With --format json the error object is on stdout, and stderr is the one error line.
    as_json = _cli(store, "--format", "json", *args)
    assert as_json.returncode == 2 and _error(as_json)["code"] == "USAGE"
    assert as_json.stderr.count("\n") == 1, as_json.stderr
