"""A session cursor carries a mark of its whole event (token version 3: a CRC-32 of the
event's timestamp, position, type, request id and data), so an event that replaced it at
its ordinal is told apart even when it was stamped in the same millisecond and written at
the same position; cursors of earlier releases (version 2: the low 32 bits of the
timestamp) still resume, checked as they were (SPEC 5)."""

from __future__ import annotations

import base64
import struct
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest
from _cli_runs import json_error, run_cli
from test_commit_undo_faults import _cut, _done, _owed_cut_writer

from cursors import KeyRing, TokenCodec, TokenKind
from journal import CursorForeign, EventIn, Journal, session_cursors


def _reissued(path: Path, cursor: str, scope: bytes, check: int, *, marked: bool) -> str:
    """`cursor` signed again by the store's key with another check (what an earlier
    release issued, or a forgery by someone holding the key)."""
    codec = TokenCodec(KeyRing.load(path / "keys"))
    claims = codec.decode(cursor, TokenKind.SESSION, scope)
    return codec.encode(
        TokenKind.SESSION, scope, claims.position, claims.ordinal, check, marked=marked
    )


def _scope_of(cursor: str) -> bytes:
    # The token's bytes 4..12 are its scope (SPEC 5); the codec checks it against itself.
    return base64.urlsafe_b64decode(cursor + "=")[4:12]


def test_the_cut_event_s_cursor_is_foreign_where_its_replacement_has_its_millisecond(
    tmp_path: Path,
) -> None:
    """The writer's clock stands still: the event that replaces the cut one at ordinal 2
    ("after") has its timestamp and its position. The cut event's cursor carried the
    timestamp's low 32 bits only, passed the check, and the replay from it went on
    after ordinal 2: it delivered "later" and never "after", in the journal that read
    the event and in a fresh process alike."""
    path = tmp_path / "s"
    writer = _owed_cut_writer(path, clock_still=True)
    try:
        with Journal.open(path, readonly=True) as reader:
            read = list(reader.replay("a"))
            assert [e.data for e in read] == [b"before", b"refused?"]
            _cut(writer, "append")
            with pytest.raises(CursorForeign):
                list(reader.replay("a", read[1].cursor))
        with Journal.open(path, readonly=True) as fresh:
            now = list(fresh.replay("a"))
            assert [e.data for e in now] == [b"before", b"after", b"later"]
            assert (now[1].timestamp_ms, now[1].position) == (
                read[1].timestamp_ms,
                read[1].position,
            )
            assert now[1].cursor != read[1].cursor
            with pytest.raises(CursorForeign):
                list(fresh.replay("a", read[1].cursor))
            assert [e.data for e in fresh.replay("a", read[0].cursor)] == [b"after", b"later"]
        done = run_cli(path, "--format", "json", "read", "-s", "a", "--cursor", read[1].cursor)
        assert done.returncode != 0, done.stdout
        assert json_error(done)["code"] == "CURSOR_FOREIGN", done.stdout
        _done(writer)
    finally:
        writer.kill()
        writer.wait()


def test_an_append_s_cursor_is_its_last_event_s_and_a_keyed_retry_returns_it(
    tmp_path: Path,
) -> None:
    with Journal.open(tmp_path / "s", create=True) as journal:
        events = [EventIn("m", b"one"), EventIn("tool", b"two", request_id="r-1")]
        first = journal.append("a", events, idempotency_key="k", create=True)
        retried = journal.append("a", events, idempotency_key="k")
        assert retried.deduplicated
        read = list(journal.replay("a"))
        assert first.cursor == retried.cursor == read[-1].cursor
        with journal.own("a") as owner, owner.turn("t-1") as turn:
            written = turn.append([EventIn("m", b"three")])
        read = list(journal.replay("a"))
        assert [e.type for e in read[2:]] == ["turn_started", "m", "turn_result"]
        assert written.cursor == read[3].cursor
        # Every event's cursor resumes right after it.
        for at, event in enumerate(read):
            assert list(journal.replay("a", event.cursor)) == read[at + 1 :]


def test_cursors_of_an_earlier_release_resume_checked_by_the_timestamp(tmp_path: Path) -> None:
    """A version 2 cursor (what releases before marks issued) resumes when its check is
    the event's timestamp's low 32 bits and is foreign otherwise; a version 3 cursor
    whose mark is not the event's is foreign."""
    path = tmp_path / "s"
    with Journal.open(path, create=True) as journal:
        journal.append("a", [EventIn("m", b"one"), EventIn("m", b"two")], create=True)
        first = next(iter(journal.replay("a")))
        scope = _scope_of(first.cursor)
        earlier = _reissued(
            path, first.cursor, scope, first.timestamp_ms & 0xFFFFFFFF, marked=False
        )
        assert earlier != first.cursor
        assert [e.data for e in journal.replay("a", earlier)] == [b"two"]
        other_time = _reissued(
            path, first.cursor, scope, (first.timestamp_ms + 1) & 0xFFFFFFFF, marked=False
        )
        with pytest.raises(CursorForeign):
            list(journal.replay("a", other_time))
        # The timestamp's bits as a mark: not the event's mark.
        as_mark = _reissued(path, first.cursor, scope, first.timestamp_ms & 0xFFFFFFFF, marked=True)
        with pytest.raises(CursorForeign):
            list(journal.replay("a", as_mark))


def test_a_replay_marks_no_event_whose_cursor_is_not_asked_and_a_watch_one_per_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mark is a CRC-32 of the event's data: a replay that signed its every page's last
    event (for an unsettled turn's check that only a live follower makes) took twice as
    long over events of 4 MB (52 ms -> 103 ms for 40 of them). A replay signs nothing
    not asked for; a live follower signs its last event once, when it has delivered
    everything and waits, not once a page."""
    marked: list[int] = []
    mark = session_cursors.cursor_mark

    def counted(*args: Any) -> int:
        marked.append(args[1])
        return mark(*args)

    monkeypatch.setattr(session_cursors, "cursor_mark", counted)
    with Journal.open(tmp_path / "s", create=True) as journal:
        journal.create_session("a")
        for _ in range(6):
            journal.append("a", [EventIn("m", bytes(700_000))])
        marked.clear()
        assert len(list(journal.replay("a"))) == 6
        assert len(journal.read("a", max_bytes=1).events) == 1
        assert len(marked) == 1, marked  # (the page's next_cursor)
        marked.clear()
        with journal.own("a") as owner, owner.turn("t-1") as turn:
            turn.append([EventIn("m", b"x")])
        journal.resolve_session("a")
        marked.clear()
        stop = threading.Event()
        seen = [e.ordinal for e in journal.watch("a", stop=stop)]
        assert seen == list(range(1, 10)), seen
        assert len(marked) <= 1, marked


@pytest.mark.parametrize("request_id", [None, "", "r-1", "é"])
@pytest.mark.parametrize("size", [0, 580, 1 << 20])
def test_a_mark_is_the_documented_crc_of_the_event(request_id: str | None, size: int) -> None:
    """SPEC 5: zlib's CRC-32 of timestamp (i64), position (u64), the UTF-8 lengths of the
    type (u32), data (u32) and request id (i32, -1 for none), big-endian, then the type,
    the request id and the data (the data's part from ISA-L where installed: the same)."""
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    rid = b"" if request_id is None else request_id.encode()
    expected = zlib.crc32(
        struct.pack(
            ">qQIIi",
            1_733_500_000_123,
            98_765,
            len(b"t\xc3\xa9"),
            size,
            -1 if request_id is None else len(rid),
        )
        + b"t\xc3\xa9"
        + rid
        + data
    )
    assert (
        session_cursors.cursor_mark(1_733_500_000_123, 98_765, "té", request_id, data) == expected
    )
