"""Imports into a nats:// store (SPEC 12.3, 16.5): staged sessions stay invisible until
one atomic batch commits them all, an id taken meanwhile rolls the import back, an
archive of more sessions than that batch holds is refused before anything is written,
and a killed importer leaves nothing visible (its staged messages are rolled back by the
next retention pass or the next import of its ids)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _nats import (
    CuttingProxy,
    DelayingProxy,
    HoldingProxy,
    NatsServer,
    shared_server,
    stream_messages,
    wait_for_jetstream,
)

from journal import (
    CursorForeign,
    EventIn,
    InvalidArgument,
    Journal,
    RetentionPolicy,
    SessionExists,
    SessionNotFound,
    SessionState,
    StoreUnavailable,
    WriteOutcomeUnknown,
)
from journal._jetstream.engine import JetStreamEngine, JetStreamOptions
from journal._jetstream.layout import ROW_DECODER
from journal.archive import ArchiveLimits, ArchiveReader
from journal.transfer import IMPORT_COMMITTED

ROOT = Path(__file__).resolve().parent.parent


def store_name(path: Path) -> str:
    return "t" + hashlib.sha256(str(path).encode()).hexdigest()[:24]


@pytest.fixture
def url() -> str:
    return shared_server().url


def _staged_messages(url: str, name: str, session_id: str) -> int:
    """The messages of a session's subjects and of every import's claims."""
    token = session_id.encode().hex()
    return stream_messages(url, name, f"s.{token}.>") + stream_messages(url, name, "in.>")


def _export(j: Journal) -> bytes:
    out = io.BytesIO()
    j.export_sessions(None, out)
    return out.getvalue()


def _one_session_archive(
    tmp_path: Path, session_id: str, count: int, size: int
) -> tuple[list[tuple[Any, ...]], bytes]:
    """The history and the archive of one session of a local store (under `tmp_path`)
    holding `count` events of `size` bytes, event i made of the byte i % 256."""
    with Journal.open(tmp_path / "local") as local:
        local.create_session(session_id)
        local.append(session_id, [EventIn("m", bytes([i % 256]) * size) for i in range(count)])
        return _history(local, session_id), _export(local)


def _sections(archive: bytes) -> list[Any]:
    """An archive's content after its header, as plain values."""
    reader = ArchiveReader(io.BytesIO(archive), ArchiveLimits())
    content: list[Any] = []
    for section in reader.sections():
        events = [msgspec.structs.asdict(e) for batch in section.batches for e in batch]
        content.append(
            (
                msgspec.structs.asdict(section.session),
                None if section.snapshot is None else msgspec.structs.asdict(section.snapshot),
                events,
                None if section.checkpoint is None else msgspec.structs.asdict(section.checkpoint),
            )
        )
    content.append(reader.counts)
    return content


def _history(j: Journal, session_id: str) -> list[tuple[Any, ...]]:
    return [(e.ordinal, e.type, e.timestamp_ms, e.request_id, e.data) for e in j.replay(session_id)]


def _meta(j: Journal, session_id: str) -> tuple[Any, ...]:
    m = j.get_session(session_id)
    return (
        m.state,
        m.mode,
        m.context_id,
        m.tags,
        m.created_at_ms,
        m.suspended_at_ms,
        m.ended_at_ms,
        m.first_ordinal,
        m.last_ordinal,
        m.ttl_ms,
        m.max_suspend_ms,
    )


def _source(path: Path) -> tuple[bytes, dict[str, Any]]:
    """A local store with sessions of every kind, its archive and what each held."""
    with Journal.open(path) as j:
        j.create_session("long", mode="chat", tags={"k": "v"}, max_history_bytes=None)
        for i in range(3):  # (1,200 events: more than one JetStream batch)
            j.append("long", [EventIn("message", f"{i}-{n}".encode()) for n in range(400)])
        j.compact_session("long", 100, b"snapshot-100")
        j.checkpoint_session("long", 1100, b"checkpoint-1100")
        j.create_session("paused")
        j.append("paused", [EventIn("message", b"p")])
        j.suspend_session("paused")
        j.create_session("done")
        with j.own("done") as owner, owner.turn("r1") as turn:
            turn.append([EventIn("message", b'{"step": 1}')])
        j.resolve_session("done")
        j.create_session("trimmed", max_history_bytes=10)
        for _ in range(5):
            j.append("trimmed", [EventIn("message", b"0123456789")])
        j.apply_retention()
        j.create_session("empty")
        held = {
            m.session_id: (_meta(j, m.session_id), _history(j, m.session_id))
            for m in j.list_sessions()
        }
        return _export(j), held


# -- round trips -------------------------------------------------------------------------


def test_a_local_export_imports_into_jetstream_and_back_unchanged(url: str, tmp_path: Path) -> None:
    archive, held = _source(tmp_path / "local")
    with Journal.open(tmp_path / "local") as local:
        local_cursor = next(iter(local.replay("long"))).cursor
    with Journal.open(url, store=store_name(tmp_path)) as j:
        report = j.import_sessions(io.BytesIO(archive))
        assert sorted(s.session_id for s in report.sessions) == sorted(held)
        for session_id, (meta, history) in held.items():
            assert (_meta(j, session_id), _history(j, session_id)) == (meta, history)
        assert j.get_session("paused").state is SessionState.SUSPENDED
        assert j.get_session("done").state is SessionState.RESOLVED
        snapshot, checkpoint = j.snapshot("long"), j.checkpoint("long")
        assert snapshot is not None and (snapshot.ordinal, snapshot.data) == (100, b"snapshot-100")
        assert checkpoint is not None and checkpoint.data == b"checkpoint-1100"
        assert checkpoint.ordinal == 1100
        # Cursors are the target's: one of the source is foreign, one of the target
        # resumes where it points.
        with pytest.raises(CursorForeign):
            j.read("long", cursor=local_cursor)
        page = j.read("long", max_bytes=1)
        assert [e.ordinal for e in page.events] == [101]
        assert [e.ordinal for e in j.read("long", cursor=page.events[0].cursor).events][:1] == [102]
        assert [e.ordinal for e in j.replay("long", checkpoint.cursor)][:1] == [1101]
        # Imported sessions take appends like any other.
        assert j.append("long", [EventIn("message", b"after")]).last_ordinal == 1201
        # The importer's heartbeat (written while it had sessions staged) is purged
        # once it has none; nothing of the staging is left but one claim a session.
        deadline = time.monotonic() + 5
        while stream_messages(url, store_name(tmp_path), "s.*.hb") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stream_messages(url, store_name(tmp_path), "s.*.hb") == 0
        assert stream_messages(url, store_name(tmp_path), "in.>") == len(held)
        assert j.verify().problems == []
        back = _export(j)
    expected = _sections(archive)
    got = _sections(back)
    long_index = [s[0]["session_id"] for s in expected[:-1]].index("long")
    assert got[long_index][2][-1]["data"] == b"after"
    del got[long_index][2][-1]
    got[long_index][0]["last_ordinal"] -= 1
    got[-1] = [(i, n - 1 if i == "long" else n) for i, n in got[-1]]
    assert got == expected
    with Journal.open(tmp_path / "again") as again:
        again.import_sessions(io.BytesIO(back))
        assert _history(again, "done") == held["done"][1]
        assert _meta(again, "paused") == held["paused"][0]


# -- staged sessions are invisible --------------------------------------------------------


class _Pause:
    """Holds an import at the fault point `import.commit` (on the importing journal's
    loop: another journal, with its own connection, looks meanwhile)."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()

    def point(self, where: str, detail: object) -> None:
        if where == "import.commit" and not self.go.is_set():
            self.reached.set()
            assert self.go.wait(60)


def _import_in_thread(j: Journal, archive: bytes) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(j.import_sessions(io.BytesIO(archive)))
        except BaseException as e:  # (the test looks at it)
            result.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_staged_sessions_are_invisible_to_every_reader_until_the_commit(
    url: str, tmp_path: Path
) -> None:
    archive, held = _source(tmp_path / "local")
    name = store_name(tmp_path)
    pause = _Pause()
    options = JetStreamOptions(servers=[url], store=name, point=pause.point)
    with (
        Journal.over(JetStreamEngine.open(options)) as j,
        Journal.open(url, store=name) as other,
    ):
        other.create_session("before")
        feed = other.watch_sessions()
        lifecycle: list[Any] = []
        watcher = threading.Thread(target=_collect, args=(feed, lifecycle, 1 + 7))
        watcher.start()
        thread, result = _import_in_thread(j, archive)
        assert pause.reached.wait(60), result
        # (staged, all of it: 1,100 retained events, snapshot, checkpoint, row, 5 claims)
        assert _staged_messages(url, name, "long") == 1108
        assert [m.session_id for m in other.list_sessions()] == ["before"]
        with pytest.raises(SessionNotFound):
            other.get_session("long")
        with pytest.raises(SessionNotFound):
            other.read("long")
        assert other.stats().sessions == {"open": 1}
        assert other.verify().frames == 1
        assert other.expire_due(now_ms=2**61) == []
        # A retention pass leaves a live importer's sessions alone.
        assert other.apply_retention().evicted_sessions == []
        assert _staged_messages(url, name, "long") == 1108
        assert [e.session.session_id for e in lifecycle] == ["before"]
        pause.go.set()
        thread.join(60)
        assert not isinstance(result[0], BaseException), result
        watcher.join(30)
        feed.close()
        kinds = [(e.event_type.value, e.session.session_id) for e in lifecycle[1:]]
        assert kinds == [
            ("created", "done"),
            ("resolved", "done"),
            ("created", "empty"),
            ("created", "long"),
            ("created", "paused"),
            ("suspended", "paused"),
            ("created", "trimmed"),
        ], kinds
        assert sorted(m.session_id for m in other.list_sessions()) == sorted([*held, "before"])
        assert _history(other, "long") == held["long"][1]


def _collect(stream: Any, into: list[Any], count: int) -> None:
    for event in stream:
        into.append(event)
        if len(into) == count:
            break


def test_an_import_committed_during_the_startup_snapshot_is_delivered_once(
    url: str, tmp_path: Path
) -> None:
    """An imported session's incarnation (its claim) precedes its CREATED entry: an
    import staged before `watch_sessions` read the feed's position and committed before
    it read the rows was in the rows (incarnation below the position) and came again
    from the feed after it, when its entries were more than the snapshot reads again
    (64). The snapshot leaves out sessions whose CREATED entry lies past the position."""
    with Journal.open(tmp_path / "local") as local:
        for i in range(70):
            local.create_session(f"s{i:02d}")
        archive = _export(local)
    name = store_name(tmp_path)
    pause = _Pause()
    importing = JetStreamOptions(servers=[url], store=name, point=pause.point)
    done: list[Any] = []

    def at_snapshot(where: str, detail: object) -> None:
        if where == "sessions.snapshot_point" and not pause.go.is_set():
            pause.go.set()  # (the import commits now, between the position and the rows)
            thread.join(60)
            done.append(result)

    watching = JetStreamOptions(servers=[url], store=name, point=at_snapshot)
    with (
        Journal.over(JetStreamEngine.open(importing)) as j,
        Journal.over(JetStreamEngine.open(watching)) as watcher,
    ):
        j.create_session("before")
        thread, result = _import_in_thread(j, archive)
        assert pause.reached.wait(60), result
        watcher.create_session("mid")  # (the feed's last position: after the claims)
        seen: list[Any] = []
        feed = watcher.watch_sessions()
        collector = threading.Thread(target=_collect, args=(feed, seen, 72))
        collector.start()
        collector.join(30)
        j.create_session("after")  # (the last one: nothing came twice before it)
        more: list[Any] = []
        _collect(feed, more, 1)
        feed.close()
        assert done and not isinstance(done[0][0], BaseException), done
        ids = [e.session.session_id for e in seen + more]
        assert sorted(ids[:-1]) == sorted(["before", "mid", *(f"s{i:02d}" for i in range(70))])
        assert ids[-1] == "after", ids[-3:]


def test_an_id_taken_meanwhile_is_session_exists_and_the_import_rolls_back(
    url: str, tmp_path: Path
) -> None:
    archive, _ = _source(tmp_path / "local")
    name = store_name(tmp_path)
    pause = _Pause()
    options = JetStreamOptions(servers=[url], store=name, point=pause.point)
    with (
        Journal.over(JetStreamEngine.open(options)) as j,
        Journal.open(url, store=name) as other,
    ):
        thread, result = _import_in_thread(j, archive)
        assert pause.reached.wait(60), result
        other.create_session("paused")  # (over the staged row: it reads as no session)
        other.append("paused", [EventIn("message", b"mine")])
        # Another import of the same ids meanwhile: refused, its importer is alive.
        with pytest.raises(SessionExists, match="being imported"):
            other.import_sessions(io.BytesIO(archive), rename={"paused": "p2"})
        pause.go.set()
        thread.join(60)
        assert isinstance(result[0], SessionExists), result
        assert "'paused'" in str(result[0])
        assert [m.session_id for m in j.list_sessions()] == ["paused"]
        assert [e.data for e in j.replay("paused")] == [b"mine"]
        # Rolled back: nothing of the staged sessions is left, claims included; the
        # session created meanwhile keeps its own messages (its row and one event).
        assert _staged_messages(url, name, "long") == 0
        assert stream_messages(url, name, f"s.{b'paused'.hex()}.>") == 2
        # The same archive under other ids imports.
        renamed = {"paused": "paused-2"}
        assert len(j.import_sessions(io.BytesIO(archive), rename=renamed).sessions) == 5
        assert j.verify().problems == []


def test_a_claim_delete_refused_for_want_of_a_leader_is_asked_again_by_the_rollback(
    url: str, tmp_path: Path
) -> None:
    """The import's own rollback (Ctrl+C during the write pass) whose delete of a claim is
    refused for want of a leader (10008, at the `import.drop_claim` point: an election)
    asks it again: the refusal was left unsaid, and the claim `in.<id>` stayed for good
    (a cluster run of the leader-hang import test left one)."""
    from journal._jetstream.client import ApiError

    archive, _held = _source(tmp_path / "local")
    name = store_name(tmp_path)
    refused: list[object] = []

    def refuse(where: str, detail: object) -> None:
        if where == "import.drop_claim" and not refused:
            refused.append(detail)
            raise ApiError(503, 10008, "no leader (a fault point)")

    def progress(done: int, total: int) -> None:
        if total and done > total // 2:
            raise KeyboardInterrupt

    options = JetStreamOptions(servers=[url], store=name, point=refuse)
    with Journal.over(JetStreamEngine.open(options)) as j:
        with pytest.raises(KeyboardInterrupt):
            j.import_sessions(io.BytesIO(archive), progress=progress)
        assert refused  # (the point was reached)
        assert list(j.list_sessions()) == []
        assert stream_messages(url, name, "in.>") == 0


def test_an_import_interrupted_while_it_stages_is_rolled_back(url: str, tmp_path: Path) -> None:
    """Ctrl+C during the write pass: the staged sessions are rolled back at once (their
    messages and claims purged), nothing became visible, and the archive imports again."""
    archive, held = _source(tmp_path / "local")
    path = tmp_path / "a.sja"
    path.write_bytes(archive)
    name = store_name(tmp_path)
    seen: list[int] = []

    def progress(done: int, total: int) -> None:
        if total and done > total // 2:
            seen.append(_staged_messages(url, name, "long"))
            raise KeyboardInterrupt

    with Journal.open(url, store=name) as j:
        with pytest.raises(KeyboardInterrupt):
            j.import_sessions(path, progress=progress)
        assert seen and seen[0] > 0  # (something was staged when it was interrupted)
        assert list(j.list_sessions()) == []
        assert stream_messages(url, name, "in.>") == 0
        # (The importer's heartbeat goes too, at its next beat: within a second.)
        assert stream_messages(url, name, "s.*.row") == stream_messages(url, name, "s.*.ev") == 0
        deadline = time.monotonic() + 5
        while stream_messages(url, name, "s.>") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stream_messages(url, name, "s.>") == 0
        assert len(j.import_sessions(path).sessions) == len(held)


# -- how many sessions one import takes ---------------------------------------------------


def test_an_import_of_more_sessions_than_one_batch_commits_is_refused_first(
    url: str, tmp_path: Path
) -> None:
    name = store_name(tmp_path)
    with Journal.open(tmp_path / "local") as local:
        for i in range(334):
            local.create_session(f"s{i:03d}")
            if i % 2:
                local.resolve_session(f"s{i:03d}")  # (3 messages at the commit)
        too_many = _export(local)
        local.create_session("x")  # (not exported below)
        out = io.BytesIO()
        local.export_sessions([f"s{i:03d}" for i in range(333)], out)
        most = out.getvalue()
    with Journal.open(url, store=name) as j:
        before = j.stats()
        with pytest.raises(InvalidArgument, match="at most 333 sessions") as refused:
            j.import_sessions(io.BytesIO(too_many))
        assert "334" in str(refused.value) and "journal export -s" in str(refused.value)
        assert j.stats() == before  # (nothing written)
        report = j.import_sessions(io.BytesIO(most))
        assert len(report.sessions) == 333
        assert j.stats().sessions == {"open": 167, "resolved": 166}


# -- a killed importer --------------------------------------------------------------------

_IMPORTER = """
import sys, time
from journal import Journal
j = Journal.open(sys.argv[1], store=sys.argv[2])
def progress(done, total):
    if total and done > total // 2:  # the write pass: something is staged
        print("staged", flush=True)
        time.sleep(600)
j.import_sessions(sys.argv[3], progress=progress)
"""


def _importer(
    script: str, url: str, name: str, archive: Path, stdin: bool = False
) -> subprocess.Popen[bytes]:
    """A process running `script` (an importer of `archive` into store `name`)."""
    return subprocess.Popen(
        [sys.executable, "-c", script, url, name, str(archive)],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _ended(child: subprocess.Popen[bytes]) -> None:
    """Kill `child` (when it still runs), reap it and close its pipes (left to the
    collector, each was a ResourceWarning, "unclosed file")."""
    with child:
        child.kill()


def _killed_once_staged(url: str, name: str, archive: Path) -> None:
    """An importer of `archive` into store `name`, SIGKILLed once it staged its first
    session (a dead importer's staging left behind)."""
    child = _importer(_IMPORTER, url, name, archive)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"staged\n"
    finally:
        _ended(child)


@pytest.mark.parametrize("cleaner", ["retention", "import"])
def test_a_killed_importer_leaves_nothing_visible_and_is_rolled_back(
    url: str, tmp_path: Path, cleaner: str
) -> None:
    """SIGKILL mid-import: the staged sessions stay invisible, and once the importer is
    gone (same host: its pid) the next retention pass, or the next import of its ids,
    rolls them back."""
    with Journal.open(tmp_path / "local") as local:
        local.create_session("big")
        for i in range(4):  # (staged in steps: several StageEvents)
            local.append("big", [EventIn("m", bytes([i]) * 4000) for _ in range(900)])
        local.create_session("small")
        local.append("small", [EventIn("m", b"s")])
        held = {i: _history(local, i) for i in ("big", "small")}
        archive = _export(local)
    path = tmp_path / "archive.sja"
    path.write_bytes(archive)
    name = store_name(tmp_path)
    _killed_once_staged(url, name, path)
    assert _staged_messages(url, name, "big") > 0
    with Journal.open(url, store=name) as j:
        assert list(j.list_sessions()) == []
        with pytest.raises(SessionNotFound):
            j.get_session("big")
        assert j.stats().sessions == {}
        if cleaner == "retention":
            j.apply_retention()
            assert _staged_messages(url, name, "big") == 0
            assert stream_messages(url, name, f"s.{b'small'.hex()}.>") == 0
        report = j.import_sessions(io.BytesIO(archive))
        assert [s.events for s in report.sessions] == [3600, 1]
        assert {i: _history(j, i) for i in held} == held
        assert j.verify().problems == []
        # Only the committed import's messages: one claim each, and no heartbeat (the
        # killed importer's went with its staged sessions, the live one's at its end).
        assert stream_messages(url, name, "in.>") == 2
    assert stream_messages(url, name, "s.*.hb") == 0


_IMPORTER_ELSEWHERE = (
    """
import socket, sys
socket.gethostname = lambda: "another-host"  # the importer runs on another machine
"""
    + _IMPORTER
)


@pytest.mark.slow  # (it waits out real leases: 22 s)
def test_an_importer_on_another_host_is_alive_while_it_beats_and_dead_after(
    url: str, tmp_path: Path
) -> None:
    """No pid to look at across machines: the importer's heartbeat (every second while
    it has sessions staged) keeps its staged sessions; 10 s after its last beat a
    retention pass rolls them back (SPEC 16.5)."""
    with Journal.open(tmp_path / "local") as local:
        local.create_session("a")
        local.append("a", [EventIn("m", b"x" * 4000) for _ in range(900)])
        local.create_session("b")
        archive = _export(local)
    path = tmp_path / "archive.sja"
    path.write_bytes(archive)
    name = store_name(tmp_path)
    child = _importer(_IMPORTER_ELSEWHERE, url, name, path)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"staged\n"
        staged = _staged_messages(url, name, "a")
        assert staged > 900
        with Journal.open(url, store=name) as j:
            time.sleep(11)  # (longer than a lease: the beats keep it alive)
            j.apply_retention()
            assert _staged_messages(url, name, "a") == staged
            child.send_signal(signal.SIGKILL)
            child.wait()
            j.apply_retention()  # (its last beat is recent: not judged dead yet)
            assert _staged_messages(url, name, "a") == staged
            time.sleep(10.5)
            j.apply_retention()
            assert _staged_messages(url, name, "a") == 0
            assert list(j.list_sessions()) == []
    finally:
        _ended(child)


_IMPORTER_STALLED = """
import socket, sys
socket.gethostname = lambda: "another-host"  # the importer runs on another machine
from journal import Journal
from journal._jetstream.engine import JetStreamEngine, JetStreamOptions
from journal._jetstream.layout import ROW_DECODER

def point(where, detail):
    if where == "import.commit":  # (on the engine's loop: no heartbeat meanwhile)
        print("commit", flush=True)
        sys.stdin.readline()

options = JetStreamOptions(servers=[sys.argv[1]], store=sys.argv[2], point=point)
j = Journal.over(JetStreamEngine.open(options))
try:
    report = j.import_sessions(sys.argv[3])
    print("committed", len(report.sessions), flush=True)
except Exception as e:
    print("failed", type(e).__name__, flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize(
    "first",
    # (each waits out a real lease, 11 s: both under -m slow, as the other-host
    # importer test above; test_jetstream_clocks judges lapsed beats in the default run)
    [
        pytest.param("commit", marks=pytest.mark.slow),
        pytest.param("rollback", marks=pytest.mark.slow),
    ],
)
def test_a_rollback_that_judged_a_late_importer_dead_spares_what_it_committed(
    url: str, tmp_path: Path, first: str
) -> None:
    """An importer on another host whose heartbeat is late (10 s: judged dead) commits
    after a retention pass judged it dead and before that pass rolls its sessions back:
    the rollback must not purge the committed sessions' events (it purged everything
    below the staged row it had read, which the commit had just made visible). When the
    rollback comes first, the commit is refused with StoreUnavailable saying the import
    was rolled back (it said SessionExists, "created meanwhile", of an id nobody has)."""
    held, archive = _one_session_archive(tmp_path, "a", 300, 10)
    path = tmp_path / "archive.sja"
    path.write_bytes(archive)
    name = store_name(tmp_path)
    child = _importer(_IMPORTER_STALLED, url, name, path, stdin=True)
    assert child.stdin is not None and child.stdout is not None
    answers: list[bytes] = []

    def point(where: str, detail: object) -> None:
        if where == "import.roll_back" and not answers and first == "commit":
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(b"go\n")  # (the importer wakes and commits now)
            child.stdin.flush()
            answers.append(child.stdout.readline())

    try:
        assert child.stdout.readline() == b"commit\n"
        time.sleep(11)  # (no beat for longer than a lease: judged dead)
        options = JetStreamOptions(servers=[url], store=name, point=point)
        with Journal.over(JetStreamEngine.open(options)) as j:
            j.apply_retention()
            if first == "rollback":
                assert _staged_messages(url, name, "a") == 0
                child.stdin.write(b"go\n")
                child.stdin.flush()
                answers.append(child.stdout.readline())
                assert answers == [b"failed StoreUnavailable\n"], answers
                assert list(j.list_sessions()) == []
                assert _staged_messages(url, name, "a") == 0
                return
            assert answers == [b"committed 1\n"], answers
            assert [m.session_id for m in j.list_sessions()] == ["a"]
            assert _history(j, "a") == held
            assert j.verify().problems == []
            assert stream_messages(url, name, "in.>") == 1
    finally:
        _ended(child)


def _off_loop(wait: Any) -> None:
    """Run `wait` in a thread of its own (a fault point runs on the engine's loop, where
    a client of the test's own cannot)."""
    thread = threading.Thread(target=wait)
    thread.start()
    thread.join(60)


def _until_committed(url: str, name: str) -> None:
    deadline = time.monotonic() + 30
    while not stream_messages(url, name, "lc.>") and time.monotonic() < deadline:
        time.sleep(0.02)


def _interrupt_when(event: threading.Event) -> threading.Thread:
    """A Ctrl+C to this process (its main thread) once `event` is set."""

    def send() -> None:
        if event.wait(60):
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_an_import_interrupted_as_it_commits_keeps_a_commit_that_lands_during_its_rollback(
    url: str, tmp_path: Path
) -> None:
    """Ctrl+C while the commit waits for its answer: its batch is on its way, and the
    import's own rollback (AbortImport) may read the staged row before the server stores
    the batch. It purged below the row it read, leaving the committed session without
    its events (replay: "ordinal 1 where 1 was due"); now a tombstone with the
    compare-and-set on that row goes first, and a commit that lands first keeps its
    sessions and the interrupt says the import was committed."""
    held, archive = _one_session_archive(tmp_path, "a", 300, 10)
    name = store_name(tmp_path)
    proxy = HoldingProxy(shared_server().port)
    reached: list[object] = []

    def point(where: str, detail: object) -> None:
        if where == "import.commit":  # (the commit's last message waits at the proxy)
            proxy.hold(lambda message: b"Nats-Batch-Commit" in message)
        elif where == "import.abort" and not reached:
            reached.append(detail)  # (the rollback read the row: still staged)
            proxy.release()
            _off_loop(lambda: _until_committed(url, name))

    options = JetStreamOptions(servers=[proxy.url], store=name, point=point)
    try:
        with Journal.over(JetStreamEngine.open(options)) as j:
            _interrupt_when(proxy.held)
            with pytest.raises(KeyboardInterrupt) as caught:
                j.import_sessions(io.BytesIO(archive))
            assert reached == ["a"]
            assert [m.session_id for m in j.list_sessions()] == ["a"]
            assert _history(j, "a") == held
            assert j.verify().problems == []
            assert getattr(caught.value, "__notes__", []) == [IMPORT_COMMITTED]
    finally:
        proxy.close()


def _last_beat_ms(url: str, name: str) -> int:
    """When the store's newest heartbeat message was written (0: none)."""
    import nats

    async def look() -> int:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            stream = f"JOURNAL_{name}"
            info = await js.stream_info(stream, subjects_filter=f"j.{name}.s.*.hb")
            times = [0]
            for subject in info.state.subjects or {}:
                message = await js.get_last_msg(stream, subject)
                times.append(msgspec.msgpack.decode(message.data)[-1])
            return max(times)
        finally:
            await nc.close()

    return asyncio.run(look())


def test_an_import_begun_as_the_last_ones_heartbeat_ends_still_beats(
    url: str, tmp_path: Path
) -> None:
    """The importer's heartbeat task left its loop when nothing was staged and then
    purged its subject; an import begun during that purge found the task running and
    started none, so it staged with no heartbeat at all (another host's retention pass
    would roll it back 10 s after its staging began). The purge is held at a proxy
    while the second import stages; once it is done, beats must come again."""
    with Journal.open(tmp_path / "local") as local:
        local.create_session("a")
        local.append("a", [EventIn("m", b"x" * 4000) for _ in range(1200)])
        archive = _export(local)
    name = store_name(tmp_path)
    proxy = HoldingProxy(shared_server().port)
    beats: list[int] = []

    def progress(done: int, total: int) -> None:
        if beats or not stream_messages(url, name, f"s.{b'a2'.hex()}.row"):
            return
        assert proxy.held.is_set()  # (begun while the purge waits)
        released = int(time.time() * 1000)
        proxy.release()
        deadline = time.monotonic() + 5
        while _last_beat_ms(url, name) <= released and time.monotonic() < deadline:
            time.sleep(0.05)
        beats.append(_last_beat_ms(url, name) - released)

    options = JetStreamOptions(servers=[proxy.url], store=name, heartbeat_s=0.2)
    try:
        with Journal.over(JetStreamEngine.open(options)) as j:
            proxy.hold(lambda message: b"STREAM.PURGE" in message and b".hb" in message)
            j.import_sessions(io.BytesIO(archive))
            assert proxy.held.wait(10)  # (the first import's heartbeat ends: its purge)
            j.import_sessions(io.BytesIO(archive), rename={"a": "a2"}, progress=progress)
            assert beats and beats[0] > 0, "no heartbeat while the second import staged"
            assert sorted(m.session_id for m in j.list_sessions()) == ["a", "a2"]
    finally:
        proxy.close()


def test_a_journal_closed_right_after_its_import_leaves_no_heartbeat(
    url: str, tmp_path: Path
) -> None:
    """The importer's heartbeat subject was purged by its heartbeat task a beat after the
    import; a journal closed sooner (every `journal import`) cancelled the task first and
    left one message for good, which no retention pass removed."""
    _history_a, archive = _one_session_archive(tmp_path, "a", 3, 10)
    name = store_name(tmp_path)
    for round_ in range(3):
        with Journal.open(url, store=name) as j:
            j.import_sessions(io.BytesIO(archive), rename={"a": f"a{round_}"})
        assert stream_messages(url, name, "s.*.hb") == 0


# -- the command line ---------------------------------------------------------------------


def test_the_command_line_imports_into_a_nats_store_and_lists_archives(
    url: str, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from cli.main import main

    archive, held = _source(tmp_path / "local")
    path = tmp_path / "a.sja"
    path.write_bytes(archive)
    store = f"{url}/{store_name(tmp_path)}"

    def run(*args: str) -> tuple[int, list[dict[str, Any]]]:
        result = CliRunner().invoke(main, ["--store", store, "--format", "json", *args])
        assert "Traceback" not in result.output, result.output
        return result.exit_code, [json.loads(x) for x in result.stdout.splitlines() if x]

    code, listed = run("import", "--list", str(path))
    assert code == 0 and sorted(x["session_id"] for x in listed[1:]) == sorted(held)
    assert run("init")[0] == 0
    code, imported = run("import", str(path))
    assert code == 0, imported
    assert imported[-1]["sessions"] == len(held)
    code, again = run("import", "--rename", "done=done-2", str(path))
    assert code != 0 and again[0]["error"]["code"] == "SESSION_EXISTS", again
    code, refused = run("import", "--as", "copy", str(path))
    assert code != 0 and refused  # (--as takes a one-session archive)
    code, sessions = run("sessions", "list")
    assert code == 0 and sorted(s["session_id"] for s in sessions) == sorted(held)


# -- a staging batch that lands after its rollback, a rollback killed midway ----------------

_IMPORT_ONCE = """
import sys
from journal import Journal
with Journal.open(sys.argv[1], store=sys.argv[2]) as j:
    try:
        print("imported", len(j.import_sessions(sys.argv[3]).sessions), flush=True)
    except Exception as e:
        print(type(e).__name__, e, flush=True)
"""


def _staged_row(url: str, name: str, session_id: str) -> bool:
    """Whether the id's last row message is a staged row (a client of the test's own)."""
    import nats

    async def look() -> bool:
        nc = await nats.connect(url)
        try:
            subject = f"j.{name}.s.{session_id.encode().hex()}.row"
            try:
                message = await nc.jetstream().get_last_msg(f"JOURNAL_{name}", subject)
            except nats.js.errors.NotFoundError:
                return False
            return bool(message.data) and ROW_DECODER.decode(message.data).staged
        finally:
            await nc.close()

    return asyncio.run(look())


@pytest.mark.parametrize("batch", ["first", "later"])
def test_a_staging_batch_that_lands_after_its_rollback_read_is_rolled_back_too(
    url: str, tmp_path: Path, batch: str
) -> None:
    """Ctrl+C while a staging batch waits for its answer: the batch is on its way, and
    the rollback may read the id's row before the server stores it. A first batch was
    left staged when it landed after that read (the rollback found nothing of its own),
    a later one when it landed between the read and the tombstone (the tombstone's
    compare-and-set failed on a row still staged): its claim and events stayed, and
    another process of this host could not import the id while this one lived
    ("being imported by another process")."""
    count, size = (10, 10) if batch == "first" else (1200, 4000)  # (later: StageEvents)
    held, archive = _one_session_archive(tmp_path, "a", count, size)
    path = tmp_path / "archive.sja"
    path.write_bytes(archive)
    name = store_name(tmp_path)
    proxy = HoldingProxy(shared_server().port)
    skip = [0 if batch == "first" else 1]

    def staging(message: bytes) -> bool:
        if b"Nats-Batch-Commit" not in message or b"Journal-Stage" not in message:
            return False
        skip[0] -= 1
        return skip[0] < 0

    def landed() -> None:  # (the held batch is stored, or refused: 2 s)
        subjects = "in.>" if batch == "first" else f"s.{b'a'.hex()}.ev"
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and not stream_messages(url, name, subjects):
            time.sleep(0.02)

    reached: list[object] = []

    def point(where: str, detail: object) -> None:
        if where == "import.abort" and batch == "later" and not reached:
            reached.append(detail)  # (the rollback read the row: the batch lands now)
            proxy.release()
            _off_loop(landed)

    options = JetStreamOptions(servers=[proxy.url], store=name, point=point)
    try:
        with Journal.over(JetStreamEngine.open(options)) as j:
            proxy.hold(staging)
            _interrupt_when(proxy.held)
            with pytest.raises(KeyboardInterrupt):
                j.import_sessions(path)
            if batch == "first":
                time.sleep(1)  # (the rollback, on the engine's loop, is over)
                proxy.release()
                landed()
            else:
                assert reached == ["a"]
            assert list(j.list_sessions()) == []
            assert not _staged_row(url, name, "a")
            assert stream_messages(url, name, "in.>") == 0
            assert stream_messages(url, name, f"s.{b'a'.hex()}.ev") == 0
            # Another process imports the id at once (this one lives on).
            child = _importer(_IMPORT_ONCE, url, name, path)
            out, _ = child.communicate(timeout=60)
            assert out == b"imported 1\n", out
            assert _history(j, "a") == held
            assert j.verify().problems == []
    finally:
        proxy.close()


_IMPORTER_INTERRUPTED = """
import sys
from journal import Journal
j = Journal.open(sys.argv[1], store=sys.argv[2])
def progress(done, total):
    if total and done > total // 2:  # the write pass: something is staged
        raise KeyboardInterrupt
j.import_sessions(sys.argv[3], progress=progress)
"""


@pytest.mark.parametrize("cleaner", ["retention", "import", "create"])
def test_an_importer_killed_during_its_rollback_leaves_no_claim(
    url: str, tmp_path: Path, cleaner: str
) -> None:
    """SIGKILL while an import rolls back (a Ctrl+C during staging), as it deletes the
    claim (`in.<id>`): the claim was left for good (nothing reads or removes a claim but
    the rollback that staged it, and it was deleted after the purge that left no trace
    of it). The next retention pass, or the next import of the id, removes it."""
    held, archive = _one_session_archive(tmp_path, "big", 2000, 4000)
    path = tmp_path / "archive.sja"
    path.write_bytes(archive)
    name = store_name(tmp_path)
    proxy = HoldingProxy(shared_server().port)
    proxy.hold(lambda message: b"STREAM.MSG.DELETE" in message)
    child = _importer(_IMPORTER_INTERRUPTED, proxy.url, name, path)
    try:
        assert proxy.held.wait(60)  # (the rollback deletes the claim: it dies now)
    finally:
        _ended(child)
        proxy.close()
    assert stream_messages(url, name, "in.>") == 1
    with Journal.open(url, store=name) as j:
        assert list(j.list_sessions()) == []
        if cleaner == "create":
            # A create of the id writes over the rollback's tombstone (rolled up): it
            # finishes that rollback first, or nothing ever would.
            j.create_session("big")
            j.apply_retention()
            assert stream_messages(url, name, "in.>") == 0
            assert stream_messages(url, name, f"s.{b'big'.hex()}.ev") == 0
            return
        if cleaner == "retention":
            j.apply_retention()
            assert stream_messages(url, name, "in.>") == 0
            assert stream_messages(url, name, f"s.{b'big'.hex()}.>") == 0
        assert len(j.import_sessions(path).sessions) == 1
        assert _history(j, "big") == held
        assert j.verify().problems == []
        assert stream_messages(url, name, "in.>") == 1  # (the committed import's claim only)
        assert stream_messages(url, name, f"s.{b'big'.hex()}.ev") == len(held)


def test_an_id_created_while_an_import_rolls_back_a_dead_importer_is_session_exists(
    url: str, tmp_path: Path
) -> None:
    """An import of an id a killed importer left staged rolls that staging back first;
    a create_session of the id by another writer in between (it writes over the staged
    row, which reads as no row) made the rollback's tombstone fail, and the import then
    took the created session's row for a free one: its first batch wrote over the
    committed session (its row rolled up), which vanished."""
    with Journal.open(tmp_path / "local") as local:
        local.create_session("a")
        local.append("a", [EventIn("m", bytes([i % 256]) * 100) for i in range(2000)])
        archive = _export(local)
    path = tmp_path / "archive.sja"
    path.write_bytes(archive)
    name = store_name(tmp_path)
    _killed_once_staged(url, name, path)
    assert _staged_row(url, name, "a")
    other = Journal.open(url, store=name)
    reached: list[object] = []

    def create() -> None:
        other.create_session("a", tags={"by": "creator"})
        other.append("a", [EventIn("m", b"mine")])

    def point(where: str, detail: object) -> None:
        if where == "import.roll_back" and not reached:
            reached.append(detail)  # (the import read the dead importer's staged row)
            _off_loop(create)

    options = JetStreamOptions(servers=[url], store=name, point=point)
    try:
        with Journal.over(JetStreamEngine.open(options)) as j:
            with pytest.raises(SessionExists):
                j.import_sessions(path)
            assert reached == ["a"]
            assert j.get_session("a").tags == {"by": "creator"}
            assert [e.data for e in j.replay("a")] == [b"mine"]
            assert j.verify().problems == []
    finally:
        other.close()


def test_an_interrupted_import_committed_and_evicted_before_its_rollback_keeps_its_claim(
    url: str, tmp_path: Path
) -> None:
    """Ctrl+C as the commit waits for its answer; the commit lands, and a retention pass
    evicts the (long ended) imported session before the import's rollback reads its row:
    the rollback took the eviction's tombstone for an id taken since, deleted the claim
    (the committed session's incarnation, kept for good as a CREATED entry is) and
    counted the session as rolled back (the interrupt lost its "committed" note)."""
    with Journal.open(tmp_path / "local") as local:
        local.create_session("a")
        local.append("a", [EventIn("m", b"x")])
        local.resolve_session("a")
        archive = _export(local)
    name = store_name(tmp_path)
    proxy = HoldingProxy(shared_server().port)
    reached: list[object] = []
    evicted: list[str] = []

    def evict() -> None:
        _until_committed(url, name)
        policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=1)
        with Journal.open(url, store=name, retention=policy) as other:
            evicted.extend(other.apply_retention().evicted_sessions)

    def point(where: str, detail: object) -> None:
        if where == "import.commit":
            proxy.hold(lambda message: b"Nats-Batch-Commit" in message)
        elif where == "import.abort" and not reached:
            reached.append(detail)
            proxy.release()
            _off_loop(evict)

    options = JetStreamOptions(servers=[proxy.url], store=name, point=point)
    try:
        with Journal.over(JetStreamEngine.open(options)) as j:
            _interrupt_when(proxy.held)
            with pytest.raises(KeyboardInterrupt) as caught:
                j.import_sessions(io.BytesIO(archive))
            assert reached == ["a"] and evicted == ["a"]
            assert list(j.list_sessions()) == []
            assert getattr(caught.value, "__notes__", []) == [IMPORT_COMMITTED]
            assert stream_messages(url, name, "in.>") == 1
    finally:
        proxy.close()


def test_a_ctrl_c_while_close_waits_for_the_heartbeats_purge_still_closes(
    url: str, tmp_path: Path
) -> None:
    """`close()` right after an import waits (up to 2 s) for its importer's heartbeat to
    be purged; a Ctrl+C in that wait left the connection, its thread and the waiter open
    for good (a second `close()` did nothing)."""
    _history_a, archive = _one_session_archive(tmp_path, "a", 3, 10)
    name = store_name(tmp_path)
    proxy = HoldingProxy(shared_server().port)
    before = {t for t in threading.enumerate() if t.name == "journal-nats"}
    try:
        j = Journal.over(JetStreamEngine.open(JetStreamOptions(servers=[proxy.url], store=name)))
        j.import_sessions(io.BytesIO(archive))
        proxy.hold(lambda message: b"STREAM.PURGE" in message and b".hb" in message)
        main = threading.get_ident()
        timer = threading.Timer(0.3, lambda: signal.pthread_kill(main, signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            j.close()
            time.sleep(5)  # (not reached when close took the Ctrl+C)
        timer.join()
        assert proxy.held.is_set()  # (the Ctrl+C came during the purge's wait)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            left = {t for t in threading.enumerate() if t.name == "journal-nats"} - before
            if not left:
                break
            time.sleep(0.05)
        assert not left, "the connection's thread still runs"
    finally:
        proxy.close()


def test_a_rollback_refused_for_one_staged_session_still_rolls_back_the_others(
    url: str, tmp_path: Path
) -> None:
    """A group's staging that fails (its last id being imported by another live importer)
    rolls back the sessions it began; one whose rollback is refused (a refusal no retry
    mends, at the `import.abort` point) does not keep the others staged: each is rolled
    back, and the refused one is left as a dead importer's, for the journal's own next
    retention pass (a rollback that stopped at its first refusal left the sessions after
    it staged and judged alive, their importer's heartbeat beating, while the journal
    lived)."""
    from journal._jetstream.client import ApiError

    name = store_name(tmp_path)
    with Journal.open(tmp_path / "local") as local:
        for session_id in ("a", "b", "c"):
            local.create_session(session_id)
            local.append(session_id, [EventIn("m", session_id.encode())])
        archive = _export(local)
        only_c = io.BytesIO()
        local.export_sessions(["c"], only_c)

    def refuse(where: str, detail: object) -> None:
        if where == "import.abort" and detail == "a":
            raise ApiError(400, 10999, "refused (a fault point)")

    pause = _Pause()
    holding = JetStreamOptions(servers=[url], store=name, point=pause.point)
    refusing = JetStreamOptions(servers=[url], store=name, point=refuse)
    with (
        Journal.over(JetStreamEngine.open(holding)) as holder,
        Journal.over(JetStreamEngine.open(refusing)) as j,
    ):
        thread, result = _import_in_thread(holder, only_c.getvalue())
        try:
            assert pause.reached.wait(60), result  # ("c" staged by a live importer)
            with pytest.raises(SessionExists, match="being imported"):
                j.import_sessions(io.BytesIO(archive))
            assert stream_messages(url, name, f"s.{b'b'.hex()}.>") == 0
            assert stream_messages(url, name, f"s.{b'a'.hex()}.>") > 0  # (refused: left)
            j.apply_retention()  # (its own staging, no longer alive, is rolled back)
            assert stream_messages(url, name, f"s.{b'a'.hex()}.>") == 0
        finally:
            pause.go.set()
            thread.join(60)
        assert [m.session_id for m in j.list_sessions()] == ["c"], result
        assert j.verify().problems == []


@pytest.mark.slow
def test_an_import_commit_left_without_an_answer_is_write_outcome_unknown(
    tmp_path: Path,
) -> None:
    """The import's commit batch went out and no answer came (the server stopped as it
    arrived): the import said "not known to have committed" as a plain StoreUnavailable
    (status UNAVAILABLE, the CLI's exit 9: retry once the store answers) until
    2026-12-06, while the server stored the batch on waking. It is WriteOutcomeUnknown
    (status UNKNOWN, exit 8: look before importing again), as an append's is. (About
    65 s: the commit's 30 s of asking, then its rollback's, SPEC 16.3.)"""
    held, archive = _one_session_archive(tmp_path, "a", 20, 100)
    server = NatsServer(tmp_path, "stopped")
    server.start()
    wait_for_jetstream([server.url])
    proxy = CuttingProxy(server.port)
    committing = threading.Event()
    name = store_name(tmp_path)

    def point(where: str, detail: object) -> None:
        if where == "import.commit":  # (the proxy cuts the commit's batch, not staging's)
            proxy.armed.set()
            committing.set()

    raised: list[BaseException] = []
    options = JetStreamOptions(servers=[proxy.url], store=name, point=point)
    try:
        with Journal.over(JetStreamEngine.open(options)) as j:

            def run() -> None:
                try:
                    j.import_sessions(io.BytesIO(archive))
                except BaseException as e:
                    raised.append(e)

            importer = threading.Thread(target=run)
            importer.start()
            try:
                assert committing.wait(20), "the import never committed"
                deadline = time.monotonic() + 20
                while proxy.armed.is_set():  # (cleared as the batch is forwarded)
                    assert time.monotonic() < deadline, "no commit batch came"
                    time.sleep(0.001)
                os.kill(server.pid, signal.SIGSTOP)  # (the batch is in its socket, unread)
                importer.join(150)
            finally:
                os.kill(server.pid, signal.SIGCONT)
            assert not importer.is_alive()
        [error] = raised
        assert isinstance(error, WriteOutcomeUnknown), repr(error)
        assert isinstance(error, StoreUnavailable)  # (`except StoreUnavailable` catches it)
        assert (error.code, error.status) == ("WRITE_OUTCOME_UNKNOWN", "UNKNOWN")
        assert "not known to have committed" in str(error)
        with Journal.open(server.url, store=name) as again:
            # (What the status warns of: the stopped server stored the import on waking.)
            deadline = time.monotonic() + 10
            while [m.session_id for m in again.list_sessions()] != ["a"]:
                assert time.monotonic() < deadline, "the stopped server never stored it"
                time.sleep(0.05)
            assert _history(again, "a") == held
            assert again.verify().problems == []
    finally:
        proxy.close()
        server.stop()


def _late_answers(url: str, proxy: DelayingProxy, inbox: str) -> list[dict[str, Any]]:
    """Release what `proxy` held, and the servers' answers to its batch commits (sent to
    `inbox`)."""
    import nats

    async def release() -> list[dict[str, Any]]:
        nc = await nats.connect(url)
        try:
            sub = await nc.subscribe(inbox)
            await nc.flush()
            sent = await asyncio.to_thread(proxy.release, inbox)
            commits = [m for m in sent if b"Nats-Batch-Commit" in m]
            return [json.loads((await sub.next_msg(10)).data) for _ in commits]
        finally:
            await nc.close()

    return asyncio.run(release())


@pytest.mark.slow
def test_an_unanswered_import_commit_fenced_by_its_rollback_is_store_unavailable(
    url: str, tmp_path: Path
) -> None:
    """The import's commit batch (every copy the commit sent again) was held back in
    flight for its 30 s, the servers answering all else: it raised WriteOutcomeUnknown
    (exit 8, "look before importing again") until 2026-12-06, though its rollback then
    went through. The rollback's tombstone, with the compare-and-set on the staged row,
    fences the batch for good (its own compare-and-set on that row can no longer pass):
    nothing was imported, StoreUnavailable (exit 9, retry). Every held copy, delivered
    after the tombstone, is refused. (About 35 s: the commit's 30 s of asking.)"""
    _, archive = _one_session_archive(tmp_path, "a", 20, 100)
    name = store_name(tmp_path)
    proxy = DelayingProxy(shared_server().port)

    def point(where: str, detail: object) -> None:
        if where == "import.commit":  # (staging is done: every batch now is the commit's)
            proxy.hold(lambda message: b"Nats-Batch-Id" in message)

    options = JetStreamOptions(servers=[proxy.url], store=name, point=point)
    try:
        with Journal.over(JetStreamEngine.open(options)) as j:
            with pytest.raises(StoreUnavailable) as caught:
                j.import_sessions(io.BytesIO(archive))
            error = caught.value
            assert _staged_messages(url, name, "a") == 0  # (rolled back: no claim either)
            # The batch delivered late, after the tombstone: each copy is refused.
            answers = _late_answers(url, proxy, f"late.{name}")
            assert answers and {a["error"]["err_code"] for a in answers} == {10071}, answers
            assert list(j.list_sessions()) == []
            assert stream_messages(url, name, "lc.>") == 0
            assert j.verify().problems == []
        assert not isinstance(error, WriteOutcomeUnknown), repr(error)
        assert (error.code, error.status) == ("STORE_UNAVAILABLE", "UNAVAILABLE")
        assert "nothing was imported" in str(error)
    finally:
        proxy.close()


@pytest.mark.slow
def test_a_ctrl_c_during_the_rollback_of_an_unanswered_commit_leaves_it_to_abort_import(
    url: str, tmp_path: Path
) -> None:
    """A Ctrl+C while an unanswered commit's own rollback runs (the test above): the
    sessions it had not finished are rolled back by the import's `AbortImport`, which
    counts them, so the interrupt does not say the import was committed (with the
    sessions forgotten by the cancelled rollback, `AbortImport` counted none, the
    import's sign that the commit went through)."""
    _, archive = _one_session_archive(tmp_path, "a", 20, 100)
    name = store_name(tmp_path)
    proxy = DelayingProxy(shared_server().port)
    interrupted = threading.Event()
    reached: list[object] = []

    def point(where: str, detail: object) -> None:
        if where == "import.commit":
            proxy.hold(lambda message: b"Nats-Batch-Id" in message)
        elif where == "import.abort" and not reached:  # (the commit's own rollback)
            reached.append(detail)
            os.kill(os.getpid(), signal.SIGINT)
            assert interrupted.wait(10)  # (the rollback goes on once the caller has it)

    def on_sigint(signum: int, frame: object) -> None:
        interrupted.set()
        raise KeyboardInterrupt

    options = JetStreamOptions(servers=[proxy.url], store=name, point=point)
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with Journal.over(JetStreamEngine.open(options)) as j:
            with pytest.raises(KeyboardInterrupt) as caught:
                j.import_sessions(io.BytesIO(archive))
            assert reached == ["a"]
            assert getattr(caught.value, "__notes__", []) == []
            assert list(j.list_sessions()) == []
            assert _staged_messages(url, name, "a") == 0
    finally:
        signal.signal(signal.SIGINT, previous)
        proxy.close()
