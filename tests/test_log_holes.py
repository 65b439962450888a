"""Observers that outlive a hole in the log (SPEC 9, "Accepting a hole").

Committed frames cut off the active segment (a segment restored from an older backup, a
file cut short) are accepted by `verify(fix=True)`: the store's head goes back, and later
appends take the dropped positions and ordinals again. An observer process that kept
running across it must be told when it had delivered events that are gone (its next
events would take their ordinals: silently skipped), and must not sleep until the log
grows past the old head when it had not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import IO

import pytest
from _waiting import first_of

from journal import EventIn, Journal

ROOT = Path(__file__).resolve().parent.parent

# Watches SESSION (or, for "-", the lifecycle feed) from the start in its own process
# (READONLY: a read-only journal); prints one JSON line per item, then the error that
# ended the watch.
_OBSERVER = textwrap.dedent(
    """
    import json, sys
    from journal import Journal
    store, session, readonly = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    with Journal.open(store, readonly=readonly) as j:
        try:
            if session == "-":
                for change in j.watch_sessions():
                    print(json.dumps([change.event_type.value, change.session.session_id]),
                          flush=True)
            else:
                for event in j.watch(session):
                    print(json.dumps([event.ordinal, event.data.decode()]), flush=True)
        except Exception as e:
            print(json.dumps(["error", type(e).__name__, str(e)]), flush=True)
    """
)


def _observer(store: Path, session: str, readonly: bool) -> subprocess.Popen[str]:
    # (Killed at the end: a private view it made stays in its TMPDIR, the test's.)
    scratch = store.parent / "tmp"
    scratch.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(scratch))
    return subprocess.Popen(
        [sys.executable, "-c", _OBSERVER, str(store), session, "1" if readonly else "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _lines(out: IO[str] | None, count: int, timeout: float = 20.0) -> list[list[object]]:
    """The next `count` JSON lines (fails after `timeout`: a watch that stalls)."""
    assert out is not None
    deadline = time.monotonic() + timeout
    got: list[list[object]] = []
    while len(got) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"only {got[-3:]} ({len(got)} lines) within {timeout} s"
        line = first_of(iter(out.readline, ""), left)
        got.append(json.loads(line))
    return got


def _cut_last_frame(store: Path) -> None:
    (active,) = sorted((store / "segments").glob("*.seg"))
    end = len(active.read_bytes().rstrip(b"\0"))
    with open(active, "r+b") as f:
        f.truncate(end - 10)


@pytest.mark.parametrize(
    ("readonly", "private"),
    [(False, False), (True, False), (True, True)],
    ids=["writable", "readonly", "private-view"],
)
def test_observers_across_an_accepted_hole_are_told_or_go_on(
    tmp_path: Path, readonly: bool, private: bool
) -> None:
    # (private: read-only observers that found no view to share read through a private
    # one, SPEC 10; it never went back, and never saw the appends after the fix.)
    store = tmp_path / "s"
    with Journal.open(store, create=True) as j:
        j.create_session("s")
        j.create_session("t")
        for i in range(3):
            j.append("s", [EventIn("message", b"s%d" % i)])
        # Many events, so that the positions they took are far past where the log ends
        # once they are cut: the next appends stay below the old head.
        j.append("t", [EventIn("message", b"t%d" % i) for i in range(200)])
    if private:
        (store / "index").rename(tmp_path / "index")
    kept = _observer(store, "s", readonly)
    cut = _observer(store, "t", readonly)
    changes = _observer(store, "-", readonly)
    try:
        assert [x[1] for x in _lines(kept.stdout, 3)] == ["s0", "s1", "s2"]
        assert len(_lines(cut.stdout, 200)) == 200
        assert len(_lines(changes.stdout, 2)) == 2
        if private:  # (the writer's view again: the fix needs the hole it records)
            (tmp_path / "index").rename(store / "index")
        _cut_last_frame(store)  # t's 200 events are gone
        with Journal.open(store) as j:
            report = j.verify(fix=True)
            assert report.fixed and "200 event(s)" in report.problems[0].what
            # The follower of t delivered ordinals the session no longer has: told.
            (told,) = _lines(cut.stdout, 1)
            assert told[:2] == ["error", "CursorFuture"], told
            assert "delivered up to ordinal 200" in str(told[2])
            # The follower of s delivered nothing that is gone: its next event comes,
            # though it takes a position below the old head.
            j.append("s", [EventIn("message", b"s3")])
            assert _lines(kept.stdout, 1) == [[4, "s3"]]
            # The lifecycle follower's position (its startup snapshot's) is past the new
            # end, where the next changes go: told too.
            (told,) = _lines(changes.stdout, 1)
            assert told[:2] == ["error", "CursorFuture"], told
    finally:
        for process in (kept, cut, changes):
            process.kill()
            process.wait()
            assert process.stdout is not None
            process.stdout.close()


def test_a_follower_in_the_fixing_process_goes_on_after_the_fix(tmp_path: Path) -> None:
    """The head went back in the process that accepted the hole too: its follower that
    waited past the new end is woken by the commit that takes those positions again."""
    import threading

    store = tmp_path / "s"
    with Journal.open(store, create=True) as j:
        j.create_session("s")
        j.create_session("t")
        j.append("s", [EventIn("message", b"s0")])
        j.append("t", [EventIn("message", b"t%d" % i) for i in range(200)])
    _cut_last_frame(store)
    with Journal.open(store) as j, j.watch("s") as events:
        assert next(events).data == b"s0"
        box: list[bytes] = []
        follower = threading.Thread(target=lambda: box.append(next(events).data), daemon=True)
        follower.start()
        waiter = j._engine.waiter  # noqa: SLF001
        deadline = time.monotonic() + 10
        while waiter.waiting == 0:  # (it waits for a head past the old end)
            assert time.monotonic() < deadline, "the follower never waited"
            time.sleep(0.01)
        assert j.verify(fix=True).fixed
        j.append("s", [EventIn("message", b"s1")])
        follower.join(10)
        assert box == [b"s1"]


def test_a_lifecycle_follow_started_after_a_fix_elsewhere_takes_no_copy_from_before(
    tmp_path: Path,
) -> None:
    """A follow in progress holds the startup snapshot that later follows share; after
    another process accepted a hole that cut a session's creation, a follow started
    then listed that session and raised CursorFuture (the copy's point is past the new
    end): it copies the registry anew."""
    store = tmp_path / "s"
    with Journal.open(store, create=True) as j:
        for session_id in ("s1", "s2", "s3", "gone"):
            j.create_session(session_id)
    with Journal.open(store) as j:
        held = j.watch_sessions()
        assert next(held).session.session_id in {"s1", "s2", "s3", "gone"}
        _cut_last_frame(store)  # the creation of "gone"
        fix = "import sys\nfrom journal import Journal\nwith Journal.open(sys.argv[1]) as k:\n"
        fix += "    assert k.verify(fix=True).fixed"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        subprocess.run([sys.executable, "-c", fix, str(store)], env=env, check=True)
        with j.watch_sessions() as later:
            assert {next(later).session.session_id for _ in range(3)} == {"s1", "s2", "s3"}
        held.close()


_WRITER = textwrap.dedent(
    """
    import sys
    from journal import EventIn, Journal
    with Journal.open(sys.argv[1], durability="os") as k:
        for line in sys.stdin:
            session, count = line.split()
            k.append(session, [EventIn("message", b"%s%d" % (session.encode(), i))
                               for i in range(int(count))])
            print("done", flush=True)
    """
)


def test_a_hole_seen_while_few_followers_waited_does_not_hide_later_commits(
    tmp_path: Path,
) -> None:
    """The waiter thread reads which sessions other processes' commits touched only while
    more than two followers wait (`journal/_local/commits_seen.py`), from where its last
    such read ended. A hole another process accepted while one follower waited took the
    head back below that point; once more followers waited, a commit that took those
    positions again, read at the first look after its event, was read as touching
    nothing (a head not past the last read), and its followers were not woken: until
    2026-12-05 (a review) the follower of s here got its event only with a later
    commit of s (in most rounds: in the others a look that read the lower head first, a
    read too early for the commit, set the point right)."""
    import threading

    store = tmp_path / "s"
    with Journal.open(store, create=True) as j:
        for session_id in ("s", "u", "v", "t"):
            j.create_session(session_id)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(store)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert writer.stdin is not None and writer.stdout is not None

    def append(session_id: str, count: int) -> None:
        writer.stdin.write(f"{session_id} {count}\n")  # type: ignore[union-attr]
        writer.stdin.flush()  # type: ignore[union-attr]
        assert writer.stdout.readline() == "done\n"  # type: ignore[union-attr]

    fix = "import sys\nfrom journal import Journal\nwith Journal.open(sys.argv[1]) as k:\n"
    fix += "    assert k.verify(fix=True).fixed"
    got: dict[str, list[bytes]] = {"s": [], "u": [], "v": []}
    stop_all = threading.Event()
    try:
        with Journal.open(store) as j:
            waiter = j._engine.waiter  # noqa: SLF001

            def until(condition: object, what: str) -> None:
                deadline = time.monotonic() + 10
                while not condition():  # type: ignore[operator]
                    assert time.monotonic() < deadline, f"gave up waiting for {what}"
                    time.sleep(0.002)

            def follow(session_id: str, stop: threading.Event) -> None:
                events = list(j.replay(session_id))
                cursor = events[-1].cursor if events else None

                def run() -> None:
                    for event in j.watch(session_id, cursor, stop=stop):
                        got[session_id].append(event.data)

                threading.Thread(target=run, daemon=True).start()

            follow("s", stop_all)
            for round_ in range(4):
                stop_others = threading.Event()
                follow("u", stop_others)
                follow("v", stop_others)
                until(lambda: waiter.waiting == 3, "three followers")
                polls = waiter.polls
                # Many events in one last frame, read with their sessions (three wait).
                append("t", 200)
                until(lambda polls=polls: waiter.polls > polls, "a look past them")
                stop_others.set()
                until(lambda: waiter.waiting == 1, "one follower")
                epoch = waiter.epoch
                _cut_last_frame(store)  # t's 200 events
                subprocess.run([sys.executable, "-c", fix, str(store)], env=env, check=True)
                until(lambda epoch=epoch: waiter.epoch != epoch, "the head seen going back")
                stop_others = threading.Event()
                follow("u", stop_others)
                follow("v", stop_others)
                until(lambda: waiter.waiting == 3, "three followers again")
                append("s", 1)
                woken = round_ + 1
                until(lambda woken=woken: len(got["s"]) == woken, f"round {round_}: s woken")
                stop_others.set()
                until(lambda: waiter.waiting == 1, "one follower")
    finally:
        stop_all.set()
        writer.stdin.close()
        writer.wait(10)
        writer.stdout.close()
