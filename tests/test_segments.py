"""Segment log: round trips across rotation and reopening, torn tails, corruption.

A writer is set up as the engine sets it up: `start_first_segment` for a new log, and
`attach_writer` after the committed frames (the view's head) for an existing one. Crash
recovery of whole stores, through `Journal.open`, is in test_recovery.py."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from journal import JournalCorrupt
from journal._local.files import FileOps
from journal._local.frames import (
    FRAME_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    FrameInfo,
    encode_frame,
    segment_name,
)
from journal._local.log import SegmentLog
from journal._local.segments import SegmentReader
from journal._local.sidecar import read_summary
from journal.records import (
    EventAppended,
    Record,
    SessionCreated,
    StateChanged,
    decode_frame_body,
    encode_frame_body,
)

STORE_ID = b"S" * 16

records_st = st.one_of(
    st.builds(
        EventAppended,
        incarnation=st.integers(1, 1 << 40),
        ordinal=st.integers(1, 1 << 40),
        timestamp_ms=st.integers(0, 1 << 50),
        type=st.text(max_size=12),
        data=st.binary(max_size=700),
        request_id=st.none() | st.text(max_size=8),
    ),
    st.builds(
        SessionCreated,
        session_id=st.text(min_size=1, max_size=20),
        created_at_ms=st.integers(0, 1 << 50),
        mode=st.text(max_size=5),
        tags=st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
    ),
    st.builds(StateChanged, st.integers(1, 1000), st.integers(0, 5), st.integers(0, 1 << 40)),
)
frames_st = st.lists(st.lists(records_st, min_size=1, max_size=6), min_size=1, max_size=40)


def read_all(log: SegmentLog) -> list[list[Record]]:
    return [decode_frame_body(body) for _, body in log.frames()]


def make_log(path: Path, end: tuple[int, int, int] | None = None, **kwargs: object) -> SegmentLog:
    """A log with its writer: a new one, or one attached at `end` (segment, end offset,
    next position) as the engine attaches it at its view's head."""
    log = SegmentLog(str(path), STORE_ID, segment_bytes=4096, **kwargs)  # type: ignore[arg-type]
    if end is None:
        log.start_first_segment()
    else:
        log.attach_writer(*end)
    return log


@given(frames=frames_st, reopen_at=st.sets(st.integers(0, 39)), compress=st.booleans())
def test_frames_read_back_identical_across_rotation_and_reopen(
    tmp_path_factory: pytest.TempPathFactory,
    frames: list[list[Record]],
    reopen_at: set[int],
    compress: bool,
) -> None:
    directory = tmp_path_factory.mktemp("log")
    log = make_log(directory, compress_sealed=compress, sync=False)
    positions = []
    for i, records in enumerate(frames):
        info = log.append(encode_frame_body(records), len(records))
        positions.append((info.first_position, info.count))
        if i in reopen_at:
            end = log.writer_end()
            log.close()
            log = make_log(directory, end, compress_sealed=compress, sync=False)
    assert read_all(log) == frames
    # dense store-wide positions from 1, across segment boundaries
    expected = 1
    for first, count in positions:
        assert first == expected
        expected += count
    assert log.next_position == expected
    log.close()
    # reading from a middle position starts at the frame holding it
    log = SegmentLog(str(directory), STORE_ID)
    middle = positions[len(positions) // 2][0]
    firsts = [info.first_position for info, _ in log.frames(middle)]
    assert firsts == [p for p, _ in positions if p >= middle]


def write_frames(directory: Path, n: int, size: int = 150) -> tuple[SegmentLog, list[bytes]]:
    log = SegmentLog(str(directory), STORE_ID, segment_bytes=1 << 20)
    log.start_first_segment()
    bodies = []
    for i in range(n):
        body = encode_frame_body([EventAppended(1, i + 1, 0, "m", bytes([i % 251]) * size)])
        log.append(body, 1)
        bodies.append(body)
    return log, bodies


# A frame header promising 1,000 bytes, and 30 of them: a write cut short.
HALF_FRAME = b"SJFR" + (1000).to_bytes(4, "big") + b"\x01" * 30


def frames_then(directory: Path, tail: bytes) -> tuple[list[bytes], int, Path]:
    """Three frames written and the log closed, then `tail` after the last of them: the
    frames' bodies, where they end, and the segment file."""
    log, bodies = write_frames(directory, 3)
    end = log.writer.end_offset
    log.close()
    seg = directory / segment_name(1)
    with open(seg, "r+b") as f:
        f.seek(end)
        f.write(tail)
    return bodies, end, seg


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 1 << bit
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("compress", [False, True])
def test_flipped_bit_in_sealed_segment_raises_corrupt_with_name_and_offset(
    tmp_path: Path, compress: bool, rng: random.Random
) -> None:
    log = SegmentLog(str(tmp_path), STORE_ID, segment_bytes=8192, compress_sealed=compress)
    log.start_first_segment()
    for i in range(80):
        log.append(encode_frame_body([EventAppended(1, i + 1, 0, "m", os.urandom(300))]), 1)
    log.close()
    sealed = log.segments()[0]
    assert read_summary(str(tmp_path), sealed.base_position) is not None
    path = tmp_path / segment_name(sealed.base_position, compressed=compress)
    assert path.exists() and (sealed.compressed == compress)
    size = path.stat().st_size
    for _ in range(12):
        original = path.read_bytes()
        offset = rng.randrange(SEGMENT_HEADER_SIZE, size)
        flip_bit(path, offset, rng.randrange(8))
        with pytest.raises(JournalCorrupt) as caught:
            list(SegmentLog(str(tmp_path), STORE_ID).frames())
        assert caught.value.segment == path.name
        assert caught.value.offset <= offset or compress
        assert path.name in str(caught.value)
        path.write_bytes(original)
    # undamaged again: reads fine
    assert len(list(SegmentLog(str(tmp_path), STORE_ID).frames())) == 80


def test_flipped_bit_in_middle_of_active_segment_is_corruption_not_a_torn_tail(
    tmp_path: Path, rng: random.Random
) -> None:
    log, _ = write_frames(tmp_path, 20)
    infos = [info for info, _ in log.frames()]
    log.close()
    seg = tmp_path / segment_name(1)
    original = seg.read_bytes()
    for target in (infos[0], infos[7], infos[-2]):
        # header fields (length included) and body: all must be detected
        for offset in (target.offset + 5, target.offset + 14, target.end_offset - 3):
            flip_bit(seg, offset, rng.randrange(8))
            with pytest.raises(JournalCorrupt) as caught:
                list(SegmentLog(str(tmp_path), STORE_ID).frames())
            assert caught.value.segment == seg.name
            assert caught.value.offset == target.offset
            seg.write_bytes(original)
    # (A writer refuses it too, and cuts nothing: test_recovery.py, through the product.)
    assert len(list(SegmentLog(str(tmp_path), STORE_ID).frames())) == 20


def test_reader_at_active_tail_sees_only_whole_frames(tmp_path: Path) -> None:
    # a half-written frame after the committed ones is "not yet written" to a reader
    bodies, end, _ = frames_then(tmp_path, HALF_FRAME)
    with SegmentReader(str(tmp_path), 1) as reader:
        assert [bytes(b) for _, b in reader.frames(tail=True)] == bodies
        # ... but corruption when the caller knows it was committed
        with pytest.raises(JournalCorrupt):
            list(reader.frames(committed_end=end + FRAME_HEADER_SIZE + 1, tail=True))


def test_a_frame_claiming_no_records_is_implausible_whatever_its_checksum(
    tmp_path: Path,
) -> None:
    # A frame header with count 0 is never written: past the active segment's committed
    # end it is an unfinished tail (the writer cuts it off), before it JournalCorrupt.
    # (a valid CRC over an empty body and count 0)
    segments = tmp_path / "segments"  # (its cut is kept beside it, in tmp_path)
    bodies, end, _ = frames_then(segments, encode_frame(b"", 4, 0))
    with SegmentReader(str(segments), 1) as reader:
        assert [bytes(b) for _, b in reader.frames(tail=True)] == bodies
        with pytest.raises(JournalCorrupt, match="implausible frame header"):
            list(reader.frames(committed_end=end + FRAME_HEADER_SIZE, tail=True))
    log = SegmentLog(str(segments), STORE_ID)
    log.attach_writer(1, end, 4)  # (where the frames the reader found end)
    info = log.append(bodies[0], 1)
    assert (info.offset, info.first_position) == (end, 4)
    log.close()


def test_other_store_segments_are_refused(tmp_path: Path) -> None:
    log, _ = write_frames(tmp_path, 2)
    log.close()
    from journal import StoreIncompatible

    with pytest.raises(StoreIncompatible, match="belongs to another store"):
        SegmentLog(str(tmp_path), b"T" * 16).attach_writer(1, SEGMENT_HEADER_SIZE, 1)


def test_sidecar_built_while_appending_equals_a_rescan(tmp_path: Path) -> None:
    from journal._local.segments import summarize_segment
    from journal._local.sidecar import digest_records

    log = SegmentLog(str(tmp_path), STORE_ID, segment_bytes=16384)
    log.start_first_segment()  # a fresh store: the writer sees every frame it will seal
    ordinals = {1: 0, 2: 0, 3: 0}
    for i in range(60):
        incarnations = [1 + (i % 3)] if i % 4 else [1, 2]
        records: list[Record] = []
        runs = {}
        for inc in incarnations:
            first = ordinals[inc] + 1
            for _ in range(1 + i % 3):
                ordinals[inc] += 1
                records.append(EventAppended(inc, ordinals[inc], 0, "m", os.urandom(200)))
            runs[inc] = (first, ordinals[inc])
        digest = digest_records(records)
        assert digest.sessions == runs
        log.append(encode_frame_body(records), len(records), digest)
    sealed = log.segments()[:-1]
    assert len(sealed) >= 2
    for segment in sealed:
        written = read_summary(str(tmp_path), segment.base_position)
        assert written == summarize_segment(str(tmp_path), segment.base_position)
    log.close()


def test_view_is_rebuilt_from_segments_after_a_reboot(tmp_path: Path) -> None:
    # After a power cut the LMDB view (synced lazily) is not trusted: a different boot id
    # in view-boot makes the next writer rebuild it from the segments, which were synced.
    from journal import EventIn, Journal

    with Journal.open(tmp_path) as j:
        j.create_session("s")
        j.append("s", [EventIn("m", b"a"), EventIn("m", b"b")])
        before = [(e.ordinal, e.data) for e in j.replay("s")]
    (tmp_path / "view-boot").write_bytes(b"another-boot")
    sentinel = tmp_path / "index" / "sentinel"
    sentinel.write_text("the old view")
    with Journal.open(tmp_path) as j:
        assert not sentinel.exists()
        assert [(e.ordinal, e.data) for e in j.replay("s")] == before
        assert j.get_session("s").last_ordinal == 2
    assert (tmp_path / "view-boot").read_bytes() != b"another-boot"


def test_a_refused_frame_another_writer_committed_after_is_not_cut(tmp_path: Path) -> None:
    """`undo_append` runs under the write lock taken again after the failed transaction.
    If another writer took the lock first, it indexed the refused frame (as after a crash
    between sync and view update) and committed after it: the view's head is past the
    frame, and cutting back to where the frame began would cut that writer's
    acknowledged frame too. Nothing is cut then; with the head not past it, it is."""
    log = make_log(tmp_path, sync=False)
    record = [StateChanged(1, 1, 1)]
    log.append(encode_frame_body(record), 1)
    before = log.writer_end()
    log.append(encode_frame_body(record), 1)  # (refused)
    log.append(encode_frame_body(record), 1)  # (the other writer's, after it)
    log.owe_cut(before)
    log.undo_append(log.writer_end())
    assert len(read_all(log)) == 3
    log.attach_writer(*before)  # (cuts what lies past it: a fresh start)
    log.append(encode_frame_body(record), 1)  # (refused)
    log.owe_cut(before)
    log.undo_append(before)  # (nobody committed since: cut)
    assert len(read_all(log)) == 1
    assert log.writer_end() == before
    log.close()


def _two_writers_past_a_refused_frame(
    tmp_path: Path,
) -> tuple[SegmentLog, SegmentLog, tuple[int, int, int], tuple[int, int, int]]:
    """Writer A's frame F is refused (its view commit failed); before A cuts it, writer
    B's catch-up (in a transaction that fails too) indexed F and B appended G after it.
    A cuts F (and G with it). Returns A, B, the head before F, and where B's G began."""
    log_a = make_log(tmp_path, sync=False)
    log_a.append(encode_frame_body([StateChanged(1, 1, 1)]), 1)
    head = log_a.writer_end()
    log_a.append(encode_frame_body([StateChanged(2, 2, 2)]), 1)  # F
    log_b = make_log(tmp_path, log_a.writer_end(), sync=False)  # (B indexed F)
    before_g = log_b.writer_end()
    log_b.append(encode_frame_body([StateChanged(3, 3, 3)]), 1)  # G
    log_a.owe_cut(head)
    log_a.undo_append(head)
    return log_a, log_b, head, before_g


def test_a_refused_frame_after_another_writer_s_refused_frame_cuts_no_committed_one(
    tmp_path: Path,
) -> None:
    """A (as above) then commits a frame F' where F was: as many records, so the view's
    next position is where G began, but longer. B's cut of G, made where its failed
    catch-up had put it, cut F' (acknowledged) in two; it is not made: past the view's
    head lies nothing of B's."""
    log_a, log_b, _, before_g = _two_writers_past_a_refused_frame(tmp_path)
    longer = EventAppended(1, 1, 0, "m", b"x" * 300, None)
    log_a.append(encode_frame_body([longer]), 1)  # F', committed
    committed = log_a.writer_end()
    assert committed[2] == before_g[2] and committed[1] > before_g[1]
    log_b.owe_cut(before_g)
    log_b.undo_append(committed)
    assert read_all(log_a)[-1] == [longer]
    log_a.close()
    log_b.close()


def test_a_refused_frame_whose_predecessor_was_cut_leaves_nothing_to_cut(
    tmp_path: Path,
) -> None:
    """A (as above) commits nothing more: B's cut of G found the log ending before G's
    place and raised `LogHole` (a commit failing with "frames were cut off ... until
    verify --fix"), though nothing committed was missing. Nothing is left to cut: the
    writer attaches at the view's head at the next commit."""
    log_a, log_b, head, before_g = _two_writers_past_a_refused_frame(tmp_path)
    log_b.owe_cut(before_g)
    log_b.undo_append(head)
    assert len(read_all(log_b)) == 1
    log_b.attach_writer(*head)
    log_b.append(encode_frame_body([StateChanged(5, 5, 5)]), 1)
    assert len(read_all(log_b)) == 2
    log_a.close()
    log_b.close()


def test_a_refused_frame_is_found_committed_only_where_it_lies_unchanged(
    tmp_path: Path,
) -> None:
    """`undo_append` with the refused frame (where it was written, and its records) says
    whether another writer indexed it: the view's head lies past it and the log holds
    exactly that frame there. Past the head but with other frames in its place (it was
    cut with another writer's refused frame, and others committed there), it is not."""
    log = make_log(tmp_path, sync=False)
    record: list[Record] = [StateChanged(1, 1, 1)]
    log.append(encode_frame_body(record), 1)
    before = log.writer_end()
    refused = log.append(encode_frame_body(record), 1)
    log.owe_cut(before)
    assert not log.undo_append(before, (refused, record))  # (not indexed: cut)
    assert len(read_all(log)) == 1
    refused = log.append(encode_frame_body(record), 1)
    log.append(encode_frame_body(record), 1)  # (the other writer's, after it)
    log.owe_cut(before)
    assert log.undo_append(log.writer_end(), (refused, record))
    assert len(read_all(log)) == 3
    log.close()

    log_a, log_b, _, before_g = _two_writers_past_a_refused_frame(tmp_path / "two")
    g = read_all(log_b)[-1]
    g_info = FrameInfo(before_g[0], before_g[1], before_g[2], 1, len(encode_frame_body(g)))
    longer = EventAppended(1, 1, 0, "m", b"x" * 300, None)
    log_a.append(encode_frame_body([longer]), 1)  # where F and G were
    log_a.append(encode_frame_body(record), 1)
    past_g = log_a.writer_end()
    assert past_g[2] > g_info.last_position
    log_b.owe_cut(before_g)
    assert not log_b.undo_append(past_g, (g_info, list(g)))
    assert read_all(log_a)[-2:] == [[longer], record]
    log_a.close()
    log_b.close()


def test_a_cut_torn_tail_is_kept_and_logged_with_its_segment_and_offset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A writer attaching after the last whole frame (as after a rebuild of a lost view)
    # cuts the bytes after it off as an interrupted write. Without the index, a last
    # frame damaged on disk looks the same and goes the same way (SPEC 3.3): the cut is
    # no longer silent (a new-user trial deleted `index/` after damaging the only frame,
    # and `verify` then said nothing), and the bytes are kept first, in `cut-tails/`
    # beside `segments/`, which the warning names.
    segments = tmp_path / "segments"
    _, end, seg = frames_then(segments, HALF_FRAME)
    with caplog.at_level("WARNING", logger="journal"):
        log = SegmentLog(str(segments), STORE_ID)
        log.attach_writer(1, end, 4)
        log.close()
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert str(seg) in warning.getMessage() and f"offset {end}" in warning.getMessage()
    assert "cut off 38 bytes" in warning.getMessage()
    copy = tmp_path / "cut-tails" / f"{seg.name}-{end}.tail"
    assert str(copy) in warning.getMessage()
    assert copy.read_bytes() == HALF_FRAME
    caplog.clear()
    with caplog.at_level("WARNING", logger="journal"):  # (zeros after it: nothing said)
        log = SegmentLog(str(segments), STORE_ID)
        log.attach_writer(1, end, 4)
        log.close()
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert [p.name for p in (tmp_path / "cut-tails").iterdir()] == [copy.name]


class CountReads(FileOps):
    """Counts the bytes read through `pread` while `counting`."""

    def __init__(self) -> None:
        super().__init__()
        self.counting = False
        self.read = 0

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        data = super().pread(fd, length, offset)
        if self.counting:
            self.read += len(data)
        return data


def test_a_compressed_seal_without_the_writer_s_summary_reads_the_segment_once(
    tmp_path: Path,
) -> None:
    # A writer that did not see every frame of its segment (reopened since) scans it when
    # it seals: with `compress_sealed` the scan and the compression each read (and
    # decoded) the whole segment. The compression's pass gives the sidecar now.
    ops = CountReads()
    log = SegmentLog(str(tmp_path), STORE_ID, segment_bytes=1 << 20, compress_sealed=True, ops=ops)
    log.start_first_segment()
    for i in range(3):
        log.append(encode_frame_body([EventAppended(1, i + 1, 0, "m", os.urandom(64 << 10))]), 1)
    base, end, next_position = log.writer_end()
    log.close()
    log.attach_writer(base, end, next_position)  # (its summary is unknown now)
    ops.counting = True
    log.rotate()
    log.close()
    assert ops.read < end * 3 // 2, (ops.read, end)
    summary = read_summary(str(tmp_path), base)
    assert summary is not None and len(summary.frames) == 3 and summary.blocks
