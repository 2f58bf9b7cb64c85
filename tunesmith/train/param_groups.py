"""Learning rates per kind of trained weight: `--lora_learning_rate` gives LoRA's own matrices their own rate when
other weights train beside them (a reward model's score head, PPO's value head, PEFT's modules_to_save), as
LLaMA-Factory's loraplus/`--lora_lr` and DeepSpeed-Chat's separate actor and critic rates do. One function for
the Trainer stages (which group by weight decay first) and for the RL loop."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from torch import nn

logger = logging.getLogger(__name__)


def is_lora_weight(name: str) -> bool:
    """PEFT's LoRA tensors: lora_A/lora_B (and lora_embedding_A/B, DoRA's lora_magnitude_vector)."""
    return ".lora_" in name


def split_lora_groups(groups: Iterable[dict[str, Any]], model: nn.Module, learning_rate: float,
                      lora_learning_rate: float | None) -> list[dict[str, Any]]:
    """Each optimizer param group split in two: its LoRA weights at lora_learning_rate, the rest at learning_rate;
    empty parts dropped. Groups unchanged when lora_learning_rate is None."""
    groups = list(groups)
    if lora_learning_rate is None:
        return groups
    lora = {id(p) for name, p in model.named_parameters() if is_lora_weight(name)}
    split: list[dict[str, Any]] = []
    for group in groups:
        params = list(group["params"])
        split.append({**group, "params": [p for p in params if id(p) in lora], "lr": lora_learning_rate})
        split.append({**group, "params": [p for p in params if id(p) not in lora], "lr": learning_rate})
    split = [g for g in split if g["params"]]
    counted = sum(len(p) for p in (g["params"] for g in split) if id(p[0]) in lora)
    others = sum(len(g["params"]) for g in split) - counted
    logger.info("learning rates: %g for %d LoRA tensors (--lora_learning_rate), %g for %d other trained tensors",
                lora_learning_rate, counted, learning_rate, others)
    return split
