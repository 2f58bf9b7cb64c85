"""One table of combinations that cannot work, checked right after parsing, before any weight is
loaded: each says what to change instead of failing later inside a library."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from .config import ConfigError


def deepspeed_config(training_args: Any) -> dict:
    """The DeepSpeed config a run was given (empty when none); a file path or an inline dict."""
    ds = getattr(training_args, "deepspeed", None)
    if not ds:
        return {}
    if isinstance(ds, dict):
        return ds
    if not os.path.isfile(ds):
        raise ConfigError(f"--deepspeed {ds}: no such file (shipped configs: configs/ds_zero2.json, configs/ds_zero3.json)")
    with open(ds, encoding="utf-8") as f:
        return json.load(f)


def zero_stage(training_args: Any) -> int:
    return int(deepspeed_config(training_args).get("zero_optimization", {}).get("stage", 0))


@dataclass(frozen=True)
class Rule:
    name: str
    broken: Callable[[SimpleNamespace], bool]
    message: str


def _has(a: SimpleNamespace, *names: str) -> bool:
    return all(getattr(a, n, None) is not None for n in names)


RULES: list[Rule] = [
    Rule("quantization_bit",
         lambda a: _has(a, "model") and a.model.quantization_bit not in (None, 4, 8),
         "--quantization_bit must be 4 or 8 (got {model.quantization_bit})."),
    Rule("qlora_needs_lora",
         lambda a: _has(a, "model", "finetuning") and a.model.quantization_bit is not None
         and a.finetuning.finetuning_type != "lora",
         "--quantization_bit trains LoRA adapters on a frozen quantized base: use --finetuning_type lora "
         "(quantized weights cannot be fully fine-tuned)."),
    Rule("zero3_8bit",
         lambda a: _has(a, "model", "training") and a.model.quantization_bit == 8 and zero_stage(a.training) == 3,
         "ZeRO-3 cannot partition 8-bit bitsandbytes weights: use --quantization_bit 4 (stored in the compute "
         "dtype, which ZeRO-3 can shard) or configs/ds_zero2.json."),
    Rule("fp16_on_cpu",
         lambda a: _has(a, "training") and a.training.fp16 and (a.training.use_cpu or not torch.cuda.is_available()),
         "--fp16 mixed precision needs a CUDA GPU: drop it, or use --bf16 true."),
    Rule("flash_attn_missing",
         lambda a: _has(a, "model") and a.model.attn_implementation == "flash_attention_2"
         and (importlib.util.find_spec("flash_attn") is None or not torch.cuda.is_available()),
         "--attn_implementation flash_attention_2 needs a CUDA GPU and the flash-attn package "
         "(pip install 'tunesmith[gpu]'); use auto to pick sdpa otherwise."),
    Rule("no_data",
         lambda a: _has(a, "data") and not a.data.data_path,
         "--data_path is required: one or more JSON/JSONL files (e.g. data/demo/sft.jsonl)."),
    Rule("eval_split_ratio",
         lambda a: _has(a, "data") and not 0.0 <= a.data.eval_split_ratio < 1.0,
         "--eval_split_ratio must be in [0, 1) (got {data.eval_split_ratio})."),
    Rule("max_seq_length",
         lambda a: _has(a, "data") and a.data.max_seq_length < 8,
         "--max_seq_length must be at least 8 tokens (got {data.max_seq_length})."),
    Rule("lora_rank",
         lambda a: _has(a, "finetuning") and a.finetuning.finetuning_type == "lora" and a.finetuning.lora_r < 1,
         "--lora_r must be a positive rank (got {finetuning.lora_r})."),
    Rule("adapter_with_full",
         lambda a: _has(a, "model", "finetuning") and a.model.adapter_name_or_path is not None
         and a.finetuning.finetuning_type == "full",
         "--adapter_name_or_path continues a LoRA run: use --finetuning_type lora, or merge the adapter first "
         "(merge/merge_lora.py) and fully fine-tune the merged model."),
    Rule("liger_kernel_missing",
         lambda a: _has(a, "training") and a.training.use_liger_kernel
         and (importlib.util.find_spec("liger_kernel") is None or not torch.cuda.is_available()),
         "--use_liger_kernel needs a CUDA GPU and the liger-kernel package (pip install liger-kernel; its kernels "
         "are Triton, GPU only): drop the flag on CPU."),
]


def check_compatibility(**configs: Any) -> None:
    """Raise ConfigError for the first broken rule. Pass the parsed dataclasses by role:
    model=, data=, finetuning=, training= (stages pass the ones they have)."""
    namespace = SimpleNamespace(**configs)
    for rule in RULES:
        if rule.broken(namespace):
            raise ConfigError(rule.message.format(**configs))
