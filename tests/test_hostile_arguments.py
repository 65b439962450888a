"""Hostile arguments (SPEC.md, "Failure handling: hostile arguments"): every public
method of the API, driven with arbitrary values in every argument position, raises only
the documented errors it may raise, never corrupts the store (it still verifies clean)
and never fails another caller (a concurrent writer's appends keep committing).

The methods are enumerated from the classes: a new public method, or a new parameter,
without a strategy here fails `test_every_public_method_and_parameter_is_driven`.
The default run draws a few examples per method; `-m slow` draws many more.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import io
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal import (
    ArchiveInvalid,
    ArchiveLimits,
    CursorExpired,
    CursorForeign,
    CursorFuture,
    CursorMalformed,
    EventIn,
    ExportIncomplete,
    Fold,
    IdempotencyKeyReused,
    IllegalTransition,
    InvalidArgument,
    InvalidPageToken,
    Journal,
    JournalClosed,
    JournalError,
    JsonCodec,
    KeyRingError,
    LifecycleEventType,
    OrdinalConflict,
    Owner,
    OwnerBusy,
    RetentionPolicy,
    SessionExists,
    SessionNotFound,
    SessionNotWritable,
    SessionState,
    StoreIncompatible,
    StoreNotFound,
    StoreUnavailable,
    Stream,
    Subscription,
    Turn,
    TurnSettled,
)

# -- hostile values --------------------------------------------------------------------

_ODD_INTS = [
    -1,
    0,
    1,
    2**31,
    2**32,
    2**53 + 1,
    2**62 - 1,
    2**62,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    2**70,
    -(2**63) - 1,
    10**40,
]
_ODD_TEXT = [
    "",
    " ",
    "a\udc80",  # a lone surrogate: what undecodable command-line bytes become
    "\udc80",
    "\ud800x",
    "\0",
    "a\0b",
    "x" * 257,
    "\xe9" * 129,  # 129 characters, 258 bytes
    "\x7f",
    "\x85",
    "\x9b2J",
    "\x1b[2J",
    "a\nb",
    "\u2028",
    "turn_started",
    "turn_result",
    "open",
]
_CHARACTERS = st.one_of(
    st.characters(),
    st.characters(max_codepoint=0x9F),  # C0, DEL and C1 controls often
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),  # lone surrogates
)
_TEXT = st.one_of(st.sampled_from(_ODD_TEXT), st.text(_CHARACTERS, max_size=12))


class _Liar(str):
    """A str whose methods lie about it: only a copy of its characters may be trusted."""

    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        return b"fine"

    def __len__(self) -> int:
        return 4

    def isascii(self) -> bool:
        return True


class _Bytes(bytes):
    """A bytes subclass (no encoder takes one)."""


class _Int(int):
    """An int subclass."""


class _FsPath(os.PathLike):  # type: ignore[type-arg]
    """A PathLike whose __fspath__ returns whatever it was given."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __fspath__(self) -> Any:
        return self.value

    def __repr__(self) -> str:
        return f"_FsPath({self.value!r})"


_HASHABLE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(_ODD_INTS),
    st.floats(),
    _TEXT,
    st.binary(max_size=8),
    st.builds(_Liar, _TEXT),
)
_LEAVES = st.one_of(
    _HASHABLE,
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e300, 0.5]),
    st.builds(_Int, st.sampled_from(_ODD_INTS)),
    st.builds(_Bytes, st.binary(max_size=8)),
    st.builds(bytearray, st.binary(max_size=4)),
    st.builds(memoryview, st.binary(max_size=4)),
    st.complex_numbers(max_magnitude=10),
    st.decimals(),
    st.fractions(),
    st.builds(object),
    st.sampled_from(list(SessionState) + list(LifecycleEventType)),
    st.builds(threading.Event),
    st.builds(io.BytesIO),
    st.builds(io.StringIO),
    st.builds(_FsPath, st.sampled_from([None, 5, "a\0b", b"bytes"])),
)
_BASIC = st.recursive(
    _LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(_HASHABLE, children, max_size=3),
        st.frozensets(_HASHABLE, max_size=3),
    ),
    max_leaves=6,
)
_EVENT_LIKE = st.builds(
    EventIn,
    st.one_of(_TEXT, _BASIC),
    st.one_of(st.binary(max_size=8), _BASIC),
    st.one_of(st.none(), _TEXT, _BASIC),
)
_POLICY_LIKE = st.builds(
    RetentionPolicy,
    max_history_bytes=_BASIC,
    max_history_age_ms=_BASIC,
    session_retention_ms=_BASIC,
    session_retention_from=st.one_of(_TEXT, _BASIC),
)
HOSTILE = st.one_of(
    _BASIC, _EVENT_LIKE, st.lists(_EVENT_LIKE, min_size=1, max_size=3), _POLICY_LIKE
)


def _confined(value: object) -> object:
    """Hostile file names stay inside the test's working directory (the tests may run
    as root: "/x" must not become a file at the root)."""
    if isinstance(value, str):
        value = str.__str__(value).replace("/", "_")
        return "_.." if value == ".." else value
    return value


# -- the store every method of one test runs against ------------------------------------


class Bystander(threading.Thread):
    """A good writer appending all along: any error it gets is the bug (a hostile call
    that joined its commit batch and failed it)."""

    def __init__(self, journal: Journal) -> None:
        super().__init__(daemon=True)
        self.journal = journal
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.appended = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.journal.append("bystander", [EventIn("message", b"%d" % self.appended)])
            except BaseException as e:
                self.failures.append(e)
                return
            self.appended += 1
            time.sleep(0.002)


@dataclass
class Env:
    tmp: Path
    journal: Journal
    cursor: str
    lifecycle_cursor: str
    page_token: str
    archive: Path
    bystander: Bystander
    counter: list[int] = field(default_factory=lambda: [0])

    def check(self, verify: bool) -> None:
        assert self.bystander.failures == [], "a good append failed beside a hostile call"
        self.journal.append("bystander", [EventIn("message", b"check")])
        if verify:
            assert self.journal.verify().problems == []


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (tmp_path / "stores").mkdir()
    monkeypatch.chdir(cwd)  # where relative hostile names land
    j = Journal.open(tmp_path / "store", durability="os", segment_bytes=1 << 16)
    try:
        j.create_session("open", mode="chat", tags={"k": "v"})
        first = j.append("open", [EventIn("message", b"one", "r1")])
        j.append("open", [EventIn("message", b"%d" % i) for i in range(4)])
        j.create_session("suspended")
        j.suspend_session("suspended")
        j.create_session("ended")
        j.resolve_session("ended")
        j.create_session("owned")
        # its history trimmed as it goes (and dead segments deleted): verify stays quick
        j.create_session("bystander", max_history_bytes=1 << 12)
        lifecycle = next(iter(j.watch_sessions())).cursor
        token = j.list_sessions_page(page_size=1).next_page_token
        archive = tmp_path / "open.jnl"
        j.export_sessions(["open"], archive)
        bystander = Bystander(j)
        bystander.start()
        environment = Env(tmp_path, j, first.cursor, lifecycle, token, archive, bystander)
        yield environment
        bystander.stop.set()
        bystander.join()
        assert bystander.failures == []
        assert bystander.appended > 0
        assert j.verify().problems == []
    finally:
        j.close()


# -- good values, by parameter name -----------------------------------------------------

Strategy = Callable[[Env], st.SearchStrategy[Any]]
_NAME = st.from_regex(r"[a-z]{1,8}", fullmatch=True)
_SESSION_ID = st.one_of(st.sampled_from(["open", "suspended", "ended", "missing"]), _NAME)
_FRESH = "\0fresh"  # replaced by a name no call used before (see `_fresh`)
_ENGINE = "\0engine"  # replaced by a local engine opened for the call
_EVENTS = st.lists(
    st.builds(
        EventIn,
        st.sampled_from(["message", "tool_call"]),
        st.binary(max_size=16),
        st.one_of(st.none(), _NAME),
    ),
    min_size=1,
    max_size=3,
)
_SET_SOON = st.builds(threading.Event)  # set 5 ms after the call (see `_drive`)


def _ignore_progress(done: int, total: int) -> None:
    pass


def _ignore(item: object) -> None:
    pass


def _same(state: object, event: object) -> object:
    return state


_FN = st.sampled_from(
    [
        lambda state: [],
        lambda state: None,
        lambda state: [EventIn("message", b"x")],
        lambda state: ([EventIn("message", b"y")], "result"),
    ]
)


GOOD: dict[str, Strategy] = {
    "session_id": lambda env: _SESSION_ID,
    "mode": lambda env: st.sampled_from(["", "chat", "r\xe9vision"]),
    "context_id": lambda env: st.one_of(st.none(), _NAME),
    "tags": lambda env: st.one_of(st.none(), st.dictionaries(_NAME, _NAME, max_size=2)),
    "extensions": lambda env: st.one_of(
        st.none(), st.dictionaries(_NAME, st.binary(max_size=4), max_size=2)
    ),
    "ttl_ms": lambda env: st.one_of(st.none(), st.integers(1, 10**9)),
    "max_suspend_ms": lambda env: st.integers(0, 10**9),
    "max_history_bytes": lambda env: st.one_of(st.none(), st.integers(1, 1 << 30)),
    "max_history_age_ms": lambda env: st.one_of(st.none(), st.integers(1, 10**12)),
    "events": lambda env: _EVENTS,
    "expected_last_ordinal": lambda env: st.one_of(st.none(), st.integers(0, 10)),
    "idempotency_key": lambda env: st.one_of(st.none(), st.sampled_from(["key-a", "key-b"])),
    "create": lambda env: st.booleans(),
    "now_ms": lambda env: st.one_of(st.none(), st.integers(0, 1 << 42)),
    "through_ordinal": lambda env: st.integers(1, 8),
    "snapshot": lambda env: st.binary(max_size=16),
    "fix": lambda env: st.booleans(),
    "progress": lambda env: st.one_of(st.none(), st.just(_ignore_progress)),
    "dead_share": lambda env: st.floats(0.0, 1.0),
    "session_ids": lambda env: st.one_of(
        st.none(), st.lists(st.sampled_from(["open", "ended"]), unique=True)
    ),
    "dest": lambda env: st.one_of(st.just("export.jnl"), st.builds(io.BytesIO)),
    "src": lambda env: st.one_of(
        st.just(str(env.archive)),
        st.builds(lambda: io.BytesIO(env.archive.read_bytes())),
    ),
    "rename": lambda env: st.one_of(st.none(), st.just({"open": _FRESH})),
    "limits": lambda env: st.one_of(st.none(), st.just(ArchiveLimits())),
    "wait_s": lambda env: st.sampled_from([0, 0.0, 0.01]),
    "page_size": lambda env: st.integers(1, 2000),
    "page_token": lambda env: st.sampled_from([None, "", env.page_token]),
    "state": lambda env: st.one_of(st.none(), st.sampled_from(list(SessionState))),
    "cursor": lambda env: st.sampled_from([None, env.cursor]),
    "max_bytes": lambda env: st.integers(1, 1 << 21),
    "stop": lambda env: st.one_of(st.none(), _SET_SOON),
    "request_id": lambda env: _NAME,
    "max_content_bytes": lambda env: st.integers(1, 1 << 62),
    "max_window_bytes": lambda env: st.integers(1, 1 << 31),
    "max_record_bytes": lambda env: st.integers(1, 1 << 62),
    "max_sessions": lambda env: st.integers(1, 1 << 62),
    "max_metadata_bytes": lambda env: st.integers(1, 1 << 62),
    "checkpoint": lambda env: st.binary(max_size=16),
    "listener": lambda env: st.just(_ignore),
    "on_error": lambda env: st.one_of(st.none(), st.just(_ignore)),
    "apply": lambda env: st.one_of(st.none(), st.just(_same)),
    "initial": lambda env: st.one_of(st.just({}), st.integers(), st.none()),
    "codec": lambda env: st.one_of(st.none(), st.builds(JsonCodec)),
    "version": lambda env: st.one_of(st.integers(0, 3), _NAME),
    "follow": lambda env: st.booleans(),
    "snapshot_every": lambda env: st.one_of(st.none(), st.integers(1, 5)),
    "tries": lambda env: st.integers(1, 20),
    "fn": lambda env: _FN,
    "partial": lambda env: st.dictionaries(_NAME, st.one_of(st.integers(), _NAME), max_size=2),
    "compact": lambda env: st.booleans(),
    "timeout": lambda env: st.one_of(st.none(), st.floats(0, 0.01)),
}


@dataclass(frozen=True)
class Target:
    """One public callable: the documented errors it may raise besides InvalidArgument,
    whether it writes (a call that returned is followed by a verify), and good values
    of its own where the shared ones (`GOOD`) do not fit."""

    allowed: tuple[type[JournalError], ...] = ()
    writes: bool = False
    good: dict[str, Strategy] = field(default_factory=dict)


_CURSOR_ERRORS = (CursorMalformed, CursorForeign, CursorFuture, CursorExpired)
_READ_ERRORS = (SessionNotFound, *_CURSOR_ERRORS)
_TRANSITION = Target((SessionNotFound, IllegalTransition), writes=True)
_STORE_PATHS = st.builds(lambda n: f"../stores/s{n}", st.integers(0, 3))

TARGETS: dict[str, Target] = {
    "Journal.open": Target(
        (StoreNotFound, StoreUnavailable, StoreIncompatible, KeyRingError),
        good={
            "path": lambda env: st.one_of(_STORE_PATHS, _STORE_PATHS.map(Path)),
            "create": lambda env: st.booleans(),
            "readonly": lambda env: st.booleans(),
            "durability": lambda env: st.sampled_from(["fsync", "os"]),
            "segment_bytes": lambda env: st.integers(4096, 1 << 26),
            "retention": lambda env: st.one_of(st.none(), st.just(RetentionPolicy())),
            "compress_sealed": lambda env: st.booleans(),
            "key_ring": lambda env: st.none(),
            "file_ops": lambda env: st.none(),
            # (A mode with readonly=True is refused: good values keep the recorded one.)
            "file_mode": lambda env: st.none(),
            # (A local path: store= and replicas= name stores on NATS, tests/test_jetstream.py.)
            "store": lambda env: st.none(),
            "replicas": lambda env: st.sampled_from([None, 1]),
            # (repair=True with readonly=True is refused: tests/test_os_power_cut_fix.py.)
            "repair": lambda env: st.just(False),
        },
    ),
    "Journal.over": Target(good={"engine": lambda env: st.just(_ENGINE)}),
    "Journal.close": Target(),
    "Journal.create_session": Target(
        (SessionExists,),
        writes=True,
        good={"session_id": lambda env: st.one_of(st.just(_FRESH), _SESSION_ID)},
    ),
    "Journal.append": Target(
        (
            SessionNotFound,
            SessionNotWritable,
            OrdinalConflict,
            IdempotencyKeyReused,
        ),
        writes=True,
    ),
    "Journal.suspend_session": _TRANSITION,
    "Journal.resume_session": _TRANSITION,
    "Journal.resolve_session": _TRANSITION,
    "Journal.cancel_session": _TRANSITION,
    "Journal.expire_due": Target(writes=True),
    "Journal.compact_session": Target((SessionNotFound,), writes=True),
    "Journal.snapshot": Target((SessionNotFound,)),
    "Journal.apply_retention": Target(writes=True),
    "Journal.verify": Target(writes=True),
    "Journal.compact": Target(writes=True),
    "Journal.stats": Target(),
    "Journal.retention_policy": Target(),
    "Journal.change_retention_policy": Target(
        writes=True,
        good={
            "change": lambda env: st.sampled_from(
                [lambda p: p, lambda p: msgspec.structs.replace(p, max_history_age_ms=60_000)]
            )
        },
    ),
    "Journal.export_sessions": Target((SessionNotFound, ExportIncomplete)),
    "Journal.import_sessions": Target((SessionExists, ArchiveInvalid), writes=True),
    "Journal.own": Target((SessionNotFound, SessionNotWritable, OwnerBusy), writes=True),
    "Journal.get_session": Target((SessionNotFound,)),
    "Journal.list_sessions_page": Target((InvalidPageToken,)),
    "Journal.list_sessions": Target((InvalidPageToken,)),
    "Journal.read": Target(_READ_ERRORS),
    "Journal.replay": Target(_READ_ERRORS),
    "Journal.watch": Target(_READ_ERRORS),
    "Journal.awatch": Target(_READ_ERRORS),
    "Journal.watch_sessions": Target(
        _CURSOR_ERRORS, good={"cursor": lambda env: st.sampled_from([None, env.lifecycle_cursor])}
    ),
    "Journal.awatch_sessions": Target(
        _CURSOR_ERRORS, good={"cursor": lambda env: st.sampled_from([None, env.lifecycle_cursor])}
    ),
    "Owner.turn": Target((TurnSettled,), writes=True),  # (a request id drawn again)
    "Owner.release": Target(writes=True),
    "Turn.append": Target(writes=True),
    "Turn.cancel": Target(writes=True),
    "Turn.wait_cancelled": Target(),
    "Stream.close": Target(),
    "Journal.checkpoint_session": Target((SessionNotFound,), writes=True),
    "Journal.checkpoint": Target((SessionNotFound,)),
    "Journal.subscribe": Target(_READ_ERRORS),
    "Journal.subscribe_sessions": Target(
        _CURSOR_ERRORS, good={"cursor": lambda env: st.sampled_from([None, env.lifecycle_cursor])}
    ),
    "Journal.fold": Target((SessionNotFound, CursorExpired)),
    "Fold.refresh": Target(),
    "Fold.update": Target((OrdinalConflict,), writes=True),
    "Fold.set": Target((OrdinalConflict,), writes=True),
    "Fold.snapshot": Target(writes=True),
    "Fold.close": Target(),
    "Subscription.close": Target(),
    "Subscription.wait": Target(),
    "ArchiveLimits": Target(),
}
_CLASSES = {
    "Journal": Journal,
    "Owner": Owner,
    "Turn": Turn,
    "Stream": Stream,
    "Fold": Fold,
    "Subscription": Subscription,
}


def _public_methods(cls: type) -> list[str]:
    return [
        f"{cls.__name__}.{name}"
        for name, value in vars(cls).items()
        if not name.startswith("_")
        and (inspect.isfunction(value) or isinstance(value, (classmethod, staticmethod)))
    ]


def _function(name: str) -> Callable[..., Any]:
    if name == "ArchiveLimits":
        return ArchiveLimits
    class_name, method = name.split(".")
    return getattr(_CLASSES[class_name], method)  # type: ignore[no-any-return]


def _parameters(name: str) -> list[inspect.Parameter]:
    parameters = list(inspect.signature(_function(name)).parameters.values())
    if name != "ArchiveLimits" and not isinstance(
        inspect.getattr_static(_CLASSES[name.split(".")[0]], name.split(".")[1]), classmethod
    ):
        parameters = parameters[1:]  # self
    return parameters


def _good(env: Env, name: str, parameter: inspect.Parameter) -> st.SearchStrategy[Any]:
    good = (TARGETS[name].good.get(parameter.name) or GOOD[parameter.name])(env)
    if parameter.default is inspect.Parameter.empty:
        return good
    return st.one_of(st.just(_OMIT), good)


def _hostile(parameter: inspect.Parameter) -> st.SearchStrategy[Any]:
    if parameter.name in ("path", "dest", "src"):
        return HOSTILE.map(_confined)
    return HOSTILE


def _fresh(kwargs: dict[str, Any], counter: list[int]) -> dict[str, Any]:
    """`kwargs` with every `_FRESH` (also as a dict value) replaced by a new name."""

    def new(value: Any) -> Any:
        if value is _FRESH:
            counter[0] += 1
            return f"fresh-{counter[0]}"
        if type(value) is dict and _FRESH in value.values():
            return {k: new(v) for k, v in value.items()}
        return value

    return {key: new(value) for key, value in kwargs.items()}


_OMIT = object()

# -- calling one -------------------------------------------------------------------------


def _call(env: Env, name: str, kwargs: dict[str, Any]) -> None:
    j = env.journal
    if name == "ArchiveLimits":
        ArchiveLimits(**kwargs)
    elif name == "Journal.open":
        Journal.open(**kwargs).close()
    elif name == "Journal.over":
        if kwargs["engine"] is _ENGINE:
            from journal._local import LocalEngine, LocalOptions

            options = LocalOptions(durability="os")
            kwargs["engine"] = LocalEngine.open(str(env.tmp / "over"), options)
        Journal.over(**kwargs).close()
    elif name == "Journal.close":
        other = Journal.open(env.tmp / "closing", durability="os")
        assert not other.closed
        other.close()
        other.close()
        assert other.closed
        with pytest.raises(JournalClosed):
            other.get_session("open")
        # (`with` of a closed journal entered, and only its first call raised: a
        # new-user trial, until 2026-12-05)
        with pytest.raises(JournalClosed), other:
            pytest.fail("entered a closed journal")
    elif name == "Stream.close":
        stream = j.replay("open")
        next(stream)
        stream.close()
    elif name.startswith("Owner."):
        with j.own("owned") as owner:
            _consume(name, kwargs, getattr(owner, name.split(".")[1])(**kwargs))
    elif name.startswith("Fold."):
        with j.fold("open", None, {}, version="hostile") as fold:
            getattr(fold, name.split(".")[1])(**kwargs)
    elif name.startswith("Subscription."):
        with j.subscribe("open", _ignore) as sub:
            if name == "Subscription.wait":
                sub.close()  # (a subscription to an open session would never end)
            getattr(sub, name.split(".")[1])(**kwargs)
    elif name.startswith("Turn."):
        env.counter[0] += 1  # (a request id runs once)
        with j.own("owned") as owner, owner.turn(f"the-turn-{env.counter[0]}") as turn:
            if name == "Turn.wait_cancelled":
                turn.cancel()  # (else a wait without a timeout would never end)
            getattr(turn, name.split(".")[1])(**kwargs)
    else:
        _consume(name, kwargs, getattr(j, name.split(".")[1])(**kwargs))


def _consume(name: str, kwargs: dict[str, Any], result: Any) -> None:
    """Run what the call returned far enough to reach every check it makes."""
    if isinstance(result, Stream):
        with result:
            if kwargs.get("stop") is not None or name == "Journal.replay":
                for _ in result:  # a watch ends when its stop is set (5 ms after the call)
                    pass
    elif isinstance(result, AsyncIterator):

        async def follow() -> None:
            async for _ in result:
                pass

        async def briefly() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(follow(), 0.01)

        asyncio.run(briefly())
    elif isinstance(result, Iterator):
        list(result)
    elif isinstance(result, Owner):
        result.release()
    elif isinstance(result, Subscription):
        result.close()
        assert result.wait(10)
    elif isinstance(result, Fold):
        result.close()
    elif isinstance(result, Turn):
        with result:
            pass


def _drive(env: Env, name: str, data: st.DataObject) -> None:
    """One example: good values for every parameter, then one call per parameter with a
    hostile value in its position (the others good), then the good call itself."""
    parameters = _parameters(name)
    good: dict[str, Any] = {}
    for parameter in parameters:
        good[parameter.name] = data.draw(_good(env, name, parameter), label=parameter.name)
    calls = []
    for parameter in parameters:
        hostile = data.draw(_hostile(parameter), label=f"hostile {parameter.name}")
        calls.append({**good, parameter.name: hostile})
    calls.append(good)
    for kwargs in calls:
        _attempt(env, name, _fresh(kwargs, env.counter))


def _attempt(env: Env, name: str, given: dict[str, Any]) -> None:
    target = TARGETS[name]
    kwargs = {key: value for key, value in given.items() if value is not _OMIT}
    timers = [
        threading.Timer(0.005, value.set)
        for value in kwargs.values()
        if isinstance(value, threading.Event)
    ]
    for timer in timers:
        timer.start()
    returned = False
    before = set(os.listdir())
    try:
        _call(env, name, kwargs)
        returned = True
    except InvalidArgument:
        if name == "Journal.open":
            assert set(os.listdir()) == before, f"{name}(**{kwargs!r}) was refused late"
    except target.allowed:
        pass
    except JournalError as e:
        raise AssertionError(
            f"{name}(**{kwargs!r}): {type(e).__name__} is not one it documents: {e}"
        ) from e
    except Exception as e:
        raise AssertionError(
            f"{name}(**{kwargs!r}) raised {type(e).__name__}, not a JournalError: {e}"
        ) from e
    finally:
        for timer in timers:
            timer.cancel()
    try:
        env.check(verify=returned and target.writes)
    except AssertionError as e:
        raise AssertionError(f"after {name}(**{kwargs!r}): {e}") from e


# -- the tests ---------------------------------------------------------------------------


def test_every_public_method_and_parameter_is_driven() -> None:
    public = {name for cls in _CLASSES.values() for name in _public_methods(cls)}
    assert public | {"ArchiveLimits"} == set(TARGETS), "add a Target for every public method"
    for name, target in TARGETS.items():
        for parameter in _parameters(name):
            assert parameter.name in target.good or parameter.name in GOOD, (
                f"no good values for {name}({parameter.name}=...): add them to GOOD"
            )


@pytest.mark.parametrize("name", sorted(TARGETS))
@settings(max_examples=12)
@given(data=st.data())
def test_hostile_arguments_raise_only_documented_errors(
    env: Env, name: str, data: st.DataObject
) -> None:
    _drive(env, name, data)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TARGETS))
@settings(max_examples=200)
@given(data=st.data())
def test_hostile_arguments_raise_only_documented_errors_deep(
    env: Env, name: str, data: st.DataObject
) -> None:
    _drive(env, name, data)


# -- regressions: each of these raised something else (or nothing) before ---------------


def _turn_of(j: Journal, request_id: str) -> None:
    with j.own("s") as owner:
        owner.turn(request_id)


def _closed() -> io.BytesIO:
    stream = io.BytesIO()
    stream.close()
    return stream


def _calls(j: Journal, tmp: Path) -> dict[str, Callable[[], object]]:
    """Calls that must raise InvalidArgument, by what they used to do."""
    return {
        # TypeError, AttributeError, ValueError, OSError, UnicodeEncodeError, ZstdError
        "open-pathlike-bytes": lambda: Journal.open(_FsPath(b"store")),
        "open-pathlike-int": lambda: Journal.open(_FsPath(5)),
        "open-surrogate-path": lambda: Journal.open(str(tmp / "a\udc80")),
        "open-empty-path": lambda: Journal.open(""),  # created a store in the cwd, then failed
        # (Made the directories "http:/host/x" and "NATS:/host/x" in the cwd: a JetStream trial.)
        "open-http-url": lambda: Journal.open("http://127.0.0.1:4222/x"),
        "open-upper-case-nats-url": lambda: Journal.open("NATS://127.0.0.1:4222/x"),
        "open-key-ring": lambda: Journal.open(tmp / "k", key_ring=5),  # type: ignore[arg-type]
        "over-not-an-engine": lambda: Journal.over(None),  # type: ignore[arg-type]
        "mode-surrogate": lambda: j.create_session("m", mode="a\udc80"),
        "context-surrogate": lambda: j.create_session("m", context_id="\udc80"),
        "tags-surrogate": lambda: j.create_session("m", tags={"k": "\udc80"}),
        "tags-list": lambda: j.create_session("m", tags=[("k", "v")]),  # type: ignore[arg-type]
        "tags-int": lambda: j.create_session("m", tags=5),  # type: ignore[arg-type]
        "extensions-str": lambda: j.create_session("m", extensions="ab"),  # type: ignore[arg-type]
        "event-type-list": lambda: j.append("s", [EventIn(["t"], b"")]),  # type: ignore[arg-type]
        "event-request-id-surrogate": lambda: j.append("s", [EventIn("t", b"", "r\udc80")]),
        "verify-progress": lambda: j.verify(progress=5),  # type: ignore[arg-type]
        "verify-fix-progress": lambda: j.verify(fix=True, progress=5),  # type: ignore[arg-type]
        "export-progress": lambda: j.export_sessions(None, tmp / "e", progress=5),  # type: ignore[arg-type]
        "export-unhashable-id": lambda: j.export_sessions([["s"]], tmp / "e"),  # type: ignore[list-item]
        "export-bool-ids": lambda: j.export_sessions(True, tmp / "e"),  # type: ignore[arg-type]
        "export-dest-nul": lambda: j.export_sessions(None, str(tmp / "e\0")),
        "export-dest-too-long": lambda: j.export_sessions(None, str(tmp / ("e" * 300))),
        "export-text-stream": lambda: j.export_sessions(None, io.StringIO()),  # type: ignore[arg-type]
        "import-src-nul": lambda: j.import_sessions(str(tmp / "a\0")),
        "import-src-too-long": lambda: j.import_sessions(str(tmp / ("a" * 300))),
        "import-text-stream": lambda: j.import_sessions(io.StringIO("x")),  # type: ignore[arg-type]
        "import-progress": lambda: j.import_sessions(io.BytesIO(), progress=5),  # type: ignore[arg-type]
        # io.UnsupportedOperation (a runtime-author trial), and ValueError for a closed one
        "export-read-only-stream": lambda: j.export_sessions(None, io.BufferedReader(io.BytesIO())),
        "export-closed-stream": lambda: j.export_sessions(None, _closed()),
        "import-write-only-stream": lambda: j.import_sessions(io.BufferedWriter(io.BytesIO())),
        "import-closed-stream": lambda: j.import_sessions(_closed()),
        "limits-window-too-large": lambda: ArchiveLimits(max_window_bytes=1 << 32),
        "limits-content-too-large": lambda: ArchiveLimits(max_content_bytes=2**70),
        "turn-request-id-surrogate": lambda: _turn_of(j, "r\udc80"),
        "watch-stop": lambda: next(iter(j.watch("s", stop=5))),  # type: ignore[arg-type]
        "watch-sessions-stop": lambda: next(iter(j.watch_sessions(stop=[]))),  # type: ignore[arg-type]
        # accepted although wrong (or waiting forever)
        "open-segment-bytes-huge": lambda: Journal.open(tmp / "h", segment_bytes=2**70),
        "open-create-not-bool": lambda: Journal.open(tmp / "c", create="no"),  # type: ignore[arg-type]
        "mode-control": lambda: j.create_session("m", mode="a\nb"),
        "mode-over-256-bytes": lambda: j.create_session("m", mode="\xe9" * 129),
        "name-c1-control": lambda: j.create_session("a\x9bb"),
        "tags-zero": lambda: j.create_session("m", tags=0),  # type: ignore[arg-type]
        "expected-bool": lambda: j.append("s", [EventIn("t", b"")], expected_last_ordinal=True),
        "compact-session-bool": lambda: j.compact_session("s", True, b""),
        "compact-bool": lambda: j.compact(True),
        "expire-negative": lambda: j.expire_due(-1),
        "retention-float": lambda: j.apply_retention(1.5),  # type: ignore[arg-type]
        "own-nan": lambda: j.own("s", math.nan),
        "own-inf": lambda: j.own("s", math.inf),
        "import-limits-zero": lambda: j.import_sessions(io.BytesIO(), limits=0),  # type: ignore[arg-type]
        "list-sessions-lazy": lambda: j.list_sessions(page_size="x"),  # type: ignore[arg-type]
    }


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Journal]:
    with Journal.open(tmp_path_factory.mktemp("shared") / "store", durability="os") as j:
        j.create_session("s")
        j.append("s", [EventIn("t", b"x")])
        yield j
        assert j.verify().problems == []


@pytest.mark.parametrize("label", sorted(_calls(None, Path()).keys()))  # type: ignore[arg-type]
def test_a_hostile_argument_is_refused_with_invalid_argument(
    shared: Journal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, label: str
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    try:
        result = _calls(shared, tmp_path)[label]()
    except InvalidArgument:
        pass
    else:
        if isinstance(result, Journal):
            result.close()
        elif isinstance(result, Owner):
            result.release()
        raise AssertionError(f"accepted: {result!r:.80}")
    assert not (tmp_path / "a\udc80").exists(), "a refused store path creates nothing"
    assert list(cwd.iterdir()) == [], "a refused call creates nothing"
    shared.append("s", [EventIn("t", b"y")])


class _Mode(enum.StrEnum):
    CHAT = "chat"


def test_str_and_bytes_subclasses_no_longer_fail_their_batch_mates(tmp_path: Path) -> None:
    """A `StrEnum` mode, a str-subclass id or type and a bytes-subclass payload passed
    the checks and then failed in the encoder (TypeError) inside the shared commit, and
    so did a request id with a lone surrogate (UnicodeEncodeError): every append batched
    with them failed too. Subclasses are copied to plain values now (and accepted), lone
    surrogates refused before batching."""
    with Journal.open(tmp_path / "s", durability="os") as j:
        for i in range(4):
            j.create_session(f"w{i}")
        stop = threading.Event()
        failures: list[BaseException] = []
        done = [0, 0]

        def append(i: int) -> None:
            n = 0
            while not stop.is_set() or n < 50:
                try:
                    j.append(f"w{i}", [EventIn("message", b"%d" % n)])
                except BaseException as e:  # any failure of a good append is the bug
                    failures.append(e)
                    return
                n += 1

        def odd() -> None:
            n = 0
            while not stop.is_set():
                session_id = _Liar(f"odd-{n}")
                j.create_session(session_id, mode=_Mode.CHAT, tags={_Liar("k"): _Liar("v")})
                j.append(session_id, [EventIn(_Liar("message"), _Bytes(b"x"), _Liar("r"))])
                done[0] += 1
                with contextlib.suppress(InvalidArgument):
                    j.append("w0", [EventIn("message", b"x", "r\udc80")])
                    failures.append(AssertionError("a lone surrogate was accepted"))
                done[1] += 1
                n += 1

        threads = [threading.Thread(target=append, args=(i,)) for i in range(4)]
        threads.append(threading.Thread(target=odd))
        for t in threads:
            t.start()
        time.sleep(0.5)
        # (and the odd ones batched with the others more than 10 times: about 600 in that
        # half second, but a loaded machine may run this thread late; 30 s, for liveness)
        deadline = time.monotonic() + 30
        while done[1] <= 10 and time.monotonic() < deadline and not failures:
            time.sleep(0.01)
        stop.set()
        for t in threads:
            t.join()
        assert failures == []
        assert done[0] > 10 and done[1] > 10
        odd_session = j.get_session("odd-0")
        assert (odd_session.mode, odd_session.tags) == ("chat", {"k": "v"})
        (event,) = j.replay("odd-0")
        assert (type(event.type), type(event.data), event.request_id) == (str, bytes, "r")
        assert j.verify().problems == []
