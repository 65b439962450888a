"""File descriptors: reads, replays, watches and open/close cycles release what they open.

Leaks are found by listing /proc/self/fd (and `readlink` of each entry: a file that was
deleted while still open reads back as "<path> (deleted)"). Only the public API is used.
Counts are compared with a small slack (other threads of the test process may open and
close descriptors meanwhile); descriptors pointing into the test's store are counted
exactly where that is meaningful.
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from journal import CursorExpired, EventIn, Journal, RetentionPolicy, Subscription
from journal._local.files import FileOps
from journal._local.reader import KEPT_AT_HEAD
from journal.abandoned import wait_for_dropped

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.isdir("/proc/self/fd"),
    reason="needs /proc/self/fd",
)

SMALL_SEGMENT = 16 << 10
SLACK = 2  # descriptors other threads of the test process may hold at any moment
DELETED = " (deleted)"


# -- helpers -------------------------------------------------------------------------------


def open_fds(collect: bool = True) -> dict[int, str]:
    """Every open descriptor of this process and what it points at (after a gc pass)."""
    if collect:
        gc.collect()
    fds: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
    return fds


def _waiter_threads() -> int:
    """Journals' waiter threads, and the thread of the process's inotify instance."""
    names = ("journal-waiter", "journal-inotify")
    return sum(thread.name in names for thread in threading.enumerate())


def fd_count() -> int:
    return len(open_fds())


def under(fds: dict[int, str], directory: Path) -> list[str]:
    """Targets of descriptors that point into `directory` (deleted files included)."""
    prefix = os.path.realpath(directory) + os.sep
    return sorted(target for target in fds.values() if target.startswith(prefix))


def deleted_under(fds: dict[int, str], directory: Path) -> list[str]:
    return [target for target in under(fds, directory) if target.endswith(DELETED)]


def describe(targets: list[str]) -> str:
    """'N: name x count, ...' for an assertion message (file names only)."""
    counts = Counter(os.path.basename(target) for target in targets)
    common = ", ".join(f"{name} x{n}" for name, n in counts.most_common(3))
    return f"{len(targets)} ({common}{', ...' if len(counts) > 3 else ''})"


def segments_dir(store: Path) -> Path:
    return store / "segments"


def open_small(store: Path, **kwargs: Any) -> Journal:
    return Journal.open(store, segment_bytes=SMALL_SEGMENT, durability="os", **kwargs)


def payload(i: int, size: int = 200) -> bytes:
    head = b"event %06d " % i
    return head + b"x" * (size - len(head))


def fill(j: Journal, session: str, batches: int, per_batch: int = 3) -> list[str]:
    """Append `batches` batches; returns the cursor after each batch."""
    cursors = []
    ordinal = 0
    for _ in range(batches):
        events = [EventIn(type="e", data=payload(ordinal + k + 1)) for k in range(per_batch)]
        result = j.append(session, events)
        ordinal = result.last_ordinal
        cursors.append(result.cursor)
    return cursors


def segment_files(store: Path) -> list[str]:
    return sorted(n for n in os.listdir(segments_dir(store)) if ".seg" in n)


def abandon(iterator: Iterator[object]) -> None:
    """Drop an iterator the way a caller who stops early does: close() if it has one."""
    close: Callable[[], None] | None = getattr(iterator, "close", None)
    if close is not None:
        close()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the watcher")
        time.sleep(0.0005)


class Watcher:
    """`watch()` in a thread, recording ordinals (and any error) as they arrive."""

    def __init__(self, j: Journal, session: str, max_bytes: int = 4096) -> None:
        self.stop = threading.Event()
        self.ordinals: list[int] = []
        self.errors: list[BaseException] = []
        self._iterator = j.watch(session, stop=self.stop, max_bytes=max_bytes)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._iterator:
                self.ordinals.append(event.ordinal)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
        finally:
            self._iterator = iter(())  # drop the generator (and its readers) in this thread

    def caught_up(self, last_ordinal: int) -> None:
        wait_until(lambda: bool(self.errors) or (self.ordinals[-1:] or [0])[0] >= last_ordinal)
        if self.errors:
            raise self.errors[0]

    def finish(self) -> None:
        self.stop.set()
        self._thread.join(timeout=5)
        assert not self._thread.is_alive(), "watch() did not end after stop was set"


def dense(ordinals: list[int], first: int, last: int) -> None:
    if ordinals != list(range(first, last + 1)):
        gaps = sorted(set(range(first, last + 1)) - set(ordinals))[:10]
        dupes = len(ordinals) - len(set(ordinals))
        raise AssertionError(
            f"watcher saw {len(ordinals)} events, expected {first}..{last}: "
            f"first missing {gaps}, {dupes} duplicates"
        )


# -- 1. read() -----------------------------------------------------------------------------


def test_read_pages_do_not_leak_descriptors(tmp_path: Path) -> None:
    store = tmp_path / "store"
    before_open = fd_count()
    j = open_small(store)
    j.create_session("s")
    cursors: list[str | None] = [None, *fill(j, "s", batches=200)]
    assert len(segment_files(store)) >= 6, "the session should span many segments"

    j.read("s", cursor=cursors[len(cursors) // 2], max_bytes=4096)
    baseline = fd_count()
    pages = 0
    for i in range(300):
        cursor = cursors[(i * 37) % len(cursors)]
        # small pages touch one or two segments, large ones several
        page = j.read("s", cursor=cursor, max_bytes=2048 if i % 3 else 48 << 10)
        pages += bool(page.events)
    assert pages >= 290
    fds = open_fds()
    assert len(fds) <= baseline + SLACK, (
        f"300 read() calls left {len(fds) - baseline} more descriptors open; under segments/: "
        f"{describe(under(fds, segments_dir(store)))}"
    )

    j.close()
    fds = open_fds()
    assert under(fds, store) == [], f"still open after close(): {describe(under(fds, store))}"
    assert len(fds) <= before_open + SLACK, (
        f"{len(fds)} descriptors after close(), {before_open} before open()"
    )


# -- 2. replay() ---------------------------------------------------------------------------


def test_replays_full_and_abandoned_do_not_leak_descriptors(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with open_small(store) as j:
        j.create_session("s")
        cursors: list[str | None] = [None, *fill(j, "s", batches=150)]
        total = 450
        # warm up both paths once, then measure
        assert len(list(j.replay("s", max_bytes=4096))) == total
        first = j.replay("s", cursor=cursors[10])
        next(first)
        abandon(first)
        del first
        baseline = fd_count()

        for i in range(30):
            cursor = cursors[(i * 11) % len(cursors)]
            skipped = 0 if cursor is None else 3 * ((i * 11) % len(cursors))
            events = list(j.replay("s", cursor=cursor, max_bytes=2048 if i % 2 else 1 << 20))
            assert len(events) == total - skipped
        after_full = fd_count()
        assert after_full <= baseline + SLACK, (
            f"30 full replays left {after_full - baseline} more descriptors open"
        )

        for i in range(100):
            iterator = j.replay("s", cursor=cursors[(i * 7) % (len(cursors) - 1)], max_bytes=2048)
            next(iterator)
            if i % 2:
                abandon(iterator)
            del iterator
        after_abandoned = fd_count()
        assert after_abandoned <= baseline + SLACK, (
            f"100 abandoned replays left {after_abandoned - baseline} more descriptors open; "
            f"under segments/: {describe(under(open_fds(), segments_dir(store)))}"
        )


def test_a_page_over_many_segments_keeps_one_of_them_open(tmp_path: Path) -> None:
    """A session written slowly beside busy ones has one event in each of many segments:
    a page of it read every one of them and kept them all open until the next page (a
    paused replay, a watch, a subscription; export used them all at once), so a process
    with a few such readers held thousands of descriptors (found by a soak: 2,161 open,
    1,067 of them on 320 segment files) and the 1 MiB read buffer of each. A page reads
    positions in order, so the segments behind it are closed as it moves on."""
    store = tmp_path / "store"
    with open_small(store, retention=RetentionPolicy(max_history_bytes=None)) as j:
        j.create_session("slow")
        j.create_session("busy")
        for i in range(60):
            j.append("slow", [EventIn("e", payload(i))])
            for _ in range(4):  # fills a 16 KiB segment
                j.append("busy", [EventIn("e", payload(i, 4000))])
        assert len(segment_files(store)) >= 60
        before = len(under(open_fds(), segments_dir(store)))
        stream = j.replay("slow")  # one page holds all 60 events
        next(stream)
        held = under(open_fds(), segments_dir(store))
        assert len(held) <= before + 1, f"a paused replay holds {describe(held)}"
        assert len(list(stream)) == 59
        subscription = j.subscribe("slow", lambda event: None)
        subscription.close()
        export_held: list[int] = []
        j.export_sessions(
            ["slow"],
            tmp_path / "slow.sja",
            progress=lambda done, total: export_held.append(
                len(under(open_fds(collect=False), segments_dir(store)))
            ),
        )
        assert export_held and max(export_held) <= before + 1, export_held


def test_a_dropped_stream_releases_its_segment_files_without_the_cycle_collector(
    tmp_path: Path,
) -> None:
    """A stream dropped mid-replay (a `break`) must close its segment files when it
    goes, not when the cyclic collector runs: nothing its page generator holds may
    refer back to the stream (a close() wired through it did, briefly)."""
    store = tmp_path / "store"
    with open_small(store) as j:
        j.create_session("s")
        fill(j, "s", batches=20)
        gc.disable()
        try:
            before = under(open_fds(collect=False), segments_dir(store))
            stream = j.replay("s", max_bytes=2048)
            next(stream)
            assert under(open_fds(collect=False), segments_dir(store)) != before
            del stream
            assert under(open_fds(collect=False), segments_dir(store)) == before
        finally:
            gc.enable()


# -- 3. watch() ----------------------------------------------------------------------------


def test_abandoned_and_stopped_watches_release_descriptors(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with open_small(store) as j:
        j.create_session("s")  # stays open: a watch never ends by itself
        cursors = fill(j, "s", batches=150)
        warm = j.watch("s", cursor=cursors[0])
        next(warm)
        abandon(warm)
        del warm
        baseline = fd_count()

        for i in range(100):
            cursor = cursors[(i * 13) % (len(cursors) - 2)]  # at least 6 events follow
            iterator = j.watch("s", cursor=cursor, max_bytes=1024 if i % 2 else 1 << 20)
            for _ in range(4):
                next(iterator)
            if i % 2 == 0:
                abandon(iterator)
            del iterator
        after = fd_count()
        assert after <= baseline + SLACK, (
            f"100 abandoned watches left {after - baseline} more descriptors open; "
            f"under segments/: {describe(under(open_fds(), segments_dir(store)))}"
        )

        # a watch from the start, followed live in a thread, ended by its stop event
        before_thread = fd_count()
        watcher = Watcher(j, "s")
        watcher.caught_up(450)
        last = 450
        for i in range(40):
            last = j.append("s", [EventIn(type="live", data=payload(i))]).last_ordinal
        watcher.caught_up(last)
        watcher.finish()
        dense(watcher.ordinals, 1, last)
        del watcher
        # (The waiter thread stays 1-2 s after its last follower left, with its change
        # source: an eventfd, and the process's inotify instance with its own eventfd
        # while any journal's waiter has one. Both go with it.)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _waiter_threads():
            time.sleep(0.01)
        after_stop = fd_count()
        assert after_stop <= before_thread + SLACK, (
            f"a stopped watch left {after_stop - before_thread} more descriptors open; "
            f"under segments/: {describe(under(open_fds(), segments_dir(store)))}"
        )


def test_awatch_dropped_after_its_loop_closed_releases_its_segment_file(
    tmp_path: Path,
) -> None:
    """An `awatch` advanced once and dropped after its event loop was closed without
    `shutdown_asyncgens` (a loop run with `run_until_complete`, then `close()`) is never
    finalized by asyncio: its frame is just cleared. Its reader cache then went without
    `close()`: found by a soak trial, each such follower kept its segment file open for
    the life of the process (also past `Journal.close()`, and past the segment's
    deletion), and the process-wide count of open readers never came back down, so once
    `KEPT_AT_HEAD` of them had leaked every later follower closed its reader at the
    head."""
    import asyncio

    store = tmp_path / "store"
    with open_small(store) as j:
        j.create_session("s")
        j.append("s", [EventIn("m", payload(1))])
        held = []
        for _ in range(KEPT_AT_HEAD + 8):
            loop = asyncio.new_event_loop()

            async def first() -> None:
                follower = j.awatch("s")
                assert (await follower.__anext__()).ordinal == 1
                held.append(follower)

            loop.run_until_complete(first())
            loop.close()  # (no shutdown_asyncgens: the generators are not finalized)
        assert len(under(open_fds(), segments_dir(store))) > 1  # (they hold readers)
        held.clear()
        # (the writer's descriptor of the active segment)
        assert len(under(open_fds(), segments_dir(store))) <= 1, describe(
            under(open_fds(), segments_dir(store))
        )
        # A new follower at the head keeps its reader again (closed at once while the
        # leaked ones were counted).
        watcher = j.watch("s")
        assert next(watcher).ordinal == 1
        assert len(under(open_fds(), segments_dir(store))) == 2
        watcher.close()
    assert under(open_fds(), store) == []


# -- 4. open/close -------------------------------------------------------------------------


def test_open_close_cycles_return_to_baseline(tmp_path: Path) -> None:
    store = tmp_path / "store"
    baseline = fd_count()
    worst: tuple[int, int, list[str]] = (0, 0, [])  # (extra fds, cycle, store fds)
    for cycle in range(50):
        j = open_small(store)
        try:
            if cycle == 0:
                j.create_session("s")
            first = j.append("s", [EventIn(type="e", data=payload(cycle))])
            for _ in range(9):
                j.append("s", [EventIn(type="e", data=payload(cycle))])
            page = j.read("s", cursor=first.cursor, max_bytes=4096)
            assert page.events[0].ordinal == first.last_ordinal + 1
            j.read("s", max_bytes=4096)  # from the first event: an old segment
            assert len(list(j.replay("s", cursor=first.cursor))) == 9
            iterator = j.watch("s", cursor=first.cursor)
            next(iterator)
            del iterator
        finally:
            j.close()
        # (A gc pass only when the count could be a new worst: a pass can only lower it.
        # One after every cycle took most of this test's time.)
        fds = open_fds(collect=False)
        if len(fds) - baseline > worst[0]:
            fds = open_fds()
        extra = len(fds) - baseline
        if extra > worst[0]:
            worst = (extra, cycle, under(fds, store))
    assert len(segment_files(store)) >= 3, "the cycles should rotate segments"
    fds = open_fds()
    assert under(fds, store) == [], (
        f"store files open after the last close(): {describe(under(fds, store))}"
    )
    assert len(fds) <= baseline + SLACK, (
        f"50 open/close cycles: {len(fds) - baseline} more descriptors than before "
        f"(worst after cycle {worst[1]}: +{worst[0]}, {describe(worst[2])})"
    )


# -- 5. a live watcher and retention -------------------------------------------------------


def test_live_watcher_does_not_pin_deleted_segments(tmp_path: Path) -> None:
    store = tmp_path / "store"
    policy = RetentionPolicy(max_history_bytes=32 << 10)
    appends = 2000
    with open_small(store, retention=policy) as j:
        j.create_session("s")
        watcher = Watcher(j, "s")
        peak_deleted: list[str] = []
        peak_segments: list[str] = []
        try:
            last = 0
            for i in range(appends):
                last = j.append("s", [EventIn(type="tick", data=payload(i + 1))]).last_ordinal
                if i % 10 == 9:
                    # keep the watcher caught up: retention never trims what it has not read
                    watcher.caught_up(last)
                    fds = open_fds(collect=False)  # the watcher's readers are alive anyway
                    held, gone = under(fds, segments_dir(store)), deleted_under(fds, store)
                    if len(gone) > len(peak_deleted):
                        peak_deleted = gone
                    if len(held) > len(peak_segments):
                        peak_segments = held
        finally:
            watcher.finish()
        assert not watcher.errors, watcher.errors
        dense(watcher.ordinals, 1, last)
        assert last == appends
        # retention really ran: the store holds a few segments, not all of them
        assert len(segment_files(store)) <= 6, segment_files(store)
        assert j.get_session("s").first_ordinal > 1
        assert len(peak_deleted) <= 2, (
            f"a caught-up watcher kept {len(peak_deleted)} deleted segment files open "
            f"(disk space never reclaimed): {describe(peak_deleted)}"
        )
        assert len(peak_segments) <= 4, (
            f"{len(peak_segments)} descriptors open under segments/ while the watcher was "
            f"caught up: {describe(peak_segments)}"
        )
    assert under(open_fds(), store) == []


# -- 6. a watcher mid-way through history and compaction -----------------------------------


def test_watcher_releases_segments_that_compaction_replaced(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with open_small(store) as j:
        j.create_session("s")
        j.create_session("filler")
        for i in range(300):
            j.append("s", [EventIn(type="e", data=payload(i + 1))])
            j.append("filler", [EventIn(type="f", data=payload(i + 1))])
        assert len(segment_files(store)) >= 8

        max_bytes = 1024  # at most 6 events of 200 bytes per page
        iterator = j.watch("s", max_bytes=max_bytes)
        seen = [next(iterator).ordinal for _ in range(150)]  # mid-way through history
        before = under(open_fds(), segments_dir(store))

        # most of what lies behind the watcher becomes dead, then compaction rewrites (zstd)
        # or deletes every sealed segment: the plain files the watcher read are unlinked
        j.compact_session("filler", through_ordinal=300, snapshot=b"filler state")
        j.compact_session("s", through_ordinal=100, snapshot=b"s state")
        report = j.compact()
        assert report.segments_rewritten or report.segments_deleted, report
        stale = deleted_under(open_fds(), store)

        # the watcher reads its next page (at least one: more events than a page holds)
        seen += [next(iterator).ordinal for _ in range(max_bytes // 200 + 2)]
        fds = open_fds()
        gone = deleted_under(fds, store)
        assert gone == [], (
            f"after its next page the watcher still holds {len(gone)} deleted segment "
            f"files (before that page: {len(stale)}; segments/ fds before compaction: "
            f"{len(before)}): {describe(gone)}"
        )
        held = under(fds, segments_dir(store))
        assert len(held) <= 4, f"segments/ descriptors after the next page: {describe(held)}"

        # the watch carries on live without a gap, then ends with the session
        for i in range(300, 350):
            j.append("s", [EventIn(type="e", data=payload(i + 1))])
        j.resolve_session("s")
        try:
            seen += [event.ordinal for event in iterator]
        except CursorExpired as exc:  # the watcher is never behind: history is kept
            raise AssertionError(f"the watcher lost history it had not read: {exc}") from exc
        dense(seen, 1, 350)
        del iterator
        assert deleted_under(open_fds(), store) == []
    assert under(open_fds(), store) == []


# -- 7. preallocation ----------------------------------------------------------------------


def test_small_segments_are_not_preallocated_past_segment_bytes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    frame_slack = 1024  # more than one frame of the small batches below
    with open_small(store) as j:
        j.create_session("s")
        for i in range(5):
            j.append("s", [EventIn(type="small", data=b"event %d" % i)])
        sizes = {n: os.stat(segments_dir(store) / n).st_size for n in segment_files(store)}
        assert len(sizes) == 1, sizes
        assert all(size <= SMALL_SEGMENT + frame_slack for size in sizes.values()), (
            f"segment files larger than segment_bytes={SMALL_SEGMENT}: {sizes}"
        )

        # and after rotations: the sealed ones and the new active one
        for i in range(200):
            j.append("s", [EventIn(type="small", data=payload(i, size=300))])
        sizes = {n: os.stat(segments_dir(store) / n).st_size for n in segment_files(store)}
        assert len(sizes) >= 3, sizes
        too_big = {n: s for n, s in sizes.items() if s > SMALL_SEGMENT + frame_slack}
        assert too_big == {}, f"segment files larger than segment_bytes={SMALL_SEGMENT}"


def test_closing_the_journal_releases_watchers_that_are_not_being_advanced(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    j = Journal.open(store, segment_bytes=SMALL_SEGMENT, durability="os")
    j.create_session("s")
    for _ in range(40):
        j.append("s", [EventIn("m", b"z" * 1000)])
    # Held, advanced once, never finished: each holds the segment of its position.
    watchers = [j.watch("s", max_bytes=1000) for _ in range(20)]
    for watcher in watchers:
        assert next(watcher).ordinal == 1
    assert len(under(open_fds(), store)) >= 20
    j.close()
    assert under(open_fds(), store) == []
    # Advancing one after the close ends it (no error from closed files, no reopen).
    rest = list(watchers[0])
    assert [e.ordinal for e in rest] == sorted(e.ordinal for e in rest)
    assert under(open_fds(), store) == []


def test_followers_waiting_at_the_head_hold_no_descriptor_and_no_read_buffer(
    tmp_path: Path,
) -> None:
    # A follower kept its segment reader open while it waited at the head: a descriptor
    # and a read buffer of up to 64 KiB per follower. A supervisor with 1,000
    # subscriptions held 1,012 descriptors (the 1,013th failed with EMFILE under the
    # usual limit of 1,024) and 37 MiB of buffers (42 KiB traced per subscription; 4 now).
    import tracemalloc

    store = tmp_path / "store"
    sessions = [f"s{i}" for i in range(100)]
    with Journal.open(store, durability="os") as j:
        for session in sessions:
            j.create_session(session)
        for session in sessions:
            j.append(session, [EventIn("m", payload(1))])
        # (so that each follower's first read is a 64 KiB chunk)
        j.create_session("filler")
        j.append("filler", [EventIn("f", payload(i, 1000)) for i in range(100)])
        tracemalloc.start()
        try:
            watchers = [j.watch(session) for session in sessions]
            for watcher in watchers:
                assert next(watcher).ordinal == 1  # its page ended at the session's last
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # (the writer's descriptor of the active segment, and the readers of the first
        # `KEPT_AT_HEAD` followers; 101 with every reader kept)
        assert len(under(open_fds(), segments_dir(store))) <= 1 + KEPT_AT_HEAD
        # (100 followers: 6.9 MiB traced with the readers kept, 0.7 MiB without)
        assert held < 2 << 20, held
        # and each goes on reading what comes next
        for session in sessions:
            j.append(session, [EventIn("m", payload(2))])
        for watcher in watchers:
            assert next(watcher).ordinal == 2
            watcher.close()
    assert under(open_fds(), store) == []


def test_a_failed_open_releases_everything_and_fails_the_same_way_again(
    tmp_path: Path,
) -> None:
    from journal import JournalCorrupt

    store = tmp_path / "store"
    with Journal.open(store, segment_bytes=SMALL_SEGMENT, durability="os") as j:
        j.create_session("s")
        for _ in range(40):
            j.append("s", [EventIn("m", b"z" * 1000)])
    active = sorted((store / "segments").glob("*.seg"))[-1]
    active.unlink()  # the segment the view says is active is gone
    before = fd_count()
    for _ in range(3):
        with pytest.raises(JournalCorrupt) as raised:
            Journal.open(store, segment_bytes=SMALL_SEGMENT, durability="os")
        assert raised.value.segment == active.name
    assert under(open_fds(), store) == []
    assert fd_count() <= before + SLACK


def test_journals_dropped_without_close_are_closed_and_the_store_reopens(tmp_path: Path) -> None:
    # A handler that forgets close(): each dropped journal is closed when collected (a
    # ResourceWarning says so), its thread ends and its files close, and opening the
    # store again at once waits for that close instead of failing.
    store = tmp_path / "store"
    with open_small(store):
        pass
    before_threads = threading.active_count()
    before = open_fds()

    def forgetful(i: int) -> None:
        j = open_small(store)
        j.create_session(f"s{i}")

    for i in range(20):
        with pytest.warns(ResourceWarning, match="dropped without close"):
            forgetful(i)
            gc.collect()
    with open_small(store) as j:
        assert len(list(j.list_sessions())) == 20
    deadline = time.monotonic() + 10
    while threading.active_count() > before_threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= before_threads
    assert under(open_fds(), store) == under(before, store) == []
    assert fd_count() <= len(before) + SLACK


def test_a_journal_dropped_without_close_is_closed_without_the_cycle_collector(
    tmp_path: Path,
) -> None:
    """The lifecycle feed held a method of its journal, a reference cycle: a journal
    dropped without close() stayed open (its thread, files and lock) until the cycle
    collector ran, which a process that disables it or allocates little may not do for
    long. It is closed as its last reference goes."""
    store = tmp_path / "store"
    gc.collect()
    gc.disable()
    try:
        with pytest.warns(ResourceWarning, match="dropped without close"):
            j = open_small(store)
            j.create_session("s")
            del j
    finally:
        gc.enable()
    wait_for_dropped(10)  # (it is closed by a thread of its own: SPEC 7)
    assert under(open_fds(), store) == []


def test_a_journal_dropped_with_a_lifecycle_subscription_is_closed_as_with_an_event_one(
    tmp_path: Path,
) -> None:
    """A subscription does not keep its journal: dropped without close(), the journal is
    closed (with the warning) and its subscriptions end, a lifecycle one as an event one.
    Until the session views moved out of the facade (2026-12-05) the lifecycle feed held
    a method of its journal, so a `subscribe_sessions` kept a dropped journal open (its
    thread, files and the store's place in this process) for the life of the process."""
    store = tmp_path / "store"
    seen: list[object] = []

    def forgetful() -> tuple[Subscription[Any], ...]:
        j = open_small(store)
        j.create_session("s")
        return j.subscribe("s", seen.append), j.subscribe_sessions(seen.append)

    with pytest.warns(ResourceWarning, match="dropped without close"):
        subscriptions = forgetful()
        gc.collect()
    with open_small(store) as j:  # (waits for the dropped journal's close)
        assert [m.session_id for m in j.list_sessions()] == ["s"]
    assert [sub.closed for sub in subscriptions] == [True, True]
    assert under(open_fds(), store) == []


def test_an_export_of_many_sessions_keeps_one_segment_open(tmp_path: Path) -> None:
    """An export reads session after session, each from its first segment on: going
    back to an earlier segment closed the readers behind it only, so the ones ahead,
    left by the sessions before, stayed open until a later segment was opened. An export
    of 20 sessions written in turn beside a busy one held 21 segment files by its end,
    one more per session (up to every segment of the store), where SPEC 7.5 says an
    export keeps one."""
    store = tmp_path / "store"
    names = [f"slow{k}" for k in range(20)]
    with open_small(store, retention=RetentionPolicy(max_history_bytes=None)) as j:
        for name in [*names, "busy"]:
            j.create_session(name)
        for i in range(60):
            for name in names:
                j.append(name, [EventIn("e", payload(i))])
            for _ in range(4):  # fills a 16 KiB segment
                j.append("busy", [EventIn("e", payload(i, 4000))])
        assert len(segment_files(store)) >= 60
        before = len(under(open_fds(), segments_dir(store)))
        held: list[int] = []
        j.export_sessions(
            names,
            tmp_path / "slow.sja",
            progress=lambda done, total: held.append(
                len(under(open_fds(collect=False), segments_dir(store)))
            ),
        )
        assert len(held) >= len(names) and max(held) <= before + 1, held


def test_followers_stalled_in_a_catch_up_hold_no_descriptor_and_no_read_buffer(
    tmp_path: Path,
) -> None:
    """A follower whose consumer stops pulling in the middle of a catch-up (a server's
    slow client) kept its segment reader, a descriptor and a read buffer of up to 1 MiB,
    whatever its page size: 1,000 such `awatch` streams failed with EMFILE under the
    usual limit of 1,024, and 200 of 64 KiB pages held 231 MiB. Beyond the first
    `KEPT_AT_HEAD` readers of the process, a page that ends before the session's last
    event lets its reader go too."""
    import tracemalloc

    store = tmp_path / "store"
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
        for batch in range(40):
            j.append("s", [EventIn("m", payload(batch * 100 + i, 500)) for i in range(100)])
        tracemalloc.start()
        try:
            followers = [j.watch("s", max_bytes=64 << 10) for _ in range(100)]
            for follower in followers:
                assert next(follower).ordinal == 1  # a page of many, the rest to come
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(under(open_fds(), segments_dir(store))) <= 1 + KEPT_AT_HEAD
        # (100 followers of 64 KiB pages: 105 MiB traced with every reader kept and
        # reading 1 MiB ahead, 17 MiB now: `KEPT_AT_HEAD` readers read 128 KiB ahead)
        assert held < 24 << 20, held
        for follower in followers[:3] + followers[-3:]:  # each reads on, in order
            assert [e.ordinal for e in itertools.islice(follower, 3999)] == list(range(2, 4001))
        for follower in followers:
            follower.close()
    assert under(open_fds(), store) == []


def test_a_follower_whose_reader_is_let_go_between_pages_reads_once_a_page(
    tmp_path: Path,
) -> None:
    """Beyond the first `KEPT_AT_HEAD` readers, a catch-up's reader is closed after each
    page and opened again for the next: that reopened reader took the next page's first
    read for a jump (64 KiB) and read ahead only from its second read on, two reads a
    page where one does (64 KiB pages, with more than 32 readers open: the catch-up took
    a third longer than at 50bf05b, which kept the reader; a fifth now). It reads on in
    order from where the closed one stopped."""

    class Reads(FileOps):
        count = 0

        def pread_into(self, fd: int, buffer: bytearray | memoryview, offset: int) -> int:
            self.count += 1
            return super().pread_into(fd, buffer, offset)

    ops = Reads()
    with Journal.open(tmp_path / "store", durability="os", file_ops=ops) as j:
        j.create_session("s")
        for batch in range(50):
            j.append("s", [EventIn("m", payload(batch * 100 + i, 500)) for i in range(100)])
        crowd = [j.watch("s", max_bytes=64 << 10) for _ in range(KEPT_AT_HEAD + 8)]
        for follower in crowd:
            assert next(follower).ordinal == 1
        ops.count = 0
        with j.watch("s", max_bytes=64 << 10) as follower:
            assert sum(1 for _ in itertools.islice(follower, 5000)) == 5000
        pages = 5000 * 500 // (64 << 10) + 1  # (39)
        # (50 reads before: a reopened reader's first read was a jump's 64 KiB.)
        assert ops.count <= pages + 2, (ops.count, pages)
        for follower in crowd:
            follower.close()
