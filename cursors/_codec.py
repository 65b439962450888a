"""The token format: encoding, signing, validating and decoding cursors and page tokens.

A token is 44 bytes, big-endian, sent as 59 characters of unpadded base64url:

    offset  size  field
    0       1     format version (1, 2 or 3)
    1       1     kind (TokenKind)
    2       2     key id of the signing key
    4       8     scope digest (store, session, incarnation, purpose; see scope_digest)
    12      8     version 1: position (u64)     versions 2, 3: position (u48), ordinal (u48),
    20      8     version 1: ordinal (u64)                    check (u32)
    28      16    tag: HMAC-SHA256(key, DOMAIN + bytes[0:28]), first 16 bytes

Version 2 carries a `check`, a number the issuer derives from what the token points at
(the journal: the event's timestamp), so the holder of the token can tell that what it
finds there now is something else; a token with a check is written in version 2 when
its position and ordinal fit 48 bits, else in version 1 without it. Version 3 is laid out
as version 2; its check is a *mark*, derived from the whole of what the token points at
(the journal: a CRC-32 of the event), where version 2's was derived from part of it
(`Claims.marked` tells them apart).

Only the canonical spelling is accepted: the last character carries two unused bits, and a
token whose text differs from the re-encoding of its bytes was altered.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

from ._errors import CursorForeign, CursorMalformed, InvalidPageToken, KeyRingError, TokenError
from ._keyring import _EXTERNAL_ID_BIT, KeyRing

__all__ = ["DOMAIN", "TOKEN_LENGTH", "Claims", "TokenCodec", "TokenKind", "scope_digest"]

FORMAT_VERSION = 1
CHECKED_VERSION = 2
MARKED_VERSION = 3
DOMAIN = b"session-journal/token/v1\x00"
"""Prefix of every signed message, so a tag can never be valid for another use of a key."""

_SCOPE_DOMAIN = b"session-journal/scope/v1\x00"
_HEADER = struct.Struct(">BBH8sQQ")
# Versions 2 and 3: the same prefix, then position and ordinal as u48 (u16 + u32 each),
# check.
_CHECKED = struct.Struct(">BBH8sHIHII")
_U48_MAX = 2**48 - 1
_U32_MAX = 2**32 - 1
_TAG_BYTES = 16
_SCOPE_BYTES = 8
_TOKEN_BYTES = _HEADER.size + _TAG_BYTES
TOKEN_LENGTH = 59
"""Length in characters of every token's text form."""
_PASTED_LENGTH = 4096  # the longest text told apart as a token pasted with more
_U64_MAX = 2**64 - 1
_LENGTH_PREFIX = struct.Struct(">Q")
_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")
_URLSAFE = bytes.maketrans(b"+/", b"-_")

assert _TOKEN_BYTES == 44 and (_TOKEN_BYTES * 8 + 5) // 6 == TOKEN_LENGTH
assert _CHECKED.size == _HEADER.size


class TokenKind(IntEnum):
    """What a token resumes; a token is only accepted where its kind is expected."""

    SESSION = 1
    """A session-watch cursor: a position in one session's event stream."""
    LIFECYCLE = 2
    """A lifecycle-feed cursor: a position in the store's session lifecycle feed."""
    PAGE = 3
    """A listing page token: where the next page of a listing starts."""


_KINDS_BY_BYTE: dict[int, TokenKind] = {kind.value: kind for kind in TokenKind}
_NOUNS = {
    TokenKind.SESSION: "session cursor",
    TokenKind.LIFECYCLE: "lifecycle cursor",
    TokenKind.PAGE: "page token",
}
_REMEDIES = {
    TokenKind.SESSION: (
        "pass a cursor returned by this session's watch, or omit it to start from the beginning"
    ),
    TokenKind.LIFECYCLE: (
        "pass a cursor returned by this store's lifecycle feed, or omit it to start "
        "with a snapshot of every session (one `created` each), then live changes"
    ),
    TokenKind.PAGE: (
        "pass the page token returned with the previous page of the same listing, "
        "or omit it to start from the first page"
    ),
}
_FOREIGN_SCOPES = {
    # (in words: "incarnation" is the store's own term, SPEC 4)
    TokenKind.SESSION: (
        "another store, another session, or an earlier session of the same id (ended, "
        "evicted and created again)"
    ),
    TokenKind.LIFECYCLE: "another store",
    TokenKind.PAGE: (
        "another store or listing (a listing is its state filter: pass the one its first "
        "page was listed with)"
    ),
}


def scope_digest(
    store_id: bytes, session_id: str = "", incarnation: int = 0, purpose: str = ""
) -> bytes:
    """The 8-byte scope a token is bound to: a digest of store, session, incarnation, purpose.

    Fields are length-prefixed, so ("ab", "c") and ("a", "bc") give different scopes. A
    session deleted and re-created under the same id gets a new incarnation, and so a new
    scope that rejects the old session's cursors.
    """
    if not 0 <= incarnation <= _U64_MAX:
        raise ValueError(f"incarnation must be in 0..2**64-1, got {incarnation}")
    digest = hashlib.sha256(_SCOPE_DOMAIN)
    for field in (
        bytes(store_id),
        session_id.encode("utf-8", "surrogatepass"),
        _LENGTH_PREFIX.pack(incarnation),
        purpose.encode("utf-8", "surrogatepass"),
    ):
        digest.update(_LENGTH_PREFIX.pack(len(field)))
        digest.update(field)
    return digest.digest()[:_SCOPE_BYTES]


@dataclass(frozen=True, slots=True)
class Claims:
    """What a verified token says: its kind, signing key, scope, position and ordinal,
    its check (None for a token without one), and whether the check is a mark of the
    whole target (version 3) rather than of part of it (version 2)."""

    kind: TokenKind
    key_id: int
    scope: bytes
    position: int
    ordinal: int
    check: int | None = None
    marked: bool = False


class _MacState(NamedTuple):
    # Keyed HMAC objects already fed DOMAIN; each token copies one instead of re-keying,
    # which roughly halves the cost of signing and verifying.
    generation: int
    active_key_id: int
    active_mac: hmac.HMAC
    macs: dict[int, hmac.HMAC]
    # The active key's HMAC as its two keyed SHA-256 halves (RFC 2104; the inner one fed
    # DOMAIN): signing copies these C objects instead of going through `hmac.HMAC`'s
    # Python methods (copy, update, digest), once per append. Checked against `hmac` when
    # built.
    active_halves: tuple[hashlib._Hash, hashlib._Hash]


_BLOCK_BYTES = 64  # SHA-256's block size
_INNER_PAD = bytes(x ^ 0x36 for x in range(256))
_OUTER_PAD = bytes(x ^ 0x5C for x in range(256))


def _keyed_halves(secret: bytes) -> tuple[hashlib._Hash, hashlib._Hash]:
    """HMAC-SHA256 with `secret` as its inner (fed DOMAIN) and outer keyed hashes."""
    key = hashlib.sha256(secret).digest() if len(secret) > _BLOCK_BYTES else secret
    key = key.ljust(_BLOCK_BYTES, b"\0")
    inner = hashlib.sha256(key.translate(_INNER_PAD))
    inner.update(DOMAIN)
    outer = hashlib.sha256(key.translate(_OUTER_PAD))
    probe = inner.copy()
    probe.update(DOMAIN)
    tag = outer.copy()
    tag.update(probe.digest())
    if not hmac.compare_digest(tag.digest(), hmac.digest(secret, DOMAIN + DOMAIN, "sha256")):
        raise RuntimeError("the keyed SHA-256 halves disagree with hmac: a broken hashlib")
    return inner, outer


class TokenCodec:
    """Encodes and decodes tokens signed with the keys of a `KeyRing`.

    The codec follows the ring: after `rotate()` new tokens are signed by the new key, and
    after `retire()` tokens of the retired key are foreign. Safe to share between threads.
    """

    __slots__ = ("_keyring", "_keys_in_stream", "_state")

    def __init__(self, keyring: KeyRing, *, keys_in_stream: bool = False) -> None:
        """`keys_in_stream`: the store keeps its own keys in its stream (a `nats://`
        store), not in a key file, which a foreign token's message then says (there is
        no key file to rotate, and `journal cursor-key` does not print them)."""
        self._keyring = keyring
        self._keys_in_stream = keys_in_stream
        self._state = self._build_state()

    @property
    def keyring(self) -> KeyRing:
        """The ring whose keys sign and verify tokens."""
        return self._keyring

    def encode(
        self,
        kind: TokenKind,
        scope: bytes,
        position: int,
        ordinal: int = 0,
        check: int | None = None,
        *,
        marked: bool = False,
    ) -> str:
        """A token of `kind` for `scope` carrying `position`, `ordinal` and, when given and
        both fit 48 bits, `check` (a u32; a mark of the whole target when `marked`: version
        3, else version 2), signed by the ring's active key. ValueError if scope is not 8
        bytes or a value is out of range."""
        if kind not in _KINDS_BY_BYTE:
            raise ValueError(f"kind must be a TokenKind, got {kind!r}")
        _check_scope(scope)
        _check_u64("position", position)
        _check_u64("ordinal", ordinal)
        state = self._current_state()
        if check is None or position > _U48_MAX or ordinal > _U48_MAX:
            body = _HEADER.pack(FORMAT_VERSION, kind, state.active_key_id, scope, position, ordinal)
        else:
            if not isinstance(check, int) or not 0 <= check <= _U32_MAX:
                raise ValueError(f"check must be an int in 0..2**32-1, got {check!r}")
            body = _CHECKED.pack(
                MARKED_VERSION if marked else CHECKED_VERSION,
                kind,
                state.active_key_id,
                scope,
                position >> 32,
                position & _U32_MAX,
                ordinal >> 32,
                ordinal & _U32_MAX,
                check,
            )
        inner_key, outer_key = state.active_halves
        inner = inner_key.copy()
        inner.update(body)
        outer = outer_key.copy()
        outer.update(inner.digest())
        # 44 bytes encode to 59 characters and one "=" of padding, which is dropped.
        # (`base64.urlsafe_b64encode`, without its two Python-level calls: one per append.)
        encoded = binascii.b2a_base64(body + outer.digest()[:_TAG_BYTES], newline=False)
        return encoded[:-1].translate(_URLSAFE).decode("ascii")

    def decode(self, token: object, kind: TokenKind, scope: bytes) -> Claims:
        """The claims of `token` if it is an authentic token of `kind` for `scope`.

        Checks, in order: well formed (str, canonical base64url, 44 bytes), known version and
        kind, the expected kind (else CursorMalformed); a known key and a verifying tag, the
        expected scope (else CursorForeign). For kind PAGE every failure is InvalidPageToken.
        Whether the position is still in range is the caller's to check.
        """
        expected = _KINDS_BY_BYTE.get(kind)
        if expected is None:
            raise ValueError(f"kind must be a TokenKind, got {kind!r}")
        _check_scope(scope)
        noun = _NOUNS[expected]
        if not isinstance(token, str):
            raise _malformed(expected, f"the {noun} must be a str, not {type(token).__name__}")
        if len(token) != TOKEN_LENGTH:
            # The hints for a pasted token copy its text: only for what a paste could be
            # (a string of MBs was copied twice, 0.2 s and 128 MB for 64 MB of "=").
            pasted = len(token) <= _PASTED_LENGTH
            stripped = token.strip() if pasted else token
            if not token:
                # (a saved cursor read back before one was saved; None means "no cursor")
                reason = 'is empty: pass None, not "", for no cursor'
            elif len(stripped) == TOKEN_LENGTH and stripped != token:
                reason = "has white space around it (strip it)"
            elif pasted and (
                len(label := stripped.partition("=")[0]) + 1 + TOKEN_LENGTH == len(stripped)
            ):
                # (copied with its label from the CLI's text output, `cursor=...`)
                reason = (
                    f"starts with {label + '='!r}: pass only the {TOKEN_LENGTH} characters after it"
                )
            elif (
                pasted
                and len(stripped) == TOKEN_LENGTH + 2
                and stripped[0] == stripped[-1]
                and stripped[0] in "'\""
            ):
                # (copied with the quotes of a shell command or a JSON string)
                reason = (
                    f"has quotes around it ({stripped[0]}): pass only the {TOKEN_LENGTH} "
                    "characters inside them"
                )
            elif pasted and len(words := stripped.split()) == 2 and len(words[1]) == TOKEN_LENGTH:
                # (copied with the option that took it, `--cursor ...`)
                reason = (
                    f"starts with {words[0] + ' '!r}: pass only the {TOKEN_LENGTH} characters "
                    "after it"
                )
            else:
                characters = "character" if len(token) == 1 else "characters"
                reason = (
                    f"is {len(token)} {characters} long, not {TOKEN_LENGTH} "
                    f"(it was truncated, extended or is not a {noun})"
                )
            raise _malformed(expected, f"the {noun} {reason}")
        if _ALPHABET.fullmatch(token) is None:
            raise _malformed(expected, f"the {noun} has characters outside the base64url alphabet")
        raw = base64.urlsafe_b64decode(token + "=")
        if base64.urlsafe_b64encode(raw)[:-1].decode("ascii") != token:
            raise _malformed(expected, f"the {noun} is not spelled canonically (it was altered)")

        version, kind_byte, key_id, token_scope, position, ordinal = _HEADER.unpack_from(raw)
        check: int | None = None
        if version in (CHECKED_VERSION, MARKED_VERSION):
            _, _, _, _, high, low, ordinal_high, ordinal_low, check = _CHECKED.unpack_from(raw)
            position = high << 32 | low
            ordinal = ordinal_high << 32 | ordinal_low
        elif version != FORMAT_VERSION:
            raise _malformed(
                expected,
                f"the {noun} has format version {version}, which this release does not know "
                f"(it was altered or comes from a newer release)",
            )
        actual = _KINDS_BY_BYTE.get(kind_byte)
        if actual is None:
            raise _malformed(expected, f"the {noun} has unknown kind {kind_byte}")
        if actual is not expected:
            raise _malformed(expected, f"this is a {_NOUNS[actual]}, not a {noun}")

        state = self._current_state()
        mac_template = state.macs.get(key_id)
        if mac_template is None and self._keyring.refresh():
            # Another process rotated the store's key file since this ring was read.
            state = self._current_state()
            mac_template = state.macs.get(key_id)
        if mac_template is None:
            known = tuple(state.macs)
            raise _foreign(expected, _unknown_key(noun, key_id, known, self._keys_in_stream))
        mac = mac_template.copy()
        mac.update(raw[: _HEADER.size])
        if not hmac.compare_digest(mac.digest()[:_TAG_BYTES], raw[_HEADER.size :]):
            raise _foreign(
                expected,
                f"the {noun}'s signature does not verify (it comes from another store "
                f"or was altered)",
            )
        if token_scope != scope:
            raise _foreign(expected, f"the {noun} belongs to {_FOREIGN_SCOPES[expected]}")
        return Claims(
            actual, key_id, token_scope, position, ordinal, check, version == MARKED_VERSION
        )

    def _current_state(self) -> _MacState:
        state = self._state
        if state.generation != self._keyring.generation:
            state = self._build_state()
            # Assigned whole: a racing thread at worst builds the same state twice.
            self._state = state
        return state

    def _build_state(self) -> _MacState:
        ring = self._keyring
        while True:
            # Read the generation first: the state built below is then at least that new,
            # and a change made meanwhile is picked up on the next call.
            generation = ring.generation
            active_key_id = ring.active_key_id
            try:
                macs = {
                    key_id: hmac.new(ring.secret(key_id), DOMAIN, hashlib.sha256)
                    for key_id in ring.key_ids
                }
                active_secret = ring.secret(active_key_id)
                active_mac = macs.get(active_key_id) or hmac.new(
                    active_secret, DOMAIN, hashlib.sha256
                )
            except KeyRingError:
                # Another thread rotated and retired between our reads; read again.
                continue
            return _MacState(
                generation, active_key_id, active_mac, macs, _keyed_halves(active_secret)
            )


def _check_scope(scope: bytes) -> None:
    if not isinstance(scope, bytes) or len(scope) != _SCOPE_BYTES:
        raise ValueError(f"scope must be {_SCOPE_BYTES} bytes from scope_digest(), got {scope!r}")


def _check_u64(name: str, value: int) -> None:
    if not isinstance(value, int) or not 0 <= value <= _U64_MAX:
        raise ValueError(f"{name} must be an int in 0..2**64-1, got {value!r}")


def _malformed(kind: TokenKind, reason: str) -> TokenError:
    message = f"{reason}; {_REMEDIES[kind]}"
    return InvalidPageToken(message) if kind is TokenKind.PAGE else CursorMalformed(message)


def _foreign(kind: TokenKind, reason: str) -> TokenError:
    message = f"{reason}; {_REMEDIES[kind]}"
    return InvalidPageToken(message) if kind is TokenKind.PAGE else CursorForeign(message)


def _unknown_key(noun: str, key_id: int, known: tuple[int, ...], in_stream: bool) -> str:
    """Why a token signed by a key id missing from this process's ring is foreign, naming
    both sides: the store may well have the key (a process with `JOURNAL_CURSOR_KEY` set
    verifies with those keys only: a ring given as text lacks a key rotated in since).
    `in_stream`: the store keeps its own key in its stream (a `nats://` store), where it
    never changes and `journal cursor-key` does not print it (until 2026-12-07 this
    advised running it there too: an operator trial)."""

    def kind(ids: tuple[int, ...]) -> str:
        return "external" if ids and all(i & _EXTERNAL_ID_BIT for i in ids) else "local"

    ids = ", ".join(str(i) for i in sorted(known))
    text = (
        f"the {noun} is signed by key id {key_id}, which this process's cursor keys "
        f"(id {ids}) do not include: it comes from another store, its key was retired, "
    )
    if key_id & _EXTERNAL_ID_BIT and kind(known) == "local":
        return text + (
            "or it was signed with an external key (JOURNAL_CURSOR_KEY or "
            "JOURNAL_CURSOR_KEY_FILE) that this process does not have"
        )
    if in_stream:
        return text + (
            "or this process and the one that signed it use different keys: every "
            "journal of a nats:// store signs and verifies with the key the store keeps "
            "in its stream, unless JOURNAL_CURSOR_KEY (or JOURNAL_CURSOR_KEY_FILE) gives "
            "one, and then every journal of the store must be given the same"
        )
    if kind(known) == "external" and not key_id & _EXTERNAL_ID_BIT:
        return text + (
            "or this process verifies with the external key from JOURNAL_CURSOR_KEY or "
            "JOURNAL_CURSOR_KEY_FILE instead of the store's key file, which signed it "
            "(unset it, or set it to what `journal cursor-key` prints)"
        )
    return text + (
        "or it was signed after a key rotation that this process's keys do not have (when "
        "they come from JOURNAL_CURSOR_KEY, set it to what `journal cursor-key` prints now)"
    )
