"""`verify()` compares every derived table of the view with a view rebuilt from the log,
not only the rows, the events index, the state index and the head (SPEC 9): until
2026-12-04 a view left with 60 eviction tombstones and 61 pins where a rebuilt view had
12 and 13 (a review, a retention pass acknowledged after LMDB's commit failed) was
reported healthy. Each table is changed here behind the journal's back, through the
view's own methods in a transaction of their own; `verify()` names it and
`verify(fix=True)` rebuilds it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest
from _dead_files import KeepDeadFiles, evict_keeping_dead_files
from _local_engine import open_local

from journal import EventIn, Journal, RetentionPolicy
from journal._local.engine import LocalEngine
from journal._local.view import View
from journal.sessions import FeedEntry

# Positions and incarnations no record of these stores has.
_NOWHERE = 1 << 40
_POLICY = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)


def _tombstone(view: View, txn: lmdb.Transaction, kept: int) -> None:
    view.put_tombstone(txn, _NOWHERE, _NOWHERE)  # (what a forgotten one leaves)


def _pin(view: View, txn: lmdb.Transaction, kept: int) -> None:
    view.pin(txn, _NOWHERE, kept)


def _unpin(view: View, txn: lmdb.Transaction, kept: int) -> None:
    view.unpin(txn, kept)  # (its creation record's pin)


def _incarnation(view: View, txn: lmdb.Transaction, kept: int) -> None:
    view.put_incarnation(txn, _NOWHERE, "ghost")


def _idem(view: View, txn: lmdb.Transaction, kept: int) -> None:
    assert view.idem_entry(txn, kept, "once") is not None
    view.delete_idem(txn, kept, "once")


def _deadline(view: View, txn: lmdb.Transaction, kept: int) -> None:
    due = view.next_deadline(txn)
    assert due is not None
    view.delete_deadline(txn, due, kept)


def _aged(view: View, txn: lmdb.Transaction, kept: int) -> None:
    view.retention.drop_aged(txn, kept)


def _feed(view: View, txn: lmdb.Transaction, kept: int) -> None:
    entry = view.feed_entry(txn, kept)  # (its CREATED entry: at its creation's position)
    assert entry is not None
    view.put_feed(txn, kept, FeedEntry(entry.event_type, entry.at_ms + 1, entry.row))


CHANGES: dict[str, tuple[Callable[[View, lmdb.Transaction, int], None], str]] = {
    "tombstone-left-behind": (_tombstone, "tombstones table differs"),
    "pin-left-behind": (_pin, "pins table differs"),
    "pin-lost": (_unpin, "pins table differs"),
    "incarnation-left-behind": (_incarnation, "incarnations table differs"),
    "idempotency-key-lost": (_idem, "idem table differs"),
    "deadline-lost": (_deadline, "deadlines table differs"),
    "age-window-lost": (_aged, "aged table differs"),
    "feed-entry-stale": (_feed, "lifecycle feed differs"),
}


def _open(store: Path, **options: object) -> tuple[Journal, LocalEngine]:
    return open_local(store, durability="os", retention=_POLICY, **options)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_verify_reports_a_derived_table_changed_behind_the_journals_back_and_fix_rebuilds_it(
    tmp_path: Path, change: str
) -> None:
    alter, what = CHANGES[change]
    j, engine = _open(tmp_path / "store")
    with j:
        j.create_session("kept", ttl_ms=10**9, max_history_age_ms=10**9)
        j.append("kept", [EventIn("m", b"k")], idempotency_key="once")
        j.create_session("gone")
        ended = j.resolve_session("gone").ended_at_ms
        assert ended is not None
        assert j.apply_retention(now_ms=ended + 10).evicted_sessions == ["gone"]
        assert j.verify().ok
        view = engine.view
        with view.begin(write=True) as txn:
            row = view.row(txn, "kept")
            assert row is not None
            # (`gone`'s creation record is still in the log: its tombstone stays.)
            assert len(view.tombstones_between(txn, 0, _NOWHERE)) == 1
            alter(view, txn, row.incarnation)
        report = j.verify()
        assert [p.segment for p in report.problems] == ["index"], report
        assert what in report.problems[0].what, report
        assert j.verify(fix=True).fixed
        assert j.verify().ok
        assert [m.session_id for m in j.list_sessions()] == ["kept"]


def test_the_message_counts_what_differs(tmp_path: Path) -> None:
    j, engine = _open(tmp_path / "store")
    with j:
        j.create_session("kept")
        view = engine.view
        with view.begin(write=True) as txn:
            for i in range(3):
                view.put_tombstone(txn, _NOWHERE + i, _NOWHERE + i)
        (problem,) = j.verify().problems
        assert problem.what == (
            "tombstones table differs from the log (3 entries, a rebuilt view has 0: "
            "0 missing, 3 extra or stale)"
        )


def test_verify_is_ok_while_a_pass_could_not_delete_the_dead_segments_files(
    tmp_path: Path,
) -> None:
    """A retention pass forgets the tombstones of the sessions created in the segments it
    found dead (with their ids and eviction pins) in its transaction, and deletes the
    files after its commit; when deleting fails (logged), the files stay until the next
    pass, and a rebuild still finds those creation records: not a difference."""

    ops = KeepDeadFiles()
    j, _ = _open(tmp_path / "store", segment_bytes=4096, file_ops=ops)
    with j:
        report, _ = evict_keeping_dead_files(j, ops)
        segments = tmp_path / "store" / "segments"
        assert all((segments / name).exists() for name in report.deleted_segments)
        assert j.verify().ok, j.verify().problems
