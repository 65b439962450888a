"""README examples run as tests, so they never rot."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_python_examples_in_readme_run() -> None:
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
