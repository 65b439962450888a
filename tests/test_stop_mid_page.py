"""A watch catching up ends soon after its `stop` is set, its stream is closed or the
journal is closed, not only once the page it is delivering is over (a default page holds
about 10,000 small events: with a consumer taking 0.2 ms an event, that was 2 s).

After a stop mid-page, resuming from the last delivered event's cursor goes on with the
next event: nothing skipped, nothing repeated."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from journal import EventIn, Journal, LifecycleEventType
from journal._local.files import FileOps

EVENTS = 12_000
CONSUMER_S = 0.0002  # a consumer's time per event
STOP_AFTER_S = 0.1
# Seen within this of the stop (a slice of the page takes about 5 ms of the consumer's
# time; the margin is for a loaded machine).
LATE_S = 0.5


def _store(tmp_path: Path, events: int = EVENTS) -> Path:
    path = tmp_path / "store"
    with Journal.open(path, durability="os") as j:
        j.create_session("s")
        for first in range(0, events, 1000):
            j.append("s", [EventIn("t", b"x" * 20) for _ in range(min(1000, events - first))])
    return path


def _consume(stream: object, ended: list[float], seen: list[int]) -> None:
    for event in stream:  # type: ignore[attr-defined]
        seen.append(event.ordinal)
        time.sleep(CONSUMER_S)
    ended.append(time.monotonic())


def _late(stopped_at: float, ended: list[float]) -> float:
    assert ended, "the consumer did not end"
    return ended[0] - stopped_at


def _late_after(consume: Callable[[], None], ended: list[float], stop: Callable[[], None]) -> float:
    """Run `consume` in a thread, `stop()` it `STOP_AFTER_S` in: how late it ended."""
    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(STOP_AFTER_S)
    stop()
    stopped_at = time.monotonic()
    consumer.join(30)
    return _late(stopped_at, ended)


def test_a_stop_set_while_a_watch_catches_up_is_seen_within_the_page(tmp_path: Path) -> None:
    path = _store(tmp_path)
    with Journal.open(path, readonly=True) as j:
        stop = threading.Event()
        seen: list[int] = []
        ended: list[float] = []
        consume = partial(_consume, j.watch("s", stop=stop), ended, seen)
        assert _late_after(consume, ended, stop.set) < LATE_S, f"{len(seen)} events delivered"
        assert 0 < len(seen) < EVENTS
        assert seen == list(range(1, len(seen) + 1))
        # Resumed from the last event delivered: the next one, and every one after.
        last = j.read("s", cursor=None, max_bytes=1 << 20)
        assert last.events  # (the store holds them all)
        resumed = [e.ordinal for e in j.replay("s", cursor=_cursor_of(j, seen[-1]))]
        assert resumed == list(range(seen[-1] + 1, EVENTS + 1))


def _cursor_of(j: Journal, ordinal: int) -> str:
    for event in j.replay("s"):
        if event.ordinal == ordinal:
            return event.cursor
    raise AssertionError(f"no event {ordinal}")


def test_a_stream_closed_from_another_thread_ends_within_the_page(tmp_path: Path) -> None:
    path = _store(tmp_path)
    with Journal.open(path, readonly=True) as j:
        seen: list[int] = []
        ended: list[float] = []
        stream = j.watch("s")
        consume = partial(_consume, stream, ended, seen)
        assert _late_after(consume, ended, stream.close) < LATE_S, f"{len(seen)} delivered"
        assert seen == list(range(1, len(seen) + 1))


def test_a_journal_closed_while_a_watch_catches_up_ends_it_within_the_page(
    tmp_path: Path,
) -> None:
    path = _store(tmp_path)
    j = Journal.open(path, readonly=True)
    seen: list[int] = []
    ended: list[float] = []
    consume = partial(_consume, j.watch("s"), ended, seen)
    assert _late_after(consume, ended, j.close) < LATE_S, f"{len(seen)} events delivered"


def test_a_stream_closed_by_its_own_consumer_delivers_nothing_more(tmp_path: Path) -> None:
    path = _store(tmp_path, 3000)
    with Journal.open(path, readonly=True) as j:
        stream = j.replay("s")
        first = next(stream)
        stream.close()
        assert first.ordinal == 1
        assert list(stream) == []


def test_a_stop_set_in_a_lifecycle_snapshot_is_seen_within_the_page(tmp_path: Path) -> None:
    path = tmp_path / "store"
    sessions = 300
    with Journal.open(path, durability="os") as j:
        for n in range(sessions):
            j.create_session(f"s{n:05}")
    with Journal.open(path, readonly=True) as j:
        stop = threading.Event()
        seen: list[str] = []
        ended: list[float] = []

        def consume() -> None:
            for change in j.watch_sessions(stop=stop):
                assert change.event_type is LifecycleEventType.CREATED
                seen.append(change.session.session_id)
                time.sleep(0.01)  # (a page of changes then took 0.6 s)
            ended.append(time.monotonic())

        assert _late_after(consume, ended, stop.set) < LATE_S, f"{len(seen)} changes delivered"
        assert 0 < len(seen) < sessions


def test_a_fast_consumer_still_gets_whole_pages_in_few_slices(tmp_path: Path) -> None:
    """The slices grow while the consumer keeps up: a replay delivers all, in order."""
    path = _store(tmp_path, 30_000)
    with Journal.open(path, readonly=True) as j:
        assert [e.ordinal for e in j.replay("s")] == list(range(1, 30_001))


def test_a_stop_is_seen_within_a_backlog_after_a_long_live_follow(tmp_path: Path) -> None:
    """Pages of one event each, quickly handled, do not grow the slices: a backlog that
    comes next is still delivered in slices of the consumer's pace."""
    with Journal.open(tmp_path / "store", durability="os") as j:
        j.create_session("s")
        stop = threading.Event()
        seen: list[int] = []
        ended: list[float] = []
        slow = threading.Event()

        def consume() -> None:
            for event in j.watch("s", stop=stop):
                seen.append(event.ordinal)
                if slow.is_set():
                    time.sleep(CONSUMER_S)
            ended.append(time.monotonic())

        consumer = threading.Thread(target=consume)
        consumer.start()
        for n in range(1, 201):
            j.append("s", [EventIn("t", b"x")])
            deadline = time.monotonic() + 10
            while len(seen) < n and time.monotonic() < deadline:
                time.sleep(0.0005)
        assert len(seen) == 200
        slow.set()
        for _ in range(2):  # (10,000 at most in one append)
            j.append("s", [EventIn("t", b"x" * 20) for _ in range(EVENTS // 2)])
        time.sleep(STOP_AFTER_S)
        stop.set()
        stopped_at = time.monotonic()
        consumer.join(30)
        assert _late(stopped_at, ended) < LATE_S, f"{len(seen)} events delivered"
        assert seen == list(range(1, len(seen) + 1))


def test_a_stop_is_seen_soon_by_a_consumer_that_slows_after_a_fast_catch_up(
    tmp_path: Path,
) -> None:
    """A consumer that handled whole pages quickly (its slices grew to a page) and then
    slows down (work that comes once it is caught up) still sees its stop within about a
    slice of its new pace: the slices are bounded. Until they were (a slice grew to 2**20
    items), the first slice of the next page was as long as a page: 20,000 events at
    0.5 ms each went on for 10 s after the stop."""
    per_page = 20_000
    pages = 4
    path = _store(tmp_path, per_page * pages)
    with Journal.open(path, readonly=True) as j:
        stop = threading.Event()
        slow = threading.Event()
        seen: list[int] = []
        ended: list[float] = []

        def consume() -> None:
            # (Pages of `per_page` events: 20 bytes of data each.)
            for event in j.watch("s", stop=stop, max_bytes=per_page * 20):
                seen.append(event.ordinal)
                if event.ordinal > per_page * (pages - 1):  # (the last page's first event)
                    slow.set()
                    time.sleep(0.0005)
            ended.append(time.monotonic())

        consumer = threading.Thread(target=consume)
        consumer.start()
        assert slow.wait(30)
        time.sleep(0.02)
        stop.set()
        stopped_at = time.monotonic()
        consumer.join(60)
        assert _late(stopped_at, ended) < LATE_S, f"{len(seen)} events delivered"
        assert seen == list(range(1, len(seen) + 1))


class _PauseReads(FileOps):
    """Pauses the next segment read of the thread `armed` names until `go` is set."""

    def __init__(self) -> None:
        self.armed: threading.Thread | None = None
        self.paused = threading.Event()
        self.go = threading.Event()

    def _pause(self) -> None:
        if self.armed is threading.current_thread():
            self.armed = None
            self.paused.set()
            self.go.wait(30)

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        self._pause()
        return super().pread(fd, length, offset)

    def pread_into(self, fd: int, buffer: bytearray | memoryview, offset: int) -> int:
        self._pause()
        return super().pread_into(fd, buffer, offset)


def test_a_stream_closed_while_its_page_is_read_delivers_none_of_it(tmp_path: Path) -> None:
    """A close from another thread while the iterating thread reads a page: that thread's
    `next()` raises StopIteration, as the page it reads is the rest of the stream (until
    then the page's first slice was delivered: the close found no page in delivery)."""
    path = _store(tmp_path, 3000)
    ops = _PauseReads()
    with Journal.open(path, readonly=True, file_ops=ops) as j:
        stream = j.replay("s")
        got: list[object] = []

        def first() -> None:
            ops.armed = threading.current_thread()
            got.append(next(stream, None))

        reader = threading.Thread(target=first)
        reader.start()
        assert ops.paused.wait(30), "the page's read did not pause"
        stream.close()
        ops.go.set()
        reader.join(30)
        assert got == [None]
