#!/usr/bin/env bash
# The test suite: set-up (idempotent), lint, then pytest. Extra arguments go to pytest.
#   bash scripts/test.sh --with-llama-cpp ...   # also llama-cpp-python (built once, cached), so the GGUF
#                                               # tests in llama.cpp run instead of being skipped
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SETUP_FLAGS=()
if [[ "${1:-}" == "--with-llama-cpp" ]]; then
  SETUP_FLAGS+=("$1")
  shift
fi
bash scripts/setup.sh "${SETUP_FLAGS[@]}"
.venv/bin/ruff check .
# --durations: every CI log shows where the time goes (the suite should stay well under 20 minutes).
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
