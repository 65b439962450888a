"""Reading the snapshot or checkpoint record a session's row names, from its frame."""

from __future__ import annotations

from ..engine import StoredSnapshot
from ..errors import JournalCorrupt
from ..records import CheckpointTaken, SnapshotTaken, decode_frame_body
from ..sessions import SessionRow
from .log import SegmentLog
from .segments import SegmentReader, frame_records

__all__ = ["stored_record"]


def stored_record(
    log: SegmentLog, row: SessionRow, kind: type[SnapshotTaken | CheckpointTaken]
) -> StoredSnapshot:
    """The row's snapshot (`SnapshotTaken`) or checkpoint (`CheckpointTaken`): its
    position, coverage and data; `JournalCorrupt` when the frame the row names lacks it."""
    if kind is SnapshotTaken:
        segment, offset, through = row.snapshot_segment, row.snapshot_offset, row.snapshot_ordinal
        at = row.snapshot_position
    else:
        segment, offset = row.checkpoint_segment, row.checkpoint_offset
        through, at = row.checkpoint_ordinal, row.checkpoint_position
    with SegmentReader(log.directory, segment, log.ops) as reader:
        info, body = reader.read_frame(offset)
        position = info.first_position
        for record in frame_records(reader.name, info, body, decode_frame_body):
            # (The record at the row's position: one frame may hold two of one session
            # through one ordinal, and the row names the later. Until 2026-12-04 the
            # first was read, the replaced one's data; found by a review.)
            if (
                isinstance(record, kind)
                and record.incarnation == row.incarnation
                and record.through_ordinal == through
                and (position == at or not at)
            ):
                return StoredSnapshot(position, record.through_ordinal, record.data)
            position += 1
    what = "snapshot" if kind is SnapshotTaken else "checkpoint"
    raise JournalCorrupt(reader.name, offset, f"the {what} of {row.session_id!r} is missing")
