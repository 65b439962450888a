"""What a supervisor meets when it passes back a cursor it saved (SPEC 5, 7.7): an empty
saved cursor is named as empty, and the lifecycle feed's errors say that leaving the
cursor out starts with a snapshot of every session, not from the feed's beginning.
Found by a supervisor-author trial."""

from __future__ import annotations

from pathlib import Path

import pytest

from journal import CursorForeign, CursorMalformed, EventIn, Journal


@pytest.fixture
def journal_with_a_session(tmp_path: Path) -> Journal:
    j = Journal.open(tmp_path / "store", durability="os")
    j.create_session("worker-1")
    j.append("worker-1", [EventIn("message", b"{}")])
    return j


def test_an_empty_saved_cursor_is_named_as_empty(journal_with_a_session: Journal) -> None:
    # A supervisor that keeps its cursor in a file reads "" before it saved one. Until
    # 2026-12-04: "the lifecycle cursor is 0 characters long, not 59 (it was truncated,
    # extended or is not a lifecycle cursor)", a cause that is not the one.
    j = journal_with_a_session
    calls = [
        lambda: j.watch_sessions(cursor=""),
        lambda: j.watch("worker-1", cursor=""),
        lambda: j.read("worker-1", cursor=""),
        lambda: j.replay("worker-1", cursor=""),
    ]
    with j:
        for call in calls:
            with pytest.raises(CursorMalformed) as info:
                call()
            message = info.value.message
            assert "is empty" in message, message
            assert "None" in message, message
            assert "characters long" not in message, message
            assert "truncated" not in message, message


def test_lifecycle_cursor_errors_say_no_cursor_starts_with_a_snapshot(
    journal_with_a_session: Journal, tmp_path: Path
) -> None:
    # Until 2026-12-04 they said "omit it to start from the beginning": the feed without
    # a cursor starts with one `created` per existing session, then live changes.
    j = journal_with_a_session
    with j, Journal.open(tmp_path / "other", durability="os") as other:
        other.create_session("elsewhere")
        foreign = next(iter(other.watch_sessions())).cursor
        for cursor, error in (("", CursorMalformed), ("x" * 10, CursorMalformed)):
            with pytest.raises(error) as info:
                j.watch_sessions(cursor=cursor)
            message = info.value.message
            assert "from the beginning" not in message, message
            assert "snapshot" in message, message
        with pytest.raises(CursorForeign) as foreign_info:
            j.watch_sessions(cursor=foreign)
        assert "from the beginning" not in foreign_info.value.message
        assert "snapshot" in foreign_info.value.message
