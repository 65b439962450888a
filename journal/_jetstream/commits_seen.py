"""Which sessions the commits since its previous look touched, for the shared waiter's
thread (`waiter.Notifier`'s `read_changes`, SPEC 7.6 and 16): it reads the stream's head,
and here the messages that name those sessions, so it wakes only their followers.

Every commit of a session is one atomic batch ending with the session's row (section
16), rolled up: the row subject keeps only its newest message, so a session committed to
since the previous look has its row message at or after that look's head (a later commit
replaced it with a later one). An eviction's row is a tombstone, purged with the rest of
the session soon after: its lifecycle feed entry (kept until a day after the eviction,
feed_pruning.py) names the incarnation.
So the row messages and the feed entries from the previous head on name every session
touched since (and perhaps a few touched after the head read: they look once, early).

Anything else is "not known", and every follower looks: the first look, a tombstone,
more than `MOST` messages to read, a read that fails or a message that does not decode.
On a replicated stream the messages are read through the leader (one get a message): a
direct get may be answered by a replica that has not stored the newest rows yet.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Coroutine
from typing import Any, Final

import msgspec

from ..errors import JournalCorrupt
from .client import ApiError, Found, Unavailable
from .reads import StoreReader, decode_feed, stored_row

__all__ = ["CommitsSeen"]

# Past this many messages of either kind (rows, feed entries) since the previous look,
# reading them costs more than every follower's look.
MOST: Final = 256
# Through the leader (a replicated stream), one request a message: fewer.
MOST_THROUGH_LEADER: Final = 32

# The head, and the incarnations touched since the previous look (None: not known).
Changes = tuple[int, Collection[int] | None]


class CommitsSeen:
    """The waiter thread's `read_changes` (see the module docstring): one instance per
    engine, called by its one waiter thread; it keeps the head of its previous call."""

    def __init__(self, reader: StoreReader, closed: Callable[[], bool]) -> None:
        self._conn = reader.conn
        self._subjects = reader.subjects
        self._reader = reader
        self._closed = closed
        self._last: int | None = None  # the head the previous call returned

    def read(self, ask: Callable[[Callable[[], Coroutine[Any, Any, Changes]]], Changes]) -> Changes:
        """The committed next position, and the incarnations the commits since the
        previous call's head touched (None: not known), read by the engine's `ask` (as
        its `head`; past the end when the engine is closed: every follower looks, and
        its own read raises)."""
        if self._closed():
            return 1 << 63, None
        return ask(self._read)

    async def _read(self) -> Changes:
        """`read` on the connection's loop: a failure to read the head raises (as
        `StoreReader.head`); one to read the sessions is "not known"."""
        info = await self._conn.api(f"$JS.API.STREAM.INFO.{self._conn.stream}")
        last = int(info["state"]["last_seq"])
        self._reader.saw(last)
        head = last + 1
        previous, self._last = self._last, head
        if previous is None:
            return head, None
        if head <= previous:
            return head, ()  # (a purge never renumbers: nothing was committed)
        leader = int(info.get("config", {}).get("num_replicas", 1)) != 1
        try:
            touched: set[int] = set()
            for subject in (self._subjects.rows, self._subjects.feed):
                found = await self._since(subject, previous, leader)
                if found is None:
                    return head, None
                for message in found:
                    incarnation = self._incarnation(message)
                    if incarnation is None:
                        return head, None
                    touched.add(incarnation)
            return head, touched
        except (ApiError, *Unavailable, msgspec.DecodeError, JournalCorrupt):
            return head, None

    def _incarnation(self, message: Found) -> int | None:
        """The incarnation a row message or feed entry names (None: a tombstone). A
        staged row's (an import in progress) has no follower: it wakes nobody."""
        if message.subject.startswith(self._subjects.feed[:-1]):
            return decode_feed(message).row.incarnation
        row = stored_row(message)
        return None if row is None else row.incarnation

    async def _since(self, subject: str, first: int, leader: bool) -> list[Found] | None:
        """The messages of `subject` (a wildcard) from sequence `first` on, None when
        there are more than the most read."""
        if not leader:
            body: dict[str, Any] = {"seq": first, "next_by_subj": subject, "batch": MOST}
            found, end = await self._conn.direct(body)
            if not found and end.get("Status") == "404":
                return found  # (nothing matched)
            pending = end.get("Nats-Num-Pending")
            return found if pending == "0" and len(found) < MOST else None
        messages: list[Found] = []
        seq = first
        while True:
            message = await self._conn.msg_get({"seq": seq, "next_by_subj": subject})
            if message is None:
                return messages
            if len(messages) == MOST_THROUGH_LEADER:
                return None
            messages.append(message)
            seq = message.seq + 1
