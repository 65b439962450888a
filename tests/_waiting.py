"""Taking the next item of a blocking iterator (a watch) without hanging a test."""

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
