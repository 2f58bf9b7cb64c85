"""Learning rates per kind of trained weight: `--lora_learning_rate` gives LoRA's own matrices their own rate when
other weights train beside them (a reward model's score head, PPO's value head, PEFT's modules_to_save), as
LLaMA-Factory's `--lora_lr` and DeepSpeed-Chat's separate actor and critic rates do; `--loraplus_lr_ratio` (LoRA+)
raises the B matrices' rate above the A matrices'. One function for the Trainer stages (which group by weight
decay first) and for the RL loop.

LoRA+ is done here rather than through PEFT's create_loraplus_optimizer: that one builds the optimizer itself, from
its own groups, with its own weight decay (0 unless given) and the score head's bias at B's rate; splitting the
groups the Trainer made keeps --optim (8-bit, paged, ...), --weight_decay and its no-decay set, and
--lora_learning_rate's split as they are. Which tensors count as B is PEFT's rule: lora_B (and
lora_embedding_B), and LoRA's one-dimensional tensors (DoRA's magnitudes)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from torch import nn

logger = logging.getLogger(__name__)


def is_lora_weight(name: str) -> bool:
    """PEFT's LoRA tensors: lora_A/lora_B (and lora_embedding_A/B, DoRA's lora_magnitude_vector)."""
    return ".lora_" in name


def is_loraplus_b(name: str, param: nn.Parameter) -> bool:
    """A LoRA tensor that LoRA+ trains at the higher rate (create_loraplus_optimizer's groupB)."""
    return re.search(r"\.lora_(embedding_)?B\.", name) is not None or param.ndim == 1


def lora_rates(model: nn.Module, lora_learning_rate: float,
               loraplus_lr_ratio: float | None) -> dict[int, tuple[str, float]]:
    """{id(param): (kind, rate)} for every LoRA tensor of `model`; kind "LoRA B" for LoRA+'s faster ones."""
    rates = {}
    for name, p in model.named_parameters():
        if is_lora_weight(name):
            faster = bool(loraplus_lr_ratio) and is_loraplus_b(name, p)
            rates[id(p)] = ("LoRA B", lora_learning_rate * loraplus_lr_ratio) if faster else ("LoRA", lora_learning_rate)
    return rates


def split_lora_groups(groups: Iterable[dict[str, Any]], model: nn.Module, learning_rate: float,
                      lora_learning_rate: float | None, loraplus_lr_ratio: float | None = None) -> list[dict[str, Any]]:
    """Each optimizer param group split by rate: its LoRA weights at lora_learning_rate (learning_rate when None),
    their B matrices at loraplus_lr_ratio times that, the rest at learning_rate; empty parts dropped. Groups
    unchanged when neither is set."""
    groups = list(groups)
    if lora_learning_rate is None and loraplus_lr_ratio is None:
        return groups
    rates = lora_rates(model, learning_rate if lora_learning_rate is None else lora_learning_rate, loraplus_lr_ratio)
    split: list[dict[str, Any]] = []
    counts: dict[tuple[str, float], int] = {}
    for group in groups:
        parts: dict[tuple[str, float], list[nn.Parameter]] = {}
        for p in group["params"]:
            parts.setdefault(rates.get(id(p), ("other trained", learning_rate)), []).append(p)
        for (kind, rate), params in parts.items():
            split.append({**group, "params": params, "lr": rate})
            counts[kind, rate] = counts.get((kind, rate), 0) + len(params)
    logger.info("learning rates: %s", ", ".join(f"{rate:g} for {n} {kind} tensors" for (kind, rate), n in counts.items()))
    return split
