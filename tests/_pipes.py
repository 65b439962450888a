"""Talking to a helper process over its pipes (tests that start `python tests/_procs*.py`)."""

from __future__ import annotations

import contextlib
import subprocess

__all__ = ["close_pipes", "line", "reap", "send"]


def send(proc: subprocess.Popen[str]) -> None:
    """Write the `go` line a helper waits for."""
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def line(proc: subprocess.Popen[str]) -> str:
    """The helper's next line, stripped."""
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def close_pipes(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """Close the parent's ends of `proc`'s pipes (left open they are garbage that warns
    ResourceWarning in whichever later test collects it)."""
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def reap(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """Kill `proc` if it still runs, wait for it, and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    close_pipes(proc)
