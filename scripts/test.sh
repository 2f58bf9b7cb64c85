#!/usr/bin/env bash
# The test suite: set-up (idempotent), lint, then pytest. Extra arguments go to pytest.
#   bash scripts/test.sh --with-llama-cpp ...   # also llama-cpp-python (built once, cached), and the GGUF
#                                               # tests in llama.cpp (marker llama_cpp) run with the rest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SETUP_FLAGS=()
MARKERS=()
if [[ "${1:-}" == "--with-llama-cpp" ]]; then
  SETUP_FLAGS+=("$1")
  MARKERS=(-m "not heavy and not vllm")  # pyproject's default leaves out heavy, llama_cpp and vllm; a later -m wins
  shift
fi
bash scripts/setup.sh "${SETUP_FLAGS[@]}"
.venv/bin/ruff check .
# --durations: every CI log shows where the time goes (the suite should stay well under 20 minutes).
# -n: tests run in TUNESMITH_TEST_WORKERS processes (default 2; 0 runs them in this one), each test handed
# to whichever worker is free, so the long two-rank runs do not leave the other worker idle at the end.
WORKERS="${TUNESMITH_TEST_WORKERS:-2}"
# Each worker's torch (and what it launches) gets its share of the cores: two workers of 2 threads on 2 cores wait
# on each other (a subset of real training tests: 138-149 s with 1 thread each against 154-157 s with 2).
if [[ -z "${OMP_NUM_THREADS:-}" && "$WORKERS" -gt 0 ]]; then
  export OMP_NUM_THREADS=$(( $(nproc) / WORKERS > 0 ? $(nproc) / WORKERS : 1 ))
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 -n "$WORKERS" --dist worksteal "${MARKERS[@]}" "$@"
