"""An interrupt that comes as `import_sessions` commits (SPEC.md section 12.3).

The local engine's commit queue holds a Ctrl+C while the main thread commits and raises
it once the commit is done, so it leaves `import_sessions` after the sessions are in the
store. The interrupt then says so (a note), and `journal import` does not say that
nothing was imported. On a nats:// store the interrupt cancels the commit's wait for its
answer, and the rollback that follows finds the sessions committed: the same note."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import signal
from pathlib import Path

import pytest

from journal import EventIn, Journal
from journal._local.files import FileOps
from journal.engine import AbortImport, CommitImport, StageSessions
from journal.transfer import IMPORT_COMMITTED, IMPORT_UNKNOWN


class _CtrlCAt(FileOps):
    """Sends this process a SIGINT as the operation of type `at` is planned."""

    def __init__(self, at: type, abort_fails: bool = False) -> None:
        self.at = at
        self.armed = False
        self.abort_fails = abort_fails

    def point(self, name: str, detail: object = None) -> None:
        if self.armed and name == "plan.operation" and isinstance(detail, self.at):
            self.armed = False
            os.kill(os.getpid(), signal.SIGINT)
        if self.abort_fails and name == "plan.operation" and isinstance(detail, AbortImport):
            raise OSError(errno.EIO, os.strerror(errno.EIO))


def _archive(tmp_path: Path) -> bytes:
    out = io.BytesIO()
    with Journal.open(tmp_path / "source", create=True) as j:
        for name in ("a", "b"):
            j.append(name, [EventIn("m", name.encode())], create=True)
        j.export_sessions(None, out)
    return out.getvalue()


@pytest.mark.parametrize("at", [CommitImport, StageSessions], ids=["commit", "staging"])
def test_an_interrupt_held_by_the_commit_says_whether_the_import_went_through(
    tmp_path: Path, at: type
) -> None:
    archive = _archive(tmp_path)
    ops = _CtrlCAt(at)
    with Journal.open(tmp_path / "target", create=True, file_ops=ops) as j:
        ops.armed = True
        with pytest.raises(KeyboardInterrupt) as caught:
            j.import_sessions(io.BytesIO(archive))
        assert not ops.armed, "the interrupt was sent"
        notes = getattr(caught.value, "__notes__", [])
        listed = [m.session_id for m in j.list_sessions()]
        if at is CommitImport:
            assert listed == ["a", "b"]
            assert notes == [IMPORT_COMMITTED]
        else:
            assert listed == []
            assert notes == []
            # Rolled back: the same archive imports again.
            assert len(j.import_sessions(io.BytesIO(archive)).sessions) == 2


def test_an_interrupt_as_the_import_commits_whose_rollback_fails_says_it_is_not_known(
    tmp_path: Path,
) -> None:
    """The rollback after the interrupt failed: nothing tells whether the commit went
    through, and the interrupt says so (it said nothing, and `journal import` then said
    that nothing was imported)."""
    archive = _archive(tmp_path)
    ops = _CtrlCAt(CommitImport, abort_fails=True)
    with Journal.open(tmp_path / "target", create=True, file_ops=ops) as j:
        ops.armed = True
        with pytest.raises(KeyboardInterrupt) as caught:
            j.import_sessions(io.BytesIO(archive))
        ops.abort_fails = False
        assert getattr(caught.value, "__notes__", []) == [IMPORT_UNKNOWN]
        assert [m.session_id for m in j.list_sessions()] == ["a", "b"]


def test_an_interrupt_after_a_jetstream_commit_landed_says_the_import_went_through(
    tmp_path: Path,
) -> None:
    """A nats:// store: Ctrl+C as the commit waits for its answer, and the batch is
    stored before the rollback (`AbortImport`) reads the staged rows. The rollback
    counted every session it found, the committed ones too, so the interrupt did not
    say the import was committed (and `journal import` said nothing was imported)."""
    import threading
    import time

    from _nats import HoldingProxy, shared_server

    from journal._jetstream.engine import JetStreamEngine, JetStreamOptions

    archive = _archive(tmp_path)
    server = shared_server()
    proxy = HoldingProxy(server.port)
    name = "t" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]

    def committed() -> None:  # (the servers stored the batch: its sessions are listed)
        with Journal.open(server.url, store=name) as other:
            deadline = time.monotonic() + 30
            while not list(other.list_sessions()) and time.monotonic() < deadline:
                time.sleep(0.02)

    def point(where: str, detail: object) -> None:
        if where == "import.commit":  # (held at the proxy until the rollback reads)
            proxy.hold(
                lambda message: b"Nats-Batch-Commit" in message,
                until=lambda message: b"STREAM.MSG.GET" in message,
                settle=committed,
            )

    def interrupt() -> None:
        if proxy.held.wait(60):
            os.kill(os.getpid(), signal.SIGINT)

    options = JetStreamOptions(servers=[proxy.url], store=name, point=point)
    try:
        with Journal.over(JetStreamEngine.open(options)) as j:
            threading.Thread(target=interrupt, daemon=True).start()
            with pytest.raises(KeyboardInterrupt) as caught:
                j.import_sessions(io.BytesIO(archive))
            assert sorted(m.session_id for m in j.list_sessions()) == ["a", "b"]
            assert [e.data for e in j.replay("b")] == [b"b"]
            assert getattr(caught.value, "__notes__", []) == [IMPORT_COMMITTED]
    finally:
        proxy.close()


def test_an_interrupt_in_the_progress_report_after_the_commit_says_it_went_through(
    tmp_path: Path,
) -> None:
    """The report of all done comes after the commit (`progress(2 * size, 2 * size)`;
    the last staging batch may report the same numbers before it). A Ctrl+C that lands
    while that report runs (the CLI's progress bar redraws then) left `import_sessions`
    without the note, so `journal import` said nothing was imported, and a retry met
    `SessionExists`."""
    archive = _archive(tmp_path)
    reports: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> None:
        reports.append((done, total))
        if committed():
            raise KeyboardInterrupt

    with Journal.open(tmp_path / "target", create=True) as j:

        def committed() -> bool:
            return bool(list(j.list_sessions()))

        with pytest.raises(KeyboardInterrupt) as caught:
            j.import_sessions(io.BytesIO(archive), progress=progress)
        assert reports[-1][0] == reports[-1][1] > 0, reports
        assert [m.session_id for m in j.list_sessions()] == ["a", "b"]
        assert getattr(caught.value, "__notes__", []) == [IMPORT_COMMITTED]
