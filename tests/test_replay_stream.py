"""The streaming read path (SPEC.md 7.5): pages by the byte rule without counting each
event, a page that ends inside a frame handing the frame to the next page, chunk reads
into one reused buffer (still through `FileOps`), bounded memory, and reads that race
appends, retention and compaction."""

from __future__ import annotations

import os
import random
import struct
import sys
import threading
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest
from _view_entries import read_locations, replace_location, sealed_location

from journal import CursorExpired, EventIn, Journal, JournalCorrupt, RetentionPolicy, checksums
from journal._local import frames, open_local
from journal._local.files import FileOps

NO_WINDOWS = RetentionPolicy(max_history_bytes=None)


class CountingReads(FileOps):
    """Counts the bytes read through `pread` (which `pread_into` calls for a subclass)."""

    def __init__(self) -> None:
        self.bytes_read = 0
        self.calls = 0

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        data = super().pread(fd, length, offset)
        self.bytes_read += len(data)
        self.calls += 1
        return data


def payload(ordinal: int, size: int) -> bytes:
    prefix = f"{ordinal}:".encode()
    return prefix + random.Random(ordinal).randbytes(max(0, size - len(prefix)))


def greedy_pages(sizes: list[int], max_bytes: int) -> list[int]:
    """How many events each page holds by the rule: as many as fit, at least one."""
    pages: list[int] = []
    at = 0
    while at < len(sizes):
        total, count = sizes[at], 1
        while at + count < len(sizes) and total + sizes[at + count] <= max_bytes:
            total += sizes[at + count]
            count += 1
        pages.append(count)
        at += count
    return pages


def segment_bytes_on_disk(path: Path) -> int:
    folder = path / "segments"
    return sum(os.path.getsize(folder / n) for n in os.listdir(folder) if ".seg" in n)


def test_pages_follow_the_byte_rule_exactly_with_counts_from_the_index(
    tmp_path: Path, rng: random.Random
) -> None:
    # Batches of random sizes: the page rule (as many events as fit, at least one) must
    # give the same pages whether a frame's bytes come from the index or from len().
    sizes: list[int] = []
    with Journal.open(tmp_path, segment_bytes=1 << 16, retention=NO_WINDOWS) as j:
        j.create_session("s")
        for _ in range(60):
            batch = [rng.randrange(1, 3000) for _ in range(rng.randrange(1, 40))]
            first = len(sizes) + 1
            datas = [payload(first + i, n) for i, n in enumerate(batch)]
            j.append("s", [EventIn("t", data) for data in datas])
            # (the real sizes: a payload is never shorter than its "ordinal:" prefix)
            sizes += map(len, datas)
        for max_bytes in (1, 700, 5000, rng.randrange(1, 60_000), 1 << 20):
            pages: list[int] = []
            cursor = None
            ordinals: list[int] = []
            while True:
                page = j.read("s", cursor=cursor, max_bytes=max_bytes)
                if not page.events:
                    break
                pages.append(len(page.events))
                ordinals += [e.ordinal for e in page.events]
                assert all(e.data == payload(e.ordinal, len(e.data)) for e in page.events)
                cursor = page.next_cursor
                if not page.has_more:
                    break
            assert ordinals == list(range(1, len(sizes) + 1))
            assert pages == greedy_pages(sizes, max_bytes), max_bytes


def test_pages_ending_inside_frames_continue_where_they_stopped(tmp_path: Path) -> None:
    # Frames of 100 events (about 52 KB) and pages of 20 KB: every page ends inside a
    # frame, and the next page goes on with that frame's records (kept decoded from the
    # page before). Every event comes once, in order, and the log is read about once:
    # the reused chunk buffer never makes a page read its chunk again.
    with Journal.open(tmp_path, segment_bytes=1 << 20, retention=NO_WINDOWS) as j:
        j.create_session("s")
        for batch in range(40):
            first = batch * 100 + 1
            j.append("s", [EventIn("t", payload(first + i, 500)) for i in range(100)])
    on_disk = segment_bytes_on_disk(tmp_path)
    reads = CountingReads()
    with Journal.open(tmp_path, file_ops=reads, retention=NO_WINDOWS) as j:
        reads.bytes_read = 0
        events = list(j.replay("s", max_bytes=20_000))
    assert [e.ordinal for e in events] == list(range(1, 4001))
    assert all(e.data == payload(e.ordinal, 500) for e in events)
    assert reads.bytes_read <= on_disk * 1.2, (reads.bytes_read, on_disk)


def test_chunk_reads_go_through_an_overridden_pread(tmp_path: Path) -> None:
    # The reused chunk buffer is filled by FileOps.pread_into: a test's FileOps that only
    # overrides pread (faults, checks on read sizes) still sees every chunk read.
    with Journal.open(tmp_path) as j:
        j.create_session("s")
        j.append("s", [EventIn("t", payload(i, 300)) for i in range(1, 51)])
    reads = CountingReads()
    with Journal.open(tmp_path, file_ops=reads) as j:
        reads.calls = 0
        assert len(list(j.replay("s"))) == 50
    assert reads.calls >= 1


def test_pread_into_reads_like_pread(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 10)
    fd = os.open(path, os.O_RDONLY)
    try:
        for ops in (FileOps(), CountingReads()):
            buffer = bytearray(b"\xff" * 300)
            got = ops.pread_into(fd, memoryview(buffer)[:100], 2500)
            assert got == 60
            assert buffer[:60] == bytes(range(196, 256))
            assert buffer[60:] == b"\xff" * 240  # nothing past what was read is touched
    finally:
        os.close(fd)


def test_replaying_a_large_session_holds_about_a_page(tmp_path: Path) -> None:
    # 12 MiB of events, pages of 128 KiB: what a replay holds at its peak (page, chunk
    # buffer, the frame a page ended inside) must not grow with the session.
    with Journal.open(tmp_path, segment_bytes=4 << 20, retention=NO_WINDOWS) as j:
        j.create_session("s")
        for batch in range(120):
            first = batch * 200 + 1
            j.append("s", [EventIn("t", payload(first + i, 512)) for i in range(200)])
    with Journal.open(tmp_path, retention=NO_WINDOWS) as j:
        tracemalloc.start()
        try:
            count = 0
            for event in j.replay("s", max_bytes=128 << 10):
                count += 1
                assert event.ordinal == count
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert count == 24_000
    assert peak < 4 << 20, peak  # 12 MiB replayed; a page, a chunk and a frame held


class _PageBounds:
    """An engine that records the `max_bytes` of every page read through it."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.bounds: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read(self, *args: Any) -> Any:
        self.bounds.append(args[3])  # (session, incarnation, after, max_bytes, ...)
        return self._inner.read(*args)


def test_a_default_replay_reads_a_small_first_page_then_larger_ones(tmp_path: Path) -> None:
    # Measured (SPEC 15): 4 MiB pages replay about 6% faster than 1 MiB ones; the first
    # page stays 1 MiB so the first event comes as soon as before. A max_bytes given is
    # every page's bound, and a watch keeps its pages at the default.
    with Journal.open(tmp_path, retention=NO_WINDOWS) as j:
        j.create_session("s")
        for batch in range(12):  # 12 MiB of events
            first = batch * 1024 + 1
            j.append("s", [EventIn("t", payload(first + i, 1024)) for i in range(1024)])
        j.resolve_session("s")
    engine = _PageBounds(
        open_local(tmp_path, (False, True, "fsync", 1 << 26, None, False), None, None, None)
    )
    with Journal.over(engine) as j:
        assert [e.ordinal for e in j.replay("s")] == list(range(1, 12 * 1024 + 1))
        assert engine.bounds == [1 << 20, 4 << 20, 4 << 20, 4 << 20], engine.bounds
        engine.bounds.clear()
        assert sum(1 for _ in j.replay("s", max_bytes=2 << 20)) == 12 * 1024
        assert set(engine.bounds) == {2 << 20} and len(engine.bounds) >= 6, engine.bounds
        engine.bounds.clear()
        assert sum(1 for _ in j.watch("s")) == 12 * 1024  # resolved: it ends
        assert set(engine.bounds) == {1 << 20} and len(engine.bounds) >= 12, engine.bounds
        tracemalloc.start()
        try:
            assert sum(1 for _ in j.replay("s")) == 12 * 1024
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    # 12 MiB replayed: a 4 MiB page and its events, a chunk and a frame (about 9 MiB;
    # about 5.5 MiB with 1 MiB pages, 17.6 MiB with everything held).
    assert peak < 10 << 20, peak


def test_paging_while_appending_returns_only_committed_whole_events(tmp_path: Path) -> None:
    # The active segment is read while a writer appends (and preallocates zeros ahead):
    # every page holds exactly the next committed events, never bytes past the commit.
    with Journal.open(tmp_path, segment_bytes=1 << 20, retention=NO_WINDOWS) as j:
        j.create_session("s")
        done = threading.Event()

        def write() -> None:
            try:
                for batch in range(150):
                    first = batch * 20 + 1
                    j.append("s", [EventIn("t", payload(first + i, 700)) for i in range(20)])
            finally:
                done.set()

        writer = threading.Thread(target=write)
        writer.start()
        seen = 0
        cursor = None
        try:
            while not (done.is_set() and seen == 3000):
                page = j.read("s", cursor=cursor, max_bytes=rng_bytes(seen))
                for event in page.events:
                    seen += 1
                    assert event.ordinal == seen
                    assert event.data == payload(seen, 700)
                cursor = page.next_cursor
        finally:
            writer.join()
        assert seen == 3000


def rng_bytes(seen: int) -> int:
    return (1, 3000, 40_000, 1 << 20)[seen % 4]


@pytest.mark.parametrize("how", ["retention", "compaction"])
def test_a_follower_paging_inside_frames_survives_retention_and_compaction(
    tmp_path: Path, how: str
) -> None:
    # A replay whose pages end inside frames pauses while the segment it reads is
    # deleted (retention) or rewritten (compaction): it delivers the next events
    # correctly or raises CursorExpired, never a skipped or stale event.
    with Journal.open(tmp_path, segment_bytes=1 << 16, retention=NO_WINDOWS) as j:
        j.create_session("s")
        for batch in range(30):
            first = batch * 25 + 1
            j.append("s", [EventIn("t", payload(first + i, 400)) for i in range(25)])
        stream = j.replay("s", max_bytes=3000)
        seen = [next(stream) for _ in range(10)]
        assert [e.ordinal for e in seen] == list(range(1, 11))
        if how == "retention":
            j.compact_session("s", 400, b"snapshot")  # trims the history below 401
            j.apply_retention()
        else:
            j.compact_session("s", 40, b"snapshot")
            j.compact()
        try:
            for event in stream:
                assert event.ordinal == seen[-1].ordinal + 1, "skipped or repeated"
                assert event.data == payload(event.ordinal, 400)
                seen.append(event)
            assert seen[-1].ordinal == 750
        except CursorExpired as expired:
            assert expired.earliest_ordinal > seen[-1].ordinal
        stream.close()


def test_frame_crc32_falls_back_to_zlib_without_isal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "isal.isal_zlib", None)  # import raises ImportError
    assert checksums.fast_crc32() is zlib.crc32


def test_frame_crc32_agrees_with_zlib(rng: random.Random) -> None:
    for size in (0, 1, 7, 580, 1 << 16, (1 << 20) + 3):
        data = rng.randbytes(size)
        start = rng.randrange(1 << 32)
        assert frames.frame_crc32(memoryview(data), start) == zlib.crc32(data, start)


def _three_frames(store: Path) -> list[int]:
    sizes = [300] * 10 + [500] * 10 + [700] * 10
    with Journal.open(store) as j:
        j.create_session("s")
        for first in (1, 11, 21):
            j.append(
                "s", [EventIn("t", payload(o, sizes[o - 1])) for o in range(first, first + 10)]
            )
    return sizes


def test_implausible_byte_counts_in_the_index_fall_back_to_counting(tmp_path: Path) -> None:
    # The second frame's entry (checksum intact) claims a running total larger than the
    # third's: both frames' counts are implausible, so the reader counts their events,
    # and the pages are still those of the rule.
    sizes = _three_frames(tmp_path)
    stored = read_locations(tmp_path)[1, 11]
    segment, offset, _, time_ms = struct.unpack(">QQQQ", stored[8:40])
    payload = struct.pack(">QQQQQ", 11, segment, offset, 1 << 40, time_ms)
    replace_location(tmp_path, 1, 11, sealed_location(1, payload))
    with Journal.open(tmp_path, readonly=True) as j:
        for max_bytes in (1, 2000, 4000, 9000, 1 << 20):
            pages = []
            cursor = None
            while True:
                page = j.read("s", cursor=cursor, max_bytes=max_bytes)
                pages.append(len(page.events))
                cursor = page.next_cursor
                if not page.has_more:
                    break
            assert pages == greedy_pages(sizes, max_bytes), max_bytes


def test_a_damaged_index_entry_after_the_page_fails_only_the_page_that_reaches_it(
    tmp_path: Path,
) -> None:
    # The reader looks one index entry ahead (for byte counts): damage found there is
    # raised only when a page gets to that frame.
    _three_frames(tmp_path)
    value = read_locations(tmp_path)[1, 21]
    replace_location(tmp_path, 1, 21, value[:-4] + bytes(a ^ 0xFF for a in value[-4:]))
    with Journal.open(tmp_path, readonly=True) as j:
        page = j.read("s", max_bytes=7000)  # ends inside the second frame
        assert [e.ordinal for e in page.events] == list(range(1, 19))
        # (The next page delivers the rest of the second frame, and the one after raises.)
        page = j.read("s", cursor=page.next_cursor)
        assert [e.ordinal for e in page.events] == [19, 20] and page.has_more
        with pytest.raises(JournalCorrupt):
            j.read("s", cursor=page.next_cursor)


@pytest.mark.parametrize("damage", ["frame", "index"])
def test_a_replay_delivers_the_events_before_damage_then_raises(
    tmp_path: Path, damage: str
) -> None:
    """A page that reaches a damaged frame (or index entry) returns the events before it,
    and the next page raises: until 2026-12-03 the whole page failed, so a replay of a
    session damaged in its third frame delivered nothing before `JournalCorrupt`
    (operator trial)."""
    _three_frames(tmp_path)
    if damage == "index":
        value = read_locations(tmp_path)[1, 21]
        replace_location(tmp_path, 1, 21, value[:-4] + bytes(a ^ 0xFF for a in value[-4:]))
    else:
        (segment,) = sorted((tmp_path / "segments").glob("*.seg"))
        data = bytearray(segment.read_bytes())
        at = data.index(payload(25, 700))  # inside the third frame's body
        data[at] ^= 0x01
        segment.write_bytes(bytes(data))
    with Journal.open(tmp_path, readonly=True) as j:
        delivered: list[int] = []
        with pytest.raises(JournalCorrupt):
            for event in j.replay("s"):
                delivered.append(event.ordinal)
        assert delivered == list(range(1, 21))
        page = j.read("s", max_bytes=1 << 20)
        assert [e.ordinal for e in page.events] == list(range(1, 21)) and page.has_more
        with pytest.raises(JournalCorrupt):
            j.read("s", cursor=page.next_cursor)


def test_written_frame_crc_is_zlibs_over_length_position_count_and_body(
    rng: random.Random,
) -> None:
    # The format (SPEC.md 3.2): whichever CRC32 implementation wrote it, a frame's CRC is
    # zlib.crc32 of (body length, first position, count) then the body.
    body = rng.randbytes(58_000)
    frame = frames.encode_frame(body, 12_345, 100)
    magic, length, crc, first, count = frames.FRAME_HEADER.unpack_from(frame)
    assert (magic, length, first, count) == (frames.FRAME_MAGIC, len(body), 12_345, 100)
    assert crc == zlib.crc32(body, zlib.crc32(struct.pack(">IQI", len(body), 12_345, 100)))
    assert frame[frames.FRAME_HEADER_SIZE :] == body


def test_followers_that_caught_up_keep_no_large_read_buffer(tmp_path: Path) -> None:
    # Each segment reader kept a 1 MiB read buffer while open, and a follower at the head
    # keeps its reader open: a thousand watchers that caught up held 1 GiB (measured:
    # RssAnon 18 MB -> 1,054 MB for 1,000 `awatch` tasks; 26 MB now).
    from itertools import islice

    with Journal.open(tmp_path, retention=NO_WINDOWS) as j:
        j.create_session("s")
        for batch in range(30):
            first = batch * 100 + 1
            j.append("s", [EventIn("t", payload(first + i, 1000)) for i in range(100)])
        tracemalloc.start()
        try:
            streams = [j.watch("s") for _ in range(100)]
            for stream in streams:
                assert [e.ordinal for e in islice(stream, 3000)] == list(range(1, 3001))
            # One more small event for each of them (so none holds its last page of
            # history): read into a small buffer.
            j.append("s", [EventIn("t", payload(3001, 100))])
            for stream in streams:
                assert next(stream).ordinal == 3001
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        for stream in streams:
            stream.close()
    # 100 followers that read 3 MB each: 100 MiB with the buffers kept.
    assert held < 16 << 20, held


def traced_once_caught_up(j: Journal, session: str, followers: int, events: int) -> int:
    """The memory traced once `followers` `awatch` tasks of `session` delivered its
    `events` events each and wait at the head (they hold no event themselves)."""
    import asyncio

    async def follow_all() -> int:
        delivered: list[int] = []

        async def follow() -> None:
            async for event in j.awatch(session):
                delivered.append(event.ordinal)
                del event  # (this test's own reference, while the next one is awaited)

        tasks = [asyncio.create_task(follow()) for _ in range(followers)]
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while len(delivered) < followers * events:
                assert asyncio.get_running_loop().time() < deadline, len(delivered)
                await asyncio.sleep(0.01)
            for _ in range(5):  # (each waits at the head now)
                await asyncio.sleep(0)
            held, _ = tracemalloc.get_traced_memory()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return held

    tracemalloc.start()
    try:
        return asyncio.run(follow_all())
    finally:
        tracemalloc.stop()


def test_followers_that_caught_up_in_a_compressed_segment_keep_no_block(tmp_path: Path) -> None:
    # A compressed segment's chunk is its decompressed block, not the read buffer: until
    # 2026-12-03 a follower whose session's last events were in one kept that block (up
    # to 1 MiB) while it waited at the head (measured: 50 followers, 52 MB; 1.9 MB now).

    with Journal.open(tmp_path, segment_bytes=4 << 20, retention=NO_WINDOWS) as j:
        j.create_session("s")
        j.create_session("other")
        for batch in range(10):  # (incompressible enough to fill a block or two)
            first = batch * 100 + 1
            j.append("s", [EventIn("t", payload(first + i, 1000)) for i in range(100)])
        for _ in range(40):  # ...then sealed behind another session's events
            j.append("other", [EventIn("t", b"z" * 1000) for _ in range(200)])
        j.compact()
        assert any(name.endswith(".seg.zst") for name in os.listdir(tmp_path / "segments"))
        held = traced_once_caught_up(j, "s", 50, 1000)
    # 50 followers: 50 MiB with the blocks kept.
    assert held < 16 << 20, held


def test_followers_waiting_after_a_large_event_do_not_hold_it(tmp_path: Path) -> None:
    # A live follower keeps its last event's cursor for an `OutcomeUnknown` to carry:
    # until 2026-12-03 the event with its data (50 `awatch` followers caught up at a 2 MB
    # event held 100 MB), now its cursor alone once it waits.

    with Journal.open(tmp_path, retention=NO_WINDOWS) as j:
        j.create_session("s")
        j.append("s", [EventIn("t", payload(1, 2 << 20))])
        held = traced_once_caught_up(j, "s", 20, 1)
    # 20 followers: 40 MiB with the event's data kept.
    assert held < 16 << 20, held
