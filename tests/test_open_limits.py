"""Opens that meet the process's descriptor limit (EMFILE), as a service that opens a
journal per request or per tenant may, and many open/close cycles in one process.

An open that cannot get a descriptor raises `StoreUnavailable` with errno EMFILE and
says what helps (`ulimit -n`), wherever in the open it ran out: it was blamed on a damaged
`store.json` ("restore it from a backup") when the first file it opened was the one
refused, and on a store "never opened for writing" when a read-only open ran out at the
view (helper trial h24e, 2026-12-06).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.isdir("/proc/self/fd"),
    reason="needs /proc/self/fd",
)

ROOT = Path(__file__).resolve().parent.parent

# For free = 0, 1, ... descriptors left below a lowered limit (the rest taken by
# /dev/null), an open of a new store, of an existing one and a read-only one; one JSON
# line each: [free, kind, None | [error class, errno, message]]; then the descriptors
# open before and after the sweep.
_SWEEP = r"""
import json, os, resource, sys
from journal import EventIn, Journal, JournalError
root, top = sys.argv[1], int(sys.argv[2])
existing = os.path.join(root, "existing")
with Journal.open(existing, durability="os") as j:
    j.create_session("s")
    j.append("s", [EventIn("m", b"x")])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, soft), hard))
before = len(os.listdir("/proc/self/fd"))
for free in range(top):
    for kind in ("new", "existing", "readonly"):
        path = os.path.join(root, f"new{free}") if kind == "new" else existing
        fillers = []
        try:
            while True:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        for _ in range(free):
            os.close(fillers.pop())
        opened = None
        try:
            opened = Journal.open(path, durability="os", readonly=kind == "readonly")
            outcome = None
        except JournalError as e:
            outcome = [type(e).__name__, getattr(e, "errno", None), str(e)]
        finally:
            for fd in fillers:
                os.close(fd)
        if opened is not None:
            opened.close()
        print(json.dumps([free, kind, outcome]), flush=True)
print(json.dumps(["fds", before, len(os.listdir("/proc/self/fd"))]), flush=True)
"""


def test_an_open_out_of_descriptors_says_so_wherever_it_ran_out(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SWEEP, str(tmp_path), "12"],
        capture_output=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    *opens, (_, before, after) = lines
    failed = [(free, kind, outcome) for free, kind, outcome in opens if outcome is not None]
    assert failed, "the sweep never ran out of descriptors"
    assert any(free == 11 and outcome is None for free, _, outcome in opens), opens[-3:]
    for free, kind, (name, number, message) in failed:
        where = f"{kind} store, {free} descriptors free: {name}: {message}"
        assert name == "StoreUnavailable" and number == errno.EMFILE, where
        assert "ulimit -n" in message, where
        for misleading in ("damaged", "backup", "never opened for writing"):
            assert misleading not in message, where
    assert after == before, "failed opens left descriptors open"


# A key ring read with no descriptor left: [class, message].
_KEYS = r"""
import json, os, resource, sys
from cursors import KeyRing, KeyRingError
path = os.path.join(sys.argv[1], "keys")
KeyRing.load_or_create(path)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, soft), hard))
fillers = []
try:
    while True:
        fillers.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
try:
    KeyRing.load(path)
    outcome = None
except KeyRingError as e:
    outcome = str(e)
for fd in fillers:
    os.close(fd)
print(json.dumps(outcome))
"""


def test_a_key_ring_read_out_of_descriptors_says_so(tmp_path: Path) -> None:
    """It said to check that the key file is a file its owner and permissions let this
    user read."""
    done = subprocess.run(
        [sys.executable, "-c", _KEYS, str(tmp_path)], capture_output=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    message = json.loads(done.stdout)
    assert message is not None and "Too many open files" in message, message
    assert "ulimit -n" in message and "permissions" not in message, message


def test_a_read_only_open_of_a_store_with_a_damaged_key_file_does_not_ask_for_access(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that may read the key file is told it is damaged, not to be given read
    access to it (it was told both)."""
    from journal import EventIn, Journal, KeyRingError

    monkeypatch.delenv("JOURNAL_CURSOR_KEY", raising=False)
    monkeypatch.delenv("JOURNAL_CURSOR_KEY_FILE", raising=False)
    store = tmp_path / "store"
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
        j.append("s", [EventIn("m", b"x")])
    (store / "keys").write_bytes(b"garbage\x00\xff")
    for readonly in (False, True):
        with pytest.raises(KeyRingError) as raised:
            Journal.open(store, readonly=readonly)
        assert "is invalid" in raised.value.message and "backup" in raised.value.message
        assert "read access" not in raised.value.message
