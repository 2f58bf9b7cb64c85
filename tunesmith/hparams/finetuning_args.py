"""What is trained: LoRA or every weight, and the reward model's own loss settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal


@dataclass
class FinetuningArguments:
    role: ClassVar[str] = "finetuning"
    _argument_group_name: ClassVar[str] = "fine-tuning"

    finetuning_type: Literal["lora", "full"] = field(
        default="lora", metadata={"help": "lora: train adapters on a frozen base. full: train every weight."}
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (scale = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input."})
    lora_target: list[str] = field(
        default_factory=lambda: ["all"],
        metadata={"help": "Module names to adapt; `all` means every linear layer except the output head."},
    )
    plot_loss: bool = field(default=True, metadata={"help": "Write loss.png in output_dir at the end."})


@dataclass
class RewardArguments:
    role: ClassVar[str] = "reward"
    _argument_group_name: ClassVar[str] = "reward model"

    center_rewards_coefficient: float | None = field(
        default=None,
        metadata={"help": "Add this times mean((r_chosen + r_rejected)^2) to the loss, so scores stay centred on 0 "
                  "(0.01 is typical; off by default)."},
    )
