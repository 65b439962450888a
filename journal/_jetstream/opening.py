"""Opening a JetStream store (SPEC 16.1): its stream, checked or created, the identity
record, the recorded retention policy and the cursor key ring."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import msgspec

from cursors import KeyRing, KeyRingError

from ..arguments import check_retention
from ..errors import InvalidArgument, StoreIncompatible, StoreNotFound, StoreUnavailable
from ..models import RetentionPolicy
from .client import ANOTHER_CAME_FIRST, WRITE_TOKEN, ApiError, Connection, Unavailable
from .layout import (
    ENCODER,
    FORMAT,
    META_DECODER,
    READ_FORMATS,
    Meta,
    Subjects,
    stream_config,
    stream_differences,
)
from .reads import StoreReader

if TYPE_CHECKING:
    from .engine import JetStreamOptions

__all__ = [
    "MAX_MSG_BYTES",
    "bootstrap",
    "change_recorded_policy",
    "decode_policy",
    "identity_and_policy",
    "key_ring_of",
    "recorded_policy",
]

# The server's cap on one message (the server's max_payload must allow it too).
MAX_MSG_BYTES: Final = 9 << 20
_POLICY_DECODER: Final = msgspec.msgpack.Decoder(RetentionPolicy)
# Another recording came first (10071), or one is in process at the leader of a
# clustered stream (10164, "wrong last sequence" without a sequence).
_IN_PROCESS: Final = 10164
_CHANGE_S: Final = 30.0
# The header of a policy recording that names the write tokens of the recordings before
# it (newest last, at most `_RECENT_TOKENS`): a rollup keeps only the last message, and a
# call whose reply was lost must still find its token after others recorded on top.
_RECENT_WRITES: Final = "Journal-Recent-Writes"
_RECENT_TOKENS: Final = 32
# JetStream's "replicas > 1 not supported in non-clustered mode".
_REPLICAS_NOT_SUPPORTED: Final = 10074


def _tokens_in(headers: dict[str, str]) -> list[str]:
    """The write tokens a policy recording carries: those before it, then its own."""
    tokens = headers.get(_RECENT_WRITES, "").split()
    own = headers.get(WRITE_TOKEN)
    return [*tokens, own] if own else tokens


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def bootstrap(
    conn: Connection, subjects: Subjects, reader: StoreReader, options: JetStreamOptions
) -> Meta:
    """The store's identity record: the stream (checked, or created) and its `meta`
    message (written by the first writable open)."""
    stream = conn.stream
    try:
        if options.point is not None:
            options.point("open.stream", options.store)
        info = await conn.api(f"$JS.API.STREAM.INFO.{stream}")
        _check_stream(conn, subjects, options, info.get("config") or {})
    except ApiError as e:
        if e.transient:  # (no leader: the open asks again, `JetStreamEngine._identity_and_policy`)
            raise
        raise StoreUnavailable(f"cannot read stream {stream}: {e.description}") from None
    except StoreNotFound:  # (no stream: `Connection.stream_gone`, said for an open here)
        if not options.create or options.readonly:
            # (A read-only open was told to pass create=True, which it had: the default;
            # the local engine's message names a writable open. A trial.)
            how = (
                "a writable Journal.open(url, store=...); a read-only journal does not create one"
                if options.readonly
                else "Journal.open(url, store=..., create=True)"
            )
            raise StoreNotFound(
                f"no journal store {options.store!r} on this NATS cluster (stream "
                f"{stream}): create it with `journal init` or {how}"
            ) from None
        await _create_stream(conn, subjects, options)
    if options.point is not None:
        options.point("open.identity", options.store)
    meta = await conn.msg_get({"last_by_subj": subjects.meta})
    if meta is None:
        if options.readonly:
            raise StoreNotFound(
                f"the journal store {options.store!r} was never initialised: open it writable once"
            )
        # A key of the store's own lives in the stream; a key the deployment passes
        # (key_ring=, JOURNAL_CURSOR_KEY) is never written there.
        given = options.key_ring or KeyRing.from_environment()
        shared = "" if given is not None else KeyRing.generate().shared()
        record = Meta(FORMAT, secrets.token_bytes(16), shared, _now_ms())
        with contextlib.suppress(ApiError):  # another process initialised it first
            await conn.publish(
                subjects.meta,
                ENCODER.encode(record),
                {"Nats-Expected-Last-Subject-Sequence": "0"},
            )
        meta = await conn.msg_get({"last_by_subj": subjects.meta})
        if meta is None:
            raise StoreUnavailable(f"the store {options.store!r} has no identity record")
    try:
        decoded = META_DECODER.decode(meta.data)
    except msgspec.DecodeError:
        raise StoreIncompatible(
            f"stream {stream} holds a subject {subjects.meta} that is not a journal "
            "store's identity: use another store name"
        ) from None
    if decoded.format not in READ_FORMATS:
        raise StoreIncompatible(
            f"the journal store {options.store!r} has format {decoded.format}; this "
            f"version reads formats {', '.join(map(str, READ_FORMATS))}: upgrade "
            "session-journal"
        )
    reader.saw(meta.seq)
    return decoded


async def identity_and_policy(
    conn: Connection, subjects: Subjects, reader: StoreReader, options: JetStreamOptions
) -> tuple[Meta, KeyRing, RetentionPolicy]:
    """`bootstrap`, `key_ring_of`, then `recorded_policy`: what opening a store reads, so
    that one handler says what a failure of the reads means (until 2026-12-05 the
    policy's read was outside it, and a stream electing its leader raised the client's
    own `ApiError` 10008 out of `Journal.open`: found by a chaos trial). The key
    ring comes before the policy, which the open may record: an open refused for its
    key writes nothing."""
    meta = await bootstrap(conn, subjects, reader, options)
    key_ring = key_ring_of(options, meta)
    if options.point is not None:
        options.point("open.policy", options.store)
    return meta, key_ring, await recorded_policy(conn, subjects, options)


def _check_stream(
    conn: Connection, subjects: Subjects, options: JetStreamOptions, config: dict[str, Any]
) -> None:
    """A stream of the journal's name that another tool (or an older set-up) made is
    refused before anything is written to it, naming what differs (SPEC 16.1)."""
    wrong = stream_differences(config, subjects.all)
    if wrong:
        raise StoreIncompatible(
            f"stream {conn.stream} was not made by session-journal for store "
            f"{options.store!r}: {'; '.join(wrong)}. Use another store name, or "
            "delete the stream if it holds nothing you need"
        )
    kept = config.get("num_replicas", 1)
    if options.replicas is not None and kept != options.replicas:
        # (until 2026-12-05 the open went on with the stream's factor without a word: a
        # user who asked for 3 copies of a store made with the default had one)
        raise InvalidArgument(
            f"replicas={options.replicas}, but the store {options.store!r} exists and its "
            f"stream {conn.stream} keeps {kept} replica{'s' if kept != 1 else ''}: replicas "
            "applies when the store is created. Leave replicas out to open it as it is, "
            f"or change the stream's (`nats stream edit {conn.stream} --replicas "
            f"{options.replicas}`: the servers copy it)"
        )


def decode_policy(data: bytes, subjects: Subjects) -> RetentionPolicy:
    """The policy a `j.<store>.policy` message records; `StoreIncompatible` if damaged."""
    try:
        recorded = _POLICY_DECODER.decode(data)
        check_retention(recorded)
    except (msgspec.DecodeError, InvalidArgument) as e:
        raise StoreIncompatible(
            f"the retention policy recorded in {subjects.policy} is damaged "
            f"({e}): open the store writable with retention=RetentionPolicy(...) "
            "to record one"
        ) from None
    return recorded


async def recorded_policy(
    conn: Connection, subjects: Subjects, options: JetStreamOptions
) -> RetentionPolicy:
    """The policy given (recorded for the journals opened without one, by a writer),
    else the store's recorded one, else the default (SPEC 8)."""
    found = await conn.msg_get({"last_by_subj": subjects.policy})
    recorded = None if found is None else decode_policy(found.data, subjects)
    given = options.retention
    if given is not None and given != recorded and not options.readonly:
        headers = {"Nats-Rollup": "sub"}
        if found is not None and (tokens := _tokens_in(found.headers)):
            headers[_RECENT_WRITES] = " ".join(tokens[-_RECENT_TOKENS:])  # (kept: see above)
        await conn.publish(subjects.policy, ENCODER.encode(given), headers)
    return given or recorded or RetentionPolicy()


async def change_recorded_policy(
    conn: Connection,
    subjects: Subjects,
    change: Callable[[RetentionPolicy], RetentionPolicy],
    point: Callable[[str, object], None],
) -> tuple[RetentionPolicy, int]:
    """Record `change(the recorded policy)` (the default where none is): a compare-and-set
    on the policy subject's last sequence, read and changed again when another recording
    came between (or is in process at a clustered stream's leader: asked again shortly
    after, for up to `_CHANGE_S`). A lost reply is settled: the recording carries a write
    token and those of the 32 recordings before it, and the policy recorded then is read
    again (this change's token among them: done; else changed and sent again, and a first
    copy landing later is refused as stale). The policy recorded now and its sequence (0:
    none)."""
    deadline = time.monotonic() + _CHANGE_S
    token = secrets.token_hex(16)
    while True:
        found = await conn.msg_get({"last_by_subj": subjects.policy})
        recorded = RetentionPolicy() if found is None else decode_policy(found.data, subjects)
        seq = 0 if found is None else found.seq
        tokens = [] if found is None else _tokens_in(found.headers)
        if token in tokens:
            # Recorded by this call (its reply was lost), maybe with others on top.
            return recorded, seq
        wanted = change(recorded)
        if wanted == recorded:
            return recorded, seq
        headers = {
            "Nats-Rollup": "sub",
            "Nats-Expected-Last-Subject-Sequence": str(seq),
            WRITE_TOKEN: token,
        }
        if tokens:
            headers[_RECENT_WRITES] = " ".join(tokens[-_RECENT_TOKENS:])
        try:
            seq = await conn.publish(subjects.policy, ENCODER.encode(wanted), headers)
            point("policy.recorded", seq)
            return wanted, seq
        except ApiError as e:
            if e.err_code not in ANOTHER_CAME_FIRST or time.monotonic() > deadline:
                raise
            if e.err_code == _IN_PROCESS:
                await asyncio.sleep(0.005)
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)  # (the reply was lost: read what is recorded now)


async def _create_stream(conn: Connection, subjects: Subjects, options: JetStreamOptions) -> None:
    replicas = options.replicas or 1
    config = stream_config(conn.stream, subjects.all, replicas, MAX_MSG_BYTES)
    try:
        if options.point is not None:
            options.point("open.create_stream", options.store)
        await conn.api(f"$JS.API.STREAM.CREATE.{conn.stream}", config)
    except ApiError as e:
        if e.err_code == 10058:
            # Made by another process meanwhile, with another configuration (the same
            # one is no error): checked as a stream found is (until 2026-12-06 the open
            # went on with it unchecked: another tool's stream of the name, made between
            # the open's look and its create, took the store's identity; a review).
            info = await conn.api(f"$JS.API.STREAM.INFO.{conn.stream}")
            _check_stream(conn, subjects, options, info.get("config") or {})
            return
        if e.err_code == 10065:  # another stream holds j.<store>.>
            raise StoreIncompatible(
                f"cannot create stream {conn.stream}: another stream already takes "
                f"the subjects {subjects.all} ({e.description}): use another store "
                "name, or remove that stream"
            ) from None
        if e.err_code == _REPLICAS_NOT_SUPPORTED:  # (no retry mends it)
            raise InvalidArgument(
                f"cannot create stream {conn.stream} with replicas={replicas}: "
                f"{e.description}; a server that is not in a cluster keeps one copy: "
                "use replicas=1, or a cluster of at least that many servers"
            ) from None
        if e.no_leader:
            # (no meta leader yet, 10008: the open asks again, as for the stream's info;
            # until 2026-12-06 said at once, "cannot create stream ... temporarily
            # unavailable", by an open just after a quorum loss. Not every 503: too few
            # servers for the replicas, 10023, is one, and is said at once, below.)
            raise
        raise StoreUnavailable(
            f"cannot create stream {conn.stream}: {e.description} (is JetStream "
            f"enabled, and are there {replicas} servers for replicas={replicas}?)"
        ) from None


def key_ring_of(options: JetStreamOptions, meta: Meta) -> KeyRing:
    """The cursor key ring: the one given, else the store's own (SPEC 16.5)."""
    given = options.key_ring or KeyRing.from_environment()
    if given is not None:
        return given
    try:
        if not meta.shared_key:
            raise KeyRingError("no key in the store")
        return KeyRing.from_shared(meta.shared_key)
    except KeyRingError:
        raise StoreIncompatible(
            f"the journal store {options.store!r} keeps no usable cursor key: pass "
            "key_ring= (or set JOURNAL_CURSOR_KEY) with the key its replicas share"
        ) from None
