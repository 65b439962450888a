"""Tests for the `cursors` package: token format, rejection of altered tokens, key rings."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import pickle
import re
import stat
import struct
import threading
import time
from pathlib import Path

import pytest
from _waiting import blocked_on_flock
from hypothesis import assume, given
from hypothesis import strategies as st

import cursors
from cursors import (
    KEY_ENV,
    KEY_FILE_ENV,
    TOKEN_LENGTH,
    Claims,
    CursorExpired,
    CursorForeign,
    CursorFuture,
    CursorMalformed,
    InvalidPageToken,
    JournalError,
    KeyRing,
    KeyRingError,
    TokenCodec,
    TokenError,
    TokenKind,
    scope_digest,
)

RING = KeyRing.generate()
CODEC = TokenCodec(RING)
B64URL_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

kinds = st.sampled_from(list(TokenKind))
scopes = st.binary(min_size=8, max_size=8)
u64s = st.integers(min_value=0, max_value=2**64 - 1)


@st.composite
def issued(draw: st.DrawFn) -> tuple[str, TokenKind, bytes]:
    """A token issued by CODEC, with the kind and scope it was issued for."""
    kind = draw(kinds)
    scope = draw(scopes)
    token = CODEC.encode(kind, scope, draw(u64s), draw(u64s))
    return token, kind, scope


def rejection_types(kind: TokenKind) -> tuple[type[TokenError], ...]:
    return (InvalidPageToken,) if kind is TokenKind.PAGE else (CursorMalformed, CursorForeign)


def assert_rejected(token: object, kind: TokenKind, scope: bytes) -> None:
    with pytest.raises(TokenError) as info:
        CODEC.decode(token, kind, scope)
    assert type(info.value) in rejection_types(kind), info.value


def raw_bytes(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=")


def text_of(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


# -- round trip and format ---------------------------------------------------------------------


@given(kind=kinds, scope=scopes, position=u64s, ordinal=u64s)
def test_encode_decode_round_trips(
    kind: TokenKind, scope: bytes, position: int, ordinal: int
) -> None:
    token = CODEC.encode(kind, scope, position, ordinal)
    assert len(token) == TOKEN_LENGTH == 59
    assert set(token) <= set(B64URL_ALPHABET)
    assert CODEC.decode(token, kind, scope) == Claims(
        kind, RING.active_key_id, scope, position, ordinal
    )


@given(
    kind=kinds,
    scope=scopes,
    position=u64s,
    ordinal=u64s,
    check=st.integers(min_value=0, max_value=2**32 - 1),
    marked=st.booleans(),
)
def test_a_check_round_trips_when_position_and_ordinal_fit_48_bits(
    kind: TokenKind, scope: bytes, position: int, ordinal: int, check: int, marked: bool
) -> None:
    token = CODEC.encode(kind, scope, position, ordinal, check, marked=marked)
    assert len(token) == TOKEN_LENGTH
    fits = position < 2**48 and ordinal < 2**48
    assert CODEC.decode(token, kind, scope) == Claims(
        kind,
        RING.active_key_id,
        scope,
        position,
        ordinal,
        check if fits else None,
        marked and fits,
    )


@pytest.mark.parametrize("check", [-1, 2**32, "1"])
def test_encode_rejects_a_check_out_of_range(check: object) -> None:
    with pytest.raises(ValueError, match="check"):
        CODEC.encode(TokenKind.SESSION, b"\x00" * 8, 1, 1, check)  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [2, 3])
def test_checked_token_bytes_follow_the_documented_layout(version: int) -> None:
    """Version 2 carries a check of part of what the token points at, version 3 a mark
    of all of it (`marked`); the layout is the same."""
    secret = bytes(range(32))
    codec = TokenCodec(KeyRing({7: secret}, 7))
    scope = bytes.fromhex("0102030405060708")
    position, ordinal, check = 2**40 + 3, 2**33 + 99, 0xDEADBEEF
    body = (
        struct.pack(">BBH8s", version, TokenKind.SESSION, 7, scope)
        + position.to_bytes(6, "big")
        + ordinal.to_bytes(6, "big")
        + check.to_bytes(4, "big")
    )
    domain = b"session-journal/token/v1\x00"
    tag = hmac.new(secret, domain + body, hashlib.sha256).digest()[:16]
    expected = text_of(body + tag)
    marked = version == 3
    assert codec.encode(TokenKind.SESSION, scope, position, ordinal, check, marked=marked) == (
        expected
    )
    claims = codec.decode(expected, TokenKind.SESSION, scope)
    assert (claims.position, claims.ordinal, claims.check) == (position, ordinal, check)
    assert claims.marked is marked
    # A changed check is a changed signed message: foreign, never another check.
    altered = bytearray(body + tag)
    altered[27] ^= 1
    with pytest.raises(CursorForeign):
        codec.decode(text_of(bytes(altered)), TokenKind.SESSION, scope)


def test_token_bytes_follow_the_documented_layout() -> None:
    # Pins the wire format independently of the codec, so a change to it cannot go unnoticed.
    secret = bytes(range(32))
    codec = TokenCodec(KeyRing({7: secret}, 7))
    scope = bytes.fromhex("0102030405060708")
    body = struct.pack(">BBH8sQQ", 1, TokenKind.LIFECYCLE, 7, scope, 2**40 + 3, 99)
    domain = b"session-journal/token/v1\x00"
    tag = hmac.new(secret, domain + body, hashlib.sha256).digest()[:16]
    expected = text_of(body + tag)
    assert codec.encode(TokenKind.LIFECYCLE, scope, 2**40 + 3, 99) == expected
    assert codec.decode(expected, TokenKind.LIFECYCLE, scope).position == 2**40 + 3


def test_ordinal_defaults_to_zero() -> None:
    scope = scope_digest(b"store")
    token = CODEC.encode(TokenKind.PAGE, scope, 5)
    assert CODEC.decode(token, TokenKind.PAGE, scope).ordinal == 0


@pytest.mark.parametrize(
    ("scope", "position", "ordinal"),
    [
        (b"\x00" * 7, 0, 0),
        (b"\x00" * 9, 0, 0),
        (b"\x00" * 8, -1, 0),
        (b"\x00" * 8, 2**64, 0),
        (b"\x00" * 8, 0, -1),
        (b"\x00" * 8, 0, 2**64),
    ],
)
def test_encode_rejects_out_of_range_values(scope: bytes, position: int, ordinal: int) -> None:
    with pytest.raises(ValueError):
        CODEC.encode(TokenKind.SESSION, scope, position, ordinal)


def test_encode_and_decode_reject_unknown_kind() -> None:
    with pytest.raises(ValueError):
        CODEC.encode(9, b"\x00" * 8, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        CODEC.decode("A" * TOKEN_LENGTH, 0, b"\x00" * 8)  # type: ignore[arg-type]


# -- every mutation is rejected -----------------------------------------------------------------


@given(issued(), st.integers(min_value=0, max_value=44 * 8 - 1))
def test_single_bit_flip_is_rejected(sample: tuple[str, TokenKind, bytes], bit: int) -> None:
    token, kind, scope = sample
    raw = bytearray(raw_bytes(token))
    raw[bit // 8] ^= 0x80 >> (bit % 8)
    assert_rejected(text_of(bytes(raw)), kind, scope)


@given(issued(), st.integers(min_value=0, max_value=TOKEN_LENGTH - 1), st.characters())
def test_changing_one_character_is_rejected(
    sample: tuple[str, TokenKind, bytes], index: int, replacement: str
) -> None:
    token, kind, scope = sample
    assume(replacement != token[index])
    assert_rejected(token[:index] + replacement + token[index + 1 :], kind, scope)


@given(issued(), st.integers(min_value=0, max_value=TOKEN_LENGTH - 1))
def test_truncation_is_rejected(sample: tuple[str, TokenKind, bytes], length: int) -> None:
    token, kind, scope = sample
    assert_rejected(token[:length], kind, scope)


@given(issued(), st.text(min_size=1, max_size=20))
def test_extension_is_rejected(sample: tuple[str, TokenKind, bytes], suffix: str) -> None:
    token, kind, scope = sample
    assert_rejected(token + suffix, kind, scope)
    assert_rejected(suffix + token, kind, scope)


@given(issued(), st.integers(min_value=1, max_value=3))
def test_non_canonical_spelling_is_malformed(
    sample: tuple[str, TokenKind, bytes], low_bits: int
) -> None:
    token, kind, scope = sample
    last = B64URL_ALPHABET.index(token[-1])
    assert last & 3 == 0
    respelled = token[:-1] + B64URL_ALPHABET[last | low_bits]
    assert raw_bytes(respelled) == raw_bytes(token)
    with pytest.raises(InvalidPageToken if kind is TokenKind.PAGE else CursorMalformed):
        CODEC.decode(respelled, kind, scope)


@given(issued(), kinds)
def test_decoding_as_another_kind_is_malformed(
    sample: tuple[str, TokenKind, bytes], other: TokenKind
) -> None:
    token, kind, scope = sample
    assume(other is not kind)
    with pytest.raises(InvalidPageToken if other is TokenKind.PAGE else CursorMalformed):
        CODEC.decode(token, other, scope)


def test_kind_mismatch_message_names_what_the_token_is() -> None:
    scope = scope_digest(b"store")
    token = CODEC.encode(TokenKind.LIFECYCLE, scope, 1)
    with pytest.raises(CursorMalformed, match="this is a lifecycle cursor, not a session cursor"):
        CODEC.decode(token, TokenKind.SESSION, scope)
    page = CODEC.encode(TokenKind.PAGE, scope, 1)
    with pytest.raises(CursorMalformed, match="this is a page token, not a lifecycle cursor"):
        CODEC.decode(page, TokenKind.LIFECYCLE, scope)


@given(issued(), scopes)
def test_another_scope_is_foreign(sample: tuple[str, TokenKind, bytes], other: bytes) -> None:
    token, kind, scope = sample
    assume(other != scope)
    with pytest.raises(InvalidPageToken if kind is TokenKind.PAGE else CursorForeign):
        CODEC.decode(token, kind, other)


@given(issued())
def test_non_str_input_is_malformed(sample: tuple[str, TokenKind, bytes]) -> None:
    token, kind, scope = sample
    for value in (None, token.encode("ascii"), bytearray(token, "ascii"), 12345, [token]):
        with pytest.raises(InvalidPageToken if kind is TokenKind.PAGE else CursorMalformed):
            CODEC.decode(value, kind, scope)


@pytest.mark.parametrize("kind", list(TokenKind))
def test_tampered_tag_is_foreign(kind: TokenKind) -> None:
    scope = scope_digest(b"store", "session")
    raw = bytearray(raw_bytes(CODEC.encode(kind, scope, 10, 10)))
    raw[-1] ^= 1
    with pytest.raises(InvalidPageToken if kind is TokenKind.PAGE else CursorForeign):
        CODEC.decode(text_of(bytes(raw)), kind, scope)


def test_format_checks_come_before_the_signature_check() -> None:
    # An unknown version from an unknown key is malformed, not foreign: validation order is
    # part of the contract, so callers can tell garbage from tokens of another store.
    scope = b"\x00" * 8
    body = struct.pack(">BBH8sQQ", 4, TokenKind.SESSION, 0x1234, scope, 0, 0)
    with pytest.raises(CursorMalformed, match="format version 4"):
        CODEC.decode(text_of(body + b"\x00" * 16), TokenKind.SESSION, scope)
    body = struct.pack(">BBH8sQQ", 1, 200, 0x1234, scope, 0, 0)
    with pytest.raises(CursorMalformed, match="unknown kind 200"):
        CODEC.decode(text_of(body + b"\x00" * 16), TokenKind.SESSION, scope)


def test_messages_say_what_to_do() -> None:
    scope = scope_digest(b"store")
    for kind in TokenKind:
        for bad in ("", "x" * TOKEN_LENGTH + "x", None):
            with pytest.raises(TokenError) as info:
                CODEC.decode(bad, kind, scope)
            assert "omit it" in info.value.message
        with pytest.raises(TokenError) as info:
            CODEC.decode(CODEC.encode(kind, scope, 1), kind, scope_digest(b"other"))
        assert "belongs to another" in info.value.message


# -- key rings and rotation ---------------------------------------------------------------------


def test_an_unknown_key_id_is_named_with_the_likely_cause() -> None:
    # Operator trial: a process with JOURNAL_CURSOR_KEY set (or one opened before a key
    # rotation) was told the cursor was "signed by a key this store does not have", though
    # the store had it; the message now names both key ids and the process-side causes.
    scope = scope_digest(b"store", "s")
    store_ring = KeyRing.generate()
    external = KeyRing.from_secret(b"k" * 32)
    from_store = TokenCodec(store_ring).encode(TokenKind.SESSION, scope, 5, 5)
    with pytest.raises(CursorForeign) as info:
        TokenCodec(external).decode(from_store, TokenKind.SESSION, scope)
    assert f"key id 1, which this process's cursor keys (id {external.active_key_id})" in (
        info.value.message
    )
    assert "verifies with the external key from JOURNAL_CURSOR_KEY" in info.value.message
    from_external = TokenCodec(external).encode(TokenKind.SESSION, scope, 5, 5)
    with pytest.raises(CursorForeign, match="signed with an external key"):
        TokenCodec(store_ring).decode(from_external, TokenKind.SESSION, scope)
    before_rotation = KeyRing.from_shared(store_ring.shared())
    store_ring.rotate()
    rotated = TokenCodec(store_ring).encode(TokenKind.SESSION, scope, 5, 5)
    with pytest.raises(CursorForeign, match=r"key id 2, .*rotation that this process's keys"):
        TokenCodec(before_rotation).decode(rotated, TokenKind.SESSION, scope)
    page = TokenCodec(store_ring).encode(TokenKind.PAGE, scope, 1)
    with pytest.raises(InvalidPageToken, match="key id 2"):
        TokenCodec(before_rotation).decode(page, TokenKind.PAGE, scope)


def test_a_ring_read_from_a_file_reads_it_again_for_a_key_id_it_lacks(tmp_path: Path) -> None:
    """A process opened before another rotated the store's key file verifies the new key's
    tokens, and signs with the new active key from then on; until 2026-12-03 it refused
    them as foreign until reopened."""
    path = tmp_path / "keys"
    running = TokenCodec(KeyRing.load_or_create(path))
    scope = scope_digest(b"store", "s")
    old = running.encode(TokenKind.SESSION, scope, 5, 5)
    other = KeyRing.load(path)
    new_id = other.rotate()
    other.save(path)
    token = TokenCodec(other).encode(TokenKind.SESSION, scope, 6, 6)
    assert running.decode(token, TokenKind.SESSION, scope).ordinal == 6
    assert running.keyring.active_key_id == new_id
    assert running.decode(old, TokenKind.SESSION, scope).ordinal == 5
    assert (
        running.decode(
            running.encode(TokenKind.SESSION, scope, 7, 7), TokenKind.SESSION, scope
        ).key_id
        == new_id
    )
    # A key id the file does not have either stays foreign (the file is read only when
    # it changed), and so does everything when the file is gone or damaged.
    stranger = TokenCodec(KeyRing.from_secret(b"x" * 32)).encode(TokenKind.SESSION, scope, 1, 1)
    with pytest.raises(CursorForeign):
        running.decode(stranger, TokenKind.SESSION, scope)
    other.retire(1)
    other.rotate()
    path.write_text("damaged")
    third = TokenCodec(other).encode(TokenKind.SESSION, scope, 8, 8)
    with pytest.raises(CursorForeign):
        running.decode(third, TokenKind.SESSION, scope)
    assert running.keyring.key_ids == (1, new_id)


def test_token_from_another_key_ring_is_foreign() -> None:
    scope = scope_digest(b"store", "s")
    other = TokenCodec(KeyRing.generate())
    token = other.encode(TokenKind.SESSION, scope, 1, 1)
    with pytest.raises(CursorForeign):
        CODEC.decode(token, TokenKind.SESSION, scope)
    with pytest.raises(InvalidPageToken):
        CODEC.decode(other.encode(TokenKind.PAGE, scope, 1), TokenKind.PAGE, scope)


def test_rotation_keeps_old_tokens_and_retirement_drops_them() -> None:
    ring = KeyRing.generate()
    codec = TokenCodec(ring)
    scope = scope_digest(b"store", "s", 1)
    old_token = codec.encode(TokenKind.SESSION, scope, 5, 5)
    old_id = ring.active_key_id

    new_id = ring.rotate()
    assert new_id == old_id + 1 == ring.active_key_id
    assert ring.key_ids == (old_id, new_id)
    assert codec.decode(old_token, TokenKind.SESSION, scope).key_id == old_id
    new_token = codec.encode(TokenKind.SESSION, scope, 6, 6)
    assert codec.decode(new_token, TokenKind.SESSION, scope).key_id == new_id

    ring.retire(old_id)
    assert list(ring.key_ids) == [new_id]
    with pytest.raises(CursorForeign, match="retired"):
        codec.decode(old_token, TokenKind.SESSION, scope)
    assert codec.decode(new_token, TokenKind.SESSION, scope).position == 6


def test_retiring_the_active_or_an_unknown_key_fails() -> None:
    ring = KeyRing.generate()
    with pytest.raises(KeyRingError, match="rotate"):
        ring.retire(ring.active_key_id)
    with pytest.raises(KeyRingError):
        ring.retire(999)
    with pytest.raises(KeyRingError):
        ring.secret(999)
    assert ring.key_ids == (1,)


def test_rotation_stays_below_the_external_id_range() -> None:
    ring = KeyRing({0x7FFF: b"k" * 32}, 0x7FFF)
    assert ring.rotate() == 1
    external = KeyRing.from_secret(b"s" * 32)
    assert external.rotate() == 1


def test_constructor_validates_keys() -> None:
    with pytest.raises(KeyRingError):
        KeyRing({1: b"short"}, 1)
    with pytest.raises(KeyRingError):
        KeyRing({0: b"k" * 32}, 0)
    with pytest.raises(KeyRingError):
        KeyRing({1: b"k" * 32}, 2)


def test_secrets_never_appear_in_repr_or_messages() -> None:
    ring = KeyRing.generate()
    secret = ring.secret(1)
    spellings = [secret.hex(), base64.urlsafe_b64encode(secret).decode().rstrip("="), repr(secret)]
    texts = [repr(ring)]
    for key_id in (1, 5):
        with pytest.raises(KeyRingError) as info:
            ring.retire(key_id)
        texts.append(str(info.value))
    assert not any(spelling in text for spelling in spellings for text in texts)


def test_external_keys_agree_across_replicas() -> None:
    secret = b"shared by every replica, 32 byte"
    first, second = KeyRing.from_secret(secret), KeyRing.from_secret(bytes(secret))
    assert first.active_key_id == second.active_key_id >= 0x8000
    assert first.key_ids == second.key_ids
    other = KeyRing.from_secret(b"another shared secret, 32 bytes!")
    assert other.active_key_id != first.active_key_id
    scope = scope_digest(b"store", "s")
    token = TokenCodec(first).encode(TokenKind.SESSION, scope, 3, 4)
    assert TokenCodec(second).decode(token, TokenKind.SESSION, scope).ordinal == 4
    with pytest.raises(CursorForeign):
        TokenCodec(other).decode(token, TokenKind.SESSION, scope)
    with pytest.raises(KeyRingError, match="at least 16 bytes"):
        KeyRing.from_secret(b"x" * 15)


def test_a_short_cursor_key_says_how_its_text_or_bytes_were_read(tmp_path: Path) -> None:
    """A key too short says it was read as hex, else base64url text; a key file that is
    no printable text is used as raw bytes, and says so (it was told "its text read as
    hex, else as base64url" of bytes that are no text)."""
    with pytest.raises(KeyRingError, match=r"is 5 bytes \(its text read as hex"):
        KeyRing.from_environment({"JOURNAL_CURSOR_KEY": "0a0b0c0d0e"})
    raw = tmp_path / "raw.key"
    raw.write_bytes(bytes([0x80, 1, 2, 3, 4, 5, 6, 0xFF]))
    with pytest.raises(KeyRingError, match=r"is 8 bytes") as info:
        KeyRing.from_environment({"JOURNAL_CURSOR_KEY_FILE": str(raw)})
    assert "its text" not in str(info.value) and "raw bytes" in str(info.value), info.value
    text = tmp_path / "text.key"
    text.write_text("0a0b0c0d0e\n")
    with pytest.raises(KeyRingError, match=r"is 5 bytes \(its text read as hex"):
        KeyRing.from_environment({"JOURNAL_CURSOR_KEY_FILE": str(text)})


# -- key ring file ------------------------------------------------------------------------------


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    ring = KeyRing.generate()
    ring.rotate()
    ring.rotate()
    ring.retire(2)
    path = tmp_path / "keys.json"
    ring.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["keys.json"]
    loaded = KeyRing.load(path)
    assert loaded.key_ids == ring.key_ids == (1, 3)
    assert loaded.active_key_id == 3
    assert all(loaded.secret(key_id) == ring.secret(key_id) for key_id in ring.key_ids)
    document = json.loads(path.read_text())
    assert document["format"] == 1
    assert document["active"] == 3
    assert [key["id"] for key in document["keys"]] == [1, 3]
    assert all(isinstance(key["created_at_ms"], int) for key in document["keys"])
    scope = scope_digest(b"store")
    token = TokenCodec(ring).encode(TokenKind.LIFECYCLE, scope, 8)
    assert TokenCodec(loaded).decode(token, TokenKind.LIFECYCLE, scope).position == 8


def test_save_replaces_the_file_and_keeps_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text("old")
    path.chmod(0o644)
    previous_umask = os.umask(0)
    try:
        KeyRing.generate().save(path)
    finally:
        os.umask(previous_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert KeyRing.load(path).key_ids == (1,)


def test_a_group_readable_file_is_still_loaded(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    KeyRing.generate().save(path)
    path.chmod(0o644)
    assert KeyRing.load(path).key_ids == (1,)


def test_load_of_a_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.json"
    with pytest.raises(KeyRingError, match=re.escape(str(path))):
        KeyRing.load(path)


def _valid_document() -> dict[str, object]:
    secret = base64.urlsafe_b64encode(b"k" * 32).decode().rstrip("=")
    return {"format": 1, "active": 1, "keys": [{"id": 1, "secret": secret, "created_at_ms": 0}]}


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[]",
        json.dumps({**_valid_document(), "format": 2}).encode(),
        json.dumps({**_valid_document(), "keys": []}).encode(),
        json.dumps({**_valid_document(), "active": 2}).encode(),
        json.dumps({**_valid_document(), "keys": [{"id": 1, "secret": "a+b/"}]}).encode(),
        json.dumps({**_valid_document(), "keys": [{"id": 1, "secret": "c2hvcnQ"}]}).encode(),
        json.dumps({**_valid_document(), "keys": [{"id": True, "secret": "x"}]}).encode(),
        json.dumps(
            {**_valid_document(), "keys": _valid_document()["keys"] * 2}  # type: ignore[operator]
        ).encode(),
    ],
)
def test_load_rejects_invalid_files_naming_the_path(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad-keys.json"
    path.write_bytes(content)
    with pytest.raises(KeyRingError, match=re.escape(str(path))):
        KeyRing.load(path)
    with pytest.raises(KeyRingError):
        KeyRing.load_or_create(path)
    assert path.read_bytes() == content


def test_load_or_create_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    created = KeyRing.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = KeyRing.load_or_create(path)
    assert again.key_ids == created.key_ids
    assert again.secret(1) == created.secret(1)
    assert os.listdir(tmp_path) == ["keys.json"]


def test_racing_load_or_create_agree_on_one_ring(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    barrier = threading.Barrier(8)
    secrets_seen: list[bytes] = []

    def create() -> None:
        barrier.wait()
        secrets_seen.append(KeyRing.load_or_create(path).secret(1))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(secrets_seen) == 8
    assert set(secrets_seen) == {KeyRing.load(path).secret(1)}
    assert os.listdir(tmp_path) == ["keys.json"]


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs /proc/locks")
def test_two_concurrent_edits_of_a_key_file_keep_both_rotations(tmp_path: Path) -> None:
    """`KeyRing.edit` holds `<file>.lock` from the load to the save: a second rotation
    waits for the first's save and rotates the ring it saved. (From Python there was only
    `load()`, `rotate()`, `save()`, which take no lock: two at once kept one new key.)"""
    path = tmp_path / "keys"
    KeyRing.load_or_create(path, mode=0o640)
    rotated = threading.Event()
    release = threading.Event()
    failures: list[BaseException] = []

    def rotate(pause: bool) -> None:
        try:
            with KeyRing.edit(path) as ring:
                ring.rotate()
                if pause:  # (loaded and rotated; saved when the block ends)
                    rotated.set()
                    release.wait(60)
        except BaseException as e:
            failures.append(e)

    first = threading.Thread(target=rotate, args=(True,))
    second = threading.Thread(target=rotate, args=(False,))
    first.start()
    try:
        assert rotated.wait(30), failures
        second.start()
        # Until the second has either finished or waits for the lock (this process's pid:
        # the first holds the lock, only a waiter is listed with "->").
        deadline = time.monotonic() + 30  # (a guard against a hang, not a measurement)
        while second.is_alive() and not blocked_on_flock(os.getpid()):
            assert time.monotonic() < deadline, "the second rotation neither ended nor waited"
            time.sleep(0.01)
    finally:
        release.set()
        first.join(30)
        if second.ident is not None:
            second.join(30)
    assert not failures, failures
    ring = KeyRing.load(path)
    assert ring.key_ids == (1, 2, 3) and ring.active_key_id == 3
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # (kept)
    assert stat.S_IMODE((tmp_path / "keys.lock").stat().st_mode) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["keys", "keys.lock"]


def test_an_edit_that_fails_or_changes_nothing_leaves_the_key_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    KeyRing.load_or_create(path)
    before = (path.read_bytes(), path.stat().st_ino)
    with pytest.raises(KeyRingError, match="active signing key"), KeyRing.edit(path) as ring:
        ring.rotate()
        ring.retire(2)
    with KeyRing.edit(path) as ring:
        assert ring.key_ids == (1,)
    assert (path.read_bytes(), path.stat().st_ino) == before
    path.chmod(0o400)
    with pytest.raises(KeyRingError, match=r"has mode 0400.*chmod 600"), KeyRing.edit(path):
        pass
    path.unlink()
    with pytest.raises(KeyRingError, match="does not exist"), KeyRing.edit(path):
        pass
    assert not path.exists()


# -- external key from the environment ----------------------------------------------------------

SECRET = bytes(range(100, 132))


def test_from_environment_unset_is_none() -> None:
    assert KeyRing.from_environment({}) is None
    assert KeyRing.from_environment({"UNRELATED": "1"}) is None


@pytest.mark.parametrize(
    "text",
    [
        SECRET.hex(),
        SECRET.hex().upper(),
        base64.urlsafe_b64encode(SECRET).decode().rstrip("="),
        base64.urlsafe_b64encode(SECRET).decode() + "\n",
    ],
)
def test_from_environment_reads_hex_and_base64url(text: str) -> None:
    ring = KeyRing.from_environment({KEY_ENV: text})
    assert ring is not None
    assert ring.secret(ring.active_key_id) == SECRET
    assert ring.active_key_id == KeyRing.from_secret(SECRET).active_key_id


@pytest.mark.parametrize(
    "content",
    [
        SECRET.hex().encode() + b"\n",
        base64.urlsafe_b64encode(SECRET).rstrip(b"="),
        SECRET,
    ],
)
def test_from_environment_reads_a_key_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "cursor.key"
    path.write_bytes(content)
    ring = KeyRing.from_environment({KEY_FILE_ENV: str(path)})
    assert ring is not None
    assert ring.secret(ring.active_key_id) == SECRET


def test_from_environment_rejects_bad_keys(tmp_path: Path) -> None:
    short = b"fifteen bytes!!"
    short_file = tmp_path / "short.key"
    short_file.write_bytes(short.hex().encode())
    cases: list[dict[str, str]] = [
        {KEY_ENV: short.hex()},
        {KEY_ENV: ""},
        {KEY_ENV: "not a key!"},
        {KEY_FILE_ENV: str(short_file)},
        {KEY_FILE_ENV: str(tmp_path / "missing.key")},
        {KEY_ENV: SECRET.hex(), KEY_FILE_ENV: str(short_file)},
    ]
    for environ in cases:
        with pytest.raises(KeyRingError) as info:
            KeyRing.from_environment(environ)
        assert short.hex() not in info.value.message
        assert SECRET.hex() not in info.value.message


def test_from_environment_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    monkeypatch.setenv(KEY_ENV, SECRET.hex())
    ring = KeyRing.from_environment()
    assert ring is not None and ring.secret(ring.active_key_id) == SECRET
    monkeypatch.delenv(KEY_ENV)
    assert KeyRing.from_environment() is None


# -- scope digests ------------------------------------------------------------------------------


def test_scope_digest_separates_fields() -> None:
    assert scope_digest(b"ab", "c") != scope_digest(b"a", "bc")
    assert scope_digest(b"s", "ab", 0, "c") != scope_digest(b"s", "a", 0, "bc")
    assert scope_digest(b"s", "x", 1) != scope_digest(b"s", "x", 2)
    assert scope_digest(b"s", "x", 1) == scope_digest(b"s", "x", 1)
    assert len(scope_digest(b"s")) == 8
    with pytest.raises(ValueError):
        scope_digest(b"s", "x", -1)


@given(
    st.tuples(st.binary(max_size=8), st.text(max_size=8), u64s, st.text(max_size=4)),
    st.tuples(st.binary(max_size=8), st.text(max_size=8), u64s, st.text(max_size=4)),
)
def test_distinct_scopes_have_distinct_digests(
    first: tuple[bytes, str, int, str], second: tuple[bytes, str, int, str]
) -> None:
    assume(first != second)
    assert scope_digest(*first) != scope_digest(*second)


# -- errors and public surface ------------------------------------------------------------------

ERROR_TABLE: list[tuple[type[JournalError], str, str]] = [
    (JournalError, "JOURNAL_ERROR", "INTERNAL"),
    (CursorMalformed, "CURSOR_MALFORMED", "INVALID_ARGUMENT"),
    (CursorForeign, "CURSOR_FOREIGN", "INVALID_ARGUMENT"),
    (CursorFuture, "CURSOR_FUTURE", "OUT_OF_RANGE"),
    (CursorExpired, "CURSOR_EXPIRED", "FAILED_PRECONDITION"),
    (InvalidPageToken, "INVALID_PAGE_TOKEN", "INVALID_ARGUMENT"),
    (KeyRingError, "KEYRING_INVALID", "FAILED_PRECONDITION"),
]


@pytest.mark.parametrize(("cls", "code", "status"), ERROR_TABLE)
def test_error_codes_and_statuses(cls: type[JournalError], code: str, status: str) -> None:
    assert (cls.code, cls.status) == (code, status)
    assert issubclass(cls, JournalError)
    assert issubclass(cls, Exception)
    assert cls.__doc__


def test_token_errors_share_a_base() -> None:
    for cls in (CursorMalformed, CursorForeign, CursorFuture, CursorExpired, InvalidPageToken):
        assert issubclass(cls, TokenError)
    assert not issubclass(KeyRingError, TokenError)
    assert len({code for _, code, _ in ERROR_TABLE}) == len(ERROR_TABLE)


def test_errors_carry_message_and_details_and_pickle() -> None:
    plain = CursorMalformed("pass a cursor returned by this store")
    assert str(plain) == plain.message == "pass a cursor returned by this store"
    future = CursorFuture("wait for the session to catch up", head_ordinal=41)
    expired = CursorExpired("resume from earliest", earliest_ordinal=7, resume_cursor="tok")
    assert future.head_ordinal == 41
    assert (expired.earliest_ordinal, expired.resume_cursor) == (7, "tok")
    assert CursorExpired("m", earliest_ordinal=1).resume_cursor is None
    for error in (plain, future, expired, KeyRingError("k")):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert vars(copy) == vars(error)


def test_public_surface() -> None:
    assert set(cursors.__all__) == {
        "JournalError",
        "TokenError",
        "CursorMalformed",
        "CursorForeign",
        "CursorFuture",
        "CursorExpired",
        "InvalidPageToken",
        "KeyRingError",
        "TokenKind",
        "Claims",
        "TokenCodec",
        "KeyRing",
        "scope_digest",
        "KEY_ENV",
        "KEY_FILE_ENV",
        "TOKEN_LENGTH",
    }
    assert all(hasattr(cursors, name) for name in cursors.__all__)
    assert (KEY_ENV, KEY_FILE_ENV, TOKEN_LENGTH) == (
        "JOURNAL_CURSOR_KEY",
        "JOURNAL_CURSOR_KEY_FILE",
        59,
    )
    assert [kind.value for kind in TokenKind] == [1, 2, 3]


def test_shared_key_text_round_trips_and_is_read_from_the_environment(tmp_path: Path) -> None:
    ring = KeyRing.generate()
    ring.rotate()
    text = ring.shared()
    again = KeyRing.from_shared(text)
    assert again.active_key_id == ring.active_key_id
    assert {k: again.secret(k) for k in again.key_ids} == {k: ring.secret(k) for k in ring.key_ids}
    assert KeyRing.from_environment({"JOURNAL_CURSOR_KEY": text}).shared() == text  # type: ignore[union-attr]
    key_file = tmp_path / "key"
    key_file.write_text(text + "\n")
    from_file = KeyRing.from_environment({"JOURNAL_CURSOR_KEY_FILE": str(key_file)})
    assert from_file is not None and from_file.shared() == text
    first = text.split(",")[0]
    with pytest.raises(KeyRingError):
        KeyRing.from_shared(f"{first},{first}")


def test_a_pasted_token_with_white_space_around_it_is_told_so() -> None:
    scope = scope_digest(b"store", "s")
    token = CODEC.encode(TokenKind.SESSION, scope, 1, 1)
    with pytest.raises(CursorMalformed, match="white space around it"):
        CODEC.decode(f" {token}\n", TokenKind.SESSION, scope)
    with pytest.raises(CursorMalformed, match="is 1 character long"):
        CODEC.decode("x", TokenKind.SESSION, scope)


def test_a_pasted_token_with_its_label_is_told_so() -> None:
    """The CLI's text output labels cursors (`cursor=...`); a token pasted with its label
    is told what to drop (until 2026-12-05: "66 characters long, not 59")."""
    scope = scope_digest(b"store", "s")
    token = CODEC.encode(TokenKind.SESSION, scope, 1, 1)
    with pytest.raises(CursorMalformed, match=r"starts with 'cursor=': pass only the 59"):
        CODEC.decode(f"cursor={token}", TokenKind.SESSION, scope)
    with pytest.raises(CursorMalformed, match=r"starts with 'resume_cursor='"):
        CODEC.decode(f" resume_cursor={token}\n", TokenKind.SESSION, scope)
    with pytest.raises(CursorMalformed, match="is 66 characters long"):
        CODEC.decode(f"cursor_{token}", TokenKind.SESSION, scope)


@pytest.mark.parametrize("quote", ['"', "'"])
def test_a_token_pasted_with_its_quotes_or_option_is_told_so(quote: str) -> None:
    """A token copied with a shell command's or a JSON string's quotes, or with the
    option that took it (`--cursor TOKEN`), was "61 (or 68) characters long, not 59 (it
    was truncated, extended or is not a session cursor)" (new-user trial)."""
    scope = scope_digest(b"store", "s")
    token = CODEC.encode(TokenKind.SESSION, scope, 1, 1)
    with pytest.raises(CursorMalformed, match=r"has quotes around it .*: pass only the 59"):
        CODEC.decode(f"{quote}{token}{quote}", TokenKind.SESSION, scope)
    with pytest.raises(CursorMalformed, match=r"starts with '--cursor ': pass only the 59"):
        CODEC.decode(f"--cursor {token}", TokenKind.SESSION, scope)
    with pytest.raises(CursorMalformed, match="is 69 characters long"):
        CODEC.decode(f"--cursor {token}x", TokenKind.SESSION, scope)


def test_a_very_long_token_is_refused_without_copying_it() -> None:
    """The hints for a pasted token (white space, a label) stripped and split the text:
    a token of 64 MB of "=" or white space was copied twice before it was refused
    (0.19 s, 128 MB; adversarial trial). Text longer than a paste could be is refused
    by its length alone."""
    import tracemalloc

    scope = scope_digest(b"store", "s")
    for text in ("=" * (16 << 20), " " * (16 << 20), "cursor=" + "A" * (16 << 20)):
        tracemalloc.start()
        try:
            with pytest.raises(CursorMalformed, match=f"is {len(text)} characters long"):
                CODEC.decode(text, TokenKind.SESSION, scope)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, peak
