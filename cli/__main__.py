"""`python -m cli`: the `journal` command without the console script."""

from cli.main import main

main(prog_name="journal")
