"""The on-disk record schema: msgspec Structs written into segment frames.

Every record is an array-like, integer-tagged Struct, so a record costs a few bytes of
framing and decodes in one pass. Compatibility rule: new fields go only at the end and carry
defaults (old segments still decode); new record kinds get new tags; a tag is never reused.

A session is named in records by its *incarnation*: the store-wide position of its
`SessionCreated` record. A session deleted and re-created under the same name gets a new
incarnation, so nothing written for the old one is mistaken for the new one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import msgspec

from .models import Event

__all__ = [
    "TURN_EVENT_TYPES",
    "TURN_RESULT",
    "TURN_STARTED",
    "CheckpointTaken",
    "EventAppended",
    "HistoryTrimmed",
    "IdempotencyKeyUsed",
    "OwnerAcquired",
    "OwnerReleased",
    "Record",
    "SessionCreated",
    "SessionEvicted",
    "SessionImported",
    "SessionStaged",
    "SnapshotTaken",
    "StateChanged",
    "decode_frame_body",
    "decode_frame_for_read",
    "decode_record",
    "encode_frame_body",
    "encode_frame_body_into",
]


# Event types the journal writes itself (turns); `append()` refuses them.
TURN_STARTED: Final = "turn_started"
TURN_RESULT: Final = "turn_result"
TURN_EVENT_TYPES: Final = frozenset({TURN_STARTED, TURN_RESULT})


class _RecordBase(msgspec.Struct, array_like=True, frozen=True, tag_field="record_kind"):
    """Shared encoding settings; the integer tag is the first array element on disk."""


class SessionCreated(_RecordBase, tag=1, frozen=True):
    """A session comes into being; its incarnation is this record's position."""

    session_id: str
    created_at_ms: int
    mode: str = ""
    context_id: str | None = None
    tags: dict[str, str] = {}
    extensions: dict[str, bytes] = {}
    ttl_ms: int | None = None
    max_suspend_ms: int = 0
    max_history_bytes: int | None = None
    max_history_age_ms: int | None = None


class EventAppended(_RecordBase, tag=2, frozen=True):
    """One accepted event of a session; `ordinal` is dense per incarnation from 1.

    `position` repeats the record's own store position (implied by its frame) so a reader
    decodes it instead of computing it per event, and `verify` can cross-check it.
    """

    incarnation: int
    ordinal: int
    timestamp_ms: int
    type: str
    data: bytes
    request_id: str | None = None
    position: int = 0


class StateChanged(_RecordBase, tag=3, frozen=True):
    """A lifecycle transition; `state` is the new state's wire value."""

    incarnation: int
    state: int
    at_ms: int
    reason: str = ""


class SnapshotTaken(_RecordBase, tag=4, frozen=True):
    """A snapshot standing for every event up to and including `through_ordinal`."""

    incarnation: int
    through_ordinal: int
    at_ms: int
    data: bytes


class HistoryTrimmed(_RecordBase, tag=5, frozen=True):
    """The retained range of a session now starts at `first_ordinal` (a prefix left)."""

    incarnation: int
    first_ordinal: int
    at_ms: int


class SessionEvicted(_RecordBase, tag=6, frozen=True):
    """The session and all its records are dead; its name may be reused."""

    incarnation: int
    at_ms: int


class IdempotencyKeyUsed(_RecordBase, tag=7, frozen=True):
    """An append made under an idempotency key: which ordinals it took, and a digest of
    its events so a retry with other events is told apart from a true retry."""

    incarnation: int
    key: str
    first_ordinal: int
    last_ordinal: int
    digest: bytes
    last_position: int = 0


class OwnerAcquired(_RecordBase, tag=8, frozen=True):
    """A process took the session's owner lease (a store record: no ordinal, never
    delivered to watchers). `generation` increases by one per lease of the session;
    `start_time` is the process start time in clock ticks after boot (Linux
    `/proc/<pid>/stat` field 22, 0 where unknown), so a reused pid is not the owner."""

    incarnation: int
    generation: int
    pid: int
    start_time: int
    host: str
    boot_id: str
    at_ms: int


class OwnerReleased(_RecordBase, tag=9, frozen=True):
    """The owner of lease `generation` released it."""

    incarnation: int
    generation: int
    at_ms: int


class SessionStaged(_RecordBase, tag=10, frozen=True):
    """An imported session being written: invisible (no id a caller can name, no
    lifecycle entry, no deadline, no retention) until `SessionImported` names it. Its
    incarnation is this record's position. `pid`, `start_time`, `host` and `boot_id`
    identify the importing process: a staged session whose importer died is evicted by
    the next writer that opens the store. `turn_request_id` and the source fields come
    from the archive."""

    staging_id: str
    session_id: str
    created_at_ms: int
    mode: str
    context_id: str | None
    tags: dict[str, str]
    extensions: dict[str, bytes]
    ttl_ms: int | None
    max_suspend_ms: int
    max_history_bytes: int | None
    max_history_age_ms: int | None
    source_store: str
    exported_at_ms: int
    pid: int
    start_time: int
    host: str
    boot_id: str
    turn_request_id: str | None = None


class SessionImported(_RecordBase, tag=11, frozen=True):
    """A staged session becomes visible under `session_id` (the commit of an import: one
    frame holds the `SessionImported` of every session of the archive)."""

    incarnation: int
    session_id: str
    at_ms: int


class CheckpointTaken(_RecordBase, tag=12, frozen=True):
    """A checkpoint: data standing for the session's events up to and including
    `through_ordinal`, which stay retained (unlike a `SnapshotTaken`'s). It takes a
    position and no ordinal; readers never deliver it."""

    incarnation: int
    through_ordinal: int
    at_ms: int
    data: bytes


Record = (
    SessionCreated
    | EventAppended
    | StateChanged
    | SnapshotTaken
    | HistoryTrimmed
    | SessionEvicted
    | IdempotencyKeyUsed
    | OwnerAcquired
    | OwnerReleased
    | SessionStaged
    | SessionImported
    | CheckpointTaken
)

# What readers decode: event records straight into the public `Event` (same leading layout
# as `EventAppended`), one C-level pass instead of a record plus a Python object per event.
ReadRecord = (
    SessionCreated
    | Event
    | StateChanged
    | SnapshotTaken
    | HistoryTrimmed
    | SessionEvicted
    | IdempotencyKeyUsed
    | OwnerAcquired
    | OwnerReleased
    | SessionStaged
    | SessionImported
    | CheckpointTaken
)

# Built once: msgspec encoders/decoders are reusable and cheap to call, costly to build.
_encoder: Final = msgspec.msgpack.Encoder()
_body_decoder: Final = msgspec.msgpack.Decoder(list[Record])
_read_decoder: Final = msgspec.msgpack.Decoder(list[ReadRecord])


def encode_frame_body(records: list[Record]) -> bytes:
    """Encode the records of one frame as a single msgpack array."""
    return _encoder.encode(records)


def encode_frame_body_into(records: list[Record], buffer: bytearray, offset: int) -> None:
    """Encode the records of one frame (the same bytes as `encode_frame_body`) into
    `buffer` from `offset` on; the buffer then ends where the body does."""
    _encoder.encode_into(records, buffer, offset)


# Decode one frame body with event records as `Event`s (for the read path): the decoder's
# own method, called once per frame of a replay (a wrapper function cost a Python call).
decode_frame_for_read: Final[Callable[[bytes | memoryview], list[ReadRecord]]] = (
    _read_decoder.decode
)


_record_decoder: Final = msgspec.msgpack.Decoder(Record)


def decode_record(raw: bytes) -> Record:
    """Decode one record (as kept in a sidecar)."""
    result: Record = _record_decoder.decode(raw)
    return result


def decode_frame_body(body: bytes | memoryview) -> list[Record]:
    """Decode one frame body; raises `msgspec.DecodeError` on malformed input."""
    result: list[Record] = _body_decoder.decode(body)
    return result
