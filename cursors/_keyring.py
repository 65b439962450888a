"""The cursor key ring: signing keys, rotation, the key ring file and external keys.

A ring holds ordered keys (key id, a u16, -> secret). One key is active and signs new
tokens; every key in the ring verifies. Local keys (ids 1..0x7FFF) are generated and kept in
a JSON file in the store (mode 0600 unless the store is shared), with a SHA-256 checksum so
a damaged file is reported instead of silently verifying nothing. External keys (ids
0x8000..0xFFFF) come from the deployment (environment variable or file) so that replicas
sharing a secret accept each other's tokens; their id is derived from the secret so every
replica computes the same one.

Secrets never appear in `repr()` or in error messages.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeGuard

from ._errors import KeyRingError

__all__ = ["KEY_ENV", "KEY_FILE_ENV", "KeyRing"]

KEY_ENV = "JOURNAL_CURSOR_KEY"
"""Environment variable holding an external key as hex or base64url text."""

KEY_FILE_ENV = "JOURNAL_CURSOR_KEY_FILE"
"""Environment variable naming a file that holds an external key (hex, base64url or raw)."""

_FILE_FORMAT = 1
_FILE_MODE = 0o600
_CHECKSUM_DOMAIN = b"session-journal/keys/v1\x00"
_LOCAL_SECRET_BYTES = 32
_MIN_SECRET_BYTES = 16
_MAX_LOCAL_ID = 0x7FFF
_EXTERNAL_ID_BIT = 0x8000
_MAX_KEY_ID = 0xFFFF
_KEY_ID_DOMAIN = b"session-journal/key-id\x00"

_HEX_TEXT = re.compile(r"(?:[0-9a-fA-F]{2})+")
_BASE64URL_TEXT = re.compile(r"[A-Za-z0-9_-]+={0,2}")

# How long the loser of a load_or_create race waits for the winner's file to be complete;
# only reached on filesystems without hard links, where the file is written in place.
_RACE_WAIT_SECONDS = 2.0
_Stamp = tuple[int, int, int]  # (inode, mtime in ns, size) of the key file


@dataclass(frozen=True, slots=True)
class _Key:
    secret: bytes
    created_at_ms: int


class KeyRing:
    """Ordered signing keys with one active key; all keys verify, the active key signs.

    Rings are built with `generate()`, `from_secret()`, `from_environment()`, `load()` or
    `load_or_create()`. `rotate()` and `retire()` change the ring in memory only; call
    `save()` to persist, or change a key file other processes may change too inside
    `edit()`. A ring may be shared by threads: changes replace its key table as a whole,
    so readers always see a consistent table.
    """

    __slots__ = ("_active", "_generation", "_keys", "_source")

    def __init__(self, keys: Mapping[int, bytes], active_key_id: int) -> None:
        """Build a ring from key id -> secret; `active_key_id` must be one of the ids.

        Ids are u16 values other than 0; secrets are at least 16 bytes.
        """
        now_ms = _now_ms()
        self._keys: dict[int, _Key] = {}
        for key_id, secret in keys.items():
            _check_key_id(key_id)
            _check_secret(secret)
            self._keys[key_id] = _Key(bytes(secret), now_ms)
        if active_key_id not in self._keys:
            raise KeyRingError(
                f"the active key id {active_key_id} is not one of the ring's key ids "
                f"{tuple(self._keys)}; pass the id of a key in the ring"
            )
        self._active = active_key_id
        self._generation = 0
        self._source: tuple[Path, _Stamp] | None = None  # (the file `refresh` reads)

    @classmethod
    def generate(cls) -> KeyRing:
        """A new ring with one random local key, id 1."""
        return cls({1: secrets.token_bytes(_LOCAL_SECRET_BYTES)}, 1)

    @classmethod
    def from_secret(cls, secret: bytes) -> KeyRing:
        """A ring with one external key shared by replicas (at least 16 bytes).

        The key id is derived from the secret, so every replica given the same secret signs
        with the same id and accepts the others' tokens.
        """
        _check_secret(secret)
        key_id = external_key_id(bytes(secret))
        return cls({key_id: secret}, key_id)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> KeyRing | None:
        """The external-key ring configured by `JOURNAL_CURSOR_KEY(_FILE)`, or None if unset.

        `JOURNAL_CURSOR_KEY` holds the secret as hex or base64url text (text made only of
        an even number of hex digits is read as hex), or a store's own keys as `shared()`
        prints them (`ID:HEX[,ID:HEX...]`: `journal cursor-key`). `JOURNAL_CURSOR_KEY_FILE`
        names a file holding the secret in one of those encodings, or as raw bytes when the
        file is not printable ASCII text. Setting both is an error, so a deployment never
        silently uses a key other than the one intended.
        """
        env = os.environ if environ is None else environ
        text = env.get(KEY_ENV)
        file_name = env.get(KEY_FILE_ENV)
        if text is None and file_name is None:
            return None
        for name, value in ((KEY_ENV, text), (KEY_FILE_ENV, file_name)):
            if value is not None and not value.strip():
                raise KeyRingError(
                    f"{name} is set but empty: unset it to use the store's own key file, "
                    "or set it to the key (`journal cursor-key` prints a store's keys)"
                )
        if text is not None and file_name is not None:
            raise KeyRingError(
                f"both {KEY_ENV} and {KEY_FILE_ENV} are set; set only one of them "
                f"so it is clear which cursor key is used"
            )
        if text is not None and _SHARED_TEXT.fullmatch(text.strip()):
            return cls.from_shared(text)
        read = "its text read as hex, else as base64url"
        if text is not None:
            secret = _parse_secret_text(text, source=f"${KEY_ENV}")
        else:
            assert file_name is not None
            shared = _shared_text_in(file_name)
            if shared is not None:
                return cls.from_shared(shared)
            secret, as_text = _read_secret_file(file_name)
            if not as_text:
                read = "raw bytes: the file is not printable ASCII text"
        if len(secret) < _MIN_SECRET_BYTES:
            source = f"${KEY_ENV}" if text is not None else f"the file named by ${KEY_FILE_ENV}"
            raise KeyRingError(
                f"the cursor key in {source} is {len(secret)} bytes ({read}); it must be "
                f"at least "
                f"{_MIN_SECRET_BYTES} bytes (32 random bytes recommended, e.g. "
                f"`python -c 'import secrets; print(secrets.token_hex(32))'`)"
            )
        return cls.from_secret(secret)

    @classmethod
    def from_shared(cls, text: str) -> KeyRing:
        """A ring from `shared()` text (`ID:HEX[,ID:HEX...]`, the active key first): a
        store's own keys, given to a reader that cannot read its key file, so the reader
        verifies the writer's cursors and signs with the same key ids."""
        keys: dict[int, bytes] = {}
        for item in text.strip().split(","):
            key_id, _, encoded = item.partition(":")
            if int(key_id) in keys:
                raise KeyRingError(f"key id {key_id} appears twice in the shared key text")
            keys[int(key_id)] = bytes.fromhex(encoded)
        for value in keys.values():
            _check_secret(value)
        return cls(keys, int(text.strip().split(":", 1)[0]))

    def shared(self) -> str:
        """The ring as `JOURNAL_CURSOR_KEY` takes it: `ID:HEX` per key, the active first."""
        order = [self._active, *(k for k in self._keys if k != self._active)]
        return ",".join(f"{k}:{self._keys[k].secret.hex()}" for k in order)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> KeyRing:
        """Read a ring saved by `save()`; KeyRingError naming the path if missing or invalid."""
        file_path = Path(path)
        try:
            stamp = _stamp_of(file_path)  # (before the read: a change after it reads again)
            data = _read_regular_file(file_path)
        except FileNotFoundError:
            raise KeyRingError(
                f"key ring file {file_path} does not exist; create it with "
                f"KeyRing.load_or_create(), or restore it from a backup"
            ) from None
        except OSError as exc:
            raise KeyRingError(
                f"cannot read key ring file {file_path} ({exc.strerror}); "
                + _short_of(
                    exc, "check that it is a file and that its owner and permissions allow reading"
                )
            ) from None
        ring = cls._from_document(data, file_path)
        ring._source = (file_path, stamp)
        return ring

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str], *, mode: int = _FILE_MODE) -> KeyRing:
        """Load the ring at `path`, or create, save and return a new one if there is none.

        Safe when processes race: the new file appears complete and only if none exists,
        and the loser of a race loads the winner's ring, so all end up with the same keys.
        An existing but invalid file raises KeyRingError; it is never overwritten. A new
        file gets exactly `mode` (0600 by default; a store shared with a group passes its
        own mode, e.g. 0o640, so the group's readers can verify cursors).
        """
        _check_mode(mode)
        file_path = Path(path)
        if file_path.exists():
            return cls.load(file_path)
        ring = cls.generate()
        try:
            created = ring._create_exclusive(file_path, mode)
        except OSError as exc:
            raise KeyRingError(
                f"cannot create key ring file {file_path} ({exc.strerror}); {_advice(exc)}"
            ) from None
        if created:
            with contextlib.suppress(OSError):
                ring._source = (file_path, _stamp_of(file_path))
            return ring
        return cls._load_winner(file_path)

    def save(self, path: str | os.PathLike[str], *, mode: int = _FILE_MODE) -> None:
        """Write the ring to `path` atomically with `mode` (0600 by default), replacing any
        existing file (one written before key files had a checksum gets one).

        Readers see either the old file or the new one, and the new one survives a crash
        once this returns.
        """
        _check_mode(mode)
        file_path = Path(path)
        try:
            temp_path = self._write_temp(file_path, mode)
            try:
                os.replace(temp_path, file_path)
            except BaseException:
                _unlink_quietly(temp_path)
                raise
            _fsync_directory(file_path.parent)
        except OSError as exc:
            raise KeyRingError(
                f"cannot save key ring file {file_path} ({exc.strerror}); {_advice(exc)}"
            ) from None

    @classmethod
    @contextlib.contextmanager
    def edit(cls, path: str | os.PathLike[str]) -> Iterator[KeyRing]:
        """Change the key file `path` while other processes may change it too:
        `with KeyRing.edit(STORE / "keys") as ring: ring.rotate()`.

        Holds an exclusive `flock` of the lock file beside it (`<path>.lock`: a store's
        `keys.lock`, created with the key file's mode when missing) from the load to the
        save, so two edits at once keep both changes (`journal cursor-key --rotate` and
        `--retire` edit the file so). When the block ends without an error, the ring is
        saved if it changed (atomically, keeping the file's mode); an error leaves the
        file as it was. KeyRingError when the file is missing or invalid, has a mode
        `save()` does not write, or the lock file cannot be opened.
        """
        import fcntl  # (POSIX only: imported here so the package imports everywhere)

        file_path = Path(path)
        fd = _open_lock_beside(file_path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            ring = cls.load(file_path)
            mode = stat.S_IMODE(os.stat(file_path).st_mode)
            if mode & 0o711 != 0o600:  # (what `_check_mode` lets `save()` write)
                raise KeyRingError(
                    f"the key file {file_path} has mode {mode:04o}, which KeyRing.save does "
                    f"not write (owner read and write, no execute bits): `chmod 600 "
                    f"{file_path}` (or the store's file mode, such as 640 for a store shared "
                    "with a group) and try again; nothing was changed"
                )
            generation = ring.generation
            yield ring
            if ring.generation != generation:
                ring.save(file_path, mode=mode)
        finally:
            os.close(fd)  # (releases the flock)

    def rotate(self) -> int:
        """Add a new local key, make it the active (signing) key and return its id.

        Tokens signed by older keys keep verifying until those keys are retired.
        Changes the ring in memory only; call `save()` to persist.
        """
        key_id = self._next_local_id()
        keys = dict(self._keys)
        keys[key_id] = _Key(secrets.token_bytes(_LOCAL_SECRET_BYTES), _now_ms())
        self._replace(keys, key_id)
        return key_id

    def retire(self, key_id: int) -> None:
        """Remove a key: tokens it signed become foreign. The active key cannot be retired.

        Changes the ring in memory only; call `save()` to persist.
        """
        if key_id not in self._keys:
            raise KeyRingError(
                f"key id {key_id} is not in the ring (key ids: {self.key_ids}); "
                f"pass one of those ids"
            )
        if key_id == self._active:
            raise KeyRingError(
                f"key id {key_id} is the active signing key and cannot be retired; "
                f"call rotate() first so another key signs, then retire it"
            )
        keys = dict(self._keys)
        del keys[key_id]
        self._replace(keys, self._active)

    def refresh(self) -> bool:
        """Read the file this ring was loaded from again if it changed since (another
        process rotated or retired a key: `journal cursor-key --rotate`); whether the keys
        changed. A ring not loaded from a file, or a file now missing or invalid, is left
        as it is (False). `TokenCodec` calls it when a token names a key id it lacks."""
        source = self._source
        if source is None:
            return False
        path, stamp = source
        try:
            if _stamp_of(path) == stamp:
                return False
            fresh = type(self).load(path)
        except (OSError, KeyRingError):
            return False
        self._source = fresh._source
        if fresh._active == self._active and fresh._keys == self._keys:
            return False
        self._replace(fresh._keys, fresh._active)
        return True

    @property
    def active_key_id(self) -> int:
        """The id of the key that signs new tokens."""
        return self._active

    @property
    def key_ids(self) -> tuple[int, ...]:
        """Ids of all keys that verify tokens, oldest first."""
        return tuple(self._keys)

    @property
    def generation(self) -> int:
        """A counter bumped by every change, so caches of derived key state can refresh."""
        return self._generation

    def secret(self, key_id: int) -> bytes:
        """The secret of key `key_id`; KeyRingError if the ring has no such key."""
        key = self._keys.get(key_id)
        if key is None:
            raise KeyRingError(
                f"key id {key_id} is not in the ring (key ids: {self.key_ids}); "
                f"pass one of those ids"
            )
        return key.secret

    def __repr__(self) -> str:
        return f"KeyRing(active_key_id={self._active}, key_ids={self.key_ids})"

    # -- internals -----------------------------------------------------------------------

    def _replace(self, keys: dict[int, _Key], active_key_id: int) -> None:
        # The table is swapped whole (never mutated in place) so a concurrent reader sees
        # either the old or the new table; the generation moves last so a cache built after
        # reading it is never older than the generation it records.
        self._keys = keys
        self._active = active_key_id
        self._generation += 1

    def _next_local_id(self) -> int:
        local_ids = [key_id for key_id in self._keys if key_id <= _MAX_LOCAL_ID]
        candidate = max(local_ids, default=0) + 1
        if candidate <= _MAX_LOCAL_ID:
            return candidate
        # Reusing a retired id is safe: tokens signed by the retired key fail the tag check
        # under the new secret and are rejected as foreign.
        for key_id in range(1, _MAX_LOCAL_ID + 1):
            if key_id not in self._keys:
                return key_id
        raise KeyRingError(
            f"the ring has all {_MAX_LOCAL_ID} local key ids in use; retire old keys "
            f"before rotating again"
        )

    def _document(self) -> bytes:
        document: dict[str, Any] = {
            "format": _FILE_FORMAT,
            "active": self._active,
            "keys": [
                {
                    "id": key_id,
                    "secret": _b64url(key.secret),
                    "created_at_ms": key.created_at_ms,
                }
                for key_id, key in self._keys.items()
            ],
        }
        document["sha256"] = _checksum(document)
        return (json.dumps(document, indent=2) + "\n").encode("ascii")

    @classmethod
    def _from_document(cls, data: bytes, path: Path) -> KeyRing:
        def invalid(reason: str) -> KeyRingError:
            return KeyRingError(
                f"key ring file {path} is invalid: {reason}; restore it from a backup, or "
                f"delete it to start a new key ring (outstanding cursors then become foreign)"
            )

        try:
            document: Any = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise invalid("it is not JSON") from None
        if not isinstance(document, dict):
            raise invalid("it is not a JSON object")
        # Files written before the checksum have none; they are read as they are (and
        # get one when next saved).
        recorded = document.pop("sha256", None)
        if recorded is not None and recorded != _checksum(document):
            raise KeyRingError(
                f"key ring file {path} is damaged: its sha256 does not match its keys (a "
                "changed byte would otherwise make every cursor foreign); restore it from "
                "a backup, or delete it to start a new key ring (outstanding cursors then "
                "become foreign)"
            )
        if document.get("format") != _FILE_FORMAT:
            raise invalid(f"unsupported format {document.get('format')!r} (expected 1)")
        entries = document.get("keys")
        if not isinstance(entries, list) or not entries:
            raise invalid('"keys" is not a non-empty list')
        keys: dict[int, _Key] = {}
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise invalid(f"keys[{index}] is not an object")
            key_id = entry.get("id")
            if not _is_int(key_id) or not 1 <= key_id <= _MAX_KEY_ID:
                raise invalid(f"keys[{index}].id is not an integer in 1..65535")
            if key_id in keys:
                raise invalid(f"key id {key_id} appears twice")
            secret_text = entry.get("secret")
            secret = _decode_b64url(secret_text) if isinstance(secret_text, str) else None
            if secret is None or len(secret) < _MIN_SECRET_BYTES:
                raise invalid(f"keys[{index}].secret is not base64url of at least 16 bytes")
            created_at_ms = entry.get("created_at_ms", 0)
            if not _is_int(created_at_ms) or created_at_ms < 0:
                raise invalid(f"keys[{index}].created_at_ms is not a non-negative integer")
            keys[key_id] = _Key(secret, created_at_ms)
        active = document.get("active")
        if not _is_int(active) or active not in keys:
            raise invalid('"active" is not the id of a key in the file')
        ring = cls.__new__(cls)
        ring._keys = keys
        ring._active = active
        ring._generation = 0
        ring._source = None
        return ring

    def _write_temp(self, path: Path, mode: int) -> Path:
        temp_path = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        try:
            # The umask can only clear bits, but an inherited ACL or odd filesystem might
            # not, and a shared store's mode may have more than the umask lets through:
            # the file holds secrets, so pin the mode explicitly.
            os.fchmod(fd, mode)
            data = self._document()
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(temp_path)
            raise
        os.close(fd)
        return temp_path

    def _create_exclusive(self, path: Path, mode: int) -> bool:
        """Publish this ring at `path` only if nothing is there; False if another won."""
        temp_path = self._write_temp(path, mode)
        try:
            # link() fails if the target exists and makes the complete file appear at once,
            # which O_EXCL on the target alone cannot (a racer could read it half written).
            os.link(temp_path, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            return self._create_in_place(path, mode)
        finally:
            _unlink_quietly(temp_path)
        _fsync_directory(path.parent)
        return True

    def _create_in_place(self, path: Path, mode: int) -> bool:
        # Fallback for filesystems without hard links: losers may briefly see a partial
        # file, which _load_winner waits out.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        except FileExistsError:
            return False
        try:
            os.fchmod(fd, mode)
            view = memoryview(self._document())
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_directory(path.parent)
        return True

    @classmethod
    def _load_winner(cls, path: Path) -> KeyRing:
        deadline = time.monotonic() + _RACE_WAIT_SECONDS
        while True:
            try:
                return cls.load(path)
            except KeyRingError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)


def external_key_id(secret: bytes) -> int:
    """The key id of an external secret: 0x8000 | the first 15 bits of a SHA-256 digest."""
    digest = hashlib.sha256(_KEY_ID_DOMAIN + secret).digest()
    return _EXTERNAL_ID_BIT | (int.from_bytes(digest[:2], "big") >> 1)


def _checksum(document: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the key file's fields in a canonical JSON form: independent of
    indentation and key order, so only a changed value fails it."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(_CHECKSUM_DOMAIN + canonical.encode("utf-8")).hexdigest()


def _check_mode(mode: object) -> None:
    if (
        isinstance(mode, bool)
        or not isinstance(mode, int)
        or not 0 <= mode <= 0o777
        or mode & 0o711 != 0o600
    ):
        raise KeyRingError(
            f"key file mode {mode!r} is not a file mode that lets the owner read and write "
            "and has no execute bits; pass e.g. 0o600 (or 0o640 for a store shared with a "
            "group)"
        )


def _check_key_id(key_id: int) -> None:
    if not _is_int(key_id) or not 1 <= key_id <= _MAX_KEY_ID:
        raise KeyRingError(f"key id {key_id!r} is not an integer in 1..65535; pass such an id")


def _check_secret(secret: bytes) -> None:
    if not isinstance(secret, bytes | bytearray | memoryview):
        raise KeyRingError(
            f"a key secret must be bytes, not {type(secret).__name__}; decode text keys first"
        )
    if len(secret) < _MIN_SECRET_BYTES:
        raise KeyRingError(
            f"a key secret must be at least {_MIN_SECRET_BYTES} bytes, got {len(secret)}; "
            f"use 32 random bytes (secrets.token_bytes(32))"
        )


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _decode_b64url(text: str) -> bytes | None:
    if not _BASE64URL_TEXT.fullmatch(text):
        return None
    unpadded = text.rstrip("=")
    try:
        return base64.urlsafe_b64decode(unpadded + "=" * (-len(unpadded) % 4))
    except (binascii.Error, ValueError):
        return None


_SHARED_TEXT = re.compile(r"\d{1,5}:(?:[0-9a-fA-F]{2})+(?:,\d{1,5}:(?:[0-9a-fA-F]{2})+)*")


def _parse_secret_text(text: str, *, source: str) -> bytes:
    stripped = text.strip()
    if _HEX_TEXT.fullmatch(stripped):
        return bytes.fromhex(stripped)
    secret = _decode_b64url(stripped)
    if secret is None:
        raise KeyRingError(
            f"the cursor key in {source} is neither hex nor base64url text; "
            f"encode the secret as hex (e.g. `secrets.token_hex(32)`) or base64url"
        )
    return secret


def _shared_text_in(file_name: str) -> str | None:
    """The file's text when it holds `KeyRing.shared()` text, else None."""
    try:
        text = Path(file_name).read_bytes().decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None  # reported (or read as raw bytes) by _read_secret_file
    return text if _SHARED_TEXT.fullmatch(text) else None


def _read_secret_file(file_name: str) -> tuple[bytes, bool]:
    """The secret in the file, and whether it was read as text (else raw bytes)."""
    try:
        data = Path(file_name).read_bytes()
    except OSError as exc:
        raise KeyRingError(
            f"cannot read the cursor key file {file_name!r} named by ${KEY_FILE_ENV} "
            f"({exc.strerror}); {_short_of(exc, 'check the path and its permissions')}"
        ) from None
    # Printable text must parse, so a mistyped hex or base64url key is reported rather than
    # silently used as raw bytes (which would disagree with replicas given the text form).
    if data and all(0x20 <= byte < 0x7F or byte in b"\t\n\r" for byte in data):
        return _parse_secret_text(data.decode("ascii"), source=f"the file {file_name!r}"), True
    return data, False


def _stamp_of(path: Path) -> _Stamp:
    """What tells a changed file (replaced atomically: a new inode)."""
    found = os.stat(path)
    return (found.st_ino, found.st_mtime_ns, found.st_size)


def _read_regular_file(path: Path) -> bytes:
    """The bytes of the key ring file `path`, which must be a regular file: a FIFO in its
    place would block the open until a writer came (O_NONBLOCK returns at once; it changes
    nothing for a regular file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as file:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory or a device"
            raise OSError(errno.EINVAL, f"it is {kind}, not a regular file")
        return file.read()


def _fsync_directory(directory: Path) -> None:
    # Makes the rename or link durable; some platforms cannot open directories, and there
    # the rename is as durable as the platform allows.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _open_lock_beside(path: Path) -> int:
    """Open (creating it when missing) the lock file of the key file `path`, `<path>.lock`,
    with the key file's read and write bits (0600 when it has none)."""
    lock_path = path.with_name(f"{path.name}.lock")
    try:
        try:
            mode = (stat.S_IMODE(os.stat(path).st_mode) & 0o666) | _FILE_MODE
        except FileNotFoundError:
            mode = _FILE_MODE  # (the load under the lock reports the missing file)
        while True:
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            except FileExistsError:
                pass
            else:
                try:
                    os.fchmod(fd, mode)  # (the umask may have narrowed it)
                except BaseException:
                    os.close(fd)
                    raise
                return fd
            try:
                return os.open(lock_path, os.O_RDWR | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue  # removed between the two opens
    except OSError as exc:
        raise KeyRingError(
            f"cannot open the key file's lock {lock_path} ({exc.strerror}); "
            + _short_of(exc, "run as a user who can write the store")
        ) from None


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _advice(error: OSError) -> str:
    """What to do when a key file could not be written."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on its disk, then try again"
    return _short_of(error, "check that its directory exists and is writable")


# OS errors that say the process or the system is short of descriptors or memory: nothing
# is wrong with the file, its path or its permissions (EMFILE said "check that it is a file
# and that its owner and permissions allow reading"; a trial).
_SHORT_OF: Final = {
    errno.EMFILE: "this process has too many files open: close what it does not need, or "
    "raise its limit (`ulimit -n`), then try again",
    errno.ENFILE: "the system has too many files open: close some, or raise its limit, "
    "then try again",
    errno.ENOMEM: "the system is out of memory: try again once it has some",
}


def _short_of(error: OSError, otherwise: str) -> str:
    """What helps when a key file could not be used for `error` (`otherwise`: for errors
    of the file, its path or its permissions)."""
    return _SHORT_OF.get(error.errno or 0, otherwise)
