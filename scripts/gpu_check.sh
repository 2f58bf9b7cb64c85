#!/usr/bin/env bash
# The GPU checks of issue 31 in two device calls, on a machine lent through the `device` tool. It needs the kit of
# ../shared/gpu (`bash ../shared/gpu/prepare.sh` here once fills .gpu/, then every call carries [".gpu"]):
#
#   bash scripts/gpu_check.sh stages   every stage on CUDA: `.gpu/run.sh train` beside `pytest -m gpu`, then
#                                      `.gpu/run.sh use`; one `STAGE name rc=N` line each (about 7 minutes)
#   bash scripts/gpu_check.sh bench    bench_sft against TRL packed at batch 8 and 32 and on QLoRA, then
#                                      VARIANTS (default ours_row_capped,ours_compiled) at batch 8 (about 5)
#
# Run the second right after the first, while the machine is warm (it goes back after 30 s idle, and a start
# costs device time). BUDGET (seconds, default 540) bounds a call: what no longer fits is skipped and says so.
# Benchmarks never run with --profile here, and never beside anything else on the GPU. Logs go to $OUT, which
# returns at most 8 files: the summaries are printed.
set -u
S=$(date +%s); OUT=${OUT:-/tmp/gpu-out}; export OUT; mkdir -p "$OUT"
elapsed() { echo $(( $(date +%s) - S )); }
left() { echo $(( ${BUDGET:-540} - $(elapsed) )); }
case "${1:-}" in stages|bench) ;; *) echo "usage: bash scripts/gpu_check.sh stages|bench"; exit 2 ;; esac
[ -f .gpu/run.sh ] || { echo "gpu_check: no .gpu/run.sh: run bash ../shared/gpu/prepare.sh here first"; exit 2; }
bash .gpu/run.sh shell true > "$OUT/setup.log" 2>&1 || { tail -n 5 "$OUT/setup.log"; exit 1; }
grep -E "^gpu:|random weights" "$OUT/setup.log"; echo "setup done at $(elapsed)s"
G=$PWD/.gpu; export PYTHONPATH=$G/bnb:/tmp/site:$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

bench() {  # NAME MIN_SECONDS BENCH_SFT_FLAGS...: one bench_sft call if MIN_SECONDS are left, then its table
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "skip $name: $(left)s left"; return; fi
  timeout $(( $(left) - 5 )) python3 scripts/bench_sft.py --model /tmp/m1b --repeats 1 --settle 3 --max_seq_length 2048 \
    --conversations 400 "$@" > "$OUT/bench_$name.log" 2>&1
  echo "== $name (done at $(elapsed)s)"
  grep -E "^(variant|ours|trl)|ratio|failed|Error" "$OUT/bench_$name.log" | grep -v "n/a" | cut -c1-220 | tail -n 12
}

case "${1:-}" in
stages)
  # pytest's two halves and the train stages share the GPU; their own timeouts keep the call inside BUDGET
  P="python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py"
  ( timeout 200 $P -k "flash_varlen or packed or padded or reward or serve" > "$OUT/pytest1.log" 2>&1 ) &
  ( timeout 200 $P -k "qlora or full or dpo or grpo or merge" > "$OUT/pytest2.log" 2>&1 ) &
  STAGE_S=100 timeout $(( $(left) - 150 )) bash .gpu/run.sh train > /dev/null 2>&1
  pkill -f "output_dir /tmp/gpu-runs" 2>/dev/null  # a stage the timeout cut (timeout stops run.sh, not its child)
  cp "$OUT/stages.txt" "$OUT/train.txt" 2>/dev/null; cp "$OUT/stages.log" "$OUT/train.log" 2>/dev/null
  STAGE_S=80 timeout $(( $(left) - 10 )) bash .gpu/run.sh use > /dev/null 2>&1
  wait
  echo "-- train"; cat "$OUT/train.txt" 2>/dev/null; echo "-- use"; cat "$OUT/stages.txt" 2>/dev/null
  echo "-- pytest -m gpu"; tail -n 2 "$OUT/pytest1.log" "$OUT/pytest2.log" ;;
bench)
  bench b8 80 --batch_size 8 --steps 25 --variants ours,trl_packed
  bench b32 80 --batch_size 32 --steps 12 --variants ours,trl_packed
  bench qlora 70 --batch_size 8 --steps 15 --variants ours_qlora,trl_packed_qlora
  bench extra 60 --batch_size 8 --steps 25 --variants "${VARIANTS:-ours_row_capped,ours_compiled}" ;;
esac
echo "all done at $(elapsed)s"
