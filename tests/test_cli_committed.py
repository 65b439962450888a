"""A command that committed something and then failed at a later step prints what it
committed before the error, and the error says that it committed (SPEC.md sections 11
and 13): `sessions own` whose release fails after the takeover, `sessions expire` whose
listing fails after the expiry. The later step fails at the local engine's fault points
(SPEC 1.3), through the `FileOps` the command is given in-process."""

from __future__ import annotations

import errno
import json
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _cli_runs import ROOT, cli_env, run_cli
from click.testing import CliRunner, Result

from cli.main import main
from journal import Journal, JournalClosed, StoreUnavailable
from journal._local.files import FAULT_POINTS, FileOps
from journal.engine import Expire, ReleaseLease

# A worker: owns the session, starts a turn, says so, then waits to be killed.
_WORKER = """
import sys, time
from journal import Journal
with Journal.open(sys.argv[1], durability="os") as j:
    owner = j.own(sys.argv[2])
    turn = owner.turn("r1")
    turn.__enter__()
    print("in turn", flush=True)
    time.sleep(60)
"""


class _Faults(FileOps):
    """The release's commit fails as LMDB's commit does on a full disk (`fail_release`);
    the listing of sessions fails once an expiry was planned (`fail_listing`). The store's
    expiry timer is kept out of the way (its thread ends as when the journal closes), so
    the command's own pass is the one that expires."""

    def __init__(self, fail_release: bool = False, fail_listing: bool = False) -> None:
        self.fail_release = fail_release
        self.fail_listing = fail_listing
        self.releasing = False
        self.expired = False

    def point(self, name: str, detail: object = None) -> None:
        assert name in FAULT_POINTS, name
        if name == "commit.queued" and threading.current_thread().name == "journal-expiry":
            raise JournalClosed("the test keeps the expiry timer out of the way")
        if name == "plan.operation":
            self.releasing = self.releasing or isinstance(detail, ReleaseLease)
            self.expired = self.expired or isinstance(detail, Expire)
        if name == "commit.view_commit" and self.fail_release and self.releasing:
            self.fail_release = False
            raise OSError(errno.ENOSPC, "No space left on device")
        if name == "sessions.list" and self.fail_listing and self.expired:
            raise StoreUnavailable("the view cannot be read: [Errno 5] Input/output error")


def _run(store: Path, ops: FileOps, *args: str, fmt: str) -> Result:
    result = CliRunner().invoke(
        main, ["--store", str(store), "--format", fmt, *args], obj={"file_ops": ops}
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def _dead_owners_turn(store: Path, session_id: str) -> None:
    """`session_id` holds turn r1 of an owner killed mid-turn."""
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(store), session_id],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline() == "in turn\n"
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_sessions_own_prints_the_turn_it_recorded_when_the_release_fails(
    tmp_path: Path, fmt: str
) -> None:
    """Until 2026-12-06 a release that failed after the takeover ended the command with
    exit 9 and the error alone: the turn it had recorded as failed was never printed
    (a review)."""
    store = tmp_path / "store"
    odd = "w $x"  # (an id a shell splits and expands)
    with Journal.open(store, create=True) as j:
        j.create_session(odd)
    _dead_owners_turn(store, odd)

    done = _run(store, _Faults(fail_release=True), "sessions", "own", odd, fmt=fmt)
    assert done.exit_code == 9, (done.stdout, done.stderr)  # (the release's own failure)
    (said,) = done.stderr.splitlines()
    assert said.startswith(
        "journal: error: the takeover committed (turn r1 was recorded as failed, "
        "WATCH_OUTCOME_UNKNOWN), but recording the release of the lease then failed: "
    ), said
    assert "No space left on device" in said, said
    assert said.endswith(
        ". The lease is let go as the command ends; once the store is mended, `journal "
        f"--store {shlex.quote(str(store))} sessions own 'w $x'` records a release (the "
        "turn is not recorded again)"
    ), said
    if fmt == "json":
        taken, failed = (json.loads(line) for line in done.stdout.splitlines())
        assert taken == {
            "session_id": odd,
            "generation": 2,
            "recovered_turn": "r1",
            "released": False,
        }
        error: dict[str, Any] = failed["error"]
        assert (error["code"], error["status"]) == ("STORE_UNAVAILABLE", "UNAVAILABLE")
        assert (error["failed_step"], error["committed"]) == ("release", True)
        assert error["message"] == said.removeprefix("journal: error: ")
    else:
        assert done.stdout == (
            'took over "w $x" (lease 2): turn r1 recorded as failed (WATCH_OUTCOME_UNKNOWN: '
            "its owner ended without settling it; it may have run); its release failed "
            "(below)\n"
        )

    # The turn stays recorded once; the command run again (the store mended) finds it
    # settled and records its release.
    again = run_cli(store, "--format", "json", "sessions", "own", odd)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {
        "session_id": odd,
        "generation": 3,
        "recovered_turn": None,
        "released": True,
    }
    with Journal.open(store, readonly=True) as j:
        results = [event for event in j.replay(odd) if event.type == "turn_result"]
        assert j.get_session(odd).owner is None
    assert len(results) == 1
    assert json.loads(results[0].data)["error"]["code"] == "WATCH_OUTCOME_UNKNOWN"


def _due_sessions(store: Path, *session_ids: str) -> None:
    """Sessions past their deadline, expired by no writer yet."""
    with Journal.open(store, create=True) as j:
        for session_id in session_ids:
            created = j.create_session(session_id, ttl_ms=500)
    assert created.expires_at_ms is not None
    time.sleep(max(0.0, created.expires_at_ms / 1000 - time.time()) + 0.05)


@pytest.mark.parametrize("fmt", ["json", "text", "quiet"])
def test_sessions_expire_prints_what_it_expired_when_the_listing_fails(
    tmp_path: Path, fmt: str
) -> None:
    """Until 2026-12-06 a listing that failed after the expiry committed ended the
    command with exit 9 and the error alone: the sessions it had expired were never
    printed (a review)."""
    store = tmp_path / "store"
    _due_sessions(store, "a", "b")
    done = _run(store, _Faults(fail_listing=True), "sessions", "expire", fmt=fmt)
    assert done.exit_code == 9, (done.stdout, done.stderr)
    (said,) = done.stderr.splitlines()
    shown = "" if fmt == "quiet" else ", printed above"
    assert said == (
        f"journal: error: the expiry committed (it expired 2 sessions{shown}), but listing "
        "the expired sessions then failed: the view cannot be read: [Errno 5] "
        "Input/output error. Sessions the store's timer expired as the command opened the "
        f"store are not printed; once the store is mended, `journal --store {store} sessions "
        f"list --state expired` lists every expired session (`journal --store {store} "
        "sessions expire` again lists only what it expires then)"
    ), said
    lines = done.stdout.splitlines()
    if fmt == "json":
        *expired, failed = (json.loads(line) for line in lines)
        assert [(r["session_id"], r["state"]) for r in expired] == [
            ("a", "expired"),
            ("b", "expired"),
        ]
        error = failed["error"]
        assert (error["code"], error["failed_step"], error["committed"]) == (
            "STORE_UNAVAILABLE",
            "listing",
            True,
        )
    elif fmt == "text":
        assert lines == ["a expired", "b expired"]
    else:
        assert lines == []
    with Journal.open(store, readonly=True) as j:
        assert {meta.session_id for meta in j.list_sessions(state=None)} == {"a", "b"}
        assert all(meta.state.value == "expired" for meta in j.list_sessions())


def test_sessions_expire_without_a_failure_prints_what_it_expired(tmp_path: Path) -> None:
    """The same run without the fault: the sessions in id order, exit 0."""
    store = tmp_path / "store"
    _due_sessions(store, "b", "a")
    done = _run(store, _Faults(), "sessions", "expire", fmt="text")
    assert done.exit_code == 0, done.stderr
    assert done.stdout.splitlines() == ["a expired", "b expired"]
    again = _run(store, _Faults(), "sessions", "expire", fmt="text")
    assert again.stdout.splitlines() == ["no session is past its deadline now"]
