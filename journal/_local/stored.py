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
    else:
        segment, offset = row.checkpoint_segment, row.checkpoint_offset
        through = row.checkpoint_ordinal
    with SegmentReader(log.directory, segment, log.ops) as reader:
        info, body = reader.read_frame(offset)
        position = info.first_position
        for record in frame_records(reader.name, info, body, decode_frame_body):
            if (
                isinstance(record, kind)
                and record.incarnation == row.incarnation
                and record.through_ordinal == through
            ):
                return StoredSnapshot(position, record.through_ordinal, record.data)
            position += 1
    what = "snapshot" if kind is SnapshotTaken else "checkpoint"
    raise JournalCorrupt(reader.name, offset, f"the {what} of {row.session_id!r} is missing")
