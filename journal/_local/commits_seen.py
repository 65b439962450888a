"""Which sessions the commits of other processes touched, for the shared waiter
(`waiter.Notifier`, SPEC 7.6): its thread reads the committed head, and here the frames
committed since its previous look, so it wakes only those sessions' followers.

Every record but a session's creation names the incarnation it belongs to as its first
field; the frames between two heads of the same segment are read and those fields
collected (the rest of each record is not decoded). Anything else (the first look, a
segment sealed in between, more than `MAX_BYTES` to read, a read that fails) is "not
known", and every follower looks.
"""

from __future__ import annotations

from typing import Final

import msgspec

from ..errors import JournalCorrupt
from .files import FileOps
from .segments import SegmentReader
from .view import Head

__all__ = ["CommitsSeen"]

# Past this many bytes of frames it is cheaper to let every follower look.
MAX_BYTES: Final = 4 << 20

# The records' tags that carry no incarnation of an existing session (a creation, an
# import's staging: their incarnation is their own position).
_NEW_SESSIONS: Final = frozenset({1, 10})


class _Owner(msgspec.Struct, array_like=True):
    """A record's tag and first field (the incarnation, or a new session's id)."""

    kind: int
    first: int | str


_DECODER: Final = msgspec.msgpack.Decoder(list[_Owner])


class CommitsSeen:
    """The sessions touched between one head the waiter thread read and the next (one
    instance per waiter thread: it keeps where its previous look ended)."""

    def __init__(self, directory: str, ops: FileOps) -> None:
        self._directory = directory
        self._ops = ops
        self._last: Head | None = None

    def since_last(self, head: Head | None) -> set[int] | None:
        """The incarnations the frames up to `head` touched since the previous call's
        head (None: not known)."""
        last, self._last = self._last, head
        if head is None or last is None:
            return None
        if head.next_position == last.next_position:
            return set()
        if head.next_position < last.next_position:
            # The head went back (a hole accepted, SPEC 9) since that read, maybe taken
            # again by new commits: which is not known. (Until 2026-12-05 "none": a hole
            # seen by the thread's plain head reads, while few followers waited, left
            # this point ahead, and the commits that took the positions again woke
            # nobody once more followers waited; a review.)
            return None
        if (
            head.segment != last.segment
            or head.end_offset <= last.end_offset
            or head.end_offset - last.end_offset > MAX_BYTES
        ):
            return None
        try:
            return self._read(head.segment, last.end_offset, head.end_offset)
        except (OSError, JournalCorrupt, msgspec.DecodeError):
            return None

    def _read(self, segment: int, offset: int, end: int) -> set[int]:
        touched: set[int] = set()
        with SegmentReader(self._directory, segment, self._ops) as reader:
            while offset < end:
                info, body = reader.read_frame(offset, end)
                for record in _DECODER.decode(body):
                    if record.kind not in _NEW_SESSIONS and type(record.first) is int:
                        touched.add(record.first)
                offset = info.end_offset
        return touched
