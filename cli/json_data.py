"""Event data in the command's JSON: printed as the bytes stored (`embedded`, `json_line`).

Data that is JSON goes out as the stored bytes themselves (`msgspec.Raw`), not decoded
and encoded again: a round trip through Python values changed what a user stored
(`-0` came out as `0`, `1E5` as `100000.0`, and data it could not write back exactly,
`1e400` or a key given twice, went out as base64). Only two things are not byte for
byte, both leaving every JSON token as it is: whitespace between tokens is removed when
the data holds a line break (an NDJSON line cannot hold one), and `read`/`watch` write
characters beyond ASCII as `\\u` escapes (their output is ASCII: a terminal of any
encoding shows it, and it stays UTF-8 JSON).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
from typing import Any, Final

import msgspec

__all__ = ["embedded", "json_line", "json_value"]

_ENCODER: Final = msgspec.json.Encoder()
_OBJECT: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ONE_VALUE: Final = msgspec.json.Decoder(msgspec.Raw)
_BEYOND_ASCII: Final = re.compile("[^\x00-\x7f]+")

# The deepest data embedded as JSON: a fixed depth, not where a parser runs out of the
# recursion limit (that depends on the stack it runs from), and one that a consumer's
# parser reads from deep in its own stack (Python's json.loads stops near 990 levels
# less the caller's frames).
MAX_DEPTH: Final = 512
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # (of valid JSON)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_STEP: Final = [1 if b in b"[{" else -1 for b in range(256)]


def embedded(data: bytes) -> msgspec.Raw | dict[str, str]:
    """Event data as NDJSON carries it: JSON data as its own bytes, anything else as
    `{"base64": "..."}`; JSON data that is itself an object whose only key is "base64"
    goes out as base64 too, so `{"base64": ...}` always means "decode me".

    JSON here is strict UTF-8 JSON as RFC 8259 writes it: no NaN or Infinity, no byte
    order mark, no `\\u` escape of a lone surrogate (msgspec refuses it), nested at most
    `MAX_DEPTH` (512) levels; numbers of any size and keys given twice
    are JSON, and go out as stored."""
    try:
        data.decode("utf-8")  # (strict: msgspec lets a UTF-8-encoded surrogate through)
        _ONE_VALUE.decode(data)  # (checks the whole text, decodes no value)
        if _deeper_than(data, MAX_DEPTH):
            raise ValueError("JSON data nested deeper than MAX_DEPTH")
        # (A key "base64" is written so, or with \u escapes: only then a second pass.)
        maybe = b"base64" in data or b"\\u" in data
        if maybe and data.lstrip().startswith(b"{") and set(_OBJECT.decode(data)) == {"base64"}:
            raise ValueError("JSON data that reads as base64 data")
    except (ValueError, msgspec.DecodeError, RecursionError):
        # (RecursionError: nested deeper than the parser goes; base64 then, as for any
        # data that cannot be embedded.)
        return {"base64": base64.b64encode(data).decode("ascii")}
    if b"\n" in data or b"\r" in data:
        # Only between tokens (a JSON string holds none): removed, the tokens kept.
        return msgspec.Raw(msgspec.json.format(data, indent=-1))
    return msgspec.Raw(data)


def _deeper_than(data: bytes, depth: int) -> bool:
    """Whether valid JSON `data` nests arrays and objects more than `depth` levels (counted
    only when it holds more brackets than that: strings removed, then the brackets')."""
    if data.count(b"[") + data.count(b"{") <= depth:
        return False
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0) > depth


def json_line(record: Any) -> str:
    """`record` as one line of ASCII JSON, `msgspec.Raw` values (`embedded`) as their
    bytes; characters beyond ASCII (only in strings, where JSON allows them) as `\\u`
    escapes, as `json.dumps` writes them."""
    line = _ENCODER.encode(record)
    if line.isascii():
        return line.decode("ascii")
    return _BEYOND_ASCII.sub(_escaped, line.decode("utf-8"))


def _escaped(run: re.Match[str]) -> str:
    return json.dumps(run.group())[1:-1]


def json_value(data: bytes) -> Any:
    """The value of event data that is JSON (for text that reads a field of it), or None."""
    try:
        return msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
