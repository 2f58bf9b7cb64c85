"""The resolved arguments of a run, saved beside its outputs so that a result says how it was made,
and compared with a new run's before it resumes or replaces what is there."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any

from .. import __version__
from ..constants import RUN_CONFIG_FILE
from ..utils.io import atomic_write_json
from .model_args import ModelArguments
from .run_kinds import RUN_ARGUMENTS

# Settings that do not change what a run computes. Two runs that differ only in these are the same run:
# continued, extended, logged, saved or evaluated differently, or launched on another machine. Every other
# setting changes the result, and a run in output_dir made with another value of it is neither resumed nor
# replaced without --overwrite_output_dir.
#
# tunesmith's own such fields are named by their dataclass (its `result_neutral` set); transformers' TrainingArguments fields
# are read from the dataclass and sorted by what they are named for, so a field a new transformers release adds
# under one of these names (hub_*, logging_*, save_*, eval_*, ddp_*, ...) is placed without a change here, and
# any other new field counts as changing the result (the safe side: a resume is refused, never wrong).
NEUTRAL_NAMES_OF_TRANSFORMERS = (
    # where the run goes and whether it continues; how long it runs (a longer run is a resume of a shorter one)
    "output_dir", "overwrite_output_dir", "resume_from_checkpoint", "max_steps", "num_train_epochs",
    # logging and reporting
    "logging_", "log_", "report_to", "run_name", "project", "trackio_", "disable_tqdm", "skip_memory_metrics",
    "include_num_input_tokens_seen",
    # when and where checkpoints are written and published
    "save_", "enable_jit_checkpoint", "push_to_hub", "hub_",
    # when evaluation runs and in what batches (which data it uses is compared)
    "eval_", "per_device_eval_batch_size", "batch_eval_metrics", "prediction_loss_only",
    # data loading workers
    "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "dataloader_prefetch_factor", "dataloader_multiprocessing_context",
    # the machine and the launch: device, process rank, sharding, compilation and memory trade-offs of the same maths
    "use_cpu", "local_rank", "deepspeed", "fsdp", "ddp_", "gradient_checkpointing", "activation_checkpointing",
    "torch_empty_cache_steps", "torch_compile", "debug", "do_train", "do_eval", "do_predict",
)


def _neutral_keys() -> frozenset[str]:
    from transformers import TrainingArguments as HFTrainingArguments

    classes = {cls for kinds in RUN_ARGUMENTS.values() for cls in kinds}
    own = {name for cls in classes for name in getattr(cls, "result_neutral", ())}
    # the Trainer's settings, as transformers defines them or as tunesmith's TrainingArguments redefine them
    trainer = {f.name for f in dataclasses.fields(HFTrainingArguments)} | {
        f.name for cls in classes if issubclass(cls, HFTrainingArguments) for f in dataclasses.fields(cls)}
    return frozenset(own | {name for name in trainer if name.startswith(NEUTRAL_NAMES_OF_TRANSFORMERS)})


@functools.cache
def result_neutral_keys() -> frozenset[str]:
    """The names of every setting that does not change what a run computes."""
    return _neutral_keys()


MAX_LISTED_DIFFERENCES = 10


def resolved_config(*configs: Any) -> dict[str, dict[str, Any]]:
    """{dataclass name: {field: value}} for the given argument dataclasses."""
    resolved: dict[str, dict[str, Any]] = {}
    for cfg in configs:
        resolved[getattr(cfg, "record_name", type(cfg).__name__)] = cfg.to_dict() if hasattr(cfg, "to_dict") else dataclasses.asdict(cfg)
    return resolved


# The record's section that says which tunesmith wrote it: {"tunesmith": {"version": "0.1.0"}}. It names no
# argument dataclass, so readers that look for one (the UI's runs list, the Modelfile's num_ctx) pass over it.
VERSION_SECTION = "tunesmith"


def save_run_config(output_dir: str, *configs: Any) -> None:
    record = {VERSION_SECTION: {"version": __version__}, **resolved_config(*configs)}
    atomic_write_json(os.path.join(output_dir, RUN_CONFIG_FILE), record)


def merge_record(model_args: ModelArguments) -> ModelArguments:
    """The model arguments as a merged model (a merged folder, a GGUF) records them: local paths made absolute,
    so that the record still names the adapter from another folder (the rules refuse adding that adapter again)."""
    def absolute(path: str | None) -> str | None:
        return os.path.abspath(path) if path and os.path.exists(path) else path

    return dataclasses.replace(model_args, model_name_or_path=absolute(model_args.model_name_or_path),
                               adapter_name_or_path=absolute(model_args.adapter_name_or_path))


def as_saved(*configs: Any) -> dict[str, dict[str, Any]]:
    """resolved_config as it reads back from tunesmith_config.json (tuples as lists, enums and paths
    as strings), so that it compares equal to a saved one made from the same settings."""
    return json.loads(json.dumps(resolved_config(*configs), default=str))


def result_differences(saved: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[str]:
    """`key: saved -> new` for every setting that changes the result and differs. A key the saved
    config lacks (written by an older tunesmith) is not compared; other argument classes (another
    stage) are a difference of their own. The tunesmith version is no setting: a run saved by another
    release (or by one that recorded none) resumes, as its settings alone decide."""
    saved, new = ({k: v for k, v in record.items() if k != VERSION_SECTION} for record in (saved, new))
    if set(saved) != set(new):
        return [f"arguments: {'+'.join(saved)} -> {'+'.join(new)} (another kind of run)"]
    differences = []
    for section, fields in new.items():
        for key, value in fields.items():
            if key in result_neutral_keys() or key not in saved[section] or saved[section][key] == value:
                continue
            differences.append(f"{key}: {json.dumps(saved[section][key])} -> {json.dumps(value)}")
    return differences


def describe_differences(differences: list[str]) -> str:
    listed = "; ".join(differences[:MAX_LISTED_DIFFERENCES])
    more = len(differences) - MAX_LISTED_DIFFERENCES
    return listed + (f"; and {more} more" if more > 0 else "")
