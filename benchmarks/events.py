"""The benchmark's data: deterministic JSON-RPC documents of exactly 580 bytes each.

The text field is drawn from a fixed, seeded vocabulary (invented words plus common words
repeated so that frequencies are skewed as in real text), so every run and every workload
sees the same bytes, and the data compresses like text rather than like zeros or noise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

EVENT_BYTES: Final = 580
SESSION: Final = "bench-session-0001"
EVENT_TYPE: Final = "message"
BASE_TIMESTAMP_MS: Final = 1_700_000_000_000

_SEED: Final = 580
_INVENTED_WORDS: Final = 2000
_COMMON_WORDS: Final = [
    *("the", "a", "to", "of", "and", "in", "is", "it", "that", "for", "with", "on", "this"),
    *("file", "line", "call", "tool", "result", "error", "value", "session", "agent", "user"),
    *("output", "input", "test"),
]
_COMMON_REPEAT: Final = 30
_ROLES: Final = ("user", "assistant", "tool")
_WORDS_PER_DRAW: Final = 96


@dataclass(frozen=True, slots=True)
class Dataset:
    """The events, numbered from 1, and the same events cut into batches."""

    bodies: list[bytes]
    batches: list[tuple[int, list[bytes]]]  # (sequence number of the first event, bodies)

    @property
    def count(self) -> int:
        return len(self.bodies)

    @property
    def payload_bytes(self) -> int:
        return len(self.bodies) * EVENT_BYTES


def _vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    invented = ["".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(_INVENTED_WORDS)]
    return invented + _COMMON_WORDS * _COMMON_REPEAT


def make_events(count: int) -> list[bytes]:
    """`count` JSON documents of exactly `EVENT_BYTES` bytes; event i depends only on i.

    The sequence is drawn from one seeded generator, so a shorter run sees a prefix of the
    events of a longer one.
    """
    rng = random.Random(_SEED)
    words = _vocabulary(rng)
    tail = '"}}'
    events = []
    for seq in range(1, count + 1):
        head = (
            '{"jsonrpc":"2.0","method":"session/update","params":{'
            f'"sessionId":"{SESSION}","seq":{seq},"timestampMs":{BASE_TIMESTAMP_MS + seq},'
            f'"role":"{_ROLES[seq % len(_ROLES)]}","text":"'
        )
        room = EVENT_BYTES - len(head) - len(tail)
        text = ""
        while len(text) < room:
            text += " ".join(rng.choices(words, k=_WORDS_PER_DRAW)) + " "
        # Only ASCII letters and spaces go into the text, so no JSON escaping changes sizes.
        event = (head + text[:room] + tail).encode("ascii")
        if len(event) != EVENT_BYTES:
            raise AssertionError(f"event {seq} is {len(event)} bytes, not {EVENT_BYTES}")
        events.append(event)
    return events


def make_dataset(count: int, batch: int) -> Dataset:
    """The events and their batches (cut once, outside any timed region)."""
    if count < 1 or batch < 1:
        raise ValueError("the event count and the batch size must be at least 1")
    bodies = make_events(count)
    batches = [(start + 1, bodies[start : start + batch]) for start in range(0, count, batch)]
    return Dataset(bodies, batches)
