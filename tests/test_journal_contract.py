"""The journal contract in two configurations, each run against every engine in
`engines.ENGINES`."""

from __future__ import annotations

import pytest
from engines import ENGINES, engine_params
from journal_contract import JournalContract


class TestEmbeddedJournal(JournalContract):
    """Default segment size; durability "os" unless a test asks for "fsync" (speed)."""

    options = {"durability": "os"}  # noqa: RUF012


class TestEmbeddedJournalSmallSegments(JournalContract):
    """16 KiB segments, so most tests cross segment rotation; durability "fsync"."""

    options = {"durability": "fsync", "segment_bytes": 16 << 10}  # noqa: RUF012

    # Only engines with segments: on the others this configuration repeats the first.
    @pytest.fixture(autouse=True, params=engine_params("segments"))
    def _engine(self, request: pytest.FixtureRequest) -> None:
        self.engine = ENGINES[request.param]
