"""The front: the `tunesmith` command, its parser and refusals (one line, exit status 2), the docs against the code."""
