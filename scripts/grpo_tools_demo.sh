#!/usr/bin/env bash
# Agent RL, shown: the tool-calling SFT adapter (scripts/tool_demo.sh; trained here if missing) learns with GRPO
# to answer multiplications it cannot do in its head by calling the shipped multiply tool
# (configs/grpo_tools_demo.yaml), then the SFT adapter (GRPO's start) and the GRPO policy answer 60 held-out
# multiplications as agents, with the tool, greedily: accuracy before and after, with its paired standard
# error, and the calls each made. Extra arguments go to ppo/train.py.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
PY=.venv/bin/python
SFT="${SFT:-outputs/sft_tools_demo}"
OUT="${OUT:-outputs/grpo_tools_demo}"
TOOLS=tunesmith.rl.tool_funcs:multiply
if [ ! -f "$SFT/adapter_model.safetensors" ]; then
    echo "== 0/2 the tool-calling SFT adapter -> $SFT"
    "$PY" sft/train.py configs/sft_tools_demo.yaml --output_dir "$SFT"
fi
echo "== 1/2 GRPO with the calculator in the rollouts -> $OUT"
time "$PY" ppo/train.py configs/grpo_tools_demo.yaml --adapter_name_or_path "$SFT" --output_dir "$OUT" "$@"
echo "== 2/2 held-out multiplications, answered as agents: the SFT adapter, then the GRPO policy"
"$PY" -m tunesmith eval --baseline "$SFT" --policy "$OUT" --data_path data/demo/grpo_tools_eval.jsonl \
    --reward_funcs final_number --tool_funcs "$TOOLS" --max_new_tokens 40 --show 3
