"""`verify(fix=True)` and `journal verify --fix` on the state a writer SIGKILLed inside
a seal leaves (each window of tests/test_seal_crashes.py, at a later seal and the
store's first): nothing acknowledged is lost, and the fix says there was nothing to
repair (the state is one the next writer finishes: the writable open the fix makes
finishes it first, SPEC 3.4 and 9)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _cli_runs import run_cli
from test_seal_crashes import SEALS, SEGMENT_BYTES, WINDOWS, killed_writer, payload

from journal import EventIn, Journal


@pytest.mark.parametrize("seal", SEALS)
@pytest.mark.parametrize(("compress", "step", "occurrence", "framed"), WINDOWS)
def test_a_fix_of_a_store_killed_inside_a_seal_loses_nothing_and_says_so(
    tmp_path: Path, compress: str, step: str, occurrence: int, framed: bool, seal: int
) -> None:
    store = tmp_path / "store"
    acked = killed_writer(store, compress, step, str(occurrence), str(seal))
    written = acked + 1 if framed else acked
    expected = [payload(o) for o in range(1, written + 1)]
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)

    done = run_cli(store, "verify", "--fix")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "0 problems (--fix: nothing left to repair)" in done.stdout, (done.stdout, done.stderr)

    with Journal.open(copy, segment_bytes=SEGMENT_BYTES, compress_sealed=compress == "1") as j:
        report = j.verify(fix=True)
        assert report.problems == [], report  # (`fixed`: the view was rebuilt, SPEC 9)
        assert [e.data for e in j.replay("s")] == expected
        j.append("s", [EventIn("m", payload(written + 1))])
        assert j.verify().problems == []
    for path in (store, copy):
        with Journal.open(path, readonly=True) as reader:
            got = [e.data for e in reader.replay("s")]
            assert got[: len(expected)] == expected
            assert reader.verify().problems == []
