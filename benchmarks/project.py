"""The project's own storage under the same workloads: the segment log."""

from __future__ import annotations

from typing import Final

from journal.records import EventAppended, Record, decode_frame_body, encode_frame_body
from journal.segments import FrameDigest, SegmentLog

from .events import BASE_TIMESTAMP_MS, EVENT_TYPE, SESSION, Dataset
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
            # The digest lets the sidecar be built as frames are appended (as the journal
            # does), so sealing a segment needs no rescan.
            digest = FrameDigest(
                {INCARNATION: (first_seq, first_seq + len(bodies) - 1)},
                [(0, INCARNATION, first_seq, len(bodies), len(bodies) * len(bodies[0]), 0)],
                [],
            )
            log.append(encode_frame_body(records), len(records), digest)

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
