"""The benchmarks package's own tests (benchmarks/)."""
