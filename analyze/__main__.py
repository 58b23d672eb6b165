"""`python -m analyze` is the `kvtrace` command."""

from analyze.cli import main

main()
