"""The journal contract in two configurations, each run against every engine in
`engines.ENGINES`."""

from __future__ import annotations

from journal_contract import JournalContract


class TestEmbeddedJournal(JournalContract):
    """Default segment size; durability "os" unless a test asks for "fsync" (speed)."""

    options = {"durability": "os"}  # noqa: RUF012


class TestEmbeddedJournalSmallSegments(JournalContract):
    """16 KiB segments, so most tests cross segment rotation; durability "fsync"."""

    options = {"durability": "fsync", "segment_bytes": 16 << 10}  # noqa: RUF012
