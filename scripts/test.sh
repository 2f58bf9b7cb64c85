#!/usr/bin/env bash
# The test suite: set-up (idempotent), lint, then pytest. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
.venv/bin/ruff check .
# --durations: every CI log shows where the time goes (the suite should stay well under 20 minutes).
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
