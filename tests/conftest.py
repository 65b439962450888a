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


@pytest.fixture(scope="session", autouse=True)
def _nats_servers() -> Iterator[None]:
    """The NATS servers the JetStream engine's tests started (lazily) stop at the end."""
    yield
    from _nats import stop_shared

    stop_shared()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep
