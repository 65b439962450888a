"""Writing an export's file: all of it or nothing (a temporary file beside it, synced and
renamed over it), and the temporary files of exports killed on this host removed by the
next export to their directory (SPEC 12)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import socket
import stat
from collections.abc import Callable
from typing import IO, TypeVar

from .errors import InvalidArgument

__all__ = ["user_path", "write_file"]

T = TypeVar("T")


def user_path(what: str, path: str | os.PathLike[str]) -> str:
    """A caller's file path as a str, or `InvalidArgument`."""
    try:
        given = os.fspath(path)
    except TypeError as e:  # a PathLike whose __fspath__ returns neither str nor bytes
        raise InvalidArgument(f"{what}: {e}") from None
    if not isinstance(given, str):
        raise InvalidArgument(f"{what} must be a str path, not bytes")
    if "\0" in given:
        raise InvalidArgument(f"{what} contains a NUL character")
    return given


def write_file(given: str, write: Callable[[IO[bytes]], T]) -> T:
    """Write a file made by `write(stream)` at `given`, all of it or nothing: into a
    temporary file beside it (mode 0666 less the umask), fsynced and renamed over it.
    A symlink is followed; a device or a FIFO is written through, not replaced."""
    path = os.path.realpath(given)
    if os.path.isdir(path):
        raise InvalidArgument(f"{given!r} is a directory: give a file path")
    directory = os.path.dirname(path)
    try:
        kind = os.stat(path).st_mode
    except FileNotFoundError:
        kind = stat.S_IFREG
    except OSError as e:  # too long, a loop, permissions of a parent
        raise InvalidArgument(f"cannot write {given!r}: {e.strerror or e}") from None
    if not stat.S_ISREG(kind):
        try:  # only the open: errors of the writes themselves are the caller's to see
            stream = open(path, "wb")  # noqa: SIM115 (closed by the `with` below)
        except OSError as e:
            raise InvalidArgument(f"cannot write {given!r}: {e.strerror or e}") from None
        with stream:
            return write(stream)
    try:
        fd, temporary = _create_temporary(directory)
    except OSError as e:
        raise InvalidArgument(
            f"cannot write {given!r}: {e.strerror or e} (in {directory!r})"
        ) from None
    try:
        with os.fdopen(fd, "wb") as out:
            result = write(out)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.replace(temporary, path)
        except OSError as e:  # the name itself (too long, ...): nothing was written
            raise InvalidArgument(f"cannot write {given!r}: {e.strerror or e}") from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _sync_directory(directory)
    return result


# An export's temporary file: `.export-<pid>-<host>-<random>.tmp` (host: `_host_token`),
# so that the next export to its directory can delete the ones of processes killed on
# this host.
_TEMPORARY = re.compile(r"\.export-([0-9]{1,10})-([0-9a-f]{8})-[0-9a-f]{16}\.tmp")


def _host_token() -> str:
    """8 hex digits of the SHA-256 of the host name and the pid namespace: a pid names a
    process only within its namespace, and containers sharing a directory may share a
    host name too (a Kubernetes pod's, `--network host`)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:  # (no /proc: no pid namespaces either)
        namespace = ""
    name = f"{socket.gethostname()}\0{namespace}"
    return hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def _create_temporary(directory: str) -> tuple[int, str]:
    host = _host_token()
    _remove_killed_temporaries(directory, host)
    while True:
        name = f".export-{os.getpid()}-{host}-{secrets.token_hex(8)}.tmp"
        path = os.path.join(directory, name)
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), path
        except FileExistsError:
            continue


def _remove_killed_temporaries(directory: str, host: str) -> None:
    """Delete the temporary files of exports to `directory` whose process is gone from
    this host and pid namespace (killed with SIGKILL); a live process's file is still
    being written, and another host's or pid namespace's process cannot be seen here."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        match = _TEMPORARY.fullmatch(name)
        if match is None or match.group(2) != host or _process_alive(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, name))


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except OSError:  # (another user's process: EPERM)
        return True
    return True


def _sync_directory(directory: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
