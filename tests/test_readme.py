"""README examples run as tests, so they never rot."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cli.main import main

README = Path(__file__).resolve().parent.parent / "README.md"


def test_python_examples_in_readme_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (The examples' `tempfile.mkdtemp()` stores go under tmp_path, removed with it.)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme_example"})


def test_readme_opens_with_the_two_commands() -> None:
    text = README.read_text()
    test_command = "python -m pip install -e '.[test]' && python -m pytest -q"
    assert test_command in text
    assert "python -m pip install -e . && journal demo" in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert test_command in ci, ".ci/run must run exactly the README's test command"


def _options(
    command: click.Command, words: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], list[str]]]:
    """(the command's words, the spellings of one of its options), for every option."""
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _options(sub, (*words, name))
        return
    for param in command.params:
        if isinstance(param, click.Option) and "--help" not in param.opts:
            yield words, param.opts


def test_the_readme_names_every_option_of_every_command() -> None:
    # A new user (a trial) read `journal append -s ID [--create] [--type T]
    # [--expected-last N] [--idempotency-key K] [DATA...]` and never learnt of
    # --request-id; `sessions list --state/--page-size` and `sessions create
    # --context-id` were named nowhere either. An option counts when one of its
    # spellings (`-o` for `--output`) is in the README.
    text = README.read_text()
    missing = [
        (words, spellings)
        for words, spellings in _options(main)
        if not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text) for o in spellings)
    ]
    assert len(list(_options(main))) > 40  # (every command's, not none)
    assert missing == [], missing


def test_the_readme_shows_cursor_key_as_it_prints_rotated_keys(tmp_path: Path) -> None:
    # The README said `journal cursor-key` prints `ID:HEX`: after a rotation it prints
    # every key, comma-separated, the active one first.
    store = str(tmp_path / "store")
    runner = CliRunner()
    assert runner.invoke(main, ["--store", store, "init"]).exit_code == 0
    assert runner.invoke(main, ["--store", store, "cursor-key", "--rotate"]).exit_code == 0
    printed = runner.invoke(main, ["--store", store, "cursor-key"]).output.strip()
    assert re.fullmatch(r"2:[0-9a-f]{64},1:[0-9a-f]{64}", printed), printed
    text = " ".join(README.read_text().split())
    assert "`ID:HEX,ID:HEX,...` with the active key first" in text
