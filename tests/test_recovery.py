"""Crash recovery through the product: `Journal.open` on real files left as a crash (or
damage) leaves them, with the view (`index/`) deleted, damaged, behind the log, or current
(SPEC 3.3, 3.4, 7.1 step 2). The writer recovers by catching its view up with the log and
attaching after the view's head; these tests go that way only."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from journal import EventIn, Journal, JournalCorrupt, StoreIncompatible
from journal._local.cut_tails import CUT_TAILS_DIRECTORY
from journal._local.frames import SEGMENT_HEADER_SIZE, encode_frame, segment_name
from journal._local.segments import SegmentReader

SEGMENT = segment_name(1)
PAYLOADS = [bytes([0x41 + i]) * 150 for i in range(6)]
# How the view stands when the damaged store is opened: deleted (rebuilt from the log),
# damaged (replaced by an empty one, then rebuilt), behind (copied before the last two
# frames were written: a crash before it indexed them), current (it indexes every frame).
VIEWS = ("deleted", "damaged", "behind", "current")
FILLERS = (b"", b"\0", b"\xa5")


@dataclass
class Origin:
    store: Path  # a session "s" of six events, one frame each (after its creation's)
    behind: Path  # the store's view after four of them
    data: bytes  # the segment's bytes up to its last frame's end
    ends: list[int]  # where each frame ends


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Origin:
    root = tmp_path_factory.mktemp("origin")
    store = root / "store"
    with Journal.open(store) as j:
        j.create_session("s")
        for payload in PAYLOADS[:4]:
            j.append("s", [EventIn("m", payload)])
    shutil.copytree(store / "index", root / "behind")
    with Journal.open(store) as j:
        for payload in PAYLOADS[4:]:
            j.append("s", [EventIn("m", payload)])
    ends = segment_ends(store)
    data = (store / "segments" / SEGMENT).read_bytes()[: ends[-1]]
    return Origin(store, root / "behind", data, ends)


def segment_ends(store: Path) -> list[int]:
    with SegmentReader(str(store / "segments"), 1) as reader:
        return [info.end_offset for info, _ in reader.frames(tail=True)]


def kept_tails(store: Path) -> dict[str, bytes]:
    directory = store / CUT_TAILS_DIRECTORY
    if not directory.exists():
        return {}
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def damaged_copy(origin: Origin, case: Path, damaged: bytes, view: str) -> None:
    """The origin store at `case`, its segment replaced by `damaged`, its view as `view`."""
    shutil.copytree(origin.store, case, ignore=shutil.ignore_patterns("index"))
    (case / "segments" / SEGMENT).write_bytes(damaged)
    if view == "current":
        shutil.copytree(origin.store / "index", case / "index")
    elif view == "behind":
        shutil.copytree(origin.behind, case / "index")
    elif view == "damaged":
        shutil.copytree(origin.store / "index", case / "index")
        with open(case / "index" / "data.mdb", "r+b") as f:
            f.write(b"\xa5" * 8192)  # (its meta pages: the file check fails)


def check_torn_tail(origin: Origin, case: Path, cut: int, filler: bytes, view: str) -> None:
    """Everything up to `cut`, then nothing, zeros or garbage (50 bytes past the last
    frame): the store opens, its intact frames are there, the bytes after them were cut
    (a copy kept, unless the view recorded where they begin) and appends go on right after
    them. With the current view, whose head
    says every frame committed, nothing before its head is cut and a damaged frame is
    reported on reading."""
    data, ends = origin.data, origin.ends
    damaged = data[:cut] + filler * (ends[-1] + 50 - cut)
    damaged_copy(origin, case, damaged, view)
    where = (cut, filler, view)
    segment = case / "segments" / SEGMENT
    if view == "current":
        intact = damaged[: ends[-1]] == data
        with Journal.open(case) as j:
            if intact:
                assert [e.data for e in j.replay("s")] == PAYLOADS, where
                assert j.append("s", [EventIn("m", b"after")]).first_ordinal == 7, where
            else:
                with pytest.raises(JournalCorrupt):
                    list(j.replay("s"))
                # (refused where the frames the view indexes end before its head: a hole)
                with contextlib.suppress(JournalCorrupt):
                    j.append("s", [EventIn("m", b"after")])
        assert segment.read_bytes()[: ends[-1]] == damaged[: ends[-1]], where
        return
    # A frame survives if its bytes are intact (a filler byte may happen to equal the
    # byte it replaced, e.g. a trailing zero).
    kept = [e for e in ends if damaged[:e] == data[:e]]
    end = kept[-1]
    with Journal.open(case) as j:
        assert [e.data for e in j.replay("s")] == PAYLOADS[: len(kept) - 1], where
        assert j.append("s", [EventIn("m", b"after")]).first_ordinal == len(kept), where
    # appends continue right after the recovered prefix, with nothing left after them
    after = segment_ends(case)
    assert after[:-1] == kept, where
    assert not segment.read_bytes()[after[-1] :].strip(b"\0"), where
    cut_off = damaged[end:].rstrip(b"\0")
    # A copy is kept unless the view itself recorded that end as its head (the view from
    # before the last two frames, when no frame after its head survived): nothing past a
    # head the view recorded ever committed.
    recorded = view == "behind" and end == ends[-3]
    expected = {f"{SEGMENT}-{end}.tail": cut_off} if cut_off and not recorded else {}
    assert kept_tails(case) == expected, where


def offsets(origin: Origin, sample: int | None, rng: random.Random) -> list[int]:
    """Every offset of the last two frames (`sample` None), or those next to their
    boundaries and headers and `sample` more."""
    ends = origin.ends
    every = range(ends[-3], ends[-1] + 1)
    if sample is None:
        return list(every)
    near = {b + d for b in ends[-3:] for d in (-1, 0, 1, 4, 8, 23, 24, 25) if b + d in every}
    return sorted(near | set(rng.sample(every, sample)))


def sweep(origin: Origin, tmp_path: Path, cuts: list[int], views: tuple[str, ...]) -> None:
    logging.disable(logging.WARNING)  # (every cut logs one)
    try:
        for n, (cut, filler, view) in enumerate(
            (c, f, v) for c in cuts for f in FILLERS for v in views
        ):
            case = tmp_path / f"case{n}"
            check_torn_tail(origin, case, cut, filler, view)
            shutil.rmtree(case)
    finally:
        logging.disable(logging.NOTSET)


def test_a_torn_tail_in_the_last_two_frames_recovers_the_prefix(
    origin: Origin, tmp_path: Path, rng: random.Random
) -> None:
    sweep(origin, tmp_path, offsets(origin, 4, rng), VIEWS)


@pytest.mark.slow
def test_a_torn_tail_at_every_offset_of_the_last_two_frames_recovers_the_prefix(
    origin: Origin, tmp_path: Path
) -> None:
    sweep(origin, tmp_path, offsets(origin, None, random.Random()), VIEWS)


@pytest.mark.parametrize("view", ["deleted", "current"])
def test_damage_followed_by_whole_frames_is_never_cut(
    origin: Origin, tmp_path: Path, view: str
) -> None:
    # A bad frame with valid frames after it was committed: without the view the open
    # refuses (JournalCorrupt naming it) rather than cut committed data; with it, reading
    # the frame does. Either way the file is left as it was.
    ends = origin.ends
    for target, at in ((0, 5), (2, 14), (4, 100)):  # header fields (length too), and body
        damaged = bytearray(origin.data)
        damaged[ends[target] + at] ^= 0x10
        case = tmp_path / f"{target}"
        damaged_copy(origin, case, bytes(damaged), view)
        if view == "deleted":
            with pytest.raises(JournalCorrupt) as caught:
                Journal.open(case)
            assert (caught.value.segment, caught.value.offset) == (SEGMENT, ends[target])
        else:
            with Journal.open(case) as j, pytest.raises(JournalCorrupt) as caught:
                list(j.replay("s"))
            assert caught.value.segment == SEGMENT
        raw = (case / "segments" / SEGMENT).read_bytes()
        assert raw[: len(damaged)] == damaged and not raw[len(damaged) :].strip(b"\0")
        assert kept_tails(case) == {}


@pytest.mark.parametrize("view", ["deleted", "behind"])
def test_a_frame_claiming_no_records_after_the_last_is_cut_as_a_torn_write(
    origin: Origin, tmp_path: Path, view: str
) -> None:
    # A frame header with count 0 is never written: past the last committed frame it is an
    # unfinished tail, whatever its checksum (a valid CRC over an empty body).
    ends = origin.ends
    zero = encode_frame(b"", 6, 0)
    damaged_copy(origin, tmp_path / "s", origin.data[: ends[-2]] + zero, view)
    with Journal.open(tmp_path / "s") as j:
        assert [e.data for e in j.replay("s")] == PAYLOADS[:5]
        assert j.append("s", [EventIn("m", b"after")]).first_ordinal == 6
    assert segment_ends(tmp_path / "s")[:-1] == ends[:-1]
    assert kept_tails(tmp_path / "s") == {f"{SEGMENT}-{ends[-2]}.tail": zero.rstrip(b"\0")}


def test_segments_of_another_store_are_refused_by_a_rebuilding_writer(
    origin: Origin, tmp_path: Path
) -> None:
    # (With the view there, its store id refuses first: test_regressions.)
    store = tmp_path / "s"
    damaged_copy(origin, store, origin.data, "deleted")
    other = tmp_path / "other"
    Journal.open(other).close()
    shutil.copy2(other / "store.json", store / "store.json")
    shutil.copy2(other / "keys", store / "keys")
    with pytest.raises(StoreIncompatible, match="belongs to another store"):
        Journal.open(store)
    assert (store / "segments" / SEGMENT).read_bytes() == origin.data


# -- a crash during rotation ------------------------------------------------------------


def rotated(store: Path, compress: bool) -> tuple[Path, list[bytes], int, int]:
    """A store whose append of the last payload rotated (sealed the active segment and
    started the next); returns where its view before that append was copied, the
    payloads committed before it, the sealed segment's base and the new one's."""
    segments = store / "segments"
    payloads: list[bytes] = []
    with Journal.open(store, segment_bytes=4096, compress_sealed=compress) as j:
        j.create_session("s")
        for i in range(100):
            shutil.rmtree(store.parent / "before", ignore_errors=True)
            shutil.copytree(store / "index", store.parent / "before")
            bases = sorted(int(n[:20]) for n in os.listdir(segments) if ".seg" in n)
            payload = b"%d:" % i + bytes([0x41 + i % 26]) * 1200
            j.append("s", [EventIn("m", payload)])
            after = sorted(int(n[:20]) for n in os.listdir(segments) if ".seg" in n)
            if len(after) > len(bases) and len(bases) >= 2:
                return store.parent / "before", payloads, bases[-1], after[-1]
            payloads.append(payload)
    raise AssertionError("no rotation happened")


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("view", ["deleted", "behind"])
@pytest.mark.parametrize("successor", ["none", "unborn"])
def test_a_crash_while_rotating_leaves_a_store_that_opens_and_goes_on(
    tmp_path: Path, compress: bool, view: str, successor: str
) -> None:
    """The crash comes after the sealed segment was cut to its frames (and, compressed,
    replaced by its `.zst`), before the next segment was born: it is missing, or (a store
    written before segments were born by rename) shorter than its header; the sealed
    segment's sidecar may be missing too (plain: it is written after the birth). The next
    writer starts the next segment after the sealed one's last frame."""
    store = tmp_path / "store"
    before, payloads, sealed, new = rotated(store, compress)
    segments = store / "segments"
    os.unlink(segments / segment_name(new))
    if successor == "unborn":
        (segments / segment_name(new)).write_bytes(bytes(SEGMENT_HEADER_SIZE // 2))
    if not compress:
        os.unlink(segments / f"{segment_name(sealed)[:20]}.idx")
    shutil.rmtree(store / "index")
    if view == "behind":
        shutil.copytree(before, store / "index")
    with Journal.open(store, segment_bytes=4096, compress_sealed=compress) as j:
        assert [e.data for e in j.replay("s")] == payloads
        # (as large as the append that rotated: it rotates at the same place)
        after = b"after" + bytes(1200)
        assert j.append("s", [EventIn("m", after)]).first_ordinal == len(payloads) + 1
        assert [e.data for e in j.replay("s")] == [*payloads, after]
        assert j.verify().problems == []
    names = os.listdir(segments)
    assert segment_name(sealed, compressed=compress) in names
    assert segment_name(new) in names  # (born again, at the same base)
    assert not [n for n in names if n.endswith(".tmp")]
