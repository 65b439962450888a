"""How the local engine reports failures of the store's files and its view: which
errors belong to the store rather than to one request, the `StoreUnavailable` a caller
sees when the disk refused an operation, and the `WriteOutcomeUnknown` when it also
refused the cut that takes the failed commit's frame off again (SPEC section 14.4)."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shlex
from collections.abc import Callable
from typing import Any, Final, TypeVar, cast

import lmdb

from ..errors import (
    JournalCorrupt,
    JournalError,
    StoreIncompatible,
    StoreUnavailable,
    WriteOutcomeUnknown,
)
from ..short_of import SHORT_OF
from .files import NotRegularFile

__all__ = [
    "OUT_OF_RESOURCES",
    "disk_errors",
    "held_by_this_process",
    "open_advice",
    "open_failure",
    "os_error_of",
    "outcome_unknown",
    "reads_disk",
    "store_wide",
    "unavailable",
]


def open_failure(error: BaseException, path: str, readonly: bool) -> StoreUnavailable | None:
    """What a failed open raises instead of `error` (None: `error` itself)."""
    if isinstance(error, OSError):
        return StoreUnavailable(
            f"cannot open the store at {path!r}: {error.strerror or error}"
            + (f" ({error.filename})" if error.filename else "")
            + f"; {open_advice(error, path, readonly)}",
            errno=error.errno,
        )
    if isinstance(error, lmdb.Error) and "already open" in str(error):
        return StoreUnavailable(
            f"this process has the store at {path!r} open already (another Journal, or "
            "one inherited across fork()): use that journal, or close it before opening "
            "the store again (one dropped without close() is closed when it is "
            "garbage-collected)"
            + (
                "; that one is read-only: to write, close it and open one writable "
                "journal, which reads too"
                if "(read-only)" in str(error) and not readonly
                else ""
            )
        )
    if isinstance(error, lmdb.Error):
        refused = os_error_of(error, path)
        if refused is not None:  # (the view's disk is full, ...: SPEC 14.4)
            return open_failure(refused, path, readonly)
        return StoreUnavailable(
            f"cannot open the index of the store at {path!r}: {error}"
            + (
                "; a store that was never opened for writing cannot be opened read-only"
                if readonly
                else ""
            )
        )
    return None


def held_by_this_process(error: StoreUnavailable) -> bool:
    """Whether a failed open found the store open in this process (`open_failure`)."""
    cause = error.__cause__
    return isinstance(cause, lmdb.Error) and "already open" in str(cause)


def store_wide(error: Exception) -> bool:
    """An error of the store itself (its disk, LMDB, its identity), not of what one
    request carried: every request of the batch would meet it again. (`JournalCorrupt`
    is not one: decoding what a request wrote into the view raises it too; real damage
    fails each request's own commit again.)"""
    return isinstance(error, (OSError, lmdb.Error, StoreUnavailable, StoreIncompatible))


_FAILED: Final = {
    "commit": "could not be written: {}; nothing of this call was committed",
    "read": "could not be read: {}",
    "maintenance": "could not be read or written: {}; what this call finished stays done "
    "(`journal verify` reports the state)",
}


# What fixes an OS error a store operation met (most are the disk's).
_DISK: Final = "free space, replace the disk"
# ENOSPC with free blocks left (`_out_of_inodes`): "free space" sent an operator to `df -h`,
# which showed 200 MB free (an operator trial, 2026-12-05).
_INODES: Final = (
    "the file system has no free inodes, though it may have free space (`df -i`): "
    "delete files on it, or move the store to one with more inodes"
)
# OS errors that say this process or the system ran out of descriptors or memory: not the
# store's fault (nothing there is damaged, missing or refused), and gone once the cause is.
OUT_OF_RESOURCES: Final = tuple(SHORT_OF)
# OS errors that say the disk itself refused (SPEC 14.4): the remedy is `_DISK`.
_DISK_ERRORS: Final = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG)
_NOT_A_FILE: Final = (
    "move the file named away; a segment, store.json or keys must be restored from a "
    "backup, any other file is made again"
)
_REMEDIES: Final = {
    **SHORT_OF,
    errno.EROFS: "the file system is read-only: remount it writable",
    # (Until 2026-12-07 "free space, replace the disk", which helps nothing: an operator
    # trial under `ulimit -f`. Its process's limit, as EMFILE's advice names `ulimit -n`.)
    errno.EFBIG: "a file reached the file size limit of this process, `ulimit -f`, or the "
    "largest file its file system allows: raise the limit for the processes that write the "
    "store, with `ulimit -f unlimited` or systemd's LimitFSIZE=infinity",
    errno.EACCES: "permissions: see the error's file",
    errno.EPERM: "permissions: see the error's file",
}


def unavailable(error: OSError, during: str = "commit") -> StoreUnavailable:
    """The error a caller sees when the store's disk refused an operation."""
    what = _what(error)
    not_a_file = isinstance(error, NotRegularFile) or error.errno == errno.EISDIR
    remedy = _NOT_A_FILE if not_a_file else _REMEDIES.get(error.errno or 0, _DISK)
    if error.errno == errno.ENOSPC and _out_of_inodes(error.filename):
        remedy = _INODES
    refused = StoreUnavailable(
        f"the store's files {_FAILED[during].format(what)}; the store is usable again "
        f"once the cause is fixed ({remedy}): retry then",
        errno=error.errno,
    )
    refused.__cause__ = error
    return refused


def outcome_unknown(
    error: BaseException, cut: BaseException, store: str | None = None
) -> WriteOutcomeUnknown:
    """The error of a batch whose frame was written when its commit failed with `error`,
    and whose cut (taking the frame off the log again) failed with `cut`: the frame stays,
    its cut owed. Whoever writes next decides: this journal's next commit cuts it first,
    but a close or a process that ends before (or another process's writer that takes
    the lock first) leaves it to a catch-up that indexes it, committed (SPEC 14.4). A
    `cut` that is `JournalCorrupt` is a damaged view, whose write transaction the cut
    needs: this journal commits nothing more before the view is rebuilt from the log,
    which indexes the frame."""
    first, then = _os_error(error, store), _os_error(cut, store)
    reason = first if first is not None else then
    remedy = _DISK if reason is None else _REMEDIES.get(reason.errno or 0, _DISK)
    if first is not None:
        failed = f"the store's files could not be written: {_what(first)}"
    elif isinstance(error, Exception):  # (a failure of the code: projecting the records)
        failed = f"the commit failed: {str(error) or type(error).__name__}"
    else:  # (a signal handler's exception, run inside the commit: SPEC 7.1)
        failed = f"the commit was interrupted ({type(error).__name__})"
    look = (
        "look whether it committed (get_session, read) before writing it again; an append "
        "retried with the same idempotency key is safe"
    )
    if isinstance(cut, JournalCorrupt):
        # (Its message names the way out: the view's rebuild from the log.)
        damage = "the damaged view" if str(cut) == str(error) else f"the view, damaged ({cut})"
        message = (
            f"{failed}; this call's frame was written to the log already, and cutting it "
            f"off again needs a write transaction on {damage}: the frame stays, and that "
            f"rebuild indexes it, committing the call. After the fix, {look}"
        )
    else:
        if reason is None and isinstance(cut, JournalError):
            remedy = "see the cut's error"  # (the store moved away, ...)
        message = (
            f"{failed}; cutting this call's frame off the log again failed too "
            f"({cut if then is None else _what(then)}), so whether the call commits is not "
            "known: this journal's next commit cuts the frame before anything else once "
            "the disk works, but if this journal is closed or this process ends first (or "
            "another process writes to the store first), that writer indexes it and the "
            f"call is committed. Fix the cause ({remedy}), then {look}"
        )
    unknown = WriteOutcomeUnknown(message, errno=None if reason is None else reason.errno)
    unknown.__cause__ = cut
    return unknown


def _what(error: OSError) -> str:
    return f"{error.strerror or error}" + (f" ({error.filename})" if error.filename else "")


def _os_error(error: BaseException, store: str | None) -> OSError | None:
    if isinstance(error, lmdb.Error):
        return os_error_of(error, store)
    return error if isinstance(error, OSError) else None


def _out_of_inodes(filename: object) -> bool:
    """Whether the file system of `filename` (a file being made, or its directory) has no
    inode left for this user while it has free blocks."""
    if not isinstance(filename, str):
        return False
    for place in (filename, os.path.dirname(filename)):
        try:
            found = os.statvfs(place)
        except OSError:
            continue
        return found.f_files > 0 and found.f_favail == 0 and found.f_bavail > 0
    return False


def os_error_of(error: lmdb.Error, store: str | None = None) -> OSError | None:
    """The OS error an LMDB error reports as text ("mdb_txn_commit: No space left on
    device"; at an open, "index: Too many open files"), if it is one. LMDB reports a page
    write that the disk cut short as EIO: with the `store`'s path, an EIO while its file
    system has less than `_NEARLY_FULL` free is reported as the full disk it most likely
    is (saying so)."""
    text = str(error)
    for number in (
        errno.ENOSPC,
        errno.EIO,
        errno.EDQUOT,
        errno.EROFS,
        errno.EFBIG,
        *OUT_OF_RESOURCES,
        # (A file of the view this user may not write: until 2026-12-06 its open said
        # "Permission denied" with no errno and no advice, a new user's trial.)
        errno.EACCES,
        errno.EPERM,
    ):
        if os.strerror(number) in text:
            if number == errno.EIO and store is not None and _nearly_full(store):
                return OSError(
                    errno.ENOSPC,
                    f"{os.strerror(errno.ENOSPC)} (the view, index/: {text}; LMDB reports "
                    "a write a full disk cut short as an I/O error, and this file system "
                    "is full)",
                )
            return OSError(number, f"{os.strerror(number)} (the view, index/: {text})")
    return None


_NEARLY_FULL: Final = 1 << 20


def _nearly_full(path: str) -> bool:
    try:
        stat = os.statvfs(path)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < _NEARLY_FULL


_Method = TypeVar("_Method", bound=Callable[..., Any])


def disk_errors(during: str) -> Callable[[_Method], _Method]:
    """An engine method that uses the store's files outside a commit (a failed commit is
    converted where its batch fails): an OS error becomes `StoreUnavailable`."""

    def decorate(method: _Method) -> _Method:
        @functools.wraps(method)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except OSError as e:
                raise unavailable(e, during) from e

        return cast(_Method, guarded)

    return decorate


reads_disk: Final = disk_errors("read")


def open_advice(error: OSError, path: str, readonly: bool) -> str:
    """What to do when opening the store at `path` failed with `error`."""
    if isinstance(error, NotRegularFile):
        return f"{_NOT_A_FILE}, then open it again"
    if error.errno in _DISK_ERRORS or (
        error.errno in _REMEDIES and not isinstance(error, PermissionError)
    ):
        return f"{_REMEDIES.get(error.errno or 0, _DISK)}, then open it again"
    if not isinstance(error, PermissionError):
        return "check the path and its permissions"
    missing = os.path.abspath(path)
    if not os.path.lexists(missing):
        # No store here yet: creating it (or a directory on the way) was refused.
        parent = os.path.dirname(missing)
        while not os.path.lexists(parent):  # (ends at the root at the latest)
            missing, parent = parent, os.path.dirname(parent)
        return (
            f"this user may not create {missing!r} in {parent!r}: create the store in a "
            "directory it may write, or let it write that one"
        )
    try:
        os.stat(os.path.join(path, "store.json"))
    except FileNotFoundError:
        # The directory is there and no store in it: creating the store's files was
        # refused (until 2026-12-07 advised as a store's file made read-only: a trial).
        return (
            f"this user may not create the store's files in {path!r}: create the store in "
            "an empty or new directory it may write, or let it write that one"
        )
    except OSError:
        pass  # (not searchable: another user's private store, said below)
    with contextlib.suppress(OSError):
        if os.stat(path).st_uid == os.geteuid():
            # (The user's own store, one of its files made read-only by hand or a restore:
            # not a shared store, until 2026-12-06 advised as one.)
            return (
                "the store is this user's, but one of its files or directories is not "
                "writable for it (see the error's path; a restore or a chmod?): give the "
                f"user write permission on the store again (`chmod -R u+rwX {shlex.quote(path)}`)"
            )
    if not readonly and os.access(os.path.join(path, "store.json"), os.R_OK):
        return (
            "this user may read the store but not write it (a group-shared store is "
            "read-only for its readers): open it with readonly=True (the CLI's read "
            "commands do)"
        )
    return (
        "a store is private to the user who created it: to share one, create it with a "
        "group file mode (file_mode=0o640, `journal init --file-mode 0640`) and give it "
        "to the readers' group (chgrp)"
    )
