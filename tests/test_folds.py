"""Folds (`Journal.fold`): the state equals the reducer applied to every event, from the
start or from a snapshot or checkpoint; `update` is an atomic read-modify-write (4 real
processes incrementing one counter lose nothing); updates of one process's threads are
applied in order; a reopen restores identical state; a changed reducer version refolds
(or says the history it needs is gone). Run against every engine in `engines.ENGINES`."""

from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import msgspec
import pytest
from engines import ENGINES, EngineFactory, engine_params
from hypothesis import given, settings
from hypothesis import strategies as st

from journal import (
    STATE_CHANGED,
    CursorExpired,
    Event,
    EventIn,
    InvalidArgument,
    Journal,
    JournalClosed,
    JsonCodec,
    OrdinalConflict,
    ReadOnlyStore,
    Subscription,
)

HERE = Path(__file__).resolve().parent
WAIT_S = 10.0
MODULUS = 1_000_003


def chain(state: list[int], event: Event) -> list[int]:
    """An order-sensitive reducer: [events seen, a hash chain of their values]."""
    if event.type != "v":
        return state
    return [state[0] + 1, (state[1] * 31 + int(event.data)) % MODULUS]


def model(values: list[int]) -> list[int]:
    state = [0, 0]
    for value in values:
        state = [state[0] + 1, (state[1] * 31 + value) % MODULUS]
    return state


def value_events(values: list[int]) -> list[EventIn]:
    return [EventIn(type="v", data=b"%d" % value) for value in values]


class Counting:
    """A reducer that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, state: list[int], event: Event) -> list[int]:
        self.calls += 1
        return chain(state, event)


# -- the state is the reducer over every event --------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(st.integers(0, 10**6), min_size=1, max_size=4)),
        st.tuples(st.just("update"), st.integers(0, 10**6)),
        st.tuples(st.just("checkpoint"), st.none()),
        st.tuples(st.just("compact"), st.none()),
        st.tuples(st.just("refresh"), st.none()),
        st.tuples(st.just("refold"), st.none()),
        st.tuples(st.just("reopen"), st.none()),
        st.tuples(st.just("other"), st.none()),  # an event the reducer ignores
    ),
    max_size=25,
)


@pytest.mark.parametrize("engine_name", engine_params())
@settings(max_examples=40)
@given(ops=OPS)
def test_fold_state_is_the_reducer_over_every_event(
    engine_name: str, ops: list[tuple[str, Any]]
) -> None:
    engine = ENGINES[engine_name]
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "store"
        j = engine.open(path, durability="os")
        try:
            j.create_session("s")
            values: list[int] = []
            fold = j.fold("s", chain, [0, 0])
            for op, arg in ops:
                if op == "append":
                    j.append("s", value_events(arg))
                    values += arg
                elif op == "update":
                    fold.update(lambda state, v=arg: value_events([v]))
                    values.append(arg)
                    assert fold.state == model(values)
                elif op == "checkpoint":
                    fold.refresh()
                    stored = fold.snapshot()
                    assert stored is None or stored.ordinal == fold.ordinal
                elif op == "compact":
                    fold.refresh()
                    fold.snapshot(compact=True)
                elif op == "refresh":
                    assert fold.refresh() == model(values)
                elif op == "refold":
                    fold = j.fold("s", chain, [0, 0])
                elif op == "reopen":
                    j.close()
                    j = engine.open(path, durability="os")
                    fold = j.fold("s", chain, [0, 0])
                elif op == "other":
                    j.append("s", [EventIn(type="note", data=b"ignored")])
                fresh = j.fold("s", chain, [0, 0])
                assert fresh.state == model(values)
                assert fresh.ordinal == j.get_session("s").last_ordinal
            assert fold.refresh() == model(values)
        finally:
            j.close()


@pytest.mark.parametrize("engine_name", engine_params())
@settings(max_examples=30)
@given(
    partials=st.lists(
        st.dictionaries(
            st.sampled_from(["phase", "owner", "step", "rules"]),
            st.one_of(st.integers(-5, 5), st.text(max_size=3), st.none()),
            max_size=3,
        ),
        max_size=12,
    ),
    snapshot_at=st.integers(0, 12),
)
def test_set_merges_the_changed_keys(
    engine_name: str, partials: list[dict[str, Any]], snapshot_at: int
) -> None:
    with (
        tempfile.TemporaryDirectory() as root,
        ENGINES[engine_name].open(Path(root) / "store", durability="os") as j,
    ):
        j.create_session("s")
        fold = j.fold("s", None, {}, codec=JsonCodec(dict[str, Any]))
        expected: dict[str, Any] = {}
        for index, partial in enumerate(partials):
            changed = {k: v for k, v in partial.items() if expected.get(k, object()) != v}
            before = j.get_session("s").last_ordinal
            fold.set(partial)
            expected.update(partial)
            after = j.get_session("s").last_ordinal
            assert after == before + (1 if changed else 0)
            if changed:
                (event,) = list(j.replay("s"))[-1:]
                assert event.type == STATE_CHANGED
                assert json.loads(event.data) == changed  # only the keys that changed
            assert fold.state == expected
            if index == snapshot_at:
                fold.snapshot()
        assert j.fold("s", None, {}).state == expected


def test_set_needs_a_json_fold_of_a_dict_state(j: Journal) -> None:
    j.create_session("s")

    class Raw:
        def encode(self, state: int) -> bytes:
            return b"%d" % state

        def decode(self, data: bytes) -> int:
            return int(data)

    with pytest.raises(InvalidArgument, match="JSON codec"):
        j.fold("s", lambda s, e: s, 0, codec=Raw()).set({"a": 1})
    with pytest.raises(InvalidArgument, match="dict state"):
        j.fold("s", lambda s, e: s, 0).set({"a": 1})
    with pytest.raises(InvalidArgument, match="JSON-encodable"):
        j.fold("s", None, {}).set({"a": object()})
    assert j.get_session("s").last_ordinal == 0


def test_set_refuses_values_json_would_store_as_something_else(j: Journal) -> None:
    """`set({"x": float("nan")})` appended {"x":null} (msgspec writes NaN and infinities as
    null) and bytes went in as their base64 text: the fold's state then held None or a
    str where the caller set a float or bytes, with no error. Refused now, nothing
    appended; tuples (JSON arrays) and nested JSON values are taken."""
    j.create_session("s")
    fold = j.fold("s", None, {})
    for value in (float("nan"), float("inf"), b"raw", {"n": [1, float("-inf")]}, {1: "a"}):
        with pytest.raises(InvalidArgument, match="JSON"):
            fold.set({"x": value})
    assert j.get_session("s").last_ordinal == 0
    fold.set({"t": (1, 2), "n": {"a": [1.5, None, True]}, "s": "x"})
    assert fold.state == {"t": [1, 2], "n": {"a": [1.5, None, True]}, "s": "x"}
    assert j.fold("s", None, {}).state == fold.state


def test_a_checkpoint_of_a_state_json_cannot_hold_is_refused(j: Journal) -> None:
    """The default codec wrote NaN in a fold's state as null: a fold restored from that
    checkpoint held None where the fold of the events held NaN (found by a new-user
    trial). `snapshot()` now refuses such a state (nothing stored) and a restore folds
    the events, as without a checkpoint."""
    j.create_session("s")
    j.append("s", value_events([1, 2, 3]))

    def count(state: dict[str, Any], event: Event) -> dict[str, Any]:
        return {"n": state["n"] + 1, "r": 0.5}

    fold = j.fold("s", count, {"n": 0, "r": 0.0})
    assert fold.snapshot() is not None  # (0.5: JSON holds it)
    for bad in (float("nan"), float("inf"), b"raw", {1: "a"}):
        j.append("s", value_events([4]))
        odd = j.fold("s", lambda state, event, bad=bad: {**state, "x": bad}, {"n": 0, "r": 0.0})
        assert odd.state["x"] == bad or bad != bad  # (NaN is not equal to itself)
        with pytest.raises(InvalidArgument, match="JSON stores as something else"):
            odd.snapshot()
    restored = j.fold("s", count, {"n": 0, "r": 0.0})
    assert restored.state == {"n": 7, "r": 0.5}  # (from the checkpoint at 3 on)


def test_a_checkpoint_of_a_state_holding_a_tuple_is_refused_unless_its_codec_reads_one(
    j: Journal,
) -> None:
    """The default codec reads a tuple back as a list: until 2026-12-05 a checkpoint of
    {"seen": (1,)} restored as {"seen": [1]}, which is not the fold of the events, and
    the reducer (`state["seen"] + (ordinal,)`) failed after a restart (found by a
    new-user trial). Refused now, as a set is; a codec whose type reads tuples takes it."""
    j.create_session("s")
    j.append("s", value_events([1, 2]))

    def seen(state: dict[str, Any], event: Event) -> dict[str, Any]:
        return {"seen": state["seen"] + (event.ordinal,)}

    fold = j.fold("s", seen, {"seen": ()})
    with pytest.raises(InvalidArgument, match="a tuple comes back a list"):
        fold.snapshot()
    assert j.checkpoint("s") is None
    codec: JsonCodec[dict[str, Any]] = JsonCodec(dict[str, tuple[int, ...]])
    typed = j.fold("s", seen, {"seen": ()}, codec=codec, version="typed")
    assert typed.snapshot() is not None
    j.append("s", value_events([3]))
    restored = j.fold("s", seen, {"seen": ()}, codec=codec, version="typed")
    assert restored.state == {"seen": (1, 2, 3)}


def test_refusing_tuples_left_a_list_subclass_taken_as_a_dict_subclass_is() -> None:
    """The tuple check required the list read back to be of the given list's type too,
    and refused a list subclass (with the tuple's message) that the codec took before,
    as it takes a dict subclass (a review)."""

    class Tasks(list[int]):
        pass

    class Named(dict[str, Any]):
        pass

    codec: JsonCodec[Any] = JsonCodec()
    for state in ({"tasks": Tasks([1])}, Tasks([1]), {"n": Named(a=1)}):
        assert codec.decode(codec.encode(state)) == state


class Tally(msgspec.Struct):
    """A fold state of the kind msgspec users write (a Struct, not a dict)."""

    n: int = 0


def test_a_struct_state_with_the_default_codec_is_told_which_codec_to_pass(j: Journal) -> None:
    """A msgspec Struct (or dataclass) state with the default codec, `JsonCodec()`, which
    reads JSON back as a dict: `snapshot()` said only that the state "holds a value JSON
    stores as something else (NaN or an infinity, bytes, a key that is not a string, or a
    value its type does not take)", none of which the state held (found by a new-user
    trial). It now names the codec that stores it."""
    j.create_session("s")
    j.append("s", value_events([1, 2]))
    fold = j.fold("s", lambda state, event: Tally(state.n + 1), Tally())
    with pytest.raises(InvalidArgument, match=r"back as a dict: pass codec=JsonCodec\(Tally\)"):
        fold.snapshot()
    typed = j.fold("s", lambda state, event: Tally(state.n + 1), Tally(), codec=JsonCodec(Tally))
    assert typed.snapshot() is not None
    assert j.fold("s", None, Tally(), codec=JsonCodec(Tally)).state == Tally(2)


class Floaty(msgspec.Struct):
    x: float = 0.0


@pytest.mark.parametrize(
    "state",
    [OrderedDict(x=float("nan")), Counter(x=float("inf")), Floaty(float("nan"))],
    ids=["OrderedDict-NaN", "Counter-infinity", "Struct-NaN"],
)
def test_the_codec_advice_is_given_only_when_that_codec_stores_the_state(
    j: Journal, state: Any
) -> None:
    """A state JSON reads back as another type was told to pass `JsonCodec(ThatType)`
    whatever it held: a dict subclass (OrderedDict, Counter, defaultdict) or a Struct
    holding NaN or an infinity was sent to a codec that refuses it just the same (found
    by review). The advice is given when that codec stores the state; otherwise the
    message names what JSON cannot hold."""
    j.create_session("s")
    j.append("s", value_events([1]))
    fold = j.fold("s", lambda current, event: current, state)
    with pytest.raises(InvalidArgument, match="JSON has no NaN or infinity") as caught:
        fold.snapshot()
    assert "pass codec=" not in str(caught.value)


def test_a_failing_automatic_checkpoint_is_tried_again_n_events_later(
    j: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    """`snapshot_every=N` whose checkpoint fails (here: a state its codec cannot store)
    tried again at every event after the first failure, each try encoding the whole state
    and logging a warning: 3,001 warnings for 3,000 events a following fold took in (found
    by a new-user trial). After a failure it now waits another N events."""
    j.create_session("s")
    fold = j.fold("s", lambda state, event: Tally(state.n + 1), Tally(), snapshot_every=10)
    with caplog.at_level(logging.WARNING, logger="journal"):
        for _ in range(5):
            fold.update(lambda state: value_events([1] * 10))
        for _ in range(10):
            fold.update(lambda state: value_events([1]))
    assert fold.state == Tally(60)
    failed = [r for r in caplog.records if "checkpoint of" in r.getMessage()]
    assert len(failed) == 6  # at 10, 20, 30, 40, 50 and 60, not at 51..59 too


def test_a_fold_from_a_checkpoint_applies_only_the_events_after_it(j: Journal) -> None:
    j.create_session("s")
    values = list(range(100))
    j.append("s", value_events(values[:90]))
    first = j.fold("s", chain, [0, 0])
    assert first.snapshot() is not None
    j.append("s", value_events(values[90:]))
    counting = Counting()
    restored = j.fold("s", counting, [0, 0])
    assert restored.state == model(values)
    assert counting.calls == 10
    checkpoint = j.checkpoint("s")
    assert checkpoint is not None and checkpoint.ordinal == 90
    assert j.get_session("s").first_ordinal == 1  # nothing was dropped


def test_snapshot_every_writes_checkpoints_by_itself(j: Journal) -> None:
    j.create_session("s")
    fold = j.fold("s", chain, [0, 0], snapshot_every=10)
    for value in range(25):
        fold.update(lambda state, v=value: value_events([v]))
    checkpoint = j.checkpoint("s")
    assert checkpoint is not None and checkpoint.ordinal == 20
    counting = Counting()
    assert j.fold("s", counting, [0, 0]).state == model(list(range(25)))
    assert counting.calls == 5


def test_snapshot_every_checkpoints_a_fold_restored_from_far_behind(j: Journal) -> None:
    j.create_session("s")
    j.append("s", value_events(list(range(30))))
    j.fold("s", chain, [0, 0], snapshot_every=10)
    checkpoint = j.checkpoint("s")
    assert checkpoint is not None and checkpoint.ordinal == 30
    j.append("s", value_events([1]))
    j.fold("s", chain, [0, 0], snapshot_every=10)  # one event behind: no new checkpoint
    checkpoint = j.checkpoint("s")
    assert checkpoint is not None and checkpoint.ordinal == 30


@pytest.mark.parametrize("engine_name", engine_params("import"))
def test_an_imported_session_folds_from_its_checkpoint(engine_name: str, tmp_path: Path) -> None:
    j = ENGINES[engine_name].open(tmp_path / "store", durability="os")
    try:
        _imported_session_folds_from_its_checkpoint(j, tmp_path)
    finally:
        j.close()


def _imported_session_folds_from_its_checkpoint(j: Journal, tmp_path: Path) -> None:
    """Archives carry the checkpoint (version 2, SPEC 12); until 2026-12-04 they did not,
    and the imported session folded from its events (or could not, once trimmed)."""
    j.create_session("s")
    j.append("s", value_events([1, 2, 3]))
    j.fold("s", chain, [0, 0]).snapshot()
    archive = tmp_path / "s.sja"
    j.export_sessions(["s"], archive)
    j.import_sessions(archive, rename={"s": "copy"})
    checkpoint = j.checkpoint("copy")
    assert checkpoint is not None and checkpoint.ordinal == 3
    counting = Counting()
    assert j.fold("copy", counting, [0, 0]).state == model([1, 2, 3])
    assert counting.calls == 0
    j.append("copy", value_events([4]))
    assert j.fold("copy", counting, [0, 0]).state == model([1, 2, 3, 4])
    assert counting.calls == 1


def test_compacting_drops_history_and_the_next_fold_starts_from_the_snapshot(
    j: Journal,
) -> None:
    j.create_session("s")
    j.append("s", value_events(list(range(50))))
    fold = j.fold("s", chain, [0, 0])
    snapshot = fold.snapshot(compact=True)
    assert snapshot is not None and snapshot.ordinal == 50
    assert j.get_session("s").first_ordinal == 51
    j.append("s", value_events([7]))
    counting = Counting()
    assert j.fold("s", counting, [0, 0]).state == model([*range(50), 7])
    assert counting.calls == 1
    # The old fold's cursor points into history that is gone: refresh starts again from
    # the snapshot.
    assert fold.refresh() == model([*range(50), 7])


def test_reopen_restores_identical_state(engine: EngineFactory, store: Path) -> None:
    with engine.open(store, durability="os") as j:
        j.create_session("s")
        fold = j.fold("s", None, {}, snapshot_every=3)
        for step in range(10):
            fold.set({"step": step, f"k{step % 3}": step})
        state, ordinal, cursor = fold.state, fold.ordinal, fold.cursor
    with engine.open(store, durability="os") as j:
        again = j.fold("s", None, {})
        assert (again.state, again.ordinal, again.cursor) == (state, ordinal, cursor)
        checkpoint = j.checkpoint("s")
        assert checkpoint is not None and checkpoint.ordinal == 9
    engine.discard_derived_state(store)
    with engine.open(store, durability="os") as j:
        again = j.fold("s", None, {})
        assert (again.state, again.ordinal, again.cursor) == (state, ordinal, cursor)


def test_a_changed_reducer_version_refolds_from_the_events(j: Journal) -> None:
    j.create_session("s")
    j.append("s", value_events([1, 2, 3, 4]))
    v1 = j.fold("s", lambda s, e: s + int(e.data), 0, version=1)
    assert v1.state == 10
    v1.snapshot()
    counting = Counting()
    v2 = j.fold("s", counting, [0, 0], version="2")
    assert v2.state == model([1, 2, 3, 4]) and counting.calls == 4  # not from v1's state
    v2.snapshot()  # its checkpoint replaces v1's
    again = j.fold("s", lambda s, e: s + int(e.data), 0, version=1)
    assert again.state == 10  # v1 now refolds too (the checkpoint is of version "2")
    # Once the history is compacted away under one version, the other cannot refold.
    v2.snapshot(compact=True)
    with pytest.raises(CursorExpired, match="version '2'") as raised:
        j.fold("s", lambda s, e: s + int(e.data), 0, version=1)
    assert raised.value.earliest_ordinal == 5
    assert j.fold("s", chain, [0, 0], version="2").state == model([1, 2, 3, 4])


def test_a_snapshot_that_is_not_a_folds_cannot_stand_for_lost_history(j: Journal) -> None:
    j.create_session("s")
    j.append("s", value_events([1, 2, 3]))
    j.compact_session("s", 2, b"someone else's bytes")
    with pytest.raises(CursorExpired, match="not a fold's"):
        j.fold("s", chain, [0, 0])


def test_a_fold_that_cannot_be_restored_says_what_would_restore_it(j: Journal) -> None:
    """Its CursorExpired told every caller to "fold with the version that wrote the
    snapshot", also when the snapshot is no fold's (compact_session's own bytes) or there
    is none (history trimmed by a window), where no version can: the advice now fits
    the case, and names the version that would restore a fold's snapshot."""
    j.create_session("opaque")
    j.append("opaque", value_events([1, 2, 3]))
    j.compact_session("opaque", 2, b"someone else's bytes")
    with pytest.raises(CursorExpired) as opaque:
        j.fold("opaque", chain, [0, 0])
    message = str(opaque.value)
    assert "not a fold's" in message and "snapshot()" in message, message
    assert "the version that wrote" not in message, message

    j.create_session("versioned")
    j.append("versioned", value_events([1, 2, 3]))
    j.fold("versioned", chain, [0, 0], version="2").snapshot(compact=True)
    with pytest.raises(CursorExpired) as versioned:
        j.fold("versioned", chain, [0, 0], version=2)
    assert "fold with version='2'" in str(versioned.value), str(versioned.value)

    j.create_session("trimmed", max_history_bytes=1)
    j.append("trimmed", value_events([1]))
    j.append("trimmed", value_events([2]))
    j.apply_retention()
    assert j.get_session("trimmed").first_ordinal == 2
    with pytest.raises(CursorExpired) as trimmed:
        j.fold("trimmed", chain, [0, 0])
    message = str(trimmed.value)
    assert "no snapshot" in message and "version" not in message.split(":", 1)[1], message


def test_update_returns_its_result_and_retries_on_a_conflict(j: Journal) -> None:
    j.create_session("s")
    fold = j.fold("s", chain, [0, 0])
    seen: list[list[int]] = []
    j.append("s", value_events([5]))  # the fold has not seen it: the first try conflicts

    def add(state: list[int]) -> tuple[list[EventIn], str]:
        seen.append(state)
        return value_events([6]), "added"

    assert fold.update(add) == "added"
    assert seen == [[0, 0], model([5])]  # called again on the refreshed state
    assert fold.state == model([5, 6]) and fold.ordinal == 2
    assert fold.update(lambda state: []) is None  # nothing to append: nothing written
    assert fold.update(lambda state: ([], state[0])) == 2
    assert j.get_session("s").last_ordinal == 2


def test_update_gives_up_after_its_tries(j: Journal) -> None:
    j.create_session("s")
    fold = j.fold("s", chain, [0, 0])
    calls = 0

    def always_beaten(state: list[int]) -> list[EventIn]:
        nonlocal calls
        calls += 1
        j.append("s", value_events([0]))  # another writer gets there first, every time
        return value_events([1])

    with pytest.raises(OrdinalConflict, match="3 times"):
        fold.update(always_beaten, tries=3)
    assert calls == 3
    assert [e.data for e in j.replay("s")] == [b"0", b"0", b"0"]


def test_update_refuses_bad_results_and_nested_updates(j: Journal) -> None:
    j.create_session("s")
    fold = j.fold("s", chain, [0, 0])
    with pytest.raises(InvalidArgument, match="must return"):
        fold.update(lambda state: "not events")
    with pytest.raises(InvalidArgument, match="inside an update"):
        fold.update(lambda state: fold.update(lambda inner: []))
    with pytest.raises(InvalidArgument):
        fold.update(lambda state: [], tries=0)
    fold.update(lambda state: value_events([1]))  # the turnstile is free again
    assert fold.state == model([1])
    # One EventIn with a result (the message said a tuple was refused, and allowed).
    assert fold.update(lambda state: (value_events([2])[0], "two")) == "two"
    assert fold.update(lambda state: tuple(value_events([3, 4]))) is None  # two events
    assert fold.state == model([1, 2, 3, 4])
    with pytest.raises(InvalidArgument, match="a pair whose events are a str"):
        fold.update(lambda state: ("nope", 1))


def _until_waiting(thread: threading.Thread) -> None:
    """Until `thread` waits on a `threading.Condition` (an update's turn, behind a held
    one: it has its place in the queue then)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        frame = sys._current_frames().get(thread.ident or 0)  # noqa: SLF001 (its stack)
        while frame is not None:
            if frame.f_code.co_name == "wait" and frame.f_code.co_filename == threading.__file__:
                return
            frame = frame.f_back
        assert time.monotonic() < deadline, "the update never waited for its turn"
        time.sleep(0.001)


def test_updates_of_one_process_are_applied_in_the_order_they_were_called(j: Journal) -> None:
    j.create_session("s")
    fold = j.fold("s", chain, [0, 0])
    holding = threading.Event()
    release = threading.Event()

    def first(state: list[int]) -> list[EventIn]:
        holding.set()
        release.wait(WAIT_S)
        return value_events([0])

    threads = [threading.Thread(target=fold.update, args=(first,))]
    threads[0].start()
    assert holding.wait(WAIT_S)
    for n in range(1, 6):
        thread = threading.Thread(target=fold.update, args=(lambda state, n=n: value_events([n]),))
        thread.start()
        threads.append(thread)
        # (queued behind the previous one before the next is called: a fixed sleep here
        # let a thread that started late under load take its turn after the next one)
        _until_waiting(thread)
    release.set()
    for thread in threads:
        thread.join(WAIT_S)
    assert [int(e.data) for e in j.replay("s")] == [0, 1, 2, 3, 4, 5]


def test_threads_updating_one_fold_lose_nothing(j: Journal) -> None:
    j.create_session("s")
    fold = j.fold("s", lambda s, e: s + 1, 0)
    other = j.fold("s", lambda s, e: s + 1, 0)  # a second fold: real conflicts

    def work(target: Any) -> None:
        for _ in range(50):
            # (Many tries: this checks that nothing is lost, not fairness. With commits
            # as slow as a JetStream node's, the fold that just won wins again and again.)
            target.update(lambda state: [EventIn(type="inc", data=b"%d" % (state + 1))], tries=1000)

    threads = [threading.Thread(target=work, args=(f,)) for f in (fold, other, fold, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)  # (a liveness bound: a JetStream node syncs every append)
        assert not thread.is_alive(), "an update never finished"
    assert fold.refresh() == 200 == other.refresh()
    assert [int(e.data) for e in j.replay("s")] == list(range(1, 201))


def test_follow_keeps_the_fold_current(j: Journal) -> None:
    j.create_session("s")
    with j.fold("s", chain, [0, 0], follow=True) as fold:
        j.append("s", value_events([1, 2]))
        deadline = time.monotonic() + WAIT_S
        while fold.ordinal < 2:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        assert fold.state == model([1, 2])
        fold.update(lambda state: value_events([3]))  # its own events are folded once
        j.append("s", value_events([4]))
        while fold.ordinal < 4:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        time.sleep(0.05)
        assert fold.state == model([1, 2, 3, 4])
    j.append("s", value_events([5]))
    time.sleep(0.05)
    assert fold.ordinal == 4  # closed: no longer following


def test_a_following_fold_dropped_without_close_stops_following(j: Journal) -> None:
    """A `follow=True` fold dropped without close() kept its subscription: the delivery
    thread held it (through its listener) and folded every later event into it for the
    life of the process, so a runtime that folds per request and forgets close() grew
    by a subscription and a state each time (found by a soak). It is closed when dropped
    now, with a ResourceWarning, as a journal or an owner is."""
    j.create_session("s")
    j.append("s", value_events([1]))
    counting = Counting()
    with j.fold("s", counting, [0, 0], follow=True) as kept:  # closed: no warning
        pass
    del kept
    for _ in range(20):
        fold = j.fold("s", counting, [0, 0], follow=True)
        with pytest.warns(ResourceWarning, match="'s' was dropped while following"):
            del fold
            gc.collect()
    calls = counting.calls
    seen: list[int] = []
    sentinel = j.subscribe("s", lambda event: seen.append(event.ordinal))
    j.append("s", value_events(list(range(10))))
    deadline = time.monotonic() + WAIT_S
    while seen[-1:] != [11]:
        assert time.monotonic() < deadline
        time.sleep(0.002)
    sentinel.close()
    time.sleep(0.1)
    assert counting.calls == calls, f"dropped folds applied {counting.calls - calls} events"
    while any(isinstance(o, Subscription) and not o.closed for o in gc.get_objects()):
        assert time.monotonic() < deadline, "the dropped folds' subscriptions stay open"
        time.sleep(0.01)


def _thirty_large_events_compacted(j: Journal) -> None:
    """Events 1-30 of session "s", then another fold's `snapshot(compact=True)` through
    30. (Large events: a page holds two, so a follower held at its first event reads
    pages after the compaction; `int` ignores the padding.)"""
    for value in range(1, 31):
        j.append("s", [EventIn("v", b"%d" % value + b" " * 400_000)])
    with j.fold("s", chain, [0, 0]) as compactor:
        assert compactor.ordinal == 30
        compactor.snapshot(compact=True)


def test_a_following_fold_goes_on_after_the_history_it_needed_was_compacted(
    j: Journal,
) -> None:
    """Another fold compacts the session past where a following fold is (it is slow): the
    follower's next page is gone (CursorExpired). It stopped following, silently but for
    a log line; it starts again from the snapshot and follows on."""
    j.create_session("s")
    gate = threading.Event()
    errors: list[BaseException] = []

    def slow(state: list[int], event: Event) -> list[int]:
        gate.wait(WAIT_S)  # (held at the first event until the compaction is done)
        return chain(state, event)

    with j.fold("s", slow, [0, 0], follow=True, on_error=errors.append) as follower:
        _thirty_large_events_compacted(j)
        gate.set()
        j.append("s", value_events([31]))
        deadline = time.monotonic() + WAIT_S
        while follower.ordinal < 31 and time.monotonic() < deadline:
            time.sleep(0.002)
        assert errors == []
        assert follower.state == model(list(range(1, 32)))
        assert follower.following
    assert not follower.following


def test_a_following_fold_whose_restart_fails_says_so_and_stops_following(
    j: Journal,
) -> None:
    """The restart after a compaction refolds from the snapshot; a reducer that raises
    there ends the following, reported to `on_error` (it was lost: `following` stayed
    True and nothing followed)."""
    j.create_session("s")
    gate = threading.Event()
    errors: list[BaseException] = []
    calls = [0]

    def fragile(state: list[int], event: Event) -> list[int]:
        calls[0] += 1
        gate.wait(WAIT_S)
        if calls[0] > 1 and event.ordinal == 31:
            raise ValueError("the reducer failed")
        return chain(state, event)

    with j.fold("s", fragile, [0, 0], follow=True, on_error=errors.append) as follower:
        _thirty_large_events_compacted(j)
        j.append("s", value_events([31]))  # (folded by the restart: it raises there)
        gate.set()
        deadline = time.monotonic() + WAIT_S
        while not errors and time.monotonic() < deadline:
            time.sleep(0.002)
        assert [type(e) for e in errors] == [ValueError]
        assert not follower.following


def test_a_following_fold_whose_history_is_compacted_between_restore_and_subscribe_goes_on(
    j: Journal,
) -> None:
    """The restart after a compaction refolds from the snapshot, then subscribes from
    where it got; another compaction between the two (here the reducer makes it, as it
    applies the restart's last event) made that subscribe raise `CursorExpired`, and the
    fold stopped following for good (found by a restart trial: 3 processes
    updating and compacting, a slow follower stopped 1 run in 2). It restores again."""
    j.create_session("s")
    gate = threading.Event()
    compacted = threading.Event()
    errors: list[BaseException] = []
    calls = [0]

    def racing(state: list[int], event: Event) -> list[int]:
        calls[0] += 1
        gate.wait(WAIT_S)
        if calls[0] > 1 and event.ordinal == 31:  # (the restart's refold)
            j.append("s", value_events([32]))
            with j.fold("s", chain, [0, 0]) as compactor:
                compactor.snapshot(compact=True)  # through 32
            compacted.set()
        return chain(state, event)

    with j.fold("s", racing, [0, 0], follow=True, on_error=errors.append) as follower:
        _thirty_large_events_compacted(j)
        j.append("s", value_events([31]))
        gate.set()
        assert compacted.wait(WAIT_S)
        j.append("s", value_events([33]))
        deadline = time.monotonic() + WAIT_S
        while follower.ordinal < 33 and not errors and time.monotonic() < deadline:
            time.sleep(0.002)
        assert errors == []
        assert follower.state == model(list(range(1, 34)))
        assert follower.following


def test_a_following_fold_whose_history_is_compacted_as_it_is_made_restores_again(
    j: Journal,
) -> None:
    """`fold(follow=True)` restores, then subscribes from where it got: a compaction in
    between made `fold()` raise `CursorExpired` (a state it could restore). It restores
    again, as often as each restore gets further: here six compactions in a row, each
    made by the reducer as it applies the last event of a restore."""
    j.create_session("s")
    j.append("s", value_events([1, 2, 3]))
    triggered: set[int] = set()

    def racing(state: list[int], event: Event) -> list[int]:
        # (Applying the last event, `o`: append o + 1, compact through it, append o + 2,
        # whose refold after the restore from o + 1 does the same again.)
        if event.ordinal in (3, 5, 7, 9, 11, 13) and event.ordinal not in triggered:
            triggered.add(event.ordinal)
            j.append("s", value_events([event.ordinal + 1]))
            with j.fold("s", chain, [0, 0]) as compactor:
                compactor.snapshot(compact=True)
            j.append("s", value_events([event.ordinal + 2]))
        return chain(state, event)

    with j.fold("s", racing, [0, 0], follow=True) as follower:
        assert triggered == {3, 5, 7, 9, 11, 13}
        assert follower.ordinal == 15
        j.append("s", value_events([16]))
        deadline = time.monotonic() + WAIT_S
        while follower.ordinal < 16 and time.monotonic() < deadline:
            time.sleep(0.002)
        assert follower.state == model(list(range(1, 17)))
        assert follower.following


def test_a_state_too_large_to_store_and_a_checkpoint_that_does_not_decode_say_what_to_do(
    j: Journal,
) -> None:
    """`snapshot()` of a state over 64 MiB said "a snapshot is limited to 67108864 bytes"
    (though it stores a checkpoint), with neither the state's size nor what to do; a
    checkpoint that does not decode was called "the snapshot" (a restart trial)."""
    j.create_session("s")
    j.append("s", value_events([1]))
    big = j.fold("s", None, {"blob": "x" * (64 << 20)})
    with pytest.raises(InvalidArgument, match=r"encodes to \d+ bytes, over .* smaller"):
        big.snapshot()
    with pytest.raises(InvalidArgument, match=r"a checkpoint is limited to .*this one is"):
        j.checkpoint_session("s", 1, b"x" * ((64 << 20) + 1))
    damaged = msgspec.msgpack.encode(["journal.fold/1", 0, b"\xff not JSON"])
    j.checkpoint_session("s", 1, damaged)
    with pytest.raises(InvalidArgument, match="the checkpoint of session 's' through ordinal 1"):
        j.fold("s", chain, [0, 0])


def test_a_read_only_journal_folds_but_does_not_write(engine: EngineFactory, store: Path) -> None:
    with engine.open(store, durability="os") as j:
        j.create_session("s")
        j.append("s", value_events([1, 2]))
    with engine.open(store, readonly=True) as reader:
        fold = reader.fold("s", chain, [0, 0])
        assert fold.state == model([1, 2])
        with pytest.raises(ReadOnlyStore):
            fold.update(lambda state: value_events([3]))
        with pytest.raises(ReadOnlyStore):
            fold.snapshot()
        with pytest.raises(InvalidArgument, match="writable"):
            reader.fold("s", chain, [0, 0], snapshot_every=5)


def test_bad_fold_arguments(j: Journal) -> None:
    j.create_session("s")
    for kwargs in (
        {"version": 1.5},
        {"version": True},
        {"follow": 1},
        {"snapshot_every": 0},
        {"tries": 0},
        {"codec": object()},
    ):
        with pytest.raises(InvalidArgument):
            j.fold("s", chain, [0, 0], **kwargs)
    with pytest.raises(InvalidArgument):
        j.fold("s", "not callable", [0, 0])  # type: ignore[arg-type]


def test_four_processes_incrementing_one_counter_reach_exactly_1000(store: Path) -> None:
    # On the local engine only: the helper processes open a store on disk (on JetStream,
    # test_threads_updating_one_fold_lose_nothing covers the same contention).
    _count_in_processes(store, 4, 250, "1000")


def test_eight_processes_updating_one_counter_with_the_default_tries_never_give_up(
    store: Path,
) -> None:
    # With 16 tries and a 20 ms backoff cap, 1 to 29 of these 240 updates raised
    # OrdinalConflict in a run (found by a new-user trial).
    _count_in_processes(store, 8, 30, "default", "fsync")


def _count_in_processes(
    store: Path, processes: int, each: int, tries: str, durability: str = "os"
) -> None:
    with Journal.open(store, durability="os") as j:
        j.create_session("counter")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "_procs_folds.py"),
                "counter",
                str(store),
                "counter",
                str(each),
                tries,
                durability,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        calls = 0
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0
            calls += int(out.split()[-1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    with Journal.open(store, durability="os") as j:
        fold = j.fold("counter", lambda s, e: s + 1, 0)
        total = processes * each
        assert fold.state == total
        # Every increment saw the one before it: values 1..total, none lost or repeated.
        assert [json.loads(e.data) for e in j.replay("counter")] == list(range(1, total + 1))
    assert calls >= total


def test_a_fold_or_replay_cut_short_by_close_raises_journal_closed(
    engine: EngineFactory, store: Path
) -> None:
    # Closing the journal (from another thread, at shutdown) while a fold restored ended
    # its replay silently: fold() returned the state of part of the session (1,048 of
    # 10,000 events in a trial), as if it were all of it.
    j = engine.open(store, durability="os")
    j.create_session("s")
    j.append("s", [EventIn("v", b"%d" % i + b" " * (600 << 10)) for i in range(1, 7)])

    def closing(state: int, event: Event) -> int:
        if event.ordinal == 1:
            j.close()  # (the first page of a replay holds at most 1 MiB: 1 event here)
        return state + 1

    with pytest.raises(JournalClosed, match="after ordinal"):
        j.fold("s", closing, 0)
    j = engine.open(store, durability="os")
    seen: list[int] = []
    with pytest.raises(JournalClosed, match="after ordinal 2"):
        for event in j.replay("s", max_bytes=1):
            seen.append(event.ordinal)
            if event.ordinal == 2:
                j.close()
    assert seen == [1, 2]
    # A replay that read everything, or one stopped by its own close(), raises nothing.
    with engine.open(store, durability="os") as j:
        stream = j.replay("s", max_bytes=1)
        assert next(stream).ordinal == 1
        stream.close()
        assert len(list(j.replay("s"))) == 6


@pytest.mark.parametrize("compact", [False, True])
def test_a_fold_overtaken_by_a_newer_snapshot_stores_its_own_from_there(
    j: Journal, compact: bool
) -> None:
    # Before: a fold whose session got a newer checkpoint or snapshot from another
    # process (here another fold of the same session) since it last read raised
    # InvalidArgument ("already has a snapshot through ordinal 5; a new one must reach at
    # least that far") from snapshot(), a race no caller can avoid; found by 3 processes
    # counting with update() and snapshot(compact=True), SIGKILLed at random.
    j.create_session("c")
    j.append("c", value_events([1, 2, 3]))
    behind = j.fold("c", chain, [0, 0])
    ahead = j.fold("c", chain, [0, 0])
    ahead.update(lambda state: value_events([4, 5]))
    assert ahead.snapshot(compact=compact) is not None
    assert behind.ordinal == 3
    stored = behind.snapshot(compact=compact)
    assert stored is not None and stored.ordinal == 5
    assert behind.ordinal == 5 and behind.state == model([1, 2, 3, 4, 5])
    assert j.fold("c", chain, [0, 0]).state == model([1, 2, 3, 4, 5])


@pytest.mark.parametrize(
    ("state", "where"),
    [
        ({"tasks": [1, 2, {"seen": {3, 4}}]}, "at ['tasks'][2]['seen']: {3, 4} (set)"),
        ({"a": {"b": float("nan")}}, "at ['a']['b']: nan (float)"),
        ({"a": {7: "x"}}, "at ['a']: the key 7 (int)"),
        ([1, (2, 3)], "at [1]: (2, 3) (tuple)"),
        (float("inf"), "at the top: inf (float)"),
    ],
)
def test_a_state_json_would_change_is_refused_naming_where(state: Any, where: str) -> None:
    """The default codec's refusal said what JSON cannot hold but not where in the state
    it was: a runtime with a large state had to search it (found by a folds
    trial). It names the first such value's path, the value and its type."""
    with pytest.raises(ValueError, match="JSON stores as something else") as raised:
        JsonCodec().encode(state)
    assert where in str(raised.value)


def test_a_state_its_typed_codec_would_not_read_back_is_refused_naming_where() -> None:
    """With a typed codec (`JsonCodec(ThatStruct)`, as the refusal of a Struct advises)
    a NaN comes back a null the type does not take: the refusal named nowhere, where the
    untyped codec's names the path (a review)."""

    class Scores(msgspec.Struct):
        tasks: list[int]
        by_task: dict[str, float]

    state = Scores([1, 2], {"a": 1.0, "b": float("nan")})
    with pytest.raises(ValueError, match="JSON stores as something else") as raised:
        JsonCodec(Scores).encode(state)
    assert "$.by_task[...]" in str(raised.value)
    assert JsonCodec(Scores).decode(JsonCodec(Scores).encode(Scores([1], {"a": 1.0}))) == Scores(
        [1], {"a": 1.0}
    )
