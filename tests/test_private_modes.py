"""Private by default (issue 11, item 6): every file and directory a store creates has the
store's file mode (0600, directories 0700, unless the store was created or opened with
`file_mode=`), whatever the umask; the mode is recorded in store.json; older stores keep
the mode they were set up with; a store shared with a group per the documented recipe is
readable by that group's reader (a real process as another user); the key ring file has
a checksum, so a damaged one is reported instead of making every cursor foreign.

The tests run as root: modes are checked with os.stat, and the "other user" is a child
process that drops to uid/gid 65534.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from _procs_retention import NOBODY, Child
from click.testing import CliRunner

from cli.main import main
from cursors import KeyRing
from journal import (
    EventIn,
    InvalidArgument,
    Journal,
    KeyRingError,
    RetentionPolicy,
    StoreIncompatible,
    StoreUnavailable,
)


def directory_mode(file_mode: int) -> int:
    return file_mode | (file_mode & 0o444) >> 2


def modes(store: Path) -> dict[str, int]:
    """Every path of the store (the store itself as "."): its permission bits."""
    found = {".": stat.S_IMODE(store.stat().st_mode)}
    for directory, dirs, files in os.walk(store):
        for name in dirs + files:
            path = os.path.join(directory, name)
            found[os.path.relpath(path, store)] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


def wrong_modes(store: Path, file_mode: int) -> dict[str, str]:
    """Paths whose mode is not the store's (files) or its directory mode (directories)."""
    wrong = {}
    for relative, mode in modes(store).items():
        is_dir = (store / relative).is_dir()
        expected = directory_mode(file_mode) if is_dir else file_mode
        if mode != expected:
            wrong[relative] = f"{mode:04o} (expected {expected:04o})"
    return wrong


@pytest.fixture
def umask() -> Iterator[object]:
    """Restore the process umask after a test that sets it."""
    old = os.umask(0o022)
    os.umask(old)
    yield None
    os.umask(old)


def _append(j: Journal, session_id: str, count: int, size: int = 400) -> None:
    for _ in range(count):
        j.append(session_id, [EventIn(type="m", data=b"x" * size)])


@pytest.mark.parametrize("file_mode", [None, 0o640])
@pytest.mark.parametrize("process_umask", [0o022, 0o000])
def test_every_file_and_directory_of_a_store_gets_the_store_mode_whatever_the_umask(
    tmp_path: Path, umask: object, process_umask: int, file_mode: int | None
) -> None:
    os.umask(process_umask)
    store = tmp_path / "store"
    archive = tmp_path / "all.sja"
    policy = RetentionPolicy(session_retention_ms=1)
    chosen = {} if file_mode is None else {"file_mode": file_mode}
    with Journal.open(store, segment_bytes=4096, retention=policy, **chosen) as j:
        j.create_session("a")
        _append(j, "a", 25)  # rotates: sealed segments and their sidecars
        with j.own("a") as owner, owner.turn("r1") as turn:  # a lease lock file
            turn.append([EventIn(type="m", data=b"in a turn")])
            # (It exists while the lease is held: releasing removes it, SPEC 7.8.)
            held = [p for p in (store / "locks").iterdir() if p.name.startswith("owner-")]
            assert len(held) == 1
            assert stat.S_IMODE(held[0].stat().st_mode) == (file_mode or 0o600)
        assert [p.name for p in (store / "locks").iterdir()] == ["open.lock"]
        j.compact_session("a", 10, b"snapshot")
        j.create_session("gone")
        _append(j, "gone", 12)
        ended = j.resolve_session("gone").ended_at_ms
        assert ended is not None
        report = j.apply_retention(now_ms=ended + 1000)  # evicts, deletes dead segments
        assert report.evicted_sessions == ["gone"] and report.deleted_segments
        j.compact()  # compacted copies (.seg.zst) swapped in
        j.export_sessions(["a"], archive)
        j.import_sessions(archive, rename={"a": "a-copy"})  # staged, then committed
        # (A day's ttl: the expiry thread must not expire it first.)
        j.create_session("short", ttl_ms=86_400_000)
        assert [m.session_id for m in j.expire_due(now_ms=ended + 10**9)] == ["short"]
    # Later opens without file_mode follow the recorded mode: compressed seals, and the
    # sidecar verify(fix=True) rewrites. (The default policy is recorded again: the one
    # above evicts "short" a millisecond after it expired.)
    with Journal.open(
        store, segment_bytes=4096, compress_sealed=True, retention=RetentionPolicy()
    ) as j:
        _append(j, "a", 15)
        sidecar = sorted((store / "segments").glob("*.idx"))[-1]
        sidecar.unlink()
        report = j.verify(fix=True)
        assert report.problems and report.fixed  # reported the missing sidecar, wrote it
        assert sidecar.exists()
    # A view from before a reboot is moved aside and rebuilt (new LMDB files).
    (store / "view-boot").write_bytes(b"another boot")
    os.chmod(store / "view-boot", 0o600 if file_mode is None else file_mode)
    with Journal.open(store) as j:
        assert j.verify().ok
        assert [m.session_id for m in j.list_sessions()] == ["a", "a-copy", "short"]
    names = set(modes(store))
    for expected in (
        "keys",
        "store.json",
        "view-boot",
        "index/data.mdb",
        "index/lock.mdb",
        "locks/open.lock",
        "segments/.files.lock",
    ):
        assert expected in names
    assert any(n.endswith(".seg.zst") for n in names)
    assert any(n.endswith(".idx") for n in names)
    assert not any(n.endswith(".tmp") for n in names)
    assert wrong_modes(store, 0o600 if file_mode is None else file_mode) == {}
    recorded = json.loads((store / "store.json").read_text())["file_mode"]
    assert recorded == ("0600" if file_mode is None else "0640")


def test_file_mode_is_validated_before_anything_is_created(tmp_path: Path) -> None:
    store = tmp_path / "store"
    for bad in ("0640", 416.0, True, object(), -1, 0o1640, 2**70, 0o400, 0o200, 0o700):
        with pytest.raises(InvalidArgument) as info:
            Journal.open(store, file_mode=bad)  # type: ignore[arg-type]
        assert "file_mode" in str(info.value)
        assert not store.exists()
    with pytest.raises(InvalidArgument, match="execute bits"):
        Journal.open(store, file_mode=0o750)
    with pytest.raises(InvalidArgument, match="owner read and write"):
        Journal.open(store, file_mode=0o440)
    with Journal.open(store):
        pass
    with pytest.raises(InvalidArgument, match="read-only"):
        Journal.open(store, readonly=True, file_mode=0o600)


# The keywords of `Journal.open` that would change the store, with a value (a read-only
# journal records and creates nothing).
_WRITER_ONLY = [
    ("retention", RetentionPolicy(max_history_bytes=10)),
    ("file_mode", 0o640),
]


@pytest.mark.parametrize(("keyword", "value"), _WRITER_ONLY, ids=[k for k, _ in _WRITER_ONLY])
def test_a_read_only_open_refuses_the_keywords_that_would_change_the_store(
    tmp_path: Path, keyword: str, value: object
) -> None:
    """Until 2026-12-07 only `file_mode` and `repair` were refused: `retention` was
    accepted and ignored (a reader given a policy recorded nothing, silently: a new-user
    trial)."""
    store = tmp_path / "store"
    with Journal.open(store, retention=RetentionPolicy(max_history_bytes=None)):
        pass
    before = modes(store), (store / "store.json").read_bytes()
    missing = tmp_path / "missing"
    # (A nats:// store is refused before any server is asked: nothing listens on port 1.)
    for path in (store, missing, "nats://127.0.0.1:1/agents"):
        with pytest.raises(InvalidArgument) as refused:
            Journal.open(path, readonly=True, **{keyword: value})  # type: ignore[arg-type]
        message = str(refused.value)
        assert message.startswith(f"{keyword} is for journals that write"), message
        assert "without readonly=True" in message, message
    assert (modes(store), (store / "store.json").read_bytes()) == before
    assert not missing.exists()
    Journal.open(store, **{keyword: value}).close()  # type: ignore[arg-type]


def test_a_read_only_open_takes_how_a_writer_writes_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """`durability`, `segment_bytes` and `compress_sealed` say how a writer writes: a
    reader takes them (one set of options for a store's writers and readers) and writes
    nothing."""
    store = tmp_path / "store"
    with Journal.open(store) as j:
        j.create_session("s")
        _append(j, "s", 3)
    before = modes(store), (store / "store.json").read_bytes()
    with Journal.open(
        store, readonly=True, durability="os", segment_bytes=4096, compress_sealed=True
    ) as j:
        assert [e.ordinal for e in j.replay("s")] == [1, 2, 3]
    assert (modes(store), (store / "store.json").read_bytes()) == before


def test_a_store_from_before_recorded_modes_keeps_its_mode_until_one_is_given(
    tmp_path: Path, umask: object
) -> None:
    # An older store: store.json without file_mode, files made under umask 022.
    store = tmp_path / "store"
    with Journal.open(store, segment_bytes=4096) as j:
        j.create_session("s")
        _append(j, "s", 3)
    document = json.loads((store / "store.json").read_text())
    document.pop("file_mode", None)
    (store / "store.json").write_text(json.dumps(document))
    for directory, _, files in os.walk(store):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)
    before = modes(store)
    # Opened under a strict umask: new files still get the mode the store was made with
    # (readers set up for it keep working), and nothing existing is changed.
    os.umask(0o077)
    with Journal.open(store, segment_bytes=4096) as j:
        _append(j, "s", 12)  # new segments and sidecars
    after = modes(store)
    assert {p: m for p, m in after.items() if p in before} == before
    assert len(after) > len(before)
    assert wrong_modes(store, 0o644) == {}
    assert "file_mode" not in json.loads((store / "store.json").read_text())
    # Given a mode, the store records it (store.json replaced with that mode); files made
    # from then on get it; files made before keep theirs.
    with Journal.open(store, segment_bytes=4096, file_mode=0o600) as j:
        _append(j, "s", 12)
    final = modes(store)
    assert final["store.json"] == 0o600
    assert json.loads((store / "store.json").read_text())["file_mode"] == "0600"
    new = {p: m for p, m in final.items() if p not in after}
    assert new and set(new.values()) == {0o600}, new
    assert {p: m for p, m in final.items() if p in after and p != "store.json"} == {
        p: m for p, m in after.items() if p != "store.json"
    }


def test_a_damaged_file_mode_in_store_json_is_reported(tmp_path: Path) -> None:
    store = tmp_path / "store"
    Journal.open(store).close()
    document = json.loads((store / "store.json").read_text())
    for bad in ("0750", "rw-------", 384, "06000"):
        document["file_mode"] = bad
        (store / "store.json").write_text(json.dumps(document))
        with pytest.raises(StoreIncompatible, match="file_mode"):
            Journal.open(store)


def test_cli_init_takes_the_file_mode(tmp_path: Path, umask: object) -> None:
    os.umask(0o022)
    private, shared = tmp_path / "private", tmp_path / "shared"
    runner = CliRunner()
    result = runner.invoke(main, ["--store", str(private), "init"])
    assert result.exit_code == 0, result.output
    assert wrong_modes(private, 0o600) == {}
    result = runner.invoke(main, ["--store", str(shared), "init", "--file-mode", "0640"])
    assert result.exit_code == 0, result.output
    assert wrong_modes(shared, 0o640) == {}
    result = runner.invoke(main, ["--store", str(shared), "append", "-s", "x", "--create", "1"])
    assert result.exit_code == 0, result.output
    assert wrong_modes(shared, 0o640) == {}
    for bad, code in (("abc", 2), ("0680", 2), ("0750", 4), ("0400", 4)):
        result = runner.invoke(
            main, ["--store", str(tmp_path / "other"), "init", "--file-mode", bad]
        )
        assert result.exit_code == code, (bad, result.output)
        assert "Traceback" not in result.output
        assert not (tmp_path / "other").exists()
    # Given for an existing store: recorded for files made from then on.
    result = runner.invoke(main, ["--store", str(private), "init", "--file-mode", "0640"])
    assert result.exit_code == 0, result.output
    assert json.loads((private / "store.json").read_text())["file_mode"] == "0640"


# -- a store and another user ------------------------------------------------------------


def _without_external_key() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("JOURNAL_CURSOR_KEY")}


def test_another_user_cannot_open_a_private_store(
    public_dir: Path, monkeypatch: pytest.MonkeyPatch, umask: object
) -> None:
    assert os.geteuid() == 0, "this test runs a child as uid 65534: run it as root"
    monkeypatch.delenv("JOURNAL_CURSOR_KEY", raising=False)
    monkeypatch.delenv("JOURNAL_CURSOR_KEY_FILE", raising=False)
    os.umask(0o022)
    store = public_dir / "store"
    with Journal.open(store) as j:
        j.create_session("secret")
        j.append("secret", [EventIn(type="m", data=b"agent conversation")])
    reader = Child("ro_open", str(store), env=_without_external_key())
    assert reader.wait(60) == 0, reader.err()
    assert reader.seen == ["error StoreUnavailable STORE_UNAVAILABLE"]


def test_a_store_shared_with_a_group_by_the_documented_recipe_is_readable_by_it(
    public_dir: Path, monkeypatch: pytest.MonkeyPatch, umask: object
) -> None:
    assert os.geteuid() == 0, "this test runs a child as uid 65534: run it as root"
    monkeypatch.delenv("JOURNAL_CURSOR_KEY", raising=False)
    monkeypatch.delenv("JOURNAL_CURSOR_KEY_FILE", raising=False)
    os.umask(0o077)  # a strict umask does not narrow the store's mode
    # The recipe (SPEC.md "Private files"): the store directory belongs to the readers'
    # group with the setgid bit, then the store is created with a group file mode.
    store = public_dir / "store"
    store.mkdir()
    os.chown(store, 0, NOBODY)
    os.chmod(store, 0o2750)
    with Journal.open(store, segment_bytes=4096, file_mode=0o640) as j:
        j.create_session("shared")
        _append(j, "shared", 20)  # several segments, sidecars, the key file
        last = j.get_session("shared").last_ordinal
    for directory, dirs, files in os.walk(store):
        for name in [*dirs, *files, "."]:
            st = os.lstat(os.path.join(directory, name))
            assert st.st_gid == NOBODY, (directory, name)
            if stat.S_ISDIR(st.st_mode):
                assert stat.S_IMODE(st.st_mode) == 0o2750, (directory, name)
            else:
                assert stat.S_IMODE(st.st_mode) == 0o640, (directory, name)
    # The group's reader reads the key file and every segment; it cannot write the LMDB
    # lock file, so it builds a private view (removed when it closes).
    reader = Child("ro_read", str(store), env=_without_external_key())
    assert reader.wait(60) == 0, reader.err()
    assert reader.seen[0].startswith(f"session shared open 1 {last} ")
    assert reader.seen[1:] == ["left behind []", "done"]
    # Writing is refused with advice for a reader, not the advice to share the store.
    writer = Child("rw_open", str(store), env=_without_external_key())
    assert writer.wait(60) == 0, writer.err()
    (line,) = writer.seen
    assert line.startswith("error StoreUnavailable STORE_UNAVAILABLE 13 "), line
    assert "readonly=True" in line and "chgrp" not in line, line


def test_an_index_its_own_user_may_not_write_names_the_os_error_and_what_to_do(
    public_dir: Path, monkeypatch: pytest.MonkeyPatch, umask: object
) -> None:
    """A store of the user whose `index/data.mdb` that user may not write (made read-only
    by hand, or restored so): a writable open said "cannot open the index ...: Permission
    denied" with `errno` None and no advice, where a read-only segment file gave errno 13
    and said what to fix (until 2026-12-06: LMDB's text was not taken for the OS error it
    reports; a new user's trial)."""
    assert os.geteuid() == 0, "this test runs a child as uid 65534: run it as root"
    monkeypatch.delenv("JOURNAL_CURSOR_KEY", raising=False)
    monkeypatch.delenv("JOURNAL_CURSOR_KEY_FILE", raising=False)
    store = public_dir / "store"
    with Journal.open(store) as j:
        j.append("s", [EventIn(type="m", data=b"x")], create=True)
    for directory, dirs, files in os.walk(store):
        for name in [*dirs, *files, "."]:
            os.chown(os.path.join(directory, name), NOBODY, NOBODY)
    os.chmod(store / "index" / "data.mdb", 0o400)
    writer = Child("rw_open", str(store), env=_without_external_key())
    assert writer.wait(60) == 0, writer.err()
    (line,) = writer.seen
    assert line.startswith(f"error StoreUnavailable STORE_UNAVAILABLE {errno.EACCES} "), line
    assert "Permission denied" in line and "index" in line, line
    assert "chmod -R u+rwX" in line and "readonly=True" not in line, line  # (its own store)


# -- the key ring file -------------------------------------------------------------------


def test_a_flipped_bit_anywhere_in_the_key_file_is_reported_or_harmless(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    ring = KeyRing.generate()
    ring.rotate()
    ring.save(path)
    data = path.read_bytes()
    secrets = {key_id: ring.secret(key_id) for key_id in ring.key_ids}
    damaged = tried = 0
    for index in range(len(data)):
        for bit in {0, index % 8}:
            tried += 1
            flipped = bytearray(data)
            flipped[index] ^= 1 << bit
            path.write_bytes(bytes(flipped))
            try:
                loaded = KeyRing.load(path)
            except KeyRingError:
                damaged += 1
                continue
            # Only a flip that changed no key may load (e.g. in the checksum's name).
            assert loaded.active_key_id == ring.active_key_id, (index, bit)
            assert {k: loaded.secret(k) for k in loaded.key_ids} == secrets, (index, bit)
    assert damaged > tried * 0.9


def test_a_damaged_key_file_raises_key_ring_error_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JOURNAL_CURSOR_KEY", raising=False)
    monkeypatch.delenv("JOURNAL_CURSOR_KEY_FILE", raising=False)
    store = tmp_path / "store"
    Journal.open(store).close()
    keys = store / "keys"
    document = json.loads(keys.read_text())
    secret = document["keys"][0]["secret"]
    # One character of the secret changed: still valid base64url of 32 bytes.
    document["keys"][0]["secret"] = ("B" if secret[0] != "B" else "C") + secret[1:]
    keys.write_text(json.dumps(document))
    for readonly in (False, True):
        with pytest.raises(KeyRingError) as info:
            Journal.open(store, readonly=readonly)
        assert "damaged" in str(info.value) and "backup" in str(info.value)
    # A shared key in JOURNAL_CURSOR_KEY replaces the store's ring: still works.
    monkeypatch.setenv("JOURNAL_CURSOR_KEY", "6b" * 32)
    with Journal.open(store) as j:
        j.create_session("s")


def test_a_key_file_without_a_checksum_is_read_and_gets_one_when_saved(
    tmp_path: Path, umask: object
) -> None:
    path = tmp_path / "keys"
    ring = KeyRing.generate()
    ring.save(path)
    document = json.loads(path.read_text())
    assert "sha256" in document
    del document["sha256"]
    path.write_text(json.dumps(document))  # as written before the checksum
    loaded = KeyRing.load(path)
    assert loaded.secret(1) == ring.secret(1)
    loaded.rotate()
    os.umask(0o022)
    loaded.save(path, mode=0o640)
    assert "sha256" in json.loads(path.read_text())
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert KeyRing.load(path).key_ids == (1, 2)
    created = tmp_path / "created"
    KeyRing.load_or_create(created, mode=0o660)
    assert stat.S_IMODE(created.stat().st_mode) == 0o660
    for bad in (0o700, 0o400, True, "0600"):
        with pytest.raises(KeyRingError):
            KeyRing.load_or_create(tmp_path / "never", mode=bad)  # type: ignore[arg-type]
        assert not (tmp_path / "never").exists()


def test_a_decimal_file_mode_is_refused_with_the_octal_one_suggested(tmp_path: Path) -> None:
    """`file_mode=640` (decimal, 0o1200) used to be refused as "640 has bits outside
    0o777", with no hint that a mode is octal."""
    with pytest.raises(InvalidArgument, match=r"0o1200 .*did you mean 0o640\?"):
        Journal.open(tmp_path / "s", file_mode=640)
    assert not (tmp_path / "s").exists()


def test_a_write_as_another_user_to_a_private_store_is_refused_not_made_unopenable(
    tmp_path: Path,
) -> None:
    """`journal retention`, `cursor-key --rotate` or `compact` run as root on a store
    private to its service user left root's 0600 files there (`store.json`, `keys`,
    rewritten segments), and the service user could not open its store again (an
    operator trial, until 2026-12-05). A writable open as another user is refused
    (EPERM), naming the owner; a read-only one reads."""
    assert os.geteuid() == 0, "this test makes the store another user's: run it as root"
    store = tmp_path / "store"
    with Journal.open(store) as j:
        j.create_session("s")
    for directory, dirs, files in os.walk(store):
        for name in [*dirs, *files, "."]:
            os.chown(os.path.join(directory, name), NOBODY, NOBODY)
    before = {p: p.stat() for p in store.rglob("*")}
    with pytest.raises(StoreUnavailable, match=r"private to user .* \(uid 65534\)") as raised:
        Journal.open(store)
    assert raised.value.errno == errno.EPERM and "sudo -u" in str(raised.value)
    result = CliRunner().invoke(
        main, ["--store", str(store), "retention", "--max-history-bytes", "1000"]
    )
    assert result.exit_code == 9 and "private to user" in result.stderr, result.output
    result = CliRunner().invoke(main, ["--store", str(store), "cursor-key", "--rotate"])
    assert result.exit_code == 9 and "private to user 'nobody'" in result.stderr, result.output
    assert {p: p.stat() for p in store.rglob("*")} == before  # (nothing made or changed)
    with Journal.open(store, readonly=True) as reader:
        assert [m.session_id for m in reader.list_sessions()] == ["s"]
