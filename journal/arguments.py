"""Argument checks and limits: every argument is checked here, before an operation is
built, so a bad call fails alone with `InvalidArgument` and never reaches an engine."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from .engine import Append, CreateSession
from .errors import InvalidArgument
from .models import EventIn, RetentionPolicy
from .records import TURN_EVENT_TYPES

__all__ = [
    "DEFAULT_PAGE_BYTES",
    "DEFAULT_PAGE_SIZE",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_EVENTS",
    "MAX_EVENT_BYTES",
    "MAX_METADATA_BYTES",
    "MAX_NAME_LENGTH",
    "MAX_PAGE_SIZE",
    "MAX_REQUEST_ID_BYTES",
    "MAX_SETTING",
    "EventChecker",
    "check_create",
    "check_file_mode",
    "check_name",
    "check_now",
    "check_retention",
    "check_snapshot",
    "file_mode_problem",
    "metadata_bytes",
    "name_ok",
]

MAX_EVENT_BYTES: Final = 8 << 20
MAX_BATCH_EVENTS: Final = 10_000
MAX_BATCH_BYTES: Final = 64 << 20
MAX_NAME_LENGTH: Final = 256
# mode, context id, tags and extensions of one session, together (UTF-8 and bytes)
MAX_METADATA_BYTES: Final = 1 << 20
MAX_METADATA_ENTRIES: Final = 10_000  # tags, and extensions, per session
MAX_REQUEST_ID_BYTES: Final = 64 << 10
# times, TTLs, suspension caps and history limits stay below this (ms, bytes)
MAX_SETTING: Final = 1 << 62
DEFAULT_PAGE_BYTES: Final = 1 << 20
DEFAULT_PAGE_SIZE: Final = 100
MAX_PAGE_SIZE: Final = 1000

_NAME_RE: Final = re.compile(r"[^\x00-\x1f\x7f]+")
_digest_encoder: Final = msgspec.msgpack.Encoder()


def name_ok(value: str) -> bool:
    """The rule for ids, types and keys: 1 to 256 bytes of UTF-8, no control characters."""
    try:
        size = len(value.encode())
    except UnicodeEncodeError:  # lone surrogates (e.g. undecodable command-line bytes)
        return False
    return 0 < size <= MAX_NAME_LENGTH and _NAME_RE.fullmatch(value) is not None


def metadata_bytes(
    mode: str, context_id: str | None, tags: Mapping[str, str], extensions: Mapping[str, bytes]
) -> int:
    """What counts against `MAX_METADATA_BYTES` (UTF-8 and bytes)."""
    size = len(mode.encode()) + len((context_id or "").encode())
    size += sum(len(k.encode()) + len(v.encode()) for k, v in tags.items())
    return size + sum(len(k.encode()) + len(v) for k, v in extensions.items())


def check_name(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a str, got {type(value).__name__}")
    if not name_ok(value):
        raise InvalidArgument(
            f"{what} {value!r} is invalid: use 1 to {MAX_NAME_LENGTH} bytes of UTF-8 "
            "without control characters"
        )
    return value


def check_now(now_ms: object) -> int | None:
    if now_ms is not None and not isinstance(now_ms, int):
        raise InvalidArgument("now_ms must be an int (ms since the epoch) or None")
    return now_ms


def check_create(
    session_id: str,
    mode: str,
    context_id: str | None,
    tags: Mapping[str, str] | None,
    extensions: Mapping[str, bytes] | None,
    ttl_ms: int | None,
    max_suspend_ms: int,
    max_history_bytes: int | None,
    max_history_age_ms: int | None,
) -> CreateSession:
    check_name("session_id", session_id)
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
    for name, value in (
        ("ttl_ms", ttl_ms),
        ("max_history_bytes", max_history_bytes),
        ("max_history_age_ms", max_history_age_ms),
    ):
        if value is not None and (value.__class__ is not int or not 0 < value < MAX_SETTING):
            raise InvalidArgument(f"{name} must be a positive int below 2**62, or None")
    if max_suspend_ms.__class__ is not int or not 0 <= max_suspend_ms < MAX_SETTING:
        raise InvalidArgument("max_suspend_ms must be an int >= 0 below 2**62 (0 = 7 days)")
    if len(tag_map) > MAX_METADATA_ENTRIES or len(ext_map) > MAX_METADATA_ENTRIES:
        raise InvalidArgument(f"at most {MAX_METADATA_ENTRIES} tags and as many extensions")
    size = metadata_bytes(mode, context_id, tag_map, ext_map)
    if size > MAX_METADATA_BYTES:
        raise InvalidArgument(
            f"mode, context_id, tags and extensions come to {size} bytes; the limit is "
            f"{MAX_METADATA_BYTES}: keep large data in events"
        )
    return CreateSession(
        session_id=session_id,
        mode=mode,
        context_id=context_id,
        tags=tag_map,
        extensions=ext_map,
        ttl_ms=ttl_ms,
        max_suspend_ms=max_suspend_ms,
        max_history_bytes=max_history_bytes,
        max_history_age_ms=max_history_age_ms,
    )


def check_retention(policy: RetentionPolicy) -> None:
    """A store's retention policy, checked when the journal opens (the field named)."""
    for name in ("max_history_bytes", "max_history_age_ms", "session_retention_ms"):
        value = getattr(policy, name)
        if value is not None and (value.__class__ is not int or not 0 < value < MAX_SETTING):
            raise InvalidArgument(
                f"RetentionPolicy.{name} must be a positive int below 2**62, or None; got {value!r}"
            )
    if policy.session_retention_from not in ("ended", "started"):
        raise InvalidArgument(
            "RetentionPolicy.session_retention_from must be 'ended' or 'started'; "
            f"got {policy.session_retention_from!r}"
        )


def file_mode_problem(value: object) -> str | None:
    """Why `value` cannot be a store's file mode (None when it can): an int of
    permission bits (no file type, setuid, sticky or execute bits) that lets the owner
    read and write."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an int such as 0o600 or 0o640, not {type(value).__name__}"
    if not 0 <= value <= 0o777:
        return f"{value!r} has bits outside 0o777"
    if value & 0o111:
        return (
            f"{value:#o} has execute bits: give the mode of the files (e.g. 0o640); "
            "directories get a search bit wherever the mode has a read bit (0o750)"
        )
    if value & 0o600 != 0o600:
        return f"{value:#o} does not let the owner read and write (add 0o600)"
    return None


def check_file_mode(file_mode: object) -> int | None:
    """`Journal.open(file_mode=...)`: None (the store's recorded mode, 0o600 for a new
    store) or a valid file mode."""
    if file_mode is None:
        return None
    problem = file_mode_problem(file_mode)
    if problem is not None or not isinstance(file_mode, int):
        raise InvalidArgument(f"file_mode {problem}")
    return file_mode


def check_snapshot(through_ordinal: object, snapshot: object) -> None:
    if not isinstance(through_ordinal, int) or through_ordinal < 1:
        raise InvalidArgument("through_ordinal must be an int >= 1")
    if not isinstance(snapshot, bytes):
        raise InvalidArgument("snapshot must be bytes (encode it first)")
    if len(snapshot) > MAX_BATCH_BYTES:
        raise InvalidArgument(f"a snapshot is limited to {MAX_BATCH_BYTES} bytes")


class EventChecker:
    """Checks appends. Event type names already validated are remembered: a deliberate,
    bounded cache (types repeat), so the common append costs one cheap pass."""

    def __init__(self) -> None:
        self._checked_types: set[str] = set()

    def append(
        self,
        session_id: str,
        events: Sequence[EventIn],
        expected_last_ordinal: int | None,
        idempotency_key: str | None,
        create: CreateSession | None = None,
    ) -> Append:
        check_name("session_id", session_id)
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
                or (
                    event.request_id is not None
                    and (
                        event.request_id.__class__ is not str
                        or len(event.request_id) > MAX_REQUEST_ID_BYTES // 4
                    )
                )
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
            check_name("idempotency_key", idempotency_key)
            digest = hashlib.sha256(
                _digest_encoder.encode([(e.type, e.data, e.request_id) for e in events])
            ).digest()
        return Append(
            session_id, list(events), expected_last_ordinal, idempotency_key, digest, create
        )

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
            if event.type in TURN_EVENT_TYPES:
                raise InvalidArgument(
                    f"events[{i}].type {event.type!r} is reserved for turns: use "
                    "`with journal.own(id) as owner, owner.turn(request_id) as turn`"
                )
            if event.type not in self._checked_types:
                check_name(f"events[{i}].type", event.type)
                if len(self._checked_types) < 4096:
                    self._checked_types.add(event.type)
            if event.request_id is not None and not isinstance(event.request_id, str):
                raise InvalidArgument(f"events[{i}].request_id must be a str or None")
            if event.request_id is not None and (
                len(event.request_id.encode()) > MAX_REQUEST_ID_BYTES
            ):
                raise InvalidArgument(
                    f"events[{i}].request_id is over {MAX_REQUEST_ID_BYTES} bytes"
                )
            total += len(event.data)
        return total
