"""Longest trainable context: for a model and a method (LoRA, QLoRA), the longest single conversation that
trains one optimizer step, and the speed and peak memory of a few fixed lengths, for tunesmith at its
defaults and with its memory options, TRL's SFTTrainer at its documented best, and unsloth where installed.

    .venv/bin/python -m benchmarks.context [--model DIR] [--method lora|qlora|lora,qlora]
        [--variants ours,ours_gc,ours_offload,trl,trl_offload,unsloth] [--start 1024] [--max_length 1048576]
        [--memory_gb N] [--time_budget SECONDS] [--lengths 2048,8192] [--steps 2] [--quick]
    .venv/bin/python -m benchmarks.context --variants ours,ours_gc,trl --memory_gb 2 --max_length 8192 \
        --time_budget 900 --fixed_memory_gb 10 --lengths 2048,8192 --steps 1    # CPU: about 40 minutes, 2 cores

Variants (every one trains the same LoRA: tunesmith's loader's targets, every linear layer, r --lora_r,
alpha 2r, dropout --lora_dropout; AdamW at --learning_rate; one conversation per optimizer step):
  ours          tunesmith's StageTrainer with sft_collator and packing=True at its defaults: one padding-free
                row (sdpa_varlen), logits of trained positions only (on CPU the loss's gradient built chunk by
                chunk), bf16 where the hardware has it (a LoRA base then loads in bf16), no checkpointing:
                tunesmith's default for LoRA on a GPU, and on CPU up to --max_seq_length 2048
  ours_gc       ours with gradient_checkpointing=True (each layer's input kept, the layer recomputed): tunesmith's
                default on CPU above --max_seq_length 2048 and for QLoRA on a GPU (hparams/training_args.py)
  ours_offload  ours with gradient_checkpointing="offload": the kept layer inputs go to pinned CPU memory
                (CUDA; tunesmith runs it as plain checkpointing on CPU). Where tunesmith does not accept the
                value, the variant's line says so with its error.
  ours_auto     ours with gradient_checkpointing="auto", tunesmith's default for packed SFT on a GPU: each forward
                keeps every layer where it fits the free memory, else recomputes, then offloads, as few layers as
                it must (train/layer_modes.py); on CPU (no forward budget) every layer recomputed
  ours_offload_tiled, ours_auto_tiled
                ours_offload / ours_auto with --tiled_mlp true (each layer's MLP and norms over chunks of
                hidden_size tokens): ALST's single-GPU recipe, by which the plan puts 400,000 tokens of an 8B
                QLoRA within 80 GB (docs/benchmark.md, "Memory plan against measured GPU peaks")
  trl           TRL's SFTTrainer at its documented best for memory: padding_free=True with max_length=None
                (TRL 1.16 refuses padding_free with a max_length unless it packs; the conversation is L tokens
                already; packing with packing_strategy="bfd" turns padding-free on too and would build the same
                one row), gradient_checkpointing=True and bf16 (TRL's defaults), loss_type
                "nll" (its default: the fused LM head, which never builds the full logits). The base loads in
                bf16 (TRL trains in bf16 by default; given a path, SFTTrainer would load float32 weights, twice
                the memory), for QLoRA in 4-bit NF4 with bf16 compute as TRL's QLoRA docs load it, and the
                adapter is attached with get_peft_model, which is what SFTTrainer does with a peft_config (done
                once per process here, so the trials of one process share the model); TRL casts a QLoRA
                adapter to bf16.
  trl_offload   trl with activation_offloading=True (CUDA only: on CPU the activations already live in CPU
                memory, so the variant is skipped there with a line)
  unsloth       unsloth's FastLanguageModel (4-bit for QLoRA), its get_peft_model with
                use_gradient_checkpointing="unsloth" and dropout 0, trained by a plain loop (forward with labels,
                which runs its fused loss, backward, AdamW step); only where `import unsloth` works (it pins
                transformers <= 5.17): elsewhere one line says it is not installed. Not run where this was written.
--method lora,qlora runs every variant for each method and prints a table per method; qlora is a 4-bit NF4
base (double quantization, tunesmith's ModelArguments quantization_bit=4; TRL as its QLoRA docs load it).

The data: one conversation of exactly L tokens under the model's chat template (tunesmith's pipeline,
build_sft_dataset with max_seq_length L and truncation "cut", so the last reply may stop mid-way; the
length is checked). Its turns are Python's standard-library docstrings (benchmarks/sft.py's qa_pairs):
each user turn quotes one docstring and asks about another function, the reply is that function's
docstring, so about half of the tokens are trained reply tokens. It is built afresh for every length.

The search, per variant: a trial trains one optimizer step (forward, backward, optimizer step) on a
conversation of L tokens. L starts at --start and doubles until a trial fails (or halves until one fits,
if the first fails), then bisects between the last success and the first failure until first failure /
last success <= 1.05 (--precision). The table gives the last success (the longest trainable L, within 5%
of the true one) and the first failure. --max_length caps it; --time_budget seconds per variant stops the
search early (a running trial is killed at the deadline), and the table says the bracket it reached.

A trial fails when it runs out of memory:
  - on CPU each trial is its own process (a CPU out-of-memory kills the process, and the peak RSS is the
    trial's own); the driver polls the worker's RSS every 0.1 s and kills it above --memory_gb (default 75%
    of MemTotal), so the machine itself never runs out, and a trial whose peak RSS passed it between two
    polls fails too; a torch "can't allocate memory" counts as well;
  - on CUDA (or with --one_process) all trials of a variant run in one process that loads the model once
    (a 4-bit 8B model takes a minute to load): torch.OutOfMemoryError is caught, the trainer, optimizer and
    batch dropped, gc.collect(), torch.cuda.empty_cache() and the peak statistics reset. --memory_gb still
    guards the host's RAM (pinned offloaded activations live there); a killed worker is restarted (model
    loaded again) for the next trial. --gpu_memory_gb caps the GPU memory torch may use (a smaller card).
Any other error stops the variant's search, and its line in the table gives the error.

The workers run with MALLOC_MMAP_THRESHOLD_=65536 (--glibc_malloc: glibc's defaults): every allocation over
64 KB is a mapping of its own, given back to the system when freed, so the peak RSS follows the live tensors
and a length fits or not the same way every time. At glibc's defaults freed memory is kept for reuse and the
peak RSS says more about the allocator than about the trainer: measured on 2 cores, the same trial (ours_gc,
1024 tokens) peaked at 2.2 GB in one run and 3.4 GB in the next, 1.5 GB with the threshold every time; at
2048 tokens 5.5 GB against 1.7 GB. The threshold costs CPU speed (page faults on every large tensor: ours_gc
at 2048 tokens 39 s a step instead of 26 s), which every variant pays; on CUDA it changes nothing measured.

Peak memory of a trial: on CPU the process's peak RSS during the trial (VmHWM, reset through
/proc/self/clear_refs before it starts, so model loading does not count, the loaded model does); on CUDA
torch.cuda.max_memory_allocated, reset before the trial (the host's peak RSS is printed beside it).

Fixed lengths (--lengths): each trained for --steps optimizer steps (the first untimed when there are more)
in a process of its own (CPU) or one process per variant for all of them (CUDA), apart from the search's,
under --fixed_memory_gb (default 75% of MemTotal, so speed is measured past the search's limit too); trained
tokens/s (targets of the loss), seconds per step, peak memory, and the time per token against the first
length (1.00x = no slower per token; attention, whose cost grows with the length, shows here). On CUDA, or
where --fixed_memory_gb is no more than --memory_gb, lengths at or past the search's first failure are not run.

Output: a table per method, the ratios of the longest contexts (ours*/trl), the versions of torch,
transformers, peft, trl and bitsandbytes, the device and the command line.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.metadata
import importlib.util
import itertools
import json
import os
import random
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import (
    StepClock,
    add_worker_arguments,
    benchmark_model,
    check_choices,
    child_env,
    peak_gpu_memory,
    peak_rss_mb,
    run_worker,
    running_benchmark,
    scratch,
    worker_command,
)
from benchmarks.sft import qa_pairs

VARIANTS = ("ours", "ours_gc", "ours_offload", "ours_auto", "ours_offload_tiled", "ours_auto_tiled", "trl", "trl_offload",
            "unsloth")
METHODS = ("lora", "qlora")
CUDA_ONLY = ("trl_offload",)
# What a failed allocation says where it is not a torch.OutOfMemoryError: the CPU allocator, cuBLAS workspaces.
MEMORY_ERRORS = ("out of memory", "can't allocate memory", "DefaultCPUAllocator", "CUBLAS_STATUS_ALLOC_FAILED")
LOAD_AT_START = os.getloadavg()[0]  # other jobs on the machine slow every trial: the report says how busy it was
POLL_SECONDS = 0.1  # the RSS watchdog's period: cheap (one /proc read), short enough not to overshoot by much


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    what = p.add_argument_group("what to measure")
    what.add_argument("--model", default=None, help="Model directory (default: the embedded SmolLM2-135M-Instruct).")
    what.add_argument("--method", default="lora", help="lora, qlora (4-bit NF4 base) or both, comma-separated.")
    what.add_argument("--variants", default=",".join(VARIANTS), help=f"Comma-separated subset of {', '.join(VARIANTS)}.")
    what.add_argument("--lora_r", type=int, default=16, help="LoRA rank (alpha = 2 r) on every linear layer.")
    what.add_argument("--lora_dropout", type=float, default=0.05, help="LoRA dropout (tunesmith's default; unsloth: 0).")
    what.add_argument("--learning_rate", type=float, default=2e-4)
    search = p.add_argument_group("the search for the longest context")
    search.add_argument("--start", type=int, default=1024, help="First length tried, in tokens; doubled until a trial fails.")
    search.add_argument("--max_length", type=int, default=1 << 20, help="The search stops here if this still fits.")
    search.add_argument("--precision", type=float, default=1.05,
                        help="Bisect until first failure / last success is at most this.")
    search.add_argument("--time_budget", type=float, default=0.0,
                        help="Seconds per variant for its search (0: none); past it the bracket reached is reported.")
    search.add_argument("--no_search", action="store_true", help="Only the fixed lengths.")
    limits = p.add_argument_group("memory limits")
    limits.add_argument("--memory_gb", type=float, default=None,
                        help="The search's memory: a worker whose RSS passes it is killed and its trial fails "
                             "(default: 75%% of MemTotal).")
    limits.add_argument("--fixed_memory_gb", type=float, default=None,
                        help="The same guard for the fixed lengths, which measure speed past the search's limit "
                             "too (default: 75%% of MemTotal).")
    limits.add_argument("--glibc_malloc", action="store_true",
                        help="Workers with glibc's allocator at its defaults, not MALLOC_MMAP_THRESHOLD_=65536 "
                             "(see below).")
    limits.add_argument("--gpu_memory_gb", type=float, default=None,
                        help="CUDA: cap the memory torch may allocate (set_per_process_memory_fraction), e.g. to "
                             "measure a smaller card.")
    limits.add_argument("--one_process", default=None, action=argparse.BooleanOptionalAction,
                        help="Run all trials of a variant in one process, loading the model once (default: on "
                             "CUDA only; on CPU the peak RSS is still per trial, but freed memory the allocator "
                             "keeps can raise a later trial's).")
    fixed = p.add_argument_group("fixed lengths")
    fixed.add_argument("--lengths", default="2048,8192,32768",
                       help="Comma-separated conversation lengths trained for --steps each ('' for none).")
    fixed.add_argument("--steps", type=int, default=2, help="Optimizer steps at each fixed length; the first untimed if > 1.")
    p.add_argument("--quick", action="store_true",
                   help="A smoke run: lengths 128 (search: one trial, --start 128 --max_length 128) and 128 "
                        "(--lengths), 2 steps.")
    add_worker_arguments(p, VARIANTS)
    args = p.parse_args(argv)
    return check(p, args)


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    if args.quick:
        args.start, args.max_length, args.lengths, args.steps = 128, 128, "128", 2
    check_choices(p, "variants", args.variants, VARIANTS)
    bad = [m for m in args.method.split(",") if m not in METHODS]
    if bad:
        p.error(f"--method {args.method}: unknown {bad}; choose lora, qlora or lora,qlora")
    try:
        args.fixed_lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError:
        p.error(f"--lengths {args.lengths}: give whole numbers of tokens, comma-separated (e.g. 2048,8192)")
    if args.precision <= 1 or args.start < 16 or args.steps < 1:
        p.error("--precision must be above 1, --start at least 16 and --steps at least 1")
    return args


# ---------------------------------------------------------------- the search


@dataclass
class Bracket:
    """Where a search ended: the longest length that fit, the shortest that did not (None: none found), and
    why it ended before the bracket was narrow enough (None: it did not)."""

    longest: int | None
    first_failure: int | None
    stopped: str | None = None


def longest_fitting(fits: Callable[[int], bool | None], start: int, cap: int, precision: float = 1.05,
                    floor: int = 16) -> Bracket:
    """The longest length for which fits() is True, assuming every shorter one fits too: doubling from
    `start` (halving while it fails, down to `floor`) up to `cap`, then bisection until the first failure is
    within `precision` times the longest fit. fits() returns None when it has no answer (time is up, or an
    error that is not about memory): the search stops there with the bracket it has."""
    longest = failure = None
    length = min(start, cap)
    while True:
        answer = fits(length)
        if answer is None:
            return Bracket(longest, failure, "stopped")
        if answer:
            longest = length
            if failure is not None or length >= cap:
                break
            length = min(2 * length, cap)
        else:
            failure = length
            if longest is not None:
                break
            if length // 2 < floor:
                return Bracket(None, failure)
            length //= 2
    while failure is not None and failure / longest > precision and failure - longest > 1:
        middle = (longest + failure) // 2
        answer = fits(middle)
        if answer is None:
            return Bracket(longest, failure, "stopped")
        if answer:
            longest = middle
        else:
            failure = middle
    return Bracket(longest, failure)


# ---------------------------------------------------------------- data


@functools.cache
def conversation_pairs() -> list[tuple[str, str]]:
    """(user, assistant) turns of similar size: the user quotes one docstring and asks about another function,
    whose docstring is the reply, so about half of a conversation's tokens are trained. The first question
    comes alone, so that even a short conversation reaches a reply."""
    pairs = qa_pairs()
    random.Random(0).shuffle(pairs)
    return [pairs[0]] + [(f"Here is part of Python's documentation:\n\n{context}\n\n{question}", answer)
                         for (_, context), (question, answer) in zip(pairs[1::2], pairs[2::2])]


def conversation(tokenizer: Any, tokens: int) -> list[dict[str, str]]:
    """Messages whose rendering is at least about `tokens` long (the pairs cycle for very long ones)."""
    messages, estimate = [], 0
    for user, reply in itertools.cycle(conversation_pairs()):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        estimate += len(tokenizer(user + reply)["input_ids"])
        if estimate >= tokens:
            return messages
    raise AssertionError("unreachable: the pairs cycle")


def conversation_dataset(tokenizer: Any, length: int, workdir: Path) -> Any:
    """One conversation of exactly `length` tokens, tokenized and masked by tunesmith's pipeline."""
    from tunesmith.data.dataset import build_sft_dataset
    from tunesmith.hparams import SFTDataArguments
    from tunesmith.utils.io import atomic_write_jsonl

    path = workdir / f"conversation-{length}.jsonl"
    margin = 64
    while True:
        atomic_write_jsonl(path, [{"messages": conversation(tokenizer, length + margin)}])
        # "cut": exactly max_seq_length tokens, even mid-reply (drop_turns would end up to a turn shorter)
        data_args = SFTDataArguments(data_path=[str(path)], max_seq_length=length, truncation="cut",
                                     multi_turn="whole")
        dataset = build_sft_dataset(tokenizer, data_args.data_path, data_args).select_columns(["input_ids", "labels"])
        got = len(dataset[0]["input_ids"])
        if len(dataset) == 1 and got == length:
            return dataset
        if got > length or margin > length:
            raise RuntimeError(f"the benchmark conversation is {got} tokens in {len(dataset)} rows, not {length}")
        margin *= 4  # the estimate (text without the template) fell short: more turns


# ---------------------------------------------------------------- memory


def rss_mb(pid: int | str = "self", key: str = "VmRSS") -> float:
    """A process's resident memory (VmRSS) or its peak (VmHWM) in MB, from /proc; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


def reset_peak_memory() -> None:
    """Start a trial's peak memory afresh: the RSS high-water mark (Linux: 5 to /proc/self/clear_refs) and
    torch's CUDA peak."""
    import torch

    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # peak_rss_mb() is then the process's peak since it started
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def default_memory_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return 0.75 * int(line.split()[1]) / 2**20
    return 16.0


def release_memory(model: Any) -> None:
    """After a trial, successful or not: what a failed step left (partial gradients, the exception's frames,
    cached CUDA blocks) goes, so the next trial starts from the loaded model alone."""
    import torch

    for parameter in model.parameters():
        parameter.grad = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def failure_kind(error: BaseException) -> str:
    import torch

    if isinstance(error, torch.OutOfMemoryError) or any(m in str(error) for m in MEMORY_ERRORS):
        return "oom"
    return "error"


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


# ---------------------------------------------------------------- the variants (in a worker process)


@dataclass
class Session:
    """A variant's loaded model, ready to train one conversation for some steps: train(dataset, length,
    steps) returns the step clock (its first tick is the start of training)."""

    model: Any
    tokenizer: Any
    train: Callable[[Any, int, int], StepClock]
    counts: list[dict]  # trained targets of each batch, as the trainer saw it (train() appends)


def clock_callback() -> tuple[StepClock, Any]:
    """A StepClock ticked when training starts and at the end of every optimizer step."""
    from transformers import TrainerCallback

    clock = StepClock()

    class Callback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.tick()

        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()

    return clock, Callback()


def counting(collator: Callable, counts: list[dict]) -> Callable:
    """The collator, recording each batch's trained targets (what the loss averages over)."""

    def collate(features: list[dict]) -> dict:
        batch = collator(features)
        targets = batch["shift_labels"] if "shift_labels" in batch else batch["labels"][..., 1:]
        counts.append({"trained": int((targets != -100).sum()), "positions": batch["input_ids"].numel()})
        return batch

    return collate


def output_dir(args: argparse.Namespace) -> str:
    return str(Path(args.workdir) / f"out-{args.method}-{args.worker}")


def ours_training_args(args: argparse.Namespace, steps: int, checkpointing: bool | str, tiled: bool = False) -> Any:
    from tunesmith.hparams import SFTTrainingArguments

    return SFTTrainingArguments(
        output_dir=output_dir(args), max_steps=steps, per_device_train_batch_size=1, learning_rate=args.learning_rate,
        save_strategy="no", report_to="none", logging_steps=1, disable_tqdm=True,
        gradient_checkpointing=checkpointing, tiled_mlp=tiled,
    )


def ours_session(args: argparse.Namespace, checkpointing: bool | str, tiled: bool = False) -> Session:
    """tunesmith as `tunesmith sft --packing` drives it (benchmarks/sft.py's run_ours)."""
    from tunesmith.hparams import FinetuningArguments, ModelArguments, SFTDataArguments
    from tunesmith.models.loader import load_model, load_tokenizer
    from tunesmith.train.stage_trainer import StageTrainer, sft_collator

    model_args = ModelArguments(model_name_or_path=args.model, dtype="auto",
                                quantization_bit=4 if args.method == "qlora" else None)
    lora = FinetuningArguments(lora_r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=args.lora_dropout)
    # the loader reads the checkpointing setting (it makes the frozen embeddings' output require grad)
    model = load_model(model_args, lora, ours_training_args(args, 1, checkpointing))
    tokenizer = load_tokenizer(model_args)
    counts: list[dict] = []

    def train(dataset: Any, length: int, steps: int) -> StepClock:
        training_args = ours_training_args(args, steps, checkpointing, tiled)
        data_args = SFTDataArguments(max_seq_length=length, packing=True)
        collator = counting(sft_collator(model, tokenizer, data_args, training_args), counts)
        clock, callback = clock_callback()
        trainer = StageTrainer(model=model, args=training_args, train_dataset=dataset, processing_class=tokenizer,
                              data_collator=collator, callbacks=[callback])
        trainer.train()
        return clock

    return Session(model, tokenizer, train, counts)


def trl_base_model(args: argparse.Namespace) -> Any:
    """The base model for TRL: bf16 weights (TRL trains in bf16 by default), 4-bit NF4 with bf16 compute for
    QLoRA as TRL's QLoRA docs load it."""
    import torch
    from transformers import AutoModelForCausalLM

    from tunesmith.hparams import ModelArguments
    from tunesmith.models.loader import quantization_config

    quantized = args.method == "qlora"
    model_args = ModelArguments(model_name_or_path=args.model, quantization_bit=4 if quantized else None)
    device = 0 if torch.cuda.is_available() else "cpu"
    return AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.bfloat16, device_map={"": device},
        quantization_config=quantization_config(model_args, torch.bfloat16) if quantized else None)


def trl_session(args: argparse.Namespace, offload: bool) -> Session:
    import torch
    from peft import LoraConfig, get_peft_model
    from trl import SFTConfig, SFTTrainer

    from tunesmith.hparams import ModelArguments
    from tunesmith.models.loader import find_lora_targets, load_tokenizer

    base = trl_base_model(args)
    config = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=args.lora_dropout,
                        target_modules=find_lora_targets(base), task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=args.model))
    counts: list[dict] = []

    def train(dataset: Any, length: int, steps: int) -> StepClock:
        sft_config = SFTConfig(  # bf16 and gradient checkpointing: TRL's defaults, left on
            output_dir=output_dir(args), max_steps=steps, per_device_train_batch_size=1,
            learning_rate=args.learning_rate, save_strategy="no", report_to="none", logging_steps=1,
            disable_tqdm=True, use_cpu=not torch.cuda.is_available(), gradient_checkpointing=True,
            # max_length None: TRL 1.16 refuses padding_free with a max_length it cannot enforce without packing;
            # the conversation is exactly `length` tokens already
            padding_free=True, max_length=None, loss_type="nll", activation_offloading=offload,
        )
        clock, callback = clock_callback()
        patched = base.__dict__.get("forward")  # SFTTrainer wraps the base model's forward (its fused LM head)
        trainer = SFTTrainer(model=model, args=sft_config, train_dataset=dataset, processing_class=tokenizer,
                             callbacks=[callback])
        trainer.data_collator = counting(trainer.data_collator, counts)
        try:
            trainer.train()
        finally:  # the next trial's SFTTrainer wraps the original forward again, not this wrapper
            base.__dict__.pop("forward", None)
            if patched is not None:
                base.forward = patched
        return clock

    return Session(model, tokenizer, train, counts)


def unsloth_session(args: argparse.Namespace) -> Session:
    """unsloth's own loader and LoRA (its offloaded checkpointing, dropout 0 for its fast path), trained by a
    plain loop: its patched forward computes the loss with its fused cross-entropy when given labels."""
    import torch
    from transformers import AutoConfig
    from unsloth import FastLanguageModel  # imported first by serve(), before transformers

    from tunesmith.models.loader import find_lora_targets

    # the model's own positions: a longer max_seq_length makes unsloth stretch RoPE (and size its caches to it)
    positions = getattr(AutoConfig.from_pretrained(args.model), "max_position_embeddings", args.max_length)
    model, tokenizer = FastLanguageModel.from_pretrained(model_name=args.model, max_seq_length=positions,
                                                         load_in_4bit=args.method == "qlora", dtype=None)
    targets = sorted({name.split(".")[-1] for name in find_lora_targets(model)})
    model = FastLanguageModel.get_peft_model(model, r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0,
                                             target_modules=targets, use_gradient_checkpointing="unsloth")
    counts: list[dict] = []

    def train(dataset: Any, length: int, steps: int) -> StepClock:
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=0.0)
        ids = torch.tensor([dataset[0]["input_ids"]], device=model.device)
        labels = torch.tensor([dataset[0]["labels"]], device=model.device)
        clock = StepClock()
        clock.tick()
        model.train()
        for _ in range(steps):
            counts.append({"trained": int((labels[:, 1:] != -100).sum()), "positions": ids.numel()})
            model(input_ids=ids, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            clock.tick()
        return clock

    return Session(model, tokenizer, train, counts)


SESSIONS: dict[str, Callable[[argparse.Namespace], Session]] = {
    "ours": lambda a: ours_session(a, False),
    "ours_gc": lambda a: ours_session(a, True),
    "ours_offload": lambda a: ours_session(a, "offload"),
    "ours_auto": lambda a: ours_session(a, "auto"),
    "ours_offload_tiled": lambda a: ours_session(a, "offload", tiled=True),
    "ours_auto_tiled": lambda a: ours_session(a, "auto", tiled=True),
    "trl": lambda a: trl_session(a, offload=False),
    "trl_offload": lambda a: trl_session(a, offload=True),
    "unsloth": unsloth_session,
}


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    return f"CPU, {os.cpu_count()} CPUs"


def run_trial(session: Session, args: argparse.Namespace, length: int, steps: int) -> dict:
    """Trains `steps` optimizer steps on one conversation of `length` tokens; its timing and peak memory, or
    how it failed ("oom": out of memory, "error": anything else)."""
    session.counts.clear()
    result: dict[str, Any] = {"length": length, "steps": steps}
    try:
        dataset = conversation_dataset(session.tokenizer, length, Path(args.workdir))
        reset_peak_memory()
        clock = session.train(dataset, length, steps)
        result.update(status="ok", **timing(clock, session.counts, steps))
    except Exception as error:  # every failure is a result: the driver decides what it means
        result.update(status=failure_kind(error), error=one_line(error))
    # the exception (and with it the trainer's frames) is gone here, so its memory can be freed
    result.update(peak_rss_mb=peak_rss_mb(), **peak_gpu_memory())
    release_memory(session.model)
    return result


def timing(clock: StepClock, counts: list[dict], steps: int) -> dict:
    """Seconds per step and trained tokens per second; the first step is left out when there are more."""
    ends = clock.ends
    if len(ends) != steps + 1:
        raise RuntimeError(f"{len(ends) - 1} optimizer steps ran, not {steps}")
    timed = range(2, steps + 1) if steps > 1 else range(1, 2)
    seconds = sum(ends[s] - ends[s - 1] for s in timed) / len(timed)
    trained = sum(counts[s - 1]["trained"] for s in timed) / len(timed)
    return {"seconds_per_step": seconds, "first_step_s": ends[1] - ends[0], "trained_per_step": trained,
            "tokens_per_s": trained / seconds}


def serve(args: argparse.Namespace, workdir: Path) -> dict:
    """A worker: loads its variant once, then runs each trial request read from stdin (one JSON line:
    id, length, steps) and writes its result to workdir/result-<id>.json. Stops at the end of its input, or
    after an error that is not about memory."""
    if args.worker == "unsloth":
        import unsloth  # noqa: F401  (unsloth patches transformers and TRL: it must come before them)
    import torch

    if args.gpu_memory_gb and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.gpu_memory_gb * 2**30 / total))
    session = SESSIONS[args.worker](args)
    trials = 0
    for line in sys.stdin:
        request = json.loads(line)
        result = {**run_trial(session, args, request["length"], request["steps"]), "device": device_name()}
        write_json(workdir / f"result-{request['id']}.json", result)
        trials += 1
        if result["status"] == "error":
            break
    return {"trials": trials}


def write_json(path: Path, value: dict) -> None:
    """Written whole or not at all: the driver polls for the file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


# ---------------------------------------------------------------- the driver's side of a worker


class Worker:
    """The driver's handle on the worker process of one variant and method. Per trial (CPU) a process of its
    own; with one_process one process for all trials, restarted when one was killed. While a trial runs the
    driver polls the process's RSS and kills it past the memory limit or the deadline."""

    def __init__(self, args: argparse.Namespace, variant: str, method: str, workdir: Path, limit_gb: float,
                 env: dict[str, str] | None = None, name: str = ""):
        self.args, self.variant, self.method, self.workdir = args, variant, method, workdir
        self.one_process, self.limit_gb, self.env = args.one_process, limit_gb, env
        self.proc: subprocess.Popen | None = None
        self.count = 0
        self.name = f"{method}-{variant}{name}"
        self.log = workdir / f"{self.name}.log"

    def start(self) -> subprocess.Popen:
        a = self.args
        command = worker_command(__spec__.name, self.variant, self.workdir, "--model", a.model, "--method", self.method,
                                 "--lora_r", str(a.lora_r), "--lora_dropout", str(a.lora_dropout),
                                 "--learning_rate", str(a.learning_rate), "--max_length", str(a.max_length))
        if a.gpu_memory_gb:
            command += ["--gpu_memory_gb", str(a.gpu_memory_gb)]
        with open(self.log, "a") as log:
            return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, text=True,
                                    env=child_env(**(self.env or {})))

    def trial(self, length: int, steps: int, deadline: float | None) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self.start()
        self.count += 1
        request_id = f"{self.name}-{self.count}"
        self.proc.stdin.write(json.dumps({"id": request_id, "length": length, "steps": steps}) + "\n")
        self.proc.stdin.flush()
        if not self.one_process:
            self.proc.stdin.close()
        result = self.wait(self.workdir / f"result-{request_id}.json", deadline)
        if not self.one_process or result["status"] == "error":
            self.stop()  # a worker that caught an out-of-memory error lives on for the next trial
        return {"length": length, "steps": steps, **result}

    def wait(self, path: Path, deadline: float | None) -> dict:
        while True:
            if path.exists():
                return json.loads(path.read_text())
            code = self.proc.poll()
            if code is not None:
                if path.exists():
                    continue
                if code == -9:  # SIGKILL not sent by us: the kernel's out-of-memory killer
                    return {"status": "oom", "error": "killed by the system (out of memory)"}
                return {"status": "error", "error": f"worker exited with {code}: {self.last_log_line()}"}
            rss = rss_mb(self.proc.pid)
            if rss > self.limit_gb * 1024:
                self.kill()
                return {"status": "oom", "error": f"killed at RSS {rss:.0f} MB > {self.limit_gb:g} GB"}
            if deadline is not None and time.monotonic() > deadline:
                self.kill()
                return {"status": "budget", "error": "at the end of --time_budget"}
            time.sleep(POLL_SECONDS)

    def stop(self) -> None:
        """Ends a worker between trials: at the end of its input it exits (killed if it takes too long)."""
        if self.proc is None:
            return
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def last_log_line(self) -> str:
        lines = [x for x in self.log.read_text(errors="replace").splitlines() if x.strip()] if self.log.exists() else []
        return lines[-1][:300] if lines else "(no output)"


# ---------------------------------------------------------------- the driver


@dataclass
class VariantResult:
    variant: str
    skipped: str | None = None  # why the variant did not run
    bracket: Bracket | None = None
    trials: list[dict] = field(default_factory=list)
    fixed: list[dict] = field(default_factory=list)
    error: str | None = None  # the error that stopped it

    def trial_at(self, length: int | None) -> dict | None:
        return next((t for t in self.trials if t["length"] == length and t["status"] == "ok"), None)


def describe(trial: dict, cuda: bool) -> str:
    if trial["status"] != "ok":
        return {"oom": "out of memory", "budget": "stopped"}.get(trial["status"], "error") + f" ({trial.get('error')})"
    memory = f"peak GPU {trial['peak_gpu_mb']:.0f} MB, RSS {trial['peak_rss_mb']:.0f} MB" if cuda else \
        f"peak RSS {trial['peak_rss_mb']:.0f} MB"
    return (f"fits, {trial['seconds_per_step']:.2f} s/step, {trial['tokens_per_s']:.1f} trained tokens/s, "
            f"{memory}")


def skip_reason(variant: str, cuda: bool) -> str | None:
    if variant in CUDA_ONLY and not cuda:
        return "CUDA only (on CPU the activations already live in CPU memory)"
    if variant == "unsloth" and importlib.util.find_spec("unsloth") is None:
        return "unsloth is not installed (it pins transformers <= 5.17, trl <= 1.15)"
    return None


def measure_variant(args: argparse.Namespace, variant: str, method: str, workdir: Path, cuda: bool) -> VariantResult:
    """The search for the longest context, then the fixed lengths, printing each trial as it ends."""
    out = VariantResult(variant, skipped=skip_reason(variant, cuda))
    if out.skipped:
        print(f"{method} {variant}: skipped: {out.skipped}", flush=True)
        return out
    if not args.no_search:
        search(args, out, Worker(args, variant, method, workdir, args.memory_gb, worker_env(args), "-search"), cuda)
    # the fixed lengths in workers of their own, under their own memory guard
    fixed = Worker(args, variant, method, workdir, args.fixed_memory_gb, worker_env(args), "-fixed")
    failure = out.bracket.first_failure if out.bracket else None
    past_failure = cuda or args.fixed_memory_gb <= args.memory_gb  # the search's failure holds here too
    try:
        for length in args.fixed_lengths:
            if out.error or (past_failure and failure is not None and length >= failure):
                continue
            out.fixed.append(report(fixed.trial(length, args.steps, None), method, variant, out, cuda))
    finally:
        fixed.kill()
    return out


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    """A fixed mmap threshold (a fixed one also stops glibc raising it as memory is freed): every allocation over
    64 KB is its own mapping, given back when freed, so a trial's peak RSS follows its live tensors (the module
    docstring has the measurements)."""
    return {} if args.glibc_malloc else {"MALLOC_MMAP_THRESHOLD_": "65536"}


def over_limit(trial: dict, memory_gb: float, cuda: bool) -> dict:
    """A trial that finished although its peak RSS passed the limit (a peak shorter than the watchdog's 0.1 s poll)
    did not fit either: the criterion is the peak, not what the poll happened to see."""
    if not cuda and trial["status"] == "ok" and trial["peak_rss_mb"] > memory_gb * 1024:
        return {**trial, "status": "oom", "error": f"peak RSS {trial['peak_rss_mb']:.0f} MB > {memory_gb:g} GB"}
    return trial


def report(trial: dict, method: str, variant: str, out: VariantResult, cuda: bool) -> dict:
    print(f"{method} {variant} L={trial['length']} steps={trial['steps']}: {describe(trial, cuda)}", flush=True)
    if trial["status"] == "error":
        out.error = trial.get("error")
    return trial


def search(args: argparse.Namespace, out: VariantResult, worker: Worker, cuda: bool) -> None:
    """The longest length that trains one step under the worker's memory limit, into out.bracket; every trial
    into out.trials."""
    deadline = time.monotonic() + args.time_budget if args.time_budget else None

    def fits(length: int) -> bool | None:
        trial = over_limit(worker.trial(length, 1, deadline), args.memory_gb, cuda)
        out.trials.append(report(trial, worker.method, worker.variant, out, cuda))
        return {"ok": True, "oom": False}.get(trial["status"])

    try:
        out.bracket = longest_fitting(fits, args.start, args.max_length, args.precision)
    finally:  # between trials (or interrupted): nothing of the worker's is left to keep
        worker.kill()
    if out.bracket.stopped:
        out.bracket.stopped = "error" if out.error else "time budget"


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if run_worker(args, dict.fromkeys(VARIANTS, serve)):
        return
    import torch

    cuda = torch.cuda.is_available()
    args.model = benchmark_model(args.model)
    args.memory_gb = args.memory_gb or default_memory_gb()
    args.fixed_memory_gb = args.fixed_memory_gb or default_memory_gb()
    if args.one_process is None:
        args.one_process = cuda
    results: dict[str, list[VariantResult]] = {}
    with scratch(__spec__.name) as workdir:  # the generated conversations stay out of the real cache
        print(f"model {args.model}; memory limit {args.memory_gb:.3g} GB RSS for the search, "
              f"{args.fixed_memory_gb:.3g} GB for the fixed lengths; "
              f"{'one process per variant' if args.one_process else 'one process per trial'}; workers with "
              f"{worker_env(args) or 'glibc malloc defaults'}", flush=True)
        for method in args.method.split(","):
            results[method] = [measure_variant(args, v, method, workdir, cuda) for v in args.variants.split(",")]
    device = next((t["device"] for rs in results.values() for r in rs for t in r.trials + r.fixed if "device" in t),
                  "cuda" if cuda else "cpu")
    for method, rows in results.items():
        print_table(args, method, rows, cuda)
    print_environment(device)


# ---------------------------------------------------------------- the report


def print_table(args: argparse.Namespace, method: str, rows: list[VariantResult], cuda: bool) -> None:
    unit = "peak GPU MB" if cuda else "peak RSS MB"
    print(f"\n== {method}: the longest conversation that trains one optimizer step "
          f"(search from {args.start}, to within {args.precision:g}x, cap {args.max_length}; memory limit "
          f"{args.memory_gb:.3g} GB RSS{f', GPU {args.gpu_memory_gb:g} GB' if args.gpu_memory_gb else ''}; "
          f"{'; '.join(f'{k}={v}' for k, v in worker_env(args).items()) or 'glibc malloc defaults'})")
    print(f"{'variant':<14}{'longest L':>10}{'first failing L':>16}{unit:>13}{'s, 1 step':>10}  search")
    for r in rows:
        if r.skipped or r.bracket is None:
            print(f"{r.variant:<14}  {'skipped: ' + r.skipped if r.skipped else 'no search (--no_search)'}")
            continue
        b, best = r.bracket, r.trial_at(r.bracket.longest)
        peak = f"{best['peak_gpu_mb' if cuda else 'peak_rss_mb']:.0f}" if best else "-"
        seconds = f"{best['seconds_per_step']:.1f}" if best else "-"
        print(f"{r.variant:<14}{b.longest or '-':>10}{b.first_failure or '-':>16}{peak:>13}{seconds:>10}  "
              f"{search_note(r, args)}")
    print_ratios(rows)
    print_fixed(args, method, rows, cuda)


def search_note(r: VariantResult, args: argparse.Namespace) -> str:
    b = r.bracket
    if b.stopped == "error":
        return f"error: {r.error}"
    if b.stopped:
        return f"stopped by --time_budget {args.time_budget:g} s: the answer lies in [{b.longest}, {b.first_failure})"
    if b.first_failure is None:
        return f"--max_length {args.max_length} fits (the search stopped there)"
    if b.longest is None:
        return "nothing fits"
    return f"{len(r.trials)} trials"


def print_ratios(rows: list[VariantResult]) -> None:
    """ours*/trl* of the longest contexts; a bracket left open (the cap fit, or the search stopped) makes its
    side a bound, and the line says so."""
    brackets = {r.variant: r.bracket for r in rows if r.bracket and r.bracket.longest}
    for ours in ("ours", "ours_gc", "ours_offload", "ours_auto", "ours_offload_tiled", "ours_auto_tiled"):
        for trl in ("trl", "trl_offload"):
            if ours not in brackets or trl not in brackets:
                continue
            a, b = brackets[ours], brackets[trl]
            open_a, open_b = a.stopped or a.first_failure is None, b.stopped or b.first_failure is None
            bound = "" if not (open_a or open_b) else "at least " if not open_b else "at most " if not open_a \
                else "both sides lower bounds, "
            print(f"longest context {ours}/{trl}: {bound}{a.longest / b.longest:.2f}x")


def print_fixed(args: argparse.Namespace, method: str, rows: list[VariantResult], cuda: bool) -> None:
    if not args.fixed_lengths:
        return
    print(f"\n{method}: fixed lengths, {args.steps} optimizer step(s) each"
          f"{' (the first untimed)' if args.steps > 1 else ''}; time per token against the first length")
    print(f"{'variant':<14}{'length':>8}{'tokens/s':>10}{'s/step':>9}{'peak GPU MB' if cuda else 'peak RSS MB':>13}"
          f"{'host RSS MB' if cuda else '':>12}{'time/token':>11}  trained tokens/step")
    for r in rows:
        base = None
        for t in r.fixed:
            if t["status"] != "ok":
                print(f"{r.variant:<14}{t['length']:>8}  {describe(t, cuda)}")
                continue
            per_token = t["seconds_per_step"] / t["length"]
            base = base or per_token
            peak = t["peak_gpu_mb"] if cuda else t["peak_rss_mb"]
            host = f"{t['peak_rss_mb']:.0f}" if cuda else ""
            print(f"{r.variant:<14}{t['length']:>8}{t['tokens_per_s']:>10.1f}{t['seconds_per_step']:>9.2f}{peak:>13.0f}"
                  f"{host:>12}{per_token / base:>10.2f}x  {t['trained_per_step']:.0f}")
        skipped = [n for n in args.fixed_lengths if n not in {t['length'] for t in r.fixed}]
        if skipped and not r.skipped:
            print(f"{r.variant:<14}  not run: {', '.join(map(str, skipped))} (at or past the first failure, or an error)")


def print_environment(device: str) -> None:
    versions = []
    for package in ("torch", "transformers", "peft", "trl", "bitsandbytes", "accelerate", "unsloth"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            if package != "unsloth":
                versions.append(f"{package} not installed")
    print(f"\nversions: {', '.join(versions)}\ndevice: {device}\n1-minute load average at the end: "
          f"{os.getloadavg()[0]:.1f} (at the start: {LOAD_AT_START:.1f})")
    python = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else sys.executable
    print("command: " + " ".join(shlex.quote(x) for x in [python, "-m", running_benchmark(), *sys.argv[1:]]))


if __name__ == "__main__":
    main()
