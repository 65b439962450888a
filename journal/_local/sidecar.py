"""Sidecars: the immutable index written beside each sealed segment (frames, per-session
ordinal ranges, event runs and the other records), so sealed segments are found, and a
view rebuilt, without reading them. Also the one run coalescer: consecutive events of one
session are described as one `EventRun` everywhere (planner, frame digest, sidecar).
"""

from __future__ import annotations

import bisect
import os
import struct
from array import array
from collections.abc import Sequence
from typing import Final

import msgspec

from ..records import (
    TURN_EVENT_TYPES,
    CheckpointTaken,
    EventAppended,
    Record,
    SnapshotTaken,
    decode_record,
)
from .files import (
    DEFAULT_FILE_OPS,
    DEFAULT_PERMISSIONS,
    FileOps,
    NotRegularFile,
    Permissions,
    open_regular,
    write_atomic,
)
from .frames import FRAME_HEADER_SIZE, SEGMENT_HEADER_SIZE, frame_crc32, sidecar_name

__all__ = [
    "SUMMARY_FORMAT",
    "EventRun",
    "FrameDigest",
    "SegmentSummary",
    "SidecarRecord",
    "SidecarRun",
    "SummaryBuilder",
    "add_run",
    "digest_records",
    "encode_other",
    "read_summary",
    "sidecar_intact",
    "write_summary",
]

SUMMARY_FORMAT: Final = 2
SIDECAR_MAGIC: Final = b"SJIDX\x00\r\n"
_SIDECAR_HEADER: Final = struct.Struct(">8sI")


class EventRun(msgspec.Struct, array_like=True, gc=False):
    """Consecutive events of one session in one frame: from record `start` (index in the
    frame) on, `count` events with ordinals from `first_ordinal`, `data_bytes` of data."""

    start: int
    incarnation: int
    first_ordinal: int
    count: int
    data_bytes: int
    time_ms: int


def add_run(runs: list[EventRun], run: EventRun) -> None:
    """Append `run`, merged into the previous run when it simply continues it (the one
    run coalescer: the planner and a rescan of a frame describe it the same way)."""
    if runs:
        last = runs[-1]
        if (
            last.start + last.count == run.start
            and last.incarnation == run.incarnation
            and last.first_ordinal + last.count == run.first_ordinal
        ):
            last.count += run.count
            last.data_bytes += run.data_bytes
            return
    runs.append(run)


class FrameDigest(msgspec.Struct, gc=False):
    """What a frame holds, for its segment's sidecar: its event runs, the other records
    (index in the frame, encoded record), and of those the events that are never part of
    a run (turn events, kept out so every projection sees their type: index, incarnation,
    ordinal), which still count as the session's events in the frame."""

    event_runs: list[EventRun]
    others: list[tuple[int, bytes]]
    loose_events: list[tuple[int, int, int]] = []

    @property
    def sessions(self) -> dict[int, tuple[int, int]]:
        """incarnation -> (first, last) ordinal of its events in the frame."""
        ranges: dict[int, tuple[int, int]] = {}
        if not self.loose_events:
            # (The common frame, once per commit: its runs are in frame order already.)
            for run in self.event_runs:
                seen = ranges.get(run.incarnation)
                ranges[run.incarnation] = (
                    seen[0] if seen else run.first_ordinal,
                    run.first_ordinal + run.count - 1,
                )
            return ranges
        spans = [(r.start, r.incarnation, r.first_ordinal, r.count) for r in self.event_runs]
        spans += [
            (index, incarnation, ordinal, 1) for index, incarnation, ordinal in self.loose_events
        ]
        spans.sort()
        for _, incarnation, first, count in spans:
            seen = ranges.get(incarnation)
            ranges[incarnation] = (seen[0] if seen else first, first + count - 1)
        return ranges


_digest_encoder: Final = msgspec.msgpack.Encoder()


def encode_other(record: Record) -> bytes:
    """A non-event record as the sidecar keeps it (a snapshot or checkpoint without its
    data)."""
    if isinstance(record, (SnapshotTaken, CheckpointTaken)):
        record = msgspec.structs.replace(record, data=b"")
    return _digest_encoder.encode(record)


def digest_records(records: Sequence[Record]) -> FrameDigest:
    """The digest of a frame's decoded records (what the planner computes as it plans)."""
    runs: list[EventRun] = []
    others: list[tuple[int, bytes]] = []
    loose: list[tuple[int, int, int]] = []
    for index, record in enumerate(records):
        if isinstance(record, EventAppended) and record.type in TURN_EVENT_TYPES:
            others.append((index, encode_other(record)))
            loose.append((index, record.incarnation, record.ordinal))
        elif isinstance(record, EventAppended):
            add_run(
                runs,
                EventRun(
                    index,
                    record.incarnation,
                    record.ordinal,
                    1,
                    len(record.data),
                    record.timestamp_ms,
                ),
            )
        else:
            others.append((index, encode_other(record)))
    return FrameDigest(runs, others, loose)


class SidecarRun(msgspec.Struct, array_like=True, gc=False):
    """An `EventRun` as a sidecar keeps it: by store position and frame offset."""

    position: int
    incarnation: int
    first_ordinal: int
    count: int
    frame_offset: int
    data_bytes: int
    time_ms: int


class SidecarRecord(msgspec.Struct, array_like=True, gc=False):
    """A non-event record as a sidecar keeps it (msgpack; a snapshot without its data)."""

    position: int
    frame_offset: int
    encoded: bytes


class SegmentSummary(msgspec.Struct, array_like=True):
    """A sealed segment's sidecar index: frames, per-session ordinal runs, zstd blocks.

    `sessions` maps an incarnation to one (first_ordinal, last_ordinal, frame_offset) entry
    per frame holding that session's events, so a resume seeks straight to its frame.
    `blocks` is empty for a plain segment; otherwise (uncompressed offset, uncompressed
    length, file offset, compressed length) per zstd block. Format 2 adds `event_runs` and
    `others`, from which a read-only reader projects the segment without reading it.
    """

    format: int
    base_position: int
    last_position: int
    data_end: int
    frames: list[tuple[int, int, int]]
    sessions: dict[int, list[tuple[int, int, int]]]
    blocks: list[tuple[int, int, int, int]] = []
    # Format 2: enough to project the segment into a view without reading it.
    event_runs: list[SidecarRun] = []
    others: list[SidecarRecord] = []

    def frame_at_or_before(self, position: int) -> int:
        """Offset of the frame that holds `position` (or the last one before it)."""
        at = bisect.bisect_right(self.frames, position, key=lambda frame: frame[1])
        return self.frames[at - 1][0] if at else SEGMENT_HEADER_SIZE


_summary_encoder: Final = msgspec.msgpack.Encoder()
_summary_decoder: Final = msgspec.msgpack.Decoder(SegmentSummary)


def write_summary(
    directory: str,
    summary: SegmentSummary,
    ops: FileOps = DEFAULT_FILE_OPS,
    permissions: Permissions = DEFAULT_PERMISSIONS,
) -> None:
    """Write a sidecar atomically (temp file, fsync, rename, fsync directory)."""
    body = _summary_encoder.encode(summary)
    path = os.path.join(directory, sidecar_name(summary.base_position))
    write_atomic(
        path, _SIDECAR_HEADER.pack(SIDECAR_MAGIC, frame_crc32(body, 0)) + body, ops, permissions
    )


def read_summary(directory: str, base_position: int) -> SegmentSummary | None:
    """The sidecar of a sealed segment, or None when it is missing or does not verify."""
    body = _checksummed_body(directory, base_position)
    if body is None:
        return None
    try:
        summary = _summary_decoder.decode(body)
    except msgspec.DecodeError:
        return None
    return summary if _plausible(summary, base_position) else None


def sidecar_intact(directory: str, base_position: int) -> bool:
    """Whether the sidecar of a sealed segment is there and its checksum holds: what a
    writer's open asks of every sealed segment (a rewrite for those that fail), without
    decoding it or checking it is consistent in itself. That costs about a microsecond a
    frame, and is done where a sidecar is used (`read_summary`), which treats one that
    fails as absent."""
    return _checksummed_body(directory, base_position) is not None


def _checksummed_body(directory: str, base_position: int) -> memoryview | None:
    try:
        path = os.path.join(directory, sidecar_name(base_position))
        with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as f:
            raw = f.read()
    except (FileNotFoundError, NotRegularFile):
        return None  # (not a file: replaced like a damaged one when a writer rewrites it)
    if len(raw) < _SIDECAR_HEADER.size:
        return None
    magic, crc = _SIDECAR_HEADER.unpack_from(raw)
    body = memoryview(raw)[_SIDECAR_HEADER.size :]
    # (frame_crc32: zlib's polynomial, from ISA-L where it is installed.)
    if magic != SIDECAR_MAGIC or frame_crc32(body, 0) != crc:
        return None
    return body


# Positions, ordinals, incarnations, sizes and times a sidecar may hold are below this, so
# sums of them stay within the view's u64 fields.
_SIDECAR_LIMIT: Final = 1 << 63


def _plausible(summary: SegmentSummary, base_position: int) -> bool:
    """Whether a checksummed sidecar is consistent in itself: its frames lie in order
    inside the segment and every run and record points at one of them, within its
    positions. Projecting it then cannot fail on a value; whether it matches its segment
    is `verify`'s question (a consistent forgery is only caught there)."""
    limit = _SIDECAR_LIMIT
    last = summary.last_position
    if not (
        1 <= summary.format <= SUMMARY_FORMAT
        and summary.base_position == base_position
        and 1 <= base_position <= last + 1 < limit
        and SEGMENT_HEADER_SIZE <= summary.data_end < limit
    ):
        return False
    frames: dict[int, tuple[int, int]] = {}
    previous_end = SEGMENT_HEADER_SIZE
    next_position = base_position
    for offset, first, count in summary.frames:
        if not (
            offset >= previous_end
            and offset + FRAME_HEADER_SIZE <= summary.data_end
            and next_position <= first
            and count >= 1
            and first + count - 1 <= last
        ):
            return False
        frames[offset] = (first, first + count)
        previous_end = offset + FRAME_HEADER_SIZE
        next_position = first + count
    for incarnation, spans in summary.sessions.items():
        if not 1 <= incarnation < limit:
            return False
        for first_ordinal, last_ordinal, offset in spans:
            if not (1 <= first_ordinal <= last_ordinal < limit and offset in frames):
                return False
    for block in summary.blocks:
        if not all(0 <= value < limit for value in block):
            return False
    for run in summary.event_runs:
        span = frames.get(run.frame_offset)
        if not (
            span is not None
            and span[0] <= run.position
            and run.count >= 1
            and run.position + run.count <= span[1]
            and 1 <= run.incarnation < limit
            and 1 <= run.first_ordinal < limit - run.count
            and 0 <= run.data_bytes < limit
            and 0 <= run.time_ms < limit
        ):
            return False
    for other in summary.others:
        span = frames.get(other.frame_offset)
        if span is None or not span[0] <= other.position < span[1]:
            return False
        try:
            decode_record(other.encoded)
        except msgspec.DecodeError:
            return False
    return True


class SummaryBuilder:
    """Accumulates a segment's sidecar frame by frame.

    The writer keeps one for its active segment for as long as the segment is active, so
    it is compact: flat arrays of 64-bit integers (about 100 bytes a frame, against about
    450 as tuples and structs), and the other records' encodings one after another in one
    buffer (a session created, resolved and evicted costs about 300 bytes, against 745 as
    structs, bytes objects and an array per session); the sidecar's lists are built once,
    when it is sealed."""

    def __init__(self) -> None:
        self._frames = array("q")  # offset, first position, count
        self._sessions = array("q")  # incarnation, first, last, offset: per frame and session
        self._runs = array("q")  # the fields of a SidecarRun, in order
        self._others = array("q")  # position, frame offset, length of its encoding
        self._encoded = bytearray()  # the encodings of the other records, in order

    def add(self, offset: int, first_position: int, count: int, digest: FrameDigest) -> None:
        self._frames.extend((offset, first_position, count))
        sessions = self._sessions
        for incarnation, (first, last) in digest.sessions.items():
            sessions.extend((incarnation, first, last, offset))
        runs = self._runs
        for run in digest.event_runs:
            runs.extend(
                (
                    first_position + run.start,
                    run.incarnation,
                    run.first_ordinal,
                    run.count,
                    offset,
                    run.data_bytes,
                    run.time_ms,
                )
            )
        for index, encoded in digest.others:
            self._others.extend((first_position + index, offset, len(encoded)))
            self._encoded += encoded

    @property
    def frames(self) -> list[tuple[int, int, int]]:
        return _triples(self._frames)

    @property
    def sessions(self) -> dict[int, list[tuple[int, int, int]]]:
        """incarnation -> its (first, last, frame offset) entries, in the order added."""
        found: dict[int, list[tuple[int, int, int]]] = {}
        it = iter(self._sessions)
        for incarnation, first, last, offset in zip(it, it, it, it, strict=True):
            entries = found.get(incarnation)
            if entries is None:
                entries = found[incarnation] = []
            entries.append((first, last, offset))
        return found

    @property
    def others(self) -> list[SidecarRecord]:
        records = []
        start = 0
        # (released on the way out, also on an error: a view kept would refuse the next add)
        with memoryview(self._encoded) as encoded:
            for position, frame_offset, length in _triples(self._others):
                end = start + length
                records.append(SidecarRecord(position, frame_offset, bytes(encoded[start:end])))
                start = end
        return records

    @property
    def event_runs(self) -> list[SidecarRun]:
        r = self._runs
        return [SidecarRun(*r[i : i + 7]) for i in range(0, len(r), 7)]

    def build(self, base: int, last_position: int, data_end: int) -> SegmentSummary:
        return SegmentSummary(
            SUMMARY_FORMAT,
            base,
            last_position,
            data_end,
            self.frames,
            self.sessions,
            [],
            self.event_runs,
            self.others,
        )


def _triples(values: array[int]) -> list[tuple[int, int, int]]:
    it = iter(values)
    return list(zip(it, it, it, strict=True))
