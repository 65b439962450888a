"""Lifecycle startup snapshots shared by the follows that start while one still delivers
it (SPEC 7.7, "What a startup snapshot holds")."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from journal import Journal, JournalCorrupt, LifecycleEvent
from journal.lifecycle import SNAPSHOT_PAGE

# -- a damaged row in a shared copy ----------------------------------------------------------

_DAMAGE = """
import lmdb, sys
env = lmdb.open(sys.argv[1], max_dbs=16, map_size=1 << 36)
with env.begin(write=True) as txn:
    db = env.open_db(b"sessions", txn=txn)
    raw = bytearray(txn.get(sys.argv[2].encode(), db=db))
    raw[-1] ^= 0xFF  # (its checksum fails)
    txn.put(sys.argv[2].encode(), bytes(raw), db=db)
env.close()
"""


def test_a_snapshot_copy_found_damaged_is_not_shared_after_the_view_is_repaired(
    tmp_path: Path,
) -> None:
    """A row damaged under an open journal, copied by two follows that stall before its
    page; verify(fix=True) repairs the view. Until the fix, every follow started or resumed
    after the repair (resuming inside a snapshot asks for a fresh one) took the damaged
    copy the stalled follows held and raised JournalCorrupt at that row's page, for as
    long as they held it: 3 of 3 here. Now the follow that meets the damage marks the
    copy, and the next ones copy the repaired rows."""
    store = tmp_path / "s"
    ids = [f"s{i:03d}" for i in range(SNAPSHOT_PAGE + 30)]
    damaged = ids[SNAPSHOT_PAGE + 10]  # (on the second page)
    with Journal.open(store, durability="os") as j:
        for session in ids:
            j.create_session(session)
        subprocess.run([sys.executable, "-c", _DAMAGE, str(store / "index"), damaged], check=True)
        stop = threading.Event()
        stalled = [j.watch_sessions(stop=stop) for _ in range(2)]
        for feed in stalled:
            assert next(feed).session.session_id == ids[0]  # (each holds the copy now)
        with pytest.raises(JournalCorrupt):
            j.get_session(damaged)
        report = j.verify(fix=True)
        assert report.problems and report.fixed
        assert j.get_session(damaged).session_id == damaged
        assert j.verify().ok

        # A follow started now shares the damaged copy: it meets the damage once...
        with j.watch_sessions(stop=stop) as first:
            got: list[LifecycleEvent] = []
            with pytest.raises(JournalCorrupt):
                for _ in ids:
                    got.append(next(first))
        assert len(got) == SNAPSHOT_PAGE
        # ...and resuming from its last cursor (a fresh snapshot) gives every session.
        for cursor in (got[-1].cursor, None):
            with j.watch_sessions(cursor, stop=stop) as again:
                assert [next(again).session.session_id for _ in ids] == ids
        stop.set()
        for feed in stalled:
            feed.close()
