"""`store.json`: the store's identity, the file mode of what the store creates, and its
retention policy.

    {"format": 1, "store_id": "<32 hex digits>", "file_mode": "0600",
     "retention": {"max_history_bytes": 335544320, "max_history_age_ms": null,
                   "session_retention_ms": null, "session_retention_from": "ended"}}

`file_mode` (octal text) was added later: a store.json without it (a store created before)
takes the mode its own permission bits show, which is the mode (the umask) its files were
created with, so such a store goes on as it was set up until a writer records a mode.
`retention` was added later too: without it, a journal opened without a policy uses the
default one, until a writer opened with a policy records it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

import msgspec

from ..arguments import check_retention, file_mode_problem
from ..errors import InvalidArgument, StoreIncompatible, StoreNotFound
from ..models import RetentionPolicy
from ..store_owner import refuse_another_users_private_store
from .failures import OUT_OF_RESOURCES
from .files import (
    DEFAULT_FILE_MODE,
    DEFAULT_FILE_OPS,
    FileOps,
    Permissions,
    fsync_dir,
    open_regular,
    write_atomic,
)
from .frames import COMPRESSED_SUFFIX, FRAME_HEADER_SIZE, SEGMENT_HEADER_SIZE, SEGMENT_SUFFIX
from .lmdbfile import check_data_file, trailing_crc

__all__ = [
    "CREATING",
    "STORE_FORMAT",
    "StoreFile",
    "create_store",
    "finish_creation",
    "holds_records",
    "load_store",
    "open_lock",
    "record_in_store",
    "refuse_foreign_place",
    "refuse_lost_store_file",
    "refuse_unfinished",
    "remove_stray_temporaries",
    "store_at_open",
]

_log: Final = logging.getLogger("journal")

STORE_FORMAT: Final = 1
_OCTAL: Final = re.compile(r"[0-7]{3,4}")
# The temporary files written in the store's own directory: `store.json` (created, or
# replaced to record a mode or policy), the key ring (`.keys.<pid>.<hex>.tmp`) and the
# view's boot marker; the group is the writing process's id.
_TEMPORARY: Final = re.compile(r"(?:store\.json|\.keys|view-boot)\.([0-9]+)\.(?:[0-9a-f]+\.)?tmp")
# A view moved aside to be deleted (from before a reboot: `index.stale-<pid>-<ns>`;
# damaged: `index.damaged-<pid>-<ns>`) by a process killed before it deleted it.
_VIEW_ASIDE: Final = re.compile(r"index\.(?:stale|damaged)-([0-9]{1,10})-[0-9]+")
# What the store's own directory holds (SPEC 7), besides the temporary files and views
# moved aside above: a directory without `store.json` that holds only these is a store
# whose creation was cut short (killed), and its creation is finished there.
_OWN_NAMES: Final = frozenset(
    {
        "store.json",
        "keys",
        "keys.lock",
        "view-boot",
        "segments",
        "index",
        "locks",
        "cut-tails",
        "creating",
    }
)
# The mark of a creation under way: made (and synced) before `store.json` is published,
# removed (and that synced) once the store's first writable open has committed its first
# segment and view (`finish_creation`). A store that holds it, no record and no first
# commit is one whose creation failed or was killed part way (or is still under way): a
# read-only open, or one with create=False, finds no store there; a creating open
# finishes it.
CREATING: Final = "creating"
# Files a user or the system leaves in a directory made for the store: git's placeholders
# for an empty directory and its ignore file, and macOS Finder's folder settings.
_PLACEHOLDERS: Final = frozenset({".gitkeep", ".keep", ".gitignore", ".DS_Store"})
# A `store.json` is read this far to tell whether its directory is a journal store.
_STORE_FILE_LIMIT: Final = 1 << 16


@dataclass(frozen=True, slots=True)
class StoreFile:
    """What `store.json` says: the store id, the file mode (recorded or derived) and the
    retention policy (None when none is recorded)."""

    store_id: bytes
    file_mode: int
    recorded: bool  # False: derived from the permission bits of an older store.json
    retention: RetentionPolicy | None = None


def _document(store_id: bytes, file_mode: int | None, retention: RetentionPolicy | None) -> bytes:
    document: dict[str, object] = {"format": STORE_FORMAT, "store_id": store_id.hex()}
    if file_mode is not None:
        document["file_mode"] = f"{file_mode:04o}"
    if retention is not None:
        document["retention"] = msgspec.to_builtins(retention)
    return json.dumps(document).encode()


def refuse_lost_store_file(path: str) -> None:
    """`StoreIncompatible` when `path` has no `store.json` but holds segment files: the
    store's identity is lost (deleted, or not restored with the rest), and a new one
    would name another store, which every later open refuses beside those segments."""
    try:
        names = os.listdir(os.path.join(path, "segments"))
    except (FileNotFoundError, NotADirectoryError):
        return
    if any(name.endswith((SEGMENT_SUFFIX, COMPRESSED_SUFFIX)) for name in names):
        if os.path.lexists(os.path.join(path, "store.json")):
            # Published after the caller looked: a creation publishes `store.json` before
            # its first segment is made, so the segment found here is that store's. (Until
            # 2026-12-07 a reader racing a creation said store.json was lost.)
            return
        raise StoreIncompatible(
            f"{path!r} holds a journal's segment files but no store.json (deleted, or not "
            "restored with them): restore store.json from a backup of this store; nothing "
            "was changed"
        )


def refuse_foreign_place(path: str) -> None:
    """`InvalidArgument` when a new store must not be created at `path`: a directory that
    holds anything but a store's own files (the user's files, another store), or a path
    inside another store's directory (its `segments/`, `index/`: that store's writers and
    `verify` own what is there). Nothing was created. A store's own names are allowed, so
    a creation killed part way is finished by the next open; so are the placeholders
    above."""
    outer = _enclosing_store(path)
    if outer is not None:
        raise InvalidArgument(
            f"{path!r} is inside the journal store {outer!r}: that store owns every file in "
            "its directory; create the new store outside it; nothing was created"
        )
    link = _dangling_link(path)
    if link is not None:
        # (mkdir refuses the link's name and finds nothing behind it: it said "File
        # exists", exit 7)
        where = repr(path) if link == path.rstrip(os.sep) else f"{link!r}, on the way to {path!r},"
        raise InvalidArgument(
            f"{where} is a symbolic link to {os.readlink(link)!r}, which does not exist: "
            "create that directory first, or give another path; nothing was created"
        )
    shown = _foreign_names(path)
    if shown:
        raise InvalidArgument(
            f"{path!r} is not empty ({shown}) and holds no journal store: a store is "
            "created in an empty or new directory, and nothing else goes in it; give the "
            "path of a new directory (such as one inside this one); nothing was created"
        )


def _foreign_names(path: str) -> str:
    """The first names in the directory `path` that are not a store's own, quoted ("" for
    none, or when it is missing: a file in the way is reported by the creation)."""
    try:
        names = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return ""
    foreign = sorted(name for name in names if not _own_name(name))
    more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
    return ", ".join(repr(name) for name in foreign[:3]) + more


def no_store_at(path: str, readonly: bool) -> StoreNotFound:
    """The `StoreNotFound` of an open without `create` (or read-only) of `path`, which
    holds no `store.json`: advice to create it there, unless a creation there would be
    refused (`refuse_foreign_place`): a path inside a store (its `segments/`) is told to
    open that store, a directory of other files to give another path. (Until 2026-12-07
    both were told to create a store there, which `journal init` then refused: a new-user
    trial.)"""
    outer = _enclosing_store(path)
    if outer is not None:
        return StoreNotFound(
            f"no journal store at {path!r}: it is inside the journal store {outer!r}, "
            f"which owns every file in its directory; open that store: use {outer!r}"
        )
    with contextlib.suppress(OSError):
        shown = _foreign_names(path)
        if shown:
            return StoreNotFound(
                f"no journal store at {path!r}: it is not a store and not empty ({shown}), "
                "so no store can be created there either; give the path of a store, or "
                "create one at an empty or new path"
            )
    if readonly:
        return StoreNotFound(
            f"no journal store at {path!r}, and a read-only journal does not create "
            "one: create it with `journal init` or a writable Journal.open(path)"
        )
    return StoreNotFound(
        f"no journal store at {path!r}: create it with `journal init` or "
        "Journal.open(path, create=True)"
    )


def _dangling_link(path: str) -> str | None:
    """The symbolic link to nothing that `path` is, or that the nearest existing name on
    the way up to it is (`link/store`: makedirs stops at `link` the same way), or None."""
    place = path.rstrip(os.sep) or path  # ("link/" follows the link)
    while not os.path.lexists(place):
        parent = os.path.dirname(place)
        if not parent or parent == place:
            return None
        place = parent
    return place if os.path.islink(place) and not os.path.exists(place) else None


def _own_name(name: str) -> bool:
    return (
        name in _OWN_NAMES
        or name in _PLACEHOLDERS
        or _TEMPORARY.fullmatch(name) is not None
        or _VIEW_ASIDE.fullmatch(name) is not None
    )


def _enclosing_store(path: str) -> str | None:
    """The nearest directory above `path` (symbolic links resolved) that is a journal
    store: its `store.json` holds a store id (a `store.json` of another program does not
    count)."""
    directory = os.path.realpath(path)
    while True:
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent
        try:
            fd = open_regular(os.path.join(directory, "store.json"), os.O_RDONLY)
            with os.fdopen(fd, "rb") as f:
                document = json.loads(f.read(_STORE_FILE_LIMIT))
        except (OSError, ValueError):
            continue
        if isinstance(document, dict) and "format" in document and "store_id" in document:
            return directory


def create_store(
    path: str, permissions: Permissions, retention: RetentionPolicy, ops: FileOps
) -> None:
    """Create the store's directories and publish a new `store.json` (with `link()`, so
    two processes creating the store race safely: the first one's file wins), its mark
    `CREATING` made before (by an opener that does not find `store.json` there yet).
    Fault point `store.create` after each step (detail: the directory made, the
    temporary file written, then `"store.json"` once it is published and synced): a
    creation killed there is finished by the next creating open, and
    until then a read-only open finds no store (`store_at_open`).

    Everything is synced through `ops` before the open returns: `store.json`'s temporary
    file before its link, the store's directory (its entries), and the directory above it
    and above each parent made for it (the store's own entry: without that sync a power
    cut may take the whole store away, with every append acknowledged since)."""
    made = _missing_directories(path)
    permissions.make_dirs(path)
    final = os.path.join(path, "store.json")
    if not os.path.lexists(final):
        # (An opener that finds `store.json` published lost the race before it began: the
        # winner made its mark before publishing and removes it after its first commit, so
        # a mark made now could only outlive the winner's, beside a finished store.)
        os.close(permissions.create_file(os.path.join(path, CREATING), os.O_WRONLY))
    ops.point("store.create", "")
    for name in ("segments", "index", "locks"):
        permissions.make_dirs(os.path.join(path, name))
        ops.point("store.create", name)
    fsync_dir(path, ops)  # (the mark is on disk before `store.json` is)
    temporary = f"{final}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = permissions.create_file(temporary, os.O_WRONLY | os.O_TRUNC)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_document(os.urandom(16), permissions.file, retention))
            f.flush()
            ops.fsync(f.fileno())
        ops.point("store.create", os.path.basename(temporary))
        # link() fails if another process created the store first: theirs wins.
        os.link(temporary, final)
    except FileExistsError:
        pass
    finally:
        os.unlink(temporary)
    fsync_dir(path, ops)
    # (Also when the directory was there: a creation killed part way made it, unsynced.)
    for directory in made or [os.path.realpath(path)]:
        above = os.path.dirname(directory)
        try:
            fsync_dir(above, ops)
        except PermissionError:
            # A directory this user may write but not list (a drop box, mode 1733) cannot
            # be opened to be synced: the entry is as durable as the file system makes it
            # (until 2026-12-06 the creation failed there, `store.json` published already).
            _log.info(
                "could not sync %s (no read permission): the store's entry in it is not synced",
                above,
            )
    ops.point("store.create", "store.json")


def finish_creation(path: str, ops: FileOps) -> None:
    """Remove the store's `CREATING` mark, if any (and sync that): a writable open calls
    this once its first commit succeeded, which made the first segment and the view. A
    mark left in place would make the store read as unfinished again (after a power cut
    too), so the removal is on disk before the open returns."""
    try:
        os.unlink(os.path.join(path, CREATING))
    except FileNotFoundError:
        return
    fsync_dir(path, ops)


def holds_records(path: str) -> bool:
    """Whether the log of the store at `path` holds (or held) a record, so that cursors
    may have been issued: a segment after the first (its base position is past 1), or a
    first segment with a frame. A segment that cannot be read counts as holding one."""
    directory = os.path.join(path, "segments")
    try:
        names = [
            n for n in os.listdir(directory) if n.endswith((SEGMENT_SUFFIX, COMPRESSED_SUFFIX))
        ]
    except FileNotFoundError:
        return False
    if not names:
        return False
    if len(names) > 1 or not names[0].endswith(SEGMENT_SUFFIX) or int(names[0][:20]) > 1:
        return True
    try:
        first = open_regular(os.path.join(directory, names[0]), os.O_RDONLY)
        with os.fdopen(first, "rb") as segment:
            segment.seek(SEGMENT_HEADER_SIZE)
            return bool(segment.read(FRAME_HEADER_SIZE).strip(b"\0"))
    except OSError:
        return True


def _unfinished(path: str) -> bool:
    """Whether the store at `path` (its `store.json` published) is a creation that did not
    finish: its `CREATING` mark is there, its log holds no record, and its first commit
    is not made (a mark beside records or beside a first commit is stale, left by an
    opener that lost the creation's race and was killed before its own first commit:
    the store is read as it is)."""
    return (
        os.path.lexists(os.path.join(path, CREATING))
        and not holds_records(path)
        and not _first_commit_made(path)
    )


def _first_commit_made(path: str) -> bool:
    """Whether the first commit of the store at `path` is made: a segment file is there
    (born complete: header synced, then renamed and the directory synced) and the view
    holds a head, sealed with its checksum, beside this store's id. The view's file is
    read with `pread` (`lmdbfile`, never mapped); only a store without records is asked,
    whose view is a few pages. The view is written after its segment was synced, so a
    head on disk, after a power cut too, comes with its segment."""
    try:
        names = os.listdir(os.path.join(path, "segments"))
    except OSError:
        return False
    if not any(name.endswith((SEGMENT_SUFFIX, COMPRESSED_SUFFIX)) for name in names):
        return False
    meta: dict[bytes, bytes] = {}
    try:
        store = load_store(os.path.join(path, "store.json"))
        if check_data_file(os.path.join(path, "index", "data.mdb"), None, meta) is not None:
            return False
    except (OSError, StoreIncompatible):
        return False  # (the open that goes on reports what is wrong)
    head, view_store = meta.get(b"head"), meta.get(b"store")
    return (
        head is not None
        and view_store is not None
        and trailing_crc(b"meta", b"head", head) is None
        and trailing_crc(b"meta", b"store", view_store) is None
        and view_store[:-4] == store.store_id
    )


def refuse_unfinished(path: str) -> None:
    """`StoreNotFound` when the store at `path` (its `store.json` published) is a creation
    that did not finish (`_unfinished`): what a read-only open, one with create=False and
    `journal cursor-key` (which reads and changes the key file without opening the store)
    find there."""
    if _unfinished(path):
        raise StoreNotFound(
            f"no journal store at {path!r}: its creation did not finish (the process "
            "creating it failed or was killed, or is still at it); `journal init` or a "
            "writable Journal.open(path) finishes it"
        )


def _missing_directories(path: str) -> list[str]:
    """`path` (resolved) and its parents that do not exist yet, deepest first."""
    missing = []
    directory = os.path.realpath(path)
    while not os.path.isdir(directory):
        missing.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return missing


def remove_stray_temporaries(path: str, alive: Callable[[int], bool]) -> None:
    """Delete the temporary files a process that is gone left in the store's directory
    (killed while it created `store.json`, recorded a mode or policy in it, wrote the key
    ring or the boot marker) or a view it moved aside to delete: the writer's open does
    this as it does for `segments/` (SPEC 3). A live process's file is left alone (it is
    still being written)."""
    for name in os.listdir(path):
        match = _TEMPORARY.fullmatch(name)
        if match is not None and not alive(int(match.group(1))):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(path, name))
            continue
        match = _VIEW_ASIDE.fullmatch(name)
        if match is not None and not alive(int(match.group(1))):
            shutil.rmtree(os.path.join(path, name), ignore_errors=True)


def load_store(store_file: str) -> StoreFile:
    """Read `store.json`; `StoreIncompatible` when it is damaged or of another format (an
    OS error that says nothing of the file, no permission or no descriptor left, is
    raised as it is)."""

    def damaged(reason: object) -> StoreIncompatible:
        return StoreIncompatible(
            f"{store_file} is unreadable or damaged ({reason}); restore it from a backup"
        )

    try:
        with os.fdopen(open_regular(store_file, os.O_RDONLY), "rb") as f:
            document = json.loads(f.read())
            own_mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        if not isinstance(document, dict):
            raise damaged("not a JSON object")
        if document.get("format") != STORE_FORMAT:
            raise StoreIncompatible(
                f"{store_file} has store format {document.get('format')!r}; this code "
                f"reads format {STORE_FORMAT}: upgrade session-journal"
            )
        store_id = bytes.fromhex(document["store_id"])
    except PermissionError:
        raise  # not damage: the caller reports the store as unavailable
    except OSError as e:
        if e.errno in OUT_OF_RESOURCES:
            # Not damage either: no descriptor was left to read it with (this process's
            # limit), which said "restore it from a backup" (a trial).
            raise
        raise damaged(e) from None
    except (ValueError, KeyError, TypeError) as e:
        raise damaged(e) from None
    if len(store_id) != 16:
        raise StoreIncompatible(f"{store_file} holds a store id of the wrong length")
    retention = None
    if "retention" in document:
        try:
            retention = msgspec.convert(document["retention"], RetentionPolicy)
            check_retention(retention)
        except (msgspec.ValidationError, InvalidArgument) as e:
            raise damaged(f"retention: {e}") from None
    text = document.get("file_mode")
    if text is None:
        # Written before modes were recorded: its files were made with the umask, as was
        # store.json itself; keep making them so (readers set up for that keep working).
        return StoreFile(store_id, (own_mode & 0o666) | 0o600, False, retention)
    value = int(text, 8) if isinstance(text, str) and _OCTAL.fullmatch(text) else None
    if value is None or file_mode_problem(value) is not None:
        raise damaged(f'file_mode {text!r} is not a file mode such as "0600"')
    return StoreFile(store_id, value, True, retention)


@contextlib.contextmanager
def open_lock(path: str, permissions: Permissions) -> Iterator[None]:
    """Hold the exclusive flock of the store's `locks/open.lock` (created with the mode of
    `permissions` when missing): what writers' opens change in the store's directory
    (`store.json`'s mode and policy, the view after a reboot) is read and changed under it,
    so two openers never act on what the other is changing."""
    permissions.make_dirs(os.path.join(path, "locks"))
    fd = permissions.open_or_create(os.path.join(path, "locks", "open.lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the flock)


def record_in_store(
    path: str,
    permissions: Permissions,
    file_mode: int | None = None,
    retention: RetentionPolicy | Callable[[RetentionPolicy], RetentionPolicy] | None = None,
    ops: FileOps = DEFAULT_FILE_OPS,
) -> StoreFile:
    """Record a new file mode and/or retention policy in the `store.json` of the store at
    `path`: files created from now on get the mode (existing files keep theirs); journals
    opened without a policy from now on use it. The file is read, changed and replaced
    (atomically, with the store's file mode) under the open lock (`permissions`: the lock
    file's mode if it is missing), so a mode and a policy recorded at once by two
    processes are both kept (each changes only what it was given). A callable
    `retention` is given the recorded policy (the default where none is) under the lock,
    and returns the one to record. Returns what `store.json` says now."""
    store_file = os.path.join(path, "store.json")
    with open_lock(path, permissions):
        store = load_store(store_file)
        if callable(retention):
            retention = retention(store.retention or RetentionPolicy())
        if file_mode == store.file_mode:
            file_mode = None
        if retention == store.retention:
            retention = None
        if file_mode is None and retention is None:
            return store
        mode = store.file_mode if file_mode is None else file_mode
        recorded = store.recorded or file_mode is not None
        policy = store.retention if retention is None else retention
        document = _document(store.store_id, mode if recorded else None, policy)
        write_atomic(store_file, document, ops, Permissions(mode))
        return StoreFile(store.store_id, mode, recorded, policy)


def store_at_open(
    path: str,
    create: bool,
    readonly: bool,
    file_mode: int | None,
    retention: RetentionPolicy | None,
    ops: FileOps,
) -> StoreFile:
    """What `store.json` says as a journal opens the store at `path`: created first when
    missing (`create`, and not `readonly`), and a writer records the file mode and the
    policy it was given when they differ from the recorded ones."""
    store_file = os.path.join(path, "store.json")
    if os.path.exists(path) and not os.path.isdir(path):
        raise InvalidArgument(
            f"{path!r} is a file, not a store directory: give the path of a store's "
            "directory, or of a new one"
        )
    try:
        os.stat(store_file)  # a private store of another user: PermissionError
        exists = True
    except FileNotFoundError:
        exists = False
    except NotADirectoryError:
        raise InvalidArgument(
            f"{path!r} is not a directory: a directory on the way to it is a file; give "
            "the path of a store's directory, or of a new one"
        ) from None
    if not exists:
        ops.point("store.missing", path)
        refuse_lost_store_file(path)
        # (Published meanwhile: another process's creation, then its first commit's
        # segment, which `refuse_lost_store_file` found beside it.)
        exists = os.path.lexists(store_file)
    if not exists:
        if readonly or not create:
            raise no_store_at(path, readonly)
        refuse_foreign_place(path)
        permissions = Permissions(file_mode or DEFAULT_FILE_MODE)
        create_store(path, permissions, retention or RetentionPolicy(), ops)
    elif readonly or not create:
        # (Until 2026-12-07 its readers said its active segment was missing, "restore the
        # segment from a backup", exit 7, of a store that never held an event, and a
        # writable open finished it without a word: an operator trial, `journal init` on
        # a disk that refused it.)
        refuse_unfinished(path)
    store = load_store(store_file)
    if not readonly:
        refuse_another_users_private_store(path)
    mode = None if file_mode in (None, store.file_mode) else file_mode
    policy = None if retention in (None, store.retention) else retention
    if not readonly and (mode is not None or policy is not None):
        store = record_in_store(path, Permissions(mode or store.file_mode), mode, policy, ops)
    return store
