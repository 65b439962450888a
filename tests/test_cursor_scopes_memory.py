"""What a journal keeps of the cursor scopes of sessions long gone (SPEC 13): a bounded
cache of 4,096 (session, incarnation) digests, about 230 bytes each."""

from __future__ import annotations

import gc
import tracemalloc
from types import SimpleNamespace
from typing import cast

from cursors import KeyRing, TokenCodec, scope_digest
from journal.engine import Engine
from journal.session_cursors import SessionCursors

STORE_ID = b"s" * 16
SESSIONS = 20_000


def test_scopes_of_many_sessions_stay_under_a_megabyte_and_stay_right() -> None:
    """Kept 65,536 of them (about 15 MB, 4.6 MB after these 20,000 sessions) until
    2026-12-05: a process churning sessions grew by about 230 bytes a session long
    after the sessions were evicted."""
    engine = cast(Engine, SimpleNamespace(store_id=STORE_ID))
    cursors = SessionCursors(engine, TokenCodec(KeyRing({1: b"k" * 32}, 1)))
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(SESSIONS):
            cursors.scope(f"session-{i:06d}", 1_000_000 + i)
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 1_500_000, f"{held / 1e6:.1f} MB traced for {SESSIONS} sessions' scopes"
    # Forgotten scopes are computed again, the same.
    for i in (0, SESSIONS // 2, SESSIONS - 1):
        sid, incarnation = f"session-{i:06d}", 1_000_000 + i
        assert cursors.scope(sid, incarnation) == scope_digest(STORE_ID, sid, incarnation)
