"""Mixture-of-experts SFT: transformers' experts kernels (--experts_implementation) against each other and against
TRL's SFTTrainer, on small random models of two shapes, as medians of repeated runs.

    .venv/bin/python -m benchmarks.moe [--shapes qwen3_moe,mixtral] [--steps 4] [--rows 4] [--repeats 3]
                                       [--variants eager,grouped_mm,batched_mm,trl]

The shapes (2 layers, hidden 128, the default model's tokenizer and its 49,152-token vocabulary, float32 weights
drawn at random and saved once):
  qwen3_moe   many small experts: 64 of intermediate 64, top-8 (Qwen3-30B-A3B routes 8 of 128, intermediate 768)
  mixtral     few large experts: 8 of intermediate 448, top-2 (Mixtral-8x7B: 8 of 14,336, top-2)
The variants, each the same LoRA (r 16, alpha 32, no dropout, every linear layer and the experts' fused weights
through PEFT's target_parameters) trained with AdamW for --steps optimizer steps on the same --rows conversations a
step (the SFT benchmark's set), float32 (--bf16 false):
  eager, grouped_mm, batched_mm   `tunesmith sft --packing true --experts_implementation K` (one padding-free row)
  trl                             TRL's SFTTrainer (packing=True, padding_free, bf16=False) on the same model, data
                                  and LoRA; the model loaded as TRL's docs load one (transformers' default experts:
                                  grouped_mm in transformers 5.x)
The first step is a warm-up and is not timed: tokens/s is the tokens of the rows (positions computed) from step 2 on
over the time from the end of step 1 to the end of the last step. Peak RSS is the worker process's. Each run is its
own subprocess; the variants take turns, --repeats times, each once the cores are idle (benchmarks/common.py: the
1-minute load average before each run and the share of the cores other processes took meanwhile are recorded beside
every timing; '(loaded)' marks a variant one of whose runs shared the cores).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from pathlib import Path
from typing import Any

from benchmarks.common import (
    TIMED_TRAINER,
    CountingCollator,
    add_quiet_arguments,
    add_worker_arguments,
    benchmark_model,
    check_choices,
    loaded,
    logged_losses,
    medians,
    peak_rss_mb,
    run_interleaved,
    run_worker,
    scratch,
    spread,
    trainer_clock,
)

COMMON = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 32, "max_position_embeddings": 4096, "initializer_range": 0.02, "tie_word_embeddings": False}
SHAPES = {
    "qwen3_moe": {"num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 64, "intermediate_size": 256,
                  "decoder_sparse_step": 1},
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 448},
}
KERNELS = ("eager", "grouped_mm", "batched_mm")
VARIANTS = (*KERNELS, "trl")
LORA_R = 16


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"Comma-separated subset of {', '.join(SHAPES)}.")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"Comma-separated subset of {', '.join(VARIANTS)}.")
    p.add_argument("--steps", type=int, default=4, help="Optimizer steps per run (the first untimed).")
    p.add_argument("--rows", type=int, default=4, help="Conversations per step.")
    p.add_argument("--max_seq_length", type=int, default=512)
    p.add_argument("--model", help=argparse.SUPPRESS)  # the tokenizer's folder (default: the embedded model's)
    add_quiet_arguments(p)
    add_worker_arguments(p)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    check_choices(p, "shapes", args.shapes, SHAPES)
    check_choices(p, "variants", args.variants, VARIANTS)
    return args


def build_model(shape: str, tokenizer_dir: str, out: Path) -> str:
    """A random `shape` model saved in float32 with the default model's tokenizer beside it."""
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = CONFIG_MAPPING[shape](vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                   **COMMON, **SHAPES[shape])
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def write_data(args: argparse.Namespace, workdir: Path) -> str:
    """The SFT benchmark's conversations, as many as the run trains on."""
    from benchmarks.sft import benchmark_conversations

    path = workdir / "bench.jsonl"
    rows = benchmark_conversations(args.steps * args.rows, max_turns=3)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def positions(batch: dict) -> int:
    """The positions a batch computes (its padding left out)."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else batch["input_ids"].numel()


def summarize(clock: Any, positions: list[int], losses: list[float]) -> dict:
    timed = range(2, len(clock.ends) + 1)  # step s timed from the end of step s-1
    seconds = sum(clock.ends[s - 1] - clock.ends[s - 2] for s in timed)
    tokens = sum(positions[s - 1] for s in timed)
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds, "peak_rss_mb": peak_rss_mb(),
            "losses": losses}


def run_tunesmith(kernel: str, args: argparse.Namespace, workdir: Path) -> dict:
    from tunesmith.sft.command import run
    from tunesmith.train import stage_trainer

    clock, callback = trainer_clock()
    counted: list[CountingCollator] = []
    init = stage_trainer.StageTrainer.__init__

    def counting_init(self: Any, *a: Any, **kw: Any) -> None:  # the clock and the token count, nothing else
        kw["callbacks"] = [*(kw.get("callbacks") or []), callback]
        counted.append(CountingCollator(kw["data_collator"], positions))
        kw["data_collator"] = counted[0]
        init(self, *a, **kw)

    stage_trainer.StageTrainer.__init__ = counting_init
    trainer = run(["--model_name_or_path", str(workdir / args.shape), "--data_path", str(workdir / "bench.jsonl"),
                   "--output_dir", str(workdir / f"out_{kernel}"), "--max_steps", str(args.steps),
                   "--per_device_train_batch_size", str(args.rows), "--packing", "true", "--bf16", "false",
                   "--lora_r", str(LORA_R), "--lora_alpha", str(2 * LORA_R), "--lora_dropout", "0",
                   "--max_seq_length", str(args.max_seq_length), "--experts_implementation", kernel,
                   "--save_strategy", "no", "--plot_loss", "false", "--logging_steps", "1", "--report_to", "none",
                   "--seed", "0"])
    return summarize(clock, counted[0].counts, logged_losses(trainer))


def run_trl(args: argparse.Namespace, workdir: Path) -> dict:
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from tunesmith.models.loader import find_lora_targets
    from tunesmith.models.moe import fused_expert_parameters

    folder = str(workdir / args.shape)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    peft_config = LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=0.0, task_type="CAUSAL_LM",
                             target_modules=find_lora_targets(model), target_parameters=fused_expert_parameters(model))
    dataset = load_dataset("json", data_files=str(workdir / "bench.jsonl"), split="train")
    config = SFTConfig(output_dir=str(workdir / "out_trl"), max_steps=args.steps, per_device_train_batch_size=1,
                       learning_rate=2e-4, use_cpu=True, bf16=False, gradient_checkpointing=False,
                       max_length=args.rows * args.max_seq_length, packing=True, assistant_only_loss=False, seed=0,
                       **TIMED_TRAINER)
    clock, callback = trainer_clock()
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_config, callbacks=[callback])
    trainer.data_collator = counted = CountingCollator(trainer.data_collator, positions)
    trainer.train()
    return {**summarize(clock, counted.counts, logged_losses(trainer)),
            "experts": trainer.model.get_base_model().config._experts_implementation}


RUNS = {**{kernel: functools.partial(run_tunesmith, kernel) for kernel in KERNELS}, "trl": run_trl}


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if run_worker(args, RUNS):
        return
    tokenizer_dir = benchmark_model(args.model)
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, threads {torch.get_num_threads()}; steps {args.steps} "
          f"(first untimed), {args.rows} conversations a step, {args.repeats} runs each, interleaved", flush=True)
    tables = {}
    for shape in args.shapes.split(","):
        with scratch(__spec__.name) as workdir:
            build_model(shape, tokenizer_dir, workdir / shape)
            write_data(args, workdir)
            print(f"\n{shape}: {json.dumps({**COMMON, **SHAPES[shape]})}", flush=True)
            worker_args = ["--shape", shape, "--steps", str(args.steps), "--rows", str(args.rows),
                           "--max_seq_length", str(args.max_seq_length)]
            tables[shape] = run_interleaved(__spec__.name, args.variants.split(","), args.repeats, workdir, worker_args,
                                            args.quiet_share,
                                            lambda r: f"{r['tokens_per_s']:.1f} tokens/s, peak RSS "
                                                      f"{r['peak_rss_mb']:.0f} MB", args.settle)
    for shape, results in tables.items():
        print_table(shape, results, args.quiet_share)


def print_table(shape: str, results: dict[str, list[dict]], quiet_share: float) -> None:
    rows = {name: medians(runs) for name, runs in results.items() if runs}
    print(f"\n{shape}\n{'variant':<12}{'tokens/s':>9}{'spread':>13}{'vs eager':>9}{'peak RSS MB':>12}"
          f"{'loss first -> last':>20}{'1-min load':>11}{'other CPU':>10}")
    eager = rows.get("eager", {}).get("tokens_per_s")
    for name, r in rows.items():
        runs = results[name]
        versus = f"{r['tokens_per_s'] / eager:.2f}" if eager else "-"
        loads = "/".join(f"{x['load']:.1f}" for x in runs)
        print(f"{name:<12}{r['tokens_per_s']:>9.1f}{spread(runs, 'tokens_per_s', 1):>13}{versus:>9}"
              f"{r['peak_rss_mb']:>12.0f}{r['losses'][0]:>10.3f} -> {r['losses'][-1]:.3f}{loads:>11}"
              f"{max(x['other_cpu'] for x in runs):>10.0%}{loaded(runs, quiet_share)}"
              + (f"  (experts: {r['experts']})" if "experts" in r else ""))


if __name__ == "__main__":
    main()
