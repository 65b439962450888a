"""The public data types: what callers pass in and get back.

Plain immutable values (msgspec Structs, enums); none of them exposes LMDB or segment
details, so another storage engine can return the same types.
"""

import enum
import operator
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec

__all__ = [
    "AppendResult",
    "ArchiveContents",
    "ArchivedSession",
    "CompactionReport",
    "Event",
    "EventIn",
    "ExportReport",
    "ImportReport",
    "ImportedFrom",
    "ImportedSession",
    "LifecycleEvent",
    "LifecycleEventType",
    "OwnerInfo",
    "Page",
    "RetentionPolicy",
    "RetentionReport",
    "SessionMetadata",
    "SessionPage",
    "SessionState",
    "Snapshot",
    "StoreStats",
    "VerifyProblem",
    "VerifyReport",
]


class SessionState(enum.Enum):
    """Where a session is in its lifecycle. RESOLVED, EXPIRED and CANCELLED are terminal."""

    OPEN = "open"
    SUSPENDED = "suspended"
    RESOLVED = "resolved"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def wire(self) -> int:
        """The integer written in `StateChanged` records."""
        return _STATE_WIRE[self]

    @classmethod
    def from_wire(cls, value: int) -> "SessionState":
        return _WIRE_STATE[value]


_TERMINAL = frozenset({SessionState.RESOLVED, SessionState.EXPIRED, SessionState.CANCELLED})
_STATE_WIRE = {state: i for i, state in enumerate(SessionState, start=1)}
_WIRE_STATE = {i: state for state, i in _STATE_WIRE.items()}


class LifecycleEventType(enum.Enum):
    """What happened to a session, as reported by `watch_sessions`."""

    CREATED = "created"
    SUSPENDED = "suspended"
    RESUMED = "resumed"
    RESOLVED = "resolved"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    EVICTED = "evicted"


class EventIn(msgspec.Struct, frozen=True):
    """An event to append: a type name, opaque payload bytes, optional request id."""

    type: str
    data: bytes
    request_id: str | None = None


class ReadContext:
    """What every event of one read shares: its session id and how to sign its cursor.

    Made by the facade (which owns cursor signing) and attached by an engine's reader to
    the events it decodes (`bind_events`): engines never see cursor strings. `signer` takes
    the event and returns its cursor."""

    __slots__ = ("session_id", "signer")

    def __init__(self, session_id: str, signer: Callable[["Event"], str]) -> None:
        self.session_id = session_id
        self.signer = signer


class Event(
    msgspec.Struct, array_like=True, tag_field="record_kind", tag=2, gc=False, weakref=False
):
    """One retained event of a session, as read back.

    Treat it as read-only. `cursor` is computed on first access (an HMAC per event would
    dominate replay cost); resuming from it yields the events after this one.

    Implementation note: reads decode a frame's event records straight into this type
    (its leading fields mirror the on-disk `EventAppended` record), which is what makes
    replay fast; the reader attaches one shared context (session id, cursor signer).
    """

    _incarnation: int
    ordinal: int
    timestamp_ms: int
    type: str
    data: bytes
    request_id: str | None = None
    position: int = 0
    _context: ReadContext | None = None
    _cursor: str | None = None

    @property
    def session_id(self) -> str:
        return "" if self._context is None else self._context.session_id

    @property
    def cursor(self) -> str:
        if self._cursor is None:
            if self._context is None:
                raise ValueError("this event was not read from a journal and has no cursor")
            self._cursor = self._context.signer(self)
        return self._cursor

    def to_dict(self) -> dict[str, Any]:
        """The event's public fields as a dict, `cursor` included (None for an event not
        read from a journal): what to encode, since the event itself is laid out for fast
        reads (`msgspec.json.encode(event.to_dict())`; `data` stays bytes, which msgspec
        writes as base64)."""
        try:
            cursor: str | None = self.cursor
        except ValueError:  # (not read from a journal)
            cursor = None
        return {
            "session_id": self.session_id,
            "ordinal": self.ordinal,
            "type": self.type,
            "data": self.data,
            "request_id": self.request_id,
            "timestamp_ms": self.timestamp_ms,
            "position": self.position,
            "cursor": cursor,
        }

    def _key(self) -> tuple[Any, ...]:
        return (
            self.session_id,
            self.ordinal,
            self.type,
            self.data,
            self.request_id,
            self.timestamp_ms,
            self.position,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return self._key() == other._key()

    def __reduce__(self) -> tuple[Any, ...]:
        # The read context signs cursors with the store's key: a pickled event carries its
        # session id and its cursor instead (computed now), never key material.
        return (
            _unpickle_event,
            (
                self._incarnation,
                self.ordinal,
                self.timestamp_ms,
                self.type,
                self.data,
                self.request_id,
                self.position,
                self.session_id,
                self.cursor if self._context is not None or self._cursor else None,
            ),
        )

    def __hash__(self) -> int:
        return hash((self.session_id, self.ordinal, self.position))

    def __repr__(self) -> str:
        return (
            f"Event(session_id={self.session_id!r}, ordinal={self.ordinal}, "
            f"type={self.type!r}, data=<{len(self.data)} bytes>, "
            f"request_id={self.request_id!r}, timestamp_ms={self.timestamp_ms}, "
            f"position={self.position})"
        )


def _sent_cursor(cursor: str | None, event: Event) -> str:
    if cursor is None:
        raise ValueError("this event was not read from a journal and has no cursor")
    return cursor


def _unpickle_event(
    incarnation: int,
    ordinal: int,
    timestamp_ms: int,
    type: str,
    data: bytes,
    request_id: str | None,
    position: int,
    session_id: str,
    cursor: str | None,
) -> Event:
    event = Event(incarnation, ordinal, timestamp_ms, type, data, request_id, position)
    event._context = ReadContext(session_id, partial(_sent_cursor, cursor))
    event._cursor = cursor
    return event


def bind_events(events: list[Event], context: ReadContext, position: int = 0) -> int:
    """Attach `context` to freshly decoded events; returns their data bytes.

    With `position`, the events are numbered from it (frames written before records
    carried their own position)."""
    size = 0
    if position:
        for event in events:
            event._context = context
            event.position = position
            position += 1
            size += len(event.data)
    else:
        for event in events:
            event._context = context
            size += len(event.data)
    return size


def attach_context(events: list[Event], context: ReadContext, position: int = 0) -> None:
    """`bind_events` for a reader that knows the events' data bytes already (the index
    records them per frame): one attribute store per event and nothing else, the
    cheapest binding a Python loop gives (measured: counting `len(data)` as well doubled
    its cost; `map(setattr, ...)` in C was no faster)."""
    if position:
        for event in events:
            event._context = context
            event.position = position
            position += 1
    else:
        for event in events:
            event._context = context


def bind_event(event: Event, context: ReadContext, position: int) -> None:
    """Attach `context` to one decoded event stored at `position`."""
    event._context = context
    event.position = position


# The incarnation of the session a decoded event belongs to (an attribute getter, in C:
# the page reader asks it twice a frame).
event_incarnation: Callable[[Event], int] = operator.attrgetter("_incarnation")


class Page(msgspec.Struct, frozen=True):
    """One bounded page of a session's events.

    `next_cursor` resumes after the last event of the page (it equals the cursor passed in
    when the page is empty, or None when that was None and the session has no events).
    `has_more` is True when retained events follow the page right now.
    """

    events: list[Event]
    next_cursor: str | None
    has_more: bool

    def to_dict(self) -> dict[str, Any]:
        """The page with each event as `Event.to_dict` gives it: what to encode."""
        return {
            "events": [event.to_dict() for event in self.events],
            "next_cursor": self.next_cursor,
            "has_more": self.has_more,
        }


class AppendResult(msgspec.Struct, frozen=True):
    """What an append committed: the ordinals it took and a cursor after the last one.

    `deduplicated` is True when an idempotency key matched an earlier append: nothing was
    written and the original result is returned.
    """

    session_id: str
    first_ordinal: int
    last_ordinal: int
    cursor: str
    deduplicated: bool = False


class OwnerInfo(msgspec.Struct, frozen=True):
    """The process holding a session's owner lease: its pid, its start time (clock ticks
    after boot, so a reused pid is told apart; 0 where unknown), host name, the lease
    generation (one more per lease of the session) and when it took the lease."""

    pid: int
    start_time: int
    host: str
    generation: int
    since_ms: int


class ImportedFrom(msgspec.Struct, frozen=True):
    """Where an imported session's history came from: the source store's id (hex) and
    when the archive was exported (ms since the epoch)."""

    store_id: str
    exported_at_ms: int


class SessionMetadata(msgspec.Struct, frozen=True):
    """A session's registry entry. The retained events are `[first_ordinal, last_ordinal]`
    (empty when `last_ordinal < first_ordinal`). `open_turn` is the request id of the
    session's unsettled turn (its `turn_started` has no `turn_result` yet), if any: with
    `owner` None, a turn whose owner died, which the next owner records as failed.
    `max_suspend_ms` 0 means the default, 7 days (SPEC 7.3; `journal sessions show`
    prints it so in text, and the 0 in JSON). `max_history_bytes` and
    `max_history_age_ms` are the session's own history windows, as `create_session`
    set them (None: the store's policy applies, SPEC 8)."""

    session_id: str
    state: SessionState
    mode: str
    context_id: str | None
    extension_keys: tuple[str, ...]
    tags: dict[str, str]
    created_at_ms: int
    started_at_ms: int
    ended_at_ms: int | None
    first_ordinal: int
    last_ordinal: int
    owner: OwnerInfo | None = None
    incarnation: int = 0
    ttl_ms: int | None = None
    max_suspend_ms: int = 0
    max_history_bytes: int | None = None
    max_history_age_ms: int | None = None
    suspended_at_ms: int | None = None
    expires_at_ms: int | None = None
    imported_from: ImportedFrom | None = None
    open_turn: str | None = None


class SessionPage(msgspec.Struct, frozen=True):
    """One page of `list_sessions_page`; `next_page_token` is "" on the last page."""

    sessions: list[SessionMetadata]
    next_page_token: str


class LifecycleEvent(msgspec.Struct, frozen=True):
    """A lifecycle change (or, in the startup snapshot, a CREATED per existing session).

    `session` is the metadata right after the change. Resuming `watch_sessions` from
    `cursor` yields the changes after this one (from a startup snapshot's CREATED but
    its last: the changes since of the sessions it had delivered, then the snapshot's
    sessions after this one, SPEC 7.7). `in_snapshot` is True for the CREATED events of
    a startup snapshot (resumed or not): the session existed already, it was not created
    now.
    """

    event_type: LifecycleEventType
    session: SessionMetadata
    cursor: str
    observed_at_ms: int
    in_snapshot: bool = False


class RetentionPolicy(msgspec.Struct, frozen=True):
    """Store-wide history windows and session eviction (sessions may override windows)."""

    max_history_bytes: int | None = 320 << 20
    max_history_age_ms: int | None = None
    session_retention_ms: int | None = None
    session_retention_from: str = "ended"


class RetentionReport(msgspec.Struct, frozen=True):
    """What one `apply_retention` pass did."""

    trimmed_sessions: list[str]
    evicted_sessions: list[str]
    deleted_segments: list[str]
    reclaimed_bytes: int


class Snapshot(msgspec.Struct, frozen=True):
    """A snapshot standing for events up to `ordinal`; resume after it from `cursor`."""

    session_id: str
    ordinal: int
    data: bytes
    cursor: str


class CompactionReport(msgspec.Struct, frozen=True):
    """What `compact()` did: segments rewritten and deleted, bytes on disk before and after,
    live bytes copied (uncompressed) and the seconds it took; and the sessions its
    retention passes trimmed and evicted (local engine; none on JetStream, whose
    `compact()` applies no retention: `apply_retention()` does); and the bytes of the
    active segment's committed frames as the seal's decision found them, and how many of
    them were dead (None when too few to be worth a look: under 1 MiB, or half a segment;
    local engine: 0 and None on JetStream)."""

    segments_rewritten: list[str]
    segments_deleted: list[str]
    bytes_before: int
    bytes_after: int
    live_bytes_copied: int
    seconds: float
    trimmed_sessions: list[str] = msgspec.field(default_factory=list)
    evicted_sessions: list[str] = msgspec.field(default_factory=list)
    active_frame_bytes: int = 0
    active_dead_bytes: int | None = None


class VerifyProblem(msgspec.Struct, frozen=True):
    """One problem: where (segment file name, or "index"), the byte offset, and what."""

    segment: str
    offset: int
    what: str


class VerifyReport(msgspec.Struct, frozen=True):
    """What `verify` checked and found. `ok` is True when nothing is wrong (or, with
    `fix=True`, when everything found was repaired)."""

    segments: int
    frames: int
    records: int
    problems: list[VerifyProblem]
    fixed: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems or self.fixed


class StoreStats(msgspec.Struct, frozen=True):
    """Sizes of a store (`Journal.stats()`): sessions by state (state value -> count), the
    number of segments, the bytes of the log's files (segments and their indexes), and
    the next store position (how many records were ever committed, plus one); for a
    `nats://` store, how many servers keep its stream (None for a store on disk); and, of
    `segment_bytes`, those of the active segment past its last committed frame: the zeros
    written ahead so that appends do not grow the file (0 on a `nats://` store)."""

    sessions: dict[str, int]
    segments: int
    segment_bytes: int
    next_position: int
    replicas: int | None = None
    preallocated_bytes: int = 0


class ExportReport(msgspec.Struct, frozen=True):
    """What `export_sessions` wrote: the sessions (in archive order) with their event
    counts, the totals, the archive's size and the SHA-256 its footer carries (hex)."""

    sessions: dict[str, int]
    events: int
    archive_bytes: int
    content_bytes: int
    sha256: str
    path: str | None = None


class ImportedSession(msgspec.Struct, frozen=True):
    """One session an import created: its id in the archive, its id here, its events."""

    source_id: str
    session_id: str
    events: int


class ArchivedSession(msgspec.Struct, frozen=True):
    """One session an archive holds (`read_archive_contents`), as an import would
    create it: its retained events are `[first_ordinal, last_ordinal]` (`events` of
    them), a snapshot stands for those up to `snapshot_ordinal` and a checkpoint for
    those up to `checkpoint_ordinal` (None: it has none), `open_turn` is its unsettled
    turn's request id. `content_bytes` is what its records (metadata, snapshot,
    checkpoint, events) take in the archive's decompressed content."""

    session_id: str
    state: SessionState
    mode: str
    created_at_ms: int
    ended_at_ms: int | None
    first_ordinal: int
    last_ordinal: int
    events: int
    snapshot_ordinal: int | None
    checkpoint_ordinal: int | None
    open_turn: str | None
    content_bytes: int


class ArchiveContents(msgspec.Struct, frozen=True):
    """What an archive holds, read and checked whole (`read_archive_contents`): its
    format version, the library version and store that wrote it and when, its sessions
    in archive order, the total of their events, its size compressed (`archive_bytes`)
    and decompressed (`content_bytes`), and the SHA-256 its footer carries (hex)."""

    version: int
    library_version: str
    source_store_id: str
    exported_at_ms: int
    sessions: list[ArchivedSession]
    events: int
    archive_bytes: int
    content_bytes: int
    sha256: str


class ImportReport(msgspec.Struct, frozen=True):
    """What `import_sessions` committed (every session of the archive, or it raised)."""

    sessions: list[ImportedSession]
    events: int
    archive_bytes: int
    source_store_id: str
    exported_at_ms: int
