"""The view's file check (journal/_local/lmdbfile.py) on dup-sorted databases: a key's
values inline in a sub-page, in a tree of their own, or alone; and damage to each of them
reported before LMDB maps the file (the random damage sweeps are in test_damaged_view)."""

from __future__ import annotations

import struct
from pathlib import Path

import lmdb
import pytest

from journal._local.lmdbfile import check_data_file, pages_in_use

_HEADER = struct.Struct("<QHHHH")
_NODE = struct.Struct("<HHHH")
_DB = struct.Struct("<IHHQQQQQ")
_PAGE = 4096
_SIZE = 44


def _value(i: int) -> bytes:
    return i.to_bytes(8, "big") * 5 + b"\0\0\0\0"


def _build(path: Path) -> Path:
    """One dup-sorted database: b"one" with one value, b"few" with 3 (a sub-page), b"many"
    with 300 (a tree of their own); and a plain database beside it."""
    env = lmdb.open(str(path), max_dbs=4, map_size=1 << 26)
    dups = env.open_db(b"events", dupsort=True, dupfixed=True)
    plain = env.open_db(b"plain")
    with env.begin(write=True) as txn:
        txn.put(b"one", _value(1), db=dups)
        for i in range(3):
            txn.put(b"few", _value(i), db=dups, append=True)
        for i in range(300):
            txn.put(b"many", _value(i), db=dups, append=True)
        txn.put(b"k", b"v", db=plain)
    env.close()
    return path / "data.mdb"


class _File:
    """The data file's bytes, and where its pages and nodes are."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.raw = bytearray(data.read_bytes())
        self.live = pages_in_use(str(data))
        assert self.live

    def page(self, number: int) -> tuple[int, int, int, int]:
        _, pad, flags, lower, upper = _HEADER.unpack_from(self.raw, number * _PAGE)
        return pad, flags, lower, upper

    def node(self, key: bytes) -> tuple[int, int, int]:
        """(offset of the node, its flags, its data size) of the leaf node `key`."""
        for number in sorted(self.live):
            _, flags, lower, _ = self.page(number)
            if flags != 0x02:
                continue
            base = number * _PAGE
            count = (lower - 16) >> 1
            for at in struct.unpack_from(f"<{count}H", self.raw, base + 16):
                lo, hi, node_flags, key_size = _NODE.unpack_from(self.raw, base + at)
                if bytes(self.raw[base + at + 8 : base + at + 8 + key_size]) == key:
                    return base + at, node_flags, lo | hi << 16
        raise AssertionError(f"no node {key!r}")

    def data_of(self, key: bytes) -> int:
        at, _, _ = self.node(key)
        return at + 8 + _NODE.unpack_from(self.raw, at)[3]

    def leaf2_pages(self) -> list[int]:
        return sorted(n for n in self.live if self.page(n)[1] == 0x22)

    def check(self) -> str | None:
        self.data.write_bytes(bytes(self.raw))
        return check_data_file(str(self.data))


@pytest.fixture
def built(tmp_path: Path) -> _File:
    return _File(_build(tmp_path))


def test_values_inline_in_their_own_tree_and_alone_pass(built: _File) -> None:
    assert built.check() is None
    assert built.node(b"one")[1] == 0  # one value: a plain node
    assert built.node(b"few")[1] == 0x04  # a sub-page
    assert built.node(b"many")[1] == 0x06  # a tree of their own
    leaves = built.leaf2_pages()
    assert len(leaves) >= 3  # 300 values of 44 bytes, about 92 to a page
    env = lmdb.open(str(built.data.parent), max_dbs=4, readonly=True)
    with env.begin() as txn:
        values = list(txn.cursor(db=env.open_db(b"events", txn=txn, create=False)))
    env.close()
    assert len(values) == 304


def test_the_file_check_reaches_every_page_of_a_values_tree(built: _File) -> None:
    # Freeing a page the values tree uses: the free list names a page in use.
    at = built.data_of(b"many")
    root = _DB.unpack_from(built.raw, at)[7]
    assert root in built.live
    assert set(built.leaf2_pages()) <= built.live


@pytest.mark.parametrize(
    ("field", "offset", "value", "expected"),
    [
        # (A page header: u64 page number, u16 pad (the value size), flags, lower, upper.)
        ("flags", 10, 0x02, "page flags"),  # a plain leaf's flags on a sub-page
        ("ksize", 8, _SIZE - 4, "do not fill it"),
        ("lower", 12, 16 + 2 * 4, "do not fill it"),  # one value more than it holds
        ("lower", 12, 16, "empty sub-page"),
        ("upper", 14, 0xFFF0, "bounds"),
    ],
)
def test_damage_to_a_sub_page_is_reported(
    built: _File, field: str, offset: int, value: int, expected: str
) -> None:
    at = built.data_of(b"few")
    struct.pack_into("<H", built.raw, at + offset, value)
    problem = built.check()
    assert problem is not None and expected in problem, (field, problem)


def test_values_out_of_order_in_a_sub_page_are_reported(built: _File) -> None:
    at = built.data_of(b"few") + 16
    first, second = bytes(built.raw[at : at + _SIZE]), bytes(built.raw[at + _SIZE : at + 2 * _SIZE])
    built.raw[at : at + 2 * _SIZE] = second + first
    problem = built.check()
    assert problem is not None and "out of order" in problem


@pytest.mark.parametrize(
    ("index", "value", "expected"),
    [
        (0, 0, "do not fill it"),  # the value size
        (1, 0x04 | 0x10, "record of flags"),  # a values tree is DUPFIXED only
        (6, 299, "its record says"),  # the entries count
        (7, (1 << 64) - 1, "record of flags"),  # no root
    ],
)
def test_damage_to_a_values_trees_record_is_reported(
    built: _File, index: int, value: int, expected: str
) -> None:
    at = built.data_of(b"many")
    record = list(_DB.unpack_from(built.raw, at))
    record[index] = value
    _DB.pack_into(built.raw, at, *record)
    problem = built.check()
    assert problem is not None and expected in problem, problem


def test_damage_to_a_values_trees_leaf_is_reported(built: _File) -> None:
    leaf = built.leaf2_pages()[1]
    base = leaf * _PAGE
    _, _, lower, _ = built.page(leaf)
    # Values out of order: the page's last value below its first.
    last = base + 16 + ((lower - 16) // 2 - 1) * _SIZE
    built.raw[last : last + _SIZE] = bytes(_SIZE)
    problem = built.check()
    assert problem is not None and ("out of order" in problem or "bound" in problem), problem


def test_a_values_trees_leaf_claiming_more_values_is_reported(built: _File) -> None:
    leaf = built.leaf2_pages()[0]
    struct.pack_into("<H", built.raw, leaf * _PAGE + 12, built.page(leaf)[2] + 2)
    problem = built.check()
    assert problem is not None


def test_a_values_trees_leaf_with_a_plain_leafs_flags_is_reported(built: _File) -> None:
    leaf = built.leaf2_pages()[0]
    struct.pack_into("<H", built.raw, leaf * _PAGE + 10, 0x02)
    problem = built.check()
    assert problem is not None and "page flags" in problem


def test_duplicates_in_a_database_not_dup_sorted_are_reported(built: _File) -> None:
    # The plain database's node marked as holding a sub-page.
    at, _, _ = built.node(b"k")
    struct.pack_into("<H", built.raw, at + 4, 0x04)
    problem = built.check()
    assert problem is not None and "flags" in problem


@pytest.mark.parametrize("flags", [0x04, 0x10, 0x04 | 0x10 | 0x20, 0x02])
def test_a_named_database_of_other_flags_is_reported(built: _File, flags: int) -> None:
    # Only dup-sorted databases of fixed-size values are understood: LMDB would read
    # anything else with comparisons the check does not make.
    at = built.data_of(b"events")
    record = list(_DB.unpack_from(built.raw, at))
    record[1] = flags
    _DB.pack_into(built.raw, at, *record)
    problem = built.check()
    assert problem is not None and "flags" in problem, problem


def _leaves_in_key_order(built: _File) -> list[tuple[int, int]]:
    """(offset of the first value, value count) of each leaf of b"many"'s values tree,
    in the order of their values."""
    leaves = []
    for leaf in built.leaf2_pages():
        _, _, lower, _ = built.page(leaf)
        at = leaf * _PAGE + 16
        leaves.append((bytes(built.raw[at : at + _SIZE]), at, (lower - 16) // 2))
    return [(at, count) for _, at, count in sorted(leaves)]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("a value repeated", "out of order"),  # values must be strictly increasing
        ("a value above the next leaf's first", "beyond its parent's bound"),
        ("a first value below its bound", "out of order"),
    ],
)
def test_values_of_a_values_trees_leaf_out_of_place_are_reported(
    built: _File, damage: str, expected: str
) -> None:
    # The checks of a leaf's values run in C first and again in Python to say where:
    # each way of being out of place is still reported, with its place.
    (first_at, first_count), (second_at, _) = _leaves_in_key_order(built)[:2]
    if damage == "a value repeated":
        built.raw[first_at + _SIZE : first_at + 2 * _SIZE] = built.raw[first_at : first_at + _SIZE]
    elif damage == "a value above the next leaf's first":
        last = first_at + (first_count - 1) * _SIZE
        built.raw[last : last + _SIZE] = built.raw[second_at : second_at + _SIZE]
    else:
        built.raw[second_at : second_at + _SIZE] = bytes(_SIZE)
    problem = built.check()
    assert problem is not None and expected in problem, problem
