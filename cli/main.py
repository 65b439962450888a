"""Entry point of the `journal` command: global options and the command group."""

from __future__ import annotations

import os

import click

import journal

FORMATS = ("text", "json", "quiet")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(journal.__version__, "-V", "--version", prog_name="journal")
@click.option(
    "--store",
    type=click.Path(file_okay=False),
    default=lambda: os.environ.get("JOURNAL_STORE", ".journal"),
    show_default="$JOURNAL_STORE or ./.journal",
    help="Store directory.",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="Output: human text, NDJSON (one object per line), or nothing.",
)
@click.pass_context
def main(ctx: click.Context, store: str, output_format: str) -> None:
    """Event-sourced session journal: append, replay, watch and discover agent sessions."""
    ctx.obj = {"store": store, "format": output_format}
