#!/usr/bin/env bash
# The main job, with no set-up beyond this script: LoRA SFT of the embedded SmolLM2-135M-Instruct
# on the shipped demo conversations (a new identity: Tunesmith), then the base model's and the
# fine-tuned model's answers to held-out identity questions, side by side, and both models scored by
# lm-evaluation-harness on what was taught (identity) and what should not be forgotten (knowledge).
# Extra arguments go to `tunesmith sft` (e.g. --max_steps 20 for a shorter run).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
PY=.venv/bin/python
OUT="${OUT:-outputs/sft_demo}"
echo "== 1/4 which tokens are trained (first 2 demo conversations)"
"$PY" -m tunesmith inspect --data_path data/demo/sft.jsonl --max_samples 2 --show 2
echo "== 2/4 LoRA fine-tune on data/demo/sft.jsonl -> $OUT"
time "$PY" -m tunesmith sft configs/sft_lora_demo.yaml --output_dir "$OUT" "$@"
echo "== 3/4 held-out identity questions: base vs fine-tuned"
"$PY" -m tunesmith compare --adapter_name_or_path "$OUT" --data_path data/demo/identity_heldout.jsonl \
    --count_word Tunesmith
echo "== 4/4 lm-evaluation-harness, base vs fine-tuned: the identity taught, and general knowledge (forgetting?)"
"$PY" -m tunesmith eval --adapter_name_or_path "$OUT" --tasks tunesmith_identity,tunesmith_knowledge \
    --apply_chat_template --compare_to base --output_path "$OUT/eval"
echo
echo "Loss curve: $OUT/loss.png. Next: tunesmith merge --adapter_name_or_path $OUT --output_dir outputs/sft_demo_merged"
