#!/usr/bin/env bash
# The GPU checks of issue 31 in two device calls, on a machine lent through the `device` tool. It needs the kit of
# ../shared/gpu (`bash ../shared/gpu/prepare.sh` here once fills .gpu/, then every call carries [".gpu"]):
#
#   bash scripts/gpu_check.sh stages   every stage on CUDA: `.gpu/run.sh train` beside `pytest -m gpu`, then
#                                      `.gpu/run.sh use`; one `STAGE name rc=N` line each (about 7 minutes)
#   bash scripts/gpu_check.sh bench    benchmarks.sft against TRL packed at batch 8 and 32 and on QLoRA, then
#                                      VARIANTS (default ours_row_capped,ours_compiled) at batch 8 (about 5)
#   bash scripts/gpu_check.sh memory   issue 40: the gpu tests of checkpointing, offload, the tiled head and the
#                                      forward budget, then benchmarks.sft's memory rows at tunesmith's defaults against
#                                      TRL packed: 1.07B QLoRA and LoRA at 2048, a Qwen2.5-1.5B shape at 4096 (about 9)
#   bash scripts/gpu_check.sh context  issue 52: the Llama-3.1-8B shape, QLoRA, one conversation of 400,000 tokens
#                                      (--tiled_mlp, offloaded layer inputs: about 100 GB of pinned host memory),
#                                      then ours and TRL at its best (activation offloading) at 131,072 tokens for
#                                      the speed ratio, within BUDGET; CONTEXT_ARGS replaces the first call's flags
#                                      (issue 40's Qwen2.5-1.5B LoRA search: CONTEXT_ARGS="--model /tmp/q15
#                                      --method lora --variants ours,ours_offload,trl --start 8192 --time_budget 60")
#   bash scripts/gpu_check.sh auto     issue 52, items 4-5: the gpu tests of layer modes and offload, benchmarks.sft's
#                                      1.07B QLoRA at the new default (auto) against TRL packed and against every
#                                      layer recomputed, again with the card capped at CAP_GB (default 5.3, TRL
#                                      packed QLoRA's peak there), then one long conversation under a 20 GiB cap
#                                      (auto against checkpointing and offload) (about 9 minutes)
#   bash scripts/gpu_check.sh rl       issue 62: GRPO's rollouts on a vLLM server on the same GPU against tunesmith's
#                                      engine (benchmarks.rl --rollout_engine vllm: sampling, weight sync and update per
#                                      step), then the vllm test tier. vLLM's CUDA wheel (~400 MB) does not fit a
#                                      call's 64 MiB: it runs where the machine has vLLM installed, and says so where not
#
# Run the second right after the first, while the machine is warm (it goes back after 30 s idle, and a start
# costs device time). BUDGET (seconds, default 540) bounds a call: what no longer fits is skipped and says so.
# Benchmarks never run with --profile here, and never beside anything else on the GPU. Logs go to $OUT, which
# returns at most 8 files: the summaries are printed.
set -u
S=$(date +%s); OUT=${OUT:-/tmp/gpu-out}; export OUT; mkdir -p "$OUT"
elapsed() { echo $(( $(date +%s) - S )); }
left() { echo $(( ${BUDGET:-540} - $(elapsed) )); }
case "${1:-}" in stages|bench|memory|context|auto|rl) ;; *) echo "usage: bash scripts/gpu_check.sh stages|bench|memory|context|auto|rl"; exit 2 ;; esac
[ -f .gpu/run.sh ] || { echo "gpu_check: no .gpu/run.sh: run bash ../shared/gpu/prepare.sh here first"; exit 2; }
bash .gpu/run.sh shell true > "$OUT/setup.log" 2>&1 || { tail -n 5 "$OUT/setup.log"; exit 1; }
grep -E "^gpu:|random weights" "$OUT/setup.log"; echo "setup done at $(elapsed)s"
G=$PWD/.gpu; export PYTHONPATH=$G/bnb:/tmp/site:$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

shape() {  # NAME: random bf16 weights of a real shape in /tmp/NAME with the default model's tokenizer (q15, l8b)
  python3 - "$1" "$G/tok" <<'PY' 2>&1 | grep -v "Writing model"
import os, shutil, sys, torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config
name, tok = sys.argv[1], sys.argv[2]
folder = f"/tmp/{name}"
if not os.path.exists(f"{folder}/config.json"):
    shapes = {  # Qwen2.5-1.5B and Llama-3.1-8B as their config.json give them (rope scaling left out)
        "q15": lambda: Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                                   num_key_value_heads=2, vocab_size=151936, max_position_embeddings=131072,
                                   tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6, bos_token_id=1,
                                   eos_token_id=2, pad_token_id=2),
        "l8b": lambda: LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                                   num_key_value_heads=8, vocab_size=128256, max_position_embeddings=524288,
                                   tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5, bos_token_id=1,
                                   eos_token_id=2, pad_token_id=2)}
    torch.manual_seed(0)
    config = shapes[name](); config.dtype = "bfloat16"
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    for f in os.listdir(tok):
        if f not in ("config.json", "tokenizer.json.gz"):
            shutil.copy(os.path.join(tok, f), folder)
    print(f"{folder}: random weights, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters")
PY
}

bench() {  # NAME MIN_SECONDS BENCH_SFT_FLAGS...: one benchmarks.sft call if MIN_SECONDS are left, then its table
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "skip $name: $(left)s left"; return; fi
  timeout $(( $(left) - 5 )) python3 -m benchmarks.sft --model /tmp/m1b --repeats 1 --settle 3 --max_seq_length 2048 \
    --conversations 400 "$@" > "$OUT/bench_$name.log" 2>&1
  echo "== $name (done at $(elapsed)s)"
  grep -E "^(variant|ours|trl)|ratio|failed|Error" "$OUT/bench_$name.log" | grep -v "n/a" | cut -c1-220 | tail -n 12
}

case "${1:-}" in
stages)
  # pytest's two halves and the train stages share the GPU; their own timeouts keep the call inside BUDGET
  P="python3 -m pytest -q -p no:cacheprovider -m gpu tests/system/test_gpu.py"
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
memory)
  shape q15; echo "shapes done at $(elapsed)s"
  bench qlora 100 --batch_size 8 --steps 15 --variants ours_qlora,trl_packed_qlora,ours_qlora_no_gc
  bench lora 100 --batch_size 8 --steps 25 --variants ours,trl_packed,ours_gc
  bench q15 130 --model /tmp/q15 --max_seq_length 4096 --max_turns 30 --batch_size 8 --steps 10 \
    --variants ours,trl_packed,ours_gc
  grep -h "forwards of at most\|activation checkpointing on" "$OUT"/bench_*.log | cut -c1-200 | sort | uniq -c | head -n 6
  timeout $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider -m gpu tests/system/test_gpu.py -s -k "offloaded or \
tiled or packed_logits_equal or (test_sft and (packed or offload or qlora))" > "$OUT/pytest.log" 2>&1
  echo "-- pytest -m gpu (done at $(elapsed)s)"; grep -E "peak above|passed|failed|Error" "$OUT/pytest.log" | tail -n 8 ;;
context)
  case "${CONTEXT_ARGS:-/tmp/l8b}" in *q15*) shape q15 ;; *) shape l8b ;; esac; echo "shapes done at $(elapsed)s"
  timeout $(( $(left) - 10 )) python3 -m benchmarks.context \
    ${CONTEXT_ARGS:---model /tmp/l8b --method qlora --no_search --variants ours_offload_tiled --lengths 400000 \
    --steps 1 --memory_gb 120} > "$OUT/context.log" 2>&1
  echo "-- benchmarks.context (done at $(elapsed)s)"; grep -v -iE "warning|Loading weights|it/s\]" "$OUT/context.log" | tail -n 20
  if [ -z "${CONTEXT_ARGS:-}" ] && [ "$(left)" -gt 200 ]; then
    timeout $(( $(left) - 10 )) python3 -m benchmarks.context --model /tmp/l8b --method qlora --no_search \
      --variants ours_auto_tiled,trl_offload --lengths 131072 --steps 2 --memory_gb 120 > "$OUT/context_ratio.log" 2>&1
    echo "-- ratio at 131072 (done at $(elapsed)s)"; grep -v -iE "warning|Loading weights|it/s\]" "$OUT/context_ratio.log" | tail -n 20
  fi ;;
auto)
  timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/system/test_gpu.py -s -k "layer_modes or offloaded or \
(test_sft and (packed or qlora))" > "$OUT/pytest.log" 2>&1
  echo "-- pytest -m gpu (done at $(elapsed)s)"; grep -E "^(rates|free|peak above)|passed|failed|Error" "$OUT/pytest.log" | cut -c1-240 | tail -n 12
  bench qlora 150 --batch_size 8 --steps 12 --variants ours_qlora,trl_packed_qlora,ours_qlora_gc
  bench qlora_capped 110 --batch_size 8 --steps 12 --gpu_memory_gb "${CAP_GB:-5.3}" --variants ours_qlora,ours_qlora_gc
  grep -h "forwards of at most\|a forward of" "$OUT"/bench_*.log | cut -c1-240 | sort | uniq -c | head -n 8
  if [ "$(left)" -gt 60 ]; then
    timeout $(( $(left) - 5 )) python3 -m benchmarks.context --model /tmp/m1b --method qlora --no_search \
      --variants ours_auto,ours_gc,ours_offload --lengths 131072 --steps 1 --gpu_memory_gb 20 > "$OUT/context.log" 2>&1
    echo "-- benchmarks.context (done at $(elapsed)s)"
    grep -v -iE "warning|Loading weights|it/s\]" "$OUT/context.log" | grep -E "ours|forwards|forward of|Error" | cut -c1-240 | tail -n 16
  else echo "skip benchmarks.context: $(left)s left"; fi ;;
rl)
  if ! python3 -c "import vllm" 2>/dev/null; then
    echo "rl: vllm is not importable on this machine (its wheel cannot be carried in a call): nothing measured"; exit 1
  fi
  timeout $(( $(left) - 120 )) python3 -m benchmarks.rl --rollout_engine vllm --variants grpo_fp32,grpo_vllm_fp32 \
    --repeats 2 --settle 3 > "$OUT/bench_rl.log" 2>&1
  echo "-- benchmarks.rl (done at $(elapsed)s)"; grep -E "^(variant|grpo)|per step|Error" "$OUT/bench_rl.log" | cut -c1-240 | tail -n 8
  timeout $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider -m vllm tests/features/rl/test_vllm.py > "$OUT/vllm.log" 2>&1
  echo "-- pytest -m vllm (done at $(elapsed)s)"; tail -n 3 "$OUT/vllm.log" ;;
esac
echo "all done at $(elapsed)s"
