"""The benchmark command's row selection (`python -m benchmarks --only ...`)."""

from __future__ import annotations

import pytest

from benchmarks.__main__ import main


def test_only_naming_a_row_of_a_full_run_says_where_that_row_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--only follow` said "no row matches ['follow']", as for a typo, though the
    follow latency rows exist: they run only in a run without --only."""
    assert main(["--only", "follow"]) == 2
    said = capsys.readouterr().err
    assert "follow latency" in said and "run only in a run without --only" in said
    assert "journal append" in said  # (the rows --only picks among)
