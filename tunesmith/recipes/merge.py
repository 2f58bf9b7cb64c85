"""Merge a LoRA adapter into its base model: load -> merge -> save (atomically) -> verify.

    python merge/merge_lora.py --adapter_name_or_path outputs/sft_demo --output_dir outputs/sft_demo_merged
    python merge/merge_lora.py --adapter_name_or_path outputs/rm_demo --model_name_or_path BASE \\
        --output_dir OUT --dtype bfloat16

The base defaults to the one recorded in the adapter's adapter_config.json. Writes safetensors
shards, tokenizer (a vision-language model's whole processor), chat template and generation config, then
reloads what it wrote and checks its logits against base + adapter (on a picture too, for a vision model).

The base is always loaded unquantized, even for a QLoRA adapter: merging into 4-bit weights would
quantize the merged weights again and lose most of what the adapter learned. Reward-model adapters
(task_type SEQ_CLS) merge into a one-output sequence classifier, score head included. A prompt-based adapter
(prompt tuning, p-tuning, prefix tuning) is refused before anything loads: it changes no weight to merge into.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..boundary import entry_point
from ..constants import ASSISTANT, USER
from ..data.images import image_part, probe_picture
from ..data.template import encode_conversation, encode_prompt, processor_of, reads_images
from ..hparams import MERGE_RELATIVE_TOLERANCES, MergeArguments, ModelArguments, parse_run, save_run_config
from ..hparams.run_config import merge_record
from ..models.merging import MergeError, adapter_task, load_adapted
from ..utils.io import atomic_directory
from ..utils.paths import vision_model_type

PROBE = [
    {"role": USER, "content": "What is the capital of France? Answer in one word."},
    {"role": ASSISTANT, "content": "Paris."},
]


@dataclass
class MergeResult:
    output_dir: str
    task: str
    max_abs_diff: float


def probe_logits(model: Any, tokenizer: Any) -> torch.Tensor:
    """The logits of a probe conversation; a vision-language model's shows it a picture too, so that the check
    covers its vision tower and projector (a trained projector merges in as well)."""
    if reads_images(tokenizer):
        prompt = encode_prompt(tokenizer, [{"role": USER, "content": [image_part(probe_picture()),
                                                                     {"type": "text", "text": PROBE[0]["content"]}]}])
        inputs = {"input_ids": torch.tensor([list(prompt)]), **prompt.vision}
    else:
        inputs = {"input_ids": torch.tensor([encode_conversation(tokenizer, PROBE).input_ids])}
    with torch.no_grad():
        return model(**{key: value.to(model.device) for key, value in inputs.items()}).logits.float().cpu()


def _load_saved(path: str, task: str, dtype: str) -> Any:
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSequenceClassification,
    )

    auto = AutoModelForSequenceClassification if task == "reward" else \
        AutoModelForImageTextToText if vision_model_type(path) else AutoModelForCausalLM
    return auto.from_pretrained(path, dtype=getattr(torch, dtype)).eval()


def merge(model_args: ModelArguments, args: MergeArguments) -> MergeResult:
    adapter, base = model_args.adapter_name_or_path, model_args.model_name_or_path
    if model_args.dtype == "auto":
        model_args.dtype = "float32"  # a merge keeps full precision unless asked otherwise
    dtype = model_args.dtype
    task = adapter_task(adapter)

    model, tokenizer = load_adapted(model_args, task)
    expected = probe_logits(model, tokenizer)
    tolerance = args.tolerance
    if tolerance is None:
        # Floored at 1: a reward score near 0 says nothing about the size of the hidden states' error.
        tolerance = MERGE_RELATIVE_TOLERANCES[dtype] * max(expected.abs().max().item(), 1.0)
    merged = model.merge_and_unload(safe_merge=True)

    with atomic_directory(args.output_dir) as tmp:
        merged.save_pretrained(tmp, max_shard_size=args.max_shard_size)  # with generation_config.json
        (processor_of(tokenizer) or tokenizer).save_pretrained(tmp)  # with the chat template that training used
        save_run_config(str(tmp), merge_record(model_args), args)
        del merged, model
        # Reload what was written, so the check covers the saved files and not only the weights in memory.
        diff = (probe_logits(_load_saved(str(tmp), task, dtype), tokenizer) - expected).abs().max().item()
        if not diff <= tolerance:
            raise MergeError(
                f"merged model from {adapter} differs from base {base} + adapter by {diff:.3g} "
                f"(max |logit difference| on a probe conversation; tolerance {tolerance:.3g} for {dtype})"
            )
    print(f"merged {adapter} into {base} -> {args.output_dir} ({task}, {dtype}): "
          f"max |logit difference| vs base + adapter = {diff:.3g} (tolerance {tolerance:.3g})")
    return MergeResult(args.output_dir, task, diff)


def run(argv: Sequence[str] | None = None) -> MergeResult:
    args = parse_run("merge", argv, __doc__)
    return merge(args.model, args.merge)


main = entry_point(run)
