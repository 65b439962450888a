"""The events `journal append` reads from NDJSON lines on stdin: a line that is an
envelope (`type`, `data`, `request_id`), or data stored as it is; refused as soon as the
input holds more than one append takes (`events_from_ndjson`)."""

from __future__ import annotations

import codecs
import json
from typing import IO, Any, Final

import msgspec

import journal

__all__ = ["MAX_LINE_BYTES", "events_from_ndjson"]

_ENVELOPE_KEYS = frozenset({"type", "data", "request_id"})
_ENVELOPE: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
# No line of one event is longer: its data is at most MAX_EVENT_BYTES, each byte of which
# JSON writes in at most 6 (`\u0001`), and 1 MiB covers the keys, the type and the
# request id (at most 64 KiB, escaped too).
MAX_LINE_BYTES = 6 * journal.MAX_EVENT_BYTES + (1 << 20)


def _not_a_json_number(constant: str) -> object:
    raise ValueError(f"{constant} is not a JSON number")


def events_from_ndjson(
    stream: IO[bytes], default_type: str, default_request_id: str | None
) -> list[journal.EventIn]:
    """Events from NDJSON lines (see `journal append --help`); blank lines are skipped.

    The stream is read a line at a time and refused (`InvalidArgument`, nothing read
    further) as soon as it holds more events or bytes than one append takes, or a line
    longer than any event's can be: memory stays bounded by the limits whatever the
    input."""
    events: list[journal.EventIn] = []
    total = 0
    number = 0
    while raw := stream.readline(MAX_LINE_BYTES + 1):
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise journal.InvalidArgument(
                f"stdin line {number + 1} is over {MAX_LINE_BYTES} bytes, longer than the "
                f"line of any event (its data is at most {journal.MAX_EVENT_BYTES} bytes): "
                "store large payloads elsewhere and append a reference"
            )
        for line in raw.splitlines():
            number += 1
            line = line.strip()
            if not line:
                continue
            if len(events) == journal.MAX_BATCH_EVENTS:
                raise journal.InvalidArgument(
                    f"over {journal.MAX_BATCH_EVENTS} events in one append (stdin line "
                    f"{number} is event {journal.MAX_BATCH_EVENTS + 1}); the limit is "
                    f"{journal.MAX_BATCH_EVENTS}: split it"
                )
            event = _event_of_line(line, number, default_type, default_request_id)
            if len(event.data) > journal.MAX_EVENT_BYTES:
                raise journal.InvalidArgument(
                    f"stdin line {number}: the event's data is {len(event.data)} bytes; the "
                    f"limit is {journal.MAX_EVENT_BYTES} bytes per event: store large "
                    "payloads elsewhere and append a reference"
                )
            total += len(event.data)
            if total > journal.MAX_BATCH_BYTES:
                raise journal.InvalidArgument(
                    f"over {journal.MAX_BATCH_BYTES} bytes of event data in one append "
                    f"(reached at stdin line {number}); the limit is "
                    f"{journal.MAX_BATCH_BYTES}: split it"
                )
            events.append(event)
    return events


def _event_of_line(
    line: bytes, number: int, default_type: str, default_request_id: str | None
) -> journal.EventIn:
    """The event of one non-blank NDJSON line (an envelope, or data stored as it is)."""
    # (Decoded here: from bytes, json.loads guesses UTF-16 or -32 from the first bytes,
    # and a UTF-16 line of JSON was stored, one of bytes that are not text refused as
    # not JSON. A UTF-8 BOM it takes, as before.)
    try:
        text = line.decode("utf-8-sig")
    except UnicodeDecodeError as bad:
        # (Its place is in what the decoder read: after the BOM it skipped, if any.)
        at = len(line) - len(bad.object) + bad.start
        raise journal.InvalidArgument(
            f"stdin line {number} is not UTF-8 text (byte {line[at]:#04x} at byte "
            f"{at + 1}): NDJSON is read as UTF-8; convert it (iconv) first"
        ) from None
    # (Stored as it is, but for a UTF-8 BOM, which is not part of the data: until
    # 2026-12-05 it was stored, and the data was no longer JSON.)
    data = line[len(codecs.BOM_UTF8) :] if line.startswith(codecs.BOM_UTF8) else line
    keys = _Keys()
    try:
        value = json.loads(text, parse_constant=_not_a_json_number, object_pairs_hook=keys)
    except ValueError as e:
        raise journal.InvalidArgument(
            f"stdin line {number} is not JSON ({e}): pass one JSON value per line"
        ) from None
    except RecursionError:  # (until 2026-12-07 a traceback, exit 1)
        raise _too_deep(number) from None
    if not (isinstance(value, dict) and "data" in value and value.keys() <= _ENVELOPE_KEYS):
        return journal.EventIn(default_type, data, default_request_id)
    if twice := keys.repeated():
        raise journal.InvalidArgument(
            f'stdin line {number}: the envelope gives "{twice}" twice: give each of "type", '
            '"data" and "request_id" at most once'
        )
    payload = value["data"]
    if isinstance(payload, str):
        try:
            body = payload.encode("utf-8")
        except UnicodeEncodeError:
            raise journal.InvalidArgument(
                f"stdin line {number}: data holds a lone surrogate escape, not UTF-8 text"
            ) from None
    else:
        body = _data_as_written(data, number)
    event_type = value.get("type", default_type)
    request = value.get("request_id", default_request_id)
    if not isinstance(event_type, str) or not (request is None or isinstance(request, str)):
        raise journal.InvalidArgument(
            f'stdin line {number}: "type" and "request_id" must be strings'
        )
    return journal.EventIn(event_type, body, request)


class _Keys:
    """An `object_pairs_hook` that keeps the keys of the last object parsed: the outermost
    one, which is parsed after the objects it holds."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: list[str] = []

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        self.last = [key for key, _ in pairs]
        return dict(pairs)

    def repeated(self) -> str | None:
        """The first key the outermost object gives twice, if any."""
        seen: set[str] = set()
        for key in self.last:
            if key in seen:
                return key
            seen.add(key)
        return None


def _data_as_written(line: bytes, number: int) -> bytes:
    """The JSON text of an envelope's "data", as the line writes it (the line is JSON,
    its keys given once): until 2026-12-07 it went through Python's parser and back,
    `-0` stored as `0`, `1E5` as `100000.0`, `1.00` as `1.0`."""
    try:
        return bytes(_ENVELOPE.decode(line)["data"])
    except RecursionError:
        raise _too_deep(number) from None
    except msgspec.DecodeError as e:
        # (What Python's parser takes and msgspec's does not: a \u escape of half a
        # surrogate pair, which is not a character.)
        raise journal.InvalidArgument(
            f"stdin line {number}: the envelope holds a lone surrogate escape (\\ud800 to "
            f"\\udfff, not one of a pair), which is not a character ({e})"
        ) from None


def _too_deep(number: int) -> journal.InvalidArgument:
    return journal.InvalidArgument(
        f"stdin line {number} is nested too deep to read (JSON arrays and objects about "
        "1,000 levels deep): pass such data as a DATA argument (stored as it is)"
    )
