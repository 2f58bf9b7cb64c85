"""transformers' TrainingArguments with the defaults that suit fine-tuning a chat model here. The
fields declared in this class are the ones `--help` lists under "training"; every other Trainer
flag is listed after them."""

from __future__ import annotations

import argparse
import inspect
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import transformers
from transformers import PreTrainedModel
from transformers import TrainingArguments as _HFTrainingArguments
from transformers.training_args import OptimizerNames

from ..constants import CPU_FORWARD_TOKENS, MUON
from ..distributed import bind_deepspeed_comm, fsdp_requested, read_fsdp_config
from ..errors import ConfigError
from ..utils.hardware import native_bf16, trains_on_cpu

logger = logging.getLogger(__name__)

# A plain default, not a default_factory: HfArgumentParser ignores factories of bool fields.
_NO_ACCELERATOR = not torch.cuda.is_available()


# Evaluation metrics of which less is better (the others, accuracy and margin, more is better).
LOWER_IS_BETTER = ("loss", "perplexity")

# --gradient_checkpointing's third value, besides true and false: checkpointing whose saved layer inputs wait in
# pinned host memory until the backward pass (transformers' own `offload`, torch's save_on_cpu per layer).
OFFLOAD = "offload"
# and its fourth, SFT's default on a GPU for packed rows: each forward's layers keep, recompute or offload their
# activations as the free memory needs (train/layer_modes.py, chosen by train/forward_budget.py)
AUTO = "auto"


def resolve_eval_schedule(values: dict[str, Any]) -> str | None:
    """Settle when a Trainer stage evaluates, in the parsed flag values (`values`, changed in place) of its
    data and training arguments. The one home of this decision: only the parser sees both sets of flags,
    and it must run before TrainingArguments.__post_init__, whose transformers checks (--load_best_model_at_end
    needs matching save and eval schedules) read the result. Returns a line for the log, or None.

    --eval_strategy left out (None) with evaluation data: the schedule of the checkpoints (--save_strategy,
    --save_steps), so --load_best_model_at_end has a metric at every checkpoint; with --save_strategy no, the
    end only. Without evaluation data: no. --eval_steps left out follows --save_steps. The evaluation once at
    the end is the recipes' (train/run_setup.train_save_evaluate), whatever the schedule."""
    if "val_size" not in values or "eval_strategy" not in values:
        return None  # not a stage that reads evaluation data (PPO): TrainingArguments' own default
    has_eval_data = bool(values["eval_data_path"]) or values["val_size"] > 0
    if values["load_best_model_at_end"] and not has_eval_data:
        # Before transformers' own check, which would blame the eval strategy instead of the missing data.
        raise ConfigError("--load_best_model_at_end picks the checkpoint with the best evaluation metric: give "
                          "evaluation data (--eval_data_path FILE or --val_size 0.1), or drop the flag")
    note = None
    if values["eval_strategy"] in (None, "auto"):
        strategy = "no"
        if has_eval_data:
            strategy = "steps" if values["save_strategy"] == "best" else values["save_strategy"]
            if strategy == "no":
                note = ("evaluation data: evaluated once, at the end (--save_strategy no; evaluation follows the "
                        "checkpoints unless --eval_strategy steps --eval_steps N says otherwise)")
        values["eval_strategy"] = strategy
    elif has_eval_data and values["eval_strategy"] == "no":
        note = ("--eval_strategy no: the evaluation data is evaluated once, at the end of training; leave the flag "
                "out to evaluate at every checkpoint too, or give --eval_strategy steps --eval_steps N")
    if values["eval_strategy"] == "steps" and not values["eval_steps"]:
        values["eval_steps"] = values["save_steps"]
    return note


def resolve_checkpointing(values: dict[str, Any], dataclass_types: Sequence[type]) -> str | None:
    """Settle --gradient_checkpointing left out, in the parsed flag values (`values`, changed in place), for a stage
    whose training arguments say `checkpointing_auto` (SFT): on for QLoRA on a GPU, and on CPU where --max_seq_length
    passes the CPU's forward size (2,048 tokens: a longer conversation runs as one forward, and without checkpointing
    SmolLM2-135M holds about 1.5 MB a token there); off otherwise. Measured on an
    H100 (docs/benchmark.md, "Memory"), a 1.07B model at batch 8: checkpointing takes a QLoRA run's peak from 1.63x
    TRL packed's memory to 0.32x, at 1.04x its speed instead of 1.69x (memory is what QLoRA is picked for); a LoRA
    run's to 0.28x, but at 0.72x TRL's speed, since those steps wait on the host and recomputation adds a third more
    launches. So LoRA and full fine-tuning keep their speed, their forwards sized to the free memory
    (train/forward_budget.py). Never for prefix tuning, which cannot be checkpointed, nor under FSDP, whose own
    config checkpoints. Returns a line for the log, or None."""
    if values.get("gradient_checkpointing") == AUTO:
        values["gradient_checkpointing"] = None
    if values.get("gradient_checkpointing") is not None or values.get("activation_checkpointing") is not None:
        return None
    if not any(getattr(d, "checkpointing_auto", False) for d in dataclass_types):
        return None
    on_gpu = torch.cuda.is_available() and not values.get("use_cpu")
    # FSDP checkpoints through its own config (fsdp_config's activation_checkpointing), without a second all-gather
    fsdp = fsdp_requested(argparse.Namespace(fsdp=values.get("fsdp") or values.get("fsdp_config")))
    if on_gpu and by_free_memory(values, fsdp):
        values["gradient_checkpointing"] = AUTO
        return None  # the forward budget logs its choice (train/forward_budget.py)
    long_on_cpu = not on_gpu and (values.get("max_seq_length") or 0) > CPU_FORWARD_TOKENS
    values["gradient_checkpointing"] = bool((on_gpu and values.get("quantization_bit") or long_on_cpu) and not fsdp
                                            and values.get("finetuning_type") != "prefix_tuning")
    if not values["gradient_checkpointing"]:
        return None
    why = (f"--max_seq_length {values['max_seq_length']} on CPU, above its {CPU_FORWARD_TOKENS}-token forwards"
           if long_on_cpu else "QLoRA's default on a GPU")
    return f"activation checkpointing on ({why}; --gradient_checkpointing false turns it off)"


def by_free_memory(values: dict[str, Any], fsdp: bool) -> bool:
    """Whether a GPU run's forwards are sized by its forward budget (packed rows, --max_forward_tokens left out,
    one rank's sequence, no DeepSpeed or FSDP), which can then choose its layers' modes too."""
    return bool(values.get("packing") and values.get("max_forward_tokens") is None and not values.get("deepspeed")
                and not fsdp and (values.get("sequence_parallel_size") or 1) <= 1
                and values.get("finetuning_type") != "prefix_tuning")


@dataclass
class TrainingArguments(_HFTrainingArguments):
    role: ClassVar[str] = "training"
    bf16_auto: ClassVar[bool] = False  # what --bf16's default (auto) may resolve to where bf16 is native
    _argument_group_name: ClassVar[str] = "training"
    # transformers' own fields that `--help` lists with ours, before the rest of the Trainer's.
    help_first: ClassVar[tuple[str, ...]] = ("deepspeed", "fsdp_config", "gradient_checkpointing", "lr_scheduler_type",
                                             "warmup_steps", "per_device_eval_batch_size", "report_to")

    # boolean flags that also take these words (the parser's boolean_or)
    also_accepts: ClassVar[dict[str, tuple[str, ...]]] = {"gradient_checkpointing": (OFFLOAD,)}

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
    # runs on CPU, and then every rank believes the world has one process (docs/distributed.md).
    use_cpu: bool = field(
        default=_NO_ACCELERATOR,
        metadata={"help": "Train on CPU (default when no CUDA device is present; distributed runs use gloo)."},
    )
    learning_rate: float = field(default=2e-4, metadata={"help": "Peak learning rate (AdamW)."})
    # transformers' OptimizerNames and Muon, which tunesmith adds to transformers' optimizer factory (train/muon.py)
    optim: str = field(
        default=_HFTrainingArguments.default_optim,
        metadata={"help": "The optimizer (docs/optimizers.md): transformers' names, and muon: torch.optim.Muon for the "
                  "hidden weight matrices (LoRA's A and B included) and AdamW for embeddings, heads, norms and biases, "
                  "at one --learning_rate (Muon's updates scaled to AdamW's RMS); --optim_args "
                  "adjust_lr_fn=original,momentum=0.95,nesterov=true,ns_steps=5 change torch's Muon settings. "
                  "Not with --deepspeed; FSDP2 runs it.",
                  "choices": [*(o.value for o in OptimizerNames), MUON]},
    )
    num_train_epochs: float = field(default=1.0, metadata={"help": "Passes over the training data."})
    max_steps: int = field(default=-1, metadata={"help": "Stop after this many optimizer steps (-1: use epochs)."})
    per_device_train_batch_size: int = field(default=4, metadata={"help": "Examples per device per step."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Batches summed per optimizer step."})
    logging_steps: float = field(default=1, metadata={"help": "Log every N optimizer steps."})
    save_strategy: str = field(default="steps", metadata={"help": "When to checkpoint: no, steps, epoch."})
    save_steps: float = field(default=100, metadata={"help": "Checkpoint every N steps."})
    # None is auto, resolved by resolve_eval_schedule() from the data flags before __post_init__ runs.
    eval_strategy: str | None = field(
        default=None,
        metadata={"help": "When to evaluate: no, steps, epoch. Default (auto): with evaluation data (--eval_data_path "
                  "or --val_size) at every checkpoint (--save_strategy, --save_steps), without it never. Every stage "
                  "with evaluation data also evaluates once at the end (eval_results.json); `no` leaves just that."},
    )
    eval_steps: float | None = field(
        default=None, metadata={"help": "With --eval_strategy steps: evaluate every N steps (default: --save_steps)."}
    )
    load_best_model_at_end: bool = field(
        default=False,
        metadata={"help": "At the end, load the checkpoint with the best --metric_for_best_model (it is also what "
                  "is saved in output_dir and evaluated last). Needs evaluation data; nothing else to set, as "
                  "evaluation follows the checkpoints by default."},
    )
    metric_for_best_model: str | None = field(
        default=None,
        metadata={"help": "The evaluation metric --load_best_model_at_end compares, with or without its eval_ "
                  "prefix: loss (default) or perplexity (SFT), accuracy or margin (reward, DPO). Lower is better "
                  "for loss and perplexity, higher for the others, unless --greater_is_better says otherwise."},
    )
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
    fsdp_config: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "FSDP2 (torch's fully_shard) under torchrun: configs/fsdp2.yaml (an accelerate config, whose "
                  "fsdp_config section is read) or a YAML/JSON file of those settings; given alone it turns FSDP on. "
                  "Under `accelerate launch --config_file configs/fsdp2.yaml` leave it out."},
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Activation checkpointing: keep each layer's input only, recompute the layer in the backward "
                  "pass (about a third more compute; activation memory no longer grows with the layers). `offload` also "
                  "moves those inputs to pinned CPU memory while the forward runs on, and back for the backward (for "
                  "the longest contexts on a GPU; on CPU it is plain checkpointing). true, false or offload; for SFT "
                  "also `auto`, its default for packed rows on a GPU: each forward keeps every layer's activations where "
                  "they fit the free memory, and recomputes (then offloads) only as many layers as it must, logged. "
                  "Left out elsewhere: on for QLoRA on a GPU, and on CPU above --max_seq_length 2048.",
                  "nargs": "?", "const": True},
    )
    # Our collators consume the tokenized columns; the Trainer must not drop the ones it doesn't know.
    remove_unused_columns: bool = field(default=False, metadata={"help": "Leave False for tunesmith datasets."})

    def __post_init__(self) -> None:
        if isinstance(self.deepspeed, str) and not self.deepspeed.lstrip().startswith("{") and not os.path.isfile(self.deepspeed):
            raise ConfigError(f"--deepspeed {self.deepspeed}: no such file (shipped: configs/ds_zero2.json, ds_zero1.json, "
                              "ds_zero3.json and the _offload variants of 2 and 3)")
        if self.fsdp_config is not None:
            # --fsdp_config alone turns FSDP on, and may name an accelerate config (configs/fsdp2.yaml), so that one
            # file serves `accelerate launch --config_file` and torchrun alike.
            self.fsdp = self.fsdp or True
            if isinstance(self.fsdp_config, str) and not self.fsdp_config.lstrip().startswith("{"):
                self.fsdp_config = read_fsdp_config(self.fsdp_config)
        if self.eval_strategy in (None, "auto"):  # made directly, not by the parser (which resolves auto): no evaluation
            self.eval_strategy = "no"
        if self.greater_is_better is None and self.metric_for_best_model:
            # transformers reads any name but *loss as higher-is-better: perplexity is lower-is-better too.
            self.greater_is_better = not self.metric_for_best_model.endswith(LOWER_IS_BETTER)
        offload = self.gradient_checkpointing == OFFLOAD
        # AUTO: every layer starts checkpointed (safe if the budget never runs), the budget then frees layers
        self.checkpointing_by_budget = self.gradient_checkpointing == AUTO
        if offload or self.checkpointing_by_budget:
            self.gradient_checkpointing = True
        if getattr(self, "activation_checkpointing", None) is None and self.gradient_checkpointing is not None:
            # transformers 5.2x renamed the flag; --gradient_checkpointing stays ours, without its deprecation warning
            self.activation_checkpointing = self.gradient_checkpointing
        if self.bf16 is None:
            on_cpu = trains_on_cpu(self)
            self.bf16 = self.bf16_auto and native_bf16(on_cpu) and not self.fp16 and not (self.deepspeed and on_cpu)
        muon = self.optim == MUON
        if muon:  # not one of transformers' OptimizerNames, which __post_init__ converts the name to
            self.optim = OptimizerNames.ADAMW_TORCH.value
        super().__post_init__()
        if muon:
            self.optim = MUON
        if offload:
            self._offload_checkpointed_activations()
        if self.deepspeed and self.use_cpu and self.world_size > 1:
            # world_size also starts the process group, through accelerate's PartialState
            bind_deepspeed_comm()

    def _offload_checkpointed_activations(self) -> None:
        """--gradient_checkpointing offload: transformers' `offload` checkpointing argument, where a GPU trains."""
        if trains_on_cpu(self):
            logger.info("--gradient_checkpointing offload: on CPU the activations already live in CPU memory; "
                        "checkpointing without offloading")
            return
        enable = getattr(PreTrainedModel, "activation_checkpointing_enable", None)
        if enable is None or "offload" not in inspect.signature(enable).parameters:
            raise ConfigError(f"--gradient_checkpointing offload needs transformers' offloaded checkpointing "
                              f"(transformers {transformers.__version__} has none): upgrade transformers, or use "
                              "--gradient_checkpointing true")
        kwargs = {**(self.activation_checkpointing_kwargs or {}), "offload": True}
        self.activation_checkpointing_kwargs = self.gradient_checkpointing_kwargs = kwargs


@dataclass
class SFTTrainingArguments(TrainingArguments):
    """SFT's training arguments: --bf16 auto turns bf16 on where the hardware computes it natively
    (measured against float32 in docs/benchmark.md and tests/core/train/test_cpu_speed.py)."""

    bf16_auto: ClassVar[bool] = True
    checkpointing_auto: ClassVar[bool] = True  # see resolve_checkpointing
    also_accepts: ClassVar[dict[str, tuple[str, ...]]] = {"gradient_checkpointing": (OFFLOAD, AUTO)}
    record_name: ClassVar[str] = "TrainingArguments"  # tunesmith_config.json keeps the key runs were saved with
    # the same maths cut across ranks differently, as --deepspeed is (hparams/run_config.py)
    result_neutral: ClassVar[frozenset[str]] = frozenset({"sequence_parallel_size"})

    sequence_parallel_size: int = field(
        default=1,
        metadata={"help": "Cut each packed row across N ranks (DeepSpeed's Ulysses sequence parallelism: attention "
                  "exact over the whole row, 1/N of the heads on each rank); N ranks train one row at a time, so "
                  "a conversation N times longer fits. Needs --deepspeed, --packing true and a world size N divides "
                  "(docs/distributed.md). 1: off."},
    )

    tiled_mlp: bool = field(
        default=False,
        metadata={"help": "Run every decoder layer's MLP and norms over chunks of hidden_size tokens, forward and "
                  "backward (ALST's tiled MLP, exact): their intermediate activations (the MLP's, the norms' float32 "
                  "copies) are one chunk's instead of the whole row's, for conversations of tens of thousands of "
                  "tokens. Costs one more MLP and norm forward per step. "
                  "Dense models only (Llama, Qwen2/3, Mistral, Gemma 1-3, Phi-3, ...). true or false."},
    )
