"""What `tunesmith plan` prints: one `key: value` per line, values in MB (2**20 bytes) with one decimal, so that
scripts can read them (docs/plan.md lists every key). A row's lines are indented under its `tokens:` line."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .fake_device import DEVICE, HOST
from .model import four_bit_constants, row_scales
from .step import StepMemory, allocated

MB = 2**20


@dataclass
class Weights:
    """The model's resident bytes by kind, each tensor as the CUDA allocator hands it out."""

    four_bit: int  # packed 4-bit weights and their quantization states
    eight_bit: int
    frozen_16bit: int
    frozen_32bit: int
    adapter: int  # every trained weight (LoRA's, or all of them in full fine-tuning)
    buffers: int


def weights_of(model: nn.Module) -> Weights:
    four = eight = half = full = trained = 0
    for param in model.parameters():
        size = allocated(param)
        if param.requires_grad:
            trained += size
        elif getattr(param, "quant_state", None) is not None:
            four += size
        elif param.dtype == torch.int8:
            eight += size
        elif param.element_size() == 2:
            half += size
        else:
            full += size
    four += sum(allocated(t) for t in four_bit_constants(model))
    eight += sum(allocated(t) for t in row_scales(model))
    return Weights(four, eight, half, full, trained, sum(allocated(b) for b in model.buffers()))


def mb(value: float) -> str:
    return f"{value / MB:.1f}"


def weight_lines(weights: Weights) -> list[str]:
    return [f"weights_4bit_mb: {mb(weights.four_bit)}", f"weights_8bit_mb: {mb(weights.eight_bit)}",
            f"weights_16bit_mb: {mb(weights.frozen_16bit)}", f"weights_32bit_mb: {mb(weights.frozen_32bit)}",
            f"adapter_mb: {mb(weights.adapter)}", f"buffers_mb: {mb(weights.buffers)}"]


def row_lines(step: StepMemory, conversations: int, tokens: int | None = None, ranks: int = 1) -> list[str]:
    """A planned row's lines; under sequence parallelism (`ranks` > 1) the row has `tokens` and the step is one
    rank's, whose tokens per_token rates are of."""
    per_token = 1024 / step.tokens  # MB a token shown in KB
    shards = [f"  sequence_parallel_ranks: {ranks}", f"  tokens_per_rank: {step.tokens}"] if ranks > 1 else []
    return [
        f"tokens: {tokens or step.tokens}",
        f"  conversations: {conversations}",
        *shards,
        f"  peak_device_mb: {mb(step.peak)}",
        f"  kept_device_mb: {mb(step.kept[DEVICE])}",
        f"  kept_device_kb_per_token: {step.kept[DEVICE] / MB * per_token:.1f}",
        f"  kept_host_mb: {mb(step.kept[HOST])}",
        f"  kept_host_kb_per_token: {step.kept[HOST] / MB * per_token:.1f}",
        f"  peak_host_mb: {mb(step.host_peak)}",
        f"  backbone_forward_peak_mb: {mb(step.backbone_peak)}",
        f"  head_and_loss_kept_mb: {mb(step.kept[DEVICE] - step.backbone_kept)}",
        f"  head_and_loss_peak_mb: {mb(step.head_peak)}",
        f"  head_backward_peak_mb: {mb(step.head_backward_peak)}",
        f"  layer_backward_peak_mb: {mb(step.layers_backward_peak)}",
        f"  gradients_mb: {mb(step.gradients)}",
        f"  optimizer_state_mb: {mb(step.optimizer_state)}",
        f"  optimizer_step_peak_mb: {mb(step.optimizer_peak)}",
    ]


def longest_lines(memory: int | None, found: tuple[StepMemory, StepMemory | None] | None, up_to: int) -> list[str]:
    if memory is None:
        return ["longest_tokens: not searched (no GPU here: give --memory_gb)"]
    lines = [f"memory_mb: {mb(memory)}"]
    if found is None:
        return lines + ["longest_tokens: 0 (not even the shortest row fits)"]
    fits, fails = found
    lines += [f"longest_tokens: {fits.tokens}", f"longest_peak_device_mb: {mb(fits.peak)}",
              f"longest_peak_host_mb: {mb(fits.host_peak)}"]
    if fails is None:
        return lines + [f"longest_next_tokens: none (searched up to --longest_up_to {up_to})"]
    return lines + [f"longest_next_tokens: {fails.tokens}", f"longest_next_peak_device_mb: {mb(fails.peak)}"]
