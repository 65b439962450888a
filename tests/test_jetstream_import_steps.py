"""The staging steps of an import under a byte window on JetStream (SPEC 8, 12.3): several
steps share an atomic batch, and each event still records where its own step began, so a
window trims each step as an append of its own."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import ENGINES, JetStreamEngineFactory, engine_params

from journal import EventIn, Journal, RetentionPolicy
from journal._jetstream.imports import STAGE_HEADER
from journal._jetstream.layout import EVENT_DECODER, Subjects

_SESSIONS = 10
_EVENTS = 64  # (single-event appends in the source)
_EVENT_BYTES = 4096
_WINDOW = _EVENTS * _EVENT_BYTES  # 256 KiB: steps of 64 KiB (`MIN_STEP`), 16 events each


@pytest.fixture(params=[p for p in engine_params("import") if p.id.startswith("jetstream")])
def factory(request: pytest.FixtureRequest) -> JetStreamEngineFactory:
    found = ENGINES[request.param]
    assert isinstance(found, JetStreamEngineFactory)
    return found


class _Published:
    """What the clients publish on a store's subjects, seen by a core subscription of a
    client of the test's own (the messages of an atomic batch are published one by one):
    the staging batches (their staged rows' batch ids) and each staged event."""

    def __init__(self, url: str, store: str) -> None:
        self.staging_batches: set[str] = set()
        self.events: dict[str, list[Any]] = {}  # (subject -> StoredEvent, in order)
        self._root = Subjects(store).root
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._nc: Any = self._call(self._connect(url))

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(30)

    async def _connect(self, url: str) -> Any:
        import nats

        nc = await nats.connect(servers=url.removeprefix("nats://").split(","))

        async def seen(msg: Any) -> None:
            headers = msg.headers or {}
            if msg.subject.endswith(".row") and STAGE_HEADER in headers:
                self.staging_batches.add(headers["Nats-Batch-Id"])
            elif msg.subject.endswith(".ev"):
                self.events.setdefault(msg.subject, []).append(EVENT_DECODER.decode(msg.data))

        await nc.subscribe(f"{self._root}.>", cb=seen, pending_msgs_limit=-1)
        await nc.flush()
        return nc

    def close(self) -> None:
        async def drain() -> None:
            await self._nc.flush()
            await self._nc.drain()

        self._call(drain())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[bytes]:
    """`_SESSIONS` sessions of `_EVENTS` single-event appends of `_EVENT_BYTES` each, from
    a local store without a window."""
    with Journal.open(tmp_path / "src") as source:
        for i in range(_SESSIONS):
            source.create_session(f"s{i}")
            for k in range(_EVENTS):
                source.append(f"s{i}", [EventIn("m", bytes([k]) * _EVENT_BYTES)])
        out = io.BytesIO()
        source.export_sessions(None, out)
        yield out.getvalue()


def test_staging_steps_share_batches_and_each_keeps_its_own_trim(
    factory: JetStreamEngineFactory, tmp_path: Path, archive: bytes
) -> None:
    """Sessions of 256 KiB under a 256 KiB window are staged in 4 steps of 64 KiB each
    (`MIN_STEP`): one staging batch a session, its events marked with their own step's first
    ordinal and the data appended before it; one more append then trims the first step
    alone, as an append of its own. Until 2026-12-07 each step was a batch of its own: 5 a
    session (its row, then 4 steps), 50 here; 100 sessions of 1 MiB under a 1 MiB window
    took 1,701 batches, 201 under the default window."""
    target = tmp_path / "dst"
    subjects = Subjects(factory.store_name(target))
    published = _Published(factory.url(), factory.store_name(target))
    try:
        with factory.open(target, retention=RetentionPolicy(max_history_bytes=_WINDOW)) as j:
            j.import_sessions(io.BytesIO(archive))
            j.append("s3", [EventIn("x", b"y")])
            j.apply_retention()
            first = {f"s{i}": j.get_session(f"s{i}").first_ordinal for i in range(_SESSIONS)}
    finally:
        published.close()
    assert len(published.staging_batches) == _SESSIONS
    step = _EVENTS // 4
    for i in range(_SESSIONS):
        events = published.events[subjects.events(Subjects.token(f"s{i}"))][:_EVENTS]
        assert [e.ordinal for e in events] == list(range(1, _EVENTS + 1))
        marks = [(e.batch_first, e.batch_bytes_before) for e in events]
        expected = [(1 + o // step * step, o // step * step * _EVENT_BYTES) for o in range(_EVENTS)]
        assert marks == expected, f"s{i}"
    assert first == {f"s{i}": 1 if i != 3 else 1 + step for i in range(_SESSIONS)}
