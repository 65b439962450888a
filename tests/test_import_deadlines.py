"""An imported session whose deadline has already passed expires at once (SPEC.md section
12.3): before `import_sessions` returns, so also when the importer closes right after, as
`journal import` does. Until 2026-12-05 only the importer's expiry timer did it, which
`journal import` closed before it ran: the session stayed open past its deadline (listed
as open by a supervisor, no `expired` on the lifecycle feed) until another writer's next
commit or its 30 s re-read of the deadlines (found by a supervisor-author trial)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from _cli_runs import run_cli

from journal import Journal, LifecycleEventType, SessionState

_TTL_MS = 2_500  # (the source writer closes well before its timer would expire them)


def _archive_of_sessions_with_deadlines(tmp_path: Path) -> Path:
    """An archive of an open session with a TTL and a suspended one with a suspension
    cap, exported before either deadline, returned once both have passed."""
    source = tmp_path / "source"
    with Journal.open(source) as j:
        j.create_session("ttl", ttl_ms=_TTL_MS)
        j.create_session("paused", max_suspend_ms=_TTL_MS)
        j.suspend_session("paused")
        j.create_session("plain")
    archive = tmp_path / "sessions.archive"
    exported = run_cli(source, "export", "--all", "-o", str(archive))  # (reads: no expiry)
    assert exported.returncode == 0, exported.stderr
    with Journal.open(source, readonly=True) as j:
        due = [m.expires_at_ms for m in j.list_sessions() if m.expires_at_ms is not None]
        states = {m.session_id: m.state for m in j.list_sessions()}
    assert states["ttl"] is SessionState.OPEN and states["paused"] is SessionState.SUSPENDED
    time.sleep(max(0.0, (max(due) - time.time() * 1000) / 1000) + 0.05)
    return archive


def test_journal_import_expires_the_sessions_past_their_deadline_before_it_exits(
    tmp_path: Path,
) -> None:
    archive = _archive_of_sessions_with_deadlines(tmp_path)
    target = tmp_path / "target"
    assert run_cli(target, "init").returncode == 0
    imported = run_cli(target, "import", str(archive))
    assert imported.returncode == 0, imported.stderr
    with Journal.open(target, readonly=True) as j:  # (no writer is open: none expires)
        states = {m.session_id: m.state for m in j.list_sessions()}
        expired = [m.session_id for m in j.list_sessions(state=SessionState.EXPIRED)]
    assert states == {
        "paused": SessionState.EXPIRED,
        "plain": SessionState.OPEN,
        "ttl": SessionState.EXPIRED,
    }
    assert expired == ["paused", "ttl"]


def test_import_sessions_expires_them_before_it_returns(tmp_path: Path) -> None:
    """(Not left to the timer: the process may close or exit right after the import.)"""
    archive = _archive_of_sessions_with_deadlines(tmp_path)
    with Journal.open(tmp_path / "target") as j:
        j.create_session("first")
        before = next(iter(j.watch_sessions(stop=threading.Event())))  # (the snapshot's)
        j.import_sessions(str(archive))
        states = {m.session_id: m.state for m in j.list_sessions()}
        stop = threading.Event()
        threading.Timer(0.5, stop.set).start()
        changes = [
            (c.event_type, c.session.session_id)
            for c in j.watch_sessions(cursor=before.cursor, stop=stop)
        ]
    assert states == {
        "first": SessionState.OPEN,
        "paused": SessionState.EXPIRED,
        "plain": SessionState.OPEN,
        "ttl": SessionState.EXPIRED,
    }
    assert changes[:4] == [
        (LifecycleEventType.CREATED, "paused"),
        (LifecycleEventType.SUSPENDED, "paused"),
        (LifecycleEventType.CREATED, "plain"),
        (LifecycleEventType.CREATED, "ttl"),
    ]
    assert sorted(changes[4:], key=str) == [
        (LifecycleEventType.EXPIRED, "paused"),
        (LifecycleEventType.EXPIRED, "ttl"),
    ]
