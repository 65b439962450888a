"""Shared pytest configuration: hypothesis profiles, a seeded random fixture, and the
`engine` / `store` / `j` fixtures of the tests that run on every engine (a module that
defines fixtures of these names uses its own)."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from engines import ENGINES, EngineFactory, engine_params
from hypothesis import HealthCheck, settings

from journal import Journal

# `ci` (the default) is derandomized and bounded so the default run stays within minutes;
# `deep` is for long local runs: HYPOTHESIS_PROFILE=deep python -m pytest
settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "deep",
    max_examples=2000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> Iterator[random.Random]:
    """A seeded Random; the seed is printed when the test fails so it can be replayed."""
    seed = int(os.environ.get("TEST_SEED", random.randrange(1 << 32)))
    yield random.Random(seed)
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\n[rng] seed={seed} (re-run with TEST_SEED={seed})")


@pytest.fixture(params=engine_params())
def engine(request: pytest.FixtureRequest) -> EngineFactory:
    """Each engine in turn (the JetStream one marked as engine_params says)."""
    return ENGINES[request.param]


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path lives under a 0700 one), for
    tests that run commands as other users."""
    directory = Path(tempfile.mkdtemp(prefix="journal-public-test-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def j(engine: EngineFactory, store: Path) -> Iterator[Journal]:
    """A journal on `store`, durability "os", on each engine."""
    with engine.open(store, durability="os") as journal:
        yield journal


_PYCACHE = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """The tests' child processes (the CLI, writers, readers: thousands of launches) keep
    their compiled bytecode in one temporary directory of the run when the environment
    says to write none beside the sources (PYTHONDONTWRITEBYTECODE, set on some CI
    machines): each launch compiled the project's modules again, about 350 against
    165 ms for `journal stats`. The xdist workers, started after this, inherit it."""
    if os.environ.get("PYTHONPYCACHEPREFIX") or not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return
    directory = tempfile.mkdtemp(prefix="journal-test-pycache-")
    config.stash[_PYCACHE] = directory
    os.environ["PYTHONPYCACHEPREFIX"] = directory
    del os.environ["PYTHONDONTWRITEBYTECODE"]


def pytest_unconfigure(config: pytest.Config) -> None:
    directory = config.stash.get(_PYCACHE, None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


# What each test left in the tests' temporary directory (an entry's name -> the test's id).
_MADE_BY: dict[str, str] = {}
_TEMPORARY: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def _temporary_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The temporary directory of the tests and of every process they start (TMPDIR and
    `tempfile.gettempdir()`): one of this test process's own (each xdist worker has its
    own), removed at the end, where it must be empty: a test, or the library, that left
    a file or a directory there (a child script's `tempfile.mkdtemp()`, a rebuild the
    library did not remove) fails the run, naming the test after which it appeared.
    Tests keep their files under `tmp_path`; what their children make goes there too,
    and a test that kills a child removes what the child made (before, each default
    run left about 25 stores in /tmp, and the slow ones more). It is like /tmp (mode
    1777) and not under pytest's base directory: tests run children as other users,
    which pytest's directories (mode 0700) would shut out. A run killed outright leaves
    it (one `journal-tests-*` directory per test process)."""
    tmp_path_factory.getbasetemp()  # (pytest's own stays where TMPDIR said)
    directory = Path(tempfile.mkdtemp(prefix="journal-tests-"))
    directory.chmod(0o1777)
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(directory)
    _TEMPORARY.append(directory)
    try:
        yield directory
    finally:
        _TEMPORARY.clear()
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]
        left = sorted(os.listdir(directory))
        shutil.rmtree(directory, ignore_errors=True)
    assert not left, "left in the tests' temporary directory (and removed): " + ", ".join(
        f"{name} (after {_MADE_BY.get(name, 'a session fixture')})" for name in left
    )


def _note_made_by(nodeid: str) -> None:
    """Note which test made each new entry in the tests' temporary directory (a listing
    of a directory that is empty but while a test runs: microseconds)."""
    if _TEMPORARY:
        for name in os.listdir(_TEMPORARY[0]):
            _MADE_BY.setdefault(name, nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    _note_made_by(item.nodeid)  # (before the fixtures' teardown: the last test's too)


def pytest_runtest_logfinish(nodeid: str) -> None:
    _note_made_by(nodeid)  # (what the test's fixtures left)


@pytest.fixture(scope="session", autouse=True)
def _nats_servers(_temporary_directory: Path) -> Iterator[None]:
    """The NATS servers the JetStream engine's tests started (lazily) stop at the end."""
    yield
    from _nats import stop_shared

    stop_shared()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep
