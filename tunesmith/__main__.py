"""`python -m tunesmith COMMAND ...` is the `tunesmith` command."""

from .cli import main

main()
