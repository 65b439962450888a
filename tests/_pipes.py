"""Talking to a helper process over its pipes (tests that start `python tests/_procs*.py`)."""

from __future__ import annotations

import subprocess

__all__ = ["line", "send"]


def send(proc: subprocess.Popen[str]) -> None:
    """Write the `go` line a helper waits for."""
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def line(proc: subprocess.Popen[str]) -> str:
    """The helper's next line, stripped."""
    assert proc.stdout is not None
    return proc.stdout.readline().strip()
