"""Helper process for tests/test_folds.py (run as `python tests/_procs_folds.py ...`).

counter STORE SESSION COUNT [TRIES|default [DURABILITY]]
    Open the store, print `ready`, wait for a line on stdin, then increment the
    session's counter COUNT times through `Fold.update` (each update appends one
    event carrying the new value; with TRIES tries, 1,000 unless given, or the fold's
    default with `default`; durability "os" unless given), print `done CALLS` (the fn
    calls it took), exit 0.
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


def counter(
    store: str, session_id: str, times: str, tries: str = "1000", durability: str = "os"
) -> None:
    with Journal.open(store, durability=durability) as j:  # type: ignore[arg-type]
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
            fold.update(increment, tries=None if tries == "default" else int(tries))
        print(f"done {calls}", flush=True)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"counter": counter}[command](*args)
