"""The journal contract run against the embedded local store (segment files + LMDB view)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from journal_contract import JournalContract

from journal import Journal


class TestEmbeddedJournal(JournalContract):
    """Default segment size; durability "os" unless a test asks for "fsync" (speed)."""

    def make_journal(self, path: Path, **kw: Any) -> Journal:
        return Journal.open(path, create=True, **{"durability": "os", **kw})


class TestEmbeddedJournalSmallSegments(JournalContract):
    """16 KiB segments, so most tests cross segment rotation; durability "fsync"."""

    def make_journal(self, path: Path, **kw: Any) -> Journal:
        options = {"durability": "fsync", "segment_bytes": 16 << 10, **kw}
        return Journal.open(path, create=True, **options)
