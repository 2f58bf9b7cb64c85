"""One table of settings that cannot work, checked right after parsing, before any weight loads:
each row names the flag, the value received and what to change, instead of a failure later inside a
library. A row applies to a run that has every role it reads (model, data, finetuning, training,
ppo, reward, dpo, distill, generation, chat, serve, merge, export, score, evaluation); `check(**roles)` runs the
table."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ..distributed import fsdp_requested, fsdp_setting
from ..errors import ConfigError, PathError
from ..utils.hardware import trains_on_cpu
from ..utils.paths import (
    adapter_config,
    is_adapter_dir,
    looks_local,
    model_architecture,
    problem_with_data_file,
    problem_with_model_dir,
    problem_with_output_dir,
    prompt_adapter_kind,
    run_config_record,
    vision_model_type,
)
from ..utils.vision_families import PACKABLE_VISION_TYPES, reward_model_types
from ..utils.vocabulary import vocabulary_difference
from .data_args import SPLIT_STAGES, numbers
from .finetuning_args import is_known_init, splits_base
from .tool_args import LOOPBACK_HOSTS
from .value_bounds import BOUNDS, Bound


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
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--deepspeed {ds}: not valid JSON at line {e.lineno}: {e.msg}") from None


def zero_stage(training_args: Any) -> int:
    return int(deepspeed_config(training_args).get("zero_optimization", {}).get("stage", 0))


@dataclass(frozen=True)
class Rule:
    """`broken(run)` is falsy when the settings are fine; otherwise True, or a dict of values for the
    message's {placeholders} (which may also name any role's fields, e.g. {model.quantization_bit})."""

    name: str
    roles: tuple[str, ...]
    broken: Callable[[SimpleNamespace], Any]
    message: str
    error: type[Exception] = ConfigError


def _first(values: list[str], problem: Callable[[str], str | None]) -> dict | None:
    for value in values:
        found = problem(value)
        if found:
            return {"path": value, "problem": found}
    return None


def _missing_dir(path: str | None) -> dict | None:
    if path and not os.path.isdir(path):
        return {"path": path, "problem": "is a file, not a directory" if os.path.exists(path) else "no such directory"}
    return None


def _problem(found: str | None) -> dict | None:
    return {"problem": found} if found else None


def _merged_from_this_adapter(model: Any) -> dict | None:
    """{"base": the original base} when the model is a merge (tunesmith's merge recorded it) of the very
    adapter this run puts on top of it."""
    base, adapter = model.model_name_or_path, model.adapter_name_or_path
    if not (base and adapter and os.path.isdir(base)):
        return None
    record = run_config_record(base)
    merged = record.get("ModelArguments", {}) if "MergeArguments" in record else {}
    if merged.get("adapter_name_or_path") and os.path.realpath(merged["adapter_name_or_path"]) == os.path.realpath(adapter):
        return {"base": merged.get("model_name_or_path") or "the one its adapter_config.json records"}
    return None


# The architectures the GGUF export writes (models/gguf_arch.py maps each to llama.cpp's); the default
# model is the first. A test keeps the two lists equal.
GGUF_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                      "Gemma2ForCausalLM", "Gemma3ForCausalLM")
GGUF_K_QUANTS = ("q4_k_m", "q5_k_m", "q6_k")
# The vision-language model types it exports as a text GGUF plus llama.cpp's mmproj file (models/gguf_vision.py's
# EXPORTABLE_VISION_TYPES; a test keeps the two equal).
GGUF_VISION_TYPES = ("qwen2_vl", "qwen2_5_vl", "gemma3")


def _not_exportable(model: Any) -> dict | None:
    """{"arch": ...} when the model (the base, for an adapter) is a local folder of another architecture (an
    exportable vision-language model is one of its own)."""
    arch = model_architecture(model.model_name_or_path) if model.model_name_or_path else None
    if _vision(model):
        return None  # export_vision decides
    return {"arch": arch} if arch and arch not in GGUF_ARCHITECTURES else None


def _exists(path: str | None) -> bool:
    return bool(path) and os.path.exists(path)


def _prompt_adapter(model: Any) -> dict | None:
    """{"path", "kind"} when the adapter given (as --adapter_name_or_path, or as the model) is prompt-based."""
    for path in (model.adapter_name_or_path, model.model_name_or_path):
        kind = prompt_adapter_kind(path)
        if kind:
            return {"path": path, "kind": kind}
    return None


def _prompt_method(a: SimpleNamespace) -> dict | None:
    """{"kind"}: the prompt-based method a training run trains, by --finetuning_type or by the adapter it continues."""
    if a.finetuning.prompt_learning:
        return {"kind": a.finetuning.finetuning_type}
    found = _prompt_adapter(a.model) if hasattr(a, "model") else None
    return {"kind": found["kind"]} if found else None


def _adapter_kind_differs(a: SimpleNamespace) -> dict | None:
    """{"path", "kind", "wanted"} when the adapter a training run continues is not of --finetuning_type's kind."""
    path = a.model.adapter_name_or_path
    if not is_adapter_dir(path) or a.finetuning.finetuning_type == "full":
        return None
    kind = prompt_adapter_kind(path) or "lora"
    return {"path": path, "kind": kind} if kind != a.finetuning.finetuning_type else None


# What a prompt-based adapter cannot be merged or exported into, and why.
_NOTHING_TO_MERGE = ("{path} is a {kind} adapter: its virtual tokens go in front of the input and change no weight, "
                     "so there is nothing to merge into the weights; use it as it is with tunesmith chat, serve or "
                     "compare, or train a LoRA adapter (--finetuning_type lora) to merge.")


_VARIANT_FLAGS = (("use_dora", False), ("use_rslora", False), ("init_lora_weights", "true"),
                  ("loraplus_lr_ratio", None))


def _lora_variant_flag(a: SimpleNamespace) -> dict | None:
    """{"flag": ...}: the first LoRA-variant flag set away from its default on a run that trains no LoRA."""
    if a.finetuning.finetuning_type == "lora":
        return None
    flag = next((name for name, default in _VARIANT_FLAGS if getattr(a.finetuning, name) != default), None)
    return {"flag": f"--{flag}"} if flag else None


def _adapter_variant_differs(a: SimpleNamespace) -> dict | None:
    """{"flag": ...}: --use_dora or --use_rslora asked of a run that continues an adapter made without it."""
    path = a.model.adapter_name_or_path
    if not is_adapter_dir(path):
        return None
    config = adapter_config(path)
    flag = next((name for name in ("use_dora", "use_rslora")
                 if getattr(a.finetuning, name) and not config.get(name)), None)
    return {"flag": flag} if flag else None


def _non_sft_stage(a: SimpleNamespace) -> dict | None:
    """{"stage": ...} for a training run of another stage than SFT (whose own arguments are among its roles)."""
    stage = next((role for role in ("reward", "dpo", "ppo") if getattr(a, role, None) is not None), None)
    return {"stage": stage} if stage else None


def _vision_stage_missing(a: SimpleNamespace) -> dict | None:
    """{"model_type": ..., "stage": ..., "reward_types": ...} for a vision-language model and a training stage not
    built for it: all but SFT, DPO's paired losses and the reward model of a type with a sequence-classification
    class (KTO's unpaired replies and PPO's rollouts take no pictures yet)."""
    vision = _vision(a.model)
    stage = _non_sft_stage(a) if vision else None
    if not stage:
        return None
    reward_types = reward_model_types()
    if stage["stage"] == "dpo":
        stage = {"stage": "DPO with --loss_type kto"} if a.dpo.loss_type == "kto" else None
    elif stage["stage"] == "reward" and vision["model_type"] in reward_types:
        stage = None
    return stage and {**vision, **stage, "reward_types": ", ".join(reward_types)}


def _vision_folder(path: str) -> str | None:
    """The model type of a vision-language model folder, or of an adapter's base; None otherwise."""
    if is_adapter_dir(path):
        path = adapter_config(path).get("base_model_name_or_path")
    return vision_model_type(path) if path else None


def _vision(model: Any) -> dict | None:
    """{"model_type": ...} when the model (the base, for an adapter) is a local vision-language model folder."""
    model_type = vision_model_type(model.model_name_or_path) if model.model_name_or_path else None
    return {"model_type": model_type} if model_type else None


def _sequence_parallel(a: SimpleNamespace) -> int:
    return getattr(a.training, "sequence_parallel_size", 1)


def _world_size() -> int:
    """The launch's process count (torchrun and accelerate export WORLD_SIZE); 1 without a launcher."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def _has_llama_cpp() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def _has_mtmd() -> bool:
    """llama-cpp-python with its multimodal library beside it (built with -DLLAVA_BUILD=ON), found without
    loading it."""
    spec = importlib.util.find_spec("llama_cpp")
    return bool(spec and spec.origin and any(Path(spec.origin).parent.glob("lib/*mtmd*")))


def _bound_rule(bound: Bound) -> Rule:
    """The row of one value's bound: `--FIELD must be NEED (got VALUE); ADVICE.`"""

    def broken(a: SimpleNamespace) -> bool:
        value = getattr(getattr(a, bound.role), bound.field, None)
        return value is not None and (bound.when is None or bound.when(a)) and not bound.ok(value)

    advice = f"; {bound.advice}" if bound.advice else ""
    return Rule(f"{bound.role}_{bound.field}_value", (bound.role,), broken,
                f"--{bound.field} must be {bound.need} (got {{{bound.role}.{bound.field}}}){advice}.")


def _batch(a: SimpleNamespace) -> int:
    return a.training.per_device_train_batch_size


RULES: list[Rule] = [
    # -- paths, checked before anything loads
    Rule("data_path_given", ("data",), lambda a: not a.data.data_path,
         "--data_path is required: one or more JSON/JSONL files (e.g. data/demo/sft.jsonl)."),
    Rule("data_files", ("data",), lambda a: _first(a.data.data_path + getattr(a.data, "eval_data_path", []),
                                                    problem_with_data_file),
         "data file {path}: {problem}.", PathError),
    Rule("model_path", ("model",),
         lambda a: a.model.model_name_or_path and looks_local(a.model.model_name_or_path)
         and _first([a.model.model_name_or_path], problem_with_model_dir),
         "--model_name_or_path {path}: {problem}. Give a local model directory (one with config.json), "
         "or leave it out for the embedded default model.", PathError),
    Rule("adapter_path", ("model",), lambda a: _missing_dir(a.model.adapter_name_or_path),
         "--adapter_name_or_path {path}: {problem}.", PathError),
    Rule("adapter_is_adapter", ("model",),
         lambda a: a.model.adapter_name_or_path and os.path.isdir(a.model.adapter_name_or_path)
         and not is_adapter_dir(a.model.adapter_name_or_path),
         "--adapter_name_or_path {model.adapter_name_or_path}: no adapter_config.json there, so it is not a LoRA "
         "adapter; a full or merged model goes in --model_name_or_path.", PathError),
    Rule("base_is_adapter", ("model",),
         lambda a: a.model.adapter_name_or_path and is_adapter_dir(a.model.model_name_or_path),
         "--model_name_or_path {model.model_name_or_path} is a LoRA adapter, not a base model: give the model it "
         "was trained on (or leave --model_name_or_path out to use the base its adapter_config.json records).",
         PathError),
    Rule("adapter_already_merged", ("model",), lambda a: _merged_from_this_adapter(a.model),
         "--model_name_or_path {model.model_name_or_path} already has {model.adapter_name_or_path} merged into it "
         "(its tunesmith_config.json records that merge): adding the adapter again would apply it twice. Use the "
         "merged model alone, or the adapter on its original base ({base})."),
    Rule("output_dir", ("training",), lambda a: _problem(problem_with_output_dir(a.training.output_dir)),
         "--output_dir {training.output_dir}: {problem}; choose another directory.", PathError),
    # -- single values out of their range (value_bounds.py), before any row computes with them
    *map(_bound_rule, BOUNDS),
    Rule("length_of_run", ("training",), lambda a: a.training.max_steps <= 0 and not a.training.num_train_epochs > 0,
         "--num_train_epochs {training.num_train_epochs} with --max_steps {training.max_steps} trains nothing: set "
         "--max_steps N (optimizer steps; for PPO/GRPO/RLOO, rollout batches) or --num_train_epochs above 0."),
    # -- model loading
    Rule("quantization_bit", ("model",), lambda a: a.model.quantization_bit not in (None, 4, 8),
         "--quantization_bit must be 4 or 8 (got {model.quantization_bit})."),
    Rule("qlora_prompt_learning", ("model", "finetuning", "training"),
         lambda a: a.model.quantization_bit is not None and a.finetuning.prompt_learning,
         "--quantization_bit with --finetuning_type {finetuning.finetuning_type}: not supported; the prompt-based "
         "methods train on an unquantized base (their few trained values save little memory on a quantized one): "
         "drop --quantization_bit, or use --finetuning_type lora for QLoRA."),
    Rule("qlora_needs_lora", ("model", "finetuning"),
         lambda a: a.model.quantization_bit is not None and a.finetuning.finetuning_type != "lora",
         "--quantization_bit trains LoRA adapters on a frozen quantized base: use --finetuning_type lora "
         "(quantized weights cannot be fully fine-tuned)."),
    Rule("zero3_8bit", ("model", "training"),
         lambda a: a.model.quantization_bit == 8 and zero_stage(a.training) == 3,
         "ZeRO-3 cannot partition 8-bit bitsandbytes weights: use --quantization_bit 4 (stored in the compute "
         "dtype, which ZeRO-3 can shard) or configs/ds_zero2.json."),
    Rule("fsdp_with_deepspeed", ("training",), lambda a: fsdp_requested(a.training) and a.training.deepspeed,
         "FSDP (--fsdp_config, or accelerate launch with an FSDP config) and --deepspeed {training.deepspeed} both "
         "shard the model: keep one, configs/fsdp2.yaml or a configs/ds_zero*.json."),
    Rule("fsdp_version", ("training",),
         lambda a: fsdp_requested(a.training) and fsdp_setting(a.training, "version", "1") != "2"
         and {"version": fsdp_setting(a.training, "version", "1")},
         "FSDP version {version}: tunesmith runs FSDP2 (torch's fully_shard) only; set fsdp_version: 2 in the FSDP "
         "config (configs/fsdp2.yaml does)."),
    Rule("fsdp_full_state_dict", ("training",),
         lambda a: fsdp_requested(a.training)
         and (fsdp_setting(a.training, "version", "1") == "2"
              and fsdp_setting(a.training, "state_dict_type", "SHARDED_STATE_DICT").upper() != "FULL_STATE_DICT")
         and {"kind": fsdp_setting(a.training, "state_dict_type", "SHARDED_STATE_DICT")},
         "fsdp_state_dict_type {kind}: tunesmith's saves gather the whole model on the first process, so that "
         "outputs load with plain transformers/peft; set fsdp_state_dict_type: FULL_STATE_DICT (configs/fsdp2.yaml "
         "does)."),
    Rule("fsdp_8bit", ("model", "training"), lambda a: a.model.quantization_bit == 8 and fsdp_requested(a.training),
         "FSDP cannot shard 8-bit bitsandbytes weights (fully_shard drops their quantization state): use "
         "--quantization_bit 4 (stored in the compute dtype, which FSDP shards), or --deepspeed configs/ds_zero2.json."),
    Rule("fp16_on_cpu", ("training",),
         lambda a: a.training.fp16 and trains_on_cpu(a.training),
         "--fp16 mixed precision needs a CUDA GPU: drop it, or use --bf16 true."),
    Rule("flash_attn_missing", ("model",),
         lambda a: a.model.attn_implementation == "flash_attention_2"
         and (importlib.util.find_spec("flash_attn") is None or not torch.cuda.is_available()),
         "--attn_implementation flash_attention_2 needs a CUDA GPU and the flash-attn package "
         "(pip install 'tunesmith[gpu]'); use auto to pick sdpa otherwise."),
    Rule("liger_kernel_missing", ("training",),
         lambda a: a.training.use_liger_kernel
         and (importlib.util.find_spec("liger_kernel") is None or not torch.cuda.is_available()),
         "--use_liger_kernel needs a CUDA GPU and the liger-kernel package (pip install liger-kernel; its kernels "
         "are Triton, GPU only): drop the flag on CPU."),
    # -- vision-language models (models/vision.py)
    Rule("vision_packing", ("model", "data"),
         lambda a: getattr(a.data, "packing", False) and (v := _vision(a.model))
         and v["model_type"] not in PACKABLE_VISION_TYPES and v,
         "--packing with a vision-language model ({model_type}): packed exactly for "
         + ", ".join(PACKABLE_VISION_TYPES) + " only (Gemma 3's picture tokens attend to each other both ways, "
         "which a causal packed row does not compute; Qwen3-VL's positions are not checked); use --packing false."),
    Rule("vision_packing_forward_tokens", ("model", "data"),
         lambda a: getattr(a.data, "max_forward_tokens", None) and getattr(a.data, "packing", False)
         and _vision(a.model),
         "--max_forward_tokens {data.max_forward_tokens} with a vision-language model: a packed row runs in one "
         "forward (a split would cut its pictures' inputs); drop it, or lower --per_device_train_batch_size."),
    Rule("vision_stage", ("model", "training"),
         _vision_stage_missing,
         "{stage} on a vision-language model ({model_type}): not built (SFT, DPO with the sigmoid, ipo, simpo "
         "and orpo losses, and reward models of {reward_types} train on pictures; chat, serve, merge and eval take "
         "them); train it with one of those, or on its text with the language model alone."),
    Rule("vision_prompt_learning", ("model", "finetuning"),
         lambda a: a.finetuning.prompt_learning and _vision(a.model),
         "--finetuning_type {finetuning.finetuning_type} with a vision-language model ({model_type}): its virtual "
         "tokens would go in front of the image tokens its processor places; use --finetuning_type lora or full."),
    Rule("vision_flags_text_model", ("model", "finetuning"),
         lambda a: (a.finetuning.train_vision_tower or a.finetuning.train_projector) and not _vision(a.model),
         "--train_vision_tower / --train_projector: {model.model_name_or_path} is not a vision-language model (no "
         "vision_config in its config.json, or no processor in its folder); leave them out."),
    # -- sequence parallelism (train/sequence_parallel.py)
    Rule("sequence_parallel_size_value", ("training",), lambda a: _sequence_parallel(a) < 1,
         "--sequence_parallel_size must be at least 1 (got {training.sequence_parallel_size}); 1 is off."),
    Rule("sequence_parallel_deepspeed", ("training",), lambda a: _sequence_parallel(a) > 1 and not a.training.deepspeed,
         "--sequence_parallel_size {training.sequence_parallel_size} runs on DeepSpeed's Ulysses: add --deepspeed "
         "configs/ds_zero2.json (or ds_zero3.json); FSDP does not cut sequences."),
    Rule("sequence_parallel_packing", ("data", "training"),
         lambda a: _sequence_parallel(a) > 1 and not getattr(a.data, "packing", False),
         "--sequence_parallel_size {training.sequence_parallel_size} needs --packing true: the ranks cut one "
         "padding-free row, whose conversations keep their boundaries across the cut."),
    Rule("sequence_parallel_world", ("training",),
         lambda a: _sequence_parallel(a) > 1 and _world_size() % _sequence_parallel(a) and {"world": _world_size()},
         "--sequence_parallel_size {training.sequence_parallel_size}: this launch has {world} process(es), not a "
         "multiple of it; launch N x {training.sequence_parallel_size} (torchrun --nproc_per_node, --nnodes)."),
    Rule("sequence_parallel_vision", ("model", "training"),
         lambda a: _sequence_parallel(a) > 1 and _vision(a.model),
         "--sequence_parallel_size with a vision-language model ({model_type}): its pictures cannot be cut across "
         "ranks; train on one rank per row (leave the flag out)."),
    Rule("sequence_parallel_label_smoothing", ("training",),
         lambda a: _sequence_parallel(a) > 1 and a.training.label_smoothing_factor,
         "--label_smoothing_factor {training.label_smoothing_factor} with --sequence_parallel_size: each rank "
         "computes its tokens' plain cross-entropy; drop one of them."),
    # -- data
    Rule("max_forward_tokens_needs_packing", ("data",),
         lambda a: getattr(a.data, "max_forward_tokens", None) is not None and not a.data.packing,
         "--max_forward_tokens {data.max_forward_tokens} splits packed batches: add --packing true, or drop it "
         "(a padded batch runs in one forward; lower --per_device_train_batch_size to use less memory)."),
    Rule("max_forward_tokens_deepspeed", ("data", "training"),
         lambda a: getattr(a.data, "max_forward_tokens", None) and a.training.deepspeed,
         "--max_forward_tokens {data.max_forward_tokens} cannot be used with --deepspeed: DeepSpeed takes an "
         "optimizer step at every backward, so a batch cannot run as several. Drop it, or lower "
         "--per_device_train_batch_size to use less memory."),
    Rule("max_forward_tokens", ("data",), lambda a: (getattr(a.data, "max_forward_tokens", None) or 0) < 0,
         "--max_forward_tokens {data.max_forward_tokens}: give a number of tokens, or 0 for the whole batch at once."),
    Rule("val_size", ("data",), lambda a: not 0.0 <= getattr(a.data, "val_size", 0.0) < 1.0,
         "--val_size must be in [0, 1) (got {data.val_size}): the share of --data_path held out for evaluation."),
    Rule("val_size_and_eval_data_path", ("data",),
         lambda a: getattr(a.data, "val_size", 0.0) > 0 and getattr(a.data, "eval_data_path", None),
         "--val_size {data.val_size} and --eval_data_path both give evaluation data: keep one (--val_size holds out "
         "a share of --data_path)."),
    Rule("eval_strategy_without_data", ("data", "training"),
         lambda a: hasattr(a.data, "val_size") and not (a.data.eval_data_path or a.data.val_size > 0)
         and a.training.eval_strategy != "no" and {"strategy": getattr(a.training.eval_strategy, "value", "")},
         "--eval_strategy {strategy} has no evaluation data to evaluate: give --eval_data_path FILE or --val_size "
         "0.1 (a held-out share of --data_path), or drop --eval_strategy."),
    Rule("max_seq_length", ("data",), lambda a: getattr(a.data, "max_seq_length", 8) < 8,
         "--max_seq_length must be at least 8 tokens (got {data.max_seq_length})."),
    Rule("data_selection_in_training", ("data",),
         lambda a: (a.data.data_weights or a.data.data_split) and not (hasattr(a, "training") or hasattr(a, "inspect"))
         and {"flag": "data_split" if a.data.data_split else "data_weights"},
         "--{flag} chooses the rows a training stage (or inspect) uses; this command reads its --data_path whole: "
         "drop the flag."),
    Rule("data_weights_numbers", ("data",),
         lambda a: a.data.data_weights and (numbers(a.data.data_weights) is None or min(numbers(a.data.data_weights)) < 0
                                            or not sum(numbers(a.data.data_weights)))
         and {"value": ",".join(a.data.data_weights)},
         "--data_weights {value}: give a number >= 0 per --data_path file, not all 0 (e.g. --data_weights 0.7,0.3)."),
    Rule("data_weights_count", ("data",),
         lambda a: a.data.data_weights and len(a.data.data_weights) != len(a.data.data_path)
         and {"weights": len(a.data.data_weights), "paths": len(a.data.data_path)},
         "--data_weights has {weights} values for {paths} --data_path files: give one weight per file, in order."),
    Rule("data_split_numbers", ("data",),
         lambda a: a.data.data_split and (len(a.data.data_split) != len(SPLIT_STAGES) or numbers(a.data.data_split) is None
                                          or min(numbers(a.data.data_split)) < 0 or not sum(numbers(a.data.data_split)))
         and {"value": ",".join(a.data.data_split)},
         "--data_split {value}: give three numbers >= 0, not all 0, the shares of SFT, reward/DPO and PPO (e.g. "
         "--data_split 2,4,4)."),
    Rule("data_split_stage_part", ("data",),
         lambda a: a.data.data_split and a.data.split_part and not numbers(a.data.data_split)[a.data.split_part - 1]
         and {"value": ",".join(a.data.data_split), "stage": SPLIT_STAGES[a.data.split_part - 1]},
         "--data_split {value} gives stage {stage} (part {data.split_part}) no rows: give its part a share above 0."),
    Rule("max_samples", ("data",), lambda a: a.data.max_samples is not None and a.data.max_samples < 1,
         "--max_samples must be at least 1 (got {data.max_samples}); leave it out to use every row."),
    # -- fine-tuning
    Rule("lora_rank", ("finetuning",), lambda a: a.finetuning.finetuning_type == "lora" and a.finetuning.lora_r < 1,
         "--lora_r must be a positive rank (got {finetuning.lora_r})."),
    Rule("virtual_tokens", ("finetuning",),
         lambda a: a.finetuning.prompt_learning and a.finetuning.num_virtual_tokens < 1,
         "--num_virtual_tokens must be at least 1 (got {finetuning.num_virtual_tokens})."),
    Rule("virtual_tokens_need_prompt_method", ("finetuning",),
         lambda a: not a.finetuning.prompt_learning and a.finetuning.num_virtual_tokens != 20,
         "--num_virtual_tokens {finetuning.num_virtual_tokens} sizes a prompt-based adapter: use --finetuning_type "
         "prompt_tuning, p_tuning or prefix_tuning (got {finetuning.finetuning_type}), or drop it."),
    Rule("init_text_needs_prompt_tuning", ("finetuning",),
         lambda a: a.finetuning.prompt_tuning_init_text and a.finetuning.finetuning_type != "prompt_tuning",
         "--prompt_tuning_init_text starts prompt tuning's virtual tokens from a text: use --finetuning_type "
         "prompt_tuning (got {finetuning.finetuning_type}), or drop it."),
    Rule("reward_prompt_learning", ("reward", "finetuning"), _prompt_method,
         "--finetuning_type {kind} cannot train a reward model: its score head is a new layer that a prompt-based "
         "adapter does not train; use --finetuning_type lora or full."),
    Rule("dpo_prompt_learning", ("dpo", "finetuning"), _prompt_method,
         "--finetuning_type {kind} cannot be used with DPO: its pairs run as packed rows, where PEFT's virtual tokens "
         "would precede only the first sequence of each row; use --finetuning_type lora or full."),
    Rule("ppo_prompt_learning", ("ppo", "finetuning"), _prompt_method,
         "--finetuning_type {kind} cannot be used with PPO/GRPO/RLOO: the value model is a second adapter on the "
         "policy's model, and PEFT holds one prompt-based adapter per model; use --finetuning_type lora or full."),
    Rule("adapter_kind", ("model", "finetuning", "training"), _adapter_kind_differs,
         "--adapter_name_or_path {path} is a {kind} adapter: continue it with --finetuning_type {kind} (got "
         "{finetuning.finetuning_type}), or start a new adapter without --adapter_name_or_path."),
    Rule("p_tuning_encoder", ("model", "finetuning", "training"),
         lambda a: a.finetuning.finetuning_type == "p_tuning" and prompt_adapter_kind(a.model.adapter_name_or_path)
         and not os.path.isfile(os.path.join(a.model.adapter_name_or_path, "prompt_encoder.safetensors")),
         "--adapter_name_or_path {model.adapter_name_or_path}: a p_tuning adapter without prompt_encoder.safetensors "
         "(which tunesmith writes beside it) holds the encoder's output but not the MLP to train further; train a "
         "new one, or resume the run that made it (--resume_from_checkpoint)."),
    Rule("prompt_learning_packing", ("data", "finetuning"),
         lambda a: getattr(a.data, "packing", False) and a.finetuning.prompt_learning,
         "--packing cannot be used with --finetuning_type {finetuning.finetuning_type}: PEFT puts the virtual tokens "
         "once in front of each row, and a packed row holds many examples, all but the first of which would train "
         "without them; drop --packing (padded batches)."),
    Rule("prompt_learning_label_smoothing", ("finetuning", "training"),
         lambda a: a.finetuning.finetuning_type in ("prompt_tuning", "p_tuning")
         and getattr(a.training, "label_smoothing_factor", 0),
         "--label_smoothing_factor cannot be used with --finetuning_type {finetuning.finetuning_type}: transformers' "
         "smoothed loss lines the labels up with logits that begin with the virtual tokens' positions, so every "
         "target would be scored at the wrong token; drop it, or use prefix_tuning or lora."),
    Rule("prompt_learning_zero3", ("finetuning", "training"),
         lambda a: a.finetuning.prompt_learning and zero_stage(a.training) == 3,
         "--finetuning_type {finetuning.finetuning_type} cannot be used with ZeRO-3, which this version does not "
         "support for PEFT's prompt encoders; they are small: use configs/ds_zero2.json, or no --deepspeed."),
    Rule("prefix_tuning_checkpointing", ("finetuning", "training"),
         lambda a: a.finetuning.finetuning_type == "prefix_tuning" and a.training.gradient_checkpointing,
         "--gradient_checkpointing cannot be used with --finetuning_type prefix_tuning: PEFT passes the prefix as a "
         "KV cache, which checkpointed layers do not take; drop it, or use prompt_tuning or p_tuning."),
    Rule("adapter_with_full", ("model", "finetuning"),
         lambda a: a.model.adapter_name_or_path is not None and a.finetuning.finetuning_type == "full",
         "--adapter_name_or_path continues a LoRA run: use --finetuning_type lora (or the prompt-based kind of a "
         "prompt-based adapter), or merge a LoRA adapter first (merge/merge_lora.py) and fully fine-tune the merged "
         "model."),
    Rule("lora_learning_rate_without_lora", ("finetuning",),
         lambda a: a.finetuning.lora_learning_rate is not None and a.finetuning.finetuning_type != "lora",
         "--lora_learning_rate sets the rate of LoRA's matrices, and --finetuning_type {finetuning.finetuning_type} "
         "trains none: drop it, or use --finetuning_type lora."),
    Rule("lora_learning_rate", ("finetuning",),
         lambda a: a.finetuning.lora_learning_rate is not None and not a.finetuning.lora_learning_rate > 0,
         "--lora_learning_rate must be > 0 (got {finetuning.lora_learning_rate})."),
    # -- LoRA variants (models/lora_variants.py)
    Rule("lora_variant_without_lora", ("finetuning",), _lora_variant_flag,
         "{flag} is a LoRA setting, and --finetuning_type {finetuning.finetuning_type} trains no LoRA adapter: drop "
         "it, or use --finetuning_type lora."),
    Rule("loraplus_lr_ratio", ("finetuning",),
         lambda a: a.finetuning.loraplus_lr_ratio is not None and not a.finetuning.loraplus_lr_ratio > 0,
         "--loraplus_lr_ratio must be > 0 (got {finetuning.loraplus_lr_ratio}); LoRA+ uses about 16, and leaving it "
         "out trains A and B at one rate."),
    Rule("init_lora_weights_loftq", ("finetuning",), lambda a: a.finetuning.init_lora_weights == "loftq",
         "--init_lora_weights loftq is not offered: LoftQ quantizes the base itself and rewrites its weights, and "
         "the adapter fits only that rewritten base; make both with PEFT (LoraConfig(init_lora_weights=\"loftq\", "
         "loftq_config=LoftQConfig(loftq_bits=4)) on the unquantized model, then save the base and the adapter) and "
         "train on them with --model_name_or_path BASE --adapter_name_or_path ADAPTER (see docs/sft.md)."),
    Rule("init_lora_weights", ("finetuning",),
         lambda a: a.finetuning.init_lora_weights != "loftq" and not is_known_init(a.finetuning.init_lora_weights),
         "--init_lora_weights must be one of true, gaussian, pissa, pissa_niter_N (N subspace iterations, e.g. "
         "pissa_niter_4), olora, orthogonal (got {finetuning.init_lora_weights})."),
    Rule("init_lora_weights_orthogonal_rank", ("finetuning",),
         lambda a: a.finetuning.init_lora_weights == "orthogonal" and a.finetuning.lora_r % 2,
         "--init_lora_weights orthogonal needs an even --lora_r (got {finetuning.lora_r})."),
    Rule("init_lora_weights_orthogonal_8bit", ("model", "finetuning"),
         lambda a: a.finetuning.init_lora_weights == "orthogonal" and a.model.quantization_bit == 8,
         "--init_lora_weights orthogonal with --quantization_bit 8: PEFT makes the orthogonal matrices in the base "
         "weight's dtype, int8 on an 8-bit base, which cannot train; use --quantization_bit 4, or another "
         "--init_lora_weights."),
    Rule("init_lora_weights_adapter", ("model", "finetuning", "training"),
         lambda a: a.model.adapter_name_or_path and a.finetuning.init_lora_weights != "true",
         "--init_lora_weights {finetuning.init_lora_weights} starts a new adapter, and this run continues "
         "{model.adapter_name_or_path}, whose weights it keeps: drop --init_lora_weights, or drop "
         "--adapter_name_or_path to start a new one."),
    Rule("lora_variant_adapter_differs", ("model", "finetuning", "training"), _adapter_variant_differs,
         "--{flag} true, but the adapter {model.adapter_name_or_path} this run continues was trained without it "
         "(its adapter_config.json decides): drop --{flag}, or drop --adapter_name_or_path to start a new adapter."),
    Rule("init_residual_quantized", ("model", "finetuning"),
         lambda a: a.model.quantization_bit is not None and splits_base(a.finetuning.init_lora_weights),
         "--init_lora_weights {finetuning.init_lora_weights} with --quantization_bit: the residual base it leaves "
         "must be made from the unquantized weights, and the adapter would not fit the quantized original; make "
         "the residual model with PEFT first (init on the unquantized model, save the residual base and the "
         "adapter, as PEFT's pissa_finetuning example does) and train QLoRA on it with --model_name_or_path "
         "RESIDUAL --adapter_name_or_path ADAPTER, or drop --quantization_bit."),
    Rule("init_residual_sharded", ("finetuning", "training"),
         lambda a: splits_base(a.finetuning.init_lora_weights)
         and (zero_stage(a.training) == 3 or fsdp_requested(a.training)),
         "--init_lora_weights {finetuning.init_lora_weights} cannot be used with ZeRO-3 or FSDP: it splits each "
         "whole weight at load and converts the saved adapter from whole weights; use configs/ds_zero2.json, or "
         "--init_lora_weights true."),
    Rule("init_residual_dpo_reference", ("dpo", "finetuning"),
         lambda a: a.dpo.needs_reference and splits_base(a.finetuning.init_lora_weights),
         "--init_lora_weights {finetuning.init_lora_weights} with --loss_type {dpo.loss_type}: the reference of a new "
         "adapter is the model with its adapter switched off, which {finetuning.init_lora_weights} leaves as the "
         "residual weights, not the model you start from; use --loss_type simpo or orpo (no reference), or train "
         "the PiSSA/OLoRA adapter with SFT first and continue it (--adapter_name_or_path)."),
    Rule("lora_variant_ppo", ("ppo", "finetuning"),
         lambda a: _problem("--loraplus_lr_ratio" if a.finetuning.loraplus_lr_ratio is not None else
                            f"--init_lora_weights {a.finetuning.init_lora_weights}"
                            if splits_base(a.finetuning.init_lora_weights) else None),
         "{problem} is for SFT, reward and DPO runs, not PPO/GRPO: drop it (a PiSSA/OLoRA SFT adapter is saved as a "
         "plain LoRA, which PPO continues)."),
    Rule("router_aux_loss_coef", ("finetuning",),
         lambda a: a.finetuning.router_aux_loss_coef is not None and not a.finetuning.router_aux_loss_coef >= 0,
         "--router_aux_loss_coef must be >= 0 (got {finetuning.router_aux_loss_coef}); 0 leaves the router loss out."),
    Rule("router_aux_loss_coef_sft_only", ("finetuning",),
         lambda a: a.finetuning.router_aux_loss_coef is not None and _non_sft_stage(a),
         "--router_aux_loss_coef weighs a mixture-of-experts router loss that only SFT adds, and this is a {stage} "
         "run: drop it."),
    Rule("center_rewards", ("reward",),
         lambda a: a.reward.center_rewards_coefficient is not None and a.reward.center_rewards_coefficient < 0,
         "--center_rewards_coefficient must be >= 0 (got {reward.center_rewards_coefficient}); leave it unset to "
         "train without centring."),
    # -- DPO
    Rule("dpo_beta", ("dpo",), lambda a: not a.dpo.beta > 0,
         "--beta must be > 0 (got {dpo.beta}); 0.1 is typical for sigmoid/ipo/kto, 2.0 for simpo, 0.1 for orpo."),
    Rule("dpo_label_smoothing", ("dpo",), lambda a: not 0.0 <= a.dpo.label_smoothing < 0.5,
         "--label_smoothing must be in [0, 0.5) (got {dpo.label_smoothing}): it is the assumed fraction of flipped "
         "pairs, and 0.5 or more would train towards the rejected replies."),
    Rule("dpo_smoothing_sigmoid_only", ("dpo",),
         lambda a: a.dpo.label_smoothing and a.dpo.loss_type != "sigmoid",
         "--label_smoothing {dpo.label_smoothing} applies to --loss_type sigmoid only (got {dpo.loss_type}, whose "
         "loss has no labels to smooth): drop it, or use --loss_type sigmoid."),
    Rule("dpo_precompute_needs_reference", ("dpo",),
         lambda a: a.dpo.precompute_ref_logps and not a.dpo.needs_reference,
         "--precompute_ref_logps: --loss_type {dpo.loss_type} has no reference model to score; drop the flag."),
    Rule("dpo_precompute_zero3", ("dpo", "training"),
         lambda a: a.dpo.precompute_ref_logps and zero_stage(a.training) == 3,
         "--precompute_ref_logps cannot be used with ZeRO-3: the pass runs before DeepSpeed gathers the sharded "
         "weights. Drop it (the reference then runs in each step, sharded like the policy), or use ZeRO-2."),
    Rule("dpo_full_reference_zero3", ("dpo", "finetuning", "training"),
         lambda a: a.dpo.needs_reference and a.finetuning.finetuning_type == "full" and zero_stage(a.training) == 3,
         "--loss_type {dpo.loss_type} with --finetuning_type full keeps a frozen copy of the model as its "
         "reference, which this version does not shard under ZeRO-3. Use --finetuning_type lora (the reference is "
         "the model without its adapter, sharded like the policy), ZeRO-2 with --precompute_ref_logps, or a "
         "reference-free loss (--loss_type simpo or orpo)."),
    Rule("kto_weights", ("dpo",), lambda a: not (a.dpo.desirable_weight > 0 and a.dpo.undesirable_weight > 0),
         "--desirable_weight and --undesirable_weight must be > 0 (got {dpo.desirable_weight} and "
         "{dpo.undesirable_weight}): they weigh KTO's loss on each kind of reply."),
    Rule("kto_weights_kto_only", ("dpo",),
         lambda a: a.dpo.loss_type != "kto" and (a.dpo.desirable_weight, a.dpo.undesirable_weight) != (1.0, 1.0),
         "--desirable_weight and --undesirable_weight apply to --loss_type kto only (got {dpo.loss_type}, whose "
         "pairs have one reply of each kind): drop them, or use --loss_type kto."),
    Rule("kto_precompute", ("dpo",), lambda a: a.dpo.loss_type == "kto" and a.dpo.precompute_ref_logps,
         "--precompute_ref_logps cannot be used with --loss_type kto: its KL estimate scores each batch's prompts "
         "with other rows' replies, paired anew in every batch, which no pass before training can score; drop the "
         "flag (the reference then runs in each step)."),
    Rule("kto_batch", ("dpo", "training"),
         lambda a: a.dpo.loss_type == "kto" and a.training.per_device_train_batch_size < 2,
         "--loss_type kto with --per_device_train_batch_size {training.per_device_train_batch_size}: KTO estimates "
         "its KL term from each batch's prompts paired with the batch's other replies, and one reply has none: use "
         "2 or more (8 or more gives a steadier estimate; lower --gradient_accumulation_steps to keep the step size)."),
    Rule("kto_val_size", ("dpo", "data"), lambda a: a.dpo.loss_type == "kto" and getattr(a.data, "val_size", 0) > 0,
         "--val_size with --loss_type kto: KTO is evaluated on held-out preference pairs (how often the chosen reply "
         "gets the higher implicit reward, as DPO is): give them as --eval_data_path (a file of pairs), or drop "
         "--val_size."),
    # -- PPO (the reward-model rows need "data" too: they are the recipe's, not the trainer's, which
    # may be given a reward function instead)
    Rule("ppo_reward_given", ("ppo", "data"), lambda a: not (a.ppo.reward_model or a.ppo.reward_funcs),
         "--reward_model or --reward_funcs is required: the output directory of reward/train.py (e.g. "
         "outputs/rm_demo), and/or reward functions (e.g. --reward_funcs exact_answer answer_format)."),
    Rule("ppo_reward_weights", ("ppo",),
         lambda a: a.ppo.reward_weights and len(a.ppo.reward_weights) != len(a.ppo.reward_funcs)
         and {"weights": len(a.ppo.reward_weights), "funcs": len(a.ppo.reward_funcs)},
         "--reward_weights has {weights} values for {funcs} --reward_funcs: give one weight per function, in order "
         "(the reward model's is --reward_model_weight)."),
    Rule("ppo_reward_model_path", ("ppo", "data"), lambda a: _missing_dir(a.ppo.reward_model),
         "--reward_model {path}: {problem} (train one with reward/train.py).", PathError),
    Rule("ptx_files", ("ppo", "data"), lambda a: _first(a.ppo.ptx_data_path, problem_with_data_file),
         "--ptx_data_path {path}: {problem}.", PathError),
    Rule("ppo_vision_reward_model", ("ppo", "data"),
         lambda a: a.ppo.reward_model and _vision_folder(a.ppo.reward_model)
         and {"path": a.ppo.reward_model, "model_type": _vision_folder(a.ppo.reward_model)},
         "--reward_model {path} is a vision-language reward model ({model_type}): PPO's rollouts are text, with no "
         "pictures to show it; give a text reward model, or score with `tunesmith score`."),
    Rule("ptx_coef_without_data", ("ppo", "data"), lambda a: a.ppo.ptx_coef is not None and not a.ppo.ptx_data_path,
         "--ptx_coef weighs the supervised loss of --ptx_data_path, which is not given: add --ptx_data_path FILE "
         "(SFT conversations) or drop --ptx_coef."),
    Rule("ptx_coef", ("ppo", "data"), lambda a: a.ppo.ptx_coef is not None and not a.ppo.ptx_coef > 0,
         "--ptx_coef must be > 0 (got {ppo.ptx_coef}); leave out --ptx_data_path to train without it."),
    Rule("ema_decay", ("ppo", "data"), lambda a: a.ppo.ema_decay is not None and not 0 < a.ppo.ema_decay < 1,
         "--ema_decay must be between 0 and 1, both excluded (got {ppo.ema_decay}); 0.992 is DeepSpeed-Chat's."),
    Rule("ema_zero3", ("ppo", "training"), lambda a: a.ppo.ema_decay is not None and zero_stage(a.training) == 3,
         "--ema_decay keeps a whole copy of the policy's weights, which ZeRO-3 holds only in shards: use "
         "configs/ds_zero2.json, or drop --ema_decay."),
    Rule("critic_without_value_model", ("ppo", "data"),
         lambda a: a.ppo.critic_model_name_or_path is not None and a.ppo.advantage != "gae",
         "--critic_model_name_or_path starts PPO's value model, and --advantage {ppo.advantage} has none: drop it, "
         "or use --advantage gae."),
    Rule("critic_path", ("ppo", "data"),
         lambda a: a.ppo.critic_model_name_or_path != "base" and _missing_dir(a.ppo.critic_model_name_or_path),
         "--critic_model_name_or_path {path}: {problem} (a reward model from reward/train.py, or `base`).",
         PathError),
    Rule("ppo_lora_checkpointing", ("ppo", "finetuning", "training"),
         lambda a: a.training.gradient_checkpointing and a.finetuning.finetuning_type == "lora",
         "--gradient_checkpointing cannot be used with LoRA PPO: the policy and value adapters share one model and "
         "the recomputed forward would run the wrong adapter; drop it (or use --finetuning_type full)."),
    Rule("ppo_fsdp", ("ppo", "training"), lambda a: fsdp_requested(a.training),
         "ppo/train.py (PPO, GRPO, RLOO) cannot run under FSDP: its rollouts generate with the whole policy, which "
         "it gathers only from DeepSpeed's shards. Use --deepspeed configs/ds_zero2.json or configs/ds_zero3.json."),
    Rule("ppo_mini_batches", ("ppo", "training"),
         lambda a: a.ppo.num_mini_batches < 1 or _batch(a) % a.ppo.num_mini_batches,
         "--num_mini_batches {ppo.num_mini_batches} must divide --per_device_train_batch_size "
         "{training.per_device_train_batch_size} (the rollout batch) into equal mini-batches."),
    Rule("ppo_accumulation", ("ppo", "training"),
         lambda a: a.ppo.num_mini_batches >= 1 and (_batch(a) // a.ppo.num_mini_batches)
         % a.training.gradient_accumulation_steps and {"rows": _batch(a) // a.ppo.num_mini_batches},
         "--gradient_accumulation_steps {training.gradient_accumulation_steps} must divide the mini-batch of {rows} "
         "rows (--per_device_train_batch_size / --num_mini_batches)."),
    Rule("ppo_samples_per_prompt", ("ppo", "training"),
         lambda a: a.ppo.samples_per_prompt < 1 or _batch(a) % a.ppo.samples_per_prompt,
         "--samples_per_prompt {ppo.samples_per_prompt} must divide --per_device_train_batch_size "
         "{training.per_device_train_batch_size}: each process holds whole groups of replies to one prompt."),
    Rule("ppo_group_baseline", ("ppo",), lambda a: a.ppo.advantage != "gae" and a.ppo.samples_per_prompt < 2,
         "--advantage {ppo.advantage} compares each reply with the other replies to its prompt: set "
         "--samples_per_prompt to 2 or more (got {ppo.samples_per_prompt}; a group of one has no baseline)."),
    Rule("ppo_value_flags_without_value_model", ("ppo",), lambda a: _value_only_flags_set(a.ppo),
         "--{flag} {value} belongs to the value model of --advantage gae; --advantage {ppo.advantage} has none: "
         "drop the flag, or use --advantage gae."),
    Rule("ppo_kl_in_loss_k1", ("ppo",), lambda a: a.ppo.kl_in_loss and a.ppo.kl_estimator == "k1",
         "--kl_estimator k1 with --kl_in_loss: the gradient of k1 (log p - log p_ref) is zero on average over the "
         "policy's samples, so the loss term would hold nothing back; use k3 (the default with --kl_in_loss) or "
         "mse."),
    Rule("ppo_temperature", ("ppo",), lambda a: a.ppo.temperature <= 0,
         "--temperature must be positive (got {ppo.temperature}); PPO needs a sampling policy."),
    Rule("ppo_lengths", ("ppo",), lambda a: a.ppo.max_new_tokens < 1 or a.ppo.ppo_epochs < 1,
         "--max_new_tokens ({ppo.max_new_tokens}) and --ppo_epochs ({ppo.ppo_epochs}) must be at least 1."),
    Rule("ppo_luspo_level", ("ppo",),
         lambda a: a.ppo.loss_type == "luspo" and a.ppo.importance_sampling_level != "sequence",
         "--loss_type luspo is LUSPO: GSPO's one ratio per reply, each reply's loss times its length; add "
         "--importance_sampling_level sequence."),
    Rule("ppo_vespo_level", ("ppo",),
         lambda a: a.ppo.loss_type == "vespo" and a.ppo.importance_sampling_level != "token",
         "--loss_type vespo builds its one weight per reply from the token ratios itself: leave "
         "--importance_sampling_level at token."),
    Rule("ppo_epsilon_high", ("ppo",), lambda a: a.ppo.epsilon_high is not None and a.ppo.epsilon_high < 0,
         "--epsilon_high must be >= 0 (got {ppo.epsilon_high}): the ratio's ceiling is 1 + epsilon_high."),
    Rule("ppo_delta_loss", ("ppo",),
         lambda a: a.ppo.delta is not None and a.ppo.loss_type not in ("dapo", "bnpo", "grpo", "dr_grpo", "luspo"),
         "--delta caps the unclipped ratio of PPO's clipped surrogate; --loss_type {ppo.loss_type} has none: drop "
         "--delta, or use dapo, bnpo, grpo, dr_grpo or luspo."),
    Rule("ppo_delta", ("ppo",),
         lambda a: a.ppo.delta is not None and a.ppo.delta <= 1 + (a.ppo.cliprange if a.ppo.epsilon_high is None
                                                                    else a.ppo.epsilon_high),
         "--delta {ppo.delta} must exceed the clip's ceiling 1 + --epsilon_high (or --cliprange), or it would cut "
         "ratios the clip lets through; INTELLECT-2 uses 4."),
    Rule("ppo_scale_rewards", ("ppo",), lambda a: a.ppo.scale_rewards != "group" and a.ppo.advantage != "grpo",
         "--scale_rewards {ppo.scale_rewards} scales --advantage grpo's group advantages; --advantage "
         "{ppo.advantage} has its own baseline: drop the flag, or use --advantage grpo."),
    Rule("ppo_multi_objective", ("ppo",),
         lambda a: a.ppo.multi_objective_aggregation == "normalize_then_sum"
         and (a.ppo.advantage != "grpo" or len(a.ppo.reward_funcs) + bool(a.ppo.reward_model) < 2),
         "--multi_objective_aggregation normalize_then_sum (GDPO) standardises each reward source within its "
         "group: it needs --advantage grpo and two or more sources (--reward_funcs and --reward_model; got "
         "--advantage {ppo.advantage} with {ppo.reward_funcs})."),
    Rule("ppo_dynamic_sampling", ("ppo",), lambda a: a.ppo.dynamic_sampling and a.ppo.advantage == "gae",
         "--dynamic_sampling drops groups whose rewards are all equal, which only a group baseline makes useless: "
         "use --advantage grpo or rloo."),
    Rule("ppo_dynamic_sampling_rounds", ("ppo",), lambda a: a.ppo.dynamic_sampling_rounds < 1,
         "--dynamic_sampling_rounds must be at least 1 (got {ppo.dynamic_sampling_rounds})."),
    Rule("ppo_entropy_quantile", ("ppo",), lambda a: not 0 <= a.ppo.top_entropy_quantile <= 1,
         "--top_entropy_quantile must be between 0 and 1 (got {ppo.top_entropy_quantile}; 0.2 trains the 20% most "
         "uncertain tokens, 1.0 all)."),
    Rule("ppo_overlong", ("ppo",), lambda a: not 0 <= a.ppo.overlong_buffer <= a.ppo.max_new_tokens,
         "--overlong_buffer {ppo.overlong_buffer} must be between 0 (off) and --max_new_tokens "
         "({ppo.max_new_tokens}): the penalty ramps over the last that many tokens."),
    Rule("ppo_sapo_temperatures", ("ppo",),
         lambda a: min(a.ppo.sapo_temperature_pos, a.ppo.sapo_temperature_neg) <= 0,
         "--sapo_temperature_pos and --sapo_temperature_neg must be positive (got {ppo.sapo_temperature_pos}, "
         "{ppo.sapo_temperature_neg})."),
    # -- generation and chat
    Rule("generation_temperature", ("generation",),
         lambda a: a.generation.do_sample and a.generation.temperature <= 0,
         "--temperature must be above 0 when sampling (got {generation.temperature}); for deterministic replies "
         "pass --do_sample false instead."),
    Rule("generation_top_p", ("generation",), lambda a: not 0 < a.generation.top_p <= 1,
         "--top_p must be in (0, 1] (got {generation.top_p})."),
    Rule("generation_length", ("generation",), lambda a: a.generation.max_new_tokens < 1,
         "--max_new_tokens must be at least 1 (got {generation.max_new_tokens})."),
    Rule("generation_min_p", ("generation",), lambda a: not 0 <= a.generation.min_p < 1,
         "--min_p must be in [0, 1) (got {generation.min_p}); 0 turns it off."),
    Rule("generation_beams", ("generation",), lambda a: a.generation.num_beams < 1,
         "--num_beams must be at least 1 (got {generation.num_beams}); 1 is no beam search."),
    # -- ui
    Rule("ui_port", ("ui",), lambda a: not 1 <= a.ui.port <= 65535, "--port must be in 1..65535 (got {ui.port})."),
    Rule("ui_auth_form", ("ui",), lambda a: a.ui.auth is not None and not re.fullmatch(r"[^:]+:.+", a.ui.auth),
         "--auth must be user:password, both non-empty (got one without a user or a password)."),
    Rule("ui_auth_needed", ("ui",), lambda a: a.ui.host not in LOOPBACK_HOSTS and not a.ui.auth,
         "--host {ui.host} shows the page, and the commands it runs, to every machine that can reach this one: "
         "give --auth user:password too, or keep the default --host 127.0.0.1."),
    Rule("ui_root", ("ui",), lambda a: _problem("is a file, not a directory" if os.path.isfile(a.ui.root) else None),
         "--root {ui.root} {problem}: give the folder of runs (it is created when missing).", PathError),
    # -- serve
    Rule("serve_image_root", ("serve",), lambda a: _missing_dir(a.serve.image_root),
         "--image_root {path}: {problem}; give the folder whose pictures requests may name.", PathError),
    Rule("serve_port", ("serve",), lambda a: not 0 <= a.serve.port <= 65535,
         "--port must be in 0..65535 (got {serve.port}); 0 takes any free port."),
    Rule("serve_batch", ("serve",), lambda a: a.serve.max_batch_size < 1 or a.serve.batch_wait_ms < 0,
         "--max_batch_size must be at least 1 and --batch_wait_ms at least 0 (got {serve.max_batch_size} and "
         "{serve.batch_wait_ms})."),
    Rule("serve_adapter_spec", ("serve",),
         lambda a: _problem(next((f"{spec!r} is not NAME=PATH" for spec in a.serve.adapter
                                  if not re.fullmatch(r"[^=\s]+=.+", spec)), None)
                            or (len({s.split("=", 1)[0] for s in a.serve.adapter}) < len(a.serve.adapter)
                                and "two adapters share a NAME") or None),
         "--adapter: {problem}; give each adapter as NAME=PATH, each NAME once."),
    Rule("serve_adapter_path", ("serve",),
         lambda a: _problem(next((path for path in (s.split("=", 1)[1] for s in a.serve.adapter if "=" in s)
                                  if not is_adapter_dir(path)), None)),
         "--adapter: {problem}: not a LoRA adapter folder (no adapter_config.json); give NAME=PATH with PATH an "
         "adapter folder that training wrote.", PathError),
    Rule("serve_prompt_adapter_alone", ("serve", "model"),
         lambda a: a.serve.adapter and (_prompt_adapter(a.model) or next(
             ({"path": p, "kind": prompt_adapter_kind(p)} for p in (s.split("=", 1)[1] for s in a.serve.adapter
                                                                    if "=" in s) if prompt_adapter_kind(p)), None)),
         "--adapter: {path} is a {kind} adapter, which PEFT does not load beside other adapters: serve it alone "
         "(--model_name_or_path {path}), or serve LoRA adapters side by side."),
    Rule("prompt_adapter_beams", ("model", "generation"),
         lambda a: a.generation.num_beams > 1 and _prompt_adapter(a.model),
         "--num_beams with the {kind} adapter {path}: beam search runs PEFT's generate(), which in this version "
         "does not continue a prompt-based adapter's replies as its own forward does; use --num_beams 1."),
    Rule("serve_no_beams", ("serve", "generation"), lambda a: a.generation.num_beams != 1,
         "--num_beams cannot be used with serve: the server streams replies token by token (beam search picks "
         "a reply only at its end); leave it out."),
    Rule("serve_request_limit", ("serve",), lambda a: a.serve.max_request_bytes < 1024,
         "--max_request_bytes must be at least 1024 (got {serve.max_request_bytes})."),
    Rule("serve_key_needed", ("serve",),
         lambda a: a.serve.host not in LOOPBACK_HOSTS and not a.serve.key() and not a.serve.allow_no_api_key,
         "--host {serve.host} serves the model to every machine that can reach this one: give --api_key KEY too (or "
         "set TUNESMITH_API_KEY), or keep the default --host 127.0.0.1 (--allow_no_api_key: serve it open anyway)."),
    Rule("serve_context", ("serve",), lambda a: a.serve.context_length is not None and a.serve.context_length < 8,
         "--context_length must be at least 8 tokens (got {serve.context_length}); leave it out to use the model's."),
    # -- merge
    Rule("merge_adapter_given", ("merge", "model"), lambda a: not a.model.adapter_name_or_path,
         "--adapter_name_or_path is required: the LoRA adapter directory to merge (an SFT or reward-model output)."),
    Rule("compare_adapter_given", ("compare", "model"),
         lambda a: not a.model.adapter_name_or_path and not a.compare.baseline,
         "--adapter_name_or_path is required: the fine-tuned LoRA adapter to compare with its base (or give "
         "--baseline, the model or adapter to compare the --model_name_or_path one with)."),
    Rule("compare_baseline", ("compare",),
         lambda a: a.compare.baseline and _problem(problem_with_model_dir(a.compare.baseline)),
         "--baseline {compare.baseline}: {problem}; give a model folder or an adapter folder.", PathError),
    Rule("compare_beams", ("compare",), lambda a: a.compare.num_beams < 1,
         "--num_beams must be at least 1 (got {compare.num_beams}); 1 is greedy decoding."),
    Rule("compare_prompt_adapter_beams", ("compare", "model"),
         lambda a: a.compare.num_beams > 1 and (_prompt_adapter(a.model) or _prompt_adapter(
             SimpleNamespace(adapter_name_or_path=a.compare.baseline, model_name_or_path=None))),
         "--num_beams with the {kind} adapter {path}: beam search runs PEFT's generate(), which in this version "
         "does not continue a prompt-based adapter's replies as its own forward does; use --num_beams 1."),
    Rule("merge_prompt_learning", ("merge", "model"), lambda a: _prompt_adapter(a.model),
         "merge: " + _NOTHING_TO_MERGE),
    Rule("merge_output_given", ("merge",), lambda a: not a.merge.output_dir,
         "--output_dir is required: where the merged model goes."),
    Rule("merge_output_dir", ("merge",), lambda a: a.merge.output_dir and _problem(problem_with_output_dir(a.merge.output_dir)),
         "--output_dir {merge.output_dir}: {problem}; choose another directory.", PathError),
    Rule("merge_unquantized", ("merge", "model"), lambda a: a.model.quantization_bit is not None,
         "--quantization_bit cannot be used with merge: the base is always loaded unquantized (merging into "
         "quantized weights would round away what the adapter learned); drop the flag."),
    Rule("merge_output_free", ("merge",),
         lambda a: not a.merge.overwrite_output_dir and a.merge.output_dir and os.path.isdir(a.merge.output_dir)
         and os.listdir(a.merge.output_dir),
         "--output_dir {merge.output_dir} exists and is not empty: choose another, or pass --overwrite_output_dir."),
    # -- GGUF export
    Rule("export_output_given", ("export",), lambda a: not a.export.output_file,
         "--output_file is required: the .gguf file to write (e.g. outputs/sft_demo.gguf)."),
    Rule("export_output_suffix", ("export",), lambda a: not a.export.output_file.endswith(".gguf"),
         "--output_file {export.output_file}: name it *.gguf (its Modelfile is named after it)."),
    Rule("export_output_path", ("export",),
         lambda a: _problem(problem_with_output_dir(os.path.dirname(os.path.abspath(a.export.output_file)))),
         "--output_file {export.output_file}: {problem}; choose another place.", PathError),
    Rule("export_output_free", ("export", "model"),
         lambda a: not a.export.overwrite_output_file
         and next(({"path": p} for p in (a.export.output_file, a.export.modelfile,
                                          *([a.export.mmproj_file] if _vision(a.model) else [])) if _exists(p)), None),
         "{path} exists: choose another --output_file, or pass --overwrite_output_file.", PathError),
    Rule("export_unquantized", ("export", "model"), lambda a: a.model.quantization_bit is not None,
         "--quantization_bit cannot be used with export: the model loads in float32 and --dtype chooses how the "
         "GGUF stores it; drop the flag."),
    Rule("export_prompt_learning", ("export", "model"), lambda a: _prompt_adapter(a.model),
         "export: " + _NOTHING_TO_MERGE.replace("to merge.", "to merge and export (llama.cpp has no virtual "
                                                "tokens).")),
    Rule("export_causal_lm", ("export", "model"),
         lambda a: is_adapter_dir(a.model.adapter_name_or_path)
         and adapter_config(a.model.adapter_name_or_path).get("task_type") == "SEQ_CLS",
         "{model.adapter_name_or_path} is a reward-model adapter (task_type SEQ_CLS): export_gguf writes chat "
         "models (causal LMs) only."),
    Rule("export_vision", ("export", "model"),
         lambda a: (v := _vision(a.model)) and v["model_type"] not in GGUF_VISION_TYPES and v,
         "GGUF export of a vision-language model writes " + ", ".join(GGUF_VISION_TYPES) + " (the text model and "
         "llama.cpp's mmproj file); this one is {model_type}: serve its folder with tunesmith serve, transformers or "
         "vLLM."),
    Rule("export_vision_whole", ("export", "model"),
         lambda a: _vision(a.model) and (a.export.adapter_only or a.model.dtype in GGUF_K_QUANTS),
         "--adapter_only and the k-quants (--dtype q4_k_m, q5_k_m, q6_k) are not built for vision-language models: "
         "export the whole model with --dtype f32, f16, bf16 or q8_0."),
    Rule("export_architecture", ("export", "model"), lambda a: _not_exportable(a.model),
         "export_gguf supports " + ", ".join(GGUF_ARCHITECTURES) + "; this model is {arch} "
         "({model.model_name_or_path}/config.json)."),
    Rule("export_adapter_only_needs_adapter", ("export", "model"),
         lambda a: a.export.adapter_only and not a.model.adapter_name_or_path,
         "--adapter_only writes a LoRA adapter, and no adapter was given: pass an adapter folder as "
         "--model_name_or_path (or --adapter_name_or_path), or leave out --adapter_only."),
    Rule("export_adapter_only_dtype", ("export", "model"),
         lambda a: a.export.adapter_only and a.model.dtype not in ("f32", "f16"),
         "--adapter_only writes the adapter's matrices in f32 or f16 (got --dtype {model.dtype}): llama.cpp applies "
         "them over a base of any type."),
    Rule("export_k_quant", ("export", "model"),
         lambda a: a.model.dtype in GGUF_K_QUANTS and importlib.util.find_spec("llama_cpp") is None,
         "--dtype {model.dtype} is made by llama.cpp's quantizer, and llama-cpp-python is not installed: run "
         "`bash scripts/setup.sh --with-llama-cpp`, or choose f32, f16, bf16 or q8_0."),
    Rule("export_llama_cpp_check", ("export",),
         lambda a: a.export.require_llama_cpp_check and not _has_llama_cpp(),
         "--require_llama_cpp_check: llama-cpp-python is not installed, so the GGUF cannot be checked in llama.cpp: "
         "run `bash scripts/setup.sh --with-llama-cpp`, or leave out the flag."),
    Rule("export_llama_cpp_mtmd_check", ("export", "model"),
         lambda a: a.export.require_llama_cpp_check and _vision(a.model) and not _has_mtmd(),
         "--require_llama_cpp_check: llama-cpp-python was built without its multimodal library (mtmd), so the mmproj "
         "file cannot be checked in llama.cpp: run `bash scripts/setup_llama_cpp.sh` (it builds with mtmd), or leave "
         "out the flag."),
    Rule("export_tolerance", ("export",),
         lambda a: a.export.max_relative_logit_diff is not None and not a.export.max_relative_logit_diff >= 0,
         "--max_relative_logit_diff must be >= 0 (got {export.max_relative_logit_diff}); leave it out for the "
         "default of the --dtype."),
    # distill: the rows of `tunesmith distill` (tunesmith/distill/), about its teacher and its loss
    Rule("distill_teacher_given", ("distill",), lambda a: not a.distill.teacher_model_name_or_path,
         "--teacher_model_name_or_path is required: the model to distill from, a model folder or an adapter folder "
         "(e.g. outputs/sft_demo after the quickstart) that shares the student's tokenizer."),
    Rule("distill_teacher_path", ("distill",),
         lambda a: _problem(problem_with_model_dir(a.distill.teacher_model_name_or_path)),
         "--teacher_model_name_or_path {distill.teacher_model_name_or_path}: {problem}; give a local model folder "
         "or an adapter folder.", PathError),
    Rule("distill_teacher_adapter_path", ("distill",), lambda a: _missing_dir(a.distill.teacher_adapter_name_or_path),
         "--teacher_adapter_name_or_path {path}: {problem} (an adapter folder on the teacher's model).", PathError),
    Rule("distill_vocabulary", ("model", "distill"), lambda a: _teacher_vocabulary_differs(a.model, a.distill),
         "the teacher {teacher} and the student {student} do not share a vocabulary ({difference}): distillation "
         "compares their next-token distributions token by token; pick a teacher of the student's tokenizer (its "
         "model family and tokenizer version)."),
    Rule("distill_teacher_quantization", ("distill",), lambda a: a.distill.teacher_quantization_bit not in (None, 4, 8),
         "--teacher_quantization_bit must be 4 or 8 (got {distill.teacher_quantization_bit}); leave it out for the "
         "teacher's --teacher_dtype."),
    Rule("distill_beta", ("distill",), lambda a: not 0.0 <= a.distill.beta <= 1.0,
         "--beta must be in [0, 1] (got {distill.beta}): the teacher's weight in GKD's mixture (0: forward KL, 1: "
         "reverse KL)."),
    Rule("distill_beta_unread", ("distill",), lambda a: a.distill.distill_loss != "jsd" and a.distill.beta != 0.5,
         "--beta {distill.beta} is read by --distill_loss jsd only (got --distill_loss {distill.distill_loss}, whose "
         "divergence has no beta): pass --distill_loss jsd, or leave --beta out."),
    Rule("distill_temperature", ("distill",), lambda a: not 0.0 < a.distill.distill_temperature < float("inf"),
         "--distill_temperature must be > 0 (got {distill.distill_temperature}); 1 compares the distributions as "
         "they are, 2 softens both."),
    Rule("distill_sft_weight", ("distill",), lambda a: not 0.0 <= a.distill.sft_weight < float("inf"),
         "--sft_weight must be >= 0 (got {distill.sft_weight}): the weight of the SFT loss added to the divergence "
         "(0: distillation alone)."),
    Rule("distill_lmbda", ("distill",), lambda a: not 0.0 <= a.distill.lmbda <= 1.0,
         "--lmbda must be in [0, 1] (got {distill.lmbda}): the chance that a step trains on the student's own "
         "replies (0: the data's replies only, 1: always the student's)."),
    Rule("distill_on_policy_tokens", ("distill",), lambda a: a.distill.lmbda > 0 and a.distill.on_policy_max_new_tokens < 1,
         "--on_policy_max_new_tokens must be at least 1 (got {distill.on_policy_max_new_tokens}) with --lmbda "
         "{distill.lmbda}: the longest reply the student samples."),
    Rule("distill_prompt_learning", ("distill", "finetuning"), _prompt_method,
         "--finetuning_type {kind} cannot be distilled into: the student's logits would include the virtual tokens "
         "the teacher never sees; use --finetuning_type lora or full."),
    Rule("distill_vision", ("distill", "model"),
         lambda a: _first([p for p in (a.model.model_name_or_path, a.distill.teacher_model_name_or_path) if p],
                          _vision_folder),
         "tunesmith distill trains text models only ({path} is a vision-language model, of type {problem}); "
         "give a text model as the student and the teacher."),
    Rule("distill_zero3", ("distill", "training"), lambda a: zero_stage(a.training) == 3,
         "--deepspeed {training.deepspeed} is ZeRO-3, which would shard the teacher too, and its forward runs outside "
         "DeepSpeed's engine: use ZeRO-2 (configs/ds_zero2.json), which keeps a whole teacher on every rank."),
    Rule("distill_fsdp", ("distill", "training"), lambda a: fsdp_requested(a.training),
         "tunesmith distill does not run under FSDP (the teacher would stay whole beside a sharded student); use "
         "DeepSpeed ZeRO-2 (--deepspeed configs/ds_zero2.json)."),
    Rule("distill_label_smoothing", ("distill", "training"), lambda a: a.training.label_smoothing_factor != 0,
         "--label_smoothing_factor {training.label_smoothing_factor} would do nothing in tunesmith distill, whose "
         "targets are the teacher's distributions (already soft); leave it out, or raise --distill_temperature."),
    Rule("distill_sequence_parallel", ("distill", "training"), lambda a: _sequence_parallel(a) > 1,
         "--sequence_parallel_size {training.sequence_parallel_size}: tunesmith distill does not cut rows across "
         "ranks (the teacher would need the same cut); leave it at 1."),
    # -- score and evaluation
    Rule("score_output_given", ("score",), lambda a: not a.score.output_file,
         "--output_file is required: where to write one line of scores per input row."),
    Rule("eval_models_given", ("evaluation",),
         lambda a: not (a.evaluation.policy and (a.evaluation.baseline or is_adapter_dir(a.evaluation.policy))
                        and (a.evaluation.reward_model or a.evaluation.reward_funcs)),
         "--policy, --baseline and --reward_model (or --reward_funcs) are required: e.g. the PPO, GRPO or DPO policy, "
         "the SFT policy (left out, an adapter's base) and the reward model (output directories of ppo/ or "
         "dpo/train.py, sft/train.py and reward/train.py)."),
    Rule("eval_reward_weights", ("evaluation",),
         lambda a: a.evaluation.reward_weights and len(a.evaluation.reward_weights) != len(a.evaluation.reward_funcs)
         and {"weights": len(a.evaluation.reward_weights), "funcs": len(a.evaluation.reward_funcs)},
         "--reward_weights has {weights} values for {funcs} --reward_funcs: give one weight per function, in order."),
    Rule("harness_tasks_given", ("harness",), lambda a: not (a.harness.tasks or "").strip(", "),
         "--tasks is required: lm-eval task or group names, comma-separated, e.g. --tasks tunesmith_knowledge "
         "(shipped offline: tunesmith_identity, tunesmith_arithmetic, tunesmith_tool_calls, tunesmith_knowledge)."),
    Rule("harness_prompt_adapter", ("harness", "model"),
         lambda a: _prompt_adapter(a.model) or _prompt_adapter(
             SimpleNamespace(adapter_name_or_path=a.harness.compare_to, model_name_or_path=None)),
         "--tasks: {path} is a {kind} adapter, and lm-eval scores and generates through the model's own forward "
         "and PEFT's generate(), which do not line up with its virtual tokens; compare it with tunesmith compare "
         "or tunesmith eval --policy instead."),
    Rule("harness_compare_base", ("harness", "model"),
         lambda a: a.harness.compare_to == "base" and not a.model.adapter_name_or_path,
         "--compare_to base compares an adapter with the model under it: give --adapter_name_or_path (or compare "
         "two models with --compare_to PATH)."),
    Rule("harness_compare_path", ("harness",),
         lambda a: a.harness.compare_to not in (None, "base") and _problem(problem_with_model_dir(a.harness.compare_to)),
         "--compare_to {harness.compare_to}: {problem}; give `base`, a model folder or an adapter folder.", PathError),
    Rule("harness_include_path", ("harness",), lambda a: _missing_dir(a.harness.include_path),
         "--include_path {path}: {problem} (a folder of lm-eval task YAML files).", PathError),
    Rule("harness_limit", ("harness",), lambda a: a.harness.limit is not None and not a.harness.limit > 0,
         "--limit must be > 0 (got {harness.limit}): a number of documents per task, or a share below 1."),
    Rule("harness_batch_size", ("harness",),
         lambda a: not (a.harness.batch_size.isdigit() and int(a.harness.batch_size) > 0
                        or re.fullmatch(r"auto(:\d+)?", a.harness.batch_size)),
         "--batch_size must be a positive number or auto (got {harness.batch_size})."),
    Rule("harness_multiturn", ("harness",),
         lambda a: a.harness.fewshot_as_multiturn and not a.harness.apply_chat_template,
         "--fewshot_as_multiturn needs --apply_chat_template (few-shot turns are chat turns)."),
    Rule("eval_model_paths", ("evaluation",),
         lambda a: _first([p for p in (a.evaluation.baseline, a.evaluation.policy, a.evaluation.reward_model) if p],
                          _missing_dir_problem),
         "{path}: {problem} (--baseline, --policy and --reward_model take output directories).", PathError),
]


# Settings only the value model of --advantage gae reads; under grpo/rloo a value other than the default was
# set on purpose and would silently do nothing.
_VALUE_ONLY_FLAGS = ("vf_coef", "cliprange_value", "gamma", "lam", "whiten_rewards")


def _value_only_flags_set(ppo: Any) -> dict | None:
    if ppo.uses_value_model:
        return None
    defaults = {f.name: f.default for f in dataclasses.fields(ppo)}
    for name in _VALUE_ONLY_FLAGS:
        if getattr(ppo, name) != defaults[name]:
            return {"flag": name, "value": getattr(ppo, name)}
    return None


def _teacher_vocabulary_differs(model: Any, distill: Any) -> dict | None:
    """{"teacher", "student", "difference"} when both models are local folders whose vocabularies differ."""
    student, teacher = model.model_name_or_path, distill.teacher_model_name_or_path
    if not (student and teacher and os.path.isdir(student) and os.path.isdir(teacher)):
        return None  # the default student is checked once its folder is known (distill/command.py)
    difference = vocabulary_difference((student, model.adapter_name_or_path),
                                       (teacher, distill.teacher_adapter_name_or_path))
    return {"teacher": teacher, "student": student, "difference": difference} if difference else None


def _missing_dir_problem(path: str) -> str | None:
    found = _missing_dir(path)
    return found["problem"] if found else None


def check(check_paths: bool = True, **roles: Any) -> None:
    """Raise the error of the first broken rule among those whose roles are all given. check_paths=False
    leaves out the rows about files and folders (for settings read on another machine than the run's)."""
    namespace = SimpleNamespace(**roles)
    for rule in RULES:
        if not all(roles.get(role) is not None for role in rule.roles):
            continue
        if not check_paths and rule.error is PathError:
            continue
        found = rule.broken(namespace)
        if found:
            values = found if isinstance(found, dict) else {}
            raise rule.error(rule.message.format(**roles, **values))
