"""Waiting in tests without hanging them: the next item of a blocking iterator (a watch),
and whether a process waits for a `flock`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any


def first_of(iterator: Iterator[Any], timeout: float) -> Any:
    """next(iterator) in a thread, failing the test instead of hanging."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(("value", next(iterator)))
        except BaseException as e:
            box.append(("error", e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert box, f"nothing arrived within {timeout}s"
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def blocked_on_flock(pid: int) -> bool:
    """Whether process `pid` waits for a `flock` (Linux: `/proc/locks`)."""
    with open("/proc/locks") as locks:
        # ("3: -> FLOCK  ADVISORY  WRITE 1234 ...": a waiter, its pid sixth)
        return any(
            fields[1] == "->" and fields[5] == str(pid)
            for fields in (line.split() for line in locks)
            if len(fields) > 5
        )
