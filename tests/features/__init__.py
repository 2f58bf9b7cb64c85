"""One folder per feature package under tunesmith/: `pytest tests/features/NAME` is that feature's whole suite."""
