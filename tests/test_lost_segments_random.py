"""Random sequences of public operations, then a rebuild from the log (`index/` deleted):
no "events missing" error, `verify()` passes, the same replays (SPEC 9, "Events the log
lacks": a false positive would make verify fail on a healthy store)."""

from __future__ import annotations

import functools
import logging
import os
import random
import shutil
import time
from pathlib import Path

import pytest

from journal import (
    EventIn,
    InvalidArgument,
    Journal,
    JournalError,
    RetentionPolicy,
    SessionNotFound,
)

IDS = ("a", "b", "c", "d")
# Seeds and operations per seed (about 1 s a seed at 300); more with the environment.
SEEDS = int(os.environ.get("LOST_SEEDS", "20"))
STEPS = int(os.environ.get("LOST_STEPS", "300"))


def _policy(rng: random.Random) -> RetentionPolicy:
    return RetentionPolicy(
        max_history_bytes=rng.choice([None, 3000, 12000]),
        max_history_age_ms=rng.choice([None, None, 200]),
        session_retention_ms=rng.choice([None, 1, 100]),
    )


def _timed(policy: RetentionPolicy) -> bool:
    return policy.max_history_age_ms is not None or policy.session_retention_ms is not None


def _chosen(policy: RetentionPolicy, _recorded: RetentionPolicy) -> RetentionPolicy:
    return policy


def _state(j: Journal) -> dict[str, list[int]]:
    out = {}
    for s in j.list_sessions():
        out[s.session_id] = [e.ordinal for e in j.replay(s.session_id)]
    return out


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and "missing from the log" in r.getMessage()
    ]


def _rebuild_and_check(
    store: Path,
    caplog: pytest.LogCaptureFixture,
    expected: dict[str, list[int]],
    timed: bool,
    note: str,
) -> None:
    shutil.rmtree(store / "index")
    caplog.clear()
    with Journal.open(store, durability="os") as j:
        report = j.verify()
        got = _state(j)
    assert not _errors(caplog), (note, _errors(caplog))
    assert report.ok, (note, report.problems)
    _same_but_timed(got, expected, timed, note)
    with Journal.open(store, readonly=True) as r:
        report = r.verify()
        got = _state(r)
    assert not _errors(caplog), (note, _errors(caplog))
    assert report.ok, (note, report.problems)
    _same_but_timed(got, expected, timed, note)


def _same_but_timed(
    got: dict[str, list[int]], expected: dict[str, list[int]], timed: bool, note: str
) -> None:
    """The same sessions and events; but with `timed` (an age window of 100-200 ms, the
    store's or a session's, or a session retention of 1-100 ms, was in force) a pass
    during the open since may have trimmed a prefix (each session's events still end
    where they ended) or evicted a session."""
    if not timed:
        assert got == expected, note
        return
    assert got.keys() <= expected.keys(), note
    for session_id, ordinals in got.items():
        assert ordinals == expected[session_id][len(expected[session_id]) - len(ordinals) :], (
            session_id,
            note,
        )


def _run(tmp_path: Path, seed: int, caplog: pytest.LogCaptureFixture, steps: int = STEPS) -> None:
    rng = random.Random(seed)
    store = tmp_path / f"s{seed}"
    archive = tmp_path / f"a{seed}.jar"
    seg = rng.choice([4096, 8192, 16384])
    compress = rng.random() < 0.5
    policy = _policy(rng)
    log: list[str] = [f"seg={seg} compress={compress} policy={policy}"]
    timed = _timed(policy)
    j = Journal.open(
        store, durability="os", segment_bytes=seg, retention=policy, compress_sealed=compress
    )
    n = 0
    try:
        with caplog.at_level(logging.ERROR, logger="journal"):
            for _ in range(steps):
                sid = rng.choice(IDS)
                op = rng.choice(
                    [
                        "create",
                        "append",
                        "append",
                        "append",
                        "append",
                        "resolve",
                        "snapshot",
                        "checkpoint",
                        "retention",
                        "compact",
                        "import",
                        "turn",
                        "expire",
                        "policy",
                        "rebuild",
                        "reopen",
                    ]
                )
                log.append(f"{op} {sid}")
                try:
                    if op == "create":
                        age = rng.choice([None, None, 100])
                        timed = timed or age is not None
                        j.create_session(
                            sid,
                            ttl_ms=rng.choice([None, None, 1]),
                            max_history_bytes=rng.choice([None, None, 2000]),
                            max_history_age_ms=age,
                        )
                    elif op == "append":
                        k = rng.randrange(1, 6)
                        j.append(
                            sid,
                            [EventIn("m", rng.randbytes(rng.randrange(20, 900))) for _ in range(k)],
                            create=True,
                        )
                    elif op == "resolve":
                        rng.choice([j.resolve_session, j.cancel_session])(sid)
                    elif op == "snapshot":
                        m = j.get_session(sid)
                        if m.last_ordinal:
                            t = rng.randrange(max(1, m.first_ordinal - 1), m.last_ordinal + 1)
                            j.compact_session(sid, t, b"snap")
                    elif op == "checkpoint":
                        m = j.get_session(sid)
                        if m.last_ordinal:
                            t = rng.randrange(max(1, m.first_ordinal - 1), m.last_ordinal + 1)
                            j.checkpoint_session(sid, t, b"cp")
                    elif op == "retention":
                        j.apply_retention(
                            now_ms=int(time.time() * 1000) + rng.choice([0, 1000, 10**7])
                        )
                    elif op == "compact":
                        j.compact(dead_share=rng.choice([0.0, 0.5]))
                    elif op == "import":
                        j.export_sessions([sid], archive)
                        n += 1
                        j.import_sessions(archive, rename={sid: f"{sid}{n}"})
                    elif op == "turn":
                        with j.own(sid) as owner, owner.turn(f"r{rng.randrange(10**9)}") as turn:
                            turn.append([EventIn("m", b"t" * rng.randrange(10, 400))])
                    elif op == "expire":
                        j.expire_due(now_ms=int(time.time() * 1000) + 10**6)
                    elif op == "policy":
                        policy = _policy(rng)
                        timed = timed or _timed(policy)
                        log.append(f"  -> {policy}")
                        j.change_retention_policy(functools.partial(_chosen, policy))
                    elif op in ("rebuild", "reopen"):
                        expected = _state(j)
                        j.close()
                        if op == "rebuild":
                            _rebuild_and_check(store, caplog, expected, timed, "\n".join(log))
                        j = Journal.open(store, durability="os", segment_bytes=seg)
                except (SessionNotFound, InvalidArgument) as e:
                    log.append(f"  ({type(e).__name__})")
                except JournalError as e:
                    if type(e).__name__ in (
                        "SessionExists",
                        "IllegalTransition",
                        "SessionNotWritable",
                        "OwnerBusy",
                    ):
                        log.append(f"  ({type(e).__name__})")
                    else:
                        raise
            expected = _state(j)
            assert j.verify().ok, "\n".join(log)
            j.close()
            _rebuild_and_check(store, caplog, expected, timed, "\n".join(log))
    finally:
        j.close()


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_operations_then_a_rebuild_finds_nothing_missing(
    tmp_path: Path, seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    _run(tmp_path, seed, caplog)
