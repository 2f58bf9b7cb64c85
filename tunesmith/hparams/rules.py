"""One table of settings that cannot work, checked right after parsing, before any weight loads:
each row names the flag, the value received and what to change, instead of a failure later inside a
library. These are the core's rows, about the roles several commands share (model, data, finetuning, training,
generation); each command's own roles and rows are its feature package's (its rules.py, e.g. tunesmith/rl/rules.py
for ppo, tunesmith/preference/rules.py for dpo, reward and score; hparams/run_kinds.FEATURE_RUNS names the package
of each command). `check(**roles)` runs this table, then the command's feature's rows.

The rules kit is three modules: the engine (rule_engine.py: `Rule`, one row, and `check_rows`), this table, and the
helpers the tables share (rule_helpers.py, public names, which the features' tables import). A row declares what it
reads (Rule: its roles, and the fields only some commands' dataclasses have, e.g. "data.packing", which
DataArguments lacks and SFTDataArguments has), so `check` applies it to exactly the runs that have those, and its
test needs no guard: a row that reads what it did not declare raises, never skips. A row whose test is more than one
expression is a named function above the table, so a traceback names it."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from ..constants import MUON
from ..distributed import fsdp_requested, fsdp_setting, zero_stage
from ..errors import PathError
from ..families import family, types_where
from ..utils.hardware import flash_attention_usable, liger_kernel_usable, trains_on_cpu
from ..utils.hub_data import is_hub_dataset, problem_with_data_source
from ..utils.paths import (
    adapter_config,
    is_adapter_dir,
    is_torchao_quantized,
    looks_local,
    model_config,
    problem_with_model_dir,
    problem_with_output_dir,
    prompt_adapter_kind,
    run_config_record,
)
from .data_args import SPLIT_STAGES, numbers
from .finetuning_args import is_known_init, splits_base
from .rollout_args import colocation_problem
from .rule_engine import Rule, check_rows
from .rule_helpers import (
    STREAMING_IS_SFTS,
    bound_rule,
    first_problem,
    missing_dir,
    problem_values,
    prompt_adapter,
    prompt_method,
    sequence_parallel_size,
    vision_model,
)
from .value_bounds import BOUNDS


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


def _colocation_refused(a: Any) -> dict | None:
    """Colocated vLLM where this Python cannot hold it (hparams/rollout_args.colocation_problem)."""
    problem = a.rollout.colocated and colocation_problem()
    return {"problem": problem} if problem else None


def _colocate_flags_with_server(a: Any) -> dict | None:
    """The colocated vLLM's memory flags set beside --vllm_url (a server's memory is its own)."""
    r = a.rollout
    if r.vllm_url is None:
        return None
    flags = [name for name, given, default in (
        ("--vllm_gpu_memory_utilization", r.vllm_gpu_memory_utilization, 0.3),
        ("--vllm_kv_cache_gib", r.vllm_kv_cache_gib, 1), ("--vllm_enable_sleep_mode", r.vllm_enable_sleep_mode, False),
        ("--vllm_max_model_len", r.vllm_max_model_len, None)) if given != default]
    return {"flags": ", ".join(flags)} if flags else None


def _adapter_kind_differs(a: SimpleNamespace) -> dict | None:
    """{"path", "kind", "wanted"} when the adapter a training run continues is not of --finetuning_type's kind."""
    path = a.model.adapter_name_or_path
    if not is_adapter_dir(path) or a.finetuning.finetuning_type == "full":
        return None
    kind = prompt_adapter_kind(path) or "lora"
    return {"path": path, "kind": kind} if kind != a.finetuning.finetuning_type else None


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


def _world_size() -> int:
    """The launch's process count (torchrun and accelerate export WORLD_SIZE); 1 without a launcher."""
    return int(os.environ.get("WORLD_SIZE", "1"))


NO_HUB_DATASET = ("--data_revision {data.data_revision} is the revision of a Hugging Face Hub dataset, and --data_path "
                  "names none (org/name, org/name:split): drop the flag, or name the dataset.")


def _torchao_dtype_differs(model: Any) -> dict | None:
    """{"path", "made"} when --dtype asks a torchao-quantized model (a --qat run's quantized/) for another dtype than
    the one its tensors were made in, which they compute in (models/loader.py loads it so)."""
    path = model.model_name_or_path
    if model.dtype == "auto" or not is_torchao_quantized(path):
        return None
    made = model_config(path).get("dtype") or "float32"
    return {"path": path, "made": made} if model.dtype != made else None


def _qat_sharded(training: Any) -> str | None:
    """The sharding a --qat run cannot convert at its end (the whole model in one process), or None."""
    return "ZeRO-3" if zero_stage(training) == 3 else "FSDP" if fsdp_requested(training) else None


def _fsdp_state_dict_not_full(a: SimpleNamespace) -> dict | None:
    """{"kind"}: the state dict type of an FSDP2 run when it is not FULL_STATE_DICT."""
    if not fsdp_requested(a.training) or fsdp_setting(a.training, "version", "1") != "2":
        return None
    kind = fsdp_setting(a.training, "state_dict_type", "SHARDED_STATE_DICT")
    return {"kind": kind} if kind.upper() != "FULL_STATE_DICT" else None


def _vision_packing_inexact(a: SimpleNamespace) -> dict | None:
    """{"model_type"}: --packing on a vision-language model whose family does not pack exactly."""
    if not a.data.packing:
        return None
    vision = vision_model(a.model)
    return vision if vision and not family(vision["model_type"]).packable else None


def _data_selection_flag(a: SimpleNamespace) -> dict | None:
    """{"flag"}: --data_split, or else --data_weights, when given (to a command that reads its data whole)."""
    if a.data.data_split:
        return {"flag": "data_split"}
    return {"flag": "data_weights"} if a.data.data_weights else None


def _shares_unusable(values: list[str]) -> bool:
    """Whether shares (--data_weights, --data_split) hold something not a number, a negative one, or only zeros."""
    shares = numbers(values)
    return shares is None or min(shares) < 0 or not sum(shares)


def _data_weights_unusable(a: SimpleNamespace) -> dict | None:
    """{"value"}: --data_weights as given, when they are not usable shares."""
    weights = a.data.data_weights
    return {"value": ",".join(weights)} if weights and _shares_unusable(weights) else None


def _data_split_unusable(a: SimpleNamespace) -> dict | None:
    """{"value"}: --data_split as given, when it is not one usable share per stage."""
    split = a.data.data_split
    if not split or (len(split) == len(SPLIT_STAGES) and not _shares_unusable(split)):
        return None
    return {"value": ",".join(split)}


def _whole_embedding_module(a: SimpleNamespace) -> dict | None:
    """{"module"}: embed_tokens or lm_head trained whole (--lora_modules_to_save) beside --lora_trainable_tokens."""
    if not a.finetuning.lora_trainable_tokens:
        return None
    module = next((m for m in a.finetuning.lora_modules_to_save if m in ("embed_tokens", "lm_head")), None)
    return {"module": module} if module else None


RULES: list[Rule] = [
    # -- paths, checked before anything loads
    Rule("data_path_given", ("data",), lambda a: not a.data.data_path,
         "--data_path is required: one or more data files or folders (JSONL, JSON, Parquet; raw .txt for tunesmith "
         "pt), e.g. data/demo/sft.jsonl."),
    Rule("data_files", ("data",), lambda a: first_problem(a.data.data_path, problem_with_data_source),
         "data file {path}: {problem}.", PathError),
    Rule("eval_data_files", ("data.eval_data_path",),
         lambda a: first_problem(a.data.eval_data_path, problem_with_data_source),
         "data file {path}: {problem}.", PathError),
    Rule("data_revision_without_hub_dataset", ("data.data_revision", "data.eval_data_path"),
         lambda a: a.data.data_revision and not any(map(is_hub_dataset, a.data.data_path + a.data.eval_data_path)),
         NO_HUB_DATASET),
    Rule("data_revision_without_hub_dataset_to_read", ("data.data_revision",), without=("data.eval_data_path",),
         broken=lambda a: a.data.data_revision and not any(map(is_hub_dataset, a.data.data_path)),
         message=NO_HUB_DATASET),
    Rule("model_path", ("model",),
         lambda a: a.model.model_name_or_path and looks_local(a.model.model_name_or_path)
         and first_problem([a.model.model_name_or_path], problem_with_model_dir),
         "--model_name_or_path {path}: {problem}. Give a local model directory (one with config.json), "
         "or leave it out for the embedded default model.", PathError),
    Rule("adapter_path", ("model",), lambda a: missing_dir(a.model.adapter_name_or_path),
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
    Rule("output_dir", ("training",), lambda a: problem_values(problem_with_output_dir(a.training.output_dir)),
         "--output_dir {training.output_dir}: {problem}; choose another directory.", PathError),
    # -- single values out of their range (value_bounds.py), before any row computes with them
    *map(bound_rule, BOUNDS),
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
         _fsdp_state_dict_not_full,
         "fsdp_state_dict_type {kind}: tunesmith's saves gather the whole model on the first process, so that "
         "outputs load with plain transformers/peft; set fsdp_state_dict_type: FULL_STATE_DICT (configs/fsdp2.yaml "
         "does)."),
    Rule("muon_deepspeed", ("training",), lambda a: str(a.training.optim) == MUON and a.training.deepspeed,
         "--optim muon cannot run under --deepspeed {training.deepspeed}: ZeRO hands the optimizer flat 1-D slices of "
         "the weights, and torch.optim.Muon orthogonalizes whole matrices; train under FSDP2 (--fsdp_config "
         "configs/fsdp2.yaml), on one process, or with another --optim."),
    Rule("fsdp_8bit", ("model", "training"), lambda a: a.model.quantization_bit == 8 and fsdp_requested(a.training),
         "FSDP cannot shard 8-bit bitsandbytes weights (fully_shard drops their quantization state): use "
         "--quantization_bit 4 (stored in the compute dtype, which FSDP shards), or --deepspeed configs/ds_zero2.json."),
    Rule("fp16_on_cpu", ("training",),
         lambda a: a.training.fp16 and trains_on_cpu(a.training),
         "--fp16 mixed precision needs a CUDA GPU: drop it, or use --bf16 true."),
    Rule("flash_attn_missing", ("model",),
         lambda a: a.model.attn_implementation == "flash_attention_2" and not flash_attention_usable(),
         "--attn_implementation flash_attention_2 needs a CUDA GPU and the flash-attn package "
         "(pip install 'tunesmith[gpu]'); use auto to pick sdpa otherwise."),
    Rule("liger_kernel_missing", ("training",),
         lambda a: a.training.use_liger_kernel and not liger_kernel_usable(),
         "--use_liger_kernel needs a CUDA GPU and the liger-kernel package (pip install liger-kernel; its kernels "
         "are Triton, GPU only): drop the flag on CPU."),
    # -- vision-language models (models/vision.py)
    Rule("vision_packing", ("model", "data.packing"),
         _vision_packing_inexact,
         "--packing with a vision-language model ({model_type}): packed exactly for "
         + ", ".join(types_where("packable")) + " only (Gemma 3's picture tokens attend to each other both ways, "
         "which a causal packed row does not compute; Qwen3-VL's positions are not checked); use --packing false."),
    Rule("vision_packing_forward_tokens", ("model", "data.packing", "data.max_forward_tokens"),
         lambda a: a.data.max_forward_tokens and a.data.packing and vision_model(a.model),
         "--max_forward_tokens {data.max_forward_tokens} with a vision-language model: a packed row runs in one "
         "forward (a split would cut its pictures' inputs); drop it, or lower --per_device_train_batch_size."),
    Rule("vision_prompt_learning", ("model", "finetuning"),
         lambda a: a.finetuning.prompt_learning and vision_model(a.model),
         "--finetuning_type {finetuning.finetuning_type} with a vision-language model ({model_type}): its virtual "
         "tokens would go in front of the image tokens its processor places; use --finetuning_type lora or full."),
    Rule("vision_flags_text_model", ("model", "finetuning"),
         lambda a: (a.finetuning.train_vision_tower or a.finetuning.train_projector) and not vision_model(a.model),
         "--train_vision_tower / --train_projector: {model.model_name_or_path} is not a vision-language model (no "
         "vision_config in its config.json, or no processor in its folder); leave them out."),
    # -- sequence parallelism (train/sequence_parallel.py)
    Rule("sequence_parallel_size_value", ("training.sequence_parallel_size",), lambda a: sequence_parallel_size(a) < 1,
         "--sequence_parallel_size must be at least 1 (got {training.sequence_parallel_size}); 1 is off."),
    Rule("sequence_parallel_deepspeed", ("training.sequence_parallel_size",),
         lambda a: sequence_parallel_size(a) > 1 and not a.training.deepspeed,
         "--sequence_parallel_size {training.sequence_parallel_size} runs on DeepSpeed's Ulysses: add --deepspeed "
         "configs/ds_zero2.json (or ds_zero3.json); FSDP does not cut sequences."),
    Rule("sequence_parallel_packing", ("data.packing", "training.sequence_parallel_size"),
         lambda a: sequence_parallel_size(a) > 1 and not a.data.packing,
         "--sequence_parallel_size {training.sequence_parallel_size} needs --packing true: the ranks cut one "
         "padding-free row, whose conversations keep their boundaries across the cut."),
    Rule("sequence_parallel_world", ("training.sequence_parallel_size",),
         lambda a: sequence_parallel_size(a) > 1 and _world_size() % sequence_parallel_size(a)
         and {"world": _world_size()},
         "--sequence_parallel_size {training.sequence_parallel_size}: this launch has {world} process(es), not a "
         "multiple of it; launch N x {training.sequence_parallel_size} (torchrun --nproc_per_node, --nnodes)."),
    Rule("sequence_parallel_vision", ("model", "training.sequence_parallel_size"),
         lambda a: sequence_parallel_size(a) > 1 and vision_model(a.model),
         "--sequence_parallel_size with a vision-language model ({model_type}): its pictures cannot be cut across "
         "ranks; train on one rank per row (leave the flag out)."),
    Rule("sequence_parallel_label_smoothing", ("training.sequence_parallel_size",),
         lambda a: sequence_parallel_size(a) > 1 and a.training.label_smoothing_factor,
         "--label_smoothing_factor {training.label_smoothing_factor} with --sequence_parallel_size: each rank "
         "computes its tokens' plain cross-entropy; drop one of them."),
    # -- data
    Rule("max_forward_tokens_needs_packing", ("data.max_forward_tokens",),
         lambda a: a.data.max_forward_tokens is not None and not a.data.packing,
         "--max_forward_tokens {data.max_forward_tokens} splits packed batches: add --packing true, or drop it "
         "(a padded batch runs in one forward; lower --per_device_train_batch_size to use less memory)."),
    Rule("max_forward_tokens_deepspeed", ("data.max_forward_tokens", "training"),
         lambda a: a.data.max_forward_tokens and a.training.deepspeed,
         "--max_forward_tokens {data.max_forward_tokens} cannot be used with --deepspeed: DeepSpeed takes an "
         "optimizer step at every backward, so a batch cannot run as several. Drop it, or lower "
         "--per_device_train_batch_size to use less memory."),
    Rule("max_forward_tokens", ("data.max_forward_tokens",), lambda a: (a.data.max_forward_tokens or 0) < 0,
         "--max_forward_tokens {data.max_forward_tokens}: give a number of tokens, or 0 for the whole batch at once."),
    Rule("val_size", ("data.val_size",), lambda a: not 0.0 <= a.data.val_size < 1.0,
         "--val_size must be in [0, 1) (got {data.val_size}): the share of --data_path held out for evaluation."),
    Rule("val_size_and_eval_data_path", ("data.val_size", "data.eval_data_path"),
         lambda a: a.data.val_size > 0 and a.data.eval_data_path,
         "--val_size {data.val_size} and --eval_data_path both give evaluation data: keep one (--val_size holds out "
         "a share of --data_path)."),
    Rule("eval_strategy_without_data", ("data.val_size", "data.eval_data_path", "training"),
         lambda a: not (a.data.eval_data_path or a.data.val_size > 0)
         and a.training.eval_strategy != "no" and {"strategy": a.training.eval_strategy.value},
         "--eval_strategy {strategy} has no evaluation data to evaluate: give --eval_data_path FILE or --val_size "
         "0.1 (a held-out share of --data_path), or drop --eval_strategy."),
    Rule("max_seq_length", ("data.max_seq_length",), lambda a: a.data.max_seq_length < 8,
         "--max_seq_length must be at least 8 tokens (got {data.max_seq_length})."),
    Rule("data_selection_in_training", ("data",),
         _data_selection_flag,
         "--{flag} chooses the rows a training stage (or inspect) uses; this command reads its --data_path whole: "
         "drop the flag.", without=("training", "inspect")),
    Rule("data_weights_numbers", ("data",),
         _data_weights_unusable,
         "--data_weights {value}: give a number >= 0 per --data_path file, not all 0 (e.g. --data_weights 0.7,0.3)."),
    Rule("data_weights_count", ("data",),
         lambda a: a.data.data_weights and len(a.data.data_weights) != len(a.data.data_path)
         and {"weights": len(a.data.data_weights), "paths": len(a.data.data_path)},
         "--data_weights has {weights} values for {paths} --data_path files: give one weight per file, in order."),
    Rule("data_split_numbers", ("data",),
         _data_split_unusable,
         "--data_split {value}: give three numbers >= 0, not all 0, the shares of SFT, reward/DPO and PPO (e.g. "
         "--data_split 2,4,4)."),
    Rule("data_split_stage_part", ("data",),
         lambda a: a.data.data_split and a.data.split_part and not numbers(a.data.data_split)[a.data.split_part - 1]
         and {"value": ",".join(a.data.data_split), "stage": SPLIT_STAGES[a.data.split_part - 1]},
         "--data_split {value} gives stage {stage} (part {data.split_part}) no rows: give its part a share above 0."),
    Rule("max_samples", ("data",), lambda a: a.data.max_samples is not None and a.data.max_samples < 1,
         "--max_samples must be at least 1 (got {data.max_samples}); leave it out to use every row."),
    # --streaming is SFT's: a run whose data is not SFT conversations (no --train_on: reward, dpo, pt), or that trains
    # nothing (inspect), refuses it
    Rule("streaming_stage", ("data.streaming",), lambda a: a.data.streaming, STREAMING_IS_SFTS,
         without=("data.train_on",)),
    Rule("streaming_without_training", ("data.streaming",), lambda a: a.data.streaming, STREAMING_IS_SFTS,
         without=("training",)),
    Rule("shuffle_buffer_without_streaming", ("data.shuffle_buffer",),
         lambda a: a.data.shuffle_buffer is not None and not a.data.streaming,
         "--shuffle_buffer {data.shuffle_buffer} shuffles a --streaming run's examples; without --streaming every "
         "example is shuffled: add --streaming true, or drop --shuffle_buffer."),
    Rule("shuffle_buffer", ("data.shuffle_buffer",), lambda a: (a.data.shuffle_buffer or 0) < 0,
         "--shuffle_buffer must be 0 (file order) or more examples (got {data.shuffle_buffer})."),
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
    Rule("adapter_kind", ("model", "finetuning", "training"), _adapter_kind_differs,
         "--adapter_name_or_path {path} is a {kind} adapter: continue it with --finetuning_type {kind} (got "
         "{finetuning.finetuning_type}), or start a new adapter without --adapter_name_or_path."),
    Rule("p_tuning_encoder", ("model", "finetuning", "training"),
         lambda a: a.finetuning.finetuning_type == "p_tuning" and prompt_adapter_kind(a.model.adapter_name_or_path)
         and not os.path.isfile(os.path.join(a.model.adapter_name_or_path, "prompt_encoder.safetensors")),
         "--adapter_name_or_path {model.adapter_name_or_path}: a p_tuning adapter without prompt_encoder.safetensors "
         "(which tunesmith writes beside it) holds the encoder's output but not the MLP to train further; train a "
         "new one, or resume the run that made it (--resume_from_checkpoint)."),
    Rule("prompt_learning_packing", ("data.packing", "finetuning"),
         lambda a: a.data.packing and a.finetuning.prompt_learning,
         "--packing cannot be used with --finetuning_type {finetuning.finetuning_type}: PEFT puts the virtual tokens "
         "once in front of each row, and a packed row holds many examples, all but the first of which would train "
         "without them; drop --packing (padded batches)."),
    Rule("prompt_learning_label_smoothing", ("finetuning", "training"),
         lambda a: a.finetuning.finetuning_type in ("prompt_tuning", "p_tuning")
         and a.training.label_smoothing_factor,
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
    Rule("lora_modules_to_save_without_lora", ("finetuning",),
         lambda a: a.finetuning.lora_modules_to_save and a.finetuning.finetuning_type != "lora",
         "--lora_modules_to_save trains modules whole beside a LoRA adapter, and --finetuning_type "
         "{finetuning.finetuning_type} trains none (full trains every module already): drop it, or use "
         "--finetuning_type lora."),
    Rule("lora_trainable_tokens_without_lora", ("finetuning",),
         lambda a: a.finetuning.lora_trainable_tokens and a.finetuning.finetuning_type != "lora",
         "--lora_trainable_tokens trains rows of the embeddings beside a LoRA adapter, and --finetuning_type "
         "{finetuning.finetuning_type} trains none (full trains every row already; a prompt-based method changes no "
         "weight of the model): drop it, or use --finetuning_type lora."),
    Rule("lora_trainable_tokens_with_whole_embeddings", ("finetuning",),
         _whole_embedding_module,
         "--lora_trainable_tokens trains some rows of the embeddings and the head, and --lora_modules_to_save {module} "
         "trains the whole matrix: keep one."),
    Rule("lora_trainable_tokens_adapter", ("model", "finetuning"),
         lambda a: a.finetuning.lora_trainable_tokens and a.model.adapter_name_or_path,
         "--lora_trainable_tokens sets up a new adapter, and this run continues {model.adapter_name_or_path}, whose "
         "adapter_config.json decides what trains: drop --lora_trainable_tokens, or drop --adapter_name_or_path to "
         "start a new one."),
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
    Rule("router_aux_loss_coef", ("finetuning",),
         lambda a: a.finetuning.router_aux_loss_coef is not None and not a.finetuning.router_aux_loss_coef >= 0,
         "--router_aux_loss_coef must be >= 0 (got {finetuning.router_aux_loss_coef}); 0 leaves the router loss out."),
    # -- generation (chat's and serve's settings; their own rows are chat/rules.py's and serve/rules.py's)
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
    Rule("prompt_adapter_beams", ("model", "generation"),
         lambda a: a.generation.num_beams > 1 and prompt_adapter(a.model),
         "--num_beams with the {kind} adapter {path}: beam search runs PEFT's generate(), which in this version "
         "does not continue a prompt-based adapter's replies as its own forward does; use --num_beams 1."),
    # -- the rollout engine (ppo's rollouts, distill's on-policy replies: hparams/rollout_args.py)
    Rule("rollout_vllm_colocate", ("rollout",), _colocation_refused, "{problem}."),
    Rule("rollout_colocate_flags_unread", ("rollout",), _colocate_flags_with_server,
         "{flags} set the colocated vLLM's memory, and --vllm_url names a server, whose own flags set its memory "
         "(`tunesmith vllm-serve --kv_cache_gib`, vLLM's --gpu-memory-utilization): drop them, or --vllm_url."),
    Rule("rollout_vllm_memory_share", ("rollout",), lambda a: not 0 < a.rollout.vllm_gpu_memory_utilization <= 1,
         "--vllm_gpu_memory_utilization must be in (0, 1] (got {rollout.vllm_gpu_memory_utilization}): the share of "
         "the GPU's memory colocated vLLM takes."),
    Rule("rollout_vllm_kv_cache", ("rollout",), lambda a: a.rollout.vllm_kv_cache_gib < 1,
         "--vllm_kv_cache_gib must be a whole number of GiB, at least 1 (got {rollout.vllm_kv_cache_gib})."),
    Rule("rollout_vllm_sleep_cpu", ("rollout",),
         lambda a: a.rollout.vllm_enable_sleep_mode and a.rollout.colocated and not torch.cuda.is_available(),
         "--vllm_enable_sleep_mode frees a GPU's memory between rollouts, and this run has no GPU (vLLM's sleep mode "
         "is for CUDA, ROCm and XPU devices): drop it."),
    Rule("rollout_vllm_url_form", ("rollout",),
         lambda a: a.rollout.vllm_url is not None and not a.rollout.vllm_url.startswith(("http://", "https://")),
         "--vllm_url {rollout.vllm_url}: give the server's address with its scheme, e.g. http://127.0.0.1:8000."),
    Rule("rollout_engine_tunesmith_url", ("rollout",),
         lambda a: a.rollout.rollout_engine == "tunesmith" and a.rollout.vllm_url is not None,
         "--vllm_url is the vLLM server's, and --rollout_engine tunesmith samples in the trainer: drop one of them."),
    Rule("rollout_vllm_prompt_method", ("rollout", "model", "finetuning"),
         lambda a: a.rollout.uses_vllm and prompt_method(a),
         "--rollout_engine vllm with --finetuning_type {kind}: vLLM serves LoRA adapters, not prompt-based ones; use "
         "--finetuning_type lora or full, or --rollout_engine tunesmith."),
    Rule("rollout_vllm_timeout", ("rollout",), lambda a: a.rollout.vllm_timeout <= 0,
         "--vllm_timeout must be above 0 seconds (got {rollout.vllm_timeout})."),
    Rule("torchao_model_trained", ("model", "training"), lambda a: is_torchao_quantized(a.model.model_name_or_path),
         "{model.model_name_or_path} is a torchao-quantized model (a --qat run's quantized/): its int4 weights do not "
         "train; train the run's float model (the output_dir quantized/ is in) or its base, with --qat again."),
    Rule("torchao_model_dtype", ("model",), lambda a: _torchao_dtype_differs(a.model),
         "--dtype {model.dtype}: {path} is torchao-quantized (a --qat run's quantized/) and its tensors compute in "
         "{made}, the dtype they were made in: drop --dtype.",
         without=("export",)),  # export's --dtype is the file's tensor type; its own row refuses the model
    Rule("qat_installed", ("qat",), lambda a: a.qat.qat and importlib.util.find_spec("torchao") is None,
         "--qat {qat.qat} needs torchao: pip install 'tunesmith[qat]' (torchao 0.18)."),
    Rule("qat_group_size_unread", ("qat",), lambda a: not a.qat.qat and a.qat.qat_group_size != 32,
         "--qat_group_size {qat.qat_group_size} is read with --qat only: add --qat int8_int4 or --qat int4, or drop "
         "--qat_group_size."),
    Rule("qat_group_size", ("qat",), lambda a: a.qat.qat_group_size < 1,
         "--qat_group_size {qat.qat_group_size}: give a positive number of inputs per scale (32 divides most "
         "models' layers)."),
    Rule("qat_quantization_bit", ("qat", "model"), lambda a: a.qat.qat and a.model.quantization_bit is not None,
         "--qat {qat.qat} with --quantization_bit {model.quantization_bit}: QAT trains float weights to round well "
         "later, and QLoRA's base is already rounded by bitsandbytes; drop one of them."),
    Rule("qat_prompt_learning", ("qat", "finetuning"), lambda a: a.qat.qat and a.finetuning.prompt_learning,
         "--qat with --finetuning_type {finetuning.finetuning_type}: its virtual tokens change no weight, so nothing "
         "it trains is quantized; use --finetuning_type lora or full."),
    Rule("qat_lora_dropout", ("qat", "finetuning"),
         lambda a: a.qat.qat and a.finetuning.finetuning_type == "lora" and a.finetuning.lora_dropout > 0,
         "--qat with LoRA trains the merged weight W + BA fake-quantized (what is served), which has no adapter input "
         "to drop: give --lora_dropout 0 (got {finetuning.lora_dropout})."),
    Rule("qat_dora", ("qat", "finetuning"), lambda a: a.qat.qat and a.finetuning.use_dora,
         "--qat with --use_dora: DoRA rescales each column of the merged weight by a trained magnitude, which the "
         "fake-quantized merged weight of --qat leaves out; drop one of them."),
    Rule("qat_sharded", ("qat", "training"), lambda a: a.qat.qat and _qat_sharded(a.training)
         and {"sharding": _qat_sharded(a.training)},
         "--qat with {sharding}: the conversion at the end quantizes the whole model in one process, and {sharding} "
         "holds a shard of it in each; use configs/ds_zero2.json or one process."),
]


def check(check_paths: bool = True, feature_rules: Sequence[Rule] = (), **roles: Any) -> None:
    """Raise the error of the first broken rule among those that apply to a run of these roles (Rule.applies): this
    table's rows, then the command's feature's own (`feature_rules`, e.g. tunesmith/export/rules.py's), whose rows
    marked `first` go before this table's.
    check_paths=False leaves out the rows about files and folders (for settings read on another machine than the
    run's). A row that reads what it did not declare raises its AttributeError, with the row's name."""
    check_rows((*[r for r in feature_rules if r.first], *RULES, *[r for r in feature_rules if not r.first]), roles,
               check_paths)
