"""The view's data file, apart from what LMDB does with it: checking it before LMDB maps it
(`inspect_view`: structure, every entry's CRC, the view format), replacing a damaged one
by an empty one (`replace_view`), and checking before every transaction that the open
file is still the one opened, no shorter than seen (`ViewFile`) (SPEC 14.3)."""

from __future__ import annotations

import os
import shutil
import time
from typing import Final, NamedTuple

import lmdb

from ..errors import StoreUnavailable
from .files import DEFAULT_PERMISSIONS, NotRegularFile, Permissions
from .lmdbenv import MAX_READERS, check_files, prepare_environment
from .lmdbfile import EntryCheck, check_data_file, file_identity, trailing_crc

__all__ = [
    "FORMAT_KEY",
    "INITIAL_MAP_SIZE",
    "VIEW_FORMAT",
    "ViewDamaged",
    "ViewFile",
    "ViewProblem",
    "inspect_view",
    "replace_view",
]

# 2: every value carries a CRC32 of its key and value. 3: the `states` index (a view of
# format 2 lacks it, and code of format 2 would not maintain it: either rebuilds). 4: the
# retention index (`aged`, meta b"retained"). 5: `events` keyed by incarnation alone, its
# entries dup-sorted (a view of format 4 has none). 6: the lifecycle feed pruned with its
# records and meta b"feed-floor" (a view of format 5 may lack entries without a floor).
VIEW_FORMAT: Final = 6
FORMAT_KEY: Final = b"format"  # (in `meta`)

INITIAL_MAP_SIZE: Final = 1 << 36

_EVENTS: Final = b"events"  # (the events index's database, left to the reads: below)


class ViewDamaged(Exception):
    """The view's file failed its checks before it was opened (internal: the engine
    replaces the view, or a read-only reader builds a private one)."""


def _entry_check(name: bytes) -> EntryCheck | None:
    # The events index (one entry per frame and session: most of the view) is left to
    # the reads: each entry's checksum is checked when it is read, and an entry the
    # damage moved elsewhere leaves a gap the reader reports (JournalCorrupt).
    return None if name == _EVENTS else trailing_crc


class ViewProblem(NamedTuple):
    """What `inspect_view` found: `what` is wrong, and whether it is a sound view of
    another release's format (`other_release`): replaced and rebuilt as damage is, but
    nothing was damaged, so it is said so and is no `verify` problem (SPEC 14.3)."""

    what: str
    other_release: bool = False


def inspect_view(path: str) -> ViewProblem | None:
    """What is wrong with the view's file at `path` (a directory), before LMDB maps it:
    the structure checks of `lmdbfile`, every entry's CRC, and the format (None: it may
    be opened; a missing or empty file is a new view, not damage)."""
    data = os.path.join(path, "data.mdb")
    try:
        check_files(path)
    except NotRegularFile as e:
        return ViewProblem(f"{e.path} is {e.kind}, not a file")
    try:
        if os.path.getsize(data) == 0:
            return None
    except FileNotFoundError:
        return None
    meta: dict[bytes, bytes] = {}
    try:
        problem = check_data_file(data, _entry_check, meta)
        if problem is not None:
            # A view of a release before the entries' checksums fails every CRC: a file
            # that is sound without them, of another format, is that release's view.
            return _another_release(data) or ViewProblem(problem)
    except OSError:
        return None  # unreadable here: LMDB cannot open it either, and says so
    if meta and meta.get(FORMAT_KEY, b"")[:-4] != str(VIEW_FORMAT).encode():
        return _another_release(data, meta) or ViewProblem(
            f"its format entry {meta.get(FORMAT_KEY)!r} is no view format"
        )
    return None


def _another_release(data: str, meta: dict[bytes, bytes] | None = None) -> ViewProblem | None:
    """The view file `data` as another release's view, when its structure is sound and
    its `meta` (read here when not given) records another format: sealed with its CRC
    (format 2 on), or no format entry and a head without one (format 1, before
    2026-12-01, which recorded none). None: not so (damage)."""
    if meta is None:
        meta = {}
        if check_data_file(data, None, meta) is not None or not meta:
            return None
    recorded = meta.get(FORMAT_KEY)
    if recorded is None:
        head = meta.get(b"head")
        if head is None or trailing_crc(b"meta", b"head", head) is None:
            return None  # (a view with checksums whose format entry is gone: damage)
        number = "1"
    elif trailing_crc(b"meta", FORMAT_KEY, recorded) is None and recorded[:-4].isdigit():
        number = recorded[:-4].decode()
        if number == str(VIEW_FORMAT):
            return None
    else:
        return None
    release = "a newer" if int(number) > VIEW_FORMAT else "an older"
    return ViewProblem(
        f"view format {number}, of {release} release of session-journal (this release "
        f"uses {VIEW_FORMAT})",
        other_release=True,
    )


def replace_view(
    path: str,
    env: lmdb.Environment | None,
    identity: tuple[int, int] | None,
    permissions: Permissions = DEFAULT_PERMISSIONS,
) -> None:
    """Replace the view directory `path` by an empty one (a damaged view: the next commit
    rebuilds it from the log). Done under the old view's writer lock when LMDB can still
    take it (`env`, or an environment opened here without touching its trees), so no
    writer commits through the old view meanwhile; writers that still have it open see
    the new file at their next commit (`View.begin`). When `identity` (device, inode of
    the damaged data file) no longer names the file there, another process replaced it
    already and nothing is done."""
    opened: lmdb.Environment | None = None
    txn: lmdb.Transaction | None = None
    try:
        data = os.path.join(path, "data.mdb")
        if env is None:
            prepare_environment(path, MAX_READERS, permissions)
            opened = env = lmdb.open(
                path, max_dbs=16, map_size=INITIAL_MAP_SIZE, max_readers=MAX_READERS, subdir=True
            )
        # (Beginning reads the two meta pages from the map: not from a file cut shorter.)
        if os.path.getsize(data) >= 2 * int(env.stat()["psize"]):
            txn = env.begin(write=True)
    except (lmdb.Error, OSError):
        txn = None  # a file LMDB cannot even open: nobody can be committing through it
    try:
        if identity is not None and file_identity(path) != identity:
            return
        aside = f"{path}.damaged-{os.getpid()}-{time.time_ns()}"
        os.rename(path, aside)
        permissions.make_dirs(path)
    finally:
        if txn is not None:
            txn.abort()
        if opened is not None:
            opened.close()
    shutil.rmtree(aside, ignore_errors=True)


class ViewFile:
    """The data file of an open view: its identity (device, inode) when opened, and the
    largest size this process saw it at."""

    __slots__ = ("_size", "data", "identity")

    def __init__(self, path: str) -> None:
        self.data = os.path.join(path, "data.mdb")
        self.identity = file_identity(path)
        self._size = os.stat(self.data).st_size  # (the largest seen: it never shrinks)

    def check(self) -> str | None:
        """Before every transaction: the data file must still be the one opened (not
        replaced by a process that found it damaged) and no shorter than this process
        last saw it: LMDB never shortens its file, and one cut while open kills the
        process with SIGBUS when a page past its end is touched. (Not against the pages
        LMDB records: a sound file may end a few free pages before its last used page,
        pages LMDB freed in the transaction that allocated them and never wrote; the
        check at open, `lmdbfile`, tells those from pages in use.) The damage found, if any
        (the view records it: `View.damaged`)."""
        seen = self._size  # (read before the stat: another thread may raise it meanwhile)
        try:
            st = os.stat(self.data)
        except FileNotFoundError:
            index = os.path.dirname(self.data)
            if not os.path.isdir(index):
                # Not damage: the whole store moved (or was deleted) under this process.
                raise StoreUnavailable(
                    f"the store's directory {os.path.dirname(index)} no longer holds its "
                    "index: the store was moved or deleted while this journal had it open; "
                    "open it again at its new path"
                ) from None
            return "its data file was removed"
        if (st.st_dev, st.st_ino) != self.identity:
            return "another process found it damaged and replaced it; open the journal again"
        if st.st_size < seen:
            return f"its data file was cut to {st.st_size} of {seen} bytes"
        if st.st_size > self._size:
            self._size = st.st_size
        return None
