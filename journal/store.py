"""The `Journal`: opening a store, the commit protocol, and the write operations.

Commit protocol (SPEC.md "Commit protocol"): appends and lifecycle changes are queued;
one thread at a time leads a group commit. The leader opens the LMDB write transaction
(which also serialises writers across processes), indexes any committed frames the view
has not seen (another process's, or a crashed writer's), cuts off a torn tail, validates
every queued request against the current state, writes all their records as ONE frame,
syncs it once, projects the frame into the view, commits the transaction, and only then
acknowledges the callers. A crash anywhere before the segment sync loses nothing that was
acknowledged; a crash after it leaves a frame the next writer indexes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, Final, Literal, cast

import lmdb
import msgspec

from cursors import KeyRing, KeyRingError, TokenCodec, TokenKind, scope_digest

from .compaction import (
    DEFAULT_DEAD_SHARE,
    CompactionReport,
    file_identity,
    live_frames,
    rewrite,
    swap_segment,
)
from .errors import (
    CursorExpired,
    CursorFuture,
    IdempotencyKeyReused,
    IllegalTransition,
    InvalidArgument,
    InvalidPageToken,
    JournalClosed,
    JournalCorrupt,
    OrdinalConflict,
    ReadOnlyStore,
    SessionExists,
    SessionNotFound,
    SessionNotWritable,
    StoreIncompatible,
    StoreNotFound,
    StoreUnavailable,
)
from .index import LOCATION, U64, U64X2, FeedEntry, Head, Projection, SessionRow, View
from .models import (
    AppendResult,
    Event,
    EventIn,
    LifecycleEvent,
    LifecycleEventType,
    Page,
    RetentionPolicy,
    RetentionReport,
    SessionMetadata,
    SessionPage,
    SessionState,
    Snapshot,
    _ReadContext,
)
from .records import (
    EventAppended,
    HistoryTrimmed,
    IdempotencyKeyUsed,
    Record,
    SessionCreated,
    SessionEvicted,
    SnapshotTaken,
    StateChanged,
    decode_frame_body,
    decode_frame_for_read,
    encode_frame_body,
)
from .retention import dead_segments, delete_segment_files, forget_segments
from .segments import (
    DEFAULT_SEGMENT_BYTES,
    SEGMENT_HEADER_SIZE,
    FrameDigest,
    ReaderCache,
    SegmentLog,
    SegmentReader,
    SegmentSummary,
    encode_other,
    read_summary,
    segment_name,
    summarize_segment,
    write_summary,
)
from .verify import (
    VerifyReport,
    check_log,
    compare_views,
    project_log,
    project_segments,
    rebuild_into_temporary,
)

__all__ = [
    "DEFAULT_PAGE_BYTES",
    "MAX_BATCH_EVENTS",
    "MAX_EVENT_BYTES",
    "MAX_PAGE_SIZE",
    "Journal",
]

MAX_EVENT_BYTES: Final = 8 << 20
MAX_BATCH_EVENTS: Final = 10_000
MAX_BATCH_BYTES: Final = 64 << 20
MAX_NAME_LENGTH: Final = 256
DEFAULT_PAGE_BYTES: Final = 1 << 20
DEFAULT_PAGE_SIZE: Final = 100
MAX_PAGE_SIZE: Final = 1000
STORE_FORMAT: Final = 1

_NAME_RE: Final = re.compile(r"[^\x00-\x1f\x7f]+")
_digest_encoder: Final = msgspec.msgpack.Encoder()

Durability = Literal["fsync", "os"]


def _sealed_bytes(log: SegmentLog) -> int:
    """Bytes of the sealed segments and their sidecars (the active one is preallocated)."""
    total = 0
    active = segment_name(log.bases()[-1]) if log.bases() else ""
    for name in os.listdir(log.directory):
        if name != active and not name.endswith(".tmp"):
            with contextlib.suppress(FileNotFoundError):
                total += os.path.getsize(os.path.join(log.directory, name))
    return total


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _read_boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


# Constant for the life of the process: read once.
_BOOT_ID: Final = _read_boot_id().encode()


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a str, got {type(value).__name__}")
    if not value or len(value.encode()) > MAX_NAME_LENGTH or not _NAME_RE.fullmatch(value):
        raise InvalidArgument(
            f"{what} {value!r} is invalid: use 1 to {MAX_NAME_LENGTH} bytes of UTF-8 "
            "without control characters"
        )
    return value


def _metadata(row: SessionRow) -> SessionMetadata:
    return SessionMetadata(
        session_id=row.session_id,
        state=row.session_state,
        mode=row.mode,
        context_id=row.context_id,
        extension_keys=tuple(sorted(row.extensions)),
        tags=dict(row.tags),
        created_at_ms=row.created_at_ms,
        started_at_ms=row.created_at_ms,
        ended_at_ms=row.ended_at_ms,
        first_ordinal=row.first_ordinal,
        last_ordinal=row.last_ordinal,
        owner=None,
        incarnation=row.incarnation,
        ttl_ms=row.ttl_ms,
        max_suspend_ms=row.max_suspend_ms,
        suspended_at_ms=row.suspended_at_ms,
        expires_at_ms=row.deadline(),
    )


# -- requests of the commit queue ------------------------------------------------------


class _Request:
    __slots__ = ("args", "done", "error", "op", "result", "wake")

    def __init__(self, op: str, args: tuple[Any, ...]) -> None:
        self.op = op
        self.args = args
        self.wake: threading.Event | None = None
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class _Pending:
    """The planner's view of one session while a batch is being validated."""

    __slots__ = ("incarnation", "last_ordinal", "row", "state")

    def __init__(self, row: SessionRow) -> None:
        self.row = row
        self.incarnation = row.incarnation
        self.state = row.session_state
        self.last_ordinal = row.last_ordinal


_ALLOWED: Final = {
    "suspend": ({SessionState.OPEN}, SessionState.SUSPENDED),
    "resume": ({SessionState.SUSPENDED}, SessionState.OPEN),
    "resolve": ({SessionState.OPEN, SessionState.SUSPENDED}, SessionState.RESOLVED),
    "cancel": ({SessionState.OPEN, SessionState.SUSPENDED}, SessionState.CANCELLED),
}


class _Notifier:
    """Wakes followers: at once for commits in this process, by a short adaptive poll of
    the committed head in LMDB for commits made by other processes."""

    MIN_POLL: Final = 0.0005
    MAX_POLL: Final = 0.004

    def __init__(self, read_head: Any) -> None:
        self._cv = threading.Condition()
        self._local = 0
        self._read_head = read_head
        self._async: dict[int, tuple[Any, Any]] = {}

    def publish(self, next_position: int) -> None:
        with self._cv:
            if next_position > self._local:
                self._local = next_position
            self._cv.notify_all()
            waiters = list(self._async.values())
        for loop, waiter in waiters:
            with contextlib.suppress(RuntimeError):  # that loop closed; its watcher is gone
                loop.call_soon_threadsafe(_wake, waiter)

    def wait(self, seen: int, stop: threading.Event | None, timeout: float | None = None) -> bool:
        """Block until the head passes `seen` (True), `stop` is set or `timeout` ends."""
        delay = self.MIN_POLL
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if stop is not None and stop.is_set():
                return False
            with self._cv:
                if self._local > seen:
                    return True
                self._cv.wait(delay)
                if self._local > seen:
                    return True
            if self._read_head() > seen:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            delay = min(delay * 1.5, self.MAX_POLL)

    async def await_change(self, seen: int) -> None:
        """The asyncio twin of `wait` (without `stop`: cancel the task instead).

        Waits on a plain future woken by `publish` or by a timer: unlike
        `asyncio.wait_for`, awaiting a future never swallows a cancellation that races
        with the wake-up (seen under load with Python 3.11)."""
        import asyncio

        loop = asyncio.get_running_loop()
        delay = self.MIN_POLL
        while True:
            if self._local > seen or self._read_head() > seen:
                return
            waiter = loop.create_future()
            key = id(waiter)
            with self._cv:
                self._async[key] = (loop, waiter)
            timer = loop.call_later(delay, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                with self._cv:
                    self._async.pop(key, None)
            delay = min(delay * 1.5, self.MAX_POLL)


def _wake(waiter: Any) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Journal:
    """An open session journal on an embedded local store (segment files + LMDB view).

    Thread-safe: any number of threads may append, read and watch; concurrent appends share
    one frame and one fsync (group commit). Several processes may open the same store.
    """

    def __init__(self) -> None:  # use Journal.open()
        raise TypeError("use Journal.open(path, ...) to open a journal")

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        readonly: bool = False,
        durability: Durability = "fsync",
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        retention: RetentionPolicy | None = None,
        compress_sealed: bool = False,
        key_ring: KeyRing | None = None,
    ) -> Journal:
        """Open (or create) the store at `path`.

        `durability="fsync"` (default): an acknowledged append is on disk. `"os"`: written
        to the OS; survives a process crash, not a power cut.
        """
        if durability not in ("fsync", "os"):
            raise InvalidArgument(f"durability must be 'fsync' or 'os', got {durability!r}")
        if not isinstance(segment_bytes, int) or segment_bytes < 4096:
            raise InvalidArgument("segment_bytes must be an int of at least 4096")
        self = object.__new__(cls)
        try:
            self._init(
                os.fspath(path),
                create=create,
                readonly=readonly,
                durability=durability,
                segment_bytes=segment_bytes,
                retention=retention or RetentionPolicy(),
                compress_sealed=compress_sealed,
                key_ring=key_ring,
            )
        except OSError as e:
            raise StoreUnavailable(
                f"cannot open the store at {os.fspath(path)!r}: {e.strerror or e}; check the "
                "path and its permissions"
            ) from e
        except lmdb.Error as e:
            raise StoreUnavailable(
                f"cannot open the index of the store at {os.fspath(path)!r}: {e}; a store "
                "that was never opened for writing cannot be opened read-only"
            ) from e
        return self

    def _init(
        self,
        path: str,
        *,
        create: bool,
        readonly: bool,
        durability: Durability,
        segment_bytes: int,
        retention: RetentionPolicy,
        compress_sealed: bool,
        key_ring: KeyRing | None,
    ) -> None:
        self.path = path
        self.readonly = readonly
        self.durability = durability
        self.retention = retention
        self._closed = False
        self._pid = os.getpid()
        store_file = os.path.join(path, "store.json")
        if not os.path.exists(store_file):
            if readonly or not create:
                raise StoreNotFound(
                    f"no journal store at {path!r}: create it with `journal init` or "
                    "Journal.open(path, create=True)"
                )
            self._create_store(path)
        self.store_id = self._load_store_id(store_file)
        if key_ring is None:
            key_ring = KeyRing.from_environment()
        if key_ring is None:
            keys = os.path.join(path, "keys")
            if readonly:
                try:
                    key_ring = KeyRing.load(keys)
                except KeyRingError as e:
                    raise KeyRingError(
                        f"{e.message}; a read-only reader needs the store's cursor key: give "
                        f"it read access to {keys}, or share the key via JOURNAL_CURSOR_KEY"
                    ) from e
            else:
                key_ring = KeyRing.load_or_create(keys)
        self._codec = TokenCodec(key_ring)
        self._lifecycle_scope = scope_digest(self.store_id, purpose="lifecycle")
        self._log = SegmentLog(
            os.path.join(path, "segments"),
            self.store_id,
            segment_bytes=segment_bytes,
            sync=durability == "fsync",
            compress_sealed=compress_sealed,
        )
        # Read-only on a store whose LMDB files this process cannot lock (no write access):
        # a private view outside the store, built from the segments and kept up to date by
        # scanning the active segment's tail. Nothing in the store is created or locked.
        self._private_dir: str | None = None
        self._private_lock = threading.Lock()
        if not readonly:
            self._discard_view_after_reboot(path)
            self._view = View(os.path.join(path, "index"))
        else:
            try:
                self._view = View(os.path.join(path, "index"), readonly=True)
            except lmdb.Error:
                self._private_dir = tempfile.mkdtemp(prefix="journal-readonly-")
                try:
                    self._view = View(self._private_dir)
                    with self._view.env.begin(write=True) as txn:
                        project_log(self._log, self._view, txn)
                except BaseException:
                    shutil.rmtree(self._private_dir, ignore_errors=True)
                    raise
        # Event type names already validated: a deliberate, bounded cache (types repeat).
        self._checked_types: set[str] = set()
        self._scopes: dict[tuple[str, int], bytes] = {}
        # Sidecars of sealed segments, read once (they never change once written).
        self._summaries: dict[int, SegmentSummary] = {}
        self._retention_due = False
        self._finished_interrupted = False
        self._boot_recorded = False
        self._queue: list[_Request] = []
        self._cv = threading.Condition()
        self._leading = False
        self._notifier = _Notifier(self._committed_next_position)
        if not readonly:
            with self._cv:
                self._leading = True
            try:
                self._run_commit([])
            finally:
                with self._cv:
                    self._leading = False

    @staticmethod
    def _discard_view_after_reboot(path: str) -> None:
        """Drop the LMDB view if the machine restarted since a writer last used it.

        LMDB's own fsync is off (the view is derived), so after a power cut its file may be
        torn. A writer records the boot id in `view-boot`; a different boot id means the
        view is not trusted: it is moved aside and rebuilt from the segments, which were
        synced. Runs under `locks/open.lock` so concurrent openers do it once.
        """
        os.makedirs(os.path.join(path, "locks"), exist_ok=True)
        marker = os.path.join(path, "view-boot")
        lock_fd = os.open(os.path.join(path, "locks", "open.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                with open(marker, "rb") as f:
                    recorded = f.read().strip()
            except FileNotFoundError:
                recorded = None
            if recorded == _BOOT_ID:
                return
            index = os.path.join(path, "index")
            if recorded is not None and os.path.isdir(index):
                stale = f"{index}.stale-{os.getpid()}"
                os.rename(index, stale)
                shutil.rmtree(stale, ignore_errors=True)
            os.makedirs(index, exist_ok=True)
            temporary = f"{marker}.{os.getpid()}.tmp"
            with open(temporary, "wb") as f:
                f.write(_BOOT_ID)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, marker)
            directory_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(directory_fd)
            finally:
                os.close(directory_fd)
        finally:
            os.close(lock_fd)

    @staticmethod
    def _create_store(path: str) -> None:
        os.makedirs(os.path.join(path, "segments"), exist_ok=True)
        os.makedirs(os.path.join(path, "index"), exist_ok=True)
        os.makedirs(os.path.join(path, "locks"), exist_ok=True)
        document = json.dumps({"format": STORE_FORMAT, "store_id": os.urandom(16).hex()})
        final = os.path.join(path, "store.json")
        temporary = f"{final}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(temporary, "w") as f:
            f.write(document)
            f.flush()
            os.fsync(f.fileno())
        try:
            # link() fails if another process created the store first: theirs wins.
            os.link(temporary, final)
        except FileExistsError:
            pass
        finally:
            os.unlink(temporary)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _load_store_id(store_file: str) -> bytes:
        try:
            with open(store_file) as f:
                document = json.load(f)
            if document.get("format") != STORE_FORMAT:
                raise StoreIncompatible(
                    f"{store_file} has store format {document.get('format')!r}; this code "
                    f"reads format {STORE_FORMAT}: upgrade session-journal"
                )
            store_id = bytes.fromhex(document["store_id"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StoreIncompatible(
                f"{store_file} is unreadable or damaged ({e}); restore it from a backup"
            ) from None
        if len(store_id) != 16:
            raise StoreIncompatible(f"{store_file} holds a store id of the wrong length")
        return store_id

    def close(self) -> None:
        """Close the journal; pending watches end. Idempotent."""
        if self._closed:
            return
        with self._cv:
            while self._leading:
                self._cv.wait()
            self._closed = True
        self._notifier.publish(1 << 63)
        self._log.close()
        with self._private_lock:
            self._view.close()
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise JournalClosed("this journal is closed; open it again with Journal.open()")
        if os.getpid() != self._pid:
            raise JournalClosed(
                "this journal was opened in a parent process; a forked child must call "
                "Journal.open() itself (LMDB handles do not survive fork)"
            )
        if self._private_dir is not None:
            self._refresh_private_view()

    def _committed_next_position(self) -> int:
        if self._closed:
            return 1 << 63
        if self._private_dir is not None:
            self._refresh_private_view()
        with self._view.env.begin() as txn:
            head = self._view.head(txn)
        return 1 if head is None else head.next_position

    def _refresh_private_view(self) -> None:
        """Project frames the writer committed since (read-only private view only)."""
        with self._private_lock:
            if self._closed:
                return
            view = self._view
            with view.env.begin() as txn:
                head = view.head(txn)
            if head is None or not self._log.moved_past(
                head.segment, head.end_offset, head.next_position
            ):
                return
            with view.env.begin(write=True) as txn:
                projection = Projection(view, txn, head)
                project_segments(self._log, projection)
                projection.flush()

    # -- the commit path -------------------------------------------------------------------

    def _submit(self, op: str, *args: Any) -> Any:
        if self.readonly:
            raise ReadOnlyStore(
                "this journal was opened with readonly=True; open it writable to change it"
            )
        self._check_open()
        request = _Request(op, args)
        # Leader/follower group commit: the first queued request leads; the others sleep
        # on their own event (no thundering herd) until their batch is done, or until the
        # finishing leader hands leadership to the oldest waiting request.
        with self._cv:
            self._queue.append(request)
            lead = not self._leading
            if lead:
                self._leading = True
            else:
                request.wake = threading.Event()
        if request.wake is not None:
            request.wake.wait()
        if not request.done:
            with self._cv:
                batch, self._queue = self._queue, []
            try:
                self._run_commit(batch)
                if self._retention_due:
                    self._retention_due = False
                    self._run_commit([_Request("retention", (None,))])
            finally:
                with self._cv:
                    for r in batch:
                        r.done = True
                    successor = self._queue[0] if self._queue else None
                    if successor is None:
                        self._leading = False
                        self._cv.notify_all()
                for r in batch:
                    if r.wake is not None and r is not request:
                        r.wake.set()
                if successor is not None and successor.wake is not None:
                    successor.wake.set()
        if request.error is not None:
            raise request.error
        return request.result

    def _run_commit(self, batch: list[_Request]) -> None:
        try:
            for attempt in range(8):
                try:
                    self._commit(batch)
                    return
                except lmdb.MapFullError:
                    if attempt == 7:
                        raise
                    info = self._view.env.info()
                    self._view.env.set_mapsize(info["map_size"] * 2)
        except BaseException as e:
            # Nothing of this batch was committed: no caller may see a result.
            for r in batch:
                r.result = None
                r.error = e
            if not batch:
                raise

    def _commit(self, batch: list[_Request]) -> None:
        view = self._view
        log = self._log
        before: tuple[int, int, int] | None = None
        try:
            with view.env.begin(write=True) as txn:
                head = self._catch_up(txn)
                now = _now_ms()
                planner = _Planner(self, txn, head.next_position, now)
                for request in batch:
                    request.error = None
                    request.result = None
                    planner.plan(request)
                projection = Projection(view, txn, head)
                # Rows the planner read in this transaction are the ones the projection
                # would read again: hand them over.
                if not any(request.op == "verify_fix" for request in batch):
                    for pending in planner.sessions.values():
                        if pending is not None and pending.incarnation < head.next_position:
                            projection.adopt(pending.row)
                if planner.records:
                    writer = log.writer
                    before = (writer.base_position, writer.end_offset, writer.next_position)
                    info = log.append(
                        encode_frame_body(planner.records), len(planner.records), planner.digest()
                    )
                    if info.segment != before[0]:
                        # A segment was sealed: the moment to let retention reclaim space.
                        self._retention_due = True
                    projection.apply(info, planner.records, planner.event_runs)
                    projection.flush()
                planner.finish(projection)
            # The transaction committed: from here on the frame is acknowledged.
        except BaseException:
            if before is not None:
                self._undo_append(before)
            raise
        if planner.doomed:
            freed = delete_segment_files(log, planner.doomed)
            for request in batch:
                if isinstance(request.result, RetentionReport):
                    request.result = msgspec.structs.replace(request.result, reclaimed_bytes=freed)
        if planner.records:
            self._notifier.publish(projection.head.next_position)

    def _undo_append(self, before: tuple[int, int, int]) -> None:
        """Cut off a frame whose view update failed (the transaction did not commit), so no
        later catch-up publishes what no caller was told succeeded. If the append started a
        new segment, that segment keeps only its header (the sealed one is complete)."""
        base, end_offset, next_position = before
        writer = self._log.writer
        if writer.base_position == base:
            writer.attach(end_offset, next_position)
        else:
            writer.attach(SEGMENT_HEADER_SIZE, writer.base_position)

    def _catch_up(self, txn: lmdb.Transaction) -> Head:
        """Index committed frames the view has not seen; position the writer after them."""
        view = self._view
        log = self._log
        head = view.head(txn)
        if head is None:
            stored = txn.get(b"store", db=view.meta)
            if stored is not None and bytes(stored) != self.store_id:
                raise StoreIncompatible("the index belongs to another store; delete index/")
            txn.put(b"store", self.store_id, db=view.meta)
            bases = log.bases()
            if not bases:
                log.start_first_segment()
                head = Head(1, SEGMENT_HEADER_SIZE, 1, 0)
            else:
                # No view yet (new, deleted, or discarded after a reboot): rebuild it from
                # the sidecars of sealed segments and a scan of the rest.
                log.discard_unborn_tail()
                log.finish_interrupted()
                self._finished_interrupted = True
                head = project_log(log, view, txn)
        if not self._boot_recorded:
            if txn.get(b"boot", db=view.meta) != _BOOT_ID:
                txn.put(b"boot", _BOOT_ID, db=view.meta)
            self._boot_recorded = True
        if log.writer_at(head.segment, head.end_offset, head.next_position):
            return head
        log.discard_unborn_tail()
        if not self._finished_interrupted:
            log.finish_interrupted()
            self._finished_interrupted = True
        projection = Projection(view, txn, head)
        for base in project_segments(log, projection):
            if read_summary(log.directory, base) is None:
                log.seal(base)
        projection.flush()
        head = projection.head
        log.attach_writer(head.segment, head.end_offset, head.next_position)
        return head

    # -- sessions: writes ------------------------------------------------------------------

    def create_session(
        self,
        session_id: str,
        mode: str = "",
        context_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        extensions: Mapping[str, bytes] | None = None,
        ttl_ms: int | None = None,
        max_suspend_ms: int = 0,
        *,
        max_history_bytes: int | None = None,
        max_history_age_ms: int | None = None,
    ) -> SessionMetadata:
        """Create an OPEN session; `SessionExists` if the id is taken."""
        _check_name("session_id", session_id)
        if not isinstance(mode, str) or len(mode) > MAX_NAME_LENGTH:
            raise InvalidArgument("mode must be a str of at most 256 characters")
        if context_id is not None and not isinstance(context_id, str):
            raise InvalidArgument("context_id must be a str or None")
        tag_map = dict(tags or {})
        for k, v in tag_map.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidArgument("tags must map str to str")
        ext_map = dict(extensions or {})
        for ext_key, ext_value in ext_map.items():
            if not isinstance(ext_key, str) or not isinstance(ext_value, bytes):
                raise InvalidArgument("extensions must map str to bytes")
        for name, value in (("ttl_ms", ttl_ms), ("max_history_bytes", max_history_bytes)):
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise InvalidArgument(f"{name} must be a positive int or None")
        if max_history_age_ms is not None and (
            not isinstance(max_history_age_ms, int) or max_history_age_ms <= 0
        ):
            raise InvalidArgument("max_history_age_ms must be a positive int or None")
        if not isinstance(max_suspend_ms, int) or max_suspend_ms < 0:
            raise InvalidArgument("max_suspend_ms must be an int >= 0 (0 = 7 days)")
        record = SessionCreated(
            session_id=session_id,
            created_at_ms=0,
            mode=mode,
            context_id=context_id,
            tags=tag_map,
            extensions=ext_map,
            ttl_ms=ttl_ms,
            max_suspend_ms=max_suspend_ms,
            max_history_bytes=max_history_bytes,
            max_history_age_ms=max_history_age_ms,
        )
        result: SessionMetadata = self._submit("create", record)
        return result

    def append(
        self,
        session_id: str,
        events: Sequence[EventIn],
        expected_last_ordinal: int | None = None,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        """Append events to an OPEN session; returns after they are committed."""
        _check_name("session_id", session_id)
        if isinstance(events, (str, bytes, EventIn)) or not isinstance(events, Sequence):
            raise InvalidArgument("events must be a list of EventIn")
        if not events:
            raise InvalidArgument("events is empty: pass at least one EventIn")
        if len(events) > MAX_BATCH_EVENTS:
            raise InvalidArgument(
                f"{len(events)} events in one append; the limit is {MAX_BATCH_EVENTS}: split it"
            )
        # Fast path: one cheap pass; anything unusual goes through the precise checks.
        total = 0
        checked = self._checked_types
        for event in events:
            if (
                event.__class__ is not EventIn
                or event.data.__class__ is not bytes
                or event.type not in checked
                or (event.request_id is not None and event.request_id.__class__ is not str)
            ):
                total = self._check_events(events)
                break
            total += len(event.data)
        else:
            if total > MAX_EVENT_BYTES:
                self._check_events(events)
        if total > MAX_BATCH_BYTES:
            raise InvalidArgument(
                f"one append of {total} bytes exceeds {MAX_BATCH_BYTES} bytes: split it"
            )
        if expected_last_ordinal is not None and (
            not isinstance(expected_last_ordinal, int) or expected_last_ordinal < 0
        ):
            raise InvalidArgument("expected_last_ordinal must be an int >= 0 or None")
        digest = b""
        if idempotency_key is not None:
            _check_name("idempotency_key", idempotency_key)
            digest = hashlib.sha256(
                _digest_encoder.encode([(e.type, e.data, e.request_id) for e in events])
            ).digest()
        result: AppendResult = self._submit(
            "append", session_id, list(events), expected_last_ordinal, idempotency_key, digest
        )
        return result

    def _check_events(self, events: Sequence[EventIn]) -> int:
        """Validate every event precisely (raising the first problem); total data bytes."""
        total = 0
        for i, event in enumerate(events):
            if not isinstance(event, EventIn):
                raise InvalidArgument(f"events[{i}] is a {type(event).__name__}, not an EventIn")
            if not isinstance(event.data, bytes):
                raise InvalidArgument(
                    f"events[{i}].data is a {type(event.data).__name__}; it must be bytes "
                    "(encode text or JSON first)"
                )
            if len(event.data) > MAX_EVENT_BYTES:
                raise InvalidArgument(
                    f"events[{i}].data is {len(event.data)} bytes; the limit is "
                    f"{MAX_EVENT_BYTES} bytes per event: store large payloads elsewhere "
                    "and append a reference"
                )
            if event.type not in self._checked_types:
                _check_name(f"events[{i}].type", event.type)
                if len(self._checked_types) < 4096:
                    self._checked_types.add(event.type)
            if event.request_id is not None and not isinstance(event.request_id, str):
                raise InvalidArgument(f"events[{i}].request_id must be a str or None")
            total += len(event.data)
        return total

    def suspend_session(self, session_id: str) -> SessionMetadata:
        """OPEN -> SUSPENDED (appends are refused until resumed)."""
        return self._transition("suspend", session_id)

    def resume_session(self, session_id: str) -> SessionMetadata:
        """SUSPENDED -> OPEN."""
        return self._transition("resume", session_id)

    def resolve_session(self, session_id: str) -> SessionMetadata:
        """OPEN or SUSPENDED -> RESOLVED (terminal)."""
        return self._transition("resolve", session_id)

    def cancel_session(self, session_id: str) -> SessionMetadata:
        """OPEN or SUSPENDED -> CANCELLED; an already terminal session is returned as is."""
        return self._transition("cancel", session_id)

    def _transition(self, op: str, session_id: str) -> SessionMetadata:
        _check_name("session_id", session_id)
        result: SessionMetadata = self._submit("transition", op, session_id)
        return result

    def expire_due(self, now_ms: int | None = None) -> list[SessionMetadata]:
        """Expire sessions past their TTL or suspension cap; returns what it expired."""
        if now_ms is not None and not isinstance(now_ms, int):
            raise InvalidArgument("now_ms must be an int (ms since the epoch) or None")
        result: list[SessionMetadata] = self._submit("expire", now_ms)
        return result

    def compact_session(self, session_id: str, through_ordinal: int, snapshot: bytes) -> Snapshot:
        """Store `snapshot` as standing for every event up to `through_ordinal` and drop
        those events: the retained range then starts at `through_ordinal + 1`. Ordinals of
        the events kept do not change. Works on terminal sessions too."""
        _check_name("session_id", session_id)
        if not isinstance(through_ordinal, int) or through_ordinal < 1:
            raise InvalidArgument("through_ordinal must be an int >= 1")
        if not isinstance(snapshot, bytes):
            raise InvalidArgument("snapshot must be bytes (encode it first)")
        if len(snapshot) > MAX_BATCH_BYTES:
            raise InvalidArgument(f"a snapshot is limited to {MAX_BATCH_BYTES} bytes")
        result: Snapshot = self._submit("compact_session", session_id, through_ordinal, snapshot)
        return result

    def snapshot(self, session_id: str) -> Snapshot | None:
        """The session's latest snapshot (with a cursor to resume after it), or None."""
        self._check_open()
        with self._view.env.begin() as txn:
            row = self._row(txn, session_id)
        if not row.snapshot_position:
            return None
        with SegmentReader(self._log.directory, row.snapshot_segment) as reader:
            info, body = reader.read_frame(row.snapshot_offset)
            position = info.first_position
            for record in decode_frame_body(body):
                if (
                    isinstance(record, SnapshotTaken)
                    and record.incarnation == row.incarnation
                    and record.through_ordinal == row.snapshot_ordinal
                ):
                    return Snapshot(
                        row.session_id,
                        record.through_ordinal,
                        record.data,
                        self._codec.encode(
                            TokenKind.SESSION, self._scope(row), position, record.through_ordinal
                        ),
                    )
                position += 1
        raise JournalCorrupt(
            reader.name, row.snapshot_offset, f"the snapshot of {session_id!r} is missing"
        )

    def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Apply the history windows and session retention, then delete segments that hold
        nothing live. Also runs by itself whenever the writer starts a new segment."""
        if now_ms is not None and not isinstance(now_ms, int):
            raise InvalidArgument("now_ms must be an int (ms since the epoch) or None")
        report: RetentionReport = self._submit("retention", now_ms)
        return report

    def verify(
        self, fix: bool = False, progress: Callable[[int, int], None] | None = None
    ) -> VerifyReport:
        """Check every frame checksum, every sidecar, and the view against the log.

        `fix=False` only reports (problems name the segment and byte offset). `fix=True`
        rewrites bad sidecars and rebuilds the LMDB view from the segments; damaged frames
        themselves cannot be repaired (restore the segment from a backup).
        `progress(done_bytes, total_bytes)` is called as segments are checked.
        """
        self._check_open()
        if fix and self.readonly:
            raise ReadOnlyStore("verify(fix=True) needs a writable journal")
        if fix:
            report: VerifyReport = self._submit("verify_fix", progress)
            return report
        with self._view.env.begin() as txn:
            head = self._view.head(txn)
        problems, frames, records, _ = check_log(self._log, head, progress)
        if not any(p.segment != "index" for p in problems):
            rebuilt, directory = rebuild_into_temporary(self._log)
            try:
                with self._view.env.begin() as txn, rebuilt.env.begin() as rebuilt_txn:
                    problems += compare_views(self._view, txn, rebuilt, rebuilt_txn)
            finally:
                rebuilt.close()
                shutil.rmtree(directory, ignore_errors=True)
        return VerifyReport(len(self._log.bases()), frames, records, problems)

    def compact(
        self,
        dead_share: float = DEFAULT_DEAD_SHARE,
        progress: Callable[[int, int], None] | None = None,
    ) -> CompactionReport:
        """Reclaim space: delete sealed segments that hold nothing live, and rewrite (zstd,
        block-wise) those whose dead share is at least `dead_share`, or that are not yet
        compressed, copying only live frames. Positions, ordinals and cursors are unchanged.
        Writers and readers keep working meanwhile. `progress(done, total)` counts segments.
        """
        self._check_open()
        if self.readonly:
            raise ReadOnlyStore("compact() needs a writable journal")
        if not isinstance(dead_share, (int, float)) or not 0.0 <= dead_share <= 1.0:
            raise InvalidArgument("dead_share must be a number between 0 and 1")
        started = time.perf_counter()
        bytes_before = _sealed_bytes(self._log)
        retention: RetentionReport = self._submit("retention", None)
        deleted = list(retention.deleted_segments)
        rewritten: list[str] = []
        copied = 0
        bases = self._log.bases()[:-1]
        for done, base in enumerate(bases, start=1):
            try:
                copied += self._compact_segment(base, dead_share, rewritten)
            finally:
                if progress is not None:
                    progress(done, len(bases))
        return CompactionReport(
            rewritten,
            deleted,
            bytes_before,
            _sealed_bytes(self._log),
            copied,
            time.perf_counter() - started,
        )

    def _compact_segment(self, base: int, dead_share: float, rewritten: list[str]) -> int:
        """Rewrite one sealed segment if it is worth it; returns the live bytes copied."""
        directory = self._log.directory
        source = file_identity(directory, base)
        summary = read_summary(directory, base)
        if source is None or summary is None:
            return 0
        with self._view.env.begin() as txn:
            live, live_bytes, total = live_frames(txn, self._view, summary)
        compressed = source[0].endswith(".zst")
        if not live:
            return 0  # dead: the retention pass deletes those
        if compressed and total - live_bytes < dead_share * total:
            return 0
        try:
            temporary, new_summary = rewrite(directory, base, live)
        except FileNotFoundError:
            return 0  # deleted meanwhile by another writer's retention pass
        if compressed and os.path.getsize(temporary) > source[2]:
            # Kept frames that were not contiguous compress in separate blocks; when that
            # costs more than the dead frames it drops, keep the old file.
            os.unlink(temporary)
            return 0
        if self._submit("swap", base, temporary, new_summary, source, summary.last_position):
            rewritten.append(segment_name(base, compressed=True))
            return live_bytes
        return 0

    # -- sessions: reads -------------------------------------------------------------------

    def get_session(self, session_id: str) -> SessionMetadata:
        """The session's metadata; `SessionNotFound` if it does not exist."""
        self._check_open()
        with self._view.env.begin() as txn:
            return _metadata(self._row(txn, session_id))

    def _row(self, txn: lmdb.Transaction, session_id: str) -> SessionRow:
        _check_name("session_id", session_id)
        row = self._view.row(txn, session_id)
        if row is None:
            raise SessionNotFound(
                f"no session {session_id!r} in this store: check the id with "
                "`journal sessions list`"
            )
        return row

    def list_sessions_page(
        self,
        page_size: int = DEFAULT_PAGE_SIZE,
        page_token: str | None = None,
        state: SessionState | None = None,
    ) -> SessionPage:
        """One page of sessions in session-id order; pass `next_page_token` for the next."""
        self._check_open()
        if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
            raise InvalidArgument(f"page_size must be an int >= 1, got {page_size!r}")
        if state is not None and not isinstance(state, SessionState):
            raise InvalidArgument("state must be a SessionState or None")
        page_size = min(page_size, MAX_PAGE_SIZE)
        scope = scope_digest(self.store_id, purpose="list:" + (state.value if state else "*"))
        view = self._view
        sessions: list[SessionMetadata] = []
        with view.env.begin() as txn:
            cursor = txn.cursor(db=view.sessions)
            after: bytes | None = None
            if page_token:
                claims = self._codec.decode(page_token, TokenKind.PAGE, scope)
                last_id = view.session_id_of(txn, claims.position)
                if last_id is None:
                    raise InvalidPageToken(
                        "this page token does not match this store's sessions (stale or "
                        "from a restored copy): start again without a token"
                    )
                after = last_id.encode()
            elif page_token is not None and page_token != "":
                raise InvalidPageToken("page_token must be a str")
            positioned = cursor.set_range(after) if after is not None else cursor.first()
            if positioned and after is not None and cursor.key() == after:
                positioned = cursor.next()
            last_row: SessionRow | None = None
            more = False
            while positioned:
                row = view.decode_row(cursor.value())
                if state is None or row.session_state is state:
                    if len(sessions) == page_size:
                        more = True
                        break
                    sessions.append(_metadata(row))
                    last_row = row
                positioned = cursor.next()
        token = ""
        if more and last_row is not None:
            token = self._codec.encode(TokenKind.PAGE, scope, last_row.incarnation)
        return SessionPage(sessions, token)

    def list_sessions(
        self, state: SessionState | None = None, page_size: int = DEFAULT_PAGE_SIZE
    ) -> Iterator[SessionMetadata]:
        """Every session (optionally in one state), lazily, page by page."""
        token: str | None = None
        while True:
            page = self.list_sessions_page(page_size=page_size, page_token=token, state=state)
            yield from page.sessions
            if not page.next_page_token:
                return
            token = page.next_page_token

    # -- events: reads ---------------------------------------------------------------------

    def _scope(self, row: SessionRow) -> bytes:
        key = (row.session_id, row.incarnation)
        scope = self._scopes.get(key)
        if scope is None:
            # A deliberate, bounded cache: one SHA-256 per session, not per append.
            if len(self._scopes) >= 65536:
                self._scopes.clear()
            scope = self._scopes[key] = scope_digest(self.store_id, row.session_id, row.incarnation)
        return scope

    def _after_ordinal(self, row: SessionRow, cursor: str | None) -> int:
        if cursor is None:
            return row.first_ordinal - 1
        claims = self._codec.decode(cursor, TokenKind.SESSION, self._scope(row))
        after = claims.ordinal
        if after > row.last_ordinal:
            raise CursorFuture(
                f"the cursor points at ordinal {after} but session {row.session_id!r} ends at "
                f"{row.last_ordinal} (was the store restored from an older copy?): resume "
                "from a cursor this store issued, or from the start",
                head_ordinal=row.last_ordinal,
            )
        if after < row.first_ordinal - 1:
            raise self._expired(row, after)
        return after

    def _expired(self, row: SessionRow, after: int) -> CursorExpired:
        resume = self._codec.encode(TokenKind.SESSION, self._scope(row), 0, row.first_ordinal - 1)
        return CursorExpired(
            f"events {after + 1}..{row.first_ordinal - 1} of session {row.session_id!r} are "
            f"no longer retained (rotated or compacted away); the earliest retained ordinal "
            f"is {row.first_ordinal}: resume from the error's resume_cursor to accept the gap, "
            "or rebuild from a snapshot",
            earliest_ordinal=row.first_ordinal,
            resume_cursor=resume,
        )

    def _read_events(
        self,
        txn: lmdb.Transaction,
        row: SessionRow,
        after: int,
        max_bytes: int,
        readers: ReaderCache,
    ) -> tuple[list[Event], bool]:
        """Events after ordinal `after` up to about `max_bytes`, and whether more follow."""
        start = after + 1
        last = row.last_ordinal
        if start > last:
            return [], False
        incarnation = row.incarnation
        session_id = row.session_id
        context = _ReadContext(
            session_id, partial(self._codec.encode, TokenKind.SESSION, self._scope(row))
        )
        events: list[Event] = []
        size = 0
        expected = start
        full = False
        append = events.append
        head = self._view.head(txn)
        head_segment, head_end = (head.segment, head.end_offset) if head else (0, 0)
        reader: SegmentReader | None = None
        for _, segment, offset in self._view.iter_frame_locations(txn, incarnation, start):
            reader = readers.get(segment)
            info, body = reader.read_frame(offset, head_end if segment == head_segment else None)
            try:
                records = decode_frame_for_read(body)
            except msgspec.DecodeError as e:
                raise JournalCorrupt(reader.name, offset, f"undecodable frame: {e}") from None
            position = info.first_position
            count = len(records)
            first_record = records[0]
            last_record = records[-1]
            if (
                first_record.__class__ is Event
                and last_record.__class__ is Event
                and first_record._incarnation == incarnation
                and last_record._incarnation == incarnation
                and first_record.ordinal == expected
                and last_record.ordinal == expected + count - 1
                and last_record.ordinal <= last
                and size + info.body_length <= max_bytes
            ):
                # The common frame: one batch of this session's next events (dense
                # ordinals leave no room for other records between first and last),
                # and it fits the page whole (the body length bounds the data).
                batch = cast("list[Event]", records)
                if first_record.position == position:
                    for event in batch:
                        event._context = context
                        size += len(event.data)
                else:  # written before records carried their position
                    for event in batch:
                        event._context = context
                        event.position = position
                        size += len(event.data)
                        position += 1
                events.extend(batch)
                expected += count
                if expected > last:
                    break
                continue
            # The general case, one record at a time: kept flat, no calls in the loop.
            for record in records:
                if record.__class__ is Event and record._incarnation == incarnation:
                    ordinal = record.ordinal
                    if ordinal >= expected:
                        if ordinal != expected:
                            raise JournalCorrupt(
                                reader.name,
                                offset,
                                f"session {session_id!r} skips from ordinal "
                                f"{expected - 1} to {ordinal}",
                            )
                        length = len(record.data)
                        if events and size + length > max_bytes:
                            full = True
                            break
                        record.position = position
                        record._context = context
                        append(record)
                        size += length
                        expected += 1
                        if expected > last:
                            break
                position += 1
            if full or expected > last:
                break
        if not full and expected <= last:
            # The view points past what the segments hold: name the last segment read
            # (or the active one) so the message leads to a real file.
            raise JournalCorrupt(
                reader.name if reader is not None else segment_name(head_segment),
                0,
                f"the index of session {session_id!r} has no frame for ordinal {expected}",
            )
        return events, expected <= last

    def read(
        self, session_id: str, cursor: str | None = None, max_bytes: int = DEFAULT_PAGE_BYTES
    ) -> Page:
        """One bounded page of retained events after `cursor` (from the start if None).

        The page holds events while their data totals at most `max_bytes`, and always at
        least one event if any follows, so one oversized event gets through whole.
        """
        self._check_open()
        if not isinstance(max_bytes, int) or max_bytes < 1:
            raise InvalidArgument("max_bytes must be an int >= 1")
        row, after = self._start(session_id, cursor)
        with ReaderCache(self._log.directory) as readers:
            events, has_more, _, _ = self._page_after(row, after, max_bytes, readers)
        next_cursor = events[-1].cursor if events else cursor
        return Page(events, next_cursor, has_more)

    def replay(
        self, session_id: str, cursor: str | None = None, max_bytes: int = DEFAULT_PAGE_BYTES
    ) -> Iterator[Event]:
        """Every retained event after `cursor`, page by page (what is committed now)."""
        row, after = self._start(session_id, cursor)
        return self._follow(row, after, stop=None, live=False, max_bytes=max_bytes)

    def _start(self, session_id: str, cursor: str | None) -> tuple[SessionRow, int]:
        """The session and the ordinal to read after; cursor errors are raised here."""
        self._check_open()
        with self._view.env.begin() as txn:
            row = self._row(txn, session_id)
            return row, self._after_ordinal(row, cursor)

    def watch(
        self,
        session_id: str,
        cursor: str | None = None,
        stop: threading.Event | None = None,
        max_bytes: int = DEFAULT_PAGE_BYTES,
    ) -> Iterator[Event]:
        """Replay the retained events after `cursor`, then follow new ones live.

        Ends by itself when the session is terminal and every event was delivered, or
        promptly after `stop` is set. Cursor errors are raised here, before iteration.
        """
        row, after = self._start(session_id, cursor)
        return self._follow(row, after, stop=stop, live=True, max_bytes=max_bytes)

    def _page_after(
        self, row: SessionRow, after: int, max_bytes: int, readers: ReaderCache
    ) -> tuple[list[Event], bool, bool, int]:
        """(events, has_more, terminal, committed next position) in one read snapshot."""
        for attempt in range(3):
            readers.begin_page()
            try:
                page = self._page_after_once(row, after, max_bytes, readers)
            except (FileNotFoundError, JournalCorrupt):
                # Retention deleted (or compaction dropped) a frame this snapshot still
                # pointed at: a newer snapshot either no longer needs it or says the
                # history expired. Real damage fails again and is raised.
                readers.close()
                if attempt == 2:
                    raise
                continue
            readers.end_page()
            return page
        raise AssertionError("unreachable")

    def _page_after_once(
        self, row: SessionRow, after: int, max_bytes: int, readers: ReaderCache
    ) -> tuple[list[Event], bool, bool, int]:
        with self._view.env.begin() as txn:
            head = self._view.head(txn)
            current = self._view.row(txn, row.session_id)
            if current is None or current.incarnation != row.incarnation:
                raise SessionNotFound(
                    f"session {row.session_id!r} was evicted while being read; its "
                    "remaining history is gone"
                )
            if after < current.first_ordinal - 1:
                raise self._expired(current, after)
            events, has_more = self._read_events(txn, current, after, max_bytes, readers)
            terminal = current.session_state.terminal
        return events, has_more, terminal, 1 if head is None else head.next_position

    def _follow(
        self,
        row: SessionRow,
        after: int,
        *,
        stop: threading.Event | None,
        live: bool,
        max_bytes: int,
    ) -> Iterator[Event]:
        # Pages are flattened by itertools.chain (in C): no generator frame per event.
        return itertools.chain.from_iterable(
            self._follow_pages(row, after, stop=stop, live=live, max_bytes=max_bytes)
        )

    def _follow_pages(
        self,
        row: SessionRow,
        after: int,
        *,
        stop: threading.Event | None,
        live: bool,
        max_bytes: int,
    ) -> Iterator[list[Event]]:
        with ReaderCache(self._log.directory) as readers:
            while not self._closed:
                if stop is not None and stop.is_set():
                    return
                events, has_more, terminal, seen = self._page_after(row, after, max_bytes, readers)
                if events:
                    after = events[-1].ordinal
                    yield events
                if has_more:
                    continue
                if not live or terminal:
                    if not events or not live:
                        return
                    continue
                if not events:
                    self._notifier.wait(seen, stop)

    async def awatch(
        self,
        session_id: str,
        cursor: str | None = None,
        max_bytes: int = DEFAULT_PAGE_BYTES,
    ) -> AsyncIterator[Event]:
        """The asyncio twin of `watch`; cancel the task (or break) to stop."""
        row, after = self._start(session_id, cursor)
        with ReaderCache(self._log.directory) as readers:
            while not self._closed:
                events, has_more, terminal, seen = self._page_after(row, after, max_bytes, readers)
                if events:
                    after = events[-1].ordinal
                    for event in events:
                        yield event
                if has_more:
                    continue
                if terminal:
                    if not events:
                        return
                    continue
                if not events:
                    await self._notifier.await_change(seen)

    # -- lifecycle feed --------------------------------------------------------------------

    def _lifecycle_after(self, cursor: str | None) -> tuple[int, bool]:
        """(feed position to resume after, whether to emit the startup snapshot)."""
        if cursor is None:
            return 0, True
        claims = self._codec.decode(cursor, TokenKind.LIFECYCLE, self._lifecycle_scope)
        head = self._committed_next_position() - 1
        if claims.position > head:
            raise CursorFuture(
                f"the lifecycle cursor points at position {claims.position} but this store "
                f"ends at {head}: watch from a cursor this store issued, or without one",
                head_ordinal=head,
            )
        return claims.position, False

    def _lifecycle_event(self, entry: FeedEntry, position: int) -> LifecycleEvent:
        return LifecycleEvent(
            event_type=LifecycleEventType(entry.event_type),
            session=_metadata(entry.row),
            cursor=self._codec.encode(TokenKind.LIFECYCLE, self._lifecycle_scope, position),
            observed_at_ms=entry.at_ms,
        )

    def _snapshot(self) -> Iterator[LifecycleEvent | int]:
        """One CREATED per session, all from one read snapshot; finally its position.

        The rows are copied out of the read transaction before anything is yielded, so a
        slow or abandoned consumer never pins an LMDB reader slot (memory: the registry's
        encoded size)."""
        view = self._view
        with view.env.begin() as txn:
            head = view.head(txn)
            point = 0 if head is None else head.next_position - 1
            raws = [bytes(raw) for _, raw in txn.cursor(db=view.sessions)]
        cursor_text = self._codec.encode(TokenKind.LIFECYCLE, self._lifecycle_scope, point)
        now = _now_ms()
        for raw in raws:
            if self._closed:
                return
            yield LifecycleEvent(
                LifecycleEventType.CREATED, _metadata(view.decode_row(raw)), cursor_text, now
            )
        yield point

    def _feed_after(self, after: int, limit: int = 256) -> tuple[list[LifecycleEvent], int, int]:
        """Feed entries after `after` (at most `limit`), the new `after`, the head."""
        view = self._view
        events: list[LifecycleEvent] = []
        with view.env.begin() as txn:
            head = view.head(txn)
            cursor = txn.cursor(db=view.feed)
            positioned = cursor.set_range((after + 1).to_bytes(8, "big"))
            while positioned and len(events) < limit:
                position = int.from_bytes(cursor.key(), "big")
                events.append(self._lifecycle_event(view.decode_feed(cursor.value()), position))
                after = position
                positioned = cursor.next()
        return events, after, 1 if head is None else head.next_position

    def watch_sessions(
        self, cursor: str | None = None, stop: threading.Event | None = None
    ) -> Iterator[LifecycleEvent]:
        """Lifecycle events: with no cursor, one CREATED per existing session first; then
        live changes. Resuming from an event's cursor yields the changes after it."""
        self._check_open()
        after, snapshot = self._lifecycle_after(cursor)
        return self._watch_sessions(after, snapshot, stop)

    def _watch_sessions(
        self, after: int, snapshot: bool, stop: threading.Event | None
    ) -> Iterator[LifecycleEvent]:
        if snapshot:
            for item in self._snapshot():
                if isinstance(item, int):
                    after = item
                else:
                    yield item
        while not self._closed:
            if stop is not None and stop.is_set():
                return
            events, after, seen = self._feed_after(after)
            yield from events
            if not events:
                self._notifier.wait(seen, stop)

    async def awatch_sessions(self, cursor: str | None = None) -> AsyncIterator[LifecycleEvent]:
        """The asyncio twin of `watch_sessions`."""
        self._check_open()
        after, snapshot = self._lifecycle_after(cursor)
        if snapshot:
            for item in self._snapshot():
                if isinstance(item, int):
                    after = item
                else:
                    yield item
        while not self._closed:
            events, after, seen = self._feed_after(after)
            for event in events:
                yield event
            if not events:
                await self._notifier.await_change(seen)


_ABSENT: Final = object()


def _window_start(
    txn: lmdb.Transaction, view: View, row: SessionRow, policy: RetentionPolicy, now: int
) -> int:
    """The first ordinal the session's history windows keep (frame granularity: a window
    never cuts a batch, and the newest frame is kept whatever its size)."""
    limit_bytes = row.max_history_bytes or policy.max_history_bytes
    limit_age = row.max_history_age_ms or policy.max_history_age_ms
    over_bytes = limit_bytes is not None and row.retained_bytes > limit_bytes
    if not over_bytes and limit_age is None:
        return row.first_ordinal
    new_first = row.first_ordinal
    prefix = U64.pack(row.incarnation)
    cursor = txn.cursor(db=view.events)
    if not cursor.set_range(prefix):
        return new_first
    frames: list[tuple[int, int, int]] = []  # first ordinal, bytes before, time
    while cursor.key()[:8] == prefix:
        _, first_in_frame = U64X2.unpack(cursor.key())
        _, _, bytes_before, timestamp = LOCATION.unpack(cursor.value())
        frames.append((first_in_frame, bytes_before, timestamp))
        if not cursor.next():
            break
    if not frames:
        return new_first
    if over_bytes and limit_bytes is not None:
        for first_in_frame, bytes_before, _ in frames:
            if row.appended_bytes - bytes_before <= limit_bytes:
                new_first = max(new_first, first_in_frame)
                break
        else:
            new_first = max(new_first, frames[-1][0])
    if limit_age is not None:
        horizon = now - limit_age
        if frames[-1][2] < horizon:
            new_first = max(new_first, row.last_ordinal + 1)
        else:
            for first_in_frame, _, timestamp in frames:
                if timestamp >= horizon:
                    new_first = max(new_first, first_in_frame)
                    break
    return new_first


class _Planner:
    """Validates one batch of requests against the state inside the write transaction and
    turns them into records, in order, as if they were applied one by one."""

    def __init__(self, journal: Journal, txn: lmdb.Transaction, next_position: int, now: int):
        self.journal = journal
        self.txn = txn
        self.view = journal._view
        self.next_position = next_position
        self.now = now
        self.records: list[Record] = []
        self.sessions: dict[str, _Pending | None] = {}
        self.idem: dict[tuple[int, str], IdempotencyKeyUsed] = {}
        # incarnation -> (first, last) ordinal of its events in this frame, for the sidecar.
        self.runs: dict[int, tuple[int, int]] = {}
        # (start index, count, incarnation, first ordinal, data bytes) per append.
        self.event_runs: list[tuple[int, int, int, int, int]] = []
        # (index in the frame, record) of every record that is not an event.
        self.others: list[tuple[int, Record]] = []
        # Segments the view forgot in this transaction: deleted once it commits.
        self.doomed: list[int] = []
        self._finishers: list[tuple[_Request, Any]] = []

    def _emit(self, record: Record) -> int:
        """Add a non-event record (events go in whole runs, in `_plan_append`)."""
        self.others.append((len(self.records), record))
        self.records.append(record)
        position = self.next_position
        self.next_position += 1
        return position

    def _pending(self, session_id: str) -> _Pending | None:
        if session_id not in self.sessions:
            row = self.view.row(self.txn, session_id)
            self.sessions[session_id] = None if row is None else _Pending(row)
        return self.sessions[session_id]

    def _existing(self, session_id: str) -> _Pending:
        pending = self._pending(session_id)
        if pending is None:
            raise SessionNotFound(
                f"no session {session_id!r} in this store: create it first "
                "(Journal.create_session or `journal sessions list` to check the id)"
            )
        return pending

    def plan(self, request: _Request) -> None:
        """Plan one request; its failure (of any kind) is its own and leaves no trace."""
        mark = (
            len(self.records),
            self.next_position,
            len(self.event_runs),
            len(self._finishers),
            dict(self.runs),
            len(self.others),
        )
        try:
            getattr(self, "_plan_" + request.op)(request, *request.args)
        except Exception as e:
            records, next_position, event_runs, finishers, runs, others = mark
            del self.records[records:]
            self.next_position = next_position
            del self.event_runs[event_runs:]
            del self._finishers[finishers:]
            del self.others[others:]
            self.runs = runs
            request.result = None
            request.error = e

    def _plan_create(self, request: _Request, record: SessionCreated) -> None:
        if self._pending(record.session_id) is not None:
            raise SessionExists(
                f"session {record.session_id!r} already exists: pick another id, or use "
                "get_session to inspect it"
            )
        record = msgspec.structs.replace(record, created_at_ms=self.now)
        position = self._emit(record)
        row = SessionRow.created(record, position)
        self.sessions[record.session_id] = _Pending(row)
        self._finishers.append((request, ("feed", position)))

    def _plan_append(
        self,
        request: _Request,
        session_id: str,
        events: list[EventIn],
        expected_last_ordinal: int | None,
        idempotency_key: str | None,
        digest: bytes,
    ) -> None:
        pending = self._existing(session_id)
        incarnation = pending.incarnation
        scope = self.journal._scope(pending.row)
        if idempotency_key is not None:
            used = self.idem.get((incarnation, idempotency_key))
            if used is None:
                entry = self.view.idem_entry(self.txn, incarnation, idempotency_key)
                if entry is not None:
                    used = IdempotencyKeyUsed(
                        incarnation,
                        idempotency_key,
                        entry.first_ordinal,
                        entry.last_ordinal,
                        entry.digest,
                        entry.last_position,
                    )
            if used is not None:
                if used.digest != digest:
                    raise IdempotencyKeyReused(
                        f"idempotency key {idempotency_key!r} was already used on session "
                        f"{session_id!r} with different events: use a new key for new events"
                    )
                request.result = AppendResult(
                    session_id,
                    used.first_ordinal,
                    used.last_ordinal,
                    self.journal._codec.encode(
                        TokenKind.SESSION, scope, used.last_position, used.last_ordinal
                    ),
                    deduplicated=True,
                )
                return
        if pending.state is not SessionState.OPEN:
            hint = (
                "resume it first"
                if pending.state is SessionState.SUSPENDED
                else "it has ended; create a new session"
            )
            raise SessionNotWritable(f"session {session_id!r} is {pending.state.value}: {hint}")
        if expected_last_ordinal is not None and expected_last_ordinal != pending.last_ordinal:
            raise OrdinalConflict(
                f"session {session_id!r} ends at ordinal {pending.last_ordinal}, not "
                f"{expected_last_ordinal}: read the new events and retry",
                expected=expected_last_ordinal,
                actual=pending.last_ordinal,
            )
        first = pending.last_ordinal + 1
        now = self.now
        base = self.next_position
        self.event_runs.append(
            (len(self.records), len(events), incarnation, first, sum(len(e.data) for e in events))
        )
        self.records.extend(
            [
                EventAppended(incarnation, first + i, now, e.type, e.data, e.request_id, base + i)
                for i, e in enumerate(events)
            ]
        )
        self.next_position += len(events)
        position = self.next_position - 1
        ordinal = first + len(events)
        run = self.runs.get(incarnation)
        self.runs[incarnation] = (run[0] if run else first, ordinal - 1)
        last = ordinal - 1
        pending.last_ordinal = last
        if idempotency_key is not None:
            used = IdempotencyKeyUsed(incarnation, idempotency_key, first, last, digest, position)
            self.idem[(incarnation, idempotency_key)] = used
            self._emit(used)
        request.result = AppendResult(
            session_id,
            first,
            last,
            self.journal._codec.encode(TokenKind.SESSION, scope, position, last),
        )

    def _plan_transition(self, request: _Request, op: str, session_id: str) -> None:
        pending = self._existing(session_id)
        allowed, target = _ALLOWED[op]
        if pending.state not in allowed:
            if op == "cancel" and pending.state.terminal:
                self._finishers.append((request, ("row", session_id)))
                return
            raise IllegalTransition(
                f"cannot {op} session {session_id!r}: it is {pending.state.value} "
                f"(allowed from: {', '.join(sorted(s.value for s in allowed))})"
            )
        position = self._emit(StateChanged(pending.incarnation, target.wire, self.now))
        pending.state = target
        self._finishers.append((request, ("feed", position)))

    def _plan_verify_fix(
        self, request: _Request, progress: Callable[[int, int], None] | None
    ) -> None:
        journal = self.journal
        view = self.view
        head = view.head(self.txn)
        problems, frames, records, bad_sidecars = check_log(journal._log, head, progress)
        damaged = {p.segment for p in problems if p.segment.endswith((".seg", ".seg.zst"))}
        for base in bad_sidecars:
            if segment_name(base) in damaged or segment_name(base, compressed=True) in damaged:
                continue
            write_summary(journal._log.directory, summarize_segment(journal._log.directory, base))
        if not damaged:
            # Only derived data was wrong: rebuild the view from the (intact) log.
            for db in view.all_dbs():
                self.txn.drop(db, delete=False)
            self.txn.put(b"store", journal.store_id, db=view.meta)
            self.txn.put(b"boot", _BOOT_ID, db=view.meta)
            project_log(journal._log, view, self.txn)
            journal._summaries.clear()
        # With damaged frames the view is left as it is: it still points readers at the
        # damage (JournalCorrupt), where a rebuild would make the lost events look trimmed.
        request.result = VerifyReport(
            len(journal._log.bases()), frames, records, problems, fixed=not damaged
        )

    def _plan_swap(
        self,
        request: _Request,
        base: int,
        temporary: str,
        summary: SegmentSummary,
        source: tuple[str, int, int],
        original_last_position: int,
    ) -> None:
        journal = self.journal
        request.result = swap_segment(
            self.txn,
            self.view,
            journal._log,
            base,
            temporary,
            summary,
            source,
            original_last_position,
        )
        journal._summaries.pop(base, None)

    def _plan_compact_session(
        self, request: _Request, session_id: str, through_ordinal: int, data: bytes
    ) -> None:
        pending = self._existing(session_id)
        row = pending.row
        if through_ordinal > pending.last_ordinal:
            raise InvalidArgument(
                f"session {session_id!r} ends at ordinal {pending.last_ordinal}; a snapshot "
                f"cannot stand for events up to {through_ordinal}"
            )
        if through_ordinal < row.snapshot_ordinal:
            raise InvalidArgument(
                f"session {session_id!r} already has a snapshot through ordinal "
                f"{row.snapshot_ordinal}; a new one must reach at least that far"
            )
        position = self._emit(SnapshotTaken(pending.incarnation, through_ordinal, self.now, data))
        request.result = Snapshot(
            session_id,
            through_ordinal,
            data,
            self.journal._codec.encode(
                TokenKind.SESSION, self.journal._scope(row), position, through_ordinal
            ),
        )

    def _plan_retention(self, request: _Request, now_ms: int | None) -> None:
        now = self.now if now_ms is None else now_ms
        policy = self.journal.retention
        view = self.view
        trimmed: list[str] = []
        evicted: list[str] = []
        for _, raw in self.txn.cursor(db=view.sessions):
            row = view.decode_row(bytes(raw))
            if self.sessions.get(row.session_id, _ABSENT) is not _ABSENT:
                continue  # changed earlier in this batch: left for the next pass
            state = row.session_state
            if state.terminal and policy.session_retention_ms is not None:
                since = (
                    row.created_at_ms
                    if policy.session_retention_from == "started"
                    else (row.ended_at_ms or row.created_at_ms)
                )
                if since + policy.session_retention_ms <= now:
                    self._emit(SessionEvicted(row.incarnation, self.now))
                    self.sessions[row.session_id] = None
                    evicted.append(row.session_id)
                    continue
            new_first = _window_start(self.txn, view, row, policy, now)
            if new_first > row.first_ordinal:
                self._emit(HistoryTrimmed(row.incarnation, new_first, self.now))
                trimmed.append(row.session_id)
        self._finishers.append((request, ("retention", (trimmed, evicted))))

    def _plan_expire(self, request: _Request, now_ms: int | None) -> None:
        now = self.now if now_ms is None else now_ms
        view = self.view
        positions = []
        cursor = self.txn.cursor(db=view.deadlines)
        positioned = cursor.first()
        while positioned:
            due, incarnation = (
                int.from_bytes(cursor.key()[:8], "big"),
                int.from_bytes(cursor.key()[8:], "big"),
            )
            if due > now:
                break
            positioned = cursor.next()
            row = view.row_by_incarnation(self.txn, incarnation)
            if row is None:
                continue
            if row.session_id in self.sessions:
                continue  # changed earlier in this batch: its stored deadline is stale
            pending = self._pending(row.session_id)
            if pending is None or pending.incarnation != incarnation or pending.state.terminal:
                continue
            position = self._emit(
                StateChanged(incarnation, SessionState.EXPIRED.wire, self.now, "deadline")
            )
            pending.state = SessionState.EXPIRED
            positions.append(position)
        self._finishers.append((request, ("feeds", positions)))

    def digest(self) -> FrameDigest:
        """What the planned frame holds, for the sidecar (the same as a rescan finds)."""
        runs: list[tuple[int, int, int, int, int, int]] = []
        for start, count, incarnation, first, size in self.event_runs:
            if runs:
                p_start, p_incarnation, p_first, p_count, p_size, at = runs[-1]
                if (
                    p_start + p_count == start
                    and p_incarnation == incarnation
                    and p_first + p_count == first
                ):
                    runs[-1] = (p_start, incarnation, p_first, p_count + count, p_size + size, at)
                    continue
            runs.append((start, incarnation, first, count, size, self.now))
        others = [(index, encode_other(record)) for index, record in self.others]
        return FrameDigest(dict(self.runs), runs, others)

    def _feed_metadata(self, position: int) -> SessionMetadata:
        raw = self.txn.get(position.to_bytes(8, "big"), db=self.view.feed)
        assert raw is not None, "a planned lifecycle record has no feed entry"
        return _metadata(self.view.decode_feed(bytes(raw)).row)

    def finish(self, projection: Projection) -> None:
        """Fill in results that need the projected rows (metadata after each change)."""
        txn = self.txn
        for request, (kind, value) in self._finishers:
            if request.error is not None:
                continue
            if kind == "feed":
                request.result = self._feed_metadata(value)
            elif kind == "feeds":
                request.result = [self._feed_metadata(p) for p in value]
            elif kind == "retention":
                trimmed, evicted = value
                dead = dead_segments(txn, self.view, self.journal._log, self.journal._summaries)
                forget_segments(txn, self.view, dead)
                for summary in dead:
                    self.journal._summaries.pop(summary.base_position, None)
                self.doomed.extend(summary.base_position for summary in dead)
                request.result = RetentionReport(
                    trimmed, evicted, [segment_name(s.base_position) for s in dead], 0
                )
            else:
                request.result = _metadata(self.journal._row(txn, value))
