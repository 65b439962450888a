"""Fuzzing every parser of on-disk bytes in the local engine (SPEC "Failure handling:
hostile bytes"): segment and frame headers, frame bodies, compressed-segment footers,
block tables and blocks, sidecars and the records codec, alone and as files of a store
that is then opened (writable and read-only) and used.

Inputs are arbitrary bytes and mutations of valid files: bit flips, cuts, splices, length
and offset fields set to huge values, and decoded values (msgpack) replaced by extremes,
each optionally with the checksums fixed up so the bytes reach the decoders behind them.
What may come out is a documented error (`JournalCorrupt`, `StoreIncompatible`; the
internal `BadFrame` and `msgspec.DecodeError` only from the functions whose callers convert
them), nothing else, within a deadline and without reading or allocating more than the
file holds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import struct
import tempfile
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import (
    EventIn,
    Journal,
    JournalCorrupt,
    SessionNotFound,
    StoreIncompatible,
)
from journal._local.files import FileOps
from journal._local.frames import (
    BLOCK_HEADER,
    BLOCK_MAGIC,
    FLAG_COMPRESSED,
    FOOTER_HEADER,
    FOOTER_MAGIC,
    FOOTER_TRAILER,
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    FRAME_MAGIC,
    SEGMENT_HEADER_SIZE,
    BadFrame,
    SegmentHeader,
    check_frame,
    encode_frame,
    valid_frame_after,
)
from journal._local.segments import SegmentReader
from journal._local.sidecar import SegmentSummary, read_summary
from journal.records import decode_frame_body, decode_frame_for_read, decode_record

# What a store whose files were replaced by hostile bytes may raise (SPEC section 6).
DOCUMENTED = (JournalCorrupt, StoreIncompatible)
HUGE = (2**31, 2**32 - 1, 2**62, 2**63, 2**64 - 1, 2**30 + 1)
EXTREME_VALUES: tuple[Any, ...] = (-1, 0, 2**63, 2**64 - 1, -(2**63), 2**32, 1.5, "x", b"", None)
SIDECAR_HEADER = struct.Struct(">8sI")


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail (instead of hanging) when the block takes longer than `seconds`."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class BoundedReads(FileOps):
    """Fails a read that asks for more than the file holds past its offset (plus one read
    chunk): a damaged length must never become an allocation of that size."""

    slack = 1 << 20

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        available = max(os.fstat(fd).st_size - offset, 0)
        assert 0 <= length <= available + self.slack, (length, offset, available)
        return super().pread(fd, length, offset)


# -- valid inputs -------------------------------------------------------------------------


def build_store(path: str, *, compressed: bool) -> None:
    """Sealed segments (compressed or plain) with sidecars, and an active segment holding
    every kind of record the facade writes in a few frames."""
    with Journal.open(path, segment_bytes=4096, compress_sealed=compressed) as j:
        for i in range(4):
            j.create_session(f"s{i}", tags={"k": "v"}, ttl_ms=10**9)
            for k in range(4):
                j.append(f"s{i}", [EventIn(type="t", data=bytes([65 + k]) * 300)])
        j.append("s0", [EventIn(type="t", data=b"x")], idempotency_key="key")
        j.compact_session("s1", 2, b"snapshot")
        j.suspend_session("s2")
        j.cancel_session("s3")
        j.create_session("late")
        j.append("late", [EventIn(type="t", data=b"y" * 20), EventIn(type="u", data=b"")])


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("templates")
    stores = {}
    for name, compressed in (("plain", False), ("compressed", True)):
        stores[name] = str(root / name)
        build_store(stores[name], compressed=compressed)
    return stores


def segment_files(store: str, kind: str) -> list[str]:
    """The files of one kind: `active`, `sealed` (plain or .zst) or `sidecar`."""
    directory = os.path.join(store, "segments")
    names = sorted(os.listdir(directory))
    segments = [n for n in names if n.endswith((".seg", ".seg.zst"))]
    chosen = {
        "active": segments[-1:],
        "sealed": segments[:-1],
        "sidecar": [n for n in names if n.endswith(".idx")],
    }[kind]
    return [os.path.join(directory, n) for n in chosen]


def frame_offsets(raw: bytes) -> list[int]:
    """Offsets of the frames of a plain segment's (or a block's) bytes, walking headers."""
    offsets = []
    at = SEGMENT_HEADER_SIZE
    while len(raw) - at >= FRAME_HEADER_SIZE and raw[at : at + 4] == FRAME_MAGIC:
        offsets.append(at)
        at += FRAME_HEADER_SIZE + FRAME_HEADER.unpack_from(raw, at)[1]
    return offsets


def length_fields(raw: bytes) -> list[tuple[int, int]]:
    """(offset, width) of the length, count and offset fields a valid file holds."""
    fields = [(28, 8)]  # the header's base position
    if raw.startswith(b"SJIDX"):
        return [(8, 4)]
    for at in frame_offsets(raw):
        fields += [(at + 4, 4), (at + 12, 8), (at + 20, 4)]
    if len(raw) >= SEGMENT_HEADER_SIZE + FOOTER_TRAILER.size:
        (footer_at,) = FOOTER_TRAILER.unpack_from(raw, len(raw) - FOOTER_TRAILER.size)
        if SEGMENT_HEADER_SIZE <= footer_at < len(raw):
            fields += [(len(raw) - 8, 8), (footer_at + 4, 4)]
            at = SEGMENT_HEADER_SIZE
            while at + BLOCK_HEADER.size <= footer_at and raw[at : at + 4] == b"SJBK":
                fields += [(at + 4, 8), (at + 12, 4), (at + 16, 4)]
                at += BLOCK_HEADER.size + BLOCK_HEADER.unpack_from(raw, at)[3]
    return fields


def fix_checksums(raw: bytes) -> bytes:
    """Recompute every checksum that can still be found, so mutated bytes reach the
    decoders behind the checksums (what a deliberate forgery, not rot, would do)."""
    data = bytearray(raw)
    if data.startswith(b"SJIDX") and len(data) >= SIDECAR_HEADER.size:
        data[8:12] = zlib.crc32(data[12:]).to_bytes(4, "big")
        return bytes(data)
    if len(data) >= SEGMENT_HEADER_SIZE:
        data[44:48] = zlib.crc32(data[:44]).to_bytes(4, "big")
    for at in frame_offsets(bytes(data)):
        _, length, _, first, count = FRAME_HEADER.unpack_from(data, at)
        body = data[at + FRAME_HEADER_SIZE : at + FRAME_HEADER_SIZE + length]
        if len(body) == length:
            data[at : at + FRAME_HEADER_SIZE + length] = encode_frame(bytes(body), first, count)
    if len(data) >= SEGMENT_HEADER_SIZE + FOOTER_TRAILER.size:
        (footer_at,) = FOOTER_TRAILER.unpack_from(data, len(data) - FOOTER_TRAILER.size)
        if SEGMENT_HEADER_SIZE <= footer_at <= len(data) - FOOTER_TRAILER.size - 12:
            table = data[footer_at + 12 : len(data) - FOOTER_TRAILER.size]
            data[footer_at + 4 : footer_at + 12] = struct.pack(">II", len(table), zlib.crc32(table))
            at = SEGMENT_HEADER_SIZE
            while at + BLOCK_HEADER.size <= footer_at and data[at : at + 4] == b"SJBK":
                clength = BLOCK_HEADER.unpack_from(data, at)[3]
                payload = data[at + BLOCK_HEADER.size : at + BLOCK_HEADER.size + clength]
                data[at + 20 : at + 24] = zlib.crc32(payload).to_bytes(4, "big")
                at += BLOCK_HEADER.size + clength
    return bytes(data)


def replace_values(obj: Any, choices: list[tuple[int, Any]]) -> Any:
    """`obj` (decoded msgpack) with leaf number i replaced by a value, for (i, value) in
    `choices`; lists may be emptied (value `[]`)."""
    counter = [0]
    wanted = dict(choices)

    def walk(item: Any) -> Any:
        index = counter[0]
        counter[0] += 1
        if index in wanted:
            return wanted[index]
        if isinstance(item, list):
            return [walk(x) for x in item]
        if isinstance(item, dict):
            return {walk(k): walk(v) for k, v in item.items()}
        return item

    return walk(obj)


def mutate_values(raw: bytes, draw: Callable[[st.SearchStrategy[Any]], Any]) -> bytes:
    """Replace decoded values inside one msgpack structure of the file (a frame body, the
    block table, the sidecar body) and re-encode it; checksums are fixed afterwards."""
    choices = [
        (draw(st.integers(0, 400)), draw(st.sampled_from((*EXTREME_VALUES, [], {}))))
        for _ in range(draw(st.integers(1, 4)))
    ]
    if raw.startswith(b"SJIDX"):
        body = msgspec.msgpack.decode(raw[12:])
        return raw[:12] + msgspec.msgpack.encode(replace_values(body, choices))
    offsets = frame_offsets(raw)
    if offsets:
        at = draw(st.sampled_from(offsets))
        _, length, _, first, count = FRAME_HEADER.unpack_from(raw, at)
        body = msgspec.msgpack.decode(raw[at + FRAME_HEADER_SIZE : at + FRAME_HEADER_SIZE + length])
        new = msgspec.msgpack.encode(replace_values(body, choices))
        return raw[:at] + encode_frame(new, first, count) + raw[at + FRAME_HEADER_SIZE + length :]
    (footer_at,) = FOOTER_TRAILER.unpack_from(raw, len(raw) - FOOTER_TRAILER.size)
    table = msgspec.msgpack.decode(raw[footer_at + 12 : -FOOTER_TRAILER.size])
    new = msgspec.msgpack.encode(replace_values(table, choices))
    return (
        raw[:footer_at]
        + FOOTER_HEADER.pack(FOOTER_MAGIC, len(new), 0)
        + new
        + FOOTER_TRAILER.pack(footer_at)
    )


@st.composite
def mutated(draw: Callable[[st.SearchStrategy[Any]], Any], original: bytes) -> bytes:
    """`original` after a few bit flips, cuts, splices, huge length fields or replaced
    values; with the checksums fixed up in most examples."""
    data = bytearray(original)
    fields = length_fields(original)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("flip", "cut", "splice", "huge", "huge", "values")))
        size = len(data)
        if kind == "flip" and size:
            data[draw(st.integers(0, size - 1))] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del data[draw(st.integers(0, size)) :]
        elif kind == "splice":
            start = draw(st.integers(0, size))
            end = draw(st.integers(start, min(size, start + 64)))
            if draw(st.booleans()):
                other = draw(st.integers(0, max(len(original) - 1, 0)))
                insert = original[other : other + draw(st.integers(0, 96))]
            else:
                insert = draw(st.binary(max_size=64))
            data[start:end] = insert
        elif kind == "huge" and fields:
            at, width = draw(st.sampled_from(fields))
            if at + width <= len(data):
                value = draw(st.sampled_from(HUGE)) % (1 << (8 * width))
                data[at : at + width] = value.to_bytes(width, "big")
        elif kind == "values":
            # (nothing decodable may be left to mutate)
            with contextlib.suppress(msgspec.DecodeError, struct.error, ValueError, IndexError):
                data = bytearray(mutate_values(bytes(data), draw))
    result = bytes(data)
    return fix_checksums(result) if draw(st.booleans()) or kind == "values" else result


# -- unit level: each parser alone -------------------------------------------------------


def valid_header() -> bytes:
    return SegmentHeader(1, 0, b"S" * 16, 1, 1_700_000_000_000).encode()


@given(st.binary(max_size=96) | mutated(valid_header()))
def test_segment_header_decode_raises_only_documented_errors(raw: bytes) -> None:
    try:
        header = SegmentHeader.decode(raw, "x.seg")
    except DOCUMENTED:
        return
    assert header.encode() == raw[:SEGMENT_HEADER_SIZE]


def valid_frames() -> bytes:
    return b"".join(
        encode_frame(msgspec.msgpack.encode([[2, 7, i, 0, "t", b"d" * i]]), 10 + i, 1)
        for i in range(4)
    )


@given(st.binary(max_size=200) | mutated(bytes(SEGMENT_HEADER_SIZE) + valid_frames()))
def test_check_frame_returns_a_frame_none_or_bad_frame(raw: bytes) -> None:
    for at in range(0, min(len(raw), 120), 7):
        try:
            checked = check_frame(raw, at)
        except BadFrame:
            continue
        if checked is not None:
            length, _, count = checked
            assert count >= 1 and at + FRAME_HEADER_SIZE + length <= len(raw)
    assert isinstance(valid_frame_after(raw, 0, 0), bool)


def test_searching_frame_like_bytes_is_linear() -> None:
    # 4 MiB of frame headers, each claiming a body reaching to the end: checking every
    # candidate's checksum was quadratic (minutes); the search must stay fast.
    size = 4 << 20
    step = FRAME_HEADER_SIZE
    raw = b"".join(
        FRAME_HEADER.pack(FRAME_MAGIC, max(size - at - step, 0), 0, 5, 1)
        for at in range(0, size, step)
    )
    with deadline(5):
        assert valid_frame_after(raw, 0, 0) is True  # damage, never a torn tail


def valid_body() -> bytes:
    return msgspec.msgpack.encode(
        [
            [1, "s", 5, "m", None, {"k": "v"}, {}, None, 0, None, None],
            [2, 1, 1, 5, "t", b"data", "req", 2],
            [3, 1, 2, 6, "why"],
            [4, 1, 1, 7, b"snap"],
            [7, 1, "key", 1, 1, b"d" * 32, 2],
        ]
    )


@given(
    st.binary(max_size=200) | mutated(bytes(SEGMENT_HEADER_SIZE) + encode_frame(valid_body(), 1, 5))
)
def test_record_decoders_raise_only_decode_errors(raw: bytes) -> None:
    body = raw[SEGMENT_HEADER_SIZE + FRAME_HEADER_SIZE :] if len(raw) > 88 else raw
    for decode in (decode_frame_body, decode_frame_for_read, decode_record):
        with contextlib.suppress(msgspec.DecodeError):
            decode(body)


def compressed_segment(templates: dict[str, str]) -> bytes:
    return Path(segment_files(templates["compressed"], "sealed")[0]).read_bytes()


def read_everything(directory: str, base: int) -> None:
    """Open a segment and read it every way the engine does."""
    ops = BoundedReads()
    with SegmentReader(directory, base, ops) as reader:
        offsets = [info.offset for info, _ in reader.frames(tail=not reader.compressed)]
        for offset in [*offsets, SEGMENT_HEADER_SIZE, SEGMENT_HEADER_SIZE + 1]:
            with contextlib.suppress(JournalCorrupt):
                reader.read_frame(offset)


def segment_reader_property(name: str, raw: bytes) -> None:
    """Read a segment file named `name` holding `raw` every way the engine does."""
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, name).write_bytes(raw)
        with deadline(10), contextlib.suppress(*DOCUMENTED):
            read_everything(directory, int(name[:20]))


@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_segment_reader_raises_only_documented_errors_and_reads_within_the_file(
    templates: dict[str, str], data: st.DataObject
) -> None:
    store = templates[data.draw(st.sampled_from(("plain", "compressed")))]
    path = segment_files(store, data.draw(st.sampled_from(("sealed", "active"))))[0]
    original = Path(path).read_bytes()
    raw = data.draw(st.binary(max_size=300).map(lambda b: original[:64] + b) | mutated(original))
    segment_reader_property(os.path.basename(path), raw)


@given(st.binary(max_size=300) | st.binary(max_size=300).map(lambda b: b"SJIDX\0\r\n" + b))
def test_read_summary_of_arbitrary_bytes_is_none_or_a_summary(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, f"{1:020d}.idx").write_bytes(fix_checksums(raw))
        assert read_summary(directory, 1) is None or raw.startswith(b"SJIDX")


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_read_summary_of_a_mutated_sidecar_is_none_or_consistent(
    templates: dict[str, str], data: st.DataObject
) -> None:
    path = segment_files(templates[data.draw(st.sampled_from(("plain", "compressed")))], "sidecar")[
        0
    ]
    raw = data.draw(mutated(Path(path).read_bytes()))
    with tempfile.TemporaryDirectory() as directory:
        name = os.path.basename(path)
        Path(directory, name).write_bytes(raw)
        summary = read_summary(directory, int(name[:20]))
    if summary is not None:
        assert isinstance(summary, SegmentSummary)
        offsets = {offset for offset, _, _ in summary.frames}
        assert all(run.frame_offset in offsets for run in summary.event_runs)
        assert all(0 < run.incarnation < 2**63 for run in summary.event_runs)
        for other in summary.others:
            decode_record(other.encoded)


# -- memory: lengths that claim far more than the file holds -----------------------------


def peak_while(action: Callable[[], None]) -> int:
    tracemalloc.start()
    try:
        with contextlib.suppress(*DOCUMENTED):
            action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def with_block_table(packed: bytes, change: Callable[[list[list[int]]], None]) -> bytes:
    """A compressed segment with its block table changed and the footer's checksum right."""
    (footer_at,) = FOOTER_TRAILER.unpack_from(packed, len(packed) - FOOTER_TRAILER.size)
    entries = msgspec.msgpack.decode(packed[footer_at + 12 : -FOOTER_TRAILER.size])
    change(entries)
    table = msgspec.msgpack.encode(entries)
    footer = FOOTER_HEADER.pack(FOOTER_MAGIC, len(table), zlib.crc32(table))
    return packed[:footer_at] + footer + table + FOOTER_TRAILER.pack(footer_at)


def claiming_huge_lengths(templates: dict[str, str], case: str) -> bytes:
    if case == "frame body of 1 GiB":
        plain = bytearray(Path(segment_files(templates["plain"], "active")[0]).read_bytes())
        plain[SEGMENT_HEADER_SIZE + 4 : SEGMENT_HEADER_SIZE + 8] = (1 << 30).to_bytes(4, "big")
        return bytes(plain)
    if case == "compressed block of 2**62 bytes":
        packed = compressed_segment(templates)
        return with_block_table(packed, lambda entries: entries[0].__setitem__(3, 2**62))
    # One block whose header and table agree on a 1 GiB uncompressed size, checksums
    # right, holding a zstd frame that does not state its size (so a one-shot
    # decompression allocates the claimed size up front).
    frames = encode_frame(valid_body(), 1, 5)
    payload = zstandard.ZstdCompressor(write_content_size=False).compress(frames)
    claimed = 1 << 30
    block = BLOCK_HEADER.pack(BLOCK_MAGIC, SEGMENT_HEADER_SIZE, claimed, len(payload), 0)
    block = block[:-4] + zlib.crc32(payload).to_bytes(4, "big") + payload
    table = msgspec.msgpack.encode(
        [[SEGMENT_HEADER_SIZE, claimed, SEGMENT_HEADER_SIZE, len(payload)]]
    )
    return (
        SegmentHeader(1, FLAG_COMPRESSED, b"S" * 16, 1, 0).encode()
        + block
        + FOOTER_HEADER.pack(FOOTER_MAGIC, len(table), zlib.crc32(table))
        + table
        + FOOTER_TRAILER.pack(SEGMENT_HEADER_SIZE + len(block))
    )


@pytest.mark.parametrize(
    "case",
    ["frame body of 1 GiB", "compressed block of 2**62 bytes", "uncompressed block of 1 GiB"],
)
def test_huge_claimed_lengths_allocate_nothing_like_them(
    templates: dict[str, str], case: str
) -> None:
    raw = claiming_huge_lengths(templates, case)
    base = SegmentHeader.decode(raw, "x.seg").base_position
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, f"{base:020d}.seg").write_bytes(raw)

        def read() -> None:
            with SegmentReader(directory, base) as reader:
                with contextlib.suppress(JournalCorrupt):
                    for _ in reader.frames(tail=True):
                        pass
                reader.read_frame(SEGMENT_HEADER_SIZE)

        with deadline(10):
            peak = peak_while(read)
    assert peak < 8 * len(raw) + (4 << 20), peak


# -- regressions: checksummed bytes that decoders refused or mishandled --------------------


def frame_rewritten(raw: bytes, index: int, body: bytes | None, count: int | None) -> bytes:
    """A plain segment with frame `index` given another body or count (checksum right)."""
    at = frame_offsets(raw)[index]
    _, length, _, first, old_count = FRAME_HEADER.unpack_from(raw, at)
    end = at + FRAME_HEADER_SIZE + length
    new_body = raw[at + FRAME_HEADER_SIZE : end] if body is None else body
    frame = encode_frame(new_body, first, old_count if count is None else count)
    return raw[:at] + frame + raw[end:]


def copy_store(template: str, root: str, *, keep_index: bool) -> str:
    store = os.path.join(root, "store")
    shutil.copytree(template, store)
    if not keep_index:
        shutil.rmtree(os.path.join(store, "index"))
    return store


@pytest.mark.parametrize(
    ("body", "count"),
    [
        (msgspec.msgpack.encode([]), None),  # no records: the reader took records[0]
        (b"\xc1 not msgpack", None),  # undecodable: a rebuild leaked msgspec.DecodeError
        (None, 3),  # three positions claimed, one record there: a rebuild skipped them
    ],
    ids=["empty body", "undecodable body", "count above the records"],
)
@pytest.mark.parametrize("keep_index", [True, False], ids=["view kept", "view rebuilt"])
def test_a_checksummed_frame_whose_body_is_not_its_records_is_corrupt(
    templates: dict[str, str], body: bytes | None, count: int | None, keep_index: bool
) -> None:
    with tempfile.TemporaryDirectory() as root:
        store = copy_store(templates["plain"], root, keep_index=keep_index)
        path = segment_files(store, "active")[0]
        Path(path).write_bytes(frame_rewritten(Path(path).read_bytes(), 0, body, count))
        name = os.path.basename(path)
        for readonly in (False, True):
            try:
                journal = Journal.open(store, readonly=readonly)
            except JournalCorrupt as e:
                assert (e.segment, e.offset) == (name, SEGMENT_HEADER_SIZE)
                continue
            with journal:
                places = {(p.segment, p.offset) for p in journal.verify().problems}
                for session in journal.list_sessions():
                    try:
                        journal.read(session.session_id)
                    except JournalCorrupt as e:
                        places.add((e.segment, e.offset))
                assert (name, SEGMENT_HEADER_SIZE) in places


def sidecar_rewritten(raw: bytes, change: Callable[[list[Any]], None]) -> bytes:
    body = msgspec.msgpack.decode(raw[SIDECAR_HEADER.size :])
    change(body)
    new = msgspec.msgpack.encode(body)
    return SIDECAR_HEADER.pack(raw[:8], zlib.crc32(new)) + new


def _others_undecodable(body: list[Any]) -> None:
    body[8][0][2] = b"\xc1"


def _runs_negative(body: list[Any]) -> None:
    for run in body[7]:
        run[0] = run[1] = -1


def _frames_out_of_segment(body: list[Any]) -> None:
    body[4][0][0] = 2**63


@pytest.mark.parametrize(
    "change",
    [_others_undecodable, _runs_negative, _frames_out_of_segment],
    ids=["record undecodable", "negative run values", "frame offset out of the segment"],
)
def test_a_checksummed_but_inconsistent_sidecar_is_ignored_and_rebuilt(
    templates: dict[str, str], change: Callable[[list[Any]], None]
) -> None:
    # msgspec.DecodeError and struct.error escaped from opening such a store.
    with tempfile.TemporaryDirectory() as root:
        store = copy_store(templates["plain"], root, keep_index=False)
        path = segment_files(store, "sidecar")[0]
        Path(path).write_bytes(sidecar_rewritten(Path(path).read_bytes(), change))
        directory, name = os.path.split(path)
        assert read_summary(directory, int(name[:20])) is None
        reader_store = os.path.join(root, "reader")
        shutil.copytree(store, reader_store)
        with Journal.open(reader_store, readonly=True) as reader:
            assert len(list(reader.list_sessions())) == 5
            assert not reader.verify().problems[1:]  # at most the sidecar itself
        with Journal.open(store) as journal:
            assert len(list(journal.list_sessions())) == 5
            assert journal.verify().problems == []


def test_a_writers_open_checks_sidecars_by_checksum_and_uses_them_only_once_decoded(
    templates: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    # A writer's open used to decode every sealed segment's sidecar and check it was
    # consistent (175 ms for 200,000 single-event frames); it checks the checksum only,
    # and rewrites a sidecar that fails it. A checksummed but inconsistent one (a
    # forgery) is left to where sidecars are used, which take it as absent; verify
    # reports it and --fix rewrites it. Events are never read from it.
    with tempfile.TemporaryDirectory() as root:
        store = copy_store(templates["plain"], root, keep_index=True)
        (sidecar,) = segment_files(store, "sidecar")
        with Journal.open(store) as journal:
            expected = {
                s.session_id: [e.data for e in journal.replay(s.session_id)]
                for s in journal.list_sessions()
            }
        original = Path(sidecar).read_bytes()
        damaged = bytearray(original)
        damaged[-1] ^= 0xFF  # the checksum fails
        Path(sidecar).write_bytes(bytes(damaged))
        with caplog.at_level(logging.WARNING, logger="journal"), Journal.open(store):
            assert Path(sidecar).read_bytes() == original  # rewritten at open
        # ... and said: `verify --fix` after such an open has nothing left to report.
        assert f"the sidecar {os.path.basename(sidecar)} is damaged" in caplog.text
        forgery = sidecar_rewritten(original, _frames_out_of_segment)
        Path(sidecar).write_bytes(forgery)
        with Journal.open(store) as journal:
            assert Path(sidecar).read_bytes() == forgery  # not decoded at open: kept
            got = {
                s.session_id: [e.data for e in journal.replay(s.session_id)]
                for s in journal.list_sessions()
            }
            assert got == expected
            # A retention pass takes it as absent and scans the segment instead (so does
            # compaction: test_retention).
            journal.apply_retention()
            problems = journal.verify().problems
            assert [p.segment for p in problems] == [os.path.basename(sidecar)], problems
            assert journal.verify(fix=True).fixed
            assert Path(sidecar).read_bytes() == original
            assert journal.verify().problems == []


def test_an_empty_active_segment_after_a_compressed_seal_is_started_again(
    templates: dict[str, str],
) -> None:
    # The writer discarded the unborn segment, then tried to append to the sealed .zst
    # as if it were plain: StoreUnavailable "No such file or directory".
    with tempfile.TemporaryDirectory() as root:
        store = copy_store(templates["compressed"], root, keep_index=False)
        active = segment_files(store, "active")[0]
        Path(active).write_bytes(b"")
        with Journal.open(store) as journal:
            journal.append("fresh", [EventIn(type="t", data=b"z")], create=True)
            assert journal.verify().problems == []


# -- store level: files replaced by hostile bytes, then the store is used ----------------


def use_store(path: str, *, readonly: bool) -> None:
    """Open and use a store; only documented errors may come out."""
    try:
        journal = Journal.open(path, readonly=readonly)
    except DOCUMENTED:
        return
    with journal:
        for step in ("list", "read", "replay", "verify", "append"):
            try:
                if step == "list":
                    sessions = list(journal.list_sessions())
                elif step in ("read", "replay"):
                    for session in sessions:
                        if step == "read":
                            journal.read(session.session_id, max_bytes=512)
                        else:
                            list(journal.replay(session.session_id))
                elif step == "verify":
                    journal.verify()
                elif not readonly:
                    journal.append("fresh", [EventIn(type="t", data=b"z")], create=True)
            except DOCUMENTED:
                pass
            except SessionNotFound:
                pass  # listed, then found gone by a rebuild: not a crash


def store_property(templates: dict[str, str], data: st.DataObject) -> None:
    template = templates[data.draw(st.sampled_from(("plain", "compressed")), label="store")]
    kind = data.draw(st.sampled_from(("active", "sealed", "sidecar")), label="file")
    keep_index = data.draw(st.booleans(), label="keep index")
    readonly = data.draw(st.booleans(), label="readonly")
    with tempfile.TemporaryDirectory() as root:
        store = os.path.join(root, "store")
        shutil.copytree(template, store)
        if not keep_index:
            shutil.rmtree(os.path.join(store, "index"))
        path = data.draw(st.sampled_from(segment_files(store, kind)), label="path")
        original = Path(path).read_bytes()
        raw = data.draw(
            st.binary(max_size=400) | mutated(original), label=f"bytes of {os.path.basename(path)}"
        )
        Path(path).write_bytes(raw)
        with deadline(30):
            use_store(store, readonly=readonly)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_store_with_hostile_files_raises_only_documented_errors(
    templates: dict[str, str], data: st.DataObject
) -> None:
    store_property(templates, data)


@pytest.mark.slow
@settings(max_examples=1500, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_store_with_hostile_files_raises_only_documented_errors_deep(
    templates: dict[str, str], data: st.DataObject
) -> None:
    store_property(templates, data)


@pytest.mark.slow
@settings(max_examples=3000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_segment_reader_raises_only_documented_errors_deep(
    templates: dict[str, str], data: st.DataObject
) -> None:
    store = templates[data.draw(st.sampled_from(("plain", "compressed")))]
    path = segment_files(store, data.draw(st.sampled_from(("sealed", "active"))))[0]
    segment_reader_property(os.path.basename(path), data.draw(mutated(Path(path).read_bytes())))


def test_a_block_larger_than_one_shot_decompression_reads_back(tmp_path: Path) -> None:
    # Blocks above 2 MiB (one large frame) are decompressed as a stream, capped at their
    # claimed size: a real one must still read back whole, from the writer and a reader.
    data = os.urandom(3 << 20)
    store = str(tmp_path / "store")
    with Journal.open(store, segment_bytes=4096, compress_sealed=True) as journal:
        journal.append("big", [EventIn(type="t", data=data)], create=True)
        journal.append("big", [EventIn(type="t", data=b"after")])  # seals the big one
        assert [e.data for e in journal.replay("big")] == [data, b"after"]
        assert journal.verify().problems == []
    assert any(name.endswith(".seg.zst") for name in os.listdir(os.path.join(store, "segments")))
    with Journal.open(store, readonly=True) as reader:
        assert [e.data for e in reader.replay("big")] == [data, b"after"]
