#!/usr/bin/env bash
# Tool calling, shown: LoRA-tune the embedded SmolLM2-135M-Instruct on data/demo/tools.jsonl (with
# tunesmith's chatml_tools template), then ask base and tuned model 30 held-out questions and score
# the calls they make (well formed, right function, right arguments). Extra arguments go to sft/train.py.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
PY=.venv/bin/python
OUT="${OUT:-outputs/sft_tools_demo}"
echo "== 1/3 which tokens are trained (the call is, the tool's result is not)"
"$PY" -m tunesmith inspect --data_path data/demo/tools.jsonl --chat_template chatml_tools --max_samples 1 --show 1
echo "== 2/3 LoRA fine-tune on data/demo/tools.jsonl -> $OUT"
time "$PY" sft/train.py configs/sft_tools_demo.yaml --output_dir "$OUT" "$@"
echo "== 3/3 held-out questions: the calls base and tuned model make"
"$PY" -m tunesmith compare --adapter_name_or_path "$OUT" --data_path data/demo/tools_heldout.jsonl --max_new_tokens 40
