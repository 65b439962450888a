"""The facade over the engine seam: public names, errors that cross process boundaries,
store statistics, the local engine's fault points, and damage reports that name files."""

from __future__ import annotations

import pickle
import re
import sys
from pathlib import Path

import pytest
from _dead_files import EVICT_AT_ONCE, KeepDeadFiles, evict_keeping_dead_files

import journal
from journal import (
    CursorExpired,
    CursorFuture,
    Event,
    EventIn,
    Journal,
    JournalCorrupt,
    JournalError,
    OrdinalConflict,
    SessionState,
)
from journal._local.files import FAULT_POINTS
from journal._local.view import View

ROOT = Path(__file__).resolve().parent.parent


def _instance(cls: type[JournalError]) -> JournalError:
    if cls is JournalCorrupt:
        return JournalCorrupt("00000000000000000001.seg", 4096, "frame checksum mismatch")
    if cls is OrdinalConflict:
        return OrdinalConflict("ends at 3, not 2", expected=2, actual=3)
    if cls is CursorFuture:
        return CursorFuture("past the head", head_ordinal=7)
    if cls is CursorExpired:
        return CursorExpired("expired", earliest_ordinal=5, resume_cursor="AQ")
    if cls is journal.OutcomeUnknown:
        return journal.OutcomeUnknown("owner died", request_id="r1", cursor="AQ")
    if cls is journal.TurnSettled:
        result: dict[str, object] = {"status": "completed"}
        return journal.TurnSettled("ran once", request_id="r1", result=result, cursor="AQ")
    if cls is journal.OwnerBusy:
        return journal.OwnerBusy("owned by pid 42", pid=42)
    if cls is journal.ArchiveInvalid:
        return journal.ArchiveInvalid("truncated", "ends early", offset=12)
    return cls(f"a {cls.__name__}")


ERRORS = sorted(
    (obj for obj in vars(journal).values() if isinstance(obj, type)),
    key=lambda cls: cls.__name__,
)
ERRORS = [cls for cls in ERRORS if issubclass(cls, JournalError)]


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_every_error_survives_pickling(cls: type[JournalError]) -> None:
    error = _instance(cls)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error)
    assert (copy.code, copy.status) == (error.code, error.status)
    assert vars(copy) == vars(error)


def test_public_classes_report_the_package_they_are_imported_from() -> None:
    for name in journal.__all__:
        obj = getattr(journal, name)
        if not isinstance(obj, type):
            continue
        # Classes of the `cursors` package (the error root and the token errors) report
        # that public package; everything defined in journal reports `journal`.
        assert obj.__module__ in ("journal", "cursors"), (name, obj.__module__)
        assert getattr(sys.modules[obj.__module__], name) is obj
        if not issubclass(obj, JournalError) or obj.__module__ == "journal":
            assert obj.__module__ == "journal", name


def test_stats_counts_sessions_segments_and_bytes(tmp_path: Path) -> None:
    with Journal.open(tmp_path, durability="os", segment_bytes=4096) as j:
        empty = j.stats()
        assert empty.sessions == {} and empty.segments == 1 and empty.replicas is None
        for name in ("a", "b", "c"):
            j.create_session(name)
        for _ in range(6):
            j.append("a", [EventIn("m", b"x" * 1000)])
        j.resolve_session("b")
        stats = j.stats()
        segment_files = [
            p for p in (tmp_path / "segments").iterdir() if p.name.endswith((".seg", ".seg.zst"))
        ]
        all_bytes = sum(p.stat().st_size for p in (tmp_path / "segments").iterdir())
    assert stats.sessions == {"open": 2, "resolved": 1}
    assert stats.segments == len(segment_files) > 1
    assert stats.segment_bytes == all_bytes
    # 3 creations + 6 events + 1 transition, positions from 1.
    assert stats.next_position == 1 + 3 + 6 + 1


def test_stats_tells_the_zeros_written_ahead_of_the_active_segment(tmp_path: Path) -> None:
    """The active segment is written ahead with zeros (up to 4 MiB): they are in
    `segment_bytes`, and `preallocated_bytes` says how many (an append takes its frame
    from them; sealing cuts them). Until 2026-12-07 nothing told them from the data."""
    with Journal.open(tmp_path, durability="os") as j:
        empty = j.stats()
        j.create_session("a")
        j.append("a", [EventIn("m", b"x" * 100_000)])
        after = j.stats()
        (active,) = (tmp_path / "segments").glob("*.seg")
        assert after.preallocated_bytes < active.stat().st_size <= 4 << 20
        j.compact(dead_share=0.0)  # (nothing dead: nothing sealed, the zeros stay)
        assert j.stats().preallocated_bytes == after.preallocated_bytes
    assert empty.segment_bytes == after.segment_bytes  # (the file did not grow)
    used = after.segment_bytes - after.preallocated_bytes
    assert 100_000 < used - (empty.segment_bytes - empty.preallocated_bytes) < 101_000
    assert empty.preallocated_bytes > (4 << 20) - 200, empty


def test_every_fault_point_is_declared_and_reached_from_the_code() -> None:
    used: set[str] = set()
    for path in (ROOT / "journal" / "_local").glob("*.py"):
        source = path.read_text()
        used |= set(re.findall(r'\.point\(\s*"([a-z_.]+)"', source))
        # Points named by a conditional expression.
        used |= set(re.findall(r'\.point\(\s*"([a-z_.]+)" if', source))
        used |= set(re.findall(r'else "([a-z_.]+)"\)', source))
    assert used == set(FAULT_POINTS)


def test_a_view_that_lost_its_event_index_is_reported_with_a_real_segment(
    tmp_path: Path,
) -> None:
    with Journal.open(tmp_path, durability="os", segment_bytes=4096) as j:
        j.create_session("s")
        for _ in range(8):
            j.append("s", [EventIn("m", b"y" * 700)])
        incarnation = j.get_session("s").incarnation
    view = View(str(tmp_path / "index"))
    try:
        with view.begin(write=True) as txn:
            locations = view.events.locations(txn, incarnation)
            assert len(locations) == 8
            for location in locations[4:]:  # the last frames: the index ends early
                view.events.delete(txn, incarnation, location.first_ordinal)
    finally:
        view.close()
    with Journal.open(tmp_path, durability="os", segment_bytes=4096) as j:
        with pytest.raises(JournalCorrupt) as raised:
            list(j.replay("s"))
        assert (tmp_path / "segments" / raised.value.segment).exists(), raised.value
        assert "no frame for ordinal 5" in str(raised.value)
        assert j.get_session("s").state is SessionState.OPEN
        report = j.verify()
        assert not report.ok and any(p.segment == "index" for p in report.problems)
        assert j.verify(fix=True).ok
        assert [e.ordinal for e in j.replay("s")] == list(range(1, 9))


def test_annotations_of_public_classes_resolve_under_their_public_module() -> None:
    import typing

    import msgspec

    import cursors

    for package in (journal, cursors):
        for name in package.__all__:
            obj = getattr(package, name)
            if not isinstance(obj, type):
                continue
            typing.get_type_hints(obj)
            if issubclass(obj, msgspec.Struct):
                msgspec.inspect.type_info(obj)
    typing.get_type_hints(Journal.open)
    # A decoder built after import (as a user's would be) works for the read types.
    decoder = msgspec.msgpack.Decoder(journal.Page)
    page = decoder.decode(msgspec.msgpack.encode(journal.Page([], None, False)))
    assert page == journal.Page([], None, False)


def test_a_failure_to_delete_dead_segments_does_not_fail_the_committed_pass(
    tmp_path: Path,
) -> None:
    ops = KeepDeadFiles()
    with Journal.open(
        tmp_path, durability="os", segment_bytes=4096, retention=EVICT_AT_ONCE, file_ops=ops
    ) as j:
        report, ended = evict_keeping_dead_files(j, ops)
        assert report.reclaimed_bytes == 0
        leftover = [
            name for name in report.deleted_segments if (tmp_path / "segments" / name).exists()
        ]
        assert leftover == report.deleted_segments  # not deleted: the I/O error
        ops.armed = False
        again = j.apply_retention(now_ms=ended + 10)
        assert set(again.deleted_segments) >= set(leftover) and again.reclaimed_bytes > 0
        assert not [n for n in leftover if (tmp_path / "segments" / n).exists()]
        assert j.get_session("kept").state is SessionState.OPEN
        assert j.verify().ok


def test_events_and_pages_pickle_with_their_cursors(tmp_path: Path) -> None:
    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        j.append("s", [EventIn("m", b"one", "r1"), EventIn("m", b"two")])
        page = j.read("s")
        copy = pickle.loads(pickle.dumps(page))
        assert copy == page
        assert [e.cursor for e in copy.events] == [e.cursor for e in page.events]
        assert copy.events[0].session_id == "s" and copy.events[0].request_id == "r1"
        # A cursor that travelled in a pickle resumes as well as the original.
        resumed = list(j.replay("s", cursor=copy.events[0].cursor))
        assert [e.data for e in resumed] == [b"two"]
        # No key material travels: only the cursor strings.
        assert b"HMAC" not in pickle.dumps(page)


def test_events_and_pages_encode_through_to_dict(tmp_path: Path) -> None:
    """An event (laid out for fast reads) does not encode itself: `to_dict` gives what
    does, with the cursor; the other public types encode as they are."""
    import msgspec

    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        j.append("s", [EventIn("m", b"one", "r1"), EventIn("m", b"two")])
        page = j.read("s")
        decoded = msgspec.json.decode(msgspec.json.encode(page.to_dict()))
        first = decoded["events"][0]
        assert first == {
            "session_id": "s",
            "ordinal": 1,
            "type": "m",
            "data": "b25l",  # (base64 of b"one")
            "request_id": "r1",
            "timestamp_ms": page.events[0].timestamp_ms,
            "position": page.events[0].position,
            "cursor": page.events[0].cursor,
        }
        assert decoded["next_cursor"] == page.next_cursor and decoded["has_more"] is False
        assert [e["data"] for e in decoded["events"]] == ["b25l", "dHdv"]
        resumed = list(j.replay("s", cursor=first["cursor"]))
        assert [e.data for e in resumed] == [b"two"]
        # An unpickled event keeps its cursor; one not read from a journal has none.
        unpickled = pickle.loads(pickle.dumps(page.events[1]))
        assert unpickled.to_dict()["cursor"] == page.events[1].cursor
        assert Event(0, 1, 0, "m", b"x").to_dict()["cursor"] is None
        with j.watch_sessions() as feed:
            msgspec.json.encode(next(feed))
        msgspec.json.encode(j.get_session("s"))
        msgspec.json.encode(j.stats())


def test_streams_close_at_once_and_work_as_context_managers(tmp_path: Path) -> None:
    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        j.append("s", [EventIn("m", b"x")])
        stream = j.watch("s")
        assert next(stream).data == b"x"
        stream.close()  # a live watch at the head: ends without waiting
        with pytest.raises(StopIteration):
            next(stream)
        with j.watch_sessions() as feed:
            assert next(feed).session.session_id == "s"
        assert [e.ordinal for e in j.replay("s")] == [1]


def test_journal_says_how_to_open_it_and_what_it_is(tmp_path: Path) -> None:
    from journal import InvalidArgument

    with pytest.raises(TypeError, match=r"Journal\.open"):
        Journal()
    assert "Journal.open" in (Journal.__doc__ or "")
    j = Journal.open(tmp_path, durability="os")
    assert repr(j) == f"Journal({str(tmp_path)!r}, writable)"
    j.create_session("s")
    with pytest.raises(InvalidArgument):
        j.read("s", max_bytes=True)
    j.close()
    assert repr(j).endswith("closed)")
