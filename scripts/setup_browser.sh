#!/usr/bin/env bash
# What the web UI's browser test needs (tests/features/ui/test_ui_browser.py, marked `browser`), apart from the default
# set-up: Debian's chromium and chromium-driver, and selenium in the repo's .venv. Not part of
# scripts/setup.sh (nor of CI): without them that test is skipped and says why.
#   bash scripts/setup_browser.sh            # as root, or with sudo available
#   .venv/bin/python -m pytest tests/features/ui/test_ui_browser.py
#   TUNESMITH_UPDATE_SCREENSHOTS=1 .venv/bin/python -m pytest tests/features/ui/test_ui_browser.py   # refresh docs/ui_*.png
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUDO=()
[[ "$(id -u)" == 0 ]] || SUDO=(sudo)
if ! command -v chromium >/dev/null 2>&1 || [[ ! -x /usr/bin/chromedriver ]]; then
  "${SUDO[@]}" apt-get update -q
  "${SUDO[@]}" apt-get install -y -q chromium chromium-driver
fi
bash "$ROOT/scripts/setup.sh"
# Selenium talks to the system's chromedriver (the test names /usr/bin/chromedriver), so it downloads nothing.
"$ROOT/.venv/bin/python" -m pip install --disable-pip-version-check -q "selenium>=4.20"
echo "setup_browser: $(chromium --version), selenium $("$ROOT/.venv/bin/python" -c 'import selenium; print(selenium.__version__)')"
