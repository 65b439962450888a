"""The JetStream engine's subject layout and the records its messages carry (SPEC 16).

One stream per store (`JOURNAL_<store>`, subjects `j.<store>.>`). Session ids are hex
encoded into one subject token (hex keeps byte order, so sorted subjects are sorted ids).

    j.<store>.meta               the store's identity (id, format, shared cursor key)
    j.<store>.policy             the store's retention policy (rolled up)
    j.<store>.lc.<id>            lifecycle feed entries of the session (pruned a day
                                 after its eviction, and those a later change of it
                                 superseded a day after that change, its CREATED one
                                 kept: `feed_pruning.py`)
    j.<store>.in.<id>            an imported session's incarnation (pruned with them)
    j.<store>.ff                 the lifecycle feed's floor (rolled up)
    j.<store>.s.<id>.row         the session's registry row (rolled up: one message)
    j.<store>.s.<id>.ev          its events, one message each
    j.<store>.s.<id>.sn          its latest snapshot (rolled up)
    j.<store>.s.<id>.ck          its latest checkpoint (rolled up)
    j.<store>.s.<id>.hb          the owner lease's heartbeat (rolled up)
    j.<store>.s.<id>.ik.<key>    one insert-only marker per idempotency key

Every commit of a session is one atomic batch ending with its new row, published with a
compare-and-set on the row subject: the row subject's sequence serialises the session.
Positions inside a batch are not known before it commits, so records refer to messages of
their own batch relatively: a stored position below zero means "that many messages before
the batch's row" (`resolve`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from ..errors import InvalidArgument
from ..sessions import FeedEntry, SessionRow

__all__ = [
    "ENCODER",
    "EVENT_DECODER",
    "FEED_DECODER",
    "FLOOR_DECODER",
    "FORMAT",
    "HEARTBEAT_DECODER",
    "MARKER_DECODER",
    "META_DECODER",
    "PRUNED_FORMAT",
    "READ_FORMATS",
    "ROW_DECODER",
    "SNAPSHOT_DECODER",
    "FeedFloor",
    "Heartbeat",
    "Marker",
    "Meta",
    "StoredEvent",
    "StoredFeed",
    "StoredSnapshot",
    "Subjects",
    "check_store_name",
    "resolve",
    "stamps_recorded",
    "stream_config",
    "stream_differences",
]

FORMAT: Final = 1
# The format of a store whose lifecycle feed was pruned (`feed_pruning.py`): a release
# that reads format 1 only knows no feed floor, and would resume a lifecycle cursor past
# pruned entries, so the store is marked before its first purge and such a release
# refuses it. This release reads both.
PRUNED_FORMAT: Final = 2
READ_FORMATS: Final = (FORMAT, PRUNED_FORMAT)
_STORE_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")

# SessionRow fields that hold store positions (resolved after a batch commits).
_POSITIONS: Final = (
    "incarnation",
    "lifecycle_position",
    "last_event_position",
    "snapshot_position",
    "trim_position",
    "owner_position",
    "turn_position",
    "name_position",
    "checkpoint_position",
)


def check_store_name(store: object) -> str:
    if not isinstance(store, str) or not _STORE_RE.fullmatch(store):
        raise InvalidArgument(
            "store must name the journal's stream: 1 to 64 letters, digits, '-' or '_', "
            + ("but none was given" if store is None or store == "" else f"got {store!r}")
            + " (for example Journal.open('nats://host:4222', store='agents'))"
        )
    return store


class Subjects:
    """The subjects of one store."""

    def __init__(self, store: str) -> None:
        root = f"j.{store}"
        self.root = root
        self.all = f"{root}.>"
        self.meta = f"{root}.meta"
        self.policy = f"{root}.policy"
        self.feed = f"{root}.lc.*"
        self.feed_floor = f"{root}.ff"
        self.rows = f"{root}.s.*.row"
        self._feed_prefix = f"{root}.lc."
        self._claim_prefix = f"{root}.in."
        self._session_prefix = f"{root}.s."

    @staticmethod
    def token(session_id: str) -> str:
        return session_id.encode().hex()

    @staticmethod
    def session_of_token(token: str) -> str | None:
        return _decode_token(token)

    def lifecycle(self, token: str) -> str:
        return self._feed_prefix + token

    def feed_and_claim(self, token: str) -> str:
        """The session's feed entries and its claim (`lc.<id>`, `in.<id>`): the only
        subjects of four tokens that end with the session's."""
        return f"{self.root}.*.{token}"

    def claim(self, token: str) -> str:
        """The message an imported session's staging began with: its incarnation."""
        return self._claim_prefix + token

    def row(self, token: str) -> str:
        return f"{self._session_prefix}{token}.row"

    def events(self, token: str) -> str:
        return f"{self._session_prefix}{token}.ev"

    def snapshot(self, token: str) -> str:
        return f"{self._session_prefix}{token}.sn"

    def checkpoint(self, token: str) -> str:
        return f"{self._session_prefix}{token}.ck"

    def heartbeat(self, token: str) -> str:
        return f"{self._session_prefix}{token}.hb"

    def marker(self, token: str, key: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()[:40]
        return f"{self._session_prefix}{token}.ik.{digest}"

    def markers(self, token: str) -> str:
        """Every idempotency marker of the session."""
        return f"{self._session_prefix}{token}.ik.*"

    def session_wide(self, token: str) -> str:
        """Every subject of the session but its idempotency markers."""
        return f"{self._session_prefix}{token}.*"

    def session_all(self, token: str) -> str:
        return f"{self._session_prefix}{token}.>"

    def session_of_feed(self, subject: str) -> str | None:
        """The session a creation's message names: its CREATED feed entry, or the claim
        an imported session's incarnation is."""
        for prefix in (self._feed_prefix, self._claim_prefix):
            if subject.startswith(prefix):
                return _decode_token(subject[len(prefix) :])
        return None

    def token_of_row(self, subject: str) -> str | None:
        if not (subject.startswith(self._session_prefix) and subject.endswith(".row")):
            return None
        return subject[len(self._session_prefix) : -len(".row")]


def _decode_token(token: str) -> str | None:
    try:
        return bytes.fromhex(token).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def resolve(row: SessionRow, anchor: int) -> SessionRow:
    """Turn the row's relative positions into stream sequences; `anchor` is the sequence
    of the batch's row message."""
    for name in _POSITIONS:
        value = getattr(row, name)
        if value < 0:
            setattr(row, name, anchor + value)
    return row


class StoredEvent(msgspec.Struct, array_like=True):
    """An event message: the event, and where its append began (`batch_first`, the data
    bytes the session had appended before that append and before this event). Its
    incarnation is the row's: a session's events lie above its creation's sequence."""

    ordinal: int
    timestamp_ms: int
    type: str
    data: bytes
    request_id: str | None
    batch_first: int
    batch_bytes_before: int
    bytes_before: int


def stamps_recorded(row: SessionRow, first: int, stamps: Iterable[int]) -> tuple[int, int]:
    """The row's `last_event_ms` and `stamped_in_order_from` once events stamped `stamps`
    follow, from ordinal `first` on, those of `row` (which end before `first`). Events
    whose order the row does not record (no `last_event_ms`) count as out of order: the
    age window reads them in order (`HistoryWindows._age_window_start`)."""
    newest, in_order_from = row.last_event_ms, row.stamped_in_order_from
    if not newest:
        in_order_from = first
    for ordinal, stamp in enumerate(stamps, first):
        if stamp < newest:
            in_order_from = ordinal  # (a clock stepped back)
        newest = stamp
    return newest, in_order_from


class StoredFeed(msgspec.Struct, array_like=True):
    """A lifecycle feed message; the row's relative positions count from the message
    `anchor` places after this one (the batch's row)."""

    entry: FeedEntry
    anchor: int


class FeedFloor(msgspec.Struct, array_like=True):
    """The lifecycle feed's pruning record (`feed_pruning.py`): `floor`, the highest
    sequence pruned (raised before the purges and deletes it covers, never lowered);
    every entry up to `examined` is decided (an EVICTED one taken, a live session's
    superseded ones deleted), and `pending` lists the sessions (token, EVICTED entry's
    sequence) whose purge may not be done (a pass that stopped between its record and
    its purges; a live session's deletes are not listed: a later pass finds what is left
    of them below the session's next entry)."""

    floor: int
    examined: int
    pending: list[tuple[str, int]]


class Marker(msgspec.Struct, array_like=True):
    """An idempotency marker: what the keyed append took (positions relative as above)."""

    incarnation: int
    key: str
    first_ordinal: int
    last_ordinal: int
    digest: bytes
    last_position: int
    anchor: int


class StoredSnapshot(msgspec.Struct, array_like=True):
    incarnation: int
    through_ordinal: int
    at_ms: int
    data: bytes


class Meta(msgspec.Struct, array_like=True):
    format: int
    store_id: bytes
    shared_key: str
    created_at_ms: int


class Heartbeat(msgspec.Struct, array_like=True):
    incarnation: int
    generation: int
    pid: int
    host: str
    at_ms: int


ENCODER: Final = msgspec.msgpack.Encoder()
ROW_DECODER: Final = msgspec.msgpack.Decoder(SessionRow)
EVENT_DECODER: Final = msgspec.msgpack.Decoder(StoredEvent)
FEED_DECODER: Final = msgspec.msgpack.Decoder(StoredFeed)
MARKER_DECODER: Final = msgspec.msgpack.Decoder(Marker)
SNAPSHOT_DECODER: Final = msgspec.msgpack.Decoder(StoredSnapshot)
META_DECODER: Final = msgspec.msgpack.Decoder(Meta)
FLOOR_DECODER: Final = msgspec.msgpack.Decoder(FeedFloor)
HEARTBEAT_DECODER: Final = msgspec.msgpack.Decoder(Heartbeat)


# Settings of the store's stream that keep every message until the journal purges it (the
# server's values for "no limit"); a stream without them is another tool's.
_STREAM_KEEPS_ALL: Final = {
    "retention": "limits",
    "storage": "file",
    "max_age": 0,
    "max_msgs": -1,
    "max_bytes": -1,
    "max_msgs_per_subject": -1,
    "sealed": False,
}
# The flags the journal's commits and reads need (atomic batches, direct gets, rollups).
_STREAM_FLAGS: Final = ("allow_atomic", "allow_direct", "allow_rollup_hdrs")


def stream_config(stream: str, subjects: str, replicas: int, max_msg_bytes: int) -> dict[str, Any]:
    """The configuration of a new store's stream."""
    return {
        "name": stream,
        "subjects": [subjects],
        **_STREAM_KEEPS_ALL,
        "num_replicas": replicas,
        **dict.fromkeys(_STREAM_FLAGS, True),
        "deny_delete": False,
        "deny_purge": False,
        "max_msg_size": max_msg_bytes,
        "discard": "new",
        "duplicate_window": 120_000_000_000,
    }


def stream_differences(config: dict[str, Any], subjects: str) -> list[str]:
    """What makes an existing stream's configuration not one the journal made: empty when
    it is the journal's."""
    wrong = []
    if config.get("subjects") != [subjects]:
        wrong.append(f"subjects {config.get('subjects')!r}, not [{subjects!r}]")
    wrong += [f"{flag} is off" for flag in _STREAM_FLAGS if not config.get(flag)]
    # What would drop messages the journal keeps (its identity, rows, events) or refuse
    # its trims: the journal trims per session itself (section 16.1).
    wrong += [
        f"{setting} is {config.get(setting)!r}, not {wanted!r}"
        for setting, wanted in _STREAM_KEEPS_ALL.items()
        if config.get(setting, wanted) != wanted
    ]
    return wrong
