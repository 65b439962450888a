"""Opening and closing journals over and over in one process, as a service that opens a
journal per request or per tenant does (a trial, 2026-12-06).

A journal dropped without close() after a call of it failed was held by the error's
traceback until the cycle collector ran: the next open of its store raised "open
already"; an open right after a drop raised it too when the drop's close ended at the
wrong moment, or RuntimeError when a journal was dropped in another thread meanwhile. An
open that cannot get a descriptor raises `StoreUnavailable` with errno EMFILE and
says what helps (`ulimit -n`), wherever in the open it ran out: it was blamed on a damaged
`store.json` ("restore it from a backup") when the first file it opened was the one
refused, and on a store "never opened for writing" when a read-only open ran out at the
view (a trial, 2026-12-06).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.isdir("/proc/self/fd"),
    reason="needs /proc/self/fd",
)

ROOT = Path(__file__).resolve().parent.parent

# Prepended to the scripts below: a limit of at most 256 descriptors, and every one of
# them but `free` taken (by /dev/null) until `give_back`.
_DESCRIPTORS = r"""
import os, resource
def lower_the_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, soft), hard))
def use_up(free=0):
    fillers = []
    try:
        while True:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    for _ in range(free):
        os.close(fillers.pop())
    return fillers
def give_back(fillers):
    for fd in fillers:
        os.close(fd)
"""

# For free = 0, 1, ... descriptors left below a lowered limit (the rest taken by
# /dev/null), an open of a new store, of an existing one and a read-only one; one JSON
# line each: [free, kind, None | [error class, errno, message]]; then the descriptors
# open before and after the sweep.
_SWEEP = (
    _DESCRIPTORS
    + r"""
import json, os, resource, sys
from journal import EventIn, Journal, JournalError
root, top = sys.argv[1], int(sys.argv[2])
existing = os.path.join(root, "existing")
with Journal.open(existing, durability="os") as j:
    j.create_session("s")
    j.append("s", [EventIn("m", b"x")])
lower_the_limit()
before = len(os.listdir("/proc/self/fd"))
for free in range(top):
    for kind in ("new", "existing", "readonly"):
        path = os.path.join(root, f"new{free}") if kind == "new" else existing
        fillers = use_up(free)
        opened = None
        try:
            opened = Journal.open(path, durability="os", readonly=kind == "readonly")
            outcome = None
        except JournalError as e:
            outcome = [type(e).__name__, getattr(e, "errno", None), str(e)]
        finally:
            give_back(fillers)
        if opened is not None:
            opened.close()
        print(json.dumps([free, kind, outcome]), flush=True)
print(json.dumps(["fds", before, len(os.listdir("/proc/self/fd"))]), flush=True)
"""
)


def test_an_open_out_of_descriptors_says_so_wherever_it_ran_out(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SWEEP, str(tmp_path), "12"],
        capture_output=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    *opens, (_, before, after) = lines
    failed = [(free, kind, outcome) for free, kind, outcome in opens if outcome is not None]
    assert failed, "the sweep never ran out of descriptors"
    assert any(free == 11 and outcome is None for free, _, outcome in opens), opens[-3:]
    for free, kind, (name, number, message) in failed:
        where = f"{kind} store, {free} descriptors free: {name}: {message}"
        assert name == "StoreUnavailable" and number == errno.EMFILE, where
        assert "ulimit -n" in message, where
        for misleading in ("damaged", "backup", "never opened for writing"):
            assert misleading not in message, where
    assert after == before, "failed opens left descriptors open"


# A key ring read with no descriptor left: [class, message].
_KEYS = (
    _DESCRIPTORS
    + r"""
import json, os, resource, sys
from cursors import KeyRing, KeyRingError
path = os.path.join(sys.argv[1], "keys")
KeyRing.load_or_create(path)
lower_the_limit()
fillers = use_up()
try:
    KeyRing.load(path)
    outcome = None
except KeyRingError as e:
    outcome = str(e)
give_back(fillers)
print(json.dumps(outcome))
"""
)


def test_a_key_ring_read_out_of_descriptors_says_so(tmp_path: Path) -> None:
    """It said to check that the key file is a file its owner and permissions let this
    user read."""
    done = subprocess.run(
        [sys.executable, "-c", _KEYS, str(tmp_path)], capture_output=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    message = json.loads(done.stdout)
    assert message is not None and "Too many open files" in message, message
    assert "ulimit -n" in message and "permissions" not in message, message


def test_a_read_only_open_of_a_store_with_a_damaged_key_file_does_not_ask_for_access(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that may read the key file is told it is damaged, not to be given read
    access to it (it was told both)."""
    from journal import EventIn, Journal, KeyRingError

    monkeypatch.delenv("JOURNAL_CURSOR_KEY", raising=False)
    monkeypatch.delenv("JOURNAL_CURSOR_KEY_FILE", raising=False)
    store = tmp_path / "store"
    with Journal.open(store, durability="os") as j:
        j.create_session("s")
        j.append("s", [EventIn("m", b"x")])
    (store / "keys").write_bytes(b"garbage\x00\xff")
    for readonly in (False, True):
        with pytest.raises(KeyRingError) as raised:
            Journal.open(store, readonly=readonly)
        assert "is invalid" in raised.value.message and "backup" in raised.value.message
        assert "read access" not in raised.value.message


def _store_fds(store: Path) -> list[str]:
    prefix = os.path.realpath(store) + os.sep
    found = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{name}")
            if target.startswith(prefix):
                found.append(target)
    return found


@contextlib.contextmanager
def _no_cycle_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_journal_dropped_after_failed_calls_is_closed_without_the_cycle_collector(
    tmp_path: Path,
) -> None:
    """A create-if-missing (`SessionExists` caught) or an append to a missing session, then
    the journal dropped: it is closed as its last reference goes, and the next open of the
    store (the next request's) succeeds at once."""
    from journal import EventIn, Journal, SessionExists, SessionNotFound
    from journal.abandoned import wait_for_dropped

    store = tmp_path / "store"
    with Journal.open(store, durability="os") as j:
        j.create_session("s")

    def handler() -> None:  # forgets close()
        j = Journal.open(store, durability="os")
        with contextlib.suppress(SessionExists):
            j.create_session("s")
        with contextlib.suppress(SessionNotFound):
            j.append("missing", [EventIn("m", b"x")])

    with _no_cycle_collector():
        for _ in range(3):
            with pytest.warns(ResourceWarning, match="dropped without close"):
                handler()
            wait_for_dropped(10)  # (its closing thread may have ended already)
            assert _store_fds(store) == []


def test_an_open_collects_a_dropped_journal_that_a_reference_cycle_holds(
    tmp_path: Path,
) -> None:
    """The caller's own cycle (here a list holding itself; an exception kept with its
    frames is one too): the open that finds the store held collects it, waits for its
    close, and opens."""
    from journal import Journal

    store = tmp_path / "store"

    def handler() -> None:  # forgets close(), and leaves a cycle holding the journal
        held: list[object] = [Journal.open(store, durability="os")]
        held.append(held)

    with _no_cycle_collector(), pytest.warns(ResourceWarning, match="dropped without close"):
        for _ in range(3):
            handler()
            with Journal.open(store, durability="os") as j:
                assert not j.closed
    assert _store_fds(store) == []


def test_an_open_right_after_a_journal_was_dropped_opens(tmp_path: Path) -> None:
    """The dropped journal's close, in its own thread, ended between the open's first try
    and its wait for dropped journals: nothing was in flight, so the open raised "open
    already" with the store free (1 in 10 such opens here)."""
    from journal import Journal

    store = tmp_path / "store"

    def handler() -> None:  # forgets close()
        Journal.open(store, durability="os")

    with pytest.warns(ResourceWarning, match="dropped without close"):
        for _ in range(60):
            handler()
            with Journal.open(store, durability="os") as j:
                assert not j.closed


def test_waiting_for_dropped_journals_while_another_thread_drops_one(tmp_path: Path) -> None:
    """A journal dropped in one thread while another waited for dropped journals (an open
    of a store such a journal held): the waiter joined the closing thread before its
    start, and `Journal.open` raised RuntimeError "cannot join thread before it is
    started"."""
    from journal import Journal
    from journal.abandoned import wait_for_dropped

    dropped = threading.Event()
    errors: list[BaseException] = []

    def dropper() -> None:
        try:
            for _ in range(15):
                Journal.open(tmp_path / "store", durability="os")  # dropped at once
                wait_for_dropped(5)
        finally:
            dropped.set()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        thread = threading.Thread(target=dropper)
        thread.start()
        while not dropped.is_set():
            try:
                wait_for_dropped(0.001)
            except RuntimeError as e:
                errors.append(e)
        thread.join()
    assert errors == []


# A journal whose follower's waiter can get no inotify instance (here for want of a
# descriptor; the user's 128 instances used up fails the same way): what the `journal`
# logger says, and whether the follower still gets the next event. One JSON line.
_NO_INOTIFY = (
    _DESCRIPTORS
    + r"""
import json, logging, os, resource, sys, threading, time
from journal import EventIn, Journal
records = []
logging.getLogger("journal").addHandler(logging.Handler())
logging.getLogger("journal").handlers[-1].emit = lambda r: records.append(r.getMessage())
j = Journal.open(os.path.join(sys.argv[1], "s"), durability="os")
j.create_session("s")
lower_the_limit()
fillers = use_up()
got = threading.Event()
def watch():
    for _ in j.watch("s"):
        got.set()
        return
threading.Thread(target=watch, daemon=True).start()
# (the waiter thread starts, without inotify: until it says so, 30 s for liveness; a
# fixed half second let a thread started late get its instance, and say nothing)
deadline = time.monotonic() + 30
while not any("inotify" in r for r in records) and time.monotonic() < deadline:
    threading.Event().wait(0.01)
give_back(fillers)
j.append("s", [EventIn("m", b"x")])
print(json.dumps([got.wait(10), records]))
j.close()
"""
)


def test_a_journal_that_gets_no_inotify_instance_says_it_polls(tmp_path: Path) -> None:
    """Silent before: 200 tenant journals with a follower each took 110% of a core while
    idle, the 72 past the user's 128 inotify instances polling every 2 ms."""
    done = subprocess.run(
        [sys.executable, "-c", _NO_INOTIFY, str(tmp_path)],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    delivered, records = json.loads(done.stdout)
    assert delivered, "the follower did not get the event by polling"
    said = [r for r in records if "inotify" in r]
    assert len(said) == 1, records
    assert "max_user_instances" in said[0] and "poll" in said[0], said[0]


# A JetStream open with 0, 1, 2 descriptors free (its event loop's selector and
# self-pipe, then the connection's socket): one JSON line [free, class, errno, message].
_NATS_SWEEP = (
    _DESCRIPTORS
    + r"""
import json, os, resource, sys
from journal import Journal
url = sys.argv[1]
Journal.open(url, store="h24e_limits").close()  # (its modules imported, the store made)
lower_the_limit()
for free in range(3):
    fillers = use_up(free)
    try:
        Journal.open(url, store="h24e_limits").close()
        outcome = None
    except BaseException as e:
        outcome = [type(e).__name__, getattr(e, "errno", None), str(e)]
    finally:
        give_back(fillers)
    print(json.dumps([free, outcome]), flush=True)
"""
)


def test_a_jetstream_open_out_of_descriptors_says_so() -> None:
    """It raised the bare OSError (the event loop's), or said to check the URL, the
    credentials and that the servers run JetStream (the connection's socket)."""
    from _nats import shared_server

    done = subprocess.run(
        [sys.executable, "-c", _NATS_SWEEP, shared_server().url],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    for line in done.stdout.decode().splitlines():
        free, outcome = json.loads(line)
        assert outcome is not None, f"opened with {free} descriptors free"
        name, number, message = outcome
        where = f"{free} free: {name}: {message}"
        assert name == "StoreUnavailable" and number == errno.EMFILE, where
        assert "ulimit -n" in message and "credentials" not in message, where


# A journal dropped by its last reference starts its closing thread; a cycle collection
# that runs inside that start (CPython may run one at any allocation, or at any bytecode
# from 3.12 on) collects a dropped journal that a reference cycle holds, whose closing
# starts a thread too, in the same thread. Here the collection is made to run there.
_A_COLLECTION_INSIDE_A_CLOSINGS_START = """
import gc, os, sys, threading, warnings
warnings.simplefilter("ignore")
from journal import Journal

gc.disable()
a = Journal.open(os.path.join(sys.argv[1], "a"), durability="os")
b = Journal.open(os.path.join(sys.argv[1], "b"), durability="os")
cycle = [a]
cycle.append(cycle)  # (a is held by a reference cycle only)
del a, cycle
start = threading.Thread.start

def start_after_a_collection(self):
    gc.collect()
    start(self)

threading.Thread.start = start_after_a_collection
del b  # (its closing thread starts: the collection finds a)
threading.Thread.start = start
gc.enable()
Journal.open(os.path.join(sys.argv[1], "a"), durability="os").close()
Journal.open(os.path.join(sys.argv[1], "b"), durability="os").close()
print("closed both")
"""


def test_a_collection_while_a_dropped_journals_closing_starts_does_not_hang(
    tmp_path: Path,
) -> None:
    """The closing thread of a dropped journal was started under the (non-reentrant)
    lock of the closing threads' list, and a collection there that finalized another
    dropped journal waited for that lock in the same thread: the process hung for good
    (a review of the change that closes dropped journals)."""
    done = subprocess.run(
        [sys.executable, "-c", _A_COLLECTION_INSIDE_A_CLOSINGS_START, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        check=False,
    )
    assert done.stdout.strip() == "closed both", done.stderr
