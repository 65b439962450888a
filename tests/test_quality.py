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


def test_mypy_strict_on_journal_cursors_and_cli() -> None:
    result = run("mypy", "--strict", "journal", "cursors", "cli")
    assert result.returncode == 0, result.stdout + result.stderr


_UPDATE_TYPES = """
from journal import EventIn, Journal

fold = Journal.open("store").fold("s", lambda n, e: n + 1, 0)


def pair(n: int) -> tuple[list[EventIn], str]:
    return [EventIn("t", b"x")], "done"


reveal_type(fold.update(pair))
reveal_type(fold.update(lambda n: [EventIn("t", b"x")]))
reveal_type(fold.update(lambda n: None))
reveal_type(fold.update(lambda n: (EventIn("t", b"x"), n + 1)))
"""


def test_what_update_returns_is_typed_from_fn(tmp_path: Path) -> None:
    # update() was typed `-> Any`: a caller's result went unchecked.
    script = tmp_path / "update_types.py"
    script.write_text(_UPDATE_TYPES)
    # (a cache of its own: the run above, on another xdist worker at the same moment,
    # writes the project's `.mypy_cache`, and a fresh clone's CI once saw mypy stop with
    # an INTERNAL ERROR there)
    cache = tmp_path / "mypy-cache"
    result = run("mypy", "--strict", "--no-incremental", "--cache-dir", str(cache), str(script))
    revealed = [
        line.split("Revealed type is ")[1]
        for line in result.stdout.splitlines()
        if "Revealed" in line
    ]
    assert revealed == ['"str"', '"None"', '"None"', '"int"'], result.stdout + result.stderr
    assert "error" not in result.stdout, result.stdout


def test_public_names_are_declared() -> None:
    import cursors
    import journal

    for module in (journal, cursors):
        assert module.__all__, module
        for name in module.__all__:
            assert hasattr(module, name), (module.__name__, name)
