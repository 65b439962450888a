"""The turn API as a runtime author meets it (SPEC.md section 7.8): what an `Owner` and a
`Turn` expose, `turn.cancel()` against the turn's end, and a turn made but never started."""

from __future__ import annotations

from pathlib import Path

from journal import Journal

# What SPEC 7.8 and the README document of an owner and a turn; anything else public is
# a name users would come to rely on.
OWNER_SURFACE = {"session_id", "generation", "info", "recovered_turn", "turn", "release"}
TURN_SURFACE = {"owner", "request_id", "started", "result", "append", "cancel"}


def _public(thing: object) -> set[str]:
    return {name for name in dir(thing) if not name.startswith("_")}


def test_owner_and_turn_show_only_their_documented_names(tmp_path: Path) -> None:
    """`Owner.turn_ended`, the plumbing by which a Turn freed its owner's one-turn slot,
    was public and undocumented (found by a runtime-author trial): the slot is now an
    object each Turn is given when made."""
    with Journal.open(tmp_path, durability="os") as j:
        j.create_session("s")
        with j.own("s") as owner:
            assert _public(owner) == OWNER_SURFACE
            with owner.turn("r1") as turn:
                assert _public(turn) == TURN_SURFACE
