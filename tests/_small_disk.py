"""A real small disk for a test: an empty tmpfs of a given size, mounted in a private user
and mount namespace, where a child process runs a script (the full-disk tests: ENOSPC as
the kernel returns it, short writes included)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

__all__ = ["on_a_small_disk"]


def on_a_small_disk(tmp_path: Path, script: str, options: str = "size=2m") -> list[str]:
    """Run `script` (its argv[1]: an empty 2 MiB tmpfs, or one mounted with `options`) in
    a private user and mount namespace; its output lines. Skips where such a mount cannot
    be made (no unshare(1), or user namespaces refused); as root, or as a user where user
    namespaces are allowed (this project's machines), it runs."""
    disk = tmp_path / "disk"
    disk.mkdir()
    child = tmp_path / "child.py"
    child.write_text(script)
    root = Path(__file__).resolve().parent.parent
    shell = (
        f"mount -t tmpfs -o {options} tmpfs {disk} || exit 99; "
        f"PYTHONPATH={root} {sys.executable} {child} {disk}"
    )
    try:
        done = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", shell],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except FileNotFoundError:
        pytest.skip("no unshare(1)")
    if done.returncode == 99 or "unshare:" in done.stderr:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 0, (
        f"the child died (status {done.returncode}; 135 is SIGBUS): {done.stderr[-800:]}\n"
        f"it printed: {done.stdout}"
    )
    return done.stdout.splitlines()
