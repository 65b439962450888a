"""Compressing a sealed segment: a copy of its frames in independently decodable zstd
blocks, with the block table in a footer (SPEC "Compressed segments"); compaction's copy
keeps only the live frames. Reading such a file is `segments.SegmentReader`'s."""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from typing import Final

import msgspec
import zstandard

from ..records import decode_frame_body
from .files import (
    DEFAULT_FILE_OPS,
    DEFAULT_PERMISSIONS,
    FileOps,
    Permissions,
    discarded_on_failure,
    fsync_dir,
)
from .frames import (
    BLOCK_HEADER,
    BLOCK_MAGIC,
    BLOCK_TARGET_BYTES,
    FLAG_COMPACTED,
    FLAG_COMPRESSED,
    FOOTER_HEADER,
    FOOTER_MAGIC,
    FOOTER_TRAILER,
    FRAME_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    FrameInfo,
    encode_frame,
    segment_name,
)
from .segments import SegmentReader, frame_records
from .sidecar import SegmentSummary, SummaryBuilder, digest_records

__all__ = ["compress_segment"]

_block_table_encoder: Final = msgspec.msgpack.Encoder()


def compress_segment(
    directory: str,
    base_position: int,
    *,
    level: int = 3,
    keep: Callable[[FrameInfo], bool] | None = None,
    publish: bool = True,
    ops: FileOps = DEFAULT_FILE_OPS,
    permissions: Permissions = DEFAULT_PERMISSIONS,
    summarize: bool = True,
) -> tuple[str, SegmentSummary]:
    """Write a compressed copy of a sealed segment; returns its path and its sidecar
    (without `summarize`, only its blocks: the caller has the rest, and the frames'
    records are not decoded again).

    Blocks hold whole frames that are contiguous in the original (about 1 MiB of them, or
    one larger frame), each an independent zstd frame behind a checksummed block header,
    so a read decompresses only its blocks. Frames keep their original (uncompressed)
    offsets, so every index entry stays valid. `keep` selects the frames to copy (the
    others are dropped: compaction); a dropped frame leaves a gap no block covers. A footer
    holds the block table. With `publish`, the copy is renamed to `<base>.seg.zst` (the
    plain file is left for the caller to remove); otherwise the temporary path is returned.
    """
    blocks: list[tuple[int, int, int, int]] = []
    builder = SummaryBuilder()
    final = os.path.join(directory, segment_name(base_position, compressed=True))
    temporary = f"{final}.{os.getpid()}.tmp"
    compressor = zstandard.ZstdCompressor(level=level)
    data_end = SEGMENT_HEADER_SIZE
    last_position = base_position - 1
    with discarded_on_failure(temporary, ops):
        with (
            SegmentReader(directory, base_position, ops) as reader,
            os.fdopen(permissions.create_file(temporary, os.O_WRONLY | os.O_TRUNC), "wb") as out,
        ):
            flags = reader.header.flags | FLAG_COMPRESSED | (FLAG_COMPACTED if keep else 0)
            out.write(reader.header._replace(flags=flags).encode())
            file_offset = SEGMENT_HEADER_SIZE
            pending: list[bytes] = []
            pending_start = SEGMENT_HEADER_SIZE
            pending_end = SEGMENT_HEADER_SIZE
            pending_size = 0

            def flush() -> None:
                nonlocal file_offset, pending, pending_size
                raw = b"".join(pending)
                packed = compressor.compress(raw)
                out.write(
                    BLOCK_HEADER.pack(
                        BLOCK_MAGIC, pending_start, len(raw), len(packed), zlib.crc32(packed)
                    )
                )
                out.write(packed)
                blocks.append((pending_start, len(raw), file_offset, len(packed)))
                file_offset += BLOCK_HEADER.size + len(packed)
                pending = []
                pending_size = 0

            for info, body in reader.frames():
                if keep is not None and not keep(info):
                    continue
                size = FRAME_HEADER_SIZE + info.body_length
                full = pending_size + size > BLOCK_TARGET_BYTES
                if pending and (full or info.offset != pending_end):
                    flush()
                if not pending:
                    pending_start = info.offset
                pending.append(encode_frame(bytes(body), info.first_position, info.count))
                pending_size += size
                pending_end = info.end_offset
                if summarize:
                    digest = digest_records(
                        frame_records(reader.name, info, body, decode_frame_body)
                    )
                    builder.add(info.offset, info.first_position, info.count, digest)
                data_end = info.end_offset
                last_position = info.last_position
            if pending:
                flush()
            table = _block_table_encoder.encode(blocks)
            footer_at = file_offset
            out.write(FOOTER_HEADER.pack(FOOTER_MAGIC, len(table), zlib.crc32(table)))
            out.write(table)
            out.write(FOOTER_TRAILER.pack(footer_at))
            out.flush()
            ops.fsync(out.fileno())
        summary = builder.build(base_position, last_position, data_end)
        summary.blocks = blocks
        if not publish:
            return temporary, summary
        ops.replace(temporary, final)
        fsync_dir(directory, ops)
        return final, summary
