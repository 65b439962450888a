"""What opening a store prepares besides `store.json`: the cursor key ring, and the view,
checked against a reboot (LMDB's own sync is off) and against damage before it is mapped;
and the options a store is opened with (`LocalOptions`, the keywords of `Journal.open`).
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import logging
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Final, Literal

import lmdb

from cursors import KeyRing, KeyRingError

from ..errors import JournalCorrupt
from ..models import RetentionPolicy, VerifyProblem
from .failures import OUT_OF_RESOURCES, os_error_of
from .files import FileOps, NotRegularFile, Permissions, open_regular, write_atomic
from .frames import (
    DEFAULT_SEGMENT_BYTES,
    segment_name,
)
from .leases import BOOT_ID
from .lmdbenv import refuse_if_open_here
from .lmdbfile import file_identity
from .log import SegmentLog
from .reader_views import build_private
from .segments import open_segment
from .store_file import holds_records, open_lock
from .verify import missing_segments, view_problem
from .view import Head, View
from .view_file import ViewDamaged, inspect_view, replace_view
from .writer import data_end

__all__ = [
    "Durability",
    "LocalOptions",
    "discard_view_after_reboot",
    "key_ring_for",
    "open_checked_view",
    "open_reader_view",
    "remove_private_view",
]

Durability = Literal["fsync", "os"]
Repair = bool | Literal["cut-durable"]


@dataclass(frozen=True, slots=True)
class LocalOptions:
    """How to open a local store (the keywords of `Journal.open`, SPEC section 7)."""

    create: bool = True
    readonly: bool = False
    durability: Durability = "fsync"
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    retention: RetentionPolicy | None = None  # None: the store's recorded policy
    compress_sealed: bool = False
    key_ring: KeyRing | None = None
    file_ops: FileOps | None = None
    file_mode: int | None = None  # None: the store's recorded mode (0o600 for a new one)
    # Open a store whose active segment is damaged (`ActiveDamage`) for verify(fix=True),
    # which cuts it there; until then every write fails with the damage. "cut-durable":
    # also where only "fsync" writers wrote it (media damage, `cut_tails.cut_at_damage`).
    repair: Repair = False


_log: Final = logging.getLogger("journal")

# How long a read-only open waits for the store's view to index frames it is behind by
# before it takes the view for a crashed writer's and builds a private one (`_indexing`).
STALE_WAIT_S: Final = 0.25

# The private view directories this process made and has not removed yet (directory ->
# the pid that made it): a read-only journal never closed leaves none behind at exit.
# Only the process that made one removes it (a forked child inherits the table).
_PRIVATE_VIEWS: Final[dict[str, int]] = {}


# Each private view directory holds this file, flock()ed by the process that made it for
# as long as the directory is in use: a directory whose holder file nobody holds was left
# by a process that died without removing it (SIGKILL, the OOM killer, a power cut), and
# the next private view made by the same user removes it (`_remove_abandoned`).
PRIVATE_PREFIX: Final = "journal-readonly-"
HOLDER: Final = "holder.lock"
_HOLDERS: Final[dict[str, int]] = {}


def remove_private_view(directory: str) -> None:
    """Remove a private view directory (its journal closed, or its open failed)."""
    _PRIVATE_VIEWS.pop(directory, None)
    shutil.rmtree(directory, ignore_errors=True)
    holder = _HOLDERS.pop(directory, None)
    if holder is not None:
        os.close(holder)  # (after the removal: no one may take the directory for abandoned)


def _make_private_dir() -> str:
    """A new private view directory in the temporary directory, held by this process
    (its holder file is locked before it gets its name: a sweep never sees it unheld);
    those other processes of this user left behind are removed first."""
    # (Named and noted before it is made: `tempfile.mkdtemp` made it and returned its
    # name, then it was noted, and a Ctrl+C in between left it for good, without the
    # holder file the sweep needs, `test_a_ctrl_c_while_a_private_view_directory_...`.)
    parent = tempfile.gettempdir()
    while True:
        private = os.path.join(parent, PRIVATE_PREFIX + secrets.token_hex(6))
        _PRIVATE_VIEWS[private] = os.getpid()
        try:
            os.mkdir(private, 0o700)
        except FileExistsError:
            del _PRIVATE_VIEWS[private]  # (another's)
            continue
        except OSError:
            del _PRIVATE_VIEWS[private]  # (not made)
            raise
        except BaseException:
            remove_private_view(private)  # (a signal's raise once it was made)
            raise
        break
    try:
        staging = os.path.join(private, HOLDER + ".new")
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        _HOLDERS[private] = fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(staging, os.path.join(private, HOLDER))
    except BaseException:
        remove_private_view(private)
        raise
    _remove_abandoned(os.path.dirname(private))
    return private


def _remove_abandoned(parent: str) -> None:
    """Remove the private view directories under `parent` that this user's processes made
    and no process holds any more (their maker died). A directory without a holder file
    (made before holders existed, or not a private view) is left alone."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    uid = os.getuid()
    for entry in entries:
        if not entry.name.startswith(PRIVATE_PREFIX) or entry.path in _HOLDERS:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != uid:
                continue
            fd = os.open(
                os.path.join(entry.path, HOLDER), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            )
        except OSError:
            continue
        try:
            if os.fstat(fd).st_uid != uid:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (held: its maker is alive)
        except OSError:
            continue
        else:
            _log.info("removing %s, a private view its reader left behind", entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            os.close(fd)


@atexit.register
def _remove_private_views_left_open() -> None:
    for directory, pid in list(_PRIVATE_VIEWS.items()):
        if pid == os.getpid():
            remove_private_view(directory)


def open_checked_view(index: str, permissions: Permissions) -> View:
    """The store's view for a writer. A view that fails the file check (SPEC "a damaged
    view") is replaced by an empty one first, which the first commit rebuilds from the
    log."""
    # (Before any file of it is opened: replacing a damaged view opens its lock file.)
    refuse_if_open_here(index)
    identity = file_identity(index)
    damage = inspect_view(index)
    if damage is not None:
        if damage.other_release:
            _log.warning(
                "the view %s has %s: rebuilding it from the log, which holds every event",
                index,
                damage.what,
            )
        else:
            _log.warning(
                "the view %s is damaged (%s): rebuilding it from the log", index, damage.what
            )
        replace_view(index, None, identity, permissions)
    return View(index, permissions=permissions)


def key_ring_for(
    path: str, given: KeyRing | None, readonly: bool, permissions: Permissions
) -> KeyRing:
    """The cursor key ring: given, from the environment, or the store's `keys` file
    (created by a writer; a read-only reader never creates it)."""
    key_ring = given or KeyRing.from_environment()
    if key_ring is not None:
        return key_ring
    keys = os.path.join(path, "keys")
    # (Records first: `keys` is made before any record, so a concurrent first open that
    # makes it between the two looks does not count as a lost file.)
    if holds_records(path) and not os.path.exists(keys):
        # Cursors were issued with a key this store no longer has (the file was lost, or
        # the store was written with an external key): a new ring would make every one
        # of them foreign without a word, and a reader is told the same.
        raise KeyRingError(
            f"the store {path!r} holds records but no cursor key file ({keys}): the "
            "cursors issued so far were signed with a key it no longer has (the file "
            "was lost, or the store was written with JOURNAL_CURSOR_KEY). Restore the "
            "file from a backup, or set JOURNAL_CURSOR_KEY to the key the store was "
            "written with; to start a new key ring on purpose, which makes every "
            "cursor issued so far foreign, run `journal cursor-key --new`"
        )
    if not readonly:
        try:
            return KeyRing.load_or_create(keys, mode=permissions.file)
        except PermissionError:
            raise KeyRingError(
                f"cannot read the cursor key file {keys}: permission denied; write as a "
                "user who can read it, or give this one the store's keys in "
                "JOURNAL_CURSOR_KEY (`journal cursor-key` prints them)"
            ) from None
    try:
        return KeyRing.load(keys)
    except KeyRingError as e:
        if not os.path.exists(keys):
            raise KeyRingError(
                f"the store {path!r} has no cursor key file ({keys}) yet: its first writer "
                "makes it (`journal init`, or any write); or set JOURNAL_CURSOR_KEY"
            ) from e
        if os.access(keys, os.R_OK):
            # (Readable: damaged, or no descriptor was left to read it with; "give it read
            # access" misled there: a trial.)
            raise
        raise KeyRingError(
            f"{e.message}; a read-only reader needs the store's cursor key: give "
            f"it read access to {keys}, or share the key via JOURNAL_CURSOR_KEY"
        ) from e


def discard_view_after_reboot(path: str, permissions: Permissions, boot_id: bytes) -> bool:
    """Drop the LMDB view if the machine restarted since a writer last used it.

    LMDB's own fsync is off (the view is derived), so after a power cut its file may be
    torn. A writer records the boot id in `view-boot`; a different boot id means the
    view is not trusted: it is moved aside and rebuilt from the segments, which were
    synced. Runs under `locks/open.lock` so concurrent openers do it once.

    Returns whether it found the marker of another boot: no writer opened the store in
    this boot before, so the page cache holds nothing of the log that is not on disk
    (the rebuild need not write the active segment again: `CatchUp`).
    """
    marker = os.path.join(path, "view-boot")
    with open_lock(path, permissions):
        try:
            with os.fdopen(open_regular(marker, os.O_RDONLY), "rb") as f:
                recorded = f.read().strip()
        except FileNotFoundError:
            recorded = None
        except NotRegularFile:
            recorded = b""  # (not this boot's: the view is rebuilt, the marker replaced)
        if recorded == boot_id:
            return False
        index = os.path.join(path, "index")
        if recorded is not None and os.path.isdir(index):
            stale = f"{index}.stale-{os.getpid()}-{time.time_ns()}"
            os.rename(index, stale)
            shutil.rmtree(stale, ignore_errors=True)
        permissions.make_dirs(index)
        write_atomic(marker, boot_id, permissions=permissions)
        return recorded is not None


def open_reader_view(index: str, log: SegmentLog) -> tuple[View, str | None, VerifyProblem | None]:
    """A read-only journal's view: the store's own when it is sound and current, else a
    private one projected from the log in a temporary directory. Returns the view, the
    private directory (None for the store's view), and the damage that made the store's
    view unusable, if that is why (`verify` reports it)."""
    shared_damage: VerifyProblem | None = None
    try:
        # A damaged view (the file check; SPEC "a damaged view") is never mapped.
        damage = inspect_view(index)
        if damage is not None:
            # (Another release's view is no problem: the next writer rebuilds it, as after
            # a reboot. This reader reads through a private view meanwhile.)
            shared_damage = None if damage.other_release else view_problem(damage.what)
            raise ViewDamaged(damage.what)
        view = View(index, readonly=True)
        try:
            stale, shared_damage = _stale(view, log)
        except JournalCorrupt as e:
            shared_damage = view_problem(e.detail)
            stale = True  # a head that fails its checks
        except BaseException:
            # (Any other failure, such as an OS error reading the active segment: the view
            # is closed here, or its files stayed open and registered for good, and a
            # later store whose files got their inode numbers was "open already".)
            view.close()
            raise
        if stale:
            # Behind the log (a writer crashed before indexing its last frames) or from
            # before a reboot: a reader must not see less than was committed.
            try:
                _refuse_lost_segments(view, log)
            finally:
                view.close()
            raise ViewDamaged("the store's view is stale")
        return view, None, None
    except lmdb.Error as e:
        # (An LMDB error here is no access, or no view yet: not damage. But not a process
        # out of descriptors: it failed the private view too, blamed on a store "never
        # opened for writing"; a trial.)
        refused = os_error_of(e)
        if refused is not None and refused.errno in OUT_OF_RESOURCES:
            raise refused from e
    except ViewDamaged:
        pass
    except OSError as e:
        # The store's disk cannot back the lock file's pages (`lmdbenv`): read through a
        # private view, which lives elsewhere, as without access.
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
    private = _make_private_dir()
    try:
        view = View(private)
    except BaseException:
        remove_private_view(private)
        raise
    try:
        build_private(log, view)
    except BaseException:
        # (Closed before its directory goes: an environment left open kept two files
        # open and registered for good, found by the hostile-files fuzz test.)
        view.close()
        remove_private_view(private)
        raise
    return view, private, shared_damage


def _refuse_lost_segments(view: View, log: SegmentLog) -> None:
    """`JournalCorrupt` when the store's view, stale but sound and of this boot (behind the
    log: a writer crashed before indexing its last frames), places frames in a segment
    the log no longer has: the private view projected from the log instead cannot tell
    it from history that retention trimmed, and would start the sessions after it
    without a word (until 2026-12-05 `verify` passed and a read from the start skipped
    750 events: found by an operator trial). A writer's open keeps the view and reports
    it as every read does (`verify`: "missing"). A view from before a reboot is not
    asked: it is not synced, and after a power cut may be older than the segments'
    deletions (a writer discards it too)."""
    # The segments listed before the transaction (one a compaction deletes meanwhile is
    # in it: its entries went first) and after it (one sealed and indexed meanwhile, by a
    # writer that opened since, is in it): only a segment absent from both was lost.
    present = set(log.bases())
    with view.begin() as txn:
        if view.boot_id(txn) != BOOT_ID:
            return
        present |= set(log.bases())
        lost = missing_segments(log, view, txn, present)
    if lost:
        first = lost[0]
        more = f" (and {len(lost) - 1} more segment(s))" if len(lost) > 1 else ""
        raise JournalCorrupt(first.segment, 0, f"{first.what}{more}")


def _stale(view: View, log: SegmentLog) -> tuple[bool, VerifyProblem | None]:
    """Whether the store's view is behind the log or from before a reboot (and the
    damage, when its segment was cut short)."""
    with view.begin() as txn:
        head = view.head(txn)
        boot = view.boot_id(txn)
    if head is None or boot != BOOT_ID:
        return True, None
    name = segment_name(head.segment)
    try:
        fd = open_segment(os.path.join(log.directory, name), os.O_RDONLY)
    except FileNotFoundError:
        if not any(base >= head.segment for base in log.bases()):
            return True, VerifyProblem(
                name,
                0,
                "missing: the store's view indexes frames in it, its active segment; "
                "restore it from a backup (deleting index/ rebuilds the view without "
                "them, accepting the loss)",
            )
    else:
        try:
            end = head.end_offset
            size = data_end(log.directory, head.segment, end, os.fstat(fd).st_size, log.ops, fd)
        finally:
            os.close(fd)
        if size < head.end_offset:
            return True, VerifyProblem(
                name,
                size,
                f"the store's view indexes committed frames up to byte {head.end_offset}, "
                f"but the segment's frames end at byte {size}: frames were cut off (or the "
                "view was copied after the segments); `journal verify --fix` (writable) "
                "accepts the loss",
            )
    if not log.moved_past(head.segment, head.end_offset, head.next_position):
        return False, None
    log.ops.point("open.view_behind", head.next_position)
    return not _indexing(view, head), None


def _indexing(view: View, behind: Head) -> bool:
    """Whether a writer indexes the frames the view is behind by: it commits (its head
    moves from `behind`, the one it had when frames were found after it) within
    `STALE_WAIT_S`. A live writer's view is behind the log by the frames it is syncing
    (found in 84 of 100 read-only opens beside a writer appending durably, each of which
    then projected a private view: 150 ms at the median, 0.9 s at most); a commit indexes
    every frame it finds first, so once the head moves, frames found there are indexed, and
    the reader follows the view the writer keeps current. A crashed writer's view never
    moves. (Any move: a seal by `compact()` moves the head to the new segment, not its next
    position; until 2026-12-04 only the next position was watched, and an open during the
    seal read through a private view.)"""
    deadline = time.monotonic() + STALE_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.001)
        with view.begin() as txn:
            head = view.head(txn)
        if head is not None and head != behind:
            return True
    return False
