"""The view's value codec: the CRC32 every value ends with, checked decoding of keys and
values, and the `JournalCorrupt` damage found in the view becomes (shared by `view` and
`state_index`, which own the key layouts).

Every value ends with a big-endian CRC32 of the entry's key and the rest of the value:
`crc32(payload, crc32(key))`. A value that fails it, or does not decode, is damage.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Final, TypeVar, overload

import msgspec

from ..errors import JournalCorrupt
from ..sessions import SessionRow

__all__ = [
    "CRC",
    "U64",
    "U64X2",
    "ListedRows",
    "Raw",
    "corrupt",
    "decoded",
    "encoder",
    "key_pair",
    "key_u64",
    "listed_row",
    "row_decoder",
    "seal",
    "text_value",
    "u64_value",
    "unseal",
]

U64: Final = struct.Struct(">Q")
U64X2: Final = struct.Struct(">QQ")
CRC: Final = struct.Struct(">I")
encoder: Final = msgspec.msgpack.Encoder()
row_decoder: Final = msgspec.msgpack.Decoder(SessionRow)
T = TypeVar("T")
# What LMDB hands back for keys and values.
Raw = bytes | memoryview

_WAY_OUT: Final = (
    "the view is derived from the log: `journal verify --fix` (Journal.verify(fix=True)) "
    "rebuilds it, and so does the next writable open"
)


def corrupt(detail: str) -> JournalCorrupt:
    """The error every damaged-view finding becomes (segment `index`)."""
    return JournalCorrupt("index", 0, f"{detail}; {_WAY_OUT}")


def seal(key: bytes, payload: bytes) -> bytes:
    """The stored value: `payload` and its CRC over the key and the payload."""
    return payload + CRC.pack(zlib.crc32(payload, zlib.crc32(key)))


def unseal(key: Raw, raw: Raw, db: str) -> memoryview:
    """The payload of a stored value, after checking its CRC against the key."""
    view = memoryview(raw)
    if (
        len(view) < 4
        or zlib.crc32(view[:-4], zlib.crc32(key)) != CRC.unpack_from(view, len(view) - 4)[0]
    ):
        raise corrupt(f"the {db} entry {bytes(key)[:40]!r} fails its checksum")
    return view[:-4]


def decoded(decoder: msgspec.msgpack.Decoder[T], key: Raw, raw: Raw, db: str) -> T:
    payload = unseal(key, raw, db)
    try:
        return decoder.decode(payload)
    except msgspec.DecodeError as e:
        raise corrupt(f"the {db} entry {bytes(key)[:40]!r} does not decode ({e})") from None


def text_value(key: Raw, raw: Raw, db: str) -> str:
    try:
        return bytes(unseal(key, raw, db)).decode()
    except UnicodeDecodeError:
        raise corrupt(f"the {db} entry {bytes(key)[:40]!r} is not UTF-8") from None


def u64_value(key: Raw, raw: Raw, db: str) -> int:
    payload = unseal(key, raw, db)
    if len(payload) != 8:
        raise corrupt(f"the {db} entry {bytes(key)[:40]!r} has {len(payload)} bytes, not 8")
    return int(U64.unpack(payload)[0])


def key_pair(key: Raw, db: str) -> tuple[int, int]:
    if len(key) != 16:
        raise corrupt(f"a {db} key of {len(key)} bytes")
    first, second = U64X2.unpack(key)
    return int(first), int(second)


def key_u64(key: Raw, db: str) -> int:
    if len(key) != 8:
        raise corrupt(f"a {db} key of {len(key)} bytes")
    return int(U64.unpack(key)[0])


def listed_row(key: Raw, raw: Raw) -> SessionRow:
    """A `sessions` row met by a scan or an index: checked, and checked to be its key's."""
    row = decoded(row_decoder, key, raw, "sessions")
    if row.session_id.encode() != bytes(key):
        raise corrupt(f"the row under {bytes(key)[:40]!r} names session {row.session_id!r}")
    return row


class ListedRows(Sequence[SessionRow]):
    """`sessions` rows copied out still encoded (key, value), each decoded by `listed_row`
    when read: about 160 B per row held instead of about 670 B decoded (a startup
    snapshot of 100,000 sessions: 16 MB instead of 67)."""

    __slots__ = ("_encoded",)

    def __init__(self, encoded: list[tuple[bytes, bytes]]) -> None:
        self._encoded = encoded

    def __len__(self) -> int:
        return len(self._encoded)

    @overload
    def __getitem__(self, index: int) -> SessionRow: ...

    @overload
    def __getitem__(self, index: slice) -> list[SessionRow]: ...

    def __getitem__(self, index: int | slice) -> SessionRow | list[SessionRow]:
        if isinstance(index, slice):
            return [listed_row(*encoded) for encoded in self._encoded[index]]
        return listed_row(*self._encoded[index])
