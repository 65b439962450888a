"""What a release holds, as a user who installs one meets it: the sdist this tree builds
and the wheel built from that sdist (`-m slow`: the builds take several seconds)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest

import journal

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("journal", "cursors", "cli")  # what the wheel installs (pyproject's packages)
TYPED = ("journal", "cursors")  # PEP 561: their py.typed goes into the wheel
# What is not the source tree: caches, builds, leftovers of runs (as .gitignore says).
_NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    "__pycache__",
    "*.py[cod]",
    ".*_cache",
    ".hypothesis",
    "build",
    "dist",
    "*.egg-info",
    ".journal",
    ".venv",
    "bench-results*.json",
    "*.pid",
)
_BUILD = """
import sys
from setuptools import build_meta

print(getattr(build_meta, sys.argv[1])(sys.argv[2]))
"""


@dataclass(frozen=True)
class Release:
    source: frozenset[str]  # the tree's files, relative
    sdist: frozenset[str]  # the sdist's files, relative to its top directory
    wheel: frozenset[str]
    metadata: Message
    entry_points: str
    output: str  # what the builds printed


def _files(root: Path) -> frozenset[str]:
    return frozenset(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _build(hook: str, tree: Path, out: Path) -> tuple[Path, str]:
    result = subprocess.run(
        [sys.executable, "-c", _BUILD, hook, str(out)],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    name = result.stdout.strip().splitlines()[-1]
    return out / name, result.stdout + result.stderr


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    import setuptools

    major = int(setuptools.__version__.split(".")[0])
    assert major >= 77, f"setuptools {setuptools.__version__}: the test extra has >=77"
    work = tmp_path_factory.mktemp("release")
    tree = work / "tree"
    shutil.copytree(ROOT, tree, ignore=_NOT_SOURCE)
    source = _files(tree)  # (before the build writes its egg-info there)
    sdist_path, sdist_output = _build("build_sdist", tree, work / "dist")
    with tarfile.open(sdist_path) as sdist:
        sdist.extractall(work / "unpacked", filter="data")
    (unpacked,) = (work / "unpacked").iterdir()
    sdist_files = _files(unpacked)
    # pip and `python -m build` build the wheel from the sdist, as here
    wheel_path, wheel_output = _build("build_wheel", unpacked, work / "dist")
    with zipfile.ZipFile(wheel_path) as wheel:
        names = frozenset(wheel.namelist())
        (info,) = {name.split("/")[0] for name in names if ".dist-info/" in name}
        metadata = Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    return Release(
        source=source,
        sdist=sdist_files,
        wheel=frozenset(name for name in names if ".dist-info/" not in name),
        metadata=metadata,
        entry_points=entry_points,
        output=sdist_output + wheel_output,
    )


def test_the_version_is_the_same_in_pyproject_and_the_package() -> None:
    # written twice: `journal --version` and archives' library_version print the package's
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == journal.__version__


@pytest.mark.slow
def test_the_sdist_is_the_source_tree(release: Release) -> None:
    # The sdist had tests/test_*.py alone (what setuptools takes by itself): no conftest.py,
    # no helper module, so not one test of an unpacked sdist could even be collected; nor
    # the benchmarks, nor the SPEC.md the README cites.
    made_by_the_build = {name for name in release.sdist if name.split("/")[0].endswith("egg-info")}
    made_by_the_build |= {"PKG-INFO", "setup.cfg"}  # (also in the source of an unpacked sdist)
    assert release.sdist - made_by_the_build == release.source - made_by_the_build - {".gitignore"}
    assert {"tests/conftest.py", "tests/_procs.py", "SPEC.md", "benchmarks/__main__.py"} <= (
        release.sdist
    )


@pytest.mark.slow
def test_the_wheel_holds_the_typed_packages_and_nothing_else(release: Release) -> None:
    modules = {name for name in release.source if name.endswith(".py")}
    expected = {name for name in modules if name.split("/")[0] in PACKAGES}
    expected |= {f"{package}/py.typed" for package in TYPED}
    assert release.wheel == expected  # every subpackage, no tests, benchmarks or caches


@pytest.mark.slow
def test_the_wheel_metadata(release: Release) -> None:
    metadata = release.metadata
    assert metadata["Name"] == "session-journal"
    assert metadata["Version"] == journal.__version__
    assert metadata["Requires-Python"] == ">=3.11"
    assert metadata["License-Expression"] == "Apache-2.0"
    assert sorted(metadata.get_all("Provides-Extra") or []) == ["jetstream", "test"]
    requires = metadata.get_all("Requires-Dist") or []
    assert 'nats-py>=2.16; extra == "jetstream"' in requires
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload() == (ROOT / "README.md").read_text()
    assert "journal = cli:run" in release.entry_points.splitlines()
    # (`license = {text = ...}` warned that such builds stop working by 2027-02-18)
    assert "deprecat" not in release.output.lower(), release.output
