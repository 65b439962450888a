"""Checking an LMDB data file without mapping it: what the view must pass before LMDB may
touch it (SPEC.md "Failure handling: a damaged view").

LMDB trusts its file. A page of zeros or garbage makes it fail an assertion (the process
aborts), return MDB_CORRUPTED, or copy a value from past the end of its page; a file
shorter than its meta page records makes the kernel kill the process with SIGBUS as soon
as a page past the end is touched. So before the view is opened, the file is read here
with `pread` (never mapped: a short file is a short read, not a signal) and every page
LMDB can reach from its current meta page is checked.

Layout relied on: the data file version 1 of LMDB 0.9.x (the version py-lmdb 1.x-3.x
bundles; 0.9.36 when this was written), 64-bit little-endian builds:

    page header (16 bytes)  u64 page number, u16 pad, u16 flags, u16 lower, u16 upper
                            (an overflow page has a u32 page count at offset 12)
    page flags              BRANCH 0x01, LEAF 0x02, OVERFLOW 0x04, META 0x08
    meta pages 0 and 1      after the header: u32 magic 0xBEEFC0DE, u32 version 1,
                            u64 address, u64 map size, the free and the main database
                            records, u64 last used page, u64 transaction id; LMDB uses
                            the meta page with the larger transaction id (page 0 on a tie)
    database record (48)    u32 pad (the page size, in the free database's record),
                            u16 flags, u16 depth, u64 branch pages, u64 leaf pages,
                            u64 overflow pages, u64 entries, u64 root page (2^64-1: empty)
    node                    u16 lo, u16 hi, u16 flags, u16 key size, key, data; at the
                            page offsets in the u16 array after the header. A leaf node's
                            data size is lo | hi << 16; a branch node's child page is
                            lo | hi << 16 | flags << 32. Leaf flag BIGDATA 0x01: the data
                            is the u64 first page of an overflow run holding the value;
                            SUBDATA 0x02: a named database's record (in the main database)
    dup-sorted database     flags DUPSORT 0x04 | DUPFIXED 0x10 (the only kind checked): a
                            leaf node with flag DUPDATA 0x04 holds its key's values (all of
                            one size, the "ksize") as a sub-page in its data: a page header
                            (flags LEAF | LEAF2 0x20 | SUBP 0x40, maybe DIRTY 0x10; pad: the
                            ksize) and the values packed after it in order; with DUPDATA |
                            SUBDATA, a database record (flags DUPFIXED, pad: the ksize) of a
                            tree of its own, whose branch pages are as above and whose
                            leaves (flags LEAF | LEAF2) pack the values after the header;
                            without a flag, the key's one value. In a LEAF2 page, the value
                            count is (lower - 16) / 2 and upper - lower is the free space.
                            The database's record counts the values (entries) and the pages
                            of the trees of its keys too (pages: not exactly, see _tree)
    free database           integer keys (transaction ids); values: u64 count, then that
                            many u64 page numbers

Checked: both meta pages (flag, page number, magic, version, page size, map size), that
the file holds every page up to the last used one but free ones (the SIGBUS guard), and
for the free, the main and every named database reachable from the current meta page: every page's
number, kind and bounds, every node's bounds, keys in strictly increasing order within the
bounds their parent gives, leaves all at the recorded depth, overflow runs inside the
file, no page reached twice, page and entry counts equal to the database's record, free
pages inside the file and not in use, and the values of dup-sorted databases (their
sub-pages and trees) likewise; and a check of the caller's on every entry (every value of
a dup-sorted one) of the named databases it names (the view checks its checksums there).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from functools import lru_cache
from itertools import islice
from operator import lt
from typing import Final, NamedTuple

from .files import NotRegularFile, open_regular

__all__ = [
    "EntryCheck",
    "EntryChecks",
    "check_data_file",
    "file_identity",
    "pages_in_use",
    "trailing_crc",
]

# (database name, key, value) -> a problem or None
EntryCheck = Callable[[bytes, bytes, bytes], "str | None"]
# database name -> how to check its entries (None: not at all)
EntryChecks = Callable[[bytes], "EntryCheck | None"]

_MAGIC: Final = 0xBEEFC0DE
_DATA_VERSION: Final = 1
_HEADER: Final = struct.Struct("<QHHHH")
_META: Final = struct.Struct("<IIQQ")
_DB: Final = struct.Struct("<IHHQQQQQ")
_TAIL: Final = struct.Struct("<QQ")
_NODE: Final = struct.Struct("<HHHH")
_U64: Final = struct.Struct("<Q")
_U32: Final = struct.Struct("<I")
_BE32: Final = struct.Struct(">I")
_HEADER_SIZE: Final = 16
_DB_SIZE: Final = 48
_META_SIZE: Final = 16 + 24 + 2 * _DB_SIZE + 16
_NO_PAGE: Final = (1 << 64) - 1
_BRANCH: Final = 0x01
_LEAF: Final = 0x02
_OVERFLOW: Final = 0x04
_META_PAGE: Final = 0x08
_BIGDATA: Final = 0x01
_SUBDATA: Final = 0x02
_DUPDATA: Final = 0x04
_INTEGER_KEY: Final = 0x08
_DUP_FIXED: Final = 0x10
_DUP_SORTED: Final = 0x04 | _DUP_FIXED  # (database flags DUPSORT | DUPFIXED)
_LEAF2: Final = 0x20
_SUB_PAGE: Final = 0x40
_DIRTY: Final = 0x10
_MAX_KEY: Final = 511
_MAX_MAP: Final = 1 << 46
# A busy writer changes the meta pages under a check: it is repeated on a new snapshot.
_ATTEMPTS: Final = 4


class _Record(NamedTuple):
    pad: int
    flags: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int


class _Meta(NamedTuple):
    page_size: int
    map_size: int
    free: _Record
    main: _Record
    last_page: int
    txnid: int


class _Damage(Exception):
    """A check failed (internal: `check_data_file` returns the message)."""


def trailing_crc(name: bytes, key: bytes, value: bytes) -> str | None:
    """The entry check of values that end with a big-endian CRC32 of the key and the rest
    of the value (the view's). The walk makes it in place for a value inside its page
    (one `crc32` over the key and the value, which lie side by side: no call and no copy
    per entry, about half of the check of a view of many sessions, measured 2026-12-05)."""
    if (
        len(value) < 4
        or zlib.crc32(value[:-4], zlib.crc32(key)) != _BE32.unpack_from(value, len(value) - 4)[0]
    ):
        return _crc_problem(name, key)
    return None


def _crc_problem(name: bytes, key: bytes) -> str:
    return f"the {name.decode(errors='replace')} entry {key[:40]!r} fails its checksum"


def check_data_file(
    path: str, entry_checks: EntryChecks | None = None, keep: dict[bytes, bytes] | None = None
) -> str | None:
    """What is wrong with the LMDB data file at `path` (None: nothing the checks see).

    `entry_checks(database name)` gives the check to call on every entry of that named
    database (`check(name, key, value)`, returning a problem or None), or None. With
    `keep`, the entries of the database named `b"meta"` are put there.

    The file is read, never mapped, and may be in use: the check runs on the snapshot of
    the current meta page, and a problem only counts when the meta pages did not change
    meanwhile (a commit during the check may have reused pages it read); a file that
    changes under every attempt is taken as it is. A missing file is a problem."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return f"{path} is missing"
    except NotRegularFile as e:
        return f"{path} is {e.kind}, not a file"
    try:
        for _ in range(_ATTEMPTS):
            before = _raw_metas(fd)
            try:
                checker = _Checker(fd, entry_checks, b"meta" if keep is not None else None)
                checker.run()
                if keep is not None:
                    keep.update(checker.kept)
                return None
            except _Damage as e:
                if _raw_metas(fd) == before:
                    return str(e)
        return None
    finally:
        os.close(fd)


def pages_in_use(path: str) -> set[int]:
    """The pages the current meta page reaches (for tests and diagnostics; empty when
    the file fails its checks)."""
    fd = open_regular(path, os.O_RDONLY)
    try:
        checker = _Checker(fd, None, None)
        try:
            checker.run()
        except _Damage:
            return set()
        return checker.visited
    finally:
        os.close(fd)


def _raw_metas(fd: int) -> bytes:
    first = os.pread(fd, _META_SIZE, 0)
    page_size = _DB.unpack_from(first, 16 + 24)[0] if len(first) == _META_SIZE else 0
    if not 512 <= page_size <= 65536:
        return first
    return first + os.pread(fd, _META_SIZE, page_size)


class _Checker:
    def __init__(self, fd: int, entry_checks: EntryChecks | None, keep: bytes | None) -> None:
        self._fd = fd
        self._entry_checks = entry_checks
        self._keep = keep
        self.kept: dict[bytes, bytes] = {}
        self.visited: set[int] = set()
        self._page_size = 0
        self._last_page = 0

    def run(self) -> None:
        meta = self._metas()
        self._page_size = meta.page_size
        self._last_page = meta.last_page
        size = os.fstat(self._fd).st_size
        if meta.free.flags != _INTEGER_KEY or meta.main.flags != 0:
            raise _Damage("the meta page's database flags are not LMDB's")
        free_pages: list[int] = []
        self._tree("free", meta.free, free_pages.append)
        named: list[tuple[bytes, _Record]] = []
        self._tree("main", meta.main, None, named)
        for name, record in named:
            if record.flags not in (0, _DUP_SORTED) or record.pad:
                raise _Damage(f"database {name!r} has flags {record.flags:#x}")
            self._tree(name.decode(errors="replace"), record, None, None, name)
        for page in free_pages:
            if not 2 <= page <= meta.last_page:
                raise _Damage(f"the free list names page {page}, outside the file")
            if page in self.visited:
                raise _Damage(f"the free list names page {page}, which is in use")
        # The file may end before the last used page, but only on free pages: LMDB does
        # not write a page freed by the transaction that allocated it (a "loose" page), so
        # a sound file can be a few free pages short. A page in use past the end fails the
        # walk above (a short read), where LMDB would die of SIGBUS.
        whole = size // meta.page_size  # (pages wholly inside the file)
        if whole <= meta.last_page:
            past = {page for page in free_pages if page >= whole}
            if len(past) != meta.last_page + 1 - whole:
                needed = (meta.last_page + 1) * meta.page_size
                raise _Damage(
                    f"the file is {size} bytes, shorter than the {needed} bytes its meta "
                    f"page records (pages 0..{meta.last_page} of {meta.page_size} bytes), "
                    "and not only free pages lie past its end"
                )

    def _metas(self) -> _Meta:
        metas: list[_Meta] = []
        page_size = 0
        for number in (0, 1):
            raw = os.pread(self._fd, _META_SIZE, number * page_size)
            if len(raw) < _META_SIZE:
                raise _Damage(f"meta page {number} is cut short")
            pgno, _, flags, _, _ = _HEADER.unpack_from(raw, 0)
            magic, version, _, map_size = _META.unpack_from(raw, 16)
            free = _Record(*_DB.unpack_from(raw, 16 + 24))
            main = _Record(*_DB.unpack_from(raw, 16 + 24 + _DB_SIZE))
            last_page, txnid = _TAIL.unpack_from(raw, 16 + 24 + 2 * _DB_SIZE)
            if pgno != number or flags != _META_PAGE or magic != _MAGIC:
                raise _Damage(f"page {number} is not an LMDB meta page")
            if version != _DATA_VERSION:
                raise _Damage(f"meta page {number} has data version {version}")
            if number == 0:
                page_size = free.pad
                if page_size & (page_size - 1) or not 512 <= page_size <= 65536:
                    raise _Damage(f"meta page 0 records a page size of {page_size}")
            elif free.pad != page_size:
                raise _Damage("the meta pages record different page sizes")
            if last_page < 1 or (last_page + 1) * page_size > map_size or map_size > _MAX_MAP:
                raise _Damage(
                    f"meta page {number} records {last_page + 1} pages in a map of {map_size} bytes"
                )
            metas.append(_Meta(page_size, map_size, free, main, last_page, txnid))
        return metas[1] if metas[0].txnid < metas[1].txnid else metas[0]

    def _read(self, page: int, count: int = 1) -> bytes:
        raw = os.pread(self._fd, count * self._page_size, page * self._page_size)
        if len(raw) < count * self._page_size:
            raise _Damage(f"page {page} lies past the end of the file")
        return raw

    def _claim(self, page: int, what: str) -> None:
        if not 2 <= page <= self._last_page:
            raise _Damage(f"{what} points at page {page}, outside pages 2..{self._last_page}")
        if page in self.visited:
            raise _Damage(f"{what} points at page {page}, which is reached twice")
        self.visited.add(page)

    def _tree(
        self,
        label: str,
        record: _Record,
        free_page: Callable[[int], None] | None,
        named: list[tuple[bytes, _Record]] | None = None,
        name: bytes = b"",
        owner: bytes | None = None,
    ) -> list[int]:
        """Check one B-tree (see the module docstring for what is checked); its (branch,
        leaf, overflow pages, entries). `owner`: the tree holds the values of that key of
        a dup-sorted database (its leaves are LEAF2 pages of `record.pad`-byte values)."""
        if record.root == _NO_PAGE:
            if record.depth or record.entries or record.branch_pages or record.leaf_pages:
                raise _Damage(f"database {label}: empty, but its record counts pages")
            return [0, 0, 0, 0]
        dups = record.flags == _DUP_SORTED
        counts = [0, 0, 0, 0]  # branch pages, leaf pages, overflow pages, entries
        check = self._entry_checks(name) if self._entry_checks is not None and name else None
        kept = self.kept if name is not None and name == self._keep else None
        integer_keys = free_page is not None
        # (entries of a named database checked with `trailing_crc`, in place)
        in_place = check is trailing_crc and free_page is None and named is None
        crc32 = zlib.crc32
        # (page, level, lower key bound or None, upper key bound or None)
        stack: list[tuple[int, int, bytes | None, bytes | None]] = [(record.root, 1, None, None)]
        while stack:
            page, level, low, high = stack.pop()
            where = f"database {label}, page {page}"
            self._claim(page, f"database {label}")
            raw = self._read(page)
            pgno, _, flags, lower, upper = _HEADER.unpack_from(raw, 0)
            page_size = self._page_size
            if pgno != page:
                raise _Damage(f"{where} says it is page {pgno}")
            leaf = _LEAF | _LEAF2 if owner is not None else _LEAF
            if flags not in (_BRANCH, leaf):
                raise _Damage(f"{where} has page flags {flags:#x}")
            if lower < _HEADER_SIZE or lower & 1 or lower > upper or upper > page_size:
                raise _Damage(f"{where} has bounds {lower}..{upper}")
            count = (lower - _HEADER_SIZE) >> 1
            if flags == _LEAF | _LEAF2 and owner is not None:
                level_ok = level == record.depth
                if not level_ok or count == 0:
                    raise _Damage(f"{where}: a leaf of {count} values at level {level}")
                counts[1] += 1
                counts[3] += count
                values = _packed(raw, record.pad, count, page_size, where)
                self._values(values, low, high, name, owner, check, where)
                continue
            if count == 0 or (flags == _BRANCH and count < (1 if integer_keys else 2)):
                raise _Damage(f"{where} holds {count} nodes")
            branch = flags == _BRANCH
            if branch != (level < record.depth):
                kind = "branch" if branch else "leaf"
                raise _Damage(f"{where}: a {kind} at level {level} of {record.depth}")
            counts[0 if branch else 1] += 1
            pointers = struct.unpack_from(f"<{count}H", raw, _HEADER_SIZE)
            previous = low
            inclusive = True  # the first key may equal the bound its parent gives
            keys: list[bytes] = []
            children: list[int] = []
            for index, at in enumerate(pointers):
                if at < upper or at & 1 or at + 8 > page_size:
                    raise _Damage(f"{where}: node {index} lies outside the page")
                lo, hi, node_flags, key_size = _NODE.unpack_from(raw, at)
                key_end = at + 8 + key_size
                if key_size > _MAX_KEY or key_end > page_size:
                    raise _Damage(f"{where}: node {index} has a key of {key_size} bytes")
                key = raw[at + 8 : key_end]
                if not (branch and index == 0):
                    if integer_keys:
                        if key_size != 8:
                            raise _Damage(f"{where}: a free-list key of {key_size} bytes")
                        # (Native little-endian integers: reversed, bytes order is theirs.)
                        order = key[::-1]
                    elif key_size:
                        order = key
                    else:
                        raise _Damage(f"{where}: node {index} has an empty key")
                    if previous is not None and (
                        order < previous if inclusive else order <= previous
                    ):
                        raise _Damage(f"{where}: keys out of order at node {index}")
                    if high is not None and order >= high:
                        raise _Damage(f"{where}: node {index} is beyond its parent's bound")
                    previous = order
                    inclusive = False
                if branch:
                    keys.append(key[::-1] if integer_keys else key)
                    children.append(lo | hi << 16 | node_flags << 32)
                    continue
                data_size = lo | hi << 16
                counts[3] += 1
                if dups and node_flags & _DUPDATA:
                    if key_end + data_size > page_size:
                        raise _Damage(f"{where}: node {index} has data past the end of the page")
                    found = self._duplicates(
                        raw[key_end : key_end + data_size], node_flags, label, name, key, where
                    )
                    counts = [a + b for a, b in zip(counts, found, strict=True)]
                    counts[3] -= 1
                    continue
                if (dups and node_flags) or (named is None and node_flags not in (0, _BIGDATA)):
                    # (LMDB takes a DUPDATA flag in a database not dup-sorted for a
                    # sub-page, and a BIGDATA value in one that is for a value.)
                    raise _Damage(f"{where}: node {index} has flags {node_flags:#x}")
                if node_flags & _BIGDATA:
                    if node_flags != _BIGDATA or key_end + 8 > page_size:
                        raise _Damage(f"{where}: node {index} has flags {node_flags:#x}")
                    value = self._overflow(_U64.unpack_from(raw, key_end)[0], data_size, where)
                    counts[2] += (_HEADER_SIZE - 1 + data_size) // page_size + 1
                elif key_end + data_size > page_size:
                    raise _Damage(f"{where}: node {index} has data past the end of the page")
                elif in_place and not node_flags:
                    end = key_end + data_size
                    if (
                        data_size < 4
                        or crc32(raw[at + 8 : end - 4]) != _BE32.unpack_from(raw, end - 4)[0]
                    ):
                        raise _Damage(f"{where}: {_crc_problem(name, key)}")
                    if kept is not None:
                        kept[key] = raw[key_end:end]
                    continue
                else:
                    value = raw[key_end : key_end + data_size]
                if free_page is not None:
                    self._free_list(value, free_page, where)
                elif named is not None:
                    if node_flags != _SUBDATA or data_size != _DB_SIZE:
                        raise _Damage(f"{where}: {key!r} is not a named database")
                    named.append((key, _Record(*_DB.unpack_from(value, 0))))
                elif node_flags & _SUBDATA:
                    raise _Damage(f"{where}: node {index} has flags {node_flags:#x}")
                else:
                    if check is not None:
                        problem = check(name, key, value)
                        if problem is not None:
                            raise _Damage(f"{where}: {problem}")
                    if kept is not None:
                        kept[key] = value
            for index, child in enumerate(children):
                child_low = low if index == 0 else keys[index]
                child_high = keys[index + 1] if index + 1 < len(children) else high
                stack.append((child, level + 1, child_low, child_high))
        expected = [record.branch_pages, record.leaf_pages, record.overflow_pages, record.entries]
        if dups:
            # LMDB does not take a key's values tree's pages off the database's record
            # when it deletes the key's last value (its page counts are statistics it
            # never reads back): only the values are counted there.
            expected[:3] = counts[:3]
        if counts != expected:
            raise _Damage(
                f"database {label} has (branch, leaf, overflow pages, entries) {tuple(counts)}, "
                f"its record says {tuple(expected)}"
            )
        return counts

    def _duplicates(
        self, data: bytes, node_flags: int, label: str, name: bytes, key: bytes, where: str
    ) -> list[int]:
        """Check the values of `key` in a dup-sorted database (a sub-page or a tree of
        their own, `data` being the node's data); their (pages..., entries)."""
        check = self._entry_checks(name) if self._entry_checks is not None else None
        if node_flags == _DUPDATA:
            if len(data) < _HEADER_SIZE:
                raise _Damage(f"{where}: the values of {key!r} are cut short")
            _, ksize, flags, lower, upper = _HEADER.unpack_from(data, 0)
            if flags & ~_DIRTY != _LEAF | _LEAF2 | _SUB_PAGE:
                raise _Damage(f"{where}: the values of {key!r} have page flags {flags:#x}")
            if lower < _HEADER_SIZE or lower & 1 or lower > upper or upper > len(data):
                raise _Damage(f"{where}: the values of {key!r} have bounds {lower}..{upper}")
            count = (lower - _HEADER_SIZE) >> 1
            if count == 0:
                raise _Damage(f"{where}: {key!r} has an empty sub-page")
            values = _packed(data, ksize, count, len(data), f"{where}, values of {key!r}")
            self._values(values, None, None, name, key, check, where)
            return [0, 0, 0, count]
        if node_flags != _DUPDATA | _SUBDATA or len(data) != _DB_SIZE:
            raise _Damage(f"{where}: the values of {key!r} have flags {node_flags:#x}")
        record = _Record(*_DB.unpack_from(data, 0))
        if record.flags != _DUP_FIXED or record.root == _NO_PAGE:
            raise _Damage(
                f"{where}: the values of {key!r} have a record of flags {record.flags:#x}"
            )
        return self._tree(f"{label} (values of {key!r})", record, None, None, name, key)

    def _values(
        self,
        values: list[bytes],
        low: bytes | None,
        high: bytes | None,
        name: bytes,
        key: bytes,
        check: EntryCheck | None,
        where: str,
    ) -> None:
        """Values of one key, in order and within the bounds (the first may equal `low`),
        each passing the caller's check."""
        # Without a check, the comparisons are made in C (a Python step per value made
        # this walk most of a writer's open: 30 ms for 200,000 frames); a failure is
        # found again below, to name where.
        if (
            check is None
            and (low is None or values[0] >= low)
            and (high is None or values[-1] < high)
            and all(map(lt, values, islice(values, 1, None)))
        ):
            return
        previous = low
        for index, value in enumerate(values):
            if previous is not None and (value < previous if index == 0 else value <= previous):
                raise _Damage(f"{where}: values out of order at {index}")
            if high is not None and value >= high:
                raise _Damage(f"{where}: value {index} is beyond its parent's bound")
            previous = value
            if check is not None:
                problem = check(name, key, value)
                if problem is not None:
                    raise _Damage(f"{where}: {problem}")

    def _overflow(self, first: int, data_size: int, where: str) -> bytes:
        pages = (_HEADER_SIZE - 1 + data_size) // self._page_size + 1
        self._claim(first, where)
        head = self._read(first)
        pgno, _, flags, _, _ = _HEADER.unpack_from(head, 0)
        if pgno != first or flags != _OVERFLOW or _U32.unpack_from(head, 12)[0] != pages:
            raise _Damage(f"{where}: page {first} is not the overflow run its node needs")
        for page in range(first + 1, first + pages):
            self._claim(page, where)
        raw = head if pages == 1 else head + self._read(first + 1, pages - 1)
        return raw[_HEADER_SIZE : _HEADER_SIZE + data_size]

    def _free_list(self, value: bytes, free_page: Callable[[int], None], where: str) -> None:
        if len(value) < 8 or len(value) % 8:
            raise _Damage(f"{where}: a free list of {len(value)} bytes")
        count = _U64.unpack_from(value, 0)[0]
        if len(value) != 8 * (count + 1):
            raise _Damage(f"{where}: a free list of {len(value)} bytes says {count} pages")
        for page in struct.unpack_from(f"<{count}Q", value, 8):
            free_page(page)


def _packed(raw: bytes, ksize: int, count: int, size: int, where: str) -> list[bytes]:
    """The `count` values of `ksize` bytes packed after the header of a LEAF2 page of
    `size` bytes (whose free space its header's bounds give)."""
    _, _, _, lower, upper = _HEADER.unpack_from(raw, 0)
    if not 1 <= ksize <= _MAX_KEY or upper - lower != size - _HEADER_SIZE - count * ksize:
        raise _Damage(f"{where}: {count} values of {ksize} bytes do not fill it as it says")
    return list(_values_layout(ksize, count).unpack_from(raw, _HEADER_SIZE))


@lru_cache(maxsize=64)
def _values_layout(ksize: int, count: int) -> struct.Struct:
    """`count` values of `ksize` bytes (one unpack in C for a page of them)."""
    return struct.Struct(f"{ksize}s" * count)


def file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the view's data file in the directory `path` (None: none)."""
    try:
        st = os.stat(os.path.join(path, "data.mdb"))
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino
