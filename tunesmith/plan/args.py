"""The settings of `tunesmith plan` beside the SFT run's own flags (the core's dataclasses), which it parses as
`tunesmith sft` does. Its combinations are refused by the core's rows and by rules.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..errors import ConfigError
from ..hparams.data_args import SFTDataArguments
from ..hparams.finetuning_args import FinetuningArguments
from ..hparams.model_args import ModelArguments
from ..hparams.training_args import SFTTrainingArguments


@dataclass
class PlanArguments:
    role: ClassVar[str] = "plan"
    _argument_group_name: ClassVar[str] = "memory plan"

    plan_tokens: list[int] = field(
        default_factory=lambda: [4096],
        metadata={"nargs": "+", "help": "Tokens of the packed row to plan one step for, one plan each "
                  "(e.g. --plan_tokens 16384 32768)."},
    )
    plan_conversations: int = field(
        default=1, metadata={"help": "Conversations in the planned row, of equal length (a packed batch of "
                             "--per_device_train_batch_size conversations is one row)."})
    trained_share: float = field(
        default=0.5, metadata={"help": "Share of each conversation's tokens that train (its replies): the loss and "
                               "its logits cover these positions only."})
    memory_gb: float | None = field(
        default=None, metadata={"help": "GPU memory in GB (2**30 bytes) for the longest conversation that fits in "
                                "one step. Default: the local GPU's total memory; without a GPU and without this flag, no "
                                "longest conversation is searched for (the step's memory is still planned)."})
    longest_up_to: int = field(
        default=1 << 21, metadata={"help": "The longest conversation searched for, in tokens."})
    world_size: int | None = field(
        default=None, metadata={"help": "Ranks (GPUs) of the launch that --deepspeed configs/ds_zero3.json shards "
                                "the weights, gradients and optimizer state over. Default: --sequence_parallel_size "
                                "(one sequence-parallel group)."})

    def __post_init__(self) -> None:
        if any(t < 2 for t in self.plan_tokens):
            raise ConfigError(f"--plan_tokens {self.plan_tokens}: each row needs at least 2 tokens")
        if self.plan_conversations < 1 or any(t < 2 * self.plan_conversations for t in self.plan_tokens):
            raise ConfigError(f"--plan_conversations {self.plan_conversations}: give 1 or more, with at least 2 "
                              "tokens each in every --plan_tokens row")
        if not 0 < self.trained_share <= 1:
            raise ConfigError(f"--trained_share {self.trained_share}: give a share in (0, 1], e.g. 0.5")
        if self.world_size is not None and self.world_size < 1:
            raise ConfigError(f"--world_size {self.world_size}: give the launch's number of GPUs, e.g. 8")
        if self.memory_gb is not None and self.memory_gb <= 0:
            raise ConfigError(f"--memory_gb {self.memory_gb}: give the GPU's memory in GB, e.g. 80")


# The dataclasses `tunesmith plan` parses: the SFT run's, then the plan's own.
ARGUMENTS: tuple[type, ...] = (ModelArguments, SFTDataArguments, FinetuningArguments, SFTTrainingArguments,
                               PlanArguments)
