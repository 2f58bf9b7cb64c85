"""transformers' TrainingArguments with the defaults that suit fine-tuning a chat model here. The
fields declared in this class are the ones `--help` lists under "training"; every other Trainer
flag is listed after them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from transformers import TrainingArguments as _HFTrainingArguments

from ..distributed import bind_deepspeed_comm
from ..errors import ConfigError
from ..utils.hardware import native_bf16, trains_on_cpu

# A plain default, not a default_factory: HfArgumentParser ignores factories of bool fields.
_NO_ACCELERATOR = not torch.cuda.is_available()


@dataclass
class TrainingArguments(_HFTrainingArguments):
    role: ClassVar[str] = "training"
    bf16_auto: ClassVar[bool] = False  # what --bf16's default (auto) may resolve to where bf16 is native
    _argument_group_name: ClassVar[str] = "training"
    # transformers' own fields that `--help` lists with ours, before the rest of the Trainer's.
    help_first: ClassVar[tuple[str, ...]] = ("deepspeed", "gradient_checkpointing", "lr_scheduler_type",
                                             "warmup_steps", "per_device_eval_batch_size", "report_to")

    output_dir: str | None = field(default="outputs/run", metadata={"help": "Where checkpoints and the result go."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Start afresh in an output_dir that holds a run made with other settings (its "
                  "checkpoints are not resumed). Without it such a run is refused, naming what differs."},
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={"help": "A checkpoint folder to resume from. Default: the last complete checkpoint in "
                  "output_dir, if any (so re-running a killed command continues it)."},
    )
    # Without an accelerator accelerate's PartialState picks no process-group backend unless told it
    # runs on CPU, and then every rank believes the world has one process (see configs/README.md).
    use_cpu: bool = field(
        default=_NO_ACCELERATOR,
        metadata={"help": "Train on CPU (default when no CUDA device is present; distributed runs use gloo)."},
    )
    learning_rate: float = field(default=2e-4, metadata={"help": "Peak learning rate (AdamW)."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Passes over the training data."})
    max_steps: int = field(default=-1, metadata={"help": "Stop after this many optimizer steps (-1: use epochs)."})
    per_device_train_batch_size: int = field(default=4, metadata={"help": "Examples per device per step."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Batches summed per optimizer step."})
    logging_steps: float = field(default=1, metadata={"help": "Log every N optimizer steps."})
    save_strategy: str = field(default="steps", metadata={"help": "When to checkpoint: no, steps, epoch."})
    save_steps: float = field(default=100, metadata={"help": "Checkpoint every N steps."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Keep at most N checkpoints."})
    seed: int = field(default=42, metadata={"help": "Random seed (data order, new weights, sampling)."})
    # None is auto, resolved in __post_init__: HfArgumentParser takes `--bf16 true/false` for it as for a bool.
    bf16: bool | None = field(
        default=None,
        metadata={"help": "bfloat16 mixed precision (autocast; trained weights stay float32, a LoRA/QLoRA base loads "
                  "in bf16). Default (auto): for SFT, on where the hardware computes bf16 natively (a GPU that "
                  "supports it, a CPU with AVX512-BF16 or AMX), off elsewhere, with --fp16 and under DeepSpeed "
                  "on CPU; the other stages, whose reference and rollout log-probs are checked exactly, off."},
    )
    # Our collators consume the tokenized columns; the Trainer must not drop the ones it doesn't know.
    remove_unused_columns: bool = field(default=False, metadata={"help": "Leave False for tunesmith datasets."})

    def __post_init__(self) -> None:
        if isinstance(self.deepspeed, str) and not self.deepspeed.lstrip().startswith("{") and not os.path.isfile(self.deepspeed):
            raise ConfigError(f"--deepspeed {self.deepspeed}: no such file (shipped: configs/ds_zero2.json, "
                              "configs/ds_zero3.json and their _offload variants)")
        if self.bf16 is None:
            on_cpu = trains_on_cpu(self)
            self.bf16 = self.bf16_auto and native_bf16(on_cpu) and not self.fp16 and not (self.deepspeed and on_cpu)
        super().__post_init__()
        if self.deepspeed and self.use_cpu and self.world_size > 1:
            # world_size also starts the process group, through accelerate's PartialState
            bind_deepspeed_comm()


@dataclass
class SFTTrainingArguments(TrainingArguments):
    """SFT's training arguments: --bf16 auto turns bf16 on where the hardware computes it natively
    (measured against float32 in docs/benchmark.md and tests/test_cpu_speed.py)."""

    bf16_auto: ClassVar[bool] = True
    record_name: ClassVar[str] = "TrainingArguments"  # tunesmith_config.json keeps the key runs were saved with
