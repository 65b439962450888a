"""Helper process for tests/test_folds.py (run as `python tests/_procs_folds.py ...`).

counter STORE SESSION COUNT
    Open the store, print `ready`, wait for a line on stdin, then increment the
    session's counter COUNT times through `Fold.update` (each update appends one
    event carrying the new value), print `done TRIES` (the fn calls it took), exit 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from journal import Event, EventIn, Journal  # noqa: E402


def count(state: int, event: Event) -> int:
    return state + 1 if event.type == "incremented" else state


def counter(store: str, session_id: str, times: str) -> None:
    with Journal.open(store, durability="os") as j:
        fold = j.fold(session_id, count, 0)
        print("ready", flush=True)
        sys.stdin.readline()
        calls = 0

        def increment(state: int) -> tuple[list[EventIn], int]:
            nonlocal calls
            calls += 1
            value = state + 1
            return [EventIn(type="incremented", data=json.dumps(value).encode())], value

        for _ in range(int(times)):
            fold.update(increment, tries=1000)
        print(f"done {calls}", flush=True)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"counter": counter}[command](*args)
