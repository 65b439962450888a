"""Static checks that CI must keep green: ruff (lint + format) and mypy --strict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_ruff_lint_is_clean() -> None:
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_on_journal_and_cursors() -> None:
    result = run("mypy", "--strict", "journal", "cursors")
    assert result.returncode == 0, result.stdout + result.stderr


def test_public_names_are_declared() -> None:
    import cursors
    import journal

    for module in (journal, cursors):
        assert module.__all__, module
        for name in module.__all__:
            assert hasattr(module, name), (module.__name__, name)
