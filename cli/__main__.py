"""`python -m cli`: the `journal` command without the console script."""

from cli import run

run(prog_name="journal")
