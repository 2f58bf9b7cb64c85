#!/usr/bin/env bash
# Distillation on the embedded model (docs/distill.md): the quickstart's tuned model (base + outputs/sft_demo, trained
# first if missing) teaches a fresh LoRA on the untuned base by forward KL over the demo replies; the held-out KL to
# the teacher before and after training, then the untuned base's and the distilled student's answers to the held-out
# identity questions, side by side. Extra arguments go to `tunesmith distill` (e.g. --max_steps 20).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
PY=.venv/bin/python
TEACHER=outputs/sft_demo
OUT="${OUT:-outputs/distill_demo}"
if [ ! -f "$TEACHER/adapter_config.json" ]; then
    echo "== 0/3 the teacher: the quickstart's LoRA fine-tune -> $TEACHER"
    "$PY" sft/train.py configs/sft_lora_demo.yaml --output_dir "$TEACHER"
fi
echo "== 1/3 distill $TEACHER into a fresh LoRA on the untuned base -> $OUT"
time "$PY" -m tunesmith distill configs/distill_demo.yaml --teacher_model_name_or_path "$TEACHER" --output_dir "$OUT" "$@"
echo "== 2/3 held-out KL(teacher || student) per reply token, before and after"
"$PY" - "$OUT" <<'PYTHON'
import json, sys
evals = [r for r in json.load(open(f"{sys.argv[1]}/trainer_state.json"))["log_history"] if "eval_kl" in r]
print(f"eval_kl: before {evals[0]['eval_kl']:.3f} (step {evals[0]['step']}) -> after {evals[-1]['eval_kl']:.3f} "
      f"(step {evals[-1]['step']}); eval_loss {evals[0]['eval_loss']:.3f} -> {evals[-1]['eval_loss']:.3f}")
PYTHON
echo "== 3/3 held-out identity questions: untuned base vs distilled student"
"$PY" -m tunesmith compare --adapter_name_or_path "$OUT" --data_path data/demo/identity_heldout.jsonl \
    --count_word Tunesmith
