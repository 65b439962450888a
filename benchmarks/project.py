"""The project's own storage under the same workloads: the segment log."""

from __future__ import annotations

from typing import Final

from journal.records import EventAppended, Record, decode_frame_body, encode_frame_body
from journal.segments import SegmentLog

from .events import BASE_TIMESTAMP_MS, EVENT_TYPE, Dataset
from .timing import Measurement, store_files, time_batches, time_read

STORE_ID: Final = b"B" * 16
SEGMENT_BYTES: Final = 64 << 20
INCARNATION: Final = 1


def segment_log_append(directory: str, data: Dataset) -> Measurement:
    """One frame per batch, fdatasync'd before `append` returns.

    Building and encoding the records is inside the timed loop: it is part of what an
    append costs. Rotation and sealing of full segments happen inside it too.
    """
    log = SegmentLog(directory, STORE_ID, segment_bytes=SEGMENT_BYTES, sync=True)
    log.open_writer()
    try:

        def write_batch(first_seq: int, bodies: list[bytes]) -> None:
            records: list[Record] = [
                EventAppended(
                    incarnation=INCARNATION,
                    ordinal=first_seq + i,
                    timestamp_ms=BASE_TIMESTAMP_MS + first_seq + i,
                    type=EVENT_TYPE,
                    data=body,
                )
                for i, body in enumerate(bodies)
            ]
            log.append(encode_frame_body(records), len(records))

        measurement = time_batches(data, write_batch)
        measurement.files = store_files(directory)
    finally:
        log.close()
    return measurement


def segment_log_scan(directory: str, data: Dataset) -> Measurement:
    """Every frame from position 1 across all segments, each record decoded."""

    def read_all() -> int:
        log = SegmentLog(directory, STORE_ID)
        count = 0
        for _info, body in log.frames():
            for _record in decode_frame_body(body):
                count += 1
        return count

    return time_read(data.count, read_all)
