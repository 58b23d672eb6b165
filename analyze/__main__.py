"""`python -m kvtrace.analyze` is the `kvtrace` command."""

from kvtrace.analyze.cli import main

main()
