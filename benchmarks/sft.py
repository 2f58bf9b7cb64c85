"""SFT throughput: tunesmith against TRL's SFTTrainer and a plain PyTorch loop, as medians of repeated runs.

    .venv/bin/python -m benchmarks.sft [--model DIR] [--steps 6] [--batch_size 4] [--max_seq_length 512]
                                       [--max_turns 10] [--repeats 3] [--variants ours,trl_packed,...]

Every variant trains the same LoRA adapter (tunesmith's loader: every linear layer, r, alpha = 2r,
--lora_dropout 0.05) on the same model, from the same conversations taken in the same order, for the
same number of optimizer steps with AdamW at the same learning rate; TRL and the plain loop without gradient
checkpointing (their fastest), tunesmith at its own default (checkpointing for QLoRA on a GPU, else none):
  ours                tunesmith with --packing and its defaults: one padding-free row per batch (sdpa_varlen,
                      logits of trained positions only, the loss's gradient built chunk by chunk, or on long
                      forwards the loss from the hidden states through the tiled head) run as forwards of at
                      most 2,048 tokens on CPU, on a GPU as many as the free memory holds (--max_forward_tokens),
                      bf16 where the hardware has it (a LoRA base then loads in bf16, autocast runs the
                      products), the fast CPU LoRA dropout
  ours_gc             ours with --gradient_checkpointing true (what checkpointing costs and saves)
  ours_qlora_no_gc    ours_qlora with --gradient_checkpointing false (on a GPU the default is auto: layers kept where
                      the free memory holds them, train/layer_modes.py)
  ours_qlora_gc       ours_qlora with --gradient_checkpointing true (every layer recomputed: the default until auto)
  trl_packed_gc       trl_packed with gradient checkpointing, as TRL's SFTConfig defaults to
  trl_packed_qlora_gc trl_packed_qlora with gradient checkpointing
  ours_fp32           ours with --bf16 false: float32 weights and products (what bf16 adds, alone)
  ours_torch_dropout  ours with PEFT's own LoRA dropout (what the fast dropout adds, alone)
  ours_torch_loss     ours with transformers' own ForCausalLMLoss (what the chunked loss adds, alone)
  ours_one_forward    ours with --max_forward_tokens 0: each packed batch in one forward, however long
                      (what splitting it into forwards of at most 2,048 tokens does, alone)
  trl_padded          TRL's SFTTrainer at its defaults (bf16 mixed precision, which TRL turns on by
                      default, CPU included), padded batches, a float32 model as TRL's docs load it
  trl_packed          the same, packing=True (best-fit-decreasing rows of max_seq_length, padding-free);
                      it packs the whole set, so its batches hold other examples; the batch size in rows is
                      picked so a step trains about as many tokens as the others
  plain               a bare float32 loop: each example forward/backward alone (no padding, no mask),
                      one AdamW step per batch, the Trainer's linear decay; the loss reference
  ours_row_capped     ours with --max_forward_tokens max_seq_length: forwards no longer than TRL's packed rows, so
                      peak memory compares like with like (the GPU default runs a step as one forward)
  ours_sdpa_loop      ours with packed attention as SDPA once per example (the CPU kernel) where CUDA would
                      take torch's flash varlen kernel (what that kernel adds, alone; models/attention.py)
  ours_compiled       ours with --torch_compile true (inductor fuses the small elementwise kernels that leave
                      a GPU waiting on the host; the first steps compile)
  ours_liger          ours with --use_liger_kernel (Liger's fused linear cross-entropy and kernels; CUDA)
  ours_qlora          ours on a 4-bit NF4 base (QLoRA)
  trl_packed_qlora    trl_packed on the same 4-bit base (bf16 compute, as TRL's QLoRA docs set it), given to
                      SFTTrainer with a peft_config: TRL attaches the same LoRA itself, in bf16
Each run is its own subprocess (peak RSS is its own); the variants take turns, --repeats times; the
table gives medians with the spread (min-max) of tokens/s. The first step is a warm-up and is not timed:
throughput is trained tokens (targets of the loss) from step 2 on, over the time from the end of step 1
to the end of the last step (data loading included). Each run waits for idle cores and reports the share
other processes took while it ran (`other CPU`; see benchmarks/common.py). `loss vs plain` is the largest difference of a step's loss from the plain loop's at the same
step (the same conversations; dropout draws differ), for the variants that train the same batches.
On CUDA the table adds peak GPU memory and MFU: 6 x parameters x tokens computed per second over the GPU's
dense bf16 peak (the usual convention; a LoRA run skips the frozen weights' gradients, about a third of
that). --profile DIR writes each variant's torch.profiler table of steps 3-4 to DIR/<variant>.txt; steps 3-5 (the
profiled ones and the one that builds the table) are then left out of the throughput.

The conversations are built here, deterministically and offline: user/assistant pairs from
data/demo/sft.jsonl (when present) and questions about standard-library functions answered with their
docstrings, 1 to --max_turns pairs per conversation (log-uniform), cut at --max_seq_length by dropping
trailing turns.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
import random
from pathlib import Path
from typing import Any

from benchmarks.common import (
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
    peak_gpu_memory,
    peak_rss_mb,
    run_interleaved,
    run_worker,
    scratch,
    spread,
    trainer_clock,
)

VARIANTS = ("ours", "ours_fp32", "ours_torch_dropout", "ours_torch_loss", "ours_one_forward", "ours_row_capped",
            "ours_sdpa_loop", "ours_compiled", "ours_liger", "trl_padded", "trl_packed", "plain", "ours_qlora",
            "trl_packed_qlora", "ours_gc", "ours_qlora_no_gc", "ours_qlora_gc", "trl_packed_gc",
            "trl_packed_qlora_gc")
DEFAULT_VARIANTS = ("ours", "ours_fp32", "ours_torch_dropout", "ours_torch_loss", "trl_padded", "trl_packed", "plain")
SAME_BATCHES = ("ours", "ours_fp32", "ours_torch_dropout", "ours_torch_loss", "ours_one_forward", "ours_row_capped",
                "ours_sdpa_loop", "ours_compiled", "ours_liger", "trl_padded", "plain", "ours_qlora", "ours_gc",
                "ours_qlora_no_gc", "ours_qlora_gc")
DEMO_SFT = ROOT / "data" / "demo" / "sft.jsonl"
STDLIB_MODULES = ("argparse", "bisect", "collections", "csv", "datetime", "functools", "heapq", "inspect",
                  "itertools", "json", "logging", "math", "os", "pathlib", "random", "re", "shutil", "statistics",
                  "string", "subprocess", "textwrap", "typing")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="Model directory (default: the embedded SmolLM2-135M-Instruct).")
    p.add_argument("--steps", type=int, default=6, help="Optimizer steps per run; the first is not timed.")
    p.add_argument("--batch_size", type=int, default=4, help="Conversations per step (all but trl_packed).")
    p.add_argument("--max_seq_length", type=int, default=512, help="Longer conversations lose trailing turns.")
    p.add_argument("--max_turns", type=int, default=10, help="Most question/answer pairs in one conversation.")
    p.add_argument("--lora_r", type=int, default=16, help="LoRA rank (alpha = 2 r) on every linear layer.")
    p.add_argument("--lora_dropout", type=float, default=0.05,
                   help="0 makes every variant's loss curve comparable draw for draw (`loss vs plain`).")
    p.add_argument("--learning_rate", type=float, default=2e-4)
    p.add_argument("--conversations", type=int, default=300, help="Size of the generated benchmark set.")
    add_quiet_arguments(p)
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"Comma-separated subset of {', '.join(VARIANTS)}.")
    p.add_argument("--gpu_memory_gb", type=float, default=None,
                   help="Cap the GPU memory each variant's process may use (torch's per-process memory fraction).")
    p.add_argument("--profile", metavar="DIR", help="Write each variant's profile of steps 3-4 to DIR/<variant>.txt.")
    add_worker_arguments(p, VARIANTS)
    args = p.parse_args(argv)
    check_choices(p, "variants", args.variants, VARIANTS)
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


def benchmark_conversations(n: int, max_turns: int = 10, seed: int = 0) -> list[dict]:
    pairs = qa_pairs()
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        turns = int(math.exp(rng.uniform(0, math.log(max_turns + 0.99))))  # 1..max_turns, log-uniform
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

    atomic_write_jsonl(workdir / "bench.jsonl", benchmark_conversations(args.conversations, args.max_turns))
    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=args.model))
    data_args = DataArguments(data_path=[str(workdir / "bench.jsonl")], max_seq_length=args.max_seq_length)
    dataset = build_sft_dataset(tokenizer, data_args.data_path, data_args).select_columns(["input_ids", "labels"])
    dataset.save_to_disk(str(workdir / "tokenized"))
    lengths = sorted(len(ids) for ids in dataset["input_ids"])
    used = [len(ids) for ids in dataset["input_ids"][: args.steps * args.batch_size]]
    return {"examples": len(lengths), "min": lengths[0], "median": lengths[len(lengths) // 2], "max": lengths[-1],
            "timed_mean": sum(used) / len(used), "timed_max": max(used)}


# ---------------------------------------------------------------- measuring


def count_tokens(batch: dict) -> dict:
    """A batch's positions computed, real tokens and trained targets (what the loss is normalized by)."""
    ids = batch["input_ids"]
    real = int(batch["attention_mask"].sum()) if "attention_mask" in batch else ids.numel()
    targets = batch["shift_labels"] if "shift_labels" in batch else batch["labels"][..., 1:]
    return {"positions": ids.numel(), "real": real, "trained": int((targets != -100).sum())}


# With --profile, steps 3-4 run under torch.profiler (slower launches) and step 5's interval holds the building of
# its table (seconds): their intervals and tokens stay out of the measured throughput.
PROFILED_STEPS = range(3, 6)


def summarize(clock: StepClock, batches: list[dict], steps: int, losses: list[float], profiled: bool = False) -> dict:
    # batch i is step i+1's (one batch per step); step 1 is the warm-up, so step s is timed from the end of s-1
    timed = [s for s in range(2, steps + 1) if not (profiled and s in PROFILED_STEPS)]
    seconds = sum(clock.ends[s - 1] - clock.ends[s - 2] for s in timed)
    cpu_seconds = sum(clock.cpu[s - 1] - clock.cpu[s - 2] for s in timed)
    trained = sum(batches[s - 1]["trained"] for s in timed)
    positions = sum(batches[s - 1]["positions"] for s in timed)
    real = sum(batches[s - 1]["real"] for s in timed)
    return {
        "steps": len(clock.ends), "seconds": seconds, "trained_tokens": trained, "tokens_per_s": trained / seconds,
        "positions_per_s": positions / seconds,
        "largest_step": max(b["positions"] for b in batches[:steps]),  # tokens: what peak memory follows
        # CPU seconds are less sensitive than wall time to other jobs sharing the cores
        "tokens_per_cpu_s": trained / cpu_seconds,
        "padded_share": 1 - real / positions, "peak_rss_mb": peak_rss_mb(),
        "losses": losses, **peak_gpu_memory(),
    }


def step_profiler(args: argparse.Namespace) -> list:
    """With --profile: a Trainer callback that profiles steps 3-4 and writes the table of ops by their own
    device time (CPU time without CUDA) to DIR/<variant>.txt, headed by the wall time and, on CUDA, the share
    of it the GPU was busy."""
    if not args.profile:
        return []
    import time

    import torch
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])

    class Profile(TrainerCallback):
        def on_step_begin(self, a, state, control, **kwargs):
            if state.global_step == 2:
                if cuda:
                    torch.cuda.synchronize()
                self.prof, self.start = torch.profiler.profile(activities=activities), time.perf_counter()
                self.prof.__enter__()

        def on_step_end(self, a, state, control, **kwargs):
            if state.global_step == 4 and hasattr(self, "prof"):
                if cuda:
                    torch.cuda.synchronize()
                wall = time.perf_counter() - self.start
                self.prof.__exit__(None, None, None)
                events = self.prof.key_averages()
                key = "self_device_time_total" if cuda else "self_cpu_time_total"
                head = f"{args.worker}: steps 3-4, {wall:.3f} s wall"
                if cuda:
                    busy = sum(e.self_device_time_total for e in events
                               if e.device_type == torch.autograd.DeviceType.CUDA) / 1e6
                    head += f", GPU kernels {busy:.3f} s ({busy / wall:.0%} busy)"
                Path(args.profile).mkdir(parents=True, exist_ok=True)
                table = events.table(sort_by=key, row_limit=30)
                Path(args.profile, f"{args.worker}.txt").write_text(head + "\n" + table)

    return [Profile()]


# ---------------------------------------------------------------- variants


def default_checkpointing(quantize: bool) -> bool | str:
    """tunesmith's --gradient_checkpointing when left out, for a LoRA or QLoRA SFT run of packed rows here (on a GPU:
    auto, each forward's layers as the free memory needs)."""
    from tunesmith.hparams import SFTTrainingArguments
    from tunesmith.hparams.training_args import resolve_checkpointing

    values = {"gradient_checkpointing": None, "finetuning_type": "lora", "quantization_bit": 4 if quantize else None,
              "packing": True}
    resolve_checkpointing(values, [SFTTrainingArguments])
    return values["gradient_checkpointing"] or False  # "auto" on a GPU: the forward budget's layer modes


def load(args: argparse.Namespace, workdir: Path, tunesmith_defaults: bool, bf16: bool | None = None,
         quantize: bool = False, checkpointing: bool | str | None = None) -> tuple[Any, Any, Any, Any]:
    """(tokenized dataset, tokenizer, LoRA model, tunesmith TrainingArguments). tunesmith_defaults=False
    loads as a user of TRL or plain PyTorch would: a float32 model with PEFT's own LoRA layers as they come, or
    for a 4-bit one the quantized base alone (bf16 compute), to which TRL attaches the adapter."""
    from datasets import load_from_disk
    from transformers import set_seed

    from tunesmith.hparams import FinetuningArguments, ModelArguments
    from tunesmith.hparams import SFTTrainingArguments as TrainingArguments
    from tunesmith.models.loader import load_model, load_tokenizer

    training_args = TrainingArguments(
        output_dir=str(workdir / args.worker), max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, bf16=bf16,
        gradient_checkpointing=default_checkpointing(quantize) if checkpointing is None else checkpointing,
        **TIMED_TRAINER,
    )
    dtype = "auto" if tunesmith_defaults else "bfloat16" if quantize else "float32"
    model_args = ModelArguments(model_name_or_path=args.model, dtype=dtype, quantization_bit=4 if quantize else None)
    set_seed(0)
    lora = FinetuningArguments(lora_r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=args.lora_dropout)
    if quantize and not tunesmith_defaults:
        # TRL's QLoRA: the 4-bit base alone, which SFTTrainer gets with a peft_config (run_trl). TRL does not call
        # PEFT's prepare_model_for_kbit_training, so embeddings and norms stay bf16, and it casts the adapter to bf16.
        import torch
        from transformers import AutoModelForCausalLM

        from tunesmith.models.loader import quantization_config

        model = AutoModelForCausalLM.from_pretrained(
            args.model, dtype=torch.bfloat16, quantization_config=quantization_config(model_args, torch.bfloat16),
            device_map={"": 0 if torch.cuda.is_available() else "cpu"})
    else:
        model = load_model(model_args, lora, training_args)
        if not tunesmith_defaults:
            stock_peft_layers(model)
    return load_from_disk(str(workdir / "tokenized")), load_tokenizer(model_args), model, training_args


def stock_peft_layers(model: Any) -> None:
    """Undo what tunesmith's loader changes in PEFT's LoRA layers on CPU (models/lora_dropout.py)."""
    import torch

    from tunesmith.models.lora_dropout import FastDropout

    for module in model.modules():
        dropouts = getattr(module, "lora_dropout", None)
        if isinstance(dropouts, torch.nn.ModuleDict):
            for name, dropout in list(dropouts.items()):
                if isinstance(dropout, FastDropout):
                    dropouts[name] = torch.nn.Dropout(dropout.p)
        if hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = True


def run_ours(args: argparse.Namespace, workdir: Path, bf16: bool | None = None, quantize: bool = False,
             torch_dropout: bool = False, torch_loss: bool = False, max_forward_tokens: int | None = None,
             sdpa_loop: bool = False, liger: bool = False, compiled: bool = False,
             checkpointing: bool | str | None = None) -> dict:
    from tunesmith.hparams import SFTDataArguments as DataArguments
    from tunesmith.train.stage_trainer import StageTrainer, sft_collator

    dataset, tokenizer, model, training_args = load(args, workdir, True, bf16=bf16, quantize=quantize,
                                                    checkpointing=checkpointing)
    if torch_dropout:
        stock_peft_layers(model)
    if sdpa_loop:  # the per-example kernel wherever the flash varlen kernel would run
        import tunesmith.models.attention as attention

        attention.packed_kernel = lambda query, key, *features: attention.SDPA_PER_EXAMPLE
    training_args.use_liger_kernel = liger
    training_args.torch_compile = compiled
    data_args = DataArguments(max_seq_length=args.max_seq_length, packing=True, max_forward_tokens=max_forward_tokens)
    clock, callback = trainer_clock()
    collator = CountingCollator(sft_collator(model, tokenizer, data_args, training_args), count_tokens)
    trainer = StageTrainer(model=model, args=training_args, train_dataset=dataset, processing_class=tokenizer,
                          data_collator=collator, callbacks=[callback, *step_profiler(args)])
    if torch_loss:
        del model.get_base_model()._loss_function  # back to the class's ForCausalLMLoss
    trainer.train()
    return {**summarize(clock, collator.counts, args.steps, logged_losses(trainer), bool(args.profile)),
            "parameters": parameters(model)}


def parameters(model: Any) -> int:
    from tunesmith.models.loader import log_parameter_counts

    return log_parameter_counts(model)[1]


def run_trl(args: argparse.Namespace, workdir: Path, packing: bool, quantize: bool = False,
            checkpointing: bool = False) -> dict:
    import torch
    from trl import SFTConfig, SFTTrainer

    dataset, tokenizer, model, training_args = load(args, workdir, False, quantize=quantize, checkpointing=False)
    peft_config = None
    if quantize:  # as TRL's QLoRA docs: the 4-bit base and a LoraConfig, which TRL attaches (casting it to bf16)
        from peft import LoraConfig

        from tunesmith.models.loader import find_lora_targets

        peft_config = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=args.lora_dropout,
                                 target_modules=find_lora_targets(model), task_type="CAUSAL_LM")
    batch_size = args.batch_size
    if packing:  # rows of max_seq_length; enough of them to train about as many tokens per step
        per_step = sum(len(ids) for ids in dataset["input_ids"][: args.steps * args.batch_size]) / args.steps
        batch_size = max(1, round(per_step / args.max_seq_length))
    config = SFTConfig(  # bf16 left to TRL's default (on)
        output_dir=training_args.output_dir, max_steps=args.steps, per_device_train_batch_size=batch_size,
        learning_rate=args.learning_rate, use_cpu=not torch.cuda.is_available(), gradient_checkpointing=checkpointing,
        max_length=args.max_seq_length, packing=packing, **TIMED_TRAINER,
    )
    clock, callback = trainer_clock()
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_config, callbacks=[callback, *step_profiler(args)])
    trainer.data_collator = collator = CountingCollator(trainer.data_collator, count_tokens)
    trainer.train()
    return {**summarize(clock, collator.counts, args.steps, logged_losses(trainer), bool(args.profile)),
            "rows_per_step": batch_size, "parameters": parameters(trainer.model)}


def run_plain(args: argparse.Namespace, workdir: Path) -> dict:
    import torch

    dataset, _, model, training_args = load(args, workdir, False, bf16=False, checkpointing=False)
    device = training_args.device
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=0.0)
    # the Trainer's default schedule (linear decay to 0, no warm-up), so the loss curves compare step by step
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / args.steps))
    clock, batches, losses = StepClock(), [], []
    for step in range(args.steps):
        examples = dataset[step * args.batch_size: (step + 1) * args.batch_size]
        ids = [torch.tensor([x], device=device) for x in examples["input_ids"]]
        labels = [torch.tensor([x], device=device) for x in examples["labels"]]
        num_items = sum(int((lab[:, 1:] != -100).sum()) for lab in labels)
        batches.append({"positions": sum(x.numel() for x in ids), "real": sum(x.numel() for x in ids),
                        "trained": num_items})
        step_loss = 0.0
        for x, lab in zip(ids, labels):
            loss = model(input_ids=x, labels=lab, num_items_in_batch=num_items, use_cache=False).loss
            loss.backward()
            step_loss += loss.item()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(step_loss)
        clock.tick()
    return summarize(clock, batches, args.steps, losses)


RUNS = {
    "ours": run_ours,
    "ours_fp32": lambda a, w: run_ours(a, w, bf16=False),
    "ours_torch_dropout": lambda a, w: run_ours(a, w, torch_dropout=True),
    "ours_torch_loss": lambda a, w: run_ours(a, w, torch_loss=True),
    "ours_one_forward": lambda a, w: run_ours(a, w, max_forward_tokens=0),
    "ours_row_capped": lambda a, w: run_ours(a, w, max_forward_tokens=a.max_seq_length),
    "ours_sdpa_loop": lambda a, w: run_ours(a, w, sdpa_loop=True),
    "ours_liger": lambda a, w: run_ours(a, w, liger=True),
    "ours_compiled": lambda a, w: run_ours(a, w, compiled=True),
    "trl_padded": lambda a, w: run_trl(a, w, packing=False),
    "trl_packed": lambda a, w: run_trl(a, w, packing=True),
    "plain": run_plain,
    "ours_qlora": lambda a, w: run_ours(a, w, quantize=True),
    "trl_packed_qlora": lambda a, w: run_trl(a, w, packing=True, quantize=True),
    "ours_gc": lambda a, w: run_ours(a, w, checkpointing=True),
    "ours_qlora_no_gc": lambda a, w: run_ours(a, w, quantize=True, checkpointing=False),
    "ours_qlora_gc": lambda a, w: run_ours(a, w, quantize=True, checkpointing=True),
    "trl_packed_gc": lambda a, w: run_trl(a, w, packing=True, checkpointing=True),
    "trl_packed_qlora_gc": lambda a, w: run_trl(a, w, packing=True, quantize=True, checkpointing=True),
}


# ---------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.worker and args.gpu_memory_gb:
        import torch

        if torch.cuda.is_available():  # a smaller card stood for (the forward budget reads the fraction too)
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, args.gpu_memory_gb * 2**30 / total))
    if run_worker(args, RUNS):
        return
    args.model = benchmark_model(args.model)
    variants = args.variants.split(",")
    with scratch(__spec__.name) as workdir:  # the generated set stays out of the real cache
        data = prepare_data(args, workdir)
        print(f"model {args.model}\ndata: {data['examples']} conversations, tokens min {data['min']} / median "
              f"{data['median']} / max {data['max']}; the {args.steps * args.batch_size} trained on: mean "
              f"{data['timed_mean']:.0f}, longest {data['timed_max']}\nsteps {args.steps} (first untimed), batch "
              f"{args.batch_size}, max_seq_length {args.max_seq_length}, LoRA r {args.lora_r} dropout {args.lora_dropout}, "
              f"{args.repeats} runs "
              "each, interleaved", flush=True)
        worker_args = ["--model", args.model, "--steps", str(args.steps), "--batch_size", str(args.batch_size),
                       "--max_seq_length", str(args.max_seq_length), "--lora_r", str(args.lora_r),
                       "--lora_dropout", str(args.lora_dropout), "--learning_rate", str(args.learning_rate)]
        if args.profile:
            worker_args += ["--profile", str(Path(args.profile).resolve())]
        if args.gpu_memory_gb:
            worker_args += ["--gpu_memory_gb", str(args.gpu_memory_gb)]
        results = run_interleaved(__spec__.name, variants, args.repeats, workdir, worker_args, args.quiet_share,
                                  lambda r: f"{r['tokens_per_s']:.1f} trained tokens/s, peak RSS "
                                            f"{r['peak_rss_mb']:.0f} MB", args.settle)
    print_table(results, args.quiet_share)


def print_table(results: dict[str, list[dict]], quiet_share: float) -> None:
    rows = {name: medians(runs) for name, runs in results.items() if runs}
    gpu = any("peak_gpu_mb" in r for r in rows.values())
    peak = gpu_peak_flops() if gpu else None
    reference = rows.get("plain", {}).get("losses")
    print(f"\n{'variant':<20}{'tokens/s':>9}{'spread':>15}{'tok/CPU-s':>10}{'trained':>8}{'padded':>7}"
          f"{'peak RSS MB':>12}{'loss first -> last':>19}{'loss vs plain':>14}{'other CPU':>10}"
          + (f"{'peak GPU MB':>12}{'MFU':>6}{'largest step':>13}" if gpu else ""))
    for name, r in rows.items():
        runs = results[name]
        losses = f"{r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}"
        versus = "-"
        if reference and name in SAME_BATCHES and len(r["losses"]) == len(reference):
            versus = f"{max(abs(a - b) for a, b in zip(r['losses'], reference)):.4f}"
        other = max(x["other_cpu"] for x in runs)
        print(f"{name:<20}{r['tokens_per_s']:>9.1f}{spread(runs, 'tokens_per_s', 1):>15}{r['tokens_per_cpu_s']:>10.1f}"
              f"{int(r['trained_tokens']):>8}{r['padded_share']:>7.0%}{r['peak_rss_mb']:>12.0f}{losses:>19}{versus:>14}"
              f"{other:>10.0%}{loaded(runs, quiet_share)}" + (f"{r.get('peak_gpu_mb', 0):>12.0f}{mfu(r, peak):>6}{r['largest_step']:>13}" if gpu else ""))

    def ratio(a: str, b: str, key: str = "tokens_per_s") -> str:
        return f"{rows[a][key] / rows[b][key]:.2f}" if a in rows and b in rows else "n/a"

    print(f"tokens/s ratio vs TRL (packed): {ratio('ours', 'trl_packed')}")
    print(f"tokens/s ratio vs TRL (padded): {ratio('ours', 'trl_padded')}")
    print(f"tokens/s ratio vs plain loop: {ratio('ours', 'plain')}")
    print(f"peak RSS ratio vs plain loop: {ratio('ours', 'plain', 'peak_rss_mb')}")
    if "ours_qlora" in rows:
        print(f"QLoRA tokens/s ratio vs TRL (packed): {ratio('ours_qlora', 'trl_packed_qlora')}")
    if gpu:
        print(f"peak GPU memory ratio vs TRL (packed): {ratio('ours', 'trl_packed', 'peak_gpu_mb')}")
        if "ours_row_capped" in rows:
            print("rows capped at max_seq_length: tokens/s ratio vs TRL (packed) "
                  f"{ratio('ours_row_capped', 'trl_packed')}, "
                  f"peak GPU memory ratio {ratio('ours_row_capped', 'trl_packed', 'peak_gpu_mb')}")
        if "ours_qlora" in rows:
            print(f"QLoRA peak GPU memory ratio vs TRL (packed): {ratio('ours_qlora', 'trl_packed_qlora', 'peak_gpu_mb')}")
    for ablation, what in (("ours_fp32", "bf16"), ("ours_torch_dropout", "the fast LoRA dropout"),
                           ("ours_torch_loss", "the chunked loss"),
                           ("ours_one_forward", "forwards of at most 2,048 tokens"),
                           ("ours_sdpa_loop", "the flash varlen kernel")):
        if ablation in rows and "ours" in rows:
            print(f"{what} alone: tokens/s x{ratio('ours', ablation)}, peak RSS x{ratio('ours', ablation, 'peak_rss_mb')}")
    for addition, what in (("ours_compiled", "torch.compile"), ("ours_liger", "Liger")):  # on top of ours
        if addition in rows and "ours" in rows:
            print(f"{what} alone: tokens/s x{ratio(addition, 'ours')}")


def gpu_peak_flops() -> float | None:
    """The dense bf16 peak of this GPU in FLOP/s (datasheet figures, without sparsity); None if unknown."""
    import torch

    name = torch.cuda.get_device_name(0)
    for marker, flops in (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("GH200", 989e12),
                          ("A100", 312e12), ("L40S", 362e12)):
        if marker in name:
            return flops
    return None


def mfu(result: dict, peak: float | None) -> str:
    if not peak or "parameters" not in result:
        return "-"
    return f"{6 * result['parameters'] * result['positions_per_s'] / peak:.1%}"


if __name__ == "__main__":
    main()
