"""The resolved arguments of a run, saved beside its outputs so that a result says how it was made,
and compared with a new run's before it resumes or replaces what is there."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from ..constants import RUN_CONFIG_FILE
from ..utils.io import atomic_write_json

# Settings that do not change what a run computes. Two runs that differ only in these are the same
# run: continued, extended, logged, saved or evaluated differently, or launched on another machine.
# Every other setting changes the result, and a run in output_dir made with another value of it is
# neither resumed nor replaced without --overwrite_output_dir.
RESULT_NEUTRAL_KEYS = frozenset({
    # where the run goes and whether it continues
    "output_dir", "overwrite_output_dir", "resume_from_checkpoint",
    # how long it runs: a longer run from the same settings is a resume of the shorter one
    "max_steps", "num_train_epochs",
    # logging and reporting
    "logging_dir", "logging_strategy", "logging_steps", "logging_first_step", "log_on_each_node",
    "logging_nan_inf_filter", "log_level", "log_level_replica", "disable_tqdm", "report_to", "run_name",
    "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
    "include_num_input_tokens_seen", "skip_memory_metrics", "plot_loss", "rollout_log_samples",
    # when and how checkpoints are written and published
    "save_strategy", "save_steps", "save_total_limit", "save_on_each_node", "save_only_model",
    "enable_jit_checkpoint", "push_to_hub", "hub_token", "hub_private_repo", "hub_model_id", "hub_strategy",
    "hub_always_push", "hub_revision",
    # when evaluation runs and in what batches (which data it uses is compared)
    "eval_strategy", "eval_steps", "eval_delay", "eval_on_start", "per_device_eval_batch_size",
    "eval_accumulation_steps", "eval_do_concat_batches", "eval_use_gather_object", "batch_eval_metrics",
    "prediction_loss_only",
    # the tokenized-data cache (keyed by its inputs) and data loading workers
    "overwrite_cache", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "dataloader_prefetch_factor", "dataloader_multiprocessing_context",
    # the machine and the launch: device, process rank, sharding and memory trade-offs of the same maths
    "use_cpu", "local_rank", "deepspeed", "fsdp", "fsdp_config", "ddp_backend", "ddp_timeout",
    "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph",
    "gradient_checkpointing", "gradient_checkpointing_kwargs", "activation_checkpointing",
    "activation_checkpointing_kwargs", "torch_empty_cache_steps", "attn_implementation", "trust_remote_code",
    "torch_compile", "torch_compile_backend", "torch_compile_mode", "debug", "do_train", "do_eval", "do_predict",
})

MAX_LISTED_DIFFERENCES = 10


def resolved_config(*configs: Any) -> dict[str, dict[str, Any]]:
    """{dataclass name: {field: value}} for the given argument dataclasses."""
    resolved: dict[str, dict[str, Any]] = {}
    for cfg in configs:
        resolved[getattr(cfg, "record_name", type(cfg).__name__)] = cfg.to_dict() if hasattr(cfg, "to_dict") else dataclasses.asdict(cfg)
    return resolved


def save_run_config(output_dir: str, *configs: Any) -> None:
    atomic_write_json(os.path.join(output_dir, RUN_CONFIG_FILE), resolved_config(*configs))


def as_saved(*configs: Any) -> dict[str, dict[str, Any]]:
    """resolved_config as it reads back from tunesmith_config.json (tuples as lists, enums and paths
    as strings), so that it compares equal to a saved one made from the same settings."""
    return json.loads(json.dumps(resolved_config(*configs), default=str))


def result_differences(saved: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[str]:
    """`key: saved -> new` for every setting that changes the result and differs. A key the saved
    config lacks (written by an older tunesmith) is not compared; other argument classes (another
    stage) are a difference of their own."""
    if set(saved) != set(new):
        return [f"arguments: {'+'.join(saved)} -> {'+'.join(new)} (another kind of run)"]
    differences = []
    for section, fields in new.items():
        for key, value in fields.items():
            if key in RESULT_NEUTRAL_KEYS or key not in saved[section] or saved[section][key] == value:
                continue
            differences.append(f"{key}: {json.dumps(saved[section][key])} -> {json.dumps(value)}")
    return differences


def describe_differences(differences: list[str]) -> str:
    listed = "; ".join(differences[:MAX_LISTED_DIFFERENCES])
    more = len(differences) - MAX_LISTED_DIFFERENCES
    return listed + (f"; and {more} more" if more > 0 else "")
