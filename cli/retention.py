"""`journal retention`: show the store's recorded retention policy, or record a new one
(SPEC 8, "The store records its policy"; SPEC 13). Every writer of the store applies the
recorded policy from its next retention pass on, running writers included."""

from __future__ import annotations

from typing import Any, Final

import click
import msgspec

import journal

from .output import BELOW_2_62, Settings, pass_settings

__all__ = ["retention"]

_NONE: Final = "none"  # the option value that removes a limit


class _LimitOrNone(click.ParamType[Any]):
    """An int from 1 below 2**62, or `none` (no limit)."""

    name = "N|none"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.strip().lower() == _NONE:
            return _NONE
        try:
            number = click.INT.convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r} is neither a whole number nor {_NONE}", param, ctx)
        if number < 1:
            # (0 reads as "no limit" to some: say which value means that.)
            self.fail(
                f"{number} is not a limit: give 1 or more, or {_NONE} for no limit", param, ctx
            )
        return click.IntRange(1, BELOW_2_62).convert(number, param, ctx)


_LIMIT: Final = _LimitOrNone()


def _shown(value: int | None) -> str:
    return _NONE if value is None else str(value)


def policy_record(policy: journal.RetentionPolicy) -> dict[str, Any]:
    record: dict[str, Any] = msgspec.to_builtins(policy)
    return record


def policy_text(policy: journal.RetentionPolicy) -> str:
    window = policy.max_history_bytes
    size = "" if window is None or window % (1 << 20) else f" ({window >> 20} MiB)"
    return (
        f"max-history-bytes {_shown(window)}{size}, "
        f"max-history-age-ms {_shown(policy.max_history_age_ms)}, "
        f"session-retention-ms {_shown(policy.session_retention_ms)}, "
        f"session-retention-from {policy.session_retention_from}"
    )


@click.command()
@click.option(
    "--max-history-bytes",
    type=_LIMIT,
    default=None,
    help="Keep at most about N bytes of each session's newest events (sessions created "
    "with their own window keep theirs); none: no byte window. Whole appends are dropped, "
    "oldest first, and the newest append always stays.",
)
@click.option(
    "--max-history-age-ms",
    type=_LIMIT,
    default=None,
    help="Drop events N ms after they were appended; none: no age window.",
)
@click.option(
    "--session-retention-ms",
    type=_LIMIT,
    default=None,
    help="Evict an ended session N ms after it ended (or was created: "
    "--session-retention-from); none: keep ended sessions.",
)
@click.option(
    "--session-retention-from",
    type=click.Choice(["ended", "started"]),
    default=None,
    help="What --session-retention-ms counts from: the session's end, or its creation.",
)
@pass_settings
def retention(
    settings: Settings,
    max_history_bytes: int | str | None,
    max_history_age_ms: int | str | None,
    session_retention_ms: int | str | None,
    session_retention_from: str | None,
) -> None:
    """Show the store's retention policy, or record a new one.

    Without options it prints the recorded policy (opening the store read-only). With
    options it records a new one: the fields not given keep their recorded values. Every
    writer of the store applies it from its next retention pass on (after it seals a
    segment, or `journal compact`), running ones included; `journal compact` applies it
    now.
    """
    given = {
        "max_history_bytes": max_history_bytes,
        "max_history_age_ms": max_history_age_ms,
        "session_retention_ms": session_retention_ms,
        "session_retention_from": session_retention_from,
    }
    changes = {k: None if v == _NONE else v for k, v in given.items() if v is not None}
    output = settings.output
    if not changes:
        with settings.open(write=False) as store:
            current = store.retention_policy()
        output.emit(policy_record(current), f"retention: {policy_text(current)}")
        return
    seen: list[journal.RetentionPolicy] = []

    def change(recorded: journal.RetentionPolicy) -> journal.RetentionPolicy:
        seen.append(recorded)  # (called again when another recording came between)
        return msgspec.structs.replace(recorded, **changes)

    # Applied to the policy recorded at that moment: runs at once keep each other's fields.
    with settings.open(write=True) as store:
        current = store.change_retention_policy(change)
    before = seen[-1]
    verb = "recorded" if current != before else "unchanged"
    output.emit(
        {**policy_record(current), "changed": current != before},
        f"retention {verb}: {policy_text(current)}",
    )
