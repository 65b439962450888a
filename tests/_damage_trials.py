"""Damage trials for tests/test_damaged_view.py, run in a child process so that a crash
(SIGBUS, an LMDB assertion) fails the test instead of killing pytest.

    python _damage_trials.py build STORE
    python _damage_trials.py trials STORE WORK MODE READONLY SEED COUNT
    python _damage_trials.py while-open STORE MODE

`trials` copies STORE, damages the copy's `index/data.mdb` (MODE: zero, garbage, flip,
truncate), opens it and calls every public method; it prints one JSON line per trial:
each call's outcome is "correct" (the answer the undamaged store gives), "reported"
(verify listed the view), the class of a JournalError, or "raw ..." / "wrong ...".
`while-open` damages the view of a journal this process has open, then checks that
verify() reports it, verify(fix=True) repairs it and everything then reads correctly.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from journal import EventIn, Journal, JournalError, RetentionPolicy, SessionState
from journal._local.lmdbfile import pages_in_use

SESSIONS = ("alpha", "beta", "gamma", "delta", "epsilon")
# How long a lifecycle read waits for its startup snapshot before it takes it for empty.
LIFECYCLE_WAIT_S = 30.0


def build(store: str) -> None:
    """A store with sealed and active segments, a resolved session, a snapshot, an
    idempotency key, tags and a deadline."""
    policy = RetentionPolicy(max_history_bytes=1 << 30)
    with Journal.open(store, segment_bytes=8 << 10, retention=policy) as j:
        for index, session in enumerate(SESSIONS):
            j.create_session(session, tags={"n": str(index)}, ttl_ms=10**9 if index == 2 else None)
        for round_ in range(12):
            for session in SESSIONS:
                j.append(session, [EventIn("m", f"{session}-{round_}".encode() * 20)])
        for round_ in range(120):
            # (Enough frames that the view keeps alpha's in a tree of their own, not inline.)
            j.append("alpha", [EventIn("m", f"alpha-long-{round_}".encode())])
        j.append("beta", [EventIn("m", b"keyed")], idempotency_key="k1")
        j.compact_session("gamma", 3, b"snapshot")
        j.resolve_session("delta")
        j.create_session("scratch")


def reads(j: Journal) -> dict[str, Callable[[], Any]]:
    def listing_pages() -> list[str]:
        ids: list[str] = []
        token = None
        while True:
            page = j.list_sessions_page(page_size=2, page_token=token)
            ids += [s.session_id for s in page.sessions]
            token = page.next_page_token
            if not token:
                return ids

    def lifecycle() -> list[str]:
        # The startup snapshot (one page: all of it or nothing), then 0.3 s of the feed
        # after it. The short stop is timed from the snapshot's arrival, not from the
        # call: timed from the call (0.05 s, then 0.3 s), a process that a loaded machine
        # did not run for that long had `stop` set before the snapshot was read, and the
        # watch ended with nothing ("wrong []"), an answer the view never gave. A view
        # whose snapshot is really empty still ends, after the long timer.
        stop = threading.Event()
        timers = [threading.Timer(LIFECYCLE_WAIT_S, stop.set)]
        timers[0].start()
        ids: list[str] = []
        try:
            for event in j.watch_sessions(stop=stop):
                if not ids:
                    timers.append(threading.Timer(0.3, stop.set))
                    timers[-1].start()
                ids.append(event.session.session_id)
            return sorted(ids)
        finally:
            for timer in timers:
                timer.cancel()

    calls: dict[str, Callable[[], Any]] = {
        "list": lambda: [s.session_id for s in j.list_sessions()],
        # Filtered listings read the state index (the `states` database), page by page.
        "list open": lambda: [
            s.session_id for s in j.list_sessions(state=SessionState.OPEN, page_size=2)
        ],
        "list resolved": lambda: [
            s.session_id for s in j.list_sessions(state=SessionState.RESOLVED)
        ],
        "pages": listing_pages,
        "lifecycle": lifecycle,
        "stats": lambda: j.stats().sessions,
        "snapshot": lambda: bytes(j.snapshot("gamma").data).decode(),
        "watch": lambda: [bytes(e.data).decode() for e in j.watch("delta")],
    }
    for session in SESSIONS:
        calls[f"get {session}"] = lambda s=session: _metadata(j, s)
        calls[f"read {session}"] = lambda s=session: [
            bytes(e.data).decode() for e in j.read(s, max_bytes=2000).events
        ]
        calls[f"replay {session}"] = lambda s=session: [bytes(e.data).decode() for e in j.replay(s)]
    return calls


def _metadata(j: Journal, session: str) -> list[Any]:
    m = j.get_session(session)
    return [m.state.value, m.first_ordinal, m.last_ordinal, m.tags, m.expires_at_ms]


def _outcome(call: Callable[[], Any], expected: Any) -> str:
    try:
        answer = call()
    except JournalError as e:
        return type(e).__name__
    except BaseException as e:
        return f"raw {type(e).__name__}: {e}"[:200]
    return "correct" if answer == expected else f"wrong {answer!r}"[:200]


def _verify_outcome(j: Journal) -> str:
    try:
        report = j.verify()
    except JournalError as e:
        return type(e).__name__
    except BaseException as e:
        return f"raw {type(e).__name__}: {e}"[:200]
    if report.ok:
        return "correct"
    if all(p.segment == "index" for p in report.problems):
        return "reported"
    return f"wrong {report.problems!r}"[:200]


def expected_answers(store: str) -> dict[str, Any]:
    with Journal.open(store, readonly=True) as j:
        return {name: call() for name, call in reads(j).items()}


def _append(j: Journal) -> int:
    return j.append("scratch", [EventIn("m", b"x")]).first_ordinal


def _create(j: Journal) -> str:
    return j.create_session("fresh").session_id


def answers_after_writes(store: str, work: str) -> dict[tuple[bool, bool], dict[str, Any]]:
    """The answers after the trial's writes, by (append done, create done)."""
    answers = {}
    for appended in (False, True):
        for created in (False, True):
            path = os.path.join(work, f"after-{appended}-{created}")
            shutil.copytree(store, path)
            with Journal.open(path) as j:
                if appended:
                    _append(j)
                if created:
                    _create(j)
            answers[appended, created] = expected_answers(path)
            shutil.rmtree(path)
    return answers


def exercise(
    path: str,
    readonly: bool,
    expected: dict[str, Any],
    after: dict[tuple[bool, bool], dict[str, Any]],
) -> dict[str, str]:
    try:
        j = Journal.open(path, readonly=readonly)
    except JournalError as e:
        return {"open": type(e).__name__}
    except BaseException as e:
        return {"open": f"raw {type(e).__name__}: {e}"[:200]}
    results: dict[str, str] = {}
    with j:
        for name, call in reads(j).items():
            results[name] = _outcome(call, expected[name])
        results["verify"] = _verify_outcome(j)
        if not readonly:
            results["append"] = _outcome(lambda: _append(j), 1)
            results["create"] = _outcome(lambda: _create(j), "fresh")
            # After verify(fix=True) everything must read as before (with what was written).
            written = after[results["append"] == "correct", results["create"] == "correct"]
            results["fix"] = _outcome(lambda: j.verify(fix=True).fixed, True)
            for name, call in reads(j).items():
                results[f"fixed {name}"] = _outcome(call, written[name])
            results["fixed verify"] = _verify_outcome(j)
    return results


def damage(data: str, mode: str, rng: random.Random) -> str:
    size = os.path.getsize(data)
    # Mostly pages the view uses (damage to a free page changes no answer), sometimes any.
    used = sorted(pages_in_use(data))
    pages = size // 4096
    page = rng.choice(used) if rng.random() < 0.8 else rng.randrange(pages)
    with open(data, "r+b") as f:
        if mode == "zero":
            f.seek(page * 4096)
            f.write(bytes(4096))
            return f"zeroed page {page}"
        if mode == "garbage":
            f.seek(page * 4096)
            f.write(rng.randbytes(4096))
            return f"garbage in page {page}"
        if mode == "flip":
            # One bit in the nodes (keys and values, from the page's `upper` bound on) of
            # each of a few pages the view uses.
            offsets = []
            for chosen in rng.sample(used, 4):
                f.seek(chosen * 4096 + 14)
                upper = min(int.from_bytes(f.read(2), "little"), 4095)
                offsets.append(chosen * 4096 + rng.randrange(upper, 4096))
            offsets.sort()
            for offset in offsets:
                f.seek(offset)
                byte = f.read(1)[0]
                f.seek(offset)
                f.write(bytes([byte ^ (1 << rng.randrange(8))]))
            return f"flipped a bit at each of {offsets}"
        if mode == "truncate":
            length = rng.choice(
                [0, 4096, 8192, size // 2, size - 4096, size - 1, rng.randrange(size)]
            )
            f.truncate(length)
            return f"cut to {length} of {size} bytes"
    raise ValueError(mode)


def trials(store: str, work: str, mode: str, readonly: bool, seed: int, count: int) -> None:
    expected = expected_answers(store)
    after = answers_after_writes(store, work)
    rng = random.Random(seed)
    for trial in range(count):
        path = os.path.join(work, f"t{trial}")
        shutil.copytree(store, path)
        what = damage(os.path.join(path, "index", "data.mdb"), mode, rng)
        print(json.dumps({"damage": what}), flush=True)  # named before a crash could hide it
        results = exercise(path, readonly, expected, after)
        print(json.dumps({"damage": what, "results": results}), flush=True)
        shutil.rmtree(path)


def while_open(store: str, mode: str) -> None:
    """Damage the view under an open writable journal: reads and writes raise
    JournalCorrupt (never crash), verify() reports it, verify(fix=True) repairs it."""
    expected = expected_answers(store)
    after = answers_after_writes(store, os.path.dirname(store))
    results: dict[str, str] = {}
    data = os.path.join(store, "index", "data.mdb")
    with Journal.open(store) as j:
        # The expiry timer reads the view once as it starts: a cut during that read is
        # the one case nothing can catch (SPEC 14.1, "While open"); let it finish.
        time.sleep(0.3)
        size = os.path.getsize(data)
        with open(data, "r+b") as f:
            if mode == "truncate":
                f.truncate(size // 2)
            else:  # every page but the meta pages
                f.seek(8192)
                f.write(
                    bytes(size - 8192)
                    if mode == "zero"
                    else random.Random(1).randbytes(size - 8192)
                )
        if mode == "truncate":
            # Seen by every transaction (the size check), before verify looks.
            for name, call in reads(j).items():
                results[name] = _outcome(call, expected[name])
        results["verify"] = _verify_outcome(j)
        # Other damage is seen by verify's check of the file (or LMDB): from then on no
        # call touches the file.
        for name, call in reads(j).items():
            results[name] = _outcome(call, expected[name])
        results["append"] = _outcome(lambda: _append(j), 1)
        report = j.verify(fix=True)
        repaired = report.fixed and report.problems[0].segment == "index"
        results["fix"] = "correct" if repaired else repr(report)[:200]
        written = after[results["append"] == "correct", False]
        for name, call in reads(j).items():
            results[f"fixed {name}"] = _outcome(call, written[name])
        results["fixed verify"] = _verify_outcome(j)
        results["fixed append"] = _outcome(lambda: _append(j), 1)
    print(json.dumps({"damage": f"{mode} while open", "results": results}), flush=True)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "build":
        build(args[0])
    elif command == "trials":
        trials(args[0], args[1], args[2], args[3] == "1", int(args[4]), int(args[5]))
    elif command == "while-open":
        while_open(args[0], args[1])
