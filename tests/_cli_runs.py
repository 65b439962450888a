"""Running the `journal` command as a user does (a real process, this checkout on its
path, no `JOURNAL_STORE` from the caller's environment), and reading its JSON error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("JOURNAL_STORE", None)
    return env


def run_cli(
    store: Path | str, *args: str, timeout: float = 60, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", "--store", str(store), *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=timeout,
        input=stdin,
        check=False,
    )


def json_error(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The error object of the last `{"error": ...}` line a command printed."""
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"error"')]
    assert lines, (done.stdout, done.stderr)
    error: dict[str, Any] = json.loads(lines[-1])["error"]
    return error
