"""RL rollouts: tunesmith's GRPO against TRL's GRPOTrainer (`--peer trl`), or against tunesmith's PPO, on the same
model, prompts, reward function, group size, completion length and steps.

    python scripts/bench_rl.py --peer trl                 # GRPO vs TRL GRPOTrainer, both bf16, 3 runs each, interleaved
    python scripts/bench_rl.py --variants grpo_bf16,gae_bf16   # GRPO vs PPO (value adapter and head, KL in the reward)
    python scripts/bench_rl.py --peer trl --variants grpo_bf16,trl_bf16,grpo_fp32,trl_fp32

The work is configs/grpo_demo.yaml's (the embedded SmolLM2-135M-Instruct with a fresh LoRA r 16 on every linear
layer; a step samples 8 replies of at most 20 tokens to each of 2 prompts at temperature 0.5, rewards each with
exact_answer, and takes 2 AdamW steps of 8 replies, KL 0.04 to the LoRA-free model in the loss, clip 0.2).
TRL gets the same as a GRPOConfig: num_generations 8, per_device_train_batch_size 8, steps_per_generation 2,
beta 0.04, loss_type bnpo (tokens of the mini-batch, as tunesmith's `loss_aggregation: token`), LoRA through
its peft_config, no gradient checkpointing, and the prompts in tunesmith's seeded order (shuffle_dataset off), so
step k of both samples the same two prompts. Each side otherwise keeps its own defaults. `_bf16` and `_fp32` name
the precision: bf16 is TRL's default (autocast over float32 weights) and tunesmith's `--bf16 true` (a bf16 base
under the float32 LoRA, autocast), float32 is tunesmith's default for RL and TRL's `bf16=False`.

Each run is its own process (benchlib: the variants take turns, each once the cores are idle, with the other
processes' share of the CPU recorded). completions/s counts the steps' own wall time, first step included
(tunesmith: the generate/score/update phases it logs; TRL: train begin to end), not the model loading; peak RSS
is the worker's, loading included. Last line with --peer trl: `completions/s ratio vs TRL GRPOTrainer: X.XX`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (  # noqa: E402
    add_quiet_arguments,
    benchmark_model,
    loaded,
    medians,
    peak_gpu_memory,
    peak_rss_mb,
    run_interleaved,
    run_worker,
    spread,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs/grpo_demo.yaml"
OURS = {  # variant: tunesmith's flags on top of CONFIG
    "grpo_bf16": ["--bf16", "true"],
    "grpo_fp32": ["--bf16", "false"],
    "gae_bf16": ["--advantage", "gae", "--kl_in_loss", "false", "--bf16", "true"],
    "gae_fp32": ["--advantage", "gae", "--kl_in_loss", "false", "--bf16", "false"],
}
PEERS = {"trl_bf16": True, "trl_fp32": False}  # variant: TRL's bf16 (its default: on)
VARIANTS = [*OURS, *PEERS]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peer", choices=["trl"], help="Compare with TRL's GRPOTrainer (variants grpo_bf16,trl_bf16).")
    p.add_argument("--variants", help=f"Comma-separated, of {', '.join(VARIANTS)} (default: grpo_bf16,trl_bf16 "
                                      "with --peer trl, else grpo_bf16,gae_bf16).")
    p.add_argument("--model", default=None, help="Model directory (default: the embedded SmolLM2-135M-Instruct).")
    p.add_argument("--steps", type=int, default=6, help="Rollout batches (tunesmith steps) per run.")
    add_quiet_arguments(p)
    p.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.variants = (args.variants or ("grpo_bf16,trl_bf16" if args.peer else "grpo_bf16,gae_bf16")).split(",")
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    return args


def demo_config() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(CONFIG.read_text())


# ---------------------------------------------------------------- variants


def run_ours(args: argparse.Namespace, workdir: Path) -> dict:
    from tunesmith.recipes.ppo import run

    argv = [str(CONFIG), "--model_name_or_path", args.model, "--max_steps", str(args.steps), "--save_strategy", "no",
            "--rollout_log_samples", "0", "--report_to", "none", "--output_dir", str(workdir / args.worker),
            *OURS[args.worker]]
    trainer = run(argv)
    steps = [r for r in trainer.log_history if "time_generate" in r]
    seconds = [r["time_generate"] + r["time_score"] + r["time_train"] for r in steps]
    return summarize(seconds, [r["score"] for r in steps], trainer.batch_size, trainer.args.bf16)


def run_trl(args: argparse.Namespace, workdir: Path) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tunesmith.ppo.reward_funcs import exact_answer

    demo = demo_config()
    rows = [json.loads(line) for line in (ROOT / demo["data_path"]).read_text().splitlines() if line.strip()]
    # tunesmith's order (PPOTrainer.batch_prompts: a randperm seeded by seed + epoch), so both sample the same prompts
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(demo["seed"])).tolist()
    dataset = Dataset.from_list([{"prompt": rows[i]["messages"], "answer": str(rows[i]["answer"])} for i in order])

    def exact(prompts, completions, answer, **_):  # TRL passes conversational completions as message lists
        return exact_answer(prompts, [c[0]["content"] for c in completions], answer=answer)

    mini_batches = demo["num_mini_batches"]
    config = GRPOConfig(
        output_dir=str(workdir / args.worker), max_steps=args.steps * mini_batches, seed=demo["seed"],
        per_device_train_batch_size=demo["per_device_train_batch_size"] // mini_batches,
        steps_per_generation=mini_batches, num_generations=demo["samples_per_prompt"], num_iterations=demo["ppo_epochs"],
        max_completion_length=demo["max_new_tokens"], temperature=demo["temperature"], beta=demo["kl_coef"],
        epsilon=0.2, loss_type="bnpo", scale_rewards="group", use_bias_correction_kl=False,
        learning_rate=demo["learning_rate"], lr_scheduler_type="constant", shuffle_dataset=False,
        gradient_checkpointing=False, bf16=PEERS[args.worker], use_cpu=not torch.cuda.is_available(),
        disable_dropout=True, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        model_init_kwargs={"dtype": torch.float32},
    )
    lora = LoraConfig(r=demo["lora_r"], lora_alpha=demo["lora_alpha"], lora_dropout=0.05, target_modules="all-linear",
                      task_type="CAUSAL_LM")
    span: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *_, **__):
            span.append(time.perf_counter())

        def on_train_end(self, *_, **__):
            span.append(time.perf_counter())

    trainer = GRPOTrainer(model=args.model, reward_funcs=[exact], args=config, train_dataset=dataset,
                          peft_config=lora, callbacks=[Clock()])
    assert trainer.args.generation_batch_size == demo["per_device_train_batch_size"]  # one rollout batch a step
    trainer.train()
    rewards = [r["reward"] for r in trainer.state.log_history if "reward" in r]  # one per generation
    per_step = (span[1] - span[0]) / args.steps
    return summarize([per_step] * args.steps, rewards, demo["per_device_train_batch_size"], PEERS[args.worker])


def summarize(step_seconds: list[float], rewards: list[float], completions_per_step: int, bf16: bool) -> dict:
    seconds = sum(step_seconds)
    return {"completions_per_s": completions_per_step * len(step_seconds) / seconds,
            "seconds_per_step": seconds / len(step_seconds), "rewards": rewards, "bf16": bool(bf16),
            "peak_rss_mb": peak_rss_mb(), **peak_gpu_memory()}  # both sides train on the GPU when there is one


RUNS = {**dict.fromkeys(OURS, run_ours), **dict.fromkeys(PEERS, run_trl)}


# ---------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if run_worker(args, RUNS):
        return
    args.model = benchmark_model(args.model)
    print(f"model {args.model}\n{CONFIG.relative_to(ROOT)}, {args.steps} rollout batches of 16 completions per run, "
          f"{args.repeats} runs each, interleaved", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_rl.") as tmp:
        os.environ["TUNESMITH_CACHE"] = str(Path(tmp) / "cache")  # the prompts are encoded alike in every run
        results = run_interleaved(__file__, args.variants, args.repeats, Path(tmp),
                                  ["--model", args.model, "--steps", str(args.steps)], args.quiet_share,
                                  lambda r: f"{r['completions_per_s']:.2f} completions/s, {r['seconds_per_step']:.1f} "
                                            f"s/step, peak RSS {r['peak_rss_mb']:.0f} MB, rewards "
                                            + " ".join(f"{x:.2f}" for x in r["rewards"]),
                                  args.settle)
    print_table(results, args.quiet_share)


def print_table(results: dict[str, list[dict]], quiet_share: float) -> None:
    rows = {name: medians(runs) for name, runs in results.items() if runs}
    print(f"\n{'variant':<11}{'bf16':>5}{'completions/s':>14}{'spread':>12}{'s/step':>8}{'peak RSS MB':>12}"
          f"{'other CPU':>10}  mean reward per step (median of runs)")
    for name, r in rows.items():
        runs = results[name]
        curve = [sorted(x["rewards"][i] for x in runs)[len(runs) // 2] for i in range(min(len(x["rewards"]) for x in runs))]
        print(f"{name:<11}{'yes' if r['bf16'] else 'no':>5}{r['completions_per_s']:>14.2f}"
              f"{spread(runs, 'completions_per_s', 2):>12}{r['seconds_per_step']:>8.1f}{r['peak_rss_mb']:>12.0f}"
              f"{max(x['other_cpu'] for x in runs):>10.0%}  {' '.join(f'{x:.2f}' for x in curve)}"
              f"{loaded(runs, quiet_share)}" + (f", peak GPU {r['peak_gpu_mb']:.0f} MB" if "peak_gpu_mb" in r else ""))

    def ratio(a: str, b: str, key: str) -> str:
        return f"{rows[a][key] / rows[b][key]:.2f}" if a in rows and b in rows else "n/a"

    for precision in ("bf16", "fp32"):
        if f"gae_{precision}" in rows and f"grpo_{precision}" in rows:
            grpo, gae = f"grpo_{precision}", f"gae_{precision}"
            print(f"GRPO / PPO ({precision}): {ratio(grpo, gae, 'completions_per_s')}x the completions/s, "
                  f"{ratio(grpo, gae, 'peak_rss_mb')}x the peak RSS")
    if "grpo_fp32" in rows and "trl_fp32" in rows:
        print(f"float32 both: completions/s ratio {ratio('grpo_fp32', 'trl_fp32', 'completions_per_s')}, "
              f"peak RSS ratio {ratio('grpo_fp32', 'trl_fp32', 'peak_rss_mb')}")
    if "grpo_fp32" in rows and "trl_bf16" in rows:
        print(f"each at its default precision (tunesmith float32, TRL bf16): completions/s ratio "
              f"{ratio('grpo_fp32', 'trl_bf16', 'completions_per_s')}")
    if "trl_bf16" in rows:  # both in bf16, TRL's default
        print(f"peak RSS ratio vs TRL GRPOTrainer: {ratio('grpo_bf16', 'trl_bf16', 'peak_rss_mb')}")
        print(f"completions/s ratio vs TRL GRPOTrainer: {ratio('grpo_bf16', 'trl_bf16', 'completions_per_s')}")


if __name__ == "__main__":
    main()
