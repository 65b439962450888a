"""The LMDB view: a materialised projection of the segment log, rebuildable from it.

Nothing here is the truth: every entry is derived from records in the segments by the
projector. LMDB's own fsync is off because the view can always be rebuilt; the segment
fsync is the commit point. Every key layout and prefix scan lives in this module, except
those of the indexes with modules of their own (`events_index`, `state_index`,
`retention_index`); callers pass transactions (`View.begin`) and get rows,
entries and numbers back. The value codec is `view_codec`; checking and replacing the
data file, apart from LMDB, is `view_file`.

Named databases (keys big-endian so LMDB's byte order is numeric order):

    meta         b"head" -> Head; b"store" -> store id; b"boot" -> boot id of the last writer;
                 b"feed-floor" -> u64: feed entries at or below it may have been pruned;
                 b"lost:" + u64 incarnation -> MissingEvents: what a rebuild found lost
    sessions     session id (utf-8) -> SessionRow (staged imports: NUL-prefixed ids)
    incarnations u64 incarnation -> session id (kept after eviction: page tokens resolve it)
    events       u64 incarnation -> sorted duplicates, one per frame holding the session's
                 events: where the frame starts (`events_index`, `View.events`)
    idem         u64 incarnation + key (utf-8) -> IdemEntry
    feed         u64 position of a lifecycle record -> FeedEntry
    deadlines    u64 due ms + u64 incarnation -> b""  (TTL and suspension caps)
    pins         u64 position -> u64 incarnation: non-event records that must survive
                 compaction (a live session's creation, last transition, snapshot, trim
                 and idempotency records; an eviction record while its session's
                 creation record may still exist)
    tombstones   u64 incarnation -> u64 position of its eviction record
    states       u8 state + session id -> u64 incarnation (`state_index`, `View.states`)
    aged         u64 incarnation -> b"": sessions with an age window of their own; with
                 meta b"retained" (`retention_index`, `View.retention`)

Every value (and every duplicate of `events`) ends with a CRC32 of the entry's key and the
rest of the value (big-endian),
checked on every read: a damaged entry is `JournalCorrupt` naming `index`, never a wrong
answer. `meta` also holds b"format" (`VIEW_FORMAT`): a view of another format is rebuilt.
LMDB errors that mean damage, and checks that fail, become `JournalCorrupt` here, in one
place (`View.begin` and the value codec), so the engine above sees only journal errors.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Final, NamedTuple

import lmdb
import msgspec

from ..errors import JournalClosed, JournalCorrupt
from ..forking import TRANSACTIONS
from ..sessions import FeedEntry, SessionRow
from .events_index import EventsIndex, Location
from .files import DEFAULT_PERMISSIONS, Permissions
from .lmdbenv import (
    MAX_READERS,
    OPENING,
    prepare_environment,
    refuse_if_open_here,
    register_open,
    unregister_open,
)
from .retention_index import RetentionIndex
from .state_index import StateIndex
from .view_codec import (
    U64,
    U64X2,
    corrupt,
    decoded,
    encoder,
    key_pair,
    key_u64,
    listed_row,
    row_decoder,
    seal,
    text_value,
    u64_value,
    unseal,
)
from .view_file import (
    FORMAT_KEY,
    INITIAL_MAP_SIZE,
    VIEW_FORMAT,
    ViewFile,
    inspect_view,
    replace_view,
)

__all__ = [
    "Head",
    "IdemEntry",
    "Location",
    "MissingEvents",
    "View",
    "corrupt",
]

# Staged imports are keyed by ids starting with NUL; every id a caller can name is above.
_STAGED_END: Final = b"\x01"

_EVENTS: Final = b"events"
_FEED_FLOOR: Final = b"feed-floor"
_LOST: Final = b"lost:"  # + u64 incarnation -> MissingEvents (see `View.put_missing`)
_NAMES: Final = (
    b"meta",
    b"sessions",
    b"incarnations",
    b"events",
    b"idem",
    b"feed",
    b"deadlines",
    b"pins",
    b"tombstones",
    b"states",
    b"aged",
)


class Head(msgspec.Struct, array_like=True):
    """How far the view has indexed the log: the active segment and the end of its last
    indexed frame, the next position to assign, and the last lifecycle record's position."""

    segment: int
    end_offset: int
    next_position: int
    lifecycle_position: int = 0


class IdemEntry(msgspec.Struct, array_like=True):
    """An idempotency key's append: its ordinals, the events' digest, the position of its
    last event and of the key's own record."""

    first_ordinal: int
    last_ordinal: int
    digest: bytes
    last_position: int = 0
    position: int = 0


class MissingEvents(NamedTuple):
    """Events `first` to `last` of a live session that the log lacks, though no record of
    it trims, snapshots or evicts them; the frame after them is at `offset` in
    `segment` (a base position)."""

    session_id: str
    incarnation: int
    first: int
    last: int
    segment: int
    offset: int

    def describe(self) -> str:
        return (
            f"events {self.first} to {self.last} of session {self.session_id!r} are missing "
            "from the log, and no record trims, snapshots or evicts them (a segment file "
            "was lost?)"
        )


_head_decoder: Final = msgspec.msgpack.Decoder(Head)
_feed_decoder: Final = msgspec.msgpack.Decoder(FeedEntry)
_missing_decoder: Final = msgspec.msgpack.Decoder(MissingEvents)
_idem_decoder: Final = msgspec.msgpack.Decoder(IdemEntry)
_U64_CRC: Final = struct.Struct(">QI")
_U64_MAX: Final = 2**64 - 1


# LMDB errors that mean the file is damaged (not a full map, a busy reader table, ...).
_DAMAGE_ERRORS: Final = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.InvalidError,
    lmdb.VersionMismatchError,
    lmdb.PanicError,
    lmdb.BadTxnError,  # (a transaction an earlier damage error left unusable)
)


def _open_db(env: lmdb.Environment, name: bytes, txn: lmdb.Transaction | None) -> lmdb._Database:
    """A named database (created when `txn`, a write transaction, is given)."""
    dup = name == _EVENTS
    return env.open_db(name, txn=txn, create=txn is not None, dupsort=dup, dupfixed=dup)


class _Transaction:
    """`View.begin()`: an LMDB transaction whose damage errors become `JournalCorrupt`."""

    __slots__ = ("__weakref__", "_txn", "_view", "_write")

    def __init__(self, view: View, write: bool) -> None:
        self._view = view
        self._write = write
        self._txn: lmdb.Transaction | None = None

    def __enter__(self) -> lmdb.Transaction:
        try:
            TRANSACTIONS.enter(self)  # (fork() waits for transactions in flight: `forking`)
            self._txn = self._view.open_transaction(self._write)
        except BaseException:
            try:
                TRANSACTIONS.leave(self)  # (also when `enter` itself was cut short)
            except BaseException:
                TRANSACTIONS.leave(self)  # (an interrupt cut it short: `leave`)
                raise
            raise
        return self._txn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # (An interrupt as this starts skips it all: the gate forgets this transaction
        # once it is garbage, and the LMDB transaction is aborted then: `ForkGate.enter`.)
        assert self._txn is not None
        try:
            self._txn.__exit__(exc_type, exc, tb)
        except lmdb.Error as e:
            if self._view.closed:
                raise JournalClosed.meanwhile() from e
            if isinstance(e, _DAMAGE_ERRORS):
                raise self._view.damaged(f"LMDB reports {e}") from e
            raise
        finally:
            try:
                TRANSACTIONS.leave(self)
            except BaseException:
                TRANSACTIONS.leave(self)  # (an interrupt cut it short: `leave`)
                raise
        if isinstance(exc, lmdb.Error) and self._view.closed:
            raise JournalClosed.meanwhile() from exc
        if isinstance(exc, _DAMAGE_ERRORS):
            raise self._view.damaged(f"LMDB reports {exc}") from exc


class View:
    """The LMDB environment and its named databases.

    `damage` is set once LMDB reported damage or the file no longer holds what LMDB
    recorded (truncated, or replaced by a process that found it damaged): from then on
    no transaction touches the file (`JournalCorrupt`), except that a writable view asked
    to `repair()` replaces it by an empty one at its next write transaction, which the
    engine's catch-up then rebuilds from the log."""

    def __init__(
        self, path: str, *, readonly: bool = False, permissions: Permissions = DEFAULT_PERMISSIONS
    ) -> None:
        self.path = path
        self._permissions = permissions
        self.readonly = readonly
        self._pid = os.getpid()  # (LMDB handles do not survive fork: see open_transaction)
        self.closed = False  # (then LMDB's "closed object" errors are `JournalClosed`)
        self.damage: str | None = None
        self.replaced_because: str | None = None
        self._repair = False
        self._lock = threading.Lock()
        # Environments replaced by a repair: transactions other threads still hold on
        # them stay valid until the view closes.
        self._retired: list[lmdb.Environment] = []
        # The files of the environments it opened (`lmdbenv.register_open`), released at close.
        self._open_files: list[tuple[int, int]] = []
        self._readers_checked = 0.0  # (time.monotonic() of the last `reader_check`)
        self._open_environment()

    def _open_environment(self) -> None:
        readonly = self.readonly
        path = self.path
        permissions = self._permissions
        created: list[str] = []
        with OPENING:  # (until this environment is registered)
            refuse_if_open_here(path)
            if not readonly:
                permissions.make_dirs(path)
                created = [
                    file
                    for file in (os.path.join(path, "data.mdb"), os.path.join(path, "lock.mdb"))
                    if not os.path.exists(file)
                ]
            # (Before LMDB: a FIFO in place of a file, a full disk under its lock file.)
            prepare_environment(path, MAX_READERS, None if readonly else permissions)
            self.env = lmdb.open(
                path,
                mode=permissions.file,
                map_size=INITIAL_MAP_SIZE,
                max_dbs=16,
                max_readers=MAX_READERS,
                # No cached read transaction (SPEC 7, "Across fork()"): a forked child's close
                # would free its reader slot, which the parent's copy then reuses unregistered.
                max_spare_txns=0,
                sync=False,
                metasync=False,
                readahead=False,
                readonly=readonly,
                lock=True,
                subdir=True,
            )
            opened = register_open(path, readonly)
        try:
            for file in created:
                # LMDB creates its files with the mode less the umask: give them the mode.
                with contextlib.suppress(FileNotFoundError):
                    permissions.fix_created(file)
            if readonly:
                # Handles opened inside a read transaction die with it: let LMDB open them
                # in its own (committed) transaction instead.
                handles = [_open_db(self.env, name, None) for name in _NAMES]
            else:
                with self.env.begin(write=True) as txn:
                    handles = [_open_db(self.env, name, txn) for name in _NAMES]
        except BaseException:
            self.env.close()  # (not kept open by a view nobody can close)
            unregister_open(opened)
            raise
        self._open_files += opened
        self._handles = handles
        (
            self._meta,
            self._sessions,
            self._incarnations,
            self._events,
            self._idem,
            self._feed,
            self._deadlines,
            self._pins,
            self._tombstones,
            states,
            aged,
        ) = handles
        self.events = EventsIndex(self._events)
        self.states = StateIndex(states, self._sessions)
        self.retention = RetentionIndex(aged, self._meta)
        self._file = ViewFile(path)

    def begin(self, *, write: bool = False) -> _Transaction:
        """A transaction (a context manager yielding the LMDB transaction); a write
        transaction is the store's cross-process writer lock. Damage LMDB reports in it
        is raised as `JournalCorrupt`."""
        return _Transaction(self, write)

    def open_transaction(self, write: bool) -> lmdb.Transaction:
        if os.getpid() != self._pid:
            # A forked child still using its parent's journal (a stream it inherited,
            # iterated on): a transaction here would take reader slots of the parent's
            # lock file that nobody frees, until every process's reads fail.
            raise JournalClosed.inherited("LMDB handles do not survive fork")
        if self.closed:
            raise JournalClosed.meanwhile()
        if self.damage is not None:
            if not (write and self._repair):
                raise corrupt(f"the view {self.path} is damaged ({self.damage})")
            self._replace()
        else:
            # Before every transaction (`ViewFile.check`): the file is the one opened.
            problem = self._file.check()
            if problem is not None:
                raise self.damaged(problem)
        try:
            if write and time.monotonic() - self._readers_checked >= 1.0:
                # Free the reader slots of processes killed inside a read transaction:
                # LMDB reuses no page freed after such a slot's snapshot (the file grew
                # by every commit, for good).
                self._readers_checked = time.monotonic()
                self.env.reader_check()
            return self.env.begin(write=write)
        except lmdb.Error as e:
            if self.closed:
                raise JournalClosed.meanwhile() from e
            raise

    def damaged(self, detail: str) -> JournalCorrupt:
        """Record damage found while open (no transaction touches the file from now on)."""
        if self.damage is None:
            self.damage = detail
        return corrupt(f"the view {self.path} is damaged ({detail})")

    def inspect(self) -> str | None:
        """Check the file as `inspect_view` does (`verify`); damage found is recorded."""
        if self.damage is not None:
            return self.damage
        problem = inspect_view(self.path)
        if problem is not None:
            self.damage = problem.what
        return self.damage

    def repair(self) -> None:
        """Let the next write transaction replace a damaged view by an empty one."""
        self._repair = True

    def _replace(self) -> None:
        # Only the commit leader begins write transactions on the shared view, so no
        # other write transaction of this process runs on the old environment.
        with self._lock:
            replace_view(self.path, self.env, self._file.identity, self._permissions)
            self._retired.append(self.env)
            self.replaced_because, self.damage, self._repair = self.damage, None, False
            self._open_environment()

    def grow(self) -> None:
        """Double the map size (after `lmdb.MapFullError`)."""
        try:
            TRANSACTIONS.enter(self)
            self.env.set_mapsize(self.env.info()["map_size"] * 2)
        finally:
            try:
                TRANSACTIONS.leave(self)
            except BaseException:
                TRANSACTIONS.leave(self)  # (an interrupt cut it short: `leave`)
                raise

    def close(self) -> None:
        self.closed = True
        self.env.close()
        for env in self._retired:
            env.close()
        unregister_open(self._open_files)

    def clear(self, txn: lmdb.Transaction) -> None:
        """Empty every database (before a rebuild)."""
        for db in self._handles:
            txn.drop(db, delete=False)

    def stored(self, txn: lmdb.Transaction, name: bytes) -> dict[bytes, bytes]:
        """Every entry of a named database but `events`, as stored, copied out (verify)."""
        return {bytes(k): bytes(v) for k, v in txn.cursor(db=self._handles[_NAMES.index(name)])}

    # -- meta ------------------------------------------------------------------------------

    def head(self, txn: lmdb.Transaction) -> Head | None:
        raw = txn.get(b"head", db=self._meta)
        return None if raw is None else decoded(_head_decoder, b"head", raw, "meta")

    def put_head(self, txn: lmdb.Transaction, head: Head) -> None:
        txn.put(b"head", seal(b"head", encoder.encode(head)), db=self._meta)

    def store_id(self, txn: lmdb.Transaction) -> bytes | None:
        raw = txn.get(b"store", db=self._meta)
        return None if raw is None else bytes(unseal(b"store", raw, "meta"))

    def put_store_id(self, txn: lmdb.Transaction, store_id: bytes) -> None:
        """The store's id, and the view's format (both written when a view is begun)."""
        txn.put(b"store", seal(b"store", store_id), db=self._meta)
        txn.put(FORMAT_KEY, seal(FORMAT_KEY, str(VIEW_FORMAT).encode()), db=self._meta)

    def boot_id(self, txn: lmdb.Transaction) -> bytes | None:
        raw = txn.get(b"boot", db=self._meta)
        return None if raw is None else bytes(unseal(b"boot", raw, "meta"))

    def put_boot_id(self, txn: lmdb.Transaction, boot_id: bytes) -> None:
        txn.put(b"boot", seal(b"boot", boot_id), db=self._meta)

    # -- sessions --------------------------------------------------------------------------

    def row(self, txn: lmdb.Transaction, session_id: str) -> SessionRow | None:
        """The session's row. Checked against its key and the `incarnations` entry of its
        incarnation, so a damaged row is `JournalCorrupt`, not another session's."""
        key = session_id.encode()
        raw = txn.get(key, db=self._sessions)
        if raw is None:
            return None
        row = decoded(row_decoder, key, raw, "sessions")
        if row.session_id != session_id or self.session_id_of(txn, row.incarnation) != session_id:
            raise corrupt(
                f"the row of session {session_id!r} names session {row.session_id!r}, "
                f"incarnation {row.incarnation}, which the incarnations index does not"
            )
        return row

    def put_row(self, txn: lmdb.Transaction, row: SessionRow) -> None:
        key = row.session_id.encode()
        txn.put(key, seal(key, encoder.encode(row)), db=self._sessions)

    def delete_row(self, txn: lmdb.Transaction, session_id: str) -> None:
        txn.delete(session_id.encode(), db=self._sessions)

    def rows(
        self, txn: lmdb.Transaction, after_id: str | None = None, *, staged: bool = False
    ) -> Iterator[SessionRow]:
        """Rows in session-id order, after `after_id` when given. Staged imports (ids
        starting with NUL, which no caller can name, so they sort first) are skipped
        unless `staged`."""
        cursor = txn.cursor(db=self._sessions)
        after = None if after_id is None else after_id.encode()
        if after is None and not staged:
            after = _STAGED_END
        positioned = cursor.set_range(after) if after is not None else cursor.first()
        if positioned and after is not None and cursor.key() == after:
            positioned = cursor.next()
        while positioned:
            yield listed_row(cursor.key(), cursor.value())
            positioned = cursor.next()

    def staged_rows(self, txn: lmdb.Transaction) -> list[SessionRow]:
        """The rows of staged imports (see `rows`)."""
        rows: list[SessionRow] = []
        cursor = txn.cursor(db=self._sessions)
        positioned = cursor.first()
        while positioned and bytes(cursor.key()) < _STAGED_END:
            rows.append(listed_row(cursor.key(), cursor.value()))
            positioned = cursor.next()
        return rows

    def encoded_rows(self, txn: lmdb.Transaction) -> list[tuple[bytes, bytes]]:
        """Every visible row, still encoded, with its key (copied out of the transaction;
        `view_codec.ListedRows` decodes them)."""
        return [
            (bytes(key), bytes(raw))
            for key, raw in txn.cursor(db=self._sessions)
            if bytes(key) >= _STAGED_END
        ]

    def session_id_of(self, txn: lmdb.Transaction, incarnation: int) -> str | None:
        key = U64.pack(incarnation)
        raw = txn.get(key, db=self._incarnations)
        return None if raw is None else text_value(key, raw, "incarnations")

    def put_incarnation(self, txn: lmdb.Transaction, incarnation: int, session_id: str) -> None:
        key = U64.pack(incarnation)
        txn.put(key, seal(key, session_id.encode()), db=self._incarnations)

    def row_by_incarnation(self, txn: lmdb.Transaction, incarnation: int) -> SessionRow | None:
        session_id = self.session_id_of(txn, incarnation)
        if session_id is None:
            return None
        row = self.row(txn, session_id)
        return row if row is not None and row.incarnation == incarnation else None

    # -- event locations -------------------------------------------------------------------

    # -- idempotency keys ------------------------------------------------------------------

    def idem_entry(self, txn: lmdb.Transaction, incarnation: int, key: str) -> IdemEntry | None:
        stored = U64.pack(incarnation) + key.encode()
        raw = txn.get(stored, db=self._idem)
        return None if raw is None else decoded(_idem_decoder, stored, raw, "idem")

    def put_idem(self, txn: lmdb.Transaction, incarnation: int, key: str, entry: IdemEntry) -> None:
        stored = U64.pack(incarnation) + key.encode()
        txn.put(stored, seal(stored, encoder.encode(entry)), db=self._idem)

    def idem_entries(self, txn: lmdb.Transaction, incarnation: int) -> list[tuple[str, IdemEntry]]:
        prefix = U64.pack(incarnation)
        cursor = txn.cursor(db=self._idem)
        found: list[tuple[str, IdemEntry]] = []
        if cursor.set_range(prefix):
            while cursor.key()[:8] == prefix:
                stored = cursor.key()
                entry = decoded(_idem_decoder, stored, cursor.value(), "idem")
                try:
                    key = bytes(stored[8:]).decode()
                except UnicodeDecodeError:
                    raise corrupt(f"the idem key {stored[:40]!r} is not UTF-8") from None
                found.append((key, entry))
                if not cursor.next():
                    break
        return found

    def delete_idem(self, txn: lmdb.Transaction, incarnation: int, key: str) -> None:
        txn.delete(U64.pack(incarnation) + key.encode(), db=self._idem)

    # -- lifecycle feed --------------------------------------------------------------------

    def put_feed(self, txn: lmdb.Transaction, position: int, entry: FeedEntry) -> None:
        key = U64.pack(position)
        txn.put(key, seal(key, encoder.encode(entry)), db=self._feed)

    def feed_entry(self, txn: lmdb.Transaction, position: int) -> FeedEntry | None:
        key = U64.pack(position)
        raw = txn.get(key, db=self._feed)
        return None if raw is None else decoded(_feed_decoder, key, raw, "feed")

    def feed_floor(self, txn: lmdb.Transaction) -> int:
        """The highest position whose feed entry may have been pruned (0: none was)."""
        raw = txn.get(_FEED_FLOOR, db=self._meta)
        return 0 if raw is None else u64_value(_FEED_FLOOR, raw, "meta")

    def raise_feed_floor(self, txn: lmdb.Transaction, position: int) -> None:
        """Record that feed entries up to `position` may be missing (never lowered)."""
        if position > self.feed_floor(txn):
            txn.put(_FEED_FLOOR, seal(_FEED_FLOOR, U64.pack(position)), db=self._meta)

    def put_missing(self, txn: lmdb.Transaction, missing: MissingEvents) -> None:
        """Record events of a live session that a rebuild found missing from the log, no
        record accounting for them (SPEC 9): reads at or below them are refused until a
        rebuild no longer finds them (the file restored), or a record accounts for them
        (a fix accepting the loss, a trim or snapshot past them: `forget_missing`)."""
        key = _LOST + U64.pack(missing.incarnation)
        txn.put(key, seal(key, encoder.encode(missing)), db=self._meta)

    def forget_missing(self, txn: lmdb.Transaction, incarnation: int) -> None:
        """Drop what `put_missing` recorded of this incarnation, if anything."""
        txn.delete(_LOST + U64.pack(incarnation), db=self._meta)

    def any_missing(self, txn: lmdb.Transaction) -> bool:
        """Whether `put_missing` recorded anything."""
        cursor = txn.cursor(db=self._meta)
        return cursor.set_range(_LOST) and bytes(cursor.key()).startswith(_LOST)

    def missing(self, txn: lmdb.Transaction, incarnation: int) -> MissingEvents | None:
        """What `put_missing` recorded of this incarnation, if anything."""
        key = _LOST + U64.pack(incarnation)
        raw = txn.get(key, db=self._meta)
        return None if raw is None else decoded(_missing_decoder, key, raw, "meta")

    def prune_feed(
        self,
        txn: lmdb.Transaction,
        first_position: int,
        last_position: int,
        kept: Callable[[int], bool] = lambda position: False,
    ) -> int:
        """Delete the feed entries in the position range (but those `kept` says stay),
        raising the floor to the highest deleted; returns it (0: none was deleted)."""
        cursor = txn.cursor(db=self._feed)
        highest = 0  # (positions start at 1)
        positioned = cursor.set_range(U64.pack(first_position))
        while positioned:
            position = key_u64(cursor.key(), "feed")
            if position > last_position:
                break
            if kept(position):
                positioned = cursor.next()
                continue
            cursor.delete()  # (moves to the next entry; to none, an empty key, past the last)
            positioned = bool(cursor.key())
            highest = position
        if highest:
            self.raise_feed_floor(txn, highest)
        return highest

    def feed_goes(
        self,
        txn: lmdb.Transaction,
        first_position: int,
        last_position: int,
        kept: Callable[[int], bool],
    ) -> bool:
        """Whether a feed entry in the position range is one `kept` does not keep (what
        `prune_feed` with it would delete; keys only, nothing decoded)."""
        cursor = txn.cursor(db=self._feed)
        positioned = cursor.set_range(U64.pack(first_position))
        while positioned:
            position = key_u64(cursor.key(), "feed")
            if position > last_position:
                return False
            if not kept(position):
                return True
            positioned = cursor.next()
        return False

    def feed_after(
        self, txn: lmdb.Transaction, after_position: int, limit: int, newest_first: bool
    ) -> list[tuple[int, FeedEntry]]:
        cursor = txn.cursor(db=self._feed)
        found: list[tuple[int, FeedEntry]] = []
        # (Nothing lies after the largest u64, a position a signed lifecycle cursor may
        # carry: its key cannot be packed; until 2026-12-05 struct.error, SPEC 14.2.)
        start = after_position < _U64_MAX and cursor.set_range(U64.pack(after_position + 1))
        positioned = (cursor.prev() if start else cursor.last()) if newest_first else start
        while positioned and len(found) < limit:
            key = cursor.key()
            position = key_u64(key, "feed")
            found.append((position, decoded(_feed_decoder, key, cursor.value(), "feed")))
            positioned = cursor.prev() if newest_first else cursor.next()
        return found

    # -- deadlines -------------------------------------------------------------------------

    def put_deadline(self, txn: lmdb.Transaction, due_ms: int, incarnation: int) -> None:
        key = U64X2.pack(due_ms, incarnation)
        txn.put(key, seal(key, b""), db=self._deadlines)

    def delete_deadline(self, txn: lmdb.Transaction, due_ms: int, incarnation: int) -> None:
        txn.delete(U64X2.pack(due_ms, incarnation), db=self._deadlines)

    def next_deadline(self, txn: lmdb.Transaction) -> int | None:
        """The nearest deadline (ms), or None."""
        cursor = txn.cursor(db=self._deadlines)
        if not cursor.first():
            return None
        key = cursor.key()
        unseal(key, cursor.value(), "deadlines")
        return key_pair(key, "deadlines")[0]

    def due(self, txn: lmdb.Transaction, now_ms: int) -> list[int]:
        """Incarnations whose deadline is at or before `now_ms`, earliest first."""
        cursor = txn.cursor(db=self._deadlines)
        found: list[int] = []
        positioned = cursor.first()
        while positioned:
            key = cursor.key()
            due_ms, incarnation = key_pair(key, "deadlines")
            if due_ms > now_ms:
                break
            unseal(key, cursor.value(), "deadlines")
            found.append(incarnation)
            positioned = cursor.next()
        return found

    # -- pins and tombstones ---------------------------------------------------------------

    def pin(self, txn: lmdb.Transaction, position: int, incarnation: int) -> None:
        key = U64.pack(position)
        txn.put(key, seal(key, U64.pack(incarnation)), db=self._pins)

    def unpin(self, txn: lmdb.Transaction, position: int) -> None:
        txn.delete(U64.pack(position), db=self._pins)

    def pins_between(
        self, txn: lmdb.Transaction, first_position: int, last_position: int
    ) -> Iterator[tuple[int, int]]:
        """(position, incarnation) of the pinned records in the position range."""
        cursor = txn.cursor(db=self._pins)
        positioned = cursor.set_range(U64.pack(first_position))
        while positioned:
            key = cursor.key()
            position = key_u64(key, "pins")
            if position > last_position:
                return
            yield position, u64_value(key, cursor.value(), "pins")
            positioned = cursor.next()

    def tombstone(self, txn: lmdb.Transaction, incarnation: int) -> int | None:
        """The position of an evicted incarnation's eviction record, if still kept."""
        key = U64.pack(incarnation)
        raw = txn.get(key, db=self._tombstones)
        return None if raw is None else u64_value(key, raw, "tombstones")

    def put_tombstone(self, txn: lmdb.Transaction, incarnation: int, position: int) -> None:
        key = U64.pack(incarnation)
        txn.put(key, seal(key, U64.pack(position)), db=self._tombstones)

    def tombstones_between(
        self, txn: lmdb.Transaction, first_incarnation: int, last_incarnation: int
    ) -> list[tuple[int, int]]:
        """(incarnation, eviction position) of tombstones of incarnations in the range."""
        cursor = txn.cursor(db=self._tombstones)
        found: list[tuple[int, int]] = []
        positioned = cursor.set_range(U64.pack(first_incarnation))
        while positioned:
            key = cursor.key()
            incarnation = key_u64(key, "tombstones")
            if incarnation > last_incarnation:
                break
            found.append((incarnation, u64_value(key, cursor.value(), "tombstones")))
            positioned = cursor.next()
        return found

    def forget_tombstone(self, txn: lmdb.Transaction, incarnation: int, position: int) -> None:
        """Drop a tombstone, the pin of its eviction record and the incarnation's id: its
        creation record is gone, so a rebuilt view would not have them either (a page
        token naming it is stale then)."""
        key = U64.pack(incarnation)
        txn.delete(key, db=self._tombstones)
        txn.delete(key, db=self._incarnations)
        self.unpin(txn, position)
