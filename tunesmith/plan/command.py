"""The GPU memory of an SFT step, computed on any machine (no GPU, no weights): weights, adapter and optimizer
state, activations kept per token (device or pinned host), one layer's backward, the loss, and the longest
conversation that fits --memory_gb. Give the SFT run's own flags (or its run config) and the rows to plan; they are
parsed as `tunesmith sft` parses them, and the plan runs the step's real code on fake tensors, from the model
folder's config.json.

    tunesmith plan --model_name_or_path DIR --quantization_bit 4 --packing true --plan_tokens 16384 32768
    tunesmith plan configs/sft_lora_demo.yaml --packing true --memory_gb 24 --gradient_checkpointing offload

Read top to bottom: parse (the SFT flags resolved as on a GPU) -> build the model without weights -> under
--gradient_checkpointing auto, probe it as the run's forward budget does (plan/auto.py) -> one step per --plan_tokens
row -> the longest conversation that fits --memory_gb. What it leaves out, on purpose for now:
1. padded batches (--packing false), vision-language models, FSDP and ZeRO-1/2 on one rank per row: refused
   (sequence parallelism is planned per rank; ZeRO-3 per rank of --world_size, by arithmetic: plan/zero3.py);
2. the CUDA context, cuBLAS workspaces and the allocator's fragmentation (torch.cuda.max_memory_allocated does not
   count the first two either);
3. the forward budget's timings, which fake tensors do not have: plan/auto.py says what it assumes."""

from __future__ import annotations

import dataclasses
import logging
import math
import types
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import torch

from ..boundary import entry_point
from ..distributed import zero_stage
from ..errors import ConfigError
from ..hparams import ParsedRun, parse_run, rules
from ..hparams.parser import parse_namespace
from ..hparams.training_args import AUTO, OFFLOAD, resolve_checkpointing
from ..models.attention import FLASH_VARLEN, use_varlen_attention
from ..models.tiled_mlp import use_tiled_mlp
from ..train.forward_budget import PROBE_TOKENS
from ..train.head_loss import install_fused_head
from ..train.sequence_parallel import check_heads
from ..utils.config_facts import text_config
from .args import ARGUMENTS
from .auto import AutoChoice, AutoPlanner
from .model import GpuRun, as_on_a_gpu, build_on_meta, materialize, read_config
from .report import longest_lines, row_lines, weight_lines, weights_of
from .step import StepMemory, enable_checkpointing, planned_row, run_step
from .zero3 import Zero3Settings, rank_lines, rank_step, zero3_rank
from .zero3 import describe as describe_zero3

logger = logging.getLogger(__name__)

NO_DATA = "(tunesmith plan reads no data)"  # the SFT flags require --data_path; the plan never opens it


def parse_plan(argv: Sequence[str]) -> tuple[ParsedRun, GpuRun]:
    """The run's flags as `tunesmith sft` parses them, and the choices it leaves to the hardware as a GPU takes them:
    bf16 on, and --gradient_checkpointing by hparams.resolve_checkpointing's rule for a GPU."""
    argv = list(argv)
    given = vars(parse_namespace(ARGUMENTS, argv, __doc__))
    if not given.get("data_path"):
        argv += ["--data_path", NO_DATA]
    ranks = given.get("sequence_parallel_size") or 1
    world = given.get("world_size") or ranks
    zero3 = bool(given.get("deepspeed")) and zero_stage(types.SimpleNamespace(deepspeed=given["deepspeed"])) == 3
    # the rules check a launch of `world` processes: the one the plan is for, not this one
    try:
        with mock.patch.object(rules, "_world_size", lambda: world):
            args = parse_run("plan", argv, __doc__, check_paths=False)
    finally:
        if zero3:  # transformers' TrainingArguments with a ZeRO-3 config switches ZeRO-3's sharded loading on for the
            # whole process (is_deepspeed_zero3_enabled): the plan builds its model without DeepSpeed
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()
    if not args.data.packing:
        raise ConfigError("tunesmith plan plans packed rows: add --packing true (padded batches are not covered yet)")
    if args.training.fsdp or (args.training.deepspeed and ranks <= 1 and not zero3):
        raise ConfigError("tunesmith plan plans one GPU: leave out --deepspeed and --fsdp (not covered yet; "
                          "--deepspeed configs/ds_zero3.json with --world_size N, and --sequence_parallel_size N with "
                          "--deepspeed, are planned per rank)")
    if args.plan.world_size and not zero3:
        raise ConfigError(f"--world_size {args.plan.world_size}: the plan shards over the ranks under ZeRO-3 only; add "
                          "--deepspeed configs/ds_zero3.json, or leave --world_size out")
    if args.training.fp16:
        raise ConfigError("tunesmith plan covers bf16 and float32 runs: leave out --fp16")
    values = {**given, "use_cpu": False}
    with as_on_a_gpu():
        resolve_checkpointing(values, ARGUMENTS)
    checkpointing = values["gradient_checkpointing"]
    bf16 = True if given["bf16"] is None else bool(given["bf16"])
    if zero3 and not bf16:
        raise ConfigError("tunesmith plan counts ZeRO-3's states as DeepSpeed holds them with bf16: leave out "
                          "--bf16 false")
    return args, GpuRun(bf16=bf16, checkpointing=bool(checkpointing), offload=checkpointing == OFFLOAD,
                        by_budget=checkpointing == AUTO, ranks=ranks, zero3_world=world if zero3 else 0)


class PlannedModel:
    """The run's model on fake tensors, ready to train as the SFT recipe readies it: `step(tokens, conversations)`."""

    def __init__(self, args: ParsedRun, gpu: GpuRun, memory: int | None = None) -> None:
        """`memory`: the device's bytes, for --gradient_checkpointing auto's choices (without, auto is planned with
        every layer recomputed)."""
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.args, self.gpu = args, gpu
        self.config = read_config(args.model)
        if gpu.ranks > 1:
            check_heads(text_config(self.config), gpu.ranks)
        self.model = build_on_meta(self.config, args.model, args.finetuning, gpu)
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        with self.mode:
            materialize(self.model)
        self.attention = use_varlen_attention(self.model)  # as sft_collator does for --packing
        head = self.model.get_output_embeddings()
        self.fused_head_vocab = head.weight.shape[0] if install_fused_head(self.model) else 0  # as StageTrainer
        use_tiled_mlp(self.model, args.training)  # as StageTrainer
        if gpu.checkpointing:
            enable_checkpointing(self.model, args.training, gpu.offload)
        self.model.train()
        self.zero3 = self.zero3_rank = None
        if gpu.zero3_world:
            self.zero3 = Zero3Settings.read(args.training.deepspeed, text_config(self.config).hidden_size,
                                            gpu.zero3_world)
            self.zero3_rank = zero3_rank(self.model, self.zero3)
        self.auto = self.held = None
        if gpu.by_budget and memory:  # never under DeepSpeed (hparams.by_free_memory)
            self.auto = AutoPlanner(self.model, memory, gpu.bf16, self.fused_head_vocab, self.mode,
                                    args.plan.trained_share)
            # what a step finds allocated before its forwards: the weights and the optimizer's state
            steady = self._run(planned_row(PROBE_TOKENS, 1, args.plan.trained_share))
            self.held = steady.resident + steady.optimizer_state

    def step(self, tokens: int, conversations: int = 1) -> StepMemory:
        """One step of a packed row of `tokens` tokens; under sequence parallelism, one rank's: its ceil(tokens / N)
        tokens (train/sequence_parallel.py cuts the row in N contiguous shards; Ulysses' attention then holds all the
        tokens for 1/N of the heads, the same bytes as the shard's tokens for all heads)."""
        return self.planned_step(tokens, conversations)[0]

    def planned_step(self, tokens: int, conversations: int = 1) -> tuple[StepMemory, AutoChoice | None]:
        """step()'s, and under --gradient_checkpointing auto the forward budget's choice it ran with."""
        tokens = math.ceil(tokens / self.gpu.ranks)
        row = planned_row(tokens, max(1, min(conversations, tokens // 2)), self.args.plan.trained_share)
        if self.auto is None:
            return self._run(row), None
        choice = self.auto.choose(row, self.held)
        return self._run(row, choice.forwards, self.auto.budget.prepare), choice

    def _run(self, row: dict[str, Any], forwards: list[int] | None = None,
             prepare: Callable[[int], None] | None = None) -> StepMemory:
        step = run_step(self.model, row, self.args.training, self.gpu.bf16, self.fused_head_vocab, self.mode,
                        forwards, prepare, release_gradients=self.zero3 is not None)
        return step if self.zero3_rank is None else rank_step(step, self.zero3_rank)

    def describe(self) -> list[str]:
        finetuning = self.args.finetuning
        method = finetuning.finetuning_type + (f" r{finetuning.lora_r}" if finetuning.finetuning_type == "lora" else "")
        bits = self.args.model.quantization_bit
        base = f"{bits}-bit {self.args.model.quantization_type if bits == 4 else ''}".strip() if bits else "unquantized"
        checkpointing = "offload" if self.gpu.offload else "on" if self.gpu.checkpointing else "off"
        if self.gpu.by_budget and self.auto is not None:
            checkpointing = "auto, chosen per row by the forward budget (each row's auto: line)"
        elif self.gpu.by_budget:  # train/layer_modes.py: the run keeps what fits, planned here at its most recomputed
            checkpointing = ("auto, planned without --memory_gb with every layer recomputed (the run keeps layers' "
                             "activations where memory allows: --gradient_checkpointing false plans that end)")
        return [
            f"model: {self.args.model.model_name_or_path} ({self.config.model_type}, "
            f"{parameter_count(self.model) / 1e9:.3f}B parameters)",
            f"run: {method}, {base} base, bf16 {'on' if self.gpu.bf16 else 'off'}, checkpointing {checkpointing}, "
            f"optimizer {getattr(self.args.training.optim, 'value', self.args.training.optim)}",
            f"attention: {FLASH_VARLEN if self.attention != 'eager_varlen' else 'the model eager attention'} "
            "(what a CUDA GPU runs for a bf16 packed row; counted on fake tensors on this CPU)"
            + (f"; sequence parallel over {self.gpu.ranks} ranks (DeepSpeed Ulysses): each row's lines are one "
               "rank's, its 1/N of the row's tokens, the weights and optimizer state "
               + ("sharded (zero3: line)" if self.zero3 else "whole on it") + "; the all-to-all "
               "buffers of q, k, v and the attention output (transient, about the rank's hidden states x 4) are "
               "not counted" if self.gpu.ranks > 1 else ""),
            f"loss: {'tiled head (train/head_loss.py), counted on torch tiles' if self.fused_head_vocab else 'logits'}"
            f" over {self.args.plan.trained_share:.0%} of each conversation's tokens",
            "counted: tensors as torch.cuda.max_memory_allocated counts them (512-byte blocks); not the CUDA context, "
            "workspaces or fragmentation",
            *([self.auto.describe()] if self.auto else []),
            *([describe_zero3(self.zero3)] if self.zero3 else []),
        ]


def parameter_count(model: torch.nn.Module) -> int:
    """Parameters as the model's config counts them: a 4-bit weight by its shape before packing."""
    return sum(getattr(getattr(p, "quant_state", None), "shape", p).numel() for p in model.parameters())


def local_gpu_memory() -> int | None:
    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


def longest_fitting(peak_of: Callable[[int], StepMemory], budget: int, up_to: int,
                    start: int = 1024) -> tuple[StepMemory, StepMemory | None] | None:
    """(the step of the longest conversation whose peak fits `budget` bytes, the step one token longer, or None at
    `up_to`), or None when not even 2 tokens fit. The peak grows with the length, about linearly: a line through
    two lengths guesses where it meets the budget, then a bracket around the guess is bisected to one token."""
    low = peak_of(min(start, up_to))
    if low.peak > budget:
        return bracket_and_bisect(peak_of, budget, 2, low.tokens, None)
    high = peak_of(min(2 * low.tokens, up_to))
    if high.tokens == low.tokens or high.peak <= budget and high.tokens == up_to:
        return high, None
    slope = max(high.peak - low.peak, 1) / (high.tokens - low.tokens)
    guess = min(up_to, max(2, low.tokens + int((budget - low.peak) / slope)))
    return bracket_and_bisect(peak_of, budget, guess, up_to, low if low.peak <= budget else None)


def bracket_and_bisect(peak_of: Callable[[int], StepMemory], budget: int, guess: int, up_to: int,
                       fits: StepMemory | None) -> tuple[StepMemory, StepMemory | None] | None:
    step, fails = max(1, guess // 200), None
    probe = peak_of(guess)
    while probe.peak <= budget and probe.tokens < up_to:  # up until a length fails
        fits, step = probe, step * 2
        probe = peak_of(min(up_to, probe.tokens + step))
    if probe.peak <= budget:
        return probe, None
    fails = probe
    while fits is None or fits.tokens >= fails.tokens:  # down until a length fits
        if fails.tokens <= 2:
            return None
        probe = peak_of(max(2, fails.tokens - step))
        step *= 2
        fits, fails = (probe, fails) if probe.peak <= budget else (None, probe)
    while fails.tokens - fits.tokens > 1:
        probe = peak_of((fits.tokens + fails.tokens) // 2)
        fits, fails = (probe, fails) if probe.peak <= budget else (fits, probe)
    return fits, fails


def run(argv: Sequence[str] | None = None) -> tuple[dict[int, StepMemory], Any]:
    """Prints the plan; returns each --plan_tokens row's step and longest_fitting's answer (None without memory)."""
    args, gpu = parse_plan(argv or [])
    memory = int(args.plan.memory_gb * 2**30) if args.plan.memory_gb else local_gpu_memory()
    planned = PlannedModel(args, gpu, memory)
    lines = planned.describe() + weight_lines(weights_of(planned.model))
    if planned.zero3:
        lines += rank_lines(planned.zero3_rank, planned.zero3)
    print("\n".join(lines), flush=True)
    rows = {}
    for tokens in args.plan.plan_tokens:
        rows[tokens], choice = planned.planned_step(tokens, args.plan.plan_conversations)
        lines = row_lines(rows[tokens], args.plan.plan_conversations, tokens, gpu.ranks)
        print("\n".join(lines + ([choice.line(rows[tokens].peak, memory)] if choice else [])), flush=True)

    def step_of(tokens: int) -> StepMemory:  # the whole conversation's length, whatever a rank plans of it
        return dataclasses.replace(planned.step(tokens), tokens=tokens)
    found = longest_fitting(step_of, memory, args.plan.longest_up_to) if memory else None
    print("\n".join(longest_lines(memory, found, args.plan.longest_up_to)), flush=True)
    return rows, found


main = entry_point(run)

if __name__ == "__main__":
    main()
