"""Processes ending one session at once (SPEC 5: a resolve of a resolved session returns
it as is): every resolve succeeds, a resolve that lost to a cancel raises
`IllegalTransition`, and the lifecycle feed gets exactly one terminal entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _cli_runs import ROOT
from engines import ENGINES
from journal_contract import close_feed, guarded_stop, next_or_fail

from journal import LifecycleEventType

# argv: GO KIND OPEN-JSON. Print "ready", wait for GO, end session "s1" with KIND
# (resolve or cancel); print the state it returned or the error's type.
_ENDER = """
import json, os, sys, time
from journal import Journal
go, kind, opened = sys.argv[1:]
args = json.loads(opened)
with Journal.open(args.pop("path"), **args) as j:
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.0005)
    try:
        print(getattr(j, f"{kind}_session")("s1").state.name)
    except Exception as e:
        print(type(e).__name__, e)
"""


# (JetStream's variants start a server and take seconds: with the heavy tests.)
_ENGINES = [pytest.param("local"), pytest.param("jetstream", marks=pytest.mark.slow)]


def _open_arguments(engine: str, path: Path) -> dict[str, object]:
    if engine == "local":
        return {"path": str(path)}
    factory = ENGINES[engine]
    return {
        "path": factory.url(),  # type: ignore[attr-defined]
        "store": factory.store_name(path),  # type: ignore[attr-defined]
        "replicas": factory.replicas,  # type: ignore[attr-defined]
    }


def _end_at_once(
    tmp_path: Path, engine: str, kinds: list[str]
) -> tuple[list[str], list[tuple[str, str]]]:
    """Create s0 and s1, end s1 from one process per kind at once, create s2: what each
    process printed, and the lifecycle changes after s0's CREATED through s2's."""
    j = ENGINES[engine].open(tmp_path / "store")
    try:
        j.create_session("s0")
        with guarded_stop() as stop:
            feed = j.watch_sessions(stop=stop)
            start = next_or_fail(feed).cursor
            close_feed(feed)
        j.create_session("s1")
        go = tmp_path / "go"
        opened = json.dumps(_open_arguments(engine, tmp_path / "store"))
        enders = [
            subprocess.Popen(
                [sys.executable, "-c", _ENDER, str(go), kind, opened],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for kind in kinds
        ]
        for ender in enders:
            assert ender.stdout is not None and ender.stdout.readline() == "ready\n"
        go.touch()
        printed = []
        for ender in enders:
            out, err = ender.communicate(timeout=120)
            assert ender.returncode == 0, err
            printed.append(out.strip())
        j.create_session("s2")
        changes: list[tuple[str, str]] = []
        with guarded_stop() as stop:
            feed = j.watch_sessions(cursor=start, stop=stop)
            while not changes or changes[-1] != ("CREATED", "s2"):
                change = next_or_fail(feed)
                changes.append((change.event_type.name, change.session.session_id))
            close_feed(feed)
        return printed, changes
    finally:
        j.close()


@pytest.mark.parametrize("engine", _ENGINES)
def test_resolves_at_once_all_succeed_and_record_one_entry(tmp_path: Path, engine: str) -> None:
    printed, changes = _end_at_once(tmp_path, engine, ["resolve"] * 4)
    assert printed == ["RESOLVED"] * 4, printed
    assert changes == [("CREATED", "s1"), ("RESOLVED", "s1"), ("CREATED", "s2")], changes


@pytest.mark.parametrize("engine", _ENGINES)
def test_resolves_and_cancels_at_once_record_one_end(tmp_path: Path, engine: str) -> None:
    printed, changes = _end_at_once(tmp_path, engine, ["resolve", "cancel"] * 2)
    assert changes[0] == ("CREATED", "s1") and changes[-1] == ("CREATED", "s2"), changes
    assert len(changes) == 3, changes
    ended = changes[1][0]
    assert ended in (LifecycleEventType.RESOLVED.name, LifecycleEventType.CANCELLED.name)
    resolves, cancels = printed[0::2], printed[1::2]
    # (A cancel of an ended session returns it as is; a resolve of a cancelled one is
    # refused.)
    assert cancels == [ended] * 2, printed
    if ended == "RESOLVED":
        assert resolves == ["RESOLVED"] * 2, printed
    else:
        assert all(r.startswith("IllegalTransition") for r in resolves), printed
