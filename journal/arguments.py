"""Argument checks and limits: every argument is checked here, before an operation is
built, so a bad call fails alone with `InvalidArgument` and never reaches an engine."""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final, TypeVar

import msgspec

from cursors import KeyRing

from .engine import Append, CreateSession, PolicyChange, TurnGuard
from .errors import InvalidArgument
from .models import EventIn, RetentionPolicy, SessionState
from .records import TURN_EVENT_TYPES
from .waiter import Notifier

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
    "MAX_SEGMENT_BYTES",
    "MAX_SETTING",
    "REPLAY_PAGE_BYTES",
    "EventChecker",
    "batch_refused",
    "check_callback",
    "check_create",
    "check_dead_share",
    "check_engine",
    "check_file_mode",
    "check_flag",
    "check_int",
    "check_listing",
    "check_max_bytes",
    "check_mode",
    "check_name",
    "check_now",
    "check_open_options",
    "check_repair",
    "check_request_id",
    "check_retention",
    "check_seconds",
    "check_snapshot",
    "check_stop",
    "check_store_path",
    "check_text",
    "checked_policy_change",
    "file_mode_problem",
    "metadata_bytes",
    "mode_ok",
    "name_ok",
    "not_a_batch",
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
_U64_END: Final = 1 << 64
# Segment files stay far below the offsets the formats can address.
MAX_SEGMENT_BYTES: Final = 1 << 40
DEFAULT_PAGE_BYTES: Final = 1 << 20
# The pages after the first of a `replay()` without `max_bytes` (SPEC 7.5).
REPLAY_PAGE_BYTES: Final = 4 << 20
DEFAULT_PAGE_SIZE: Final = 100
MAX_PAGE_SIZE: Final = 1000

# What `check_store_path` takes for a URL (nats:// stores never reach it).
_URL_RE: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# Control characters are Unicode's (category Cc): C0, DEL and C1.
_NAME_RE: Final = re.compile(r"[^\x00-\x1f\x7f-\x9f]+")
_MODE_RE: Final = re.compile(r"[^\x00-\x1f\x7f-\x9f]*")
_digest_encoder: Final = msgspec.msgpack.Encoder()
_NAME_RULE: Final = f"1 to {MAX_NAME_LENGTH} bytes of UTF-8 without control characters"

CallbackT = TypeVar("CallbackT", bound=Callable[..., object])


def _utf8_size(value: str) -> int | None:
    """The UTF-8 length of `value`, or None when it has no UTF-8 form (lone surrogates,
    e.g. from undecodable command-line bytes)."""
    try:
        return len(value.encode())
    except UnicodeEncodeError:
        return None


def name_ok(value: str) -> bool:
    """The rule for ids, types and keys: 1 to 256 bytes of UTF-8, no control characters."""
    size = _utf8_size(value)
    return size is not None and 0 < size <= MAX_NAME_LENGTH and bool(_NAME_RE.fullmatch(value))


def mode_ok(value: str) -> bool:
    """The rule for modes: at most 256 bytes of UTF-8 (empty allowed), no control
    characters."""
    size = _utf8_size(value)
    return size is not None and size <= MAX_NAME_LENGTH and bool(_MODE_RE.fullmatch(value))


def not_a_batch(events: object) -> bool:
    """Whether `events` is not a list or tuple (any sequence) of events to append."""
    return isinstance(events, (str, bytes, EventIn)) or not isinstance(events, Sequence)


def batch_refused(events: object) -> InvalidArgument:
    """The error of an append whose `events` are not a batch (`not_a_batch`)."""
    if isinstance(events, EventIn):
        hint = ": pass one event in a list, [event]"
    elif isinstance(events, Iterator):
        hint = " (a generator or iterator: pass list(...) of it)"
    else:
        hint = ""
    name = type(events).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return InvalidArgument(f"events must be a list or tuple of EventIn, got {article} {name}{hint}")


def metadata_bytes(
    mode: str, context_id: str | None, tags: Mapping[str, str], extensions: Mapping[str, bytes]
) -> int:
    """What counts against `MAX_METADATA_BYTES` (UTF-8 and bytes)."""
    size = len(mode.encode()) + len((context_id or "").encode())
    size += sum(len(k.encode()) + len(v.encode()) for k, v in tags.items())
    return size + sum(len(k.encode()) + len(v) for k, v in extensions.items())


def _shown(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "...")


def _plain_str(what: str, value: object) -> str:
    """`value` as a plain str: a str subclass (a `StrEnum` member, ...) is copied, so
    neither its overridden methods nor its class reach the checks or the encoder."""
    if type(value) is str:
        return value
    # (The type itself, not `isinstance`: an object can claim any `__class__`.)
    if not issubclass(type(value), str):
        raise InvalidArgument(f"{what} must be a str, got {type(value).__name__}")
    return str.__str__(value)


def _plain_bytes(what: str, value: object) -> bytes:
    """`value` as plain bytes (a bytes subclass is copied through the buffer protocol)."""
    if type(value) is bytes:
        return value
    if not issubclass(type(value), bytes):
        raise InvalidArgument(
            f"{what} is a {type(value).__name__}; it must be bytes (encode text or JSON first)"
        )
    return bytes(memoryview(value))  # type: ignore[arg-type]


def check_name(what: str, value: object) -> str:
    """A plain str that follows the name rule (`name_ok`), or `InvalidArgument`."""
    value = _plain_str(what, value)
    if not name_ok(value):
        raise InvalidArgument(f"{what} {_shown(value)} is invalid: use {_NAME_RULE}")
    return value


def check_mode(value: object) -> str:
    value = _plain_str("mode", value)
    if not mode_ok(value):
        raise InvalidArgument(
            f"mode {_shown(value)} is invalid: use at most {MAX_NAME_LENGTH} bytes of UTF-8 "
            "without control characters"
        )
    return value


def check_text(what: str, value: object) -> str:
    """A plain str with a UTF-8 form (what the log stores), or `InvalidArgument`."""
    value = _plain_str(what, value)
    if _utf8_size(value) is None:
        raise InvalidArgument(
            f"{what} {_shown(value)} is not valid Unicode (lone surrogates): decode bytes "
            "with a UTF-8 codec before passing them"
        )
    return value


def check_int(what: str, value: object, low: int, high: int = MAX_SETTING) -> int:
    """An int (not a bool) with `low <= value < high`."""
    if type(value) is int and low <= value < high:
        return value
    bound = {MAX_SETTING: "2**62", _U64_END: "2**64"}.get(high, str(high))
    raise InvalidArgument(f"{what} must be an int >= {low} below {bound}, got {value!r}")


def check_flag(what: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be True or False, got {value!r}")
    return value


def check_callback(what: str, value: CallbackT | None) -> CallbackT | None:
    if value is not None and not callable(value):
        raise InvalidArgument(f"{what} must be a callable or None, got {type(value).__name__}")
    return value


def check_request_id(what: str, value: object) -> str:
    """A request id: a str with a UTF-8 form of at most 64 KiB."""
    value = check_text(what, value)
    if len(value.encode()) > MAX_REQUEST_ID_BYTES:
        raise InvalidArgument(f"{what} is over {MAX_REQUEST_ID_BYTES} bytes")
    return value


def check_seconds(what: str, value: object) -> float:
    """A finite number of seconds >= 0 (an int or a float, not a bool)."""
    if type(value) is int and 0 <= value < MAX_SETTING:
        return float(value)
    if isinstance(value, float) and math.isfinite(value) and value >= 0:
        return value
    raise InvalidArgument(f"{what} must be a finite number of seconds >= 0, got {value!r}")


def check_now(now_ms: object) -> int | None:
    if now_ms is None:
        return None
    # only compared with deadlines, never stored: any u64 will do (2**62 and up: "never")
    return check_int("now_ms (ms since the epoch)", now_ms, 0, _U64_END)


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
    session_id = check_name("session_id", session_id)
    mode = check_mode(mode)
    if context_id is not None:
        context_id = check_text("context_id", context_id)
    tag_map = _mapping("tags", tags, "str", str)
    ext_map = _mapping("extensions", extensions, "bytes", bytes)
    for name, value in (
        ("ttl_ms", ttl_ms),
        ("max_history_bytes", max_history_bytes),
        ("max_history_age_ms", max_history_age_ms),
    ):
        if value is not None and (type(value) is not int or not 0 < value < MAX_SETTING):
            raise InvalidArgument(
                f"{name} must be a positive int below 2**62, or None; got {value!r}"
            )
    if type(max_suspend_ms) is not int or not 0 <= max_suspend_ms < MAX_SETTING:
        raise InvalidArgument(
            f"max_suspend_ms must be an int >= 0 below 2**62 (0 = 7 days); got {max_suspend_ms!r}"
        )
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


ValueT = TypeVar("ValueT", str, bytes)


def _mapping(what: str, value: object, noun: str, value_type: type[ValueT]) -> dict[str, ValueT]:
    """`value` (None or a mapping of str keys to `value_type`) as a dict, every key and
    str value with a UTF-8 form."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{what} must be a mapping of str to {noun} (or None)")
    given = dict(value)
    if len(given) > MAX_METADATA_ENTRIES:
        raise InvalidArgument(f"at most {MAX_METADATA_ENTRIES} {what} per session")
    result: dict[str, ValueT] = {}
    for key, item in given.items():
        if not isinstance(key, str) or not isinstance(item, value_type):
            raise InvalidArgument(
                f"{what} must map str to {noun}; got {type(key).__name__} -> {type(item).__name__}"
            )
        key = check_text(f"a key of {what}", key)
        if isinstance(item, str):
            result[key] = check_text(f"the value of {what}[{_shown(key)}]", item)
        else:
            result[key] = _plain_bytes(f"the value of {what}[{_shown(key)}]", item)
    return result


def check_retention(policy: RetentionPolicy) -> None:
    """A store's retention policy, checked when the journal opens (the field named)."""
    for name in ("max_history_bytes", "max_history_age_ms", "session_retention_ms"):
        value = getattr(policy, name)
        if value is not None and (type(value) is not int or not 0 < value < MAX_SETTING):
            hint = (
                " (1 evicts an ended session at the first retention pass after it ends)"
                if name == "session_retention_ms" and value == 0
                else ""
            )
            raise InvalidArgument(
                f"RetentionPolicy.{name} must be a positive int below 2**62, or None; "
                f"got {value!r}{hint}"
            )
    if policy.session_retention_from not in ("ended", "started"):
        raise InvalidArgument(
            "RetentionPolicy.session_retention_from must be 'ended' or 'started'; "
            f"got {policy.session_retention_from!r}"
        )


def checked_policy_change(change: object) -> PolicyChange:
    """`change` (a callable), wrapped so that what it returns is checked as a policy."""
    if not callable(change):
        raise InvalidArgument(
            f"change must be a callable taking and returning a RetentionPolicy, "
            f"got {type(change).__name__}"
        )

    def checked(recorded: RetentionPolicy) -> RetentionPolicy:
        wanted = change(recorded)
        if not isinstance(wanted, RetentionPolicy):
            raise InvalidArgument(
                f"change must return a RetentionPolicy, it returned {type(wanted).__name__}"
            )
        check_retention(wanted)
        return wanted

    return checked


def file_mode_problem(value: object, *, as_chmod: bool = False) -> str | None:
    """Why `value` cannot be a store's file mode (None when it can): an int of
    permission bits (no file type, setuid, sticky or execute bits) that lets the owner
    read and write. Modes are written as Python literals (0o640), or with `as_chmod` as
    chmod takes them (0640), for a mode its user typed as octal digits (the CLI's
    `--file-mode`: no hint about a decimal slip then)."""

    def mode(bits: int) -> str:
        return f"{bits:04o}" if as_chmod else f"{bits:#o}"

    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an int such as 0o600 or 0o640, not {type(value).__name__}"
    if not 0 <= value <= 0o777:
        digits = str(value)
        hint = (
            f" (did you mean 0o{digits}? a mode is octal)"
            if not as_chmod and set(digits) <= set("01234567") and int(digits, 8) <= 0o777
            else ""
        )
        return f"{mode(value)} has bits outside {mode(0o777)}{hint}"
    if value & 0o111:
        return (
            f"{mode(value)} has execute bits: give the mode of the files (e.g. "
            f"{mode(0o640)}); directories get a search bit wherever the mode has a read "
            f"bit ({mode(0o750)})"
        )
    if value & 0o600 != 0o600:
        return f"{mode(value)} does not let the owner read and write (add {mode(0o600)})"
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


def check_snapshot(
    through_ordinal: object, snapshot: object, kind: str = "snapshot"
) -> tuple[int, bytes]:
    """(through_ordinal, snapshot) checked, the snapshot (or checkpoint: `kind`) as plain
    bytes."""
    ordinal = check_int("through_ordinal", through_ordinal, 1)
    data = _plain_bytes(kind, snapshot)
    if len(data) > MAX_BATCH_BYTES:
        raise InvalidArgument(
            f"a {kind} is limited to {MAX_BATCH_BYTES} bytes (64 MiB); this one is {len(data)}"
        )
    return ordinal, data


# How many validated names of each kind an `EventChecker` remembers.
_REMEMBERED: Final = 4096


def _remember(names: set[str], name: str) -> None:
    """Add a validated name to a bounded set of them (a full set starts over)."""
    if len(names) >= _REMEMBERED:
        names.clear()
    names.add(name)


class EventChecker:
    """Checks appends. Session ids and event type names already validated are remembered
    (a deliberate, bounded cache: they repeat), so the common append costs one cheap
    pass."""

    def __init__(self) -> None:
        self._checked_types: set[str] = set()
        self._checked_ids: set[str] = set()

    def append(
        self,
        session_id: str,
        events: Sequence[EventIn],
        expected_last_ordinal: int | None,
        idempotency_key: str | None,
        create: CreateSession | None = None,
        turn: TurnGuard | None = None,
    ) -> Append:
        if type(session_id) is not str or session_id not in self._checked_ids:
            session_id = check_name("session_id", session_id)
            _remember(self._checked_ids, session_id)
        if not_a_batch(events):
            raise batch_refused(events)
        events = list(events)  # what is checked is what is written
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
                type(event) is not EventIn
                or type(data := event.data) is not bytes
                or type(event.type) is not str
                or event.type not in checked
                or (
                    event.request_id is not None
                    and (
                        type(event.request_id) is not str
                        # ASCII (an O(1) flag) has a UTF-8 form of its own length
                        or not event.request_id.isascii()
                        or len(event.request_id) > MAX_REQUEST_ID_BYTES
                    )
                )
            ):
                total, events = self._check_events(events)
                break
            total += len(data)
        else:
            if total > MAX_EVENT_BYTES:
                self._check_events(events)
        if total > MAX_BATCH_BYTES:
            raise InvalidArgument(
                f"one append of {total} bytes exceeds {MAX_BATCH_BYTES} bytes: split it"
            )
        if expected_last_ordinal is not None:
            check_int("expected_last_ordinal (or None)", expected_last_ordinal, 0)
        digest = b""
        if idempotency_key is not None:
            idempotency_key = check_name("idempotency_key", idempotency_key)
            digest = hashlib.sha256(
                _digest_encoder.encode([(e.type, e.data, e.request_id) for e in events])
            ).digest()
        return Append(
            session_id, events, expected_last_ordinal, idempotency_key, digest, create, total, turn
        )

    def _check_events(self, events: list[EventIn]) -> tuple[int, list[EventIn]]:
        """Validate every event precisely (raising the first problem): the total data
        bytes, and the events as plain `EventIn`s of plain str and bytes."""
        total = 0
        plain: list[EventIn] = []
        for i, event in enumerate(events):
            if not isinstance(event, EventIn):
                raise InvalidArgument(f"events[{i}] is a {type(event).__name__}, not an EventIn")
            data = _plain_bytes(f"events[{i}].data", event.data)
            if len(data) > MAX_EVENT_BYTES:
                raise InvalidArgument(
                    f"events[{i}].data is {len(data)} bytes; the limit is "
                    f"{MAX_EVENT_BYTES} bytes per event: store large payloads elsewhere "
                    "and append a reference"
                )
            event_type = event.type
            if type(event_type) is not str or event_type not in self._checked_types:
                event_type = check_name(f"events[{i}].type", event_type)
                if event_type in TURN_EVENT_TYPES:
                    raise InvalidArgument(
                        f"events[{i}].type {event_type!r} is reserved for turns: use "
                        "`with journal.own(id) as owner, owner.turn(request_id) as turn`"
                    )
                _remember(self._checked_types, event_type)
            request_id = event.request_id
            if request_id is not None:
                request_id = check_request_id(f"events[{i}].request_id", request_id)
            if (
                type(event) is not EventIn
                or data is not event.data
                or event_type is not event.type
                or request_id is not event.request_id
            ):
                event = EventIn(event_type, data, request_id)
            plain.append(event)
            total += len(data)
        return total, plain


def check_listing(page_size: object, state: object) -> int:
    """The page size to use (clamped to `MAX_PAGE_SIZE`), or `InvalidArgument`."""
    if type(page_size) is not int or page_size < 1:
        # (`list_sessions(state, page_size)` and `list_sessions_page(page_size,
        # page_token, state)` take them in other orders: a new user passed the state
        # first to the second)
        hint = ": pass it as state=..." if isinstance(page_size, SessionState) else ""
        raise InvalidArgument(f"page_size must be an int >= 1, got {page_size!r}{hint}")
    if state is not None and not isinstance(state, SessionState):
        hint = ""
        if isinstance(state, str) and state in {s.value for s in SessionState}:
            hint = f": pass SessionState.{state.upper()} (or SessionState({state!r}))"
        elif type(state) is int:  # (`list_sessions(100)`: the page size given first)
            hint = ": pass it as page_size=..."
        raise InvalidArgument(f"state must be a SessionState or None, got {state!r}{hint}")
    return min(page_size, MAX_PAGE_SIZE)


def check_stop(stop: object) -> None:
    if stop is not None and not callable(getattr(stop, "is_set", None)):
        raise InvalidArgument(
            f"stop must be a threading.Event (or None), got {type(stop).__name__}"
        )


def check_store_path(path: object) -> str:
    """The store's path as a str the local engine can use, or `InvalidArgument`."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgument(f"path must be a str or os.PathLike, not {type(path).__name__}")
    try:
        given = os.fspath(path)
    except TypeError as e:  # a PathLike whose __fspath__ returns neither str nor bytes
        raise InvalidArgument(f"path: {e}") from None
    if not isinstance(given, str):
        raise InvalidArgument("path must name the store as a str, not bytes")
    if not given:
        raise InvalidArgument('path is empty: name the store\'s directory (".": this one)')
    if "\0" in given:
        raise InvalidArgument("path contains a NUL character")
    url = _URL_RE.match(given)
    if url is not None:
        # (Taken as a local path, "http://h/x" made the directories "http:/h/x" here.)
        raise InvalidArgument(
            f"path {given!r} is a {url.group(1)}:// URL: a remote store is "
            "nats://HOST:PORT/STORE (the scheme in lower case); a directory of that name "
            f"is ./{given}"
        )
    if given[:5].lower() == "nats:" or given[:6].lower() == "nats//":
        # (Taken as a local path, "nats:/h/x" was a store not found, whose advice to
        # create it made the directories "nats:/h/x" here: a new-user trial.)
        # (A pathlib.Path of a right URL is one too: it keeps one of the two slashes.)
        collapsed = (
            ""
            if isinstance(path, str)
            else f" (a {type(path).__name__} keeps one of two slashes: pass the URL as a str)"
        )
        raise InvalidArgument(
            f"path {given!r} is a misspelt nats:// URL{collapsed}: a store on NATS JetStream "
            "is nats://HOST:PORT/STORE (two slashes after 'nats:', such as "
            "nats://127.0.0.1:4222/agents); a directory of that name is ./" + given
        )
    try:
        given.encode()
    except UnicodeEncodeError:
        # The LMDB view opens its files by a UTF-8 path.
        raise InvalidArgument(
            f"path {given!r} has no UTF-8 form (it names undecodable bytes): give the "
            "store a directory whose path is valid UTF-8"
        ) from None
    return given


# What `Journal.over` needs of an engine before it uses it (see `journal.engine.Engine`).
_ENGINE_METHODS = (
    "check_usable",
    "submit",
    "head",
    "session",
    "session_id_of",
    "sessions",
    "registry",
    "feed",
    "readers",
    "read",
    "snapshot",
    "checkpoint",
    "acquire",
    "owner_alive",
    "verify",
    "compact",
    "stats",
    "close",
)


def check_engine(engine: object) -> None:
    missing = [name for name in _ENGINE_METHODS if not callable(getattr(engine, name, None))]
    if missing:
        raise InvalidArgument(
            f"engine must implement journal.engine.Engine; a {type(engine).__name__} lacks "
            f"{', '.join(missing)}"
        )
    for name, kind in (
        ("store_id", bytes),
        ("key_ring", KeyRing),
        ("readonly", bool),
        ("location", str),
        ("waiter", Notifier),
    ):
        if not isinstance(getattr(engine, name, None), kind):
            raise InvalidArgument(f"engine.{name} must be a {kind.__name__}")


def check_dead_share(dead_share: object) -> float:
    if (
        not isinstance(dead_share, (int, float))
        or isinstance(dead_share, bool)
        or not 0.0 <= dead_share <= 1.0
    ):
        raise InvalidArgument(f"dead_share must be a number between 0 and 1, got {dead_share!r}")
    return float(dead_share)


def check_max_bytes(max_bytes: object) -> None:
    if type(max_bytes) is not int or max_bytes < 1:
        raise InvalidArgument(f"max_bytes must be an int >= 1, got {max_bytes!r}")


def check_repair(repair: object, readonly: object) -> None:
    """`Journal.open`'s `repair`: a flag or "cut-durable", for a journal that writes (the
    fix does)."""
    if repair != "cut-durable" and not isinstance(repair, bool):
        raise InvalidArgument(f'repair must be True, False or "cut-durable", got {repair!r}')
    if repair and readonly is True:
        raise InvalidArgument(
            f"repair={repair!r} is for verify(fix=True), which writes: open the store "
            "without readonly=True"
        )


# What each keyword of `Journal.open` that a read-only journal refuses is for (SPEC 10):
# those that would change the store. (`durability`, `segment_bytes` and `compress_sealed`,
# how a writer writes, are taken and do nothing there: one set of options serves a
# store's writers and readers.)
_WRITER_ONLY: Final = {
    "retention": "the policy a writer records in the store and applies; a read-only "
    "journal reads the recorded one, retention_policy()",
    "file_mode": "the mode of the files a writer creates; a read-only journal creates "
    "nothing in the store",
}


def check_open_options(
    create: object,
    readonly: object,
    durability: object,
    segment_bytes: object,
    retention: object,
    compress_sealed: object,
    key_ring: object,
    file_mode: object,
) -> int | None:
    """The keywords of `Journal.open` (the path is `check_store_path`'s); the file mode.
    With `readonly`, those that would change the store must be left out (SPEC 10)."""
    for name, flag in (
        ("create", create),
        ("readonly", readonly),
        ("compress_sealed", compress_sealed),
    ):
        check_flag(name, flag)
    if not isinstance(durability, str) or durability not in ("fsync", "os"):
        raise InvalidArgument(f"durability must be 'fsync' or 'os', got {durability!r}")
    check_int("segment_bytes", segment_bytes, 4096, MAX_SEGMENT_BYTES)
    if retention is not None and not isinstance(retention, RetentionPolicy):
        raise InvalidArgument("retention must be a RetentionPolicy or None")
    if retention is not None:
        check_retention(retention)
    if key_ring is not None and not isinstance(key_ring, KeyRing):
        raise InvalidArgument("key_ring must be a cursors.KeyRing or None")
    mode = check_file_mode(file_mode)
    if readonly:
        for name, value in (("retention", retention), ("file_mode", mode)):
            if value is not None:
                raise InvalidArgument(
                    f"{name} is for journals that write ({_WRITER_ONLY[name]}): open the "
                    "store without readonly=True to use it, or leave it out"
                )
    return mode
