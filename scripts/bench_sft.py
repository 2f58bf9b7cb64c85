"""SFT throughput: tunesmith (padding-free packing) against TRL's SFTTrainer and a plain PyTorch loop.

    .venv/bin/python scripts/bench_sft.py [--model DIR] [--steps 6] [--batch_size 4] [--max_seq_length 512]
                                          [--lora_r 16] [--variants ours,trl_padded,trl_packed,plain]

Every variant trains the same LoRA adapter (tunesmith's loader: every linear layer, r, alpha = 2r) on
the same model, from the same conversations taken in the same order, for the same number of optimizer
steps with AdamW at the same learning rate and no gradient checkpointing:
  ours        tunesmith's LoraTrainer with --packing (sft_collator: one padding-free row per batch)
  trl_padded  TRL's SFTTrainer, padded batches
  trl_packed  TRL's SFTTrainer, packing=True (best-fit-decreasing rows of max_seq_length, padding-free);
              it packs the whole set, so its batches hold other examples; the batch size in rows is
              picked so a step trains about as many tokens as the others
  plain       a bare loop: each example forward/backward alone (no padding, no mask), one AdamW step per
              batch: the ceiling
Each variant runs in its own subprocess, so peak RSS is its own. The first step is a warm-up and is
not timed: throughput is trained tokens (targets of the loss) from step 2 on, over the time from the
end of step 1 to the end of the last step (data loading included).

The conversations are built here, deterministically and offline: user/assistant pairs from
data/demo/sft.jsonl (when present) and questions about standard-library functions answered with their
docstrings, 1 to 10 pairs per conversation, so lengths spread over an order of magnitude.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VARIANTS = ("ours", "trl_padded", "trl_packed", "plain")
DEMO_SFT = ROOT / "data" / "demo" / "sft.jsonl"
STDLIB_MODULES = ("argparse", "bisect", "collections", "csv", "datetime", "functools", "heapq", "inspect",
                  "itertools", "json", "logging", "math", "os", "pathlib", "random", "re", "shutil", "statistics",
                  "string", "subprocess", "textwrap", "typing")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="Model directory (default: the embedded SmolLM2-135M-Instruct).")
    p.add_argument("--steps", type=int, default=6, help="Optimizer steps per variant; the first is not timed.")
    p.add_argument("--batch_size", type=int, default=4, help="Conversations per step (ours, trl_padded, plain).")
    p.add_argument("--max_seq_length", type=int, default=512, help="Longer conversations lose trailing turns.")
    p.add_argument("--lora_r", type=int, default=16, help="LoRA rank (alpha = 2 r) on every linear layer.")
    p.add_argument("--learning_rate", type=float, default=2e-4)
    p.add_argument("--conversations", type=int, default=300, help="Size of the generated benchmark set.")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"Comma-separated subset of {', '.join(VARIANTS)}.")
    p.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        p.error(f"--variants {args.variants}: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    return args


# ---------------------------------------------------------------- data


def qa_pairs() -> list[tuple[str, str]]:
    """(question, answer) pairs: the demo set's user/assistant turns, then stdlib docstrings."""
    pairs: list[tuple[str, str]] = []
    if DEMO_SFT.is_file():
        from tunesmith.data.formats import load_conversations

        for conv in load_conversations([str(DEMO_SFT)]):
            m = conv.messages
            pairs += [(a["content"], b["content"]) for a, b in zip(m, m[1:])
                      if a["role"] == "user" and b["role"] == "assistant"]
    for name in STDLIB_MODULES:
        module = importlib.import_module(name)
        for attr in sorted(dir(module)):
            obj = getattr(module, attr)
            doc = inspect.getdoc(obj) if not attr.startswith("_") and callable(obj) else None
            if doc and len(doc.split()) >= 8:
                pairs.append((f"What does {name}.{attr} do in Python?", doc[:1500]))
    return pairs


def benchmark_conversations(n: int, seed: int = 0) -> list[dict]:
    pairs = qa_pairs()
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        turns = int(math.exp(rng.uniform(0, math.log(10.99))))  # 1..10, log-uniform
        messages = []
        for question, answer in rng.sample(pairs, turns):
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        rows.append({"messages": messages})
    return rows


def prepare_data(args: argparse.Namespace, workdir: Path) -> dict:
    """Tokenize the benchmark set once (tunesmith's template and masking) for every variant."""
    from tunesmith.data.dataset import build_sft_dataset
    from tunesmith.hparams import ModelArguments
    from tunesmith.hparams import SFTDataArguments as DataArguments
    from tunesmith.models.loader import load_tokenizer
    from tunesmith.utils.io import atomic_write_jsonl

    atomic_write_jsonl(workdir / "bench.jsonl", benchmark_conversations(args.conversations))
    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=args.model))
    data_args = DataArguments(data_path=[str(workdir / "bench.jsonl")], max_seq_length=args.max_seq_length)
    dataset = build_sft_dataset(tokenizer, data_args.data_path, data_args).select_columns(["input_ids", "labels"])
    dataset.save_to_disk(str(workdir / "tokenized"))
    lengths = sorted(len(ids) for ids in dataset["input_ids"])
    used = [len(ids) for ids in dataset["input_ids"][: args.steps * args.batch_size]]
    return {"examples": len(lengths), "min": lengths[0], "median": lengths[len(lengths) // 2], "max": lengths[-1],
            "timed_mean": sum(used) / len(used)}


# ---------------------------------------------------------------- measuring


class BatchCounts:
    """Wraps a collator; records, per batch, the positions computed, the real tokens and the trained
    targets (what the loss is normalized by)."""

    def __init__(self, collator: Any) -> None:
        self.collator, self.batches = collator, []

    def __call__(self, features: list[dict]) -> dict:
        batch = self.collator(features)
        self.batches.append(count_tokens(batch))
        return batch


def count_tokens(batch: dict) -> dict:
    ids = batch["input_ids"]
    real = int(batch["attention_mask"].sum()) if "attention_mask" in batch else ids.numel()
    targets = batch["shift_labels"] if "shift_labels" in batch else batch["labels"][..., 1:]
    return {"positions": ids.numel(), "real": real, "trained": int((targets != -100).sum())}


class StepClock:
    """Wall-clock and process CPU time at the end of every optimizer step."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.cpu: list[float] = []

    def tick(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())
        self.cpu.append(time.process_time())


def trainer_clock() -> tuple[StepClock, Any]:
    from transformers import TrainerCallback

    clock = StepClock()

    class Callback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()

    return clock, Callback()


def summarize(clock: StepClock, batches: list[dict], steps: int) -> dict:
    timed = batches[1:steps]  # batch i is step i's (one batch per step); step 1 is the warm-up
    seconds = clock.ends[steps - 1] - clock.ends[0]
    trained = sum(b["trained"] for b in timed)
    positions = sum(b["positions"] for b in timed)
    result = {
        "steps": len(clock.ends), "seconds": seconds, "trained_tokens": trained, "tokens_per_s": trained / seconds,
        # CPU seconds are less sensitive than wall time to other jobs sharing the cores
        "tokens_per_cpu_s": trained / (clock.cpu[steps - 1] - clock.cpu[0]),
        "padded_share": 1 - sum(b["real"] for b in timed) / positions, "peak_rss_mb": peak_rss_mb(),
        "load_avg": os.getloadavg()[0],
    }
    import torch

    if torch.cuda.is_available():
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------- variants


def load(args: argparse.Namespace, workdir: Path) -> tuple[Any, Any, Any, Any]:
    """(tokenized dataset, tokenizer, LoRA model, tunesmith TrainingArguments) as every variant shares them."""
    import torch
    from datasets import load_from_disk
    from transformers import set_seed

    from tunesmith.hparams import FinetuningArguments, ModelArguments, TrainingArguments
    from tunesmith.models.loader import load_model, load_tokenizer

    bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    training_args = TrainingArguments(
        output_dir=str(workdir / args.worker), max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, train_sampling_strategy="sequential", save_strategy="no",
        report_to="none", logging_steps=1, bf16=bf16, disable_tqdm=True,
    )
    model_args = ModelArguments(model_name_or_path=args.model)
    set_seed(0)
    model = load_model(model_args, FinetuningArguments(lora_r=args.lora_r, lora_alpha=2 * args.lora_r), training_args)
    return load_from_disk(str(workdir / "tokenized")), load_tokenizer(model_args), model, training_args


def run_ours(args: argparse.Namespace, workdir: Path) -> dict:
    from tunesmith.data.packing import sft_collator
    from tunesmith.hparams import SFTDataArguments as DataArguments
    from tunesmith.train.sft_trainer import LoraTrainer

    dataset, tokenizer, model, training_args = load(args, workdir)
    data_args = DataArguments(max_seq_length=args.max_seq_length, packing=True)
    clock, callback = trainer_clock()
    collator = BatchCounts(sft_collator(model, tokenizer, data_args, training_args))
    trainer = LoraTrainer(model=model, args=training_args, train_dataset=dataset, processing_class=tokenizer,
                          data_collator=collator, callbacks=[callback])
    trainer.train()
    return summarize(clock, collator.batches, args.steps)


def run_trl(args: argparse.Namespace, workdir: Path, packing: bool) -> dict:
    import torch
    from trl import SFTConfig, SFTTrainer

    dataset, tokenizer, model, training_args = load(args, workdir)
    batch_size = args.batch_size
    if packing:  # rows of max_seq_length; enough of them to train about as many tokens per step
        per_step = sum(len(ids) for ids in dataset["input_ids"][: args.steps * args.batch_size]) / args.steps
        batch_size = max(1, round(per_step / args.max_seq_length))
    config = SFTConfig(
        output_dir=training_args.output_dir, max_steps=args.steps, per_device_train_batch_size=batch_size,
        learning_rate=args.learning_rate, train_sampling_strategy="sequential", save_strategy="no",
        report_to="none", logging_steps=1, bf16=training_args.bf16, use_cpu=not torch.cuda.is_available(),
        gradient_checkpointing=False, max_length=args.max_seq_length, packing=packing, disable_tqdm=True,
    )
    clock, callback = trainer_clock()
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=[callback])
    trainer.data_collator = collator = BatchCounts(trainer.data_collator)
    trainer.train()
    return {**summarize(clock, collator.batches, args.steps), "rows_per_step": batch_size}


def run_plain(args: argparse.Namespace, workdir: Path) -> dict:
    import torch

    dataset, _, model, training_args = load(args, workdir)
    device = training_args.device
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=0.0)
    clock, batches = StepClock(), []
    for step in range(args.steps):
        examples = dataset[step * args.batch_size: (step + 1) * args.batch_size]
        ids = [torch.tensor([x], device=device) for x in examples["input_ids"]]
        labels = [torch.tensor([x], device=device) for x in examples["labels"]]
        num_items = sum(int((lab[:, 1:] != -100).sum()) for lab in labels)
        batches.append({"positions": sum(x.numel() for x in ids), "real": sum(x.numel() for x in ids),
                        "trained": num_items})
        for x, lab in zip(ids, labels):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=training_args.bf16):
                loss = model(input_ids=x, labels=lab, num_items_in_batch=num_items, use_cache=False).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.tick()
    return summarize(clock, batches, args.steps)


def worker(args: argparse.Namespace) -> None:
    workdir = Path(args.workdir)
    runs = {"ours": run_ours, "plain": run_plain,
            "trl_padded": lambda a, w: run_trl(a, w, packing=False),
            "trl_packed": lambda a, w: run_trl(a, w, packing=True)}
    result = runs[args.worker](args, workdir)
    (workdir / f"{args.worker}.json").write_text(json.dumps(result))


# ---------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.worker:
        return worker(args)
    if args.model is None:
        from tunesmith.models.default_model import ensure_default_model

        args.model = str(ensure_default_model())
    with tempfile.TemporaryDirectory(prefix="bench_sft.") as tmp:
        workdir = Path(tmp)
        os.environ["TUNESMITH_CACHE"] = str(workdir / "cache")  # the generated set stays out of the real cache
        data = prepare_data(args, workdir)
        print(f"model {args.model}\ndata: {data['examples']} conversations, tokens min {data['min']} / median "
              f"{data['median']} / max {data['max']}; the {args.steps * args.batch_size} trained on: mean "
              f"{data['timed_mean']:.0f}\nsteps {args.steps} (first untimed), batch {args.batch_size}, "
              f"max_seq_length {args.max_seq_length}, LoRA r {args.lora_r}", flush=True)
        results = {}
        for variant in args.variants.split(","):
            command = [sys.executable, __file__, "--worker", variant, "--workdir", tmp, "--model", args.model,
                       "--steps", str(args.steps), "--batch_size", str(args.batch_size),
                       "--max_seq_length", str(args.max_seq_length), "--lora_r", str(args.lora_r),
                       "--learning_rate", str(args.learning_rate)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{variant}: failed (exit {done.returncode})\n{done.stderr[-3000:]}", flush=True)
                continue
            results[variant] = json.loads((workdir / f"{variant}.json").read_text())
            print(f"{variant}: {results[variant]['tokens_per_s']:.1f} trained tokens/s", flush=True)
    print_table(results)


def print_table(results: dict) -> None:
    gpu = any("peak_gpu_mb" in r for r in results.values())
    header = (f"{'variant':<12}{'tokens/s':>10}{'tok/CPU-s':>11}{'trained':>9}{'seconds':>9}{'padded':>8}"
              f"{'peak RSS MB':>13}{'load':>6}")
    print("\n" + header + (f"{'peak GPU MB':>13}" if gpu else ""))
    for name, r in results.items():
        line = (f"{name:<12}{r['tokens_per_s']:>10.1f}{r['tokens_per_cpu_s']:>11.1f}{r['trained_tokens']:>9}"
                f"{r['seconds']:>9.1f}{r['padded_share']:>8.1%}{r['peak_rss_mb']:>13.0f}{r['load_avg']:>6.1f}")
        print(line + (f"{r.get('peak_gpu_mb', 0):>13.0f}" if gpu else ""))
    if "ours" in results and "plain" in results:
        print(f"tokens/s ratio vs plain loop: {results['ours']['tokens_per_s'] / results['plain']['tokens_per_s']:.2f}")
    if "ours" in results and "trl_packed" in results:
        print(f"tokens/s ratio vs TRL (packed): "
              f"{results['ours']['tokens_per_s'] / results['trl_packed']['tokens_per_s']:.2f}")
    ratio = "n/a"
    if "ours" in results and "trl_padded" in results:
        ratio = f"{results['ours']['tokens_per_s'] / results['trl_padded']['tokens_per_s']:.2f}"
    print(f"tokens/s ratio vs TRL (padded): {ratio}")


if __name__ == "__main__":
    main()
