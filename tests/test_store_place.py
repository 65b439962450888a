"""Where `Journal.open` (create=True, the default) and `journal init` create a store
(SPEC 7): an empty or new directory, or one whose creation was cut short; never among
other files, inside another store's directory, or at a path that is a file. Found by a
new-user trial: `journal --store ./src init` made the store's files among the user's
`.py` files, `--store STORE/index init` a store inside another store's view directory,
and `--store /etc/passwd sessions list` exited 7 ("data loss or other error")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _cli_runs import ROOT, json_error, run_cli

from journal import EventIn, InvalidArgument, Journal, StoreNotFound
from journal._local.files import FileOps


def tree(path: Path) -> dict[str, bytes | None]:
    """Every entry under `path`: a file's bytes, None for a directory."""
    found: dict[str, bytes | None] = {}
    for entry in sorted(path.rglob("*")):
        name = str(entry.relative_to(path))
        found[name] = None if entry.is_dir() else entry.read_bytes()
    return found


def filled_store(path: Path) -> Path:
    with Journal.open(path) as j:
        j.create_session("s")
        j.append("s", [EventIn("m", b"one")])
    return path


def test_a_directory_of_other_files_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.py").write_text("print('hello')\n")
    (src / "util.py").write_text("")
    (src / "pkg").mkdir()
    before = tree(src)
    for create in (None, True):  # (None: the default)
        with pytest.raises(InvalidArgument) as refused:
            Journal.open(src) if create is None else Journal.open(src, create=create)
        message = str(refused.value)
        assert "is not empty ('main.py', 'pkg', 'util.py')" in message, message
        assert "new directory" in message and "nothing was created" in message, message
    assert tree(src) == before
    # Not creating: there is no store there, as before.
    with pytest.raises(StoreNotFound):
        Journal.open(src, create=False)
    with pytest.raises(StoreNotFound):
        Journal.open(src, readonly=True)
    assert tree(src) == before
    # The CLI: exit 4 (invalid argument), the same message, nothing made.
    done = run_cli(src, "--format", "json", "init")
    assert done.returncode == 4, done.stderr
    assert json_error(done)["code"] == "INVALID_ARGUMENT"
    assert "is not empty" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert tree(src) == before


def test_many_other_files_are_named_three_and_counted(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"f{i}").write_text("")
    with pytest.raises(InvalidArgument, match=r"\('f0', 'f1', 'f2' and 2 more\)"):
        Journal.open(tmp_path)
    assert sorted(os.listdir(tmp_path)) == [f"f{i}" for i in range(5)]


@pytest.mark.parametrize(
    "place", ["index", "segments", "locks", "new", "segments/new", "index/a/b"]
)
def test_a_store_inside_another_stores_directory_is_refused(tmp_path: Path, place: str) -> None:
    """Inside a store's `index/` a new store's files would sit beside the LMDB files
    (and the outer writer moves `index/` aside and deletes it after a reboot); in
    `segments/` beside the log. Refused whether the directory exists or not."""
    outer = filled_store(tmp_path / "outer")
    before = {k: v for k, v in tree(outer).items() if not k.startswith("index")}
    inner = outer / place
    with pytest.raises(InvalidArgument) as refused:
        Journal.open(inner)
    message = str(refused.value)
    assert f"inside the journal store {str(outer)!r}" in message, message
    assert {k: v for k, v in tree(outer).items() if not k.startswith("index")} == before
    done = run_cli(inner, "init")
    assert done.returncode == 4 and "inside the journal store" in done.stderr, done.stderr
    with Journal.open(outer) as j:
        assert [e.data for e in j.replay("s")] == [b"one"]
        assert j.verify().ok


def test_a_store_json_of_another_program_above_does_not_count_as_a_store(
    tmp_path: Path,
) -> None:
    """`store.json` is a common name: a directory above whose `store.json` holds no
    store id is not a journal store, and a store may be created below it."""
    (tmp_path / "store.json").write_text(json.dumps({"name": "my-app", "version": 1}))
    with Journal.open(tmp_path / ".journal") as j:
        j.create_session("s")


@pytest.mark.parametrize("how", ["new", "new/deeper", "empty", "placeholders"])
def test_an_empty_or_new_directory_gets_a_store(tmp_path: Path, how: str) -> None:
    """Decided: git's placeholders (`.gitkeep`, `.keep`, `.gitignore`) and macOS Finder's
    `.DS_Store` do not count; any other dotfile does (`.git`: the test below)."""
    path = tmp_path / "s"
    if how == "empty":
        path.mkdir()
    elif how == "placeholders":
        path.mkdir()
        for name in (".gitkeep", ".keep", ".gitignore", ".DS_Store"):
            (path / name).write_text("")
    elif how == "new/deeper":
        path = path / "deeper"
    with Journal.open(path) as j:
        j.create_session("s")
    with Journal.open(path, create=False) as j:
        assert j.get_session("s").session_id == "s"
    with Journal.open(path, readonly=True) as j:
        assert j.get_session("s").session_id == "s"
    with Journal.open(path, create=True) as j:
        assert j.get_session("s").session_id == "s"


def test_a_directory_with_another_dotfile_is_refused(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    with pytest.raises(InvalidArgument, match=r"is not empty \('\.git'\)"):
        Journal.open(tmp_path)
    assert os.listdir(tmp_path) == [".git"]


def test_every_open_of_an_existing_store_works_with_placeholders_beside_it(
    tmp_path: Path,
) -> None:
    store = filled_store(tmp_path / "s")
    (store / ".gitignore").write_text("*\n")
    for options in ({}, {"create": False}, {"readonly": True}):
        with Journal.open(store, **options) as j:  # type: ignore[arg-type]
            assert [e.data for e in j.replay("s")] == [b"one"]


_KILLED_AT = """
import os, sys
from journal import Journal
from journal._local.files import FileOps

class KillAt(FileOps):
    def point(self, name, detail=None):
        if name == "store.create" and str(detail).startswith(sys.argv[2]):
            os._exit(9)

Journal.open(sys.argv[1], file_ops=KillAt())
sys.exit(3)  # (not reached: the point was passed over)
"""


@pytest.mark.parametrize("step", ["", "segments", "index", "locks", "store.json."])
def test_a_creation_killed_part_way_is_finished_by_the_next_open(tmp_path: Path, step: str) -> None:
    """A process killed while it created the store leaves some of the store's own
    directories and its temporary `store.json.<pid>.<thread>.tmp`, but no `store.json`:
    the next open (writable, in a directory that holds nothing else) finishes the
    creation and removes the dead process's temporary file."""
    path = tmp_path / "s"
    killed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_KILLED_AT), str(path), step],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert killed.returncode == 9, killed.stderr
    left = sorted(os.listdir(path))
    assert "store.json" not in left, left
    if step == "store.json.":
        assert any(n.startswith("store.json.") and n.endswith(".tmp") for n in left), left
    with Journal.open(path) as j:
        j.create_session("s")
    assert not [n for n in os.listdir(path) if n.endswith(".tmp")]
    with Journal.open(path, readonly=True) as j:
        assert j.get_session("s").session_id == "s"


def test_a_read_only_open_of_a_creation_killed_part_way_finds_no_store(tmp_path: Path) -> None:
    path = tmp_path / "s"
    for name in ("segments", "index", "locks"):
        (path / name).mkdir(parents=True)
    with pytest.raises(StoreNotFound):
        Journal.open(path, readonly=True)
    assert sorted(os.listdir(path)) == ["index", "locks", "segments"]


class _Points(FileOps):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def point(self, name: str, detail: object = None) -> None:
        if name == "store.create":
            self.seen.append(str(detail))


def test_the_creation_passes_its_fault_points(tmp_path: Path) -> None:
    """(The killed-creation test above kills at each: a point renamed or dropped would
    make it pass without killing anything; its child exits 3 then, which it refuses.)"""
    points = _Points()
    Journal.open(tmp_path / "s", file_ops=points).close()
    assert points.seen[:4] == ["", "segments", "index", "locks"], points.seen
    assert points.seen[4].startswith("store.json.") and points.seen[4].endswith(".tmp")
    assert points.seen[5:] == ["store.json"], points.seen


_KILLED_AFTER_PUBLISHING = """
import os, signal, sys
from journal import Journal
from journal._local.files import FileOps

class KillAt(FileOps):
    def point(self, name, detail=None):
        if name == sys.argv[2] and str(detail) == sys.argv[3]:
            os.kill(os.getpid(), signal.SIGKILL)

Journal.open(sys.argv[1], file_ops=KillAt())
sys.exit(3)  # (not reached: the point was passed over)
"""


@pytest.mark.parametrize(
    ("point", "detail"),
    [("store.create", "store.json"), ("commit.view_commit", "None")],
    ids=["store.json published", "first commit"],
)
def test_a_creation_killed_after_publishing_store_json_reads_as_no_store_until_finished(
    tmp_path: Path, point: str, detail: str
) -> None:
    """A process killed (SIGKILL) after it published `store.json`, before its first commit
    made the first segment and the view: read commands found the store and took it for
    damaged or empty, and `journal init` said "opened the existing store". Until a
    creating open finishes it, it is no store: `StoreNotFound` (CLI exit 3) for a
    read-only open and one with create=False; `journal init` creates it."""
    path = tmp_path / "s"
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER_PUBLISHING, str(path), point, detail],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    assert "store.json" in os.listdir(path), os.listdir(path)
    for options in ({"readonly": True}, {"create": False}):
        with pytest.raises(StoreNotFound, match="its creation did not finish"):
            Journal.open(path, **options)  # type: ignore[arg-type]
    # (`cursor-key`, which reads and changes the key file without opening the store, said
    # "the store has no cursor key file: restore it from a backup", exit 5, or printed or
    # rotated the keys of what every other command calls no store)
    for command in (
        ["stats"],
        ["verify"],
        ["cursor-key"],
        ["cursor-key", "--new"],
        ["cursor-key", "--rotate"],
    ):
        result = run_cli(path, *command)
        assert result.returncode == 3, (command, result.stderr)
        assert "creation did not finish" in result.stderr, result.stderr
    init = run_cli(path, "init")
    assert init.returncode == 0 and "created a new store" in init.stderr, init.stderr
    assert "creating" not in os.listdir(path)
    with Journal.open(path, create=False) as j:
        j.create_session("s")
    with Journal.open(path, readonly=True) as j:
        assert j.get_session("s").session_id == "s"


def test_a_creation_mark_beside_records_is_passed_over_and_removed(tmp_path: Path) -> None:
    """The mark of a creation under way, left beside a store that holds records (by an
    opener that lost the creation's race to another and was killed before its first
    commit), does not hide the store: every open reads it, and a writable one removes the
    mark."""
    store = filled_store(tmp_path / "s")
    (store / "creating").touch()
    for options in ({"readonly": True}, {"create": False}):
        with Journal.open(store, **options) as j:  # type: ignore[arg-type]
            assert [e.data for e in j.replay("s")] == [b"one"]
    assert not (store / "creating").exists()


@pytest.mark.parametrize("options", [{}, {"create": False}, {"readonly": True}])
def test_a_store_path_that_is_a_file_is_an_invalid_argument(
    tmp_path: Path, options: dict[str, bool]
) -> None:
    path = tmp_path / "passwd"
    path.write_text("root:x:0:0::/root:/bin/sh\n")
    with pytest.raises(InvalidArgument, match="is a file, not a store directory"):
        Journal.open(path, **options)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="a directory on the way to it is a file"):
        Journal.open(path / "store", **options)  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == ["passwd"]


def test_a_dangling_symbolic_link_is_named_as_such(tmp_path: Path) -> None:
    """A store path that is a symbolic link to nothing said "File exists" (exit 7): mkdir
    refuses the link's name and finds nothing behind it."""
    link = tmp_path / "store"
    link.symlink_to(tmp_path / "missing")
    with pytest.raises(InvalidArgument, match=r"symbolic link to .*missing.*does not exist"):
        Journal.open(link)
    result = run_cli(link, "--format", "json", "init")
    assert result.returncode == 4 and "symbolic link" in json_error(result)["message"]
    assert sorted(os.listdir(tmp_path)) == ["store"] and link.is_symlink()
    (tmp_path / "missing").mkdir()  # what the message says to do
    with Journal.open(link) as j:
        j.create_session("s")
    assert (tmp_path / "missing" / "store.json").is_file()


def test_a_store_path_below_a_dangling_symbolic_link_is_named_as_such(tmp_path: Path) -> None:
    """`link/store`, where `link` points to nothing, said "File exists" (exit 7) as the
    link itself did (a review)."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    with pytest.raises(InvalidArgument, match=r"link.*on the way to .*store.* does not exist"):
        Journal.open(link / "store")
    result = run_cli(link / "store", "--format", "json", "init")
    assert result.returncode == 4 and "symbolic link" in json_error(result)["message"]
    assert sorted(os.listdir(tmp_path)) == ["link"]


class _Syncs(FileOps):
    """Records the path of every file and directory synced through the seam, in order."""

    def __init__(self) -> None:
        self.synced: list[str] = []

    def fsync(self, fd: int) -> None:
        self.synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        super().fsync(fd)


def test_a_new_store_s_directory_entry_and_its_parents_are_synced_before_the_open_returns(
    tmp_path: Path,
) -> None:
    """A power cut after the open returned (and appends were acknowledged) must not lose
    the store's own directory: its entry lives in the directory above, and so does each
    parent the open made for it. Those directories are synced, and `store.json`'s
    temporary file before its link, through the store's `FileOps` (until 2026-12-06 the
    open synced the store's directory only, and `store.json` with `os.fsync`)."""
    top = os.path.realpath(tmp_path)
    path = os.path.join(top, "a", "b", "s")
    syncs = _Syncs()
    Journal.open(path, file_ops=syncs).close()
    temporary = next(p for p in syncs.synced if os.path.basename(p).startswith("store.json."))
    assert os.path.dirname(temporary) == path
    directories = [p for p in syncs.synced if os.path.isdir(p)]
    for directory in (path, os.path.dirname(path), os.path.join(top, "a"), top):
        assert directory in directories, (directory, syncs.synced)
    assert syncs.synced.index(temporary) < syncs.synced.index(os.path.dirname(path))
    # A store made in an existing directory syncs the entry above it too.
    syncs = _Syncs()
    Journal.open(os.path.join(top, "t"), file_ops=syncs).close()
    assert top in syncs.synced, syncs.synced


# As uid 65534: create the store at argv[1] and a session in it; print the outcome.
_CREATE_AS_NOBODY = """
import os, sys, tempfile
from journal import Journal
# A scratch store first, as root: py-lmdb imports a module when it opens an environment.
with tempfile.TemporaryDirectory() as scratch, Journal.open(scratch, durability="os") as j:
    j.create_session("s")
os.setgroups([65534])
os.setgid(65534)
os.setuid(65534)
try:
    with Journal.open(sys.argv[1], create=True) as j:
        j.create_session("s")
    print("created")
except Exception as e:
    print(type(e).__name__, e)
"""


def test_a_store_is_created_in_a_directory_its_user_may_write_but_not_list(
    public_dir: Path,
) -> None:
    """A drop-box directory (mode 1733: anyone creates entries, only its owner lists them)
    cannot be opened to be synced by the others: the creation of a store there failed,
    `StoreUnavailable` "Permission denied" naming the directory, with `store.json`
    published already (until 2026-12-06, since the open syncs the directory above the
    store). That sync is made where the directory can be opened."""
    assert os.geteuid() == 0, "this test runs a child as uid 65534: run it as root"
    drop = public_dir / "drop"
    drop.mkdir()
    drop.chmod(0o1733)
    result = subprocess.run(
        [sys.executable, "-c", _CREATE_AS_NOBODY, str(drop / "store")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.stdout.strip() == "created", result.stdout + result.stderr
    with Journal.open(drop / "store", readonly=True) as j:
        assert [m.session_id for m in j.list_sessions()] == ["s"]
