"""The `journal` command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from click.testing import CliRunner

import journal
from cli.main import main


def test_help_and_version() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "--store" in result.output and "--format" in result.output
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0
    assert journal.__version__ in result.output


def test_console_script_is_installed() -> None:
    # the README's install puts `journal` on PATH beside the interpreter that runs the tests
    script = shutil.which("journal") or shutil.which(
        "journal", path=os.path.dirname(sys.executable)
    )
    assert script is not None, "the `journal` console script is not installed"
    result = subprocess.run(
        [script, "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and journal.__version__ in result.stdout
