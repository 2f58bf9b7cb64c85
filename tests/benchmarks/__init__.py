"""The benchmark scripts' own tests (scripts/bench_*.py)."""
