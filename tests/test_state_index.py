"""The state index (SPEC 7.2, 7.7): a listing filtered by state is the unfiltered listing
filtered, in the same order and with the same page tokens, after every kind of change
(transitions, expiry, eviction, compaction, imports, a rebuilt view); it reads only the
rows it returns; a damaged or stale index entry is view damage, never a wrong listing.
"""

from __future__ import annotations

import io
import logging
import shutil
import struct
import tempfile
import time
import zlib
from pathlib import Path

import lmdb
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from journal import (
    EventIn,
    IllegalTransition,
    Journal,
    JournalCorrupt,
    RetentionPolicy,
    SessionExists,
    SessionState,
)
from journal._local.view_file import VIEW_FORMAT

DAY_MS = 24 * 3600 * 1000
# Ids whose byte order is not their length order, a prefix of another, non-ASCII.
IDS = ("a", "aa", "ab", "b", "A", "0", "z-1", "\u00e9", "\u03a9", "b/\u00e9")
POLICY = RetentionPolicy(max_history_bytes=None, session_retention_ms=DAY_MS)
STATES = list(SessionState)


def now_ms() -> int:
    return int(time.time() * 1000)


def paged(j: Journal, state: SessionState | None, page_size: int) -> list[tuple[str, str]]:
    """Every page of the listing, followed by its tokens: (id, state) in page order."""
    found: list[tuple[str, str]] = []
    token: str | None = None
    for _ in range(len(IDS) * 2 + 2):
        page = j.list_sessions_page(page_size=page_size, page_token=token, state=state)
        assert len(page.sessions) <= page_size
        found += [(m.session_id, m.state.value) for m in page.sessions]
        token = page.next_page_token
        if not token:
            return found
    raise AssertionError("the listing did not end")


def check_listings(j: Journal, model: dict[str, SessionState]) -> None:
    everything = paged(j, None, 1000)
    assert everything == sorted(
        ((s, state.value) for s, state in model.items()), key=lambda x: x[0].encode()
    )
    for state in STATES:
        wanted = [item for item in everything if item[1] == state.value]
        for page_size in range(1, len(wanted) + 2):
            assert paged(j, state, page_size) == wanted, (state, page_size)
        assert [m.session_id for m in j.list_sessions(state=state, page_size=2)] == [
            s for s, _ in wanted
        ]
    # stats() counts from the index's keys: the same counts the model has.
    counts: dict[str, int] = {}
    for state in model.values():
        counts[state.value] = counts.get(state.value, 0) + 1
    assert j.stats().sessions == counts


class StateIndexModel(RuleBasedStateMachine):
    """The journal's listings against a dict of session states."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="journal-states-"))
        self.path = self.directory / "store"
        self.j = self.open()
        self.states: dict[str, SessionState] = {}
        self.ttl: dict[str, bool] = {}

    def open(self) -> Journal:
        return Journal.open(self.path, durability="os", segment_bytes=4096, retention=POLICY)

    def teardown(self) -> None:
        try:
            self.j.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def existing(self) -> st.SearchStrategy[str]:
        return st.sampled_from(sorted(self.states)) if self.states else st.nothing()

    @rule(session_id=st.sampled_from(IDS), ttl=st.booleans(), events=st.integers(0, 3))
    def create(self, session_id: str, ttl: bool, events: int) -> None:
        if session_id in self.states:
            with pytest.raises(SessionExists):
                self.j.create_session(session_id)
            return
        self.j.create_session(session_id, ttl_ms=10 * DAY_MS if ttl else None)
        for n in range(events):
            self.j.append(session_id, [EventIn("m", bytes(700) + str(n).encode())])
        self.states[session_id] = SessionState.OPEN
        self.ttl[session_id] = ttl

    @precondition(lambda self: bool(self.states))
    @rule(data=st.data(), op=st.sampled_from(["suspend", "resume", "resolve", "cancel"]))
    def change_state(self, data: st.DataObject, op: str) -> None:
        session_id = data.draw(self.existing(), label="session")
        state = self.states[session_id]
        method = getattr(self.j, f"{op}_session")
        after = {
            ("suspend", SessionState.OPEN): SessionState.SUSPENDED,
            ("resume", SessionState.SUSPENDED): SessionState.OPEN,
        }.get((op, state))
        if op in ("resolve", "cancel") and not state.terminal:
            after = SessionState.RESOLVED if op == "resolve" else SessionState.CANCELLED
        if op == "cancel" and state.terminal:
            after = state
        if after is None:
            with pytest.raises(IllegalTransition):
                method(session_id)
            return
        assert method(session_id).state is after
        self.states[session_id] = after

    @rule()
    def expire(self) -> None:
        # Past every TTL and every suspension cap (7 days by default).
        expired = self.j.expire_due(now_ms=now_ms() + 11 * DAY_MS)
        due = sorted(
            s
            for s, state in self.states.items()
            if state is SessionState.SUSPENDED or (not state.terminal and self.ttl[s])
        )
        assert sorted(m.session_id for m in expired) == due
        for session_id in due:
            self.states[session_id] = SessionState.EXPIRED

    @rule()
    def evict_ended(self) -> None:
        report = self.j.apply_retention(now_ms=now_ms() + 2 * DAY_MS)
        ended = sorted(s for s, state in self.states.items() if state.terminal)
        assert sorted(report.evicted_sessions) == ended
        for session_id in ended:
            del self.states[session_id]

    @rule(dead_share=st.sampled_from([0.0, 1.0]))
    def compact(self, dead_share: float) -> None:
        self.j.compact(dead_share=dead_share)

    @precondition(lambda self: bool(self.states) and len(self.states) < len(IDS))
    @rule(data=st.data())
    def import_a_copy(self, data: st.DataObject) -> None:
        source = data.draw(self.existing(), label="source")
        target = data.draw(st.sampled_from([s for s in IDS if s not in self.states]), "target")
        archive = io.BytesIO()
        self.j.export_sessions([source], archive)
        archive.seek(0)
        [imported] = self.j.import_sessions(archive, rename={source: target}).sessions
        assert imported.session_id == target
        self.states[target] = self.states[source]
        self.ttl[target] = self.ttl[source]

    @rule()
    def reopen(self) -> None:
        self.j.close()
        self.j = self.open()

    @rule()
    def rebuild_the_view(self) -> None:
        self.j.close()
        shutil.rmtree(self.path / "index")
        self.j = self.open()

    @rule()
    def verify(self) -> None:
        report = self.j.verify()
        assert report.ok, report.problems

    @invariant()
    def listings_match_the_model(self) -> None:
        check_listings(self.j, self.states)


StateIndexModel.TestCase.settings = settings(max_examples=40, stateful_step_count=30)
TestStateIndexModel = StateIndexModel.TestCase


# -- helpers that reach the view's file directly (as tests/test_damaged_view.py does) -------


def _seal(key: bytes, payload: bytes) -> bytes:
    return payload + struct.pack(">I", zlib.crc32(payload, zlib.crc32(key)))


def _states_key(state: SessionState, session_id: str) -> bytes:
    return bytes([state.wire]) + session_id.encode()


def _incarnation(store: Path, session_id: str) -> int:
    with Journal.open(store, readonly=True) as j:
        return j.get_session(session_id).incarnation


class _Env:
    def __init__(self, store: Path) -> None:
        self.env = lmdb.open(str(store / "index"), max_dbs=16, map_size=1 << 36)

    def __enter__(self) -> tuple[lmdb.Environment, lmdb.Transaction]:
        self.txn = self.env.begin(write=True)
        return self.env, self.txn

    def __exit__(self, *exc: object) -> None:
        self.txn.commit()
        self.env.close()


def _three(store: Path) -> None:
    with Journal.open(store) as j:
        for session_id in ("a", "b", "c"):
            j.create_session(session_id)
            j.append(session_id, [EventIn("m", session_id.encode())])
        j.suspend_session("b")


def test_a_filtered_listing_reads_only_the_rows_it_returns(tmp_path: Path) -> None:
    """Every row but the one suspended session's is made undecodable (its checksum kept,
    so the check at open passes): a listing that scanned the rows and filtered them
    (before the state index) met one and raised JournalCorrupt; the filtered listing
    reads only its own row, and the unfiltered one still reads (and reports) them all."""
    store = tmp_path / "s"
    with Journal.open(store, durability="os") as j:
        for n in range(300):
            j.create_session(f"s{n:03d}")
        j.suspend_session("s150")
    with _Env(store) as (env, txn):
        sessions = env.open_db(b"sessions", txn=txn)
        for key in [bytes(k) for k, _ in txn.cursor(db=sessions)]:
            if key != b"s150":
                txn.put(key, _seal(key, b"\xc1"), db=sessions)
    with Journal.open(store, readonly=True) as j:
        page = j.list_sessions_page(state=SessionState.SUSPENDED)
        assert [(m.session_id, m.state) for m in page.sessions] == [
            ("s150", SessionState.SUSPENDED)
        ]
        assert page.next_page_token == ""
        assert j.list_sessions_page(state=SessionState.RESOLVED).sessions == []
        with pytest.raises(JournalCorrupt):
            j.list_sessions_page(page_size=1000)


def test_the_index_lists_in_id_order_and_resumes_from_page_tokens(tmp_path: Path) -> None:
    """Byte order of the ids (as the unfiltered listing), across a page boundary at a
    session that changed state after its page was listed."""
    store = tmp_path / "s"
    with Journal.open(store) as j:
        for session_id in ("b", "\u00e9", "a", "ab", "B", "aa"):
            j.create_session(session_id)
        first = j.list_sessions_page(page_size=2, state=SessionState.OPEN)
        assert [m.session_id for m in first.sessions] == ["B", "a"]
        j.suspend_session("a")  # the page's last session leaves the state
        rest = j.list_sessions_page(page_token=first.next_page_token, state=SessionState.OPEN)
        assert [m.session_id for m in rest.sessions] == ["aa", "ab", "b", "\u00e9"]


def test_a_stale_state_index_entry_is_journal_corrupt_and_verify_repairs_it(
    tmp_path: Path,
) -> None:
    """An entry with a valid checksum that says `a` is suspended while its row says open:
    the listing must not return `a` as suspended (nor skip it silently)."""
    store = tmp_path / "s"
    _three(store)
    key = _states_key(SessionState.SUSPENDED, "a")
    incarnation = _incarnation(store, "a")
    with _Env(store) as (env, txn):
        txn.put(key, _seal(key, struct.pack(">Q", incarnation)), db=env.open_db(b"states", txn=txn))
    with Journal.open(store) as j:
        with pytest.raises(JournalCorrupt) as caught:
            j.list_sessions_page(state=SessionState.SUSPENDED)
        assert caught.value.segment == "index"
        assert "states entry" in caught.value.detail
        report = j.verify()
        assert [p.what for p in report.problems if "state index" in p.what], report
        assert j.verify(fix=True).fixed
        assert [m.session_id for m in j.list_sessions(state=SessionState.SUSPENDED)] == ["b"]
        assert j.verify().ok


def test_a_state_index_entry_of_another_incarnation_is_journal_corrupt(tmp_path: Path) -> None:
    store = tmp_path / "s"
    _three(store)
    key = _states_key(SessionState.SUSPENDED, "b")
    with _Env(store) as (env, txn):
        txn.put(key, _seal(key, struct.pack(">Q", 99)), db=env.open_db(b"states", txn=txn))
    with Journal.open(store, readonly=True) as j, pytest.raises(JournalCorrupt) as caught:
        j.list_sessions_page(state=SessionState.SUSPENDED)
    assert caught.value.segment == "index"


def test_a_missing_state_index_entry_is_reported_by_verify_and_repaired(tmp_path: Path) -> None:
    """A deleted entry (no checksum can see an entry that is not there): verify compares
    the index with one rebuilt from the log."""
    store = tmp_path / "s"
    _three(store)
    with _Env(store) as (env, txn):
        assert txn.delete(_states_key(SessionState.OPEN, "c"), db=env.open_db(b"states", txn=txn))
    with Journal.open(store) as j:
        report = j.verify()
        assert not report.ok
        assert any(
            "state index differs" in p.what and "1 missing" in p.what for p in report.problems
        )
        assert j.verify(fix=True).fixed
        assert [m.session_id for m in j.list_sessions(state=SessionState.OPEN)] == ["a", "c"]
        assert j.verify().ok


@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "readonly"])
def test_a_flipped_bit_in_a_state_index_entry_is_seen_at_open(
    tmp_path: Path, readonly: bool
) -> None:
    """The check at open checks the CRC of every states entry: a writer rebuilds the view,
    a reader lists from a private one; both list correctly."""
    store = tmp_path / "s"
    _three(store)
    key = _states_key(SessionState.SUSPENDED, "b")
    with _Env(store) as (env, txn):
        db = env.open_db(b"states", txn=txn)
        value = bytearray(txn.get(key, db=db))
        value[3] ^= 0x10
        txn.put(key, bytes(value), db=db)
    with Journal.open(store, readonly=readonly) as j:
        assert [m.session_id for m in j.list_sessions(state=SessionState.SUSPENDED)] == ["b"]
        assert [m.session_id for m in j.list_sessions(state=SessionState.OPEN)] == ["a", "c"]
        if readonly:
            assert any("states entry" in p.what for p in j.verify().problems)
        else:
            assert j.verify().ok


def test_a_view_of_format_2_is_rebuilt_once_with_its_state_index(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A view written by code before the state index (format 2, no `states` database): a
    reader lists from a private view, the first writer rebuilds it (once), and filtered
    listings then come from the index."""
    store = tmp_path / "s"
    _three(store)
    with _Env(store) as (env, txn):
        txn.drop(env.open_db(b"states", txn=txn), delete=True)
        txn.put(b"format", _seal(b"format", b"2"), db=env.open_db(b"meta", txn=txn))
    with Journal.open(store, readonly=True) as j:
        assert [m.session_id for m in j.list_sessions(state=SessionState.SUSPENDED)] == ["b"]
    with caplog.at_level(logging.WARNING, logger="journal"):
        with Journal.open(store) as j:
            assert [m.session_id for m in j.list_sessions(state=SessionState.OPEN)] == ["a", "c"]
            assert j.verify().ok
        assert any("view format" in r.getMessage() for r in caplog.records)
        caplog.clear()
        with Journal.open(store) as j:
            assert [m.session_id for m in j.list_sessions(state=SessionState.SUSPENDED)] == ["b"]
        assert not [r for r in caplog.records if "view" in r.getMessage()]
    with _Env(store) as (env, txn):
        assert (
            txn.get(b"format", db=env.open_db(b"meta", txn=txn))[:-4] == str(VIEW_FORMAT).encode()
        )
        states = env.open_db(b"states", txn=txn)
        keys = [bytes(k) for k, _ in txn.cursor(db=states)]
    assert keys == [
        _states_key(SessionState.OPEN, "a"),
        _states_key(SessionState.OPEN, "c"),
        _states_key(SessionState.SUSPENDED, "b"),
    ]


def test_an_import_of_an_ended_session_is_listed_in_its_state(tmp_path: Path) -> None:
    """An import is staged (no entry) and then renamed and moved to its state in one
    frame: the index must end with exactly the imported state."""
    store = tmp_path / "s"
    with Journal.open(store) as j:
        j.create_session("src")
        j.resolve_session("src")
        archive = io.BytesIO()
        j.export_sessions(["src"], archive)
        archive.seek(0)
        j.import_sessions(archive, rename={"src": "copy"})
        assert [m.session_id for m in j.list_sessions(state=SessionState.RESOLVED)] == [
            "copy",
            "src",
        ]
        assert list(j.list_sessions(state=SessionState.OPEN)) == []
        assert j.verify().ok
