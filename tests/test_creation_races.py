"""Processes creating one store at once, and readers (read-only opens, `journal stats`,
`journal cursor-key`) racing them (SPEC 7, "creating"): every creator's open and append
succeed in the one store; a reader finds no store (`StoreNotFound`, exit 3) or the store,
never a damaged one; nothing is left marked unfinished."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _cli_runs import ROOT, cli_env

from journal import Journal

# argv: STORE GO INDEX. Wait for GO, then open (creating), make session s<INDEX>, append.
_CREATOR = """
import os, sys, time
from journal import EventIn, Journal
store, go, index = sys.argv[1:]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.0005)
with Journal.open(store) as j:
    j.create_session(f"s{index}")
    j.append(f"s{index}", [EventIn("m", index.encode())])
print("created")
"""

# argv: STORE GO DONE. Wait for GO, then open read-only (and with create=False) until DONE
# exists; print one line per outcome kind: "none", "open", or "error TYPE MESSAGE".
# (Both print "ready" once imported.)
_READER = """
import os, sys, time
from journal import Journal, StoreNotFound
store, go, done = sys.argv[1:]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.0005)
seen = set()
options = ({"readonly": True}, {"create": False})
turn = 0
while True:
    last = os.path.exists(done)
    turn += 1
    try:
        with Journal.open(store, **options[turn % 2]) as j:
            sessions = [s.session_id for s in j.list_sessions()]
            for session in sessions:
                list(j.replay(session))
        seen.add("open")
    except StoreNotFound:
        seen.add("none")
    except Exception as e:
        seen.add(f"error {type(e).__name__} {e}")
    if last:
        break
for line in sorted(seen):
    print(line)
"""


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _race(tmp_path: Path, trial: int, creators: int, readers: int, commands: int) -> None:
    store = tmp_path / f"t{trial}" / "store"
    go, done = tmp_path / f"go{trial}", tmp_path / f"done{trial}"
    making = [_spawn(_CREATOR, str(store), str(go), str(i)) for i in range(creators)]
    reading = [_spawn(_READER, str(store), str(go), str(done)) for _ in range(readers)]
    for process in [*making, *reading]:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
    go.touch()
    cli = []
    for i in range(commands):
        command = ["stats"] if i % 2 else ["cursor-key"]
        cli.append(
            subprocess.Popen(
                [sys.executable, "-m", "cli", "--store", str(store), *command],
                env=cli_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for process in making:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0 and out.strip() == "created", err
    for process in cli:
        out, err = process.communicate(timeout=120)
        # (0: the store, found; 3: no store yet, its creation not finished or not begun)
        assert process.returncode in (0, 3), (process.args, process.returncode, err)
        if process.returncode == 3:
            assert "no journal store" in err, err
    done.touch()
    for process in reading:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        errors = [line for line in out.splitlines() if line.startswith("error")]
        assert not errors, errors
    assert "creating" not in os.listdir(store)
    with Journal.open(store, readonly=True) as j:
        for i in range(creators):
            assert [e.data for e in j.replay(f"s{i}")] == [str(i).encode()]


def test_creators_and_readers_race(tmp_path: Path) -> None:
    _race(tmp_path, 0, creators=3, readers=2, commands=2)


@pytest.mark.slow
def test_creators_and_readers_race_many_times(tmp_path: Path) -> None:
    for trial in range(12):
        _race(tmp_path, trial, creators=4, readers=3, commands=4)
