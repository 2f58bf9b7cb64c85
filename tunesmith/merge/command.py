"""Merge a LoRA adapter into its base model, or several models into one through mergekit: load -> merge -> save
(atomically) -> verify.

    tunesmith merge --adapter_name_or_path outputs/sft_demo --output_dir outputs/sft_demo_merged
    tunesmith merge --adapter_name_or_path outputs/rm_demo --model_name_or_path BASE \\
        --output_dir OUT --dtype bfloat16

The base defaults to the one recorded in the adapter's adapter_config.json. Writes safetensors
shards, tokenizer (a vision-language model's whole processor), chat template and generation config, then
reloads what it wrote and checks its logits against base + adapter (on a picture too, for a vision model).

The base is always loaded unquantized, even for a QLoRA adapter: merging into 4-bit weights would
quantize the merged weights again and lose most of what the adapter learned. Reward-model adapters
(task_type SEQ_CLS) merge into a one-output sequence classifier, score head included. A prompt-based adapter
(prompt tuning, p-tuning, prefix tuning) is refused before anything loads: it changes no weight to merge into.

Several models (fine-tunes of one base, or LoRA adapters of one base) merge into one through mergekit:

    tunesmith merge --method linear --models outputs/sft_demo_merged outputs/dpo_demo_merged \\
        --weights 1 1 --output_dir outputs/soup
    tunesmith merge --method ties --model_name_or_path BASE --models A B --density 0.5 --output_dir OUT
    tunesmith merge --method slerp --models outputs/sft_demo outputs/dpo_demo --slerp_t 0.3 --output_dir OUT

Each adapter among --models is merged into its recorded base first (the LoRA merge above, checked, into a
temporary folder); mergekit's run_merge then merges the full models; the folder gets the first model's tokenizer,
chat template and generation config, and is reloaded to check that its logits on a probe conversation are finite.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..boundary import entry_point
from ..constants import ASSISTANT, USER
from ..data.images import image_part, probe_picture
from ..data.template import encode_conversation, encode_prompt, processor_of
from ..families import is_vision_language
from ..hparams import ModelArguments, parse_run, save_run_config
from ..hparams.run_config import merge_record
from ..models.loader import load_tokenizer
from ..models.merging import MergeError, adapter_task, load_adapted
from ..utils.events import report
from ..utils.io import atomic_directory
from ..utils.paths import adapter_base_model, is_adapter_dir
from .args import MERGE_RELATIVE_TOLERANCES, MergeArguments
from .methods import merge_configuration, run_mergekit

PROBE = [
    {"role": USER, "content": "What is the capital of France? Answer in one word."},
    {"role": ASSISTANT, "content": "Paris."},
]


@dataclass
class MergeResult:
    output_dir: str
    task: str
    max_abs_diff: float | None  # a LoRA merge's logit difference from base + adapter; None for a --method merge


def probe_logits(model: Any, tokenizer: Any) -> torch.Tensor:
    """The logits of a probe conversation; a vision-language model's shows it a picture too, so that the check
    covers its vision tower and projector (a trained projector merges in as well)."""
    if is_vision_language(tokenizer):
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
        AutoModelForImageTextToText if is_vision_language(path) else AutoModelForCausalLM
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
    report(f"merged {adapter} into {base} -> {args.output_dir} ({task}, {dtype}): "
          f"max |logit difference| vs base + adapter = {diff:.3g} (tolerance {tolerance:.3g})")
    return MergeResult(args.output_dir, task, diff)


def _full_model(path: str, model_args: ModelArguments, folder: str) -> str:
    """`path` itself for a model folder; for a LoRA adapter, its merge into its recorded base, written (and
    checked against base + adapter) to `folder`."""
    if not is_adapter_dir(path):
        return path
    adapter_args = dataclasses.replace(model_args, model_name_or_path=adapter_base_model(path),
                                       adapter_name_or_path=path)
    merge(adapter_args, MergeArguments(output_dir=folder))
    return folder


def merge_models(model_args: ModelArguments, args: MergeArguments) -> MergeResult:
    """--method: the --models (adapters merged into their bases first) merged by mergekit into --output_dir."""
    if model_args.dtype == "auto":
        model_args.dtype = "float32"
    dtype, base = model_args.dtype, model_args.model_name_or_path
    with tempfile.TemporaryDirectory(prefix="tunesmith-merge-") as work, atomic_directory(args.output_dir) as tmp:
        folders = [_full_model(path, model_args, os.path.join(work, str(i))) for i, path in enumerate(args.models)]
        run_mergekit(merge_configuration(args, folders, base, dtype), str(tmp), args.seed, model_args.trust_remote_code)
        # The first model's tokenizer and chat template (an adapter's are the ones its training saved), and its
        # generation config (stop tokens), so that the merge chats as that model does.
        tokenizer = load_tokenizer(dataclasses.replace(model_args, model_name_or_path=folders[0],
                                                       adapter_name_or_path=None))
        (processor_of(tokenizer) or tokenizer).save_pretrained(tmp)
        if os.path.isfile(os.path.join(folders[0], "generation_config.json")):
            shutil.copy(os.path.join(folders[0], "generation_config.json"), tmp)
        record = dataclasses.replace(args, models=[os.path.abspath(path) for path in args.models])
        save_run_config(str(tmp), merge_record(model_args), record)
        logits = probe_logits(_load_saved(str(tmp), "causal_lm", dtype), tokenizer)
        if not torch.isfinite(logits).all():
            raise MergeError(f"--method {args.method} merge of {', '.join(args.models)} gives non-finite logits on "
                             "a probe conversation; check the --weights (linear divides by their sum)")
    report(f"merged {len(args.models)} models by {args.method} -> {args.output_dir} ({dtype}): max |logit| on a "
          f"probe conversation {logits.abs().max().item():.3g}")
    return MergeResult(args.output_dir, "causal_lm", None)


def run(argv: Sequence[str] | None = None) -> MergeResult:
    args = parse_run("merge", argv, __doc__)
    if args.merge.method:
        return merge_models(args.model, args.merge)
    return merge(args.model, args.merge)


main = entry_point(run)
