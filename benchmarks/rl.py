"""RL rollouts: tunesmith's GRPO against TRL's GRPOTrainer (`--peer trl`), or against tunesmith's PPO, on the same
model, prompts, reward function, group size, completion length, loss and steps; and the same with a tool called in
the rollouts.

    python -m benchmarks.rl --peer trl                 # both workloads vs TRL, bf16, dapo, 3 runs each, interleaved
    python -m benchmarks.rl --peer trl --variants grpo_bf16,trl_bf16             # the arithmetic workload alone
    python -m benchmarks.rl --peer trl --variants grpo_tools_bf16,trl_tools_bf16 --adapter outputs/sft_tools_demo
    python -m benchmarks.rl --variants grpo_bf16,gae_bf16   # GRPO vs PPO (value adapter and head, KL in the reward)
    python -m benchmarks.rl --peer trl --variants grpo_bf16,trl_bf16,grpo_fp32,trl_fp32 --loss_type bnpo
    python -m benchmarks.rl --rollout_engine vllm --variants grpo_fp32,grpo_vllm_fp32   # rollouts on a vLLM server
    VLLM_PY=~/.cache/tunesmith/vllm-venv/bin/python   # vLLM colocated, tunesmith's and TRL's (setup_vllm.sh --colocate)
    $VLLM_PY -m benchmarks.rl --variants grpo_colocated_fp32,trl_vllm_fp32

Two workloads, each tunesmith's (`grpo_*`) against TRL's (`trl_*`), each a demo config's work:
- arithmetic (grpo_bf16 / trl_bf16): configs/grpo_demo.yaml. The embedded SmolLM2-135M-Instruct with a fresh LoRA
  r 16 on every linear layer; a step samples 8 replies of at most 20 tokens to each of 2 prompts at temperature 0.5,
  rewards each with exact_answer, and takes 2 AdamW steps of 8 replies, KL 0.04 (k3) to the LoRA-free model in the
  loss, clip 0.2.
- tools (grpo_tools_bf16 / trl_tools_bf16): configs/grpo_tools_demo.yaml. Multiplications of a 3-digit by a 2-digit
  number (data/demo/grpo_tools_train.jsonl), its tool offered (tunesmith.rl.tool_funcs:multiply, the same function
  on both sides), at most 1 call a trajectory, rewarded by final_number (the last line states the product), 2
  prompts x 8 trajectories at temperature 0.8, learning rate 2e-4, the rest as above. The policy starts from
  --adapter (default the config's, outputs/sft_tools_demo, the tool-calling LoRA scripts/tool_demo.sh trains, when it
  exists; `none`: a fresh LoRA): both sides train it, the KL to it as it was. What the bench changes so that TRL can
  do the same: no dynamic sampling (TRL has none), and one budget of 80 tokens for the whole trajectory, the model's
  turns and the tool result together (TRL's max_completion_length; tunesmith's --max_trajectory_tokens, and each
  turn's --max_new_tokens). The template is tunesmith's chatml_tools on both sides; the tool results are context,
  not trained, on both.
The loss is --loss_type on both sides: dapo, TRL 1.16's default (every trained token of the optimizer step weighs
the same), or another of the names they share.

TRL 1.16 gets the same as a GRPOConfig: num_generations 8, per_device_train_batch_size 8, steps_per_generation 2,
beta 0.04, epsilon 0.2 (epsilon_high its default, = epsilon: the clip symmetric, as tunesmith's), loss_type,
scale_rewards group, use_bias_correction_kl off (tunesmith's k3 KL has no importance weight), LoRA through its
peft_config (or the adapter as a trainable PeftModel, which TRL copies as its frozen "ref" adapter), no gradient
checkpointing, and the prompts in tunesmith's seeded order (shuffle_dataset off), so step k of both samples the same
two prompts. Its reward function decodes the completion's tokens as tunesmith does (the whole trajectory, special
tokens skipped) and calls the same function. With tools: tools=[the function], max_tool_calling_iterations = the
config's max_tool_calls, and the tokenizer's response_template set to TRL's own Qwen3 one
(`<tool_call>{json}</tool_call>`, the call format chatml_tools teaches; TRL's add_response_schema recognises no
template but the models' own). Each side otherwise keeps its own defaults. `_bf16` and `_fp32` name the precision:
bf16 is TRL's default (autocast over float32 weights) and tunesmith's `--bf16 true` (a bf16 base under the float32
LoRA, autocast), float32 is tunesmith's default for RL and TRL's `bf16=False`.

`--rollout_engine vllm` adds the variant `grpo_vllm_fp32` (or replaces tunesmith's variants' engine): the same run
with its rollouts on a vLLM server (`--vllm_url`, or one the bench starts before the runs, float32, outside the timed
steps; scripts/setup_vllm.sh builds its venv), and the table splits each step's time into sampling, weight sync
(the adapter handed to the server), scoring and update. Colocated against TRL: `grpo_colocated_fp32` (tunesmith with
vLLM in its process) and `trl_vllm_fp32` (TRL's GRPOTrainer, `use_vllm=True, vllm_mode="colocate"`, token-truncated
importance sampling at the same cap), run where vLLM and both trainers share one Python (vLLM's venv after
`bash scripts/setup_vllm.sh --colocate`):
    ~/.cache/tunesmith/vllm-venv/bin/python -m benchmarks.rl --variants grpo_colocated_fp32,trl_vllm_fp32 --steps 3
TRL's server mode sends weights over NCCL, which a CPU cannot: `scripts/gpu_check.sh rl` runs it on a GPU.

Each run is its own process (benchmarks/common.py: the variants take turns, each once the cores are idle, with the other
processes' share of the CPU recorded). completions/s counts the steps' own wall time, first step included
(tunesmith: the generate/score/update phases it logs; TRL: train begin to end), not the model loading; peak RSS
is the worker's, loading included. The table gives, per variant, the medians of the runs, and the mean reward per
step (the batch's accuracy: both rewards are 0 or 1) and, with tools, the calls per completion per step, each the
median over the runs. Last lines with --peer trl: the peak RSS ratios, then `completions/s ratio vs TRL
GRPOTrainer: X.XX` (arithmetic) and `completions/s ratio vs TRL GRPOTrainer (tools): X.XX`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ROOT,
    add_quiet_arguments,
    add_worker_arguments,
    benchmark_model,
    loaded,
    medians,
    peak_gpu_memory,
    peak_rss_mb,
    run_interleaved,
    run_worker,
    scratch,
    spread,
)

CONFIGS = {False: ROOT / "configs/grpo_demo.yaml", True: ROOT / "configs/grpo_tools_demo.yaml"}  # by is_tools
OURS = {  # variant: tunesmith's flags on top of its workload's config
    "grpo_bf16": ["--bf16", "true"],
    "grpo_fp32": ["--bf16", "false"],
    "gae_bf16": ["--advantage", "gae", "--kl_in_loss", "false", "--bf16", "true"],
    "gae_fp32": ["--advantage", "gae", "--kl_in_loss", "false", "--bf16", "false"],
    "grpo_tools_bf16": ["--bf16", "true"],
    "grpo_tools_fp32": ["--bf16", "false"],
    "grpo_vllm_fp32": ["--bf16", "false", "--rollout_engine", "vllm"],
    # colocated: vLLM in the worker's process (no --vllm_url), as TRL's vllm_mode="colocate" below
    "grpo_colocated_fp32": ["--bf16", "false", "--rollout_engine", "vllm", "--vllm_kv_cache_gib", "2"],
}
SERVER_VARIANTS = {"grpo_vllm_fp32"}  # the ones that sample on the server the bench starts (or --vllm_url)
PEERS = {"trl_bf16": True, "trl_fp32": False, "trl_tools_bf16": True, "trl_tools_fp32": False,  # TRL's bf16
         "trl_vllm_fp32": False}
TRL_COLOCATED = {"trl_vllm_fp32"}  # use_vllm=True, vllm_mode="colocate"
# run only where vLLM and both trainers share one Python (vLLM's venv after scripts/setup_vllm.sh --colocate)
COLOCATED_VARIANTS = {"grpo_colocated_fp32", *TRL_COLOCATED}
VARIANTS = [*OURS, *PEERS]
# Names both trainers give the same loss. Left out: cispo (tunesmith caps the ratio at 1 + epsilon_high, TRL at
# epsilon_high) and luspo (needs sequence-level ratios, which this bench does not set).
LOSS_TYPES = ("dapo", "bnpo", "grpo", "dr_grpo", "sapo", "vespo")
# The tools workload's trajectories, the model's turns and the tool results together: TRL's max_completion_length
# bounds the whole, so tunesmith gets it as --max_trajectory_tokens and as each turn's --max_new_tokens. Room for a
# call (30-40 tokens from the tool demo's adapter), its result as the template wraps it (~10) and the answer (~15).
TRAJECTORY_TOKENS = 80


def is_tools(variant: str) -> bool:
    return "_tools_" in variant


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peer", choices=["trl"], help="Compare with TRL's GRPOTrainer (variants grpo_bf16,trl_bf16,"
                                                   "grpo_tools_bf16,trl_tools_bf16).")
    p.add_argument("--variants", help=f"Comma-separated, of {', '.join(VARIANTS)} (default: grpo_bf16,trl_bf16,"
                                      "grpo_tools_bf16,trl_tools_bf16 with --peer trl, else grpo_bf16,gae_bf16).")
    p.add_argument("--model", default=None, help="Model directory (default: the embedded SmolLM2-135M-Instruct).")
    p.add_argument("--adapter", default=None,
                   help="The LoRA adapter the tools variants start from (both sides train it), or `none` for a fresh "
                        "LoRA. Default: configs/grpo_tools_demo.yaml's (outputs/sft_tools_demo, from "
                        "scripts/tool_demo.sh) when it holds one, else a fresh LoRA.")
    p.add_argument("--loss_type", default="dapo", choices=LOSS_TYPES,
                   help="The policy loss on both sides (default dapo, TRL's default).")
    p.add_argument("--steps", type=int, default=6, help="Rollout batches (tunesmith steps) per run.")
    p.add_argument("--rollout_engine", choices=["tunesmith", "vllm"], default="tunesmith",
                   help="vllm: the grpo_vllm_* variants sample on a vLLM server (--vllm_url, or one the bench starts).")
    p.add_argument("--vllm_url", default=None, help="A running vLLM server of --model, float32 (tunesmith vllm-serve).")
    add_quiet_arguments(p)
    add_worker_arguments(p, VARIANTS)
    args = p.parse_args(argv)
    default = "grpo_bf16,trl_bf16,grpo_tools_bf16,trl_tools_bf16" if args.peer else "grpo_bf16,gae_bf16"
    if args.rollout_engine == "vllm" and not args.variants:
        default = "grpo_fp32,grpo_vllm_fp32"
    args.variants = (args.variants or default).split(",")
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    return args


def resolve_adapter(adapter: str | None) -> str:
    """The adapter folder the tools variants start from, or "none" for a fresh LoRA."""
    if adapter is None:
        default = ROOT / demo_config(True)["adapter_name_or_path"]
        return str(default) if (default / "adapter_config.json").is_file() else "none"
    if adapter != "none" and not (Path(adapter) / "adapter_config.json").is_file():
        raise SystemExit(f"benchmarks.rl: --adapter {adapter}: no adapter_config.json there (give a LoRA adapter "
                         "folder, e.g. from scripts/tool_demo.sh, or `none` for a fresh LoRA)")
    return str(Path(adapter).resolve()) if adapter != "none" else adapter


def demo_config(tools: bool) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(CONFIGS[tools].read_text())


def workload(args: argparse.Namespace) -> dict[str, Any]:
    """The worker's run config, which both sides follow: its workload's demo config, paths made whole (a worker
    may run from any folder), and for tools what TRL can do too: no dynamic sampling (TRL has none), one token
    budget for the whole trajectory, chatml_tools, the bench's --adapter."""
    config = demo_config(is_tools(args.worker))
    config["data_path"] = str(ROOT / config["data_path"])
    if is_tools(args.worker):
        config.pop("dynamic_sampling", None)
        config.pop("dynamic_sampling_rounds", None)
        config.pop("adapter_name_or_path", None)
        config |= {"max_new_tokens": TRAJECTORY_TOKENS, "max_trajectory_tokens": TRAJECTORY_TOKENS,
                   "chat_template": "chatml_tools"}
        if args.adapter != "none":
            config["adapter_name_or_path"] = args.adapter
    return config


# ---------------------------------------------------------------- variants


def run_ours(args: argparse.Namespace, workdir: Path) -> dict:
    import yaml

    from tunesmith.rl.command import run

    config = workdir / f"{args.worker}.yaml"
    config.write_text(yaml.safe_dump(workload(args)))
    argv = [str(config), "--model_name_or_path", args.model, "--max_steps", str(args.steps), "--save_strategy", "no",
            "--rollout_log_samples", "0", "--report_to", "none", "--output_dir", str(workdir / args.worker),
            "--loss_type", args.loss_type, *OURS[args.worker]]
    if args.worker in SERVER_VARIANTS:
        argv += ["--vllm_url", args.vllm_url]
    trainer = run(argv)
    steps = [r for r in trainer.log_history if "time_generate" in r]
    seconds = [r["time_generate"] + r["time_score"] + r["time_train"] for r in steps]
    calls = [r["tool_calls"] for r in steps if "tool_calls" in r]
    result = summarize(seconds, [r["score"] for r in steps], trainer.batch_size, trainer.args.bf16, calls)
    # where a step's time goes: sampling (the weight sync apart), scoring, update
    sync = [r.get("time_sync", 0.0) for r in steps]
    result["split"] = {"sample": sum(r["time_generate"] for r in steps) / len(steps) - sum(sync) / len(steps),
                       "sync": sum(sync) / len(steps), "score": sum(r["time_score"] for r in steps) / len(steps),
                       "update": sum(r["time_train"] for r in steps) / len(steps)}
    return result


def trl_tokenizer(args: argparse.Namespace) -> Any:
    """The tokenizer TRL gets with tools: chatml_tools, and a response template that parses its calls."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_template

    from tunesmith.data.template import apply_chat_template_override

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    apply_chat_template_override(tokenizer, "chatml_tools")
    # TRL's add_response_schema knows the models' own templates only (it raises "Unrecognized chat template" for
    # this one), so set the parser it would pick for Qwen3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
    # after the reply's text, as chatml_tools renders a call (tests/benchmarks/test_bench_rl.py checks it parses them).
    tokenizer.response_template = qwen3_template
    return tokenizer


def run_trl(args: argparse.Namespace, workdir: Path) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig, PeftModel
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tunesmith.rl.reward_sources import load_reward_function
    from tunesmith.rl.toolbox import load_tool

    work = workload(args)
    tools = is_tools(args.worker)
    rows = [json.loads(line) for line in Path(work["data_path"]).read_text().splitlines() if line.strip()]
    # tunesmith's order (PPOTrainer.batch_prompts: a randperm seeded by seed + epoch), so both sample the same prompts
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(work["seed"])).tolist()
    dataset = Dataset.from_list([{"prompt": rows[i]["messages"], "answer": str(rows[i]["answer"])} for i in order])
    [reward_name] = work["reward_funcs"]
    score = load_reward_function(reward_name).fn

    def reward(prompts, completions, completion_ids, answer, **_):
        # As tunesmith scores: the completion's tokens decoded, special tokens skipped (with tools: the whole
        # trajectory, the tool results included). `decode` is the trainer's tokenizer, set below.
        return score(prompts, decode.batch_decode(completion_ids, skip_special_tokens=True), answer=answer)

    reward.__name__ = reward_name
    mini_batches = work["num_mini_batches"]
    adapter = work.get("adapter_name_or_path")
    config = GRPOConfig(
        output_dir=str(workdir / args.worker), max_steps=args.steps * mini_batches, seed=work["seed"],
        per_device_train_batch_size=work["per_device_train_batch_size"] // mini_batches,
        steps_per_generation=mini_batches, num_generations=work["samples_per_prompt"],
        num_iterations=work["ppo_epochs"],
        max_completion_length=work["max_new_tokens"], temperature=work["temperature"], beta=work["kl_coef"],
        epsilon=0.2, loss_type=args.loss_type, scale_rewards="group", use_bias_correction_kl=False,
        max_tool_calling_iterations=work["max_tool_calls"] if tools else None,
        learning_rate=work["learning_rate"], lr_scheduler_type="constant", shuffle_dataset=False,
        gradient_checkpointing=False, bf16=PEERS[args.worker], use_cpu=not torch.cuda.is_available(),
        disable_dropout=True, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        model_init_kwargs=None if adapter else {"dtype": torch.float32},
        **(colocated_vllm_config(work) if args.worker in TRL_COLOCATED else {}),
    )
    # tunesmith's LoRA defaults where the config leaves them (r 16, alpha 32, dropout 0.05, every linear layer)
    lora = LoraConfig(r=work.get("lora_r", 16), lora_alpha=work.get("lora_alpha", 32), lora_dropout=0.05,
                      target_modules="all-linear", task_type="CAUSAL_LM")
    model: Any = args.model
    if adapter:  # TRL's way for a trained adapter: a trainable PeftModel, no peft_config
        base = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        model = PeftModel.from_pretrained(base, adapter, is_trainable=True)
    span: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *_, **__):
            span.append(time.perf_counter())

        def on_train_end(self, *_, **__):
            span.append(time.perf_counter())

    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=dataset,
                          processing_class=trl_tokenizer(args) if tools else None,
                          peft_config=None if adapter else lora,
                          tools=[load_tool(spec).fn for spec in work["tool_funcs"]] if tools else None,
                          callbacks=[Clock()])
    decode = trainer.processing_class
    assert trainer.args.generation_batch_size == work["per_device_train_batch_size"]  # one rollout batch a step
    trainer.train()
    logs = trainer.state.log_history
    rewards = [r["reward"] for r in logs if "reward" in r]  # one per generation
    calls = [r["tools/call_frequency"] for r in logs if "tools/call_frequency" in r]
    per_step = (span[1] - span[0]) / args.steps
    return summarize([per_step] * args.steps, rewards, work["per_device_train_batch_size"], PEERS[args.worker], calls)


def colocated_vllm_config(work: dict) -> dict:
    """TRL's GRPOConfig for vLLM colocated in its process, set as tunesmith's colocated variant runs: truncated
    importance sampling per token at tunesmith's cap (--rollout_is_cap 2), and on a CPU vLLM eager with a KV cache of
    2 GiB (TRL passes vLLM no enforce_eager: its torch.compile took 281 s to load the default model on 2 cores, a cost
    outside the timed steps either way, but eager is what tunesmith's colocated engine runs on a CPU)."""
    import os

    import torch

    if not torch.cuda.is_available():
        import functools

        import trl.generation.vllm_generation as generation

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        generation.LLM = functools.partial(generation.LLM, enforce_eager=True, enable_prefix_caching=False)
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_importance_sampling_correction": True,
            "vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_max": 2.0,
            "vllm_max_model_length": 1024}


def summarize(step_seconds: list[float], rewards: list[float], completions_per_step: int, bf16: bool,
              tool_calls: list[float]) -> dict:
    seconds = sum(step_seconds)
    return {"completions_per_s": completions_per_step * len(step_seconds) / seconds,
            "seconds_per_step": seconds / len(step_seconds), "rewards": rewards, "tool_calls": tool_calls,
            "bf16": bool(bf16), "peak_rss_mb": peak_rss_mb(), **peak_gpu_memory()}  # both train on the GPU if any


RUNS = {**dict.fromkeys(OURS, run_ours), **dict.fromkeys(PEERS, run_trl)}


# ---------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if run_worker(args, RUNS):
        return
    args.model = benchmark_model(args.model)
    args.adapter = resolve_adapter(args.adapter)
    print(f"model {args.model}, loss_type {args.loss_type}, {args.steps} rollout batches per run, {args.repeats} runs "
          "each, interleaved", flush=True)
    for tools in sorted({is_tools(v) for v in args.variants}):
        print(f"{CONFIGS[tools].relative_to(ROOT)}: {describe_workload(tools, args.adapter)}", flush=True)
    # one data cache for the runs: the prompts are encoded alike in every run
    with scratch(__spec__.name) as workdir, vllm_server(args, workdir) as url:
        results = run_interleaved(__spec__.name, args.variants, args.repeats, workdir,
                                  ["--model", args.model, "--steps", str(args.steps), "--loss_type", args.loss_type,
                                   "--adapter", args.adapter, *(["--vllm_url", url] if url else [])],
                                  args.quiet_share, describe, args.settle)
    print_table(results, args.quiet_share)


@contextlib.contextmanager
def vllm_server(args: argparse.Namespace, workdir: Path) -> Iterator[str | None]:
    """The vLLM server the grpo_vllm_* variants sample on: --vllm_url, or one started here for the runs (its start
    is not timed), float32 as those variants train."""
    if not SERVER_VARIANTS & set(args.variants) or args.vllm_url:
        yield args.vllm_url
        return
    from tunesmith.generation.vllm_server import VLLMServer, VLLMServerSettings

    settings = VLLMServerSettings(model=args.model, port=8731, dtype="float32", rl=True, kv_cache_gib=2)
    print(f"starting vLLM for the grpo_vllm_* variants at {settings.url} (log: {workdir / 'vllm.log'})", flush=True)
    with VLLMServer(settings, log_file=workdir / "vllm.log") as server:
        yield server.url


def describe_workload(tools: bool, adapter: str) -> str:
    work = workload(argparse.Namespace(worker="grpo_tools_bf16" if tools else "grpo_bf16", adapter=adapter))
    group = work["samples_per_prompt"]
    text = (f"{work['per_device_train_batch_size'] // group} prompts x {group} completions a step, at most "
            f"{work['max_new_tokens']} tokens, temperature {work['temperature']}, learning rate "
            f"{work['learning_rate']:g}, rewarded by {', '.join(work['reward_funcs'])}")
    if not tools:
        return text
    start = f"the adapter {adapter}" if adapter != "none" else "a fresh LoRA (no adapter: it may never call)"
    return (f"{text}; tools {', '.join(work['tool_funcs'])}, at most {work['max_tool_calls']} call(s) a trajectory "
            f"(the tokens count the tool results too), no dynamic sampling; the policy starts from {start}")


def describe(r: dict) -> str:
    calls = " ".join(f"{x:.2f}" for x in r["tool_calls"])
    split = ", ".join(f"{k} {v:.1f} s" for k, v in r.get("split", {}).items())
    return (f"{r['completions_per_s']:.2f} completions/s, {r['seconds_per_step']:.1f} s/step, peak RSS "
            f"{r['peak_rss_mb']:.0f} MB, rewards " + " ".join(f"{x:.2f}" for x in r["rewards"])
            + (f", tool calls per completion {calls}" if calls else "") + (f"; per step: {split}" if split else ""))


def split_text(runs: list[dict]) -> str:
    """The median of the runs' mean seconds per step in each phase: sampling, weight sync, scoring, update."""
    if not all("split" in r for r in runs):
        return ""
    phases = runs[0]["split"]
    return "; per step " + ", ".join(
        f"{k} {sorted(r['split'][k] for r in runs)[len(runs) // 2]:.1f} s" for k in phases)


def median_curve(runs: list[dict], key: str) -> list[float]:
    """Step by step, the median over the runs of a per-step list (as long as the shortest run's)."""
    return [sorted(x[key][i] for x in runs)[len(runs) // 2] for i in range(min(len(x[key]) for x in runs))]


def print_table(results: dict[str, list[dict]], quiet_share: float) -> None:
    rows = {name: medians(runs) for name, runs in results.items() if runs}
    print(f"\n{'variant':<16}{'bf16':>5}{'completions/s':>14}{'spread':>12}{'s/step':>8}{'peak RSS MB':>12}"
          f"{'other CPU':>10}  mean reward per step (median of runs)")
    for name, r in rows.items():
        runs = results[name]
        calls, curve = median_curve(runs, "tool_calls"), median_curve(runs, "rewards")
        print(f"{name:<16}{'yes' if r['bf16'] else 'no':>5}{r['completions_per_s']:>14.2f}"
              f"{spread(runs, 'completions_per_s', 2):>12}{r['seconds_per_step']:>8.1f}{r['peak_rss_mb']:>12.0f}"
              f"{max(x['other_cpu'] for x in runs):>10.0%}  {' '.join(f'{x:.2f}' for x in curve)}"
              f"{loaded(runs, quiet_share)}" + (f", peak GPU {r['peak_gpu_mb']:.0f} MB" if "peak_gpu_mb" in r else "")
              + (f"; tool calls per completion {' '.join(f'{x:.2f}' for x in calls)}" if calls else "")
              + split_text(runs))

    def ratio(a: str, b: str, key: str) -> str:
        return f"{rows[a][key] / rows[b][key]:.2f}" if a in rows and b in rows else "n/a"

    for precision in ("bf16", "fp32"):
        if f"gae_{precision}" in rows and f"grpo_{precision}" in rows:
            grpo, gae = f"grpo_{precision}", f"gae_{precision}"
            print(f"GRPO / PPO ({precision}): {ratio(grpo, gae, 'completions_per_s')}x the completions/s, "
                  f"{ratio(grpo, gae, 'peak_rss_mb')}x the peak RSS")
    for tools in ("", "tools_"):
        label = " (tools)" if tools else ""
        ours32, trl32, trl16 = f"grpo_{tools}fp32", f"trl_{tools}fp32", f"trl_{tools}bf16"
        if ours32 in rows and trl32 in rows:
            print(f"float32 both{label}: completions/s ratio {ratio(ours32, trl32, 'completions_per_s')}, "
                  f"peak RSS ratio {ratio(ours32, trl32, 'peak_rss_mb')}")
        if ours32 in rows and trl16 in rows:
            print(f"each at its default precision (tunesmith float32, TRL bf16){label}: completions/s ratio "
                  f"{ratio(ours32, trl16, 'completions_per_s')}")
    if "grpo_colocated_fp32" in rows and "trl_vllm_fp32" in rows:
        print(f"vLLM colocated, float32 both: completions/s ratio vs TRL GRPOTrainer (use_vllm colocate) "
              f"{ratio('grpo_colocated_fp32', 'trl_vllm_fp32', 'completions_per_s')}, peak RSS ratio "
              f"{ratio('grpo_colocated_fp32', 'trl_vllm_fp32', 'peak_rss_mb')}")
    # Both in bf16, TRL's default: the memory ratios, then the speed ratios as the last lines.
    pairs = [(label, f"grpo_{tools}bf16", f"trl_{tools}bf16") for label, tools in (("", ""), (" (tools)", "tools_"))
             if f"trl_{tools}bf16" in rows]
    for label, ours, trl in pairs:
        print(f"peak RSS ratio vs TRL GRPOTrainer{label}: {ratio(ours, trl, 'peak_rss_mb')}")
    for label, ours, trl in pairs:
        print(f"completions/s ratio vs TRL GRPOTrainer{label}: {ratio(ours, trl, 'completions_per_s')}")


if __name__ == "__main__":
    main()
