"""Read-only journals: a reader that may read the store but not write it lists, reads and
watches it (following the writer across rotation, trims and compaction) and never creates
or changes anything in it; it needs the cursor key; writes raise `ReadOnlyStore`.

The unprivileged reader is a real process that drops to uid/gid 65534 after importing
everything (tests run as root in CI); the store is made world-readable and not writable.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest
from _procs_retention import NOBODY, Child, payload

from journal import (
    CursorExpired,
    EventIn,
    Journal,
    JournalCorrupt,
    KeyRingError,
    ReadOnlyStore,
    RetentionPolicy,
    SessionState,
    StoreNotFound,
    StoreUnavailable,
)
from journal._local.engine import LocalEngine, LocalOptions
from journal._local.files import FAULT_POINTS, FileOps

KEY = "6b" * 32  # 32 bytes, hex
SEGMENT_BYTES = 16 << 10


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path lives under a 0700 directory)."""
    directory = Path(tempfile.mkdtemp(prefix="journal-readonly-test-"))
    directory.chmod(0o755)
    # The stores that readers follow are created with file_mode=0o644, so files the
    # writer creates later (new segments, sidecars) are readable by others, as in a
    # deployment that shares a store with readers; the umask is set for the rest.
    umask = os.umask(0o022)
    try:
        yield directory
    finally:
        os.umask(umask)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def shared_key(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The cursor key as the writer (this process) and the reader see it."""
    monkeypatch.setenv("JOURNAL_CURSOR_KEY", KEY)
    monkeypatch.delenv("JOURNAL_CURSOR_KEY_FILE", raising=False)
    return {**os.environ, "JOURNAL_CURSOR_KEY": KEY}


def read_only(store: Path, file_ops: FileOps | None = None) -> tuple[Journal, LocalEngine]:
    """A read-only journal of `store`, and its engine (to see which view it reads)."""
    engine = LocalEngine.open(str(store), LocalOptions(readonly=True, file_ops=file_ops))
    return Journal.over(engine), engine


def make_readable_only(store: Path) -> None:
    """World-readable, writable by its owner (root) only."""
    for directory, _, files in os.walk(store):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)


def tree(store: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every path under the store: (size, mtime_ns, uid, mode)."""
    found = {}
    for directory, dirs, files in os.walk(store):
        for name in dirs + files:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            found[os.path.relpath(path, store)] = (
                0 if stat.S_ISDIR(st.st_mode) else st.st_size,
                st.st_mtime_ns,
                st.st_uid,
                st.st_mode,
            )
    return found


def append(j: Journal, session_id: str, count: int, size: int = 700) -> list[bytes]:
    first = j.get_session(session_id).last_ordinal + 1
    data = [payload(session_id, first + i, size) for i in range(count)]
    j.append(session_id, [EventIn(type="m", data=d) for d in data])
    return data


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


@pytest.mark.parametrize("compress_sealed", [False, True])
def test_unprivileged_reader_watches_while_the_writer_appends_and_changes_nothing(
    public_dir: Path, shared_key: dict[str, str], compress_sealed: bool
) -> None:
    assert os.geteuid() == 0, "this test drops a child process to uid 65534: run it as root"
    store = public_dir / "store"
    expected: list[bytes] = []
    with Journal.open(
        store,
        durability="fsync",
        segment_bytes=SEGMENT_BYTES,
        compress_sealed=compress_sealed,
        file_mode=0o644,
    ) as j:
        for session_id in ("a", "b", "c"):
            j.create_session(session_id)
        expected += append(j, "a", 10)
        append(j, "b", 3)
        assert not (store / "keys").exists()  # the key is external
        make_readable_only(store)
        reader = Child("ro_watch", str(store), "a", env=shared_key)
        try:
            assert reader.next_line() == "sessions a,b,c", reader.err()
            assert reader.next_line() == "ready"
            # Enough to rotate several segments while the reader follows.
            for round_no in range(40):
                expected += append(j, "a", 1 + round_no % 5)
                if round_no % 10 == 0:
                    append(j, "c", 2)
            j.resolve_session("a")
            code = reader.wait(60)
        finally:
            reader.kill()
        assert code == 0, reader.err()
        names = os.listdir(store / "segments")
        assert len([n for n in names if n.endswith((".seg", ".seg.zst"))]) > 3
        assert any(n.endswith(".seg.zst") for n in names) is compress_sealed
    lines = reader.seen[2:]
    assert lines[-1] == "done", lines[-3:]
    assert lines[:-1] == [f"ev {n} {digest(d)}" for n, d in enumerate(expected, start=1)]
    files = tree(store)
    assert [p for p, (_, _, uid, _) in files.items() if uid == NOBODY] == []

    # With the writer stopped, another read-only run leaves every file as it was.
    before = tree(store)
    reader = Child("ro_read", str(store), env=shared_key)
    code = reader.wait(60)
    assert code == 0, reader.err()
    assert reader.seen[-2:] == ["left behind []", "done"]
    assert [line.split()[1:5] for line in reader.seen[:-2]] == [
        ["a", "resolved", "1", str(len(expected))],
        ["b", "open", "1", "3"],
        ["c", "open", "1", "8"],
    ]
    assert tree(store) == before


def test_reader_paused_between_reading_the_tail_and_using_it_sees_no_corruption(
    public_dir: Path, shared_key: dict[str, str]
) -> None:
    # The reader reads a chunk of the active segment (new frames, then zeros not yet
    # written), is descheduled, and meanwhile the writer appends more frames after them.
    # The zeros it read are "not yet written", not damage in front of valid frames.
    store = public_dir / "store"
    expected: list[bytes] = []
    with Journal.open(store, durability="os", segment_bytes=1 << 20, file_mode=0o644) as j:
        j.create_session("a")
        expected += append(j, "a", 3)
        make_readable_only(store)
        reader = Child("ro_watch_paused", str(store), "a", env=shared_key)
        try:
            assert reader.next_line() == "ready", reader.err()
            expected += append(j, "a", 2)
            while (line := reader.next_line()) != "paused":
                assert line.startswith("ev "), (line, reader.err())
            expected += append(j, "a", 2)
            expected += append(j, "a", 2)
            reader.send("go")
            expected += append(j, "a", 2)
            j.resolve_session("a")
            code = reader.wait(60)
        finally:
            reader.kill()
    assert code == 0, reader.err()
    lines = [line for line in reader.seen[1:] if line != "paused"]
    assert lines == [*(f"ev {n} {digest(d)}" for n, d in enumerate(expected, start=1)), "done"]


def test_unprivileged_reader_follows_trims_evictions_and_compaction(
    public_dir: Path, shared_key: dict[str, str]
) -> None:
    store = public_dir / "store"
    policy = RetentionPolicy(max_history_bytes=None, session_retention_ms=1000)
    with Journal.open(
        store, durability="os", segment_bytes=SEGMENT_BYTES, retention=policy, file_mode=0o644
    ) as j:
        j.create_session("kept")
        j.create_session("trimmed")
        j.create_session("evicted")
        for _ in range(20):
            append(j, "kept", 2, 300)
            append(j, "trimmed", 2, 300)
            append(j, "evicted", 2, 300)
        make_readable_only(store)
        # The reader builds its private view now, then the writer changes the store.
        reader = Child("ro_watch", str(store), "kept", env=shared_key)
        try:
            assert reader.next_line() == "sessions evicted,kept,trimmed", reader.err()
            assert reader.next_line() == "ready"
            j.compact_session("trimmed", 30, b"thirty")
            ended = j.resolve_session("evicted").ended_at_ms
            assert ended is not None
            assert j.apply_retention(now_ms=ended + 1000).evicted_sessions == ["evicted"]
            j.compact()
            for _ in range(10):
                append(j, "kept", 2, 300)
                append(j, "trimmed", 2, 300)
            j.resolve_session("kept")
            code = reader.wait(60)
        finally:
            reader.kill()
        assert code == 0, reader.err()
        assert reader.seen[-1] == "done"
        assert [line.split()[1] for line in reader.seen[2:-1]] == [str(n) for n in range(1, 61)]
        expected = []
        for meta in j.list_sessions():
            whole = hashlib.sha256()
            for event in j.replay(meta.session_id):
                whole.update(f"{event.ordinal}:{event.position}:".encode() + event.data)
            expected.append(
                f"session {meta.session_id} {meta.state.value} {meta.first_ordinal} "
                f"{meta.last_ordinal} {whole.hexdigest()[:16]}"
            )
    make_readable_only(store)
    reader = Child("ro_read", str(store), env=shared_key)
    assert reader.wait(60) == 0, reader.err()
    assert reader.seen == [*expected, "left behind []", "done"]
    assert expected[1].split()[1:5] == ["trimmed", "open", "31", "60"]


def test_readonly_open_without_a_readable_key_raises_key_ring_error(
    public_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JOURNAL_CURSOR_KEY", raising=False)
    monkeypatch.delenv("JOURNAL_CURSOR_KEY_FILE", raising=False)
    store = public_dir / "store"
    with Journal.open(store, durability="os") as j:  # the key ring goes to STORE/keys (0600)
        j.create_session("s")
    make_readable_only(store)
    os.chmod(store / "keys", 0o600)
    before = tree(store)
    # An unprivileged reader cannot read STORE/keys and has no JOURNAL_CURSOR_KEY.
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOURNAL_CURSOR_KEY")}
    reader = Child("ro_open", str(store), env=env)
    assert reader.wait(60) == 0, reader.err()
    assert reader.seen == ["error KeyRingError KEYRING_INVALID"]
    # Given the key through the environment, the same reader opens the store.
    with_key = Child("ro_open", str(store), env={**env, "JOURNAL_CURSOR_KEY": KEY})
    assert with_key.wait(60) == 0, with_key.err()
    assert with_key.seen == ["opened"]
    assert tree(store) == before
    # Or given read access to STORE/keys.
    os.chmod(store / "keys", 0o644)
    readable = Child("ro_open", str(store), env=env)
    assert readable.wait(60) == 0, readable.err()
    assert readable.seen == ["opened"]


def test_readonly_open_of_a_store_with_an_external_key_needs_that_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    monkeypatch.setenv("JOURNAL_CURSOR_KEY", KEY)
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
        cursor = j.append("s", [EventIn(type="m", data=b"x")]).cursor
    assert not (store / "keys").exists()
    monkeypatch.delenv("JOURNAL_CURSOR_KEY")
    with pytest.raises(KeyRingError) as info:
        Journal.open(store, readonly=True)
    assert info.value.code == "KEYRING_INVALID"
    assert "JOURNAL_CURSOR_KEY" in str(info.value)
    assert not (store / "keys").exists()
    monkeypatch.setenv("JOURNAL_CURSOR_KEY", KEY)
    with Journal.open(store, readonly=True) as j:
        assert j.read("s", cursor=cursor).events == []


def test_a_read_only_open_of_a_missing_store_says_it_does_not_create_one(tmp_path: Path) -> None:
    """Found by a runtime-author trial: `Journal.open(path, readonly=True, create=True)`
    of a missing store answered "create it with `journal init` or Journal.open(path,
    create=True)", the call just made; a read-only open never creates (SPEC 10)."""
    for create in (True, False):
        with pytest.raises(StoreNotFound) as missing:
            Journal.open(tmp_path / "store", readonly=True, create=create)
        assert "a read-only journal does not create one" in str(missing.value)
        assert "create=True" not in str(missing.value)
    assert os.listdir(tmp_path) == []
    with pytest.raises(StoreNotFound, match=r"Journal\.open\(path, create=True\)"):
        Journal.open(tmp_path / "store", create=False)


def test_every_write_on_a_readonly_journal_raises_read_only_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
        j.create_session("t")
        j.append("s", [EventIn(type="m", data=b"one"), EventIn(type="m", data=b"two")])
    before = tree(store)
    with Journal.open(store, readonly=True) as j:
        writes = [
            lambda: j.create_session("new"),
            lambda: j.append("s", [EventIn(type="m", data=b"x")]),
            lambda: j.suspend_session("s"),
            lambda: j.resume_session("s"),
            lambda: j.resolve_session("s"),
            lambda: j.cancel_session("s"),
            lambda: j.expire_due(now_ms=1 << 50),
            lambda: j.compact_session("s", 1, b"snap"),
            lambda: j.apply_retention(now_ms=1 << 50),
            lambda: j.compact(),
            lambda: j.verify(fix=True),
        ]
        for write in writes:
            with pytest.raises(ReadOnlyStore) as info:
                write()
            assert (info.value.code, info.value.status) == ("READ_ONLY", "FAILED_PRECONDITION")
        # Reads still work and nothing changed.
        assert [e.data for e in j.replay("s")] == [b"one", b"two"]
        assert j.get_session("s").state is SessionState.OPEN
        assert [m.session_id for m in j.list_sessions()] == ["s", "t"]
        assert j.snapshot("s") is None
        assert j.verify().ok
    after = tree(store)
    # The shared view's LMDB lock file may record a reader; the log and the rest may not move.
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    assert [p for p in changed if not p.startswith("index")] == [], changed
    with Journal.open(store) as j:
        assert j.get_session("s").last_ordinal == 2
        assert j.snapshot("s") is None


_LEFT_OPEN = """
import os, sys, tempfile
from pathlib import Path
from journal import EventIn, Journal
store, scratch = sys.argv[1], Path(sys.argv[2])
tempfile.tempdir = str(scratch)
writer = Journal.open(store, durability="os")
writer.append("s", [EventIn("m", b"x")], create=True)
reader = Journal.open(store, readonly=True)  # (the writer holds the view: a private one)
assert [e.ordinal for e in reader.replay("s")] == [1]
(private,) = scratch.glob("journal-readonly-*")
child = os.fork()
if child == 0:
    sys.exit(0)  # (its exit must leave its parent's private view alone)
os.waitpid(child, 0)
assert private.is_dir(), "a forked child's exit removed its parent's private view"
print("left open", flush=True)
"""  # and exits with both journals open


def test_a_read_only_journal_left_open_at_exit_leaves_no_private_view_behind(
    tmp_path: Path,
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", _LEFT_OPEN, str(tmp_path / "store"), str(scratch)],
        cwd=Path(__file__).resolve().parent.parent,  # (this checkout's `journal`)
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout == "left open\n", result.stderr
    assert list(scratch.iterdir()) == []


def _tiny(j: Journal, session_id: str, count: int) -> int:
    """Appends `count` events of 1,000 bytes one by one (each its own frame); the last
    ordinal."""
    last = 0
    for _ in range(count):
        last = j.append(session_id, [EventIn("m", b"x" * 1000)]).last_ordinal
    return last


def test_a_private_view_follows_the_log_when_the_segment_after_its_head_was_deleted(
    tmp_path: Path,
) -> None:
    """A reader's private view probes the segment its head is in and then looked only for
    the segment starting at its next position: when retention had deleted that one (every
    event in it trimmed) before the reader looked again, the reader found "no change" at
    every refresh and never saw another commit (found by a long-running trial)."""
    with Journal.open(tmp_path / "store", segment_bytes=4096, durability="os") as writer:
        writer.create_session("a")
        reader, engine = read_only(tmp_path / "store")
        with reader:
            assert engine.private_dir is not None
            _tiny(writer, "a", 3)  # (segment 1 holds no more: the next append seals it)
            assert reader.get_session("a").last_ordinal == 3  # (its head: segment 1's end)
            last = _tiny(writer, "a", 10)  # (in segments after it, sealed but the last)
            writer.compact_session("a", last, b"snapshot")
            deleted = writer.apply_retention().deleted_segments
            assert deleted and all(not name.startswith("0" * 19 + "1.") for name in deleted)
            assert reader.get_session("a").first_ordinal == last + 1
            writer.append("a", [EventIn("m", b"after")])
            assert [e.data for e in reader.replay("a")] == [b"after"]


# A read-only journal with a private view projects segment files that a writer may delete
# (retention) or replace (compaction) right after the reader listed them. The reader took
# the error for its own: its open, or any call that refreshed the view, raised
# StoreUnavailable "No such file or directory" (found by a long-running trial: `journal
# watch` and `journal sessions show` beside a writer under a retention window).


class _OnFirstSegment(FileOps):
    """Runs `before_first` (once armed) when a projection opens its first segment, after
    it listed them (the fault point "projection.segment"); `opened`: the bases opened."""

    def __init__(self) -> None:
        self.before_first: Callable[[], None] | None = None
        self.opened: list[int] = []

    def point(self, name: str, detail: object = None) -> None:
        assert name in FAULT_POINTS, name
        if name != "projection.segment" or self.before_first is None:
            return
        if not self.opened:
            self.before_first()
        assert isinstance(detail, int)
        self.opened.append(detail)


def test_a_private_view_refresh_goes_on_when_the_writer_deletes_a_segment_it_listed(
    tmp_path: Path,
) -> None:
    with Journal.open(tmp_path / "store", segment_bytes=4096, durability="os") as writer:
        writer.create_session("a")
        writer.create_session("b")
        # (The writer holds the store's view in this process: the reader's is private.)
        ops = _OnFirstSegment()
        reader, engine = read_only(tmp_path / "store", ops)
        with reader:
            assert engine.private_dir is not None
            last = _tiny(writer, "a", 30)  # (sealed segments the reader has not seen)

            def trim_and_delete() -> None:
                writer.compact_session("a", last, b"snapshot")
                assert writer.apply_retention().deleted_segments

            ops.before_first = trim_and_delete
            assert reader.get_session("a").first_ordinal == last + 1
            assert ops.opened
            assert list(reader.replay("a")) == []
            assert reader.verify().ok


def test_a_private_view_build_goes_on_when_the_writer_deletes_a_segment_it_listed(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    with Journal.open(store, segment_bytes=4096, durability="os") as writer:
        writer.create_session("a")
        last = _tiny(writer, "a", 20)
        # A sealed segment without its sidecar (a writer crashed while sealing it): the
        # build reads it and every segment after it.
        (store / "segments" / ("0" * 19 + "1.idx")).unlink()

        def trim_and_delete() -> None:
            writer.compact_session("a", last, b"snapshot")
            assert writer.apply_retention().deleted_segments

        ops = _OnFirstSegment()
        ops.before_first = trim_and_delete
        reader, engine = read_only(store, ops)
        with reader:
            assert engine.private_dir is not None
            assert len(ops.opened) >= 2
            assert reader.get_session("a").first_ordinal == last + 1
            problems = reader.verify().problems  # (only the sidecar removed above)
            assert [p.what for p in problems] == ["sidecar missing or bad"], problems


def test_a_private_view_reader_whose_next_page_was_deleted_gets_cursor_expired(
    tmp_path: Path,
) -> None:
    """A page read retries on a fresh snapshot when the frame it points at was deleted;
    a private view's fresh snapshot did not know of the trim until the view was refreshed,
    so the replay raised `JournalCorrupt` ("points at ..., which does not exist") instead
    of the documented `CursorExpired` (found by a long-running trial)."""
    with Journal.open(tmp_path / "store", segment_bytes=4096, durability="os") as writer:
        writer.create_session("a")
        _tiny(writer, "a", 20)
        reader, engine = read_only(tmp_path / "store")
        with reader:
            assert engine.private_dir is not None
            replay = reader.replay("a", max_bytes=1)  # (a page per event)
            assert next(replay).ordinal == 1
            writer.compact_session("a", 10, b"snapshot")
            assert writer.apply_retention().deleted_segments
            with pytest.raises(CursorExpired) as expired:
                for _ in replay:
                    pass
            assert expired.value.earliest_ordinal == 11


def test_a_read_only_journal_beside_a_writer_in_one_process_keeps_the_views_locks(
    tmp_path: Path,
) -> None:
    """LMDB's locks are fcntl locks, which a process loses on any close of a descriptor of
    the lock file. Opening a read-only journal in a process that has the store open for
    writing opened and closed `index/lock.mdb` before LMDB refused the second open (the
    reader then uses a private view): the writer's process lost its locks, so the next
    process to open the view took it for unused and reinitialized the lock file, wiping
    the reader slot of the writer's read in progress (pages it still read could be reused;
    a long-running trial saw `verify()` fail with lmdb.BadDbiError)."""
    store = tmp_path / "store"
    writer_engine = LocalEngine.open(str(store), LocalOptions(durability="os"))
    with Journal.over(writer_engine) as writer:
        writer.create_session("a")
        reader, engine = read_only(store)
        with reader:
            assert engine.private_dir is not None
        view = writer_engine.view
        with view.begin():  # a read in progress, as verify() holds one
            result = subprocess.run(
                [sys.executable, "-c", _OPEN_READ_ONLY, str(store)],
                cwd=Path(__file__).resolve().parent.parent,  # (this checkout's `journal`)
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert result.returncode == 0, result.stderr
            assert f" {os.getpid()} " in f" {view.env.readers()} ", view.env.readers()
        assert writer.verify().ok


_OPEN_READ_ONLY = """
import sys
from journal import Journal
from journal._local.engine import LocalEngine, LocalOptions
engine = LocalEngine.open(sys.argv[1], LocalOptions(readonly=True))
with Journal.over(engine) as reader:
    assert engine.private_dir is None  # (the store's view)
    reader.get_session("a")
"""


def test_a_writable_open_beside_a_read_only_journal_leaves_its_damaged_view_alone(
    tmp_path: Path,
) -> None:
    """A writable open replaces a damaged view (opening its lock file to take LMDB's
    writer lock first): in a process whose read-only journal has that view open, the
    close of that descriptor dropped the reader's fcntl locks, and the view directory was
    renamed from under it. Now refused before any file of the view is opened."""
    store = tmp_path / "store"
    with Journal.open(store, create=True) as writer:
        writer.create_session("a")
    with Journal.open(store, readonly=True) as reader:
        reader.get_session("a")
        index = store / "index"
        before = os.stat(index).st_ino
        data = index / "data.mdb"
        with open(data, "r+b") as f:  # every page past the two meta pages
            f.seek(2 * 4096)
            f.write(b"\xff" * (data.stat().st_size - 2 * 4096))
        with pytest.raises(StoreUnavailable, match="open already") as caught:
            Journal.open(store)
        # (The journal open is read-only: "use that journal" alone would not write.)
        assert "that one is read-only: to write, close it" in str(caught.value)
        assert os.stat(index).st_ino == before


def test_a_read_only_open_waits_for_a_writable_open_of_the_same_view_in_another_thread(
    tmp_path: Path,
) -> None:
    """Two threads of one process opening the store's view could both pass the check that
    it is not open here (the first had opened LMDB but not registered it yet): the second
    then opened and closed the view's lock file, dropping the first's fcntl locks. The
    check and the registration are one critical section now: the read-only open waits for
    the writable one, then finds the view open and reads through a private one.

    The writable open is held (by a profile function of its thread) as it registers the
    environment it opened, which is the window the second open must not get through."""
    from journal._local import lmdbenv

    store = tmp_path / "store"
    with Journal.open(store, create=True) as first:
        first.create_session("a")
    at_register = threading.Event()
    go_on = threading.Event()
    opened: list[Journal] = []
    failures: list[BaseException] = []

    def hold(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is lmdbenv.register_open.__code__:
            at_register.set()
            go_on.wait(30)

    def open_writable() -> None:
        sys.setprofile(hold)
        try:
            opened.append(Journal.open(store))
        except BaseException as e:  # (reported by the main thread)
            failures.append(e)
        finally:
            sys.setprofile(None)

    writer_thread = threading.Thread(target=open_writable)
    writer_thread.start()
    try:
        assert at_register.wait(30), "the writable open never reached its registration"
        reader_result: list[object] = []

        def open_read_only() -> None:
            try:
                with Journal.open(store, readonly=True) as reader:
                    reader_result.append(reader.get_session("a").session_id)
            except BaseException as e:
                reader_result.append(e)

        reader_thread = threading.Thread(target=open_read_only)
        reader_thread.start()
        reader_thread.join(0.5)
        # The check is taken only with the registration: the reader waits for it.
        assert reader_thread.is_alive() and not reader_result, reader_result
    finally:
        go_on.set()
        writer_thread.join(30)
    reader_thread.join(30)
    assert not failures, failures
    assert reader_result == ["a"]
    with opened[0] as writer:
        writer.append("a", [EventIn("m", b"after")])
        assert writer.verify().ok


_HOLDS_A_PRIVATE_VIEW = """
import json, sys, tempfile, time
from pathlib import Path
from journal import EventIn, Journal
store, scratch = sys.argv[1], Path(sys.argv[2])
tempfile.tempdir = str(scratch)
writer = Journal.open(store, durability="os")
writer.append("s", [EventIn("m", b"x")], create=True)
reader = Journal.open(store, readonly=True)  # (the writer holds the view: a private one)
assert [e.data for e in reader.replay("s")][-1:] == [b"x"]
print(json.dumps(sorted(p.name for p in scratch.glob("journal-readonly-*"))), flush=True)
time.sleep(60)
"""


def test_a_private_view_a_killed_reader_left_is_removed_by_the_next_one(tmp_path: Path) -> None:
    # Before: every reader SIGKILLed (or killed by the OOM killer) while it read through a
    # private view left its directory (an LMDB view, 400 KB to 2.5 MB seen) in the
    # temporary directory for good; a supervisor restarting such readers filled /tmp.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    store = str(tmp_path / "store")
    stranger = scratch / "journal-readonly-not-a-view"  # (no holder file: never touched)
    stranger.mkdir()
    (stranger / "keep").write_text("mine")

    def start() -> tuple[subprocess.Popen[str], set[str]]:
        process = subprocess.Popen(
            [sys.executable, "-c", _HOLDS_A_PRIVATE_VIEW, store, str(scratch)],
            cwd=Path(__file__).resolve().parent.parent,  # (this checkout's `journal`)
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, "the reader did not start"
        return process, set(json.loads(line))

    killed, first = start()
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    (left,) = first - {stranger.name}
    assert (scratch / left).is_dir()
    alive, second = start()
    try:
        assert left not in second, "the killed reader's private view is still there"
        (mine,) = second - {stranger.name}
        live, third = start()  # a live reader's private view is never removed
        try:
            assert mine in third and len(third - {stranger.name}) == 2
        finally:
            live.kill()
            live.wait()
    finally:
        alive.kill()
        alive.wait()
    assert (stranger / "keep").read_text() == "mine"


_DIES_IN_A_READ_TRANSACTION = """
import sys, time, lmdb
env = lmdb.open(sys.argv[1], readonly=True, lock=True, max_dbs=16, max_readers=1024)
txn = env.begin()  # (a reader of the view, killed before its read transaction ends)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_reader_killed_inside_a_read_transaction_does_not_make_the_view_grow(
    tmp_path: Path,
) -> None:
    # Before: the dead process's LMDB reader slot stayed, holding its snapshot, so LMDB
    # reused no page freed after it and index/data.mdb grew by every commit's copied pages
    # for good (found by a soak: a read-only watcher SIGKILLed every 30 s; the writer's
    # view grew to 1.7 GB in 4 minutes, its RSS with it; 32 KiB per append here).
    store = tmp_path / "store"
    data = store / "index" / "data.mdb"
    with Journal.open(store, durability="os") as j:

        def churn(count: int) -> int:
            before = data.stat().st_size
            for _ in range(count):
                j.append("s", [EventIn("m", b"x" * 100)], create=True)
            return data.stat().st_size - before

        churn(500)
        process = subprocess.Popen(
            [sys.executable, "-c", _DIES_IN_A_READ_TRANSACTION, str(store / "index")],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        process.send_signal(signal.SIGKILL)
        process.wait()
        time.sleep(1.1)  # (dead readers are looked for at most once a second)
        grown = churn(2000)
        assert grown < 4 << 20, f"the view grew by {grown >> 10} KiB over 2000 appends"


def test_a_read_only_journal_refuses_a_lost_segment_its_stale_view_still_places(
    tmp_path: Path,
) -> None:
    """A writer killed between a frame's sync and its view commit leaves the view behind
    the log (modelled by putting back a copy of `index/` taken before the last append);
    a read-only journal then projects a private view from the log, which cannot tell a
    lost segment from trimmed history: until 2026-12-05 `verify` passed and a read from
    the start began after the lost events (an operator trial). The stale view still
    places frames in the lost segment: the read-only open is `JournalCorrupt` naming
    it, and a writer's `verify` reports it."""
    store = tmp_path / "store"
    with Journal.open(store, durability="os", segment_bytes=SEGMENT_BYTES) as j:
        j.create_session("s")
        for _ in range(60):
            j.append("s", [EventIn("m", b"x" * 700)])
    shutil.copytree(store / "index", tmp_path / "index-before")
    with Journal.open(store, durability="os", segment_bytes=SEGMENT_BYTES) as j:
        j.append("s", [EventIn("m", b"last")])
    shutil.rmtree(store / "index")
    shutil.copytree(tmp_path / "index-before", store / "index")
    with Journal.open(store, readonly=True) as reader:  # (stale: a private view, whole)
        assert [e.ordinal for e in reader.replay("s")] == list(range(1, 62))
    sealed = sorted(p for p in (store / "segments").iterdir() if p.name.endswith(".seg"))
    lost = sealed[1]
    lost.unlink()
    with pytest.raises(JournalCorrupt, match=r"missing: the index places \d+ frame") as raised:
        Journal.open(store, readonly=True)
    assert raised.value.segment == lost.name
    with Journal.open(store, durability="os") as writer:  # (keeps the view: reports it)
        assert [p.segment for p in writer.verify().problems] == [lost.name]
