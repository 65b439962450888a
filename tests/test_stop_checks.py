"""Followers' `stop` events are checked by one thread per process (`journal-stops`, SPEC
7.6), not by each journal's waiter thread: idle journals whose followers wait with a
stop do not wake, a set stop still ends its follower, and the thread ends with the last
journal's close (and is started again in a forked child).

Wake-ups are counted from /proc (each thread's voluntary context switches); nothing here
asserts a duration."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from journal import EventIn, Journal
from journal.stop_checks import StopChecks

WAIT_S = 30.0  # a bound for liveness only
JOURNALS = 20

pytestmark = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task"), reason="counts wake-ups from /proc"
)


def stop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "journal-stops" and t.is_alive()]


def wake_ups(thread: threading.Thread) -> int:
    """The thread's voluntary context switches so far (each sleep it woke from)."""
    with open(f"/proc/self/task/{thread.native_id}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def until(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.005)


class Followers:
    """A watch of session "s" in a thread per journal, each with a stop of its own."""

    def __init__(self) -> None:
        self.stops: list[threading.Event] = []
        self.threads: list[threading.Thread] = []
        self.delivered: list[int] = []

    def start(self, j: Journal) -> threading.Event:
        stop = threading.Event()

        def follow() -> None:
            for event in j.watch("s", stop=stop):
                self.delivered.append(event.ordinal)

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        self.stops.append(stop)
        self.threads.append(thread)
        return stop

    def end(self) -> None:
        for stop in self.stops:
            stop.set()
        for thread in self.threads:
            thread.join(WAIT_S)


@pytest.fixture
def journals(tmp_path: Path) -> Iterator[tuple[list[Journal], Followers]]:
    opened: list[Journal] = []
    followers = Followers()
    try:
        for i in range(JOURNALS):
            j = Journal.open(str(tmp_path / f"store{i}"), durability="os")
            opened.append(j)
            j.append("s", [EventIn("message", b"x")], create=True)
        yield opened, followers
    finally:
        followers.end()
        for j in opened:
            j.close()


def test_idle_journals_with_stopped_followers_waiting_do_not_wake(
    journals: tuple[list[Journal], Followers],
) -> None:
    """20 journals, each with a follower waiting with a stop: their waiter threads sleep
    until a change or their one-second safety look. Until 2026-12-06 each woke every
    50 ms to check its followers' stops (here about 400 wake-ups a second in all; 300
    such journals took 18-19% of a core, 24% measured with a watch thread each)."""
    opened, followers = journals
    for j in opened:
        followers.start(j)
    until(lambda: len(followers.delivered) == JOURNALS, "every follower's first event")
    until(lambda: len(_waiters()) == JOURNALS, "a waiter thread per journal")
    time.sleep(0.3)  # (the looks after each watch's first wait are over)
    waiters = _waiters()
    before = [wake_ups(t) for t in waiters]
    time.sleep(1.0)
    woke = sum(wake_ups(t) - b for t, b in zip(waiters, before, strict=True))
    # A safety look each (one or two in a second; 67 in all once on a machine at load
    # 6: waits for the GIL count too), against 20 each before (615 in all).
    assert woke <= 10 * JOURNALS, woke
    # And the stops still work: each follower ends when its stop is set, the others go on.
    followers.stops[0].set()
    followers.threads[0].join(WAIT_S)
    assert not followers.threads[0].is_alive()
    assert all(t.is_alive() for t in followers.threads[1:])
    for stop in followers.stops[1:]:
        stop.set()
    for thread in followers.threads:
        thread.join(WAIT_S)
        assert not thread.is_alive()


def _waiters() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "journal-waiter" and t.is_alive()]


def test_the_stop_checks_thread_ends_with_the_last_journal(tmp_path: Path) -> None:
    """One thread for every journal of the process; a journal's close leaves it to the
    others, the last one's close ends it (waited for), and the next stop starts it."""
    assert stop_threads() == []
    first = Journal.open(str(tmp_path / "a"), durability="os")
    second = Journal.open(str(tmp_path / "b"), durability="os")
    followers = Followers()
    try:
        for j in (first, second):
            j.append("s", [EventIn("message", b"x")], create=True)
            followers.start(j)
        until(lambda: len(followers.delivered) == 2, "both followers' first event")
        until(lambda: len(stop_threads()) == 1, "the stop checks' thread")
        followers.stops[0].set()
        followers.threads[0].join(WAIT_S)
        first.close()
        assert len(stop_threads()) == 1  # (the second journal's follower still waits)
        followers.stops[1].set()
        followers.threads[1].join(WAIT_S)
        assert not followers.threads[1].is_alive()
    finally:
        followers.end()
        first.close()
        second.close()
    assert stop_threads() == []
    with Journal.open(str(tmp_path / "a"), durability="os") as again:
        more = Followers()
        stop = more.start(again)
        until(lambda: len(more.delivered) == 1, "a new follower's first event")
        until(lambda: len(stop_threads()) == 1, "the thread started again")
        stop.set()
        more.threads[0].join(WAIT_S)
        assert not more.threads[0].is_alive()
    assert stop_threads() == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_checks_its_own_followers_stops(tmp_path: Path) -> None:
    """A child forked while the parent's stop checks run has no such thread: its first
    follower with a stop starts one of its own, and that stop ends the follower."""
    with Journal.open(str(tmp_path / "parent"), durability="os") as j:
        j.append("s", [EventIn("message", b"x")], create=True)
        followers = Followers()
        followers.start(j)
        until(lambda: len(followers.delivered) == 1, "the parent's follower")
        until(lambda: len(stop_threads()) == 1, "the parent's stop checks")
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 when its follower ended by its stop
            code = 1
            try:
                with Journal.open(str(tmp_path / "child"), durability="os") as child:
                    child.append("s", [EventIn("message", b"y")], create=True)
                    own = Followers()
                    stop = own.start(child)
                    until(lambda: len(own.delivered) == 1, "the child's follower")
                    threading.Timer(0.2, stop.set).start()
                    own.threads[0].join(WAIT_S)
                    code = 0 if not own.threads[0].is_alive() else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        followers.end()
        assert not followers.threads[0].is_alive()


class _Member:
    """A journal's waiter as the stop checks see it: a follower waits with a stop. The
    first check once `hold` is set waits for `release` (the thread is in the middle of a
    round)."""

    def __init__(self) -> None:
        self.hold = False
        self.inside = threading.Event()
        self.release = threading.Event()

    def wake_stopped(self) -> bool:
        if self.hold:
            self.hold = False
            self.inside.set()
            self.release.wait(WAIT_S)
        return True


def _joining(thread: threading.Thread) -> bool:
    """Whether `thread` waits in a `Thread.join` now."""
    frame = sys._current_frames().get(thread.ident or 0)  # noqa: SLF001 (its stack)
    while frame is not None:
        if frame.f_code.co_name == "join":
            return True
        frame = frame.f_back
    return False


def test_a_close_does_not_wait_for_the_thread_another_journal_took_on_meanwhile() -> None:
    """The last journal checked closes (`drop`) while the thread is in a round; another
    journal's follower starts waiting with a stop before that round ends (`want`): the
    thread goes on for it. The close waited for the thread to end all the same, 5 s (5 of
    200 such races of two threads; a review), while the thread made a round every
    50 ms: it returns once the thread is the other journal's."""
    checks = StopChecks()
    first, second = _Member(), _Member()
    checks.want(first)
    until(lambda: checks.checks > 0, "a round of checks")
    first.hold = True
    first.inside.wait(WAIT_S)
    rounds: list[int] = []
    closing = threading.Thread(target=lambda: (checks.drop(first), rounds.append(checks.checks)))
    closing.start()
    until(lambda: _joining(closing), "the close's wait for the thread")
    checks.want(second)
    at_release = checks.checks
    first.release.set()
    closing.join(WAIT_S)
    assert not closing.is_alive()
    # (A round every 50 ms since the release: about 100 in the 5 s the close waited.)
    assert rounds[0] - at_release < 20, (at_release, rounds)
    checks.drop(second)
    assert stop_threads() == []  # (the last one's close: the thread ended, waited for)
