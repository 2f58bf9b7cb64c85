"""Merge a LoRA adapter into its base model: load -> merge -> save (atomically) -> verify.

    python merge/merge_lora.py --adapter outputs/sft --output_dir outputs/sft-merged
    python merge/merge_lora.py --adapter outputs/reward --base_model M --output_dir OUT --dtype bfloat16

The base is always loaded unquantized, even for a QLoRA adapter: merging into 4-bit weights would
quantize the merged weights again and lose most of what the adapter learned. Reward-model adapters
(task_type SEQ_CLS) merge into a one-output sequence classifier, score head included.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from ..config import ConfigError, parse_args, save_run_config
from ..constants import ASSISTANT, USER
from ..data.template import TemplateError, encode_conversation
from ..models.loader import (
    ADAPTER_CONFIG,
    adapter_base_model,
    inference_model_args,
    is_adapter_dir,
    load_for_inference,
)
from ..utils.io import atomic_directory
from ..utils.logging import setup_logging

# Merging changes the order of float operations (W x + B A x vs (W + B A) x) and, in half precision,
# rounds the merged weight once more; the error that adds up through the layers scales with the
# dtype's rounding step and with the size of the logits. Measured on SmolLM2-135M with trained
# adapters: ~2e-6 (float32), ~5e-3 (float16), ~3e-2 (bfloat16) of the largest logit.
RELATIVE_TOLERANCES = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}


@dataclass
class MergeArguments:
    adapter: str = field(metadata={"help": "The LoRA adapter directory to merge (an SFT or reward-model output)."})
    output_dir: str = field(metadata={"help": "Where the merged model goes (must not exist or be empty, unless --overwrite)."})
    base_model: str | None = field(
        default=None,
        metadata={"help": "The base model directory. Default: the one recorded in the adapter's adapter_config.json."},
    )
    dtype: Literal["float32", "bfloat16", "float16"] = field(
        default="float32", metadata={"help": "dtype of the merged weights (the base is loaded unquantized in it)."}
    )
    overwrite: bool = field(default=False, metadata={"help": "Replace a non-empty output_dir."})
    max_shard_size: str = field(default="2GB", metadata={"help": "Largest safetensors shard."})
    tolerance: float | None = field(
        default=None,
        metadata={"help": "Largest allowed max |logit difference| between the merged model and base + adapter "
                  "on a probe conversation. Default: the largest |logit| (at least 1) times "
                  + ", ".join(f"{v:g} ({k})" for k, v in RELATIVE_TOLERANCES.items()) + "."},
    )


PROBE = [
    {"role": USER, "content": "What is the capital of France? Answer in one word."},
    {"role": ASSISTANT, "content": "Paris."},
]


class MergeError(RuntimeError):
    """A merge that cannot be done, or whose result does not match base + adapter."""


@dataclass
class MergeResult:
    output_dir: str
    task: str
    max_abs_diff: float


def adapter_task(adapter_dir: str) -> str:
    """reward for a sequence-classification adapter (task_type SEQ_CLS), else causal_lm."""
    with open(os.path.join(adapter_dir, ADAPTER_CONFIG), encoding="utf-8") as f:
        return "reward" if json.load(f).get("task_type") == "SEQ_CLS" else "causal_lm"


def check_output_dir(output_dir: str, overwrite: bool) -> None:
    if os.path.isdir(output_dir) and os.listdir(output_dir) and not overwrite:
        raise ConfigError(f"--output_dir {output_dir} exists and is not empty: choose another, or pass --overwrite")


def load_adapted(adapter: str, base: str, dtype: str, task: str) -> tuple[Any, Any]:
    """(PeftModel on the unquantized base, tokenizer); a library error about shapes or module names
    becomes one that names both sides."""
    model_args = inference_model_args(base, adapter, dtype=dtype)
    try:
        model, tokenizer = load_for_inference(model_args, task)
    except TemplateError:
        raise
    except (RuntimeError, ValueError, KeyError) as e:
        raise MergeError(f"adapter {adapter} does not fit base model {base}: {e}") from e
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise MergeError(
            f"adapter {adapter} does not fit base model {base}: its tokenizer has {len(tokenizer)} tokens but the "
            f"base has {rows} embedding rows (vocab mismatch); pass the base the adapter was trained on"
        )
    return model, tokenizer


def probe_logits(model: Any, tokenizer: Any) -> torch.Tensor:
    ids = torch.tensor([encode_conversation(tokenizer, PROBE).input_ids])
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _load_saved(path: str, task: str, dtype: str) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if task == "reward" else AutoModelForCausalLM
    return auto.from_pretrained(path, dtype=getattr(torch, dtype)).eval()


def merge(args: MergeArguments) -> MergeResult:
    if not is_adapter_dir(args.adapter):
        raise ConfigError(f"--adapter {args.adapter}: no {ADAPTER_CONFIG} there; give a LoRA output directory")
    check_output_dir(args.output_dir, args.overwrite)
    base = args.base_model or adapter_base_model(args.adapter)
    task = adapter_task(args.adapter)

    model, tokenizer = load_adapted(args.adapter, base, args.dtype, task)
    expected = probe_logits(model, tokenizer)
    tolerance = args.tolerance
    if tolerance is None:
        # Floored at 1: a reward score near 0 says nothing about the size of the hidden states' error.
        tolerance = RELATIVE_TOLERANCES[args.dtype] * max(expected.abs().max().item(), 1.0)
    merged = model.merge_and_unload(safe_merge=True)

    with atomic_directory(args.output_dir) as tmp:
        merged.save_pretrained(tmp, max_shard_size=args.max_shard_size)  # with generation_config.json
        tokenizer.save_pretrained(tmp)  # with the chat template that training used
        save_run_config(str(tmp), args)
        del merged, model
        # Reload what was written, so the check covers the saved files and not only the weights in memory.
        diff = (probe_logits(_load_saved(str(tmp), task, args.dtype), tokenizer) - expected).abs().max().item()
        if not diff <= tolerance:
            raise MergeError(
                f"merged model from {args.adapter} differs from base {base} + adapter by {diff:.3g} "
                f"(max |logit difference| on a probe conversation; tolerance {tolerance:.3g} for {args.dtype})"
            )
    print(f"merged {args.adapter} into {base} -> {args.output_dir} ({task}, {args.dtype}): "
          f"max |logit difference| vs base + adapter = {diff:.3g} (tolerance {tolerance:.3g})")
    return MergeResult(args.output_dir, task, diff)


def main(argv: Sequence[str] | None = None) -> MergeResult:
    setup_logging()
    (args,) = parse_args((MergeArguments,), argv)
    return merge(args)
