"""A policy recorded while writers run (SPEC 8, "The store records its policy"), and
`journal retention` (SPEC 13).

Until 2026-12-03 a journal applied the policy it opened with until it closed: an operator
who recorded a stricter window while the runtime's long-lived writer ran saw no effect (the
writer kept its 320 MiB default window and the store grew to 170 MB), and there was no
command to see or set the policy (it took Python). Now every retention pass (the one a
seal triggers, `apply_retention()`) applies the policy recorded at that moment.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _procs_retention import Child, payload
from _waiting import blocked_on_flock
from click.testing import CliRunner, Result
from engines import EngineFactory, JetStreamEngineFactory

from cli.main import main as journal_cli
from journal import (
    EventIn,
    InvalidArgument,
    Journal,
    ReadOnlyStore,
    RetentionPolicy,
    StoreIncompatible,
)
from journal._local.files import FileOps

ROOT = Path(__file__).resolve().parent.parent
SEGMENT_BYTES = 4096
NO_WINDOWS = RetentionPolicy(max_history_bytes=None)
WINDOW = 2000  # bytes: about 6 of the 300-byte events below


def append_300(j: Journal, count: int) -> None:
    for _ in range(count):
        ordinal = j.get_session("s").last_ordinal + 1
        j.append("s", [EventIn(type="m", data=payload("s", ordinal, 300))])


def cli(store: Path | str, *args: str, fmt: str = "json") -> Result:
    result = CliRunner().invoke(journal_cli, ["--store", str(store), "--format", fmt, *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def cli_process(store: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`journal` in a process of its own (another process than the writer)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "cli", "--store", store, "--format", "json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_writer_process_applies_a_window_recorded_while_it_runs(store: Path) -> None:
    """The operator trial: a long-lived writer (opened without a policy: the default
    320 MiB window) keeps running while another process records a 2000-byte window;
    the writer's next seal applies it. Before: first_ordinal stayed 1 for good."""
    with Journal.open(store, segment_bytes=SEGMENT_BYTES):
        pass  # (created with the default policy)
    writer = Child("writer", str(store), str(SEGMENT_BYTES))
    try:
        assert writer.next_line() == "ready"
        writer.send("append 30")  # 9,000 bytes: seals twice under the 320 MiB window
        assert writer.next_line().split() == ["s", "1", "30"]
        recorded = cli_process(str(store), "retention", "--max-history-bytes", str(WINDOW))
        assert recorded.returncode == 0, recorded.stderr
        assert json.loads(recorded.stdout)["max_history_bytes"] == WINDOW
        writer.send("append 20")  # 6,000 bytes: at least one more seal, so a pass
        _, first, last = writer.next_line().split()
        assert last == "50"
        # The seal's pass kept the batches within 2000 bytes of the sealed segments' end
        # (about 7 of them; the appends after it wait for the next seal or a full pass).
        assert 30 - 7 < int(first) < 50, writer.seen
        writer.proc.stdin.close()  # type: ignore[union-attr]
        assert writer.wait(60) == 0, writer.err()
    finally:
        writer.kill()
    with Journal.open(store) as j:
        assert j.get_session("s").first_ordinal == int(first)
        assert j.retention_policy().max_history_bytes == WINDOW
        j.apply_retention()
        assert 50 - 7 < j.get_session("s").first_ordinal <= 50 - 5


def test_a_running_writer_applies_the_policy_recorded_at_each_pass(
    engine: EngineFactory, tmp_path: Path
) -> None:
    """On every engine: a writer opened with no window applies the one another process
    records, at its next `apply_retention()`; and one that opened with a policy of its own
    gives way to a later recording too (the last recording wins)."""
    path = tmp_path / "store"
    with engine.open(path, retention=NO_WINDOWS, segment_bytes=1 << 20) as j:
        j.create_session("s")
        append_300(j, 30)
        assert j.apply_retention().trimmed_sessions == []
        store = (
            f"{engine.url()}/{engine.store_name(path)}"
            if isinstance(engine, JetStreamEngineFactory)
            else str(path)
        )
        recorded = cli_process(store, "retention", "--max-history-bytes", str(WINDOW))
        assert recorded.returncode == 0, recorded.stderr
        assert j.apply_retention().trimmed_sessions == ["s"]
        assert j.retention_policy().max_history_bytes == WINDOW
        first = j.get_session("s").first_ordinal
        assert 30 - 7 < first <= 30 - 5
        # Back to no window: the next pass trims nothing more, appends keep everything
        # (JetStream's appends keep the byte window themselves, with the recorded policy
        # compared at most once a second: retention_policy() compares it now).
        assert cli_process(store, "retention", "--max-history-bytes", "none").returncode == 0
        assert j.retention_policy() == NO_WINDOWS
        append_300(j, 10)
        assert j.apply_retention().trimmed_sessions == []
        assert j.get_session("s").first_ordinal == first


def test_a_damaged_policy_found_at_a_pass_keeps_the_previous_one(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A policy that became damaged while a writer runs does not stop its appends (nor
    its seals' passes): it logs a warning and keeps the policy in force; opening the store
    still refuses it (StoreIncompatible)."""
    window = RetentionPolicy(max_history_bytes=WINDOW)
    with Journal.open(store, retention=window, segment_bytes=SEGMENT_BYTES) as j:
        j.create_session("s")
        document = json.loads((store / "store.json").read_text())
        document["retention"]["max_history_bytes"] = -5
        (store / "store.json").write_text(json.dumps(document))
        with caplog.at_level(logging.WARNING, logger="journal"):
            append_300(j, 40)  # several seals, each with its pass
            j.apply_retention()
        assert j.get_session("s").first_ordinal > 40 - 7  # (the window in force)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("keeping the one in force" in w for w in warnings), warnings
        assert len(warnings) == 1, warnings  # (once per version of the file)
        assert j.retention_policy() == window
    with pytest.raises(StoreIncompatible, match="retention"):
        Journal.open(store)


def test_a_store_file_gone_while_a_writer_runs_is_logged_once(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its passes keep the policy in force and say so once, not at every pass (each
    seal's, every `apply_retention()`) as they did when it was first built."""
    window = RetentionPolicy(max_history_bytes=WINDOW)
    with Journal.open(store, retention=window, segment_bytes=SEGMENT_BYTES) as j:
        j.create_session("s")
        kept = (store / "store.json").read_bytes()
        (store / "store.json").unlink()
        try:
            with caplog.at_level(logging.WARNING, logger="journal"):
                append_300(j, 40)  # several seals, each with its pass
                j.apply_retention()
                j.apply_retention()
        finally:
            (store / "store.json").write_bytes(kept)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "cannot stat it" in warnings[0], warnings
        assert j.get_session("s").first_ordinal > 40 - 7  # (the window in force)


def test_a_read_only_journal_reads_the_policy_and_records_nothing(store: Path) -> None:
    with Journal.open(store, retention=NO_WINDOWS):
        pass
    before = (store / "store.json").read_bytes()
    with Journal.open(store, readonly=True) as j:
        assert j.retention_policy() == NO_WINDOWS
    # (Until 2026-12-07 a policy given to a read-only journal was accepted and ignored.)
    with pytest.raises(InvalidArgument, match="retention is for journals that write"):
        Journal.open(store, readonly=True, retention=RetentionPolicy())
    assert (store / "store.json").read_bytes() == before


class _PausedStoreFileRename(FileOps):
    """Holds the first rename onto `store.json` (an open recording a new file mode, after
    it read the file) until `release` is set."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()

    def replace(self, source: str, destination: str) -> None:
        if os.path.basename(destination) == "store.json" and not self.reached.is_set():
            self.reached.set()
            self.release.wait(60)
        super().replace(source, destination)


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs /proc/locks")
def test_a_policy_recorded_while_an_open_records_a_file_mode_is_kept(store: Path) -> None:
    """An open with a new `file_mode` rewrote `store.json` from the read it made earlier in
    the open: a policy `journal retention` recorded in between was written back to the old
    one, which every writer then applied (a lost update). Now every recording reads,
    changes and replaces `store.json` under `locks/open.lock`: the second waits."""
    with Journal.open(store, file_mode=0o600):
        pass
    paused = _PausedStoreFileRename()
    failures: list[BaseException] = []

    def open_with_a_new_mode() -> None:
        try:
            with Journal.open(store, file_mode=0o640, file_ops=paused):
                pass
        except BaseException as e:
            failures.append(e)

    opening = threading.Thread(target=open_with_a_new_mode)
    opening.start()
    recording = None
    try:
        assert paused.reached.wait(30), failures
        record = ["retention", "--max-history-bytes", str(WINDOW)]
        recording = subprocess.Popen(
            [sys.executable, "-m", "cli", "--store", str(store), "--format", "json", *record],
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Until the recording has either finished or waits for the lock.
        deadline = time.monotonic() + 60  # (a guard against a hang, not a measurement)
        while recording.poll() is None and not blocked_on_flock(recording.pid):
            assert time.monotonic() < deadline, "the recording neither ended nor waited"
            time.sleep(0.01)
    finally:
        paused.release.set()
        opening.join(60)
        if recording is not None and opening.is_alive():
            recording.kill()
    assert recording is not None
    _, errors = recording.communicate(timeout=60)
    assert recording.returncode == 0, errors
    assert not failures and not opening.is_alive(), failures
    recorded = json.loads((store / "store.json").read_text())
    assert recorded["file_mode"] == "0640"
    assert recorded["retention"]["max_history_bytes"] == WINDOW
    assert (store / "store.json").stat().st_mode & 0o777 == 0o640
    with Journal.open(store) as j:
        assert j.retention_policy().max_history_bytes == WINDOW


def test_policy_changes_from_several_threads_at_once_all_apply(
    engine: EngineFactory, tmp_path: Path
) -> None:
    """On every engine: `change_retention_policy` applies each change to the policy
    recorded at that moment (local: under the store's open lock; JetStream: compare-and-set
    on the policy subject, again on a conflict), so 4 threads adding 1 to a field 15 times
    each leave it 60 higher, and a field changed meanwhile by another call is kept.
    (Processes at once: `test_two_journal_retention_runs_at_once_keep_both_changes`.)"""
    path = tmp_path / "store"
    with engine.open(path) as j:
        j.change_retention_policy(lambda p: msgspec.structs.replace(p, max_history_age_ms=1))
        failures: list[BaseException] = []
        calls = 0

        def plus_one(p: RetentionPolicy) -> RetentionPolicy:
            nonlocal calls
            calls += 1
            return msgspec.structs.replace(p, max_history_age_ms=(p.max_history_age_ms or 0) + 1)

        def add_one() -> None:
            try:
                for _ in range(15):
                    j.change_retention_policy(plus_one)
            except BaseException as e:
                failures.append(e)

        threads = [threading.Thread(target=add_one) for _ in range(4)]
        for thread in threads:
            thread.start()
        recorded = j.change_retention_policy(
            lambda p: msgspec.structs.replace(p, session_retention_ms=5000)
        )
        assert recorded.session_retention_ms == 5000
        for thread in threads:
            thread.join(120)
        assert not failures, failures
        expected = RetentionPolicy(max_history_age_ms=61, session_retention_ms=5000)
        assert j.retention_policy() == expected
        assert calls >= 60
    with engine.open(path) as reopened:
        assert reopened.retention_policy() == expected


def test_a_policy_change_that_is_refused_records_nothing(
    engine: EngineFactory, tmp_path: Path
) -> None:
    path = tmp_path / "store"
    with engine.open(path) as j:
        before = j.retention_policy()

        def boom(p: RetentionPolicy) -> RetentionPolicy:
            raise LookupError("the caller's own error")

        with pytest.raises(LookupError, match="the caller's own error"):
            j.change_retention_policy(boom)
        with pytest.raises(InvalidArgument, match="must return a RetentionPolicy"):
            j.change_retention_policy(lambda p: {"max_history_bytes": 5})  # type: ignore[arg-type,return-value]
        with pytest.raises(InvalidArgument, match="max_history_age_ms must be a positive int"):
            j.change_retention_policy(lambda p: msgspec.structs.replace(p, max_history_age_ms=-1))
        with pytest.raises(InvalidArgument, match="must be a callable"):
            j.change_retention_policy(RetentionPolicy())  # type: ignore[arg-type]
        # (0 is refused, and the refusal says what evicts ended sessions soonest)
        with pytest.raises(InvalidArgument, match=r"got 0 \(1 evicts an ended session"):
            j.change_retention_policy(lambda p: msgspec.structs.replace(p, session_retention_ms=0))
        assert j.retention_policy() == before
    with engine.open(path, readonly=True) as reader:
        with pytest.raises(ReadOnlyStore, match="change_retention_policy"):
            reader.change_retention_policy(lambda p: p)
        assert reader.retention_policy() == before


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs /proc/locks")
def test_two_journal_retention_runs_at_once_keep_both_changes(store: Path) -> None:
    """`journal retention` read the policy, then recorded the whole policy with its
    options applied: two runs at once setting different options kept only the last one's
    (both read before either recorded). Both now apply their options to the policy
    recorded at that moment. (Both are held at `locks/open.lock` here, after their read.)"""
    assert cli(store, "init").exit_code == 0
    runs: list[subprocess.Popen[str]] = []
    fd = os.open(store / "locks" / "open.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for option in (["--max-history-age-ms", "9000"], ["--session-retention-ms", "60000"]):
            runs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "cli", "--store", str(store), "retention", *option],
                    env=dict(os.environ, PYTHONPATH=str(ROOT)),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        deadline = time.monotonic() + 60  # (a guard against a hang, not a measurement)
        while not all(blocked_on_flock(run.pid) for run in runs):
            assert time.monotonic() < deadline, [run.poll() for run in runs]
            time.sleep(0.01)
    finally:
        os.close(fd)  # (releases the lock)
    for run in runs:
        _, errors = run.communicate(timeout=60)
        assert run.returncode == 0, errors
    recorded = json.loads((store / "store.json").read_text())["retention"]
    assert (recorded["max_history_age_ms"], recorded["session_retention_ms"]) == (9000, 60000)


# -- journal retention -----------------------------------------------------------------------


def test_journal_retention_shows_the_recorded_policy(store: Path) -> None:
    assert cli(store, "init").exit_code == 0
    shown = cli(store, "retention")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == {
        "max_history_bytes": 320 << 20,
        "max_history_age_ms": None,
        "session_retention_ms": None,
        "session_retention_from": "ended",
    }
    text = cli(store, "retention", fmt="text").stdout
    assert text == (
        "retention: max-history-bytes 335544320 (320 MiB), max-history-age-ms none, "
        "session-retention-ms none, session-retention-from ended\n"
    )
    assert cli(store, "retention", fmt="quiet").stdout == ""


def test_journal_retention_records_the_fields_given_and_keeps_the_others(store: Path) -> None:
    assert cli(store, "init").exit_code == 0
    first = cli(store, "retention", "--session-retention-ms", "60000", "--max-history-age-ms", "9")
    assert first.exit_code == 0, first.output
    second = cli(
        store, "retention", "--max-history-bytes", "NONE", "--session-retention-from", "started"
    )
    assert second.exit_code == 0, second.output
    expected: dict[str, Any] = {
        "max_history_bytes": None,
        "max_history_age_ms": 9,
        "session_retention_ms": 60000,
        "session_retention_from": "started",
    }
    assert json.loads(second.stdout) == {**expected, "changed": True}
    assert json.loads((store / "store.json").read_text())["retention"] == expected
    again = cli(store, "retention", "--max-history-age-ms", "9")
    assert json.loads(again.stdout) == {**expected, "changed": False}
    assert cli(store, "retention", "--max-history-age-ms", "none", fmt="text").stdout.startswith(
        "retention recorded: max-history-bytes none, max-history-age-ms none,"
    )
    with Journal.open(store) as j:
        assert j.retention_policy().max_history_age_ms is None


@pytest.mark.parametrize(
    "value", ["0", "-3", "nonee", "1.5", str(1 << 62)], ids=["0", "neg", "word", "float", "big"]
)
def test_journal_retention_refuses_bad_values_as_usage_errors(store: Path, value: str) -> None:
    assert cli(store, "init").exit_code == 0
    before = (store / "store.json").read_bytes()
    refused = cli(store, "retention", "--max-history-bytes", value)
    assert refused.exit_code == 2, refused.output
    (error,) = [json.loads(line)["error"] for line in refused.stdout.splitlines()]
    assert error["code"] == "USAGE" and "--max-history-bytes" in error["message"]
    assert (store / "store.json").read_bytes() == before
    assert cli(store, "retention", "--session-retention-from", "created").exit_code == 2


def test_journal_retention_on_a_missing_store_is_store_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "nothing"
    assert cli(missing, "retention").exit_code == 3
    assert cli(missing, "retention", "--max-history-bytes", "5").exit_code == 3
    assert not missing.exists()
