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
from hypothesis import given, settings
from hypothesis import strategies as st

from journal import EventIn, Journal, RetentionPolicy
from journal._jetstream.engine import JetStreamEngine
from journal._jetstream.imports import STAGE_HEADER
from journal._jetstream.layout import EVENT_DECODER, Subjects
from journal.import_windows import MIN_STEP, WINDOW_STEPS

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


def _trims(j: Journal, ids: list[str], mores: list[int]) -> list[list[int]]:
    """Each session's first ordinal after each of `mores` (one more append of that many
    bytes to every session, then a retention pass)."""
    kept = []
    for more in mores:
        for session_id in ids:
            j.append(session_id, [EventIn("m", b"z" * more)])
        j.apply_retention()
        kept.append([j.get_session(session_id).first_ordinal for session_id in ids])
    return kept


# (sessions: their single-event appends' sizes, and where a checkpoint stands as a share
# of them; `share`: the window as a share of the largest session's data)
@settings(max_examples=10)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(1_000, 24_000), min_size=1, max_size=40),
            st.none() | st.floats(0.0, 1.0),
        ),
        min_size=1,
        max_size=3,
    ),
    st.floats(0.1, 0.95),
    st.booleans(),
    st.lists(st.integers(1, 60_000), min_size=1, max_size=4),
)
def test_joined_staging_steps_trim_as_steps_of_their_own(
    factory: JetStreamEngineFactory,
    tmp_path_factory: pytest.TempPathFactory,
    sessions: list[tuple[list[int], float | None]],
    share: float,
    own: bool,
    mores: list[int],
) -> None:
    """Sessions exported from a local store and imported under a byte window on JetStream,
    with steps joined in batches and with a batch a step (as until 2026-12-07), and into a
    local store (a frame a step): the same further appends trim each the same, and the
    first within a step of the source's own trim (`test_import_window_trials.py`)."""
    root = tmp_path_factory.mktemp("steps")
    window = max(500, int(max(sum(sizes) for sizes, _ in sessions) * share))
    policy = RetentionPolicy(max_history_bytes=None if own else window)
    own_window: dict[str, Any] = {"max_history_bytes": window} if own else {}
    ids = [f"s{i}" for i in range(len(sessions))]
    buffer = io.BytesIO()
    with Journal.open(root / "src", retention=policy) as source:
        for session_id, (sizes, checkpoint) in zip(ids, sessions, strict=True):
            source.create_session(session_id, **own_window)
            for i, size in enumerate(sizes):
                source.append(session_id, [EventIn("m", bytes([i % 251]) * size)])
            if checkpoint is not None:
                source.checkpoint_session(session_id, int(checkpoint * len(sizes)) or 1, b"c")
        source.apply_retention()
        source.export_sessions(None, buffer)
        first_kept = [source.get_session(session_id).first_ordinal for session_id in ids]
        wanted = _trims(source, ids, mores)
    archive = buffer.getvalue()
    kept = {}
    with Journal.open(root / "local", retention=policy) as j:
        j.import_sessions(io.BytesIO(archive))
        kept["local"] = _trims(j, ids, mores)
    with factory.open(root / "joined", retention=policy) as j:
        j.import_sessions(io.BytesIO(archive))
        kept["joined"] = _trims(j, ids, mores)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(JetStreamEngine, "joins_staging_steps", False)
        with factory.open(root / "apart", retention=policy) as j:
            j.import_sessions(io.BytesIO(archive))
            kept["apart"] = _trims(j, ids, mores)
    assert kept["joined"] == kept["apart"] == kept["local"], (kept, first_kept)
    step = max(window // WINDOW_STEPS, MIN_STEP)
    for index, (sizes, _) in enumerate(sessions):
        source_first, target_first = wanted[0][index], kept["joined"][0][index]
        low, high = sorted((source_first, target_first))
        between = sizes[low - 1 : high - 1]
        assert sum(between) <= step or len(between) == 1, (index, wanted, kept, step)


def test_a_staging_step_is_not_split_where_an_operation_fills(
    factory: JetStreamEngineFactory, tmp_path: Path
) -> None:
    """A session of 6.4 MB under a 5 MiB window is staged in steps of 320 KiB (3 events)
    over more than one staging operation (at most 4 MiB each): the operation that fills
    ends at the step being built, which begins the next one whole, so each step is the
    one the local engine stages as a frame, and the same appends trim the same events
    (a step cut where the operation filled shifted every later step by one or two
    events: trims at 45, 48, ... where the local engine's were at 43, 46, ...)."""
    window = RetentionPolicy(max_history_bytes=5 << 20)
    archive = io.BytesIO()
    with Journal.open(tmp_path / "src", retention=window) as source:
        source.create_session("s")
        for i in range(64):
            source.append("s", [EventIn("m", bytes([i]) * 100_000)])
        source.export_sessions(None, archive)
    kept = []
    for journal in (
        Journal.open(tmp_path / "local", retention=window),
        factory.open(tmp_path / "dst", retention=window),
    ):
        with journal as j:
            j.import_sessions(io.BytesIO(archive.getvalue()))
            kept.append(_trims(j, ["s"], [300_000] * 16))
    assert kept[0] == kept[1]
