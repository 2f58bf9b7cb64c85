"""DPO throughput: tunesmith's DPO trainer against TRL's DPOTrainer, on the same model, pairs, steps and LoRA.

    .venv/bin/python -m benchmarks.dpo [--model DIR] [--steps 6] [--batch_size 8] [--repeats 3]
                                       [--variants ours,trl,ours_precomputed]

Every variant trains the same LoRA adapter (tunesmith's loader: every linear layer, r 16, alpha 32, no
dropout) with sigmoid DPO (beta 0.1) against the model with its adapter disabled, from the same token
ids in the same order (data/demo/preference.jsonl through tunesmith's template path; TRL is handed
those ids as its own prompt_ids / chosen_ids / rejected_ids columns), for the same number of AdamW
steps at the same learning rate, without gradient checkpointing:
  ours              tunesmith's DPOTrainer: chosen and rejected in one padding-free row, logits only
                    where a reply token is predicted, the reference in every step
  trl               TRL's DPOTrainer (padded batches; its chunked LM head over every position)
  ours_precomputed  tunesmith with --precompute_ref_logps: the reference scored once before training
                    (its pass is not timed; TRL has the same option)
  ours_bf16         tunesmith with --bf16 true (a bf16 base under the float32 LoRA, autocast)
Each run is its own subprocess (peak RSS is its own); the variants take turns, --repeats times, and
the table gives the median of each column with the spread (min-max) of pairs/s. The first step is
a warm-up: pairs/s counts the pairs of steps 2.. over the time from the end of step 1 to the end of
the last step. Each run waits for idle cores and reports the share other processes took while it
ran; a run over --quiet_share is flagged with '!' and its variant's row with '(loaded)' (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from benchmarks.common import (  # one driver and step clock for every benchmark
    ROOT,
    TIMED_TRAINER,
    CountingCollator,
    StepClock,
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

VARIANTS = ("ours", "trl", "ours_precomputed", "ours_bf16")
PAIRS = ROOT / "data" / "demo" / "preference.jsonl"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="Model directory (default: the embedded SmolLM2-135M-Instruct).")
    p.add_argument("--steps", type=int, default=6, help="Optimizer steps per run; the first is not timed.")
    p.add_argument("--batch_size", type=int, default=8, help="Pairs per step.")
    p.add_argument("--lora_r", type=int, default=16, help="LoRA rank (alpha = 2 r) on every linear layer.")
    p.add_argument("--learning_rate", type=float, default=5e-5)
    add_quiet_arguments(p)
    p.add_argument("--variants", default=",".join(VARIANTS[:2]), help=f"Comma-separated subset of {', '.join(VARIANTS)}.")
    add_worker_arguments(p, VARIANTS)
    args = p.parse_args(argv)
    check_choices(p, "variants", args.variants, VARIANTS)
    return args


def prepare_data(args: argparse.Namespace, workdir: Path) -> dict:
    """Tokenize the pairs once through tunesmith's template path; every variant reads these ids."""
    from tunesmith.data.preference import build_preference_datasets
    from tunesmith.hparams import ModelArguments, TrainDataArguments
    from tunesmith.models.loader import load_tokenizer

    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=args.model))
    dataset, _ = build_preference_datasets(tokenizer, TrainDataArguments(data_path=[str(PAIRS)], val_size=0.0))
    dataset = dataset.select(range(min(len(dataset), args.steps * args.batch_size)))
    dataset.save_to_disk(str(workdir / "pairs"))
    lengths = [len(c) + len(r) for c, r in zip(dataset["chosen_ids"], dataset["rejected_ids"])]
    replies = [c_end - c_start + r_end - r_start for c_start, c_end, r_start, r_end in
               zip(dataset["chosen_start"], dataset["chosen_end"], dataset["rejected_start"], dataset["rejected_end"])]
    return {"pairs": len(dataset), "tokens": sum(lengths) / len(lengths), "reply_tokens": sum(replies) / len(replies)}


def positions(batch: dict) -> int:
    """The positions the model computes for a batch."""
    return batch["input_ids"].numel()


def load(args: argparse.Namespace, workdir: Path, training_args: Any = None) -> tuple[Any, Any, Any]:
    """(pairs, tokenizer, LoRA model); with training_args.bf16 the base loads in bf16, as tunesmith's stages do."""
    from datasets import load_from_disk
    from transformers import set_seed

    from tunesmith.hparams import FinetuningArguments, ModelArguments
    from tunesmith.models.loader import load_model, load_tokenizer

    model_args = ModelArguments(model_name_or_path=args.model)
    set_seed(0)
    model = load_model(model_args, FinetuningArguments(lora_r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0),
                       training_args)
    return load_from_disk(str(workdir / "pairs")), load_tokenizer(model_args), model


def summarize(clock: StepClock, positions: list[int], trainer: Any, args: argparse.Namespace) -> dict:
    """Throughput and memory, and the losses of the first and last step: the same ids, order and
    optimizer give both trainers the same losses, which shows they optimise the same objective."""
    seconds = clock.ends[args.steps - 1] - clock.ends[0]
    pairs = (args.steps - 1) * args.batch_size
    losses = logged_losses(trainer)
    return {"pairs_per_s": pairs / seconds, "seconds": seconds, "positions_per_step": statistics.mean(positions[1:]),
            "peak_rss_mb": peak_rss_mb(), "first_loss": losses[0], "last_loss": losses[-1]}


def run_ours(args: argparse.Namespace, workdir: Path, precompute: bool, bf16: bool = False) -> dict:
    from tunesmith.data.collator import PreferencePackingCollator
    from tunesmith.hparams import TrainingArguments
    from tunesmith.models.attention import use_varlen_attention
    from tunesmith.preference.args import DPOArguments
    from tunesmith.preference.dpo_trainer import DPOTrainer

    training_args = TrainingArguments(
        output_dir=str(workdir / args.worker), max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, use_cpu=True, bf16=bf16, **TIMED_TRAINER)
    dataset, tokenizer, model = load(args, workdir, training_args)
    use_varlen_attention(model)
    clock, callback = trainer_clock()
    collator = CountingCollator(PreferencePackingCollator(), positions)
    trainer = DPOTrainer(model=model, args=training_args, train_dataset=dataset, processing_class=tokenizer,
                         data_collator=collator, callbacks=[callback],
                         dpo_args=DPOArguments(beta=0.1, precompute_ref_logps=precompute))
    trainer.train()
    # the training steps' batches: a precomputing pass batches through the same collator first
    return summarize(clock, collator.counts[-args.steps:], trainer, args)


def run_trl(args: argparse.Namespace, workdir: Path) -> dict:
    from datasets import Dataset
    from trl import DPOConfig
    from trl import DPOTrainer as TRLDPOTrainer

    dataset, tokenizer, model = load(args, workdir)
    # The same ids as ours: the shared context, then each reply up to and with its end-of-turn.
    records = {"prompt_ids": [], "chosen_ids": [], "rejected_ids": []}
    for row in dataset:
        records["prompt_ids"].append(row["chosen_ids"][:row["chosen_start"]])
        records["chosen_ids"].append(row["chosen_ids"][row["chosen_start"]:row["chosen_end"]])
        records["rejected_ids"].append(row["rejected_ids"][row["rejected_start"]:row["rejected_end"]])
    config = DPOConfig(
        output_dir=str(workdir / args.worker), max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, use_cpu=True, bf16=False, gradient_checkpointing=False, max_length=None,
        beta=0.1, loss_type=["sigmoid"], **TIMED_TRAINER)
    clock, callback = trainer_clock()
    tiny = Dataset.from_list([{"prompt": "x", "chosen": "y", "rejected": "z"}])  # replaced below, ids and all
    trainer = TRLDPOTrainer(model=model, args=config, train_dataset=tiny, processing_class=tokenizer,
                            callbacks=[callback])
    trainer.train_dataset = Dataset.from_dict(records)
    trainer.data_collator = collator = CountingCollator(trainer.data_collator, positions)
    trainer.train()
    return summarize(clock, collator.counts, trainer, args)


RUNS = {"ours": lambda a, w: run_ours(a, w, precompute=False), "trl": run_trl,
        "ours_precomputed": lambda a, w: run_ours(a, w, precompute=True),
        "ours_bf16": lambda a, w: run_ours(a, w, precompute=False, bf16=True)}


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if run_worker(args, RUNS):
        return
    args.model = benchmark_model(args.model)
    variants = args.variants.split(",")
    with scratch(__spec__.name) as workdir:
        data = prepare_data(args, workdir)
        print(f"model {args.model}\ndata: {data['pairs']} pairs of {PAIRS.name}, mean {data['tokens']:.0f} tokens per "
              f"pair (chosen + rejected), {data['reply_tokens']:.0f} of them reply tokens\nsteps {args.steps} (first "
              f"untimed), batch {args.batch_size} pairs, LoRA r {args.lora_r}, {args.repeats} runs each, interleaved",
              flush=True)
        worker_args = ["--model", args.model, "--steps", str(args.steps), "--batch_size", str(args.batch_size),
                       "--lora_r", str(args.lora_r), "--learning_rate", str(args.learning_rate)]
        results = run_interleaved(__spec__.name, variants, args.repeats, workdir, worker_args, args.quiet_share,
                                  lambda r: f"{r['pairs_per_s']:.2f} pairs/s, peak RSS {r['peak_rss_mb']:.0f} MB",
                                  args.settle)
    print_table(results, args.quiet_share)


def print_table(results: dict[str, list[dict]], quiet_share: float) -> None:
    print(f"\n{'variant':<18}{'pairs/s':>9}{'spread':>14}{'positions/step':>16}{'peak RSS MB':>13}"
          f"{'loss first -> last':>21}{'other CPU':>10}")
    rows = {name: medians(runs) for name, runs in results.items() if runs}
    for name, m in rows.items():
        runs = results[name]
        losses = f"{m['first_loss']:.4f} -> {m['last_loss']:.4f}"
        print(f"{name:<18}{m['pairs_per_s']:>9.2f}{spread(runs, 'pairs_per_s', 2):>14}{m['positions_per_step']:>16.0f}"
              f"{m['peak_rss_mb']:>13.0f}{losses:>21}{max(r['other_cpu'] for r in runs):>10.0%}{loaded(runs, quiet_share)}")
    if "ours" in rows and "ours_bf16" in rows:
        print(f"bf16 against float32: pairs/s x{rows['ours_bf16']['pairs_per_s'] / rows['ours']['pairs_per_s']:.2f}, "
              f"peak RSS x{rows['ours_bf16']['peak_rss_mb'] / rows['ours']['peak_rss_mb']:.2f}")
    if "ours" in rows and "trl" in rows:
        print(f"pairs/s ratio vs TRL: {rows['ours']['pairs_per_s'] / rows['trl']['pairs_per_s']:.2f}; "
              f"peak RSS ratio vs TRL: {rows['ours']['peak_rss_mb'] / rows['trl']['peak_rss_mb']:.2f}")


if __name__ == "__main__":
    main()
