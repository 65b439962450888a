"""How the `journal` command shows what a store holds: events, sessions and lifecycle
events as JSON records (the watch contract's kinds) and as text lines, and the text of the
store (ids, tags, messages) quoted or escaped onto one line of one width.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import Any, Final

import msgspec

import journal
from journal import TURN_RESULT, TURN_STARTED

from .json_data import embedded, json_value

__all__ = [
    "display_width",
    "event_quiet",
    "event_record",
    "event_text",
    "id_column",
    "lifecycle_record",
    "lifecycle_text",
    "listing_parts",
    "one_line",
    "plural",
    "preview",
    "session_record",
    "session_text",
    "shown",
]


def preview(data: bytes, limit: int = 100) -> str:
    """A one-line, printable rendering of payload bytes, cut at `limit` (3 or more)
    characters."""
    # Only the head that can show is decoded and escaped, so a payload of megabytes costs
    # what a short one does. A decoded character takes at most 4 bytes, and each one
    # escapes to at least one character: the first limit + 1 decoded characters decide
    # both what is shown and whether it was cut.
    head = data[: 4 * (limit + 1)].decode("utf-8", "backslashreplace")[: limit + 1]
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in head)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def event_record(event: journal.Event) -> dict[str, Any]:
    """An event in the watch contract's kinds: `message` (and any other type) with
    `message`, `turn_started`, and `turn_result` with `result`; all with `ordinal`,
    `cursor` and `requestId`."""
    record: dict[str, Any] = {
        "type": event.type,
        "ordinal": event.ordinal,
        "cursor": event.cursor,
        "requestId": event.request_id,
    }
    if event.type == TURN_RESULT:
        record["result"] = embedded(event.data)
    elif event.type != TURN_STARTED:
        record["message"] = embedded(event.data)
    return record


def event_text(event: journal.Event, limit: int = 100) -> str:
    request = f" [{shown(event.request_id)}]" if event.request_id else ""
    if event.type == TURN_STARTED:
        return f"#{event.ordinal} turn_started{request} cursor={event.cursor}"
    if event.type == TURN_RESULT:
        result = json_value(event.data)
        status = result.get("status", "?") if isinstance(result, dict) else "?"
        error = result.get("error") if isinstance(result, dict) else None
        detail = f" {error.get('code')}: {error.get('message')}" if isinstance(error, dict) else ""
        line = f"{status}{detail}"
        return f"#{event.ordinal} turn_result{request} {one_line(line)} cursor={event.cursor}"
    # (The type is any text without control characters: shown as ids are, where it was
    # printed raw until 2026-12-06, `t y` reading as the type `t`.)
    return f"#{event.ordinal} {shown(event.type)}{request} {preview(event.data, limit)}"


def event_quiet(event: journal.Event) -> str | None:
    """Quiet format: the text of messages only."""
    if event.type in (TURN_STARTED, TURN_RESULT):
        return None
    return event.data.decode("utf-8", "replace")


def session_record(meta: journal.SessionMetadata) -> dict[str, Any]:
    """Every field of the metadata; enums as their string values, tuples as lists."""
    record: dict[str, Any] = msgspec.to_builtins(meta)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in record.items()}


def plural(n: int, noun: str) -> str:
    """`1 session`, `2 sessions`."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def display_width(text: str) -> int:
    """Terminal columns of `text`: East Asian wide and full-width characters take two,
    combining marks and zero-width characters (format controls, ZWJ) none."""
    width = 0
    for ch in text:
        if unicodedata.combining(ch) or unicodedata.category(ch) == "Cf":
            continue
        width += 2 if unicodedata.east_asian_width(ch) in "WF" else 1
    return width


# A listing's id column: at least 8 columns, at most 48 (a longer id is printed whole,
# past the column, rather than widening every row).
_ID_COLUMNS: Final = (8, 48)


def id_column(session_ids: Iterable[str]) -> int:
    """The width of a listing's id column: the widest of `session_ids` as printed
    (`shown`, in terminal columns) among those that fit `_ID_COLUMNS`."""
    least, most = _ID_COLUMNS
    widths = (display_width(shown(session_id)) for session_id in session_ids)
    return max([least, *(width for width in widths if width <= most)])


def listing_parts(
    session_id: str, state: journal.SessionState, count: int, first: int, last: int, id_width: int
) -> list[str]:
    """The first columns of a session's listing line (a store's, or an archive's): the
    id padded to `id_width` columns (a longer id is printed whole, so nothing is hidden),
    the state, and how many events with their ordinals (none left of a session that had
    some, all compacted into a snapshot or trimmed: after which ordinal)."""
    events = f"{count} events" if count != 1 else "1 event"
    if count:
        events += f" (#{first}..#{last})"
    elif last:
        events += f" (after #{last})"
    session_id = shown(session_id)
    padding = " " * max(0, id_width - display_width(session_id))
    return [session_id + padding, f"{state.value:<9}", events]


def session_text(meta: journal.SessionMetadata, id_width: int) -> str:
    """One listing line (`listing_parts`, then mode, tags, the session's own history
    windows, owner and open turn)."""
    count = max(0, meta.last_ordinal - meta.first_ordinal + 1)
    parts = listing_parts(
        meta.session_id, meta.state, count, meta.first_ordinal, meta.last_ordinal, id_width
    )
    if meta.mode:
        parts.append(f"mode={shown(meta.mode)}")
    if meta.tags:
        pairs = (f"{shown(k)}={shown(v)}" for k, v in sorted(meta.tags.items()))
        parts.append("tags=" + ",".join(pairs))
    if meta.max_history_bytes is not None:  # (the session's own windows: SPEC 8)
        parts.append(f"max-history-bytes={meta.max_history_bytes}")
    if meta.max_history_age_ms is not None:
        parts.append(f"max-history-age-ms={meta.max_history_age_ms}")
    if meta.owner is not None:
        parts.append(f"owner=pid {meta.owner.pid}@{shown(meta.owner.host)}")
    if meta.open_turn is not None:
        # An ended session cannot be owned: nobody will settle its turn (SPEC 7.8).
        if meta.state.terminal:
            mark = " (session ended, never settled)"
        else:
            mark = "" if meta.owner else " (no owner)"
        parts.append(f"open-turn={shown(meta.open_turn)}{mark}")
    return "  ".join(parts)


def shown(text: str) -> str:
    """Text of the store (a session id, a tag, a request id, a context id) as one word of
    one line: as it is when it is plain, else in double quotes, with `"` and `\\` escaped
    and control and format characters as in Python string literals. (A newline would fake
    a listing row, a right-to-left override show one id as another, and a space, `=` or
    `,` split a field: `a b` was shown as two words and the tag `k=v w` as `k=v w`, and
    the id `a\\nb` as the escaped newline of another id, until 2026-12-06.)"""
    if _PLAIN.fullmatch(text) and text.isprintable():
        return text
    return '"' + "".join(_ESCAPES.get(c) or _escaped(c) for c in text) + '"'


_PLAIN: Final = re.compile(r'[^\s"\\=,]+')
_ESCAPES: Final = {'"': '\\"', "\\": "\\\\"}


def _escaped(char: str) -> str:
    return char if char.isprintable() else char.encode("unicode_escape").decode("ascii")


def one_line(text: str) -> str:
    """Prose of the store (a turn's error message, a field of `sessions show`) on one line:
    control and format characters escaped as in Python string literals, nothing quoted,
    the other characters as they are (until 2026-12-06 the whole text was escaped once
    one character was: `Größe\n` read `Gr\xf6\xdfe\n`)."""
    return text if text.isprintable() else "".join(map(_escaped, text))


def lifecycle_record(event: journal.LifecycleEvent) -> dict[str, Any]:
    return {
        "event_type": event.event_type.value,
        "session": session_record(event.session),
        "cursor": event.cursor,
        "observed_at_ms": event.observed_at_ms,
        "in_snapshot": event.in_snapshot,
    }


def lifecycle_text(event: journal.LifecycleEvent) -> str:
    meta = event.session
    mode = f" (mode={shown(meta.mode)})" if meta.mode else ""
    line = f"{event.event_type.value} {shown(meta.session_id)}{mode} state={meta.state.value}"
    # (A snapshot's `created` names a session that exists, not one just made.)
    return f"{line} (in the startup snapshot)" if event.in_snapshot else line
