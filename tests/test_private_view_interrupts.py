"""A Ctrl+C while a read-only journal makes its private view's directory (SPEC section
10) leaves no directory behind once the process exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A writer holds the view, so each read-only open makes a private view. The k-th line
# that runs in the making of its directory (`_make_private_dir`, and `tempfile.mkdtemp`
# where it used that) raises KeyboardInterrupt, for k = 1, 2, ... until an open runs
# to its end; then the process exits (its private views removed at exit).
_INTERRUPTED_MAKING = """
import sys, tempfile
sys.path.insert(0, sys.argv[1])
from journal import EventIn, Journal
store, scratch = sys.argv[2], sys.argv[3]
tempfile.tempdir = scratch
writer = Journal.open(store, durability="os")
writer.append("s", [EventIn("m", b"x")], create=True)
fired = 0
for k in range(1, 1000):
    lines = [0]

    def local(frame, event, arg):
        if event == "line":
            lines[0] += 1
            if lines[0] == k:
                raise KeyboardInterrupt
        return local

    def trace(frame, event, arg):
        code = frame.f_code
        if code.co_name in ("_make_private_dir", "mkdtemp"):
            return local
        return None

    sys.settrace(trace)
    try:
        reader = Journal.open(store, readonly=True)
    except KeyboardInterrupt:
        fired += 1
        continue
    finally:
        sys.settrace(None)
    reader.close()
    break
writer.close()
print("fired", fired, flush=True)
"""


def test_a_ctrl_c_while_a_private_view_directory_is_made_leaves_none(tmp_path: Path) -> None:
    """`tempfile.mkdtemp` made the directory and then returned its name, which the
    reader then noted for removal: a Ctrl+C in between left it for good (without its
    holder file, which the next reader's sweep needs to take it for abandoned)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_MAKING, str(ROOT), str(tmp_path / "s"), str(scratch)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[1]) > 10, out.stdout  # (it fired: the test tests)
    assert sorted(p.name for p in scratch.iterdir()) == [], out.stdout
