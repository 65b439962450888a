"""The commands the CLI suggests in its messages, written so that they run as printed:
`journal` as the user ran it (with `--store` when the store was given as that option),
and arguments as shell words."""

from __future__ import annotations

import shlex

import click

from journal.remote import without_password

__all__ = ["argument", "journal_command"]


def journal_command() -> str:
    """`journal`, with `--store STORE` when the store was given as that option (not by
    $JOURNAL_STORE or ./.journal, which the suggested command finds by itself), a URL's
    password masked. Until 2026-12-06 only `journal init` named the store so: a hint to
    run `journal sessions show ID` after `journal --store S sessions own` looked in
    ./.journal (a new user's trial)."""
    context = click.get_current_context(silent=True)
    if context is None:
        return "journal"
    root = context.find_root()
    store = root.params.get("store")
    given = root.get_parameter_source("store") is click.core.ParameterSource.COMMANDLINE
    if not given or not isinstance(store, str):
        return "journal"
    return f"journal --store {shlex.quote(without_password(store))}"


def argument(value: str) -> str:
    """`value` as the command's positional argument, a shell word: quoted, and after `--`
    when it starts with `-` (`journal sessions show -- -x`; unquoted it is an option)."""
    quoted = shlex.quote(value)
    return f"-- {quoted}" if value.startswith("-") else quoted
