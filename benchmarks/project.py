"""The project's own storage under the same workloads, through the public API."""

from __future__ import annotations

from typing import Final

from .events import EVENT_TYPE, SESSION, Dataset
from .timing import Measurement, store_files, time_batches, time_read

SEGMENT_BYTES: Final = 64 << 20


def journal_append(directory: str, data: Dataset) -> Measurement:
    """The public API: `Journal.append` of each batch, durable (fsync) before it returns."""
    from journal import EventIn, Journal

    with Journal.open(directory, segment_bytes=SEGMENT_BYTES) as j:
        j.create_session(SESSION)

        def write_batch(first_seq: int, bodies: list[bytes]) -> None:
            j.append(SESSION, [EventIn(EVENT_TYPE, body) for body in bodies])

        measurement = time_batches(data, write_batch)
        measurement.files = store_files(directory)
    return measurement


def journal_replay(directory: str, data: Dataset) -> Measurement:
    """The public API: `Journal.replay` of the whole session into decoded `Event`s."""
    from journal import Journal

    def read_all() -> int:
        with Journal.open(directory) as j:
            count = 0
            for _event in j.replay(SESSION):
                count += 1
        return count

    return time_read(data.count, read_all)
