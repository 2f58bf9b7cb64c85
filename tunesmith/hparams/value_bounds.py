"""The one-value rows of the rules table: each flag whose value alone cannot work (a batch of 0 rows, a negative
learning rate, a LoRA rank of 0), with the values it takes and what to do. Without these rows such a value
fails late and far away: torch's optimizer raises on a negative learning rate, the Trainer divides by
--gradient_accumulation_steps, PEFT builds a LoRA of rank 0. rules.py turns each bound into one Rule.
A role's dataclass that lacks the field (a stage that does not read it), or a value of None (the stage's
default decides), passes. (The tool-use limits are checked by their own dataclass, rl/args.py's ToolUseArguments.)"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Bound:
    """--FIELD (of the dataclass of ROLE) must satisfy `ok`; the message says it must be NEED, then ADVICE.
    `when(run)`: the run reads the value at all (LoRA's settings in a LoRA run)."""

    role: str
    field: str
    ok: Callable[[Any], bool]
    need: str
    advice: str = ""
    when: Callable[[Any], bool] | None = None


def positive(value: float) -> bool:
    return 0 < value < math.inf  # NaN fails every comparison


def at_least(low: float) -> Callable[[Any], bool]:
    return lambda value: low <= value < math.inf


def in_range(low: float, high: float, high_included: bool = False) -> Callable[[Any], bool]:
    return lambda value: low <= value <= high if high_included else low <= value < high


def _lora(run: Any) -> bool:
    return run.finetuning.finetuning_type == "lora"


def _steps(strategy: Any) -> bool:
    return getattr(strategy, "value", strategy) == "steps"


BOUNDS: tuple[Bound, ...] = (
    # -- training, every Trainer stage (sft, reward, dpo, ppo/grpo)
    Bound("training", "learning_rate", at_least(0), ">= 0",
          "2e-4 suits LoRA, 1e-5 full fine-tuning (0 trains nothing, for evaluating the model as it is)"),
    Bound("training", "per_device_train_batch_size", at_least(1), "at least 1", "rows per device per step"),
    Bound("training", "per_device_eval_batch_size", at_least(1), "at least 1", "rows per device per evaluation batch"),
    Bound("training", "gradient_accumulation_steps", at_least(1), "at least 1",
          "1 takes an optimizer step after every batch"),
    Bound("training", "max_steps", at_least(-1), "-1 or more", "-1 trains --num_train_epochs, N stops after N steps"),
    Bound("training", "save_steps", positive, "> 0", "N saves every N steps, a share below 1 that share of the run",
          lambda run: _steps(run.training.save_strategy)),
    Bound("training", "eval_steps", positive, "> 0", "N evaluates every N steps, a share below 1 that share of the run",
          lambda run: _steps(run.training.eval_strategy)),
    Bound("training", "weight_decay", at_least(0), ">= 0", "0 turns it off"),
    Bound("training", "adam_beta1", in_range(0, 1), "in [0, 1)", "0.9 is AdamW's"),
    Bound("training", "adam_beta2", in_range(0, 1), "in [0, 1)", "0.999 is AdamW's"),
    Bound("training", "adam_epsilon", at_least(0), ">= 0", "1e-8 is AdamW's"),
    Bound("training", "dataloader_num_workers", at_least(0), ">= 0", "0 loads batches in the training process"),
    # -- fine-tuning
    Bound("finetuning", "lora_alpha", positive, "> 0", "the adapter's output is scaled by lora_alpha / lora_r; "
          "twice --lora_r is usual", _lora),
    Bound("finetuning", "lora_dropout", in_range(0, 1), "in [0, 1)", "0 turns it off", _lora),
    # -- data
    Bound("data", "max_prompt_length", at_least(1), "at least 1 token"),
    Bound("data", "max_image_pixels", at_least(1), "at least 1 pixel", "width x height of the largest picture"),
    Bound("data", "max_row_bytes", at_least(1024), "at least 1024 bytes"),
    # -- generation
    Bound("generation", "top_k", at_least(0), ">= 0", "0 turns it off"),
    Bound("generation", "repetition_penalty", positive, "> 0", "1.0 turns it off"),
)
