"""Paths the user gives, checked before anything loads, and where tunesmith keeps its caches."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..constants import RUN_CONFIG_FILE
from ..errors import PathError

ADAPTER_CONFIG = "adapter_config.json"
MODEL_CONFIG = "config.json"

# Folders that training tools write their results into (tunesmith's default --output_dir is outputs/run):
# `outputs/sft_demo` names a result on this machine even before outputs/ exists, never a hub model.
OUTPUT_ROOTS = ("outputs", "output", "saves", "checkpoints")


def cache_root() -> Path:
    """Where tunesmith keeps converted models and tokenized datasets (override: TUNESMITH_CACHE)."""
    root = os.environ.get("TUNESMITH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tunesmith"
    )
    return Path(root)


def is_adapter_dir(path: str | None) -> bool:
    return bool(path) and os.path.isfile(os.path.join(str(path), ADAPTER_CONFIG))


def adapter_config(adapter_dir: str) -> dict:
    path = os.path.join(adapter_dir, ADAPTER_CONFIG)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PathError(f"{path}: not valid JSON ({e}): train or copy the adapter again, or give another "
                        "adapter folder") from None


# PEFT's peft_type of each prompt-based --finetuning_type.
PROMPT_PEFT_TYPES = {"prompt_tuning": "PROMPT_TUNING", "p_tuning": "P_TUNING", "prefix_tuning": "PREFIX_TUNING"}


def prompt_adapter_kind(path: str | None) -> str | None:
    """The --finetuning_type of a prompt-based adapter folder (prompt_tuning, p_tuning, prefix_tuning), from
    its adapter_config.json; None for a LoRA adapter or anything else."""
    if not is_adapter_dir(path):
        return None
    peft_type = adapter_config(str(path)).get("peft_type")
    return next((kind for kind, name in PROMPT_PEFT_TYPES.items() if name == peft_type), None)


def adapter_base_model(adapter_dir: str) -> str:
    """The base model an adapter was trained on, as recorded in its adapter_config.json."""
    base = adapter_config(adapter_dir).get("base_model_name_or_path")
    if not base:
        raise PathError(f"{adapter_dir}/{ADAPTER_CONFIG}: no base_model_name_or_path; pass the base model with "
                        "--model_name_or_path")
    return base


def model_config(path: str | None) -> dict:
    """A local model directory's config.json ({} when there is no readable one there)."""
    try:
        with open(os.path.join(str(path), MODEL_CONFIG), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError, TypeError):
        return {}
    return config if isinstance(config, dict) else {}


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def has_processor(path: str | None) -> bool:
    return any(os.path.isfile(os.path.join(str(path), name)) for name in PROCESSOR_FILES)


def is_torchao_quantized(path: str | None) -> bool:
    """Whether a local model folder holds a torchao-quantized model (a --qat run's quantized/): its config.json
    says so."""
    quant = model_config(path).get("quantization_config")
    return isinstance(quant, dict) and quant.get("quant_method") == "torchao"


def model_architecture(path: str | None) -> str | None:
    """The class name a local model directory's config.json records (e.g. LlamaForCausalLM), or None when
    there is no readable config.json there."""
    architectures = model_config(path).get("architectures") or []
    return architectures[0] if architectures else None


def looks_local(name: str) -> bool:
    """True for what can only be a path on this machine: absolute, ./ ../ ~, a Windows drive, more
    than one slash, a first component that exists here (data/x when data/ exists) or that is a folder
    results are written to (outputs/x, see OUTPUT_ROOTS). A bare `org/name` that matches nothing here
    may be a hub id, and is left to transformers."""
    if name.startswith(("/", "./", "../", "~", ".\\")) or name in (".", "..") or (len(name) > 1 and name[1] == ":"):
        return True
    parts = name.replace("\\", "/").strip("/").split("/")
    return len(parts) != 2 or parts[0] in OUTPUT_ROOTS or os.path.exists(parts[0]) or os.path.exists(name)


def problem_with_model_dir(path: str) -> str | None:
    """Why the local `path` cannot be loaded as a model (or as an adapter), or None."""
    p = Path(path)
    if not p.exists():
        return "no such directory"
    if not p.is_dir():
        return "is a file, not a directory"
    if (p / MODEL_CONFIG).is_file() or is_adapter_dir(str(p)):
        return None
    inside = sorted(str(d) for d in p.iterdir() if (d / MODEL_CONFIG).is_file() or is_adapter_dir(str(d)))
    hint = f"; these folders in it do: {', '.join(inside[:3])}" if inside else ""
    return f"holds neither a model ({MODEL_CONFIG}) nor a LoRA adapter ({ADAPTER_CONFIG}){hint}"


def run_config_record(directory: str) -> dict:
    """The tunesmith_config.json a tunesmith run saved in `directory` ({} when there is none or it
    cannot be read): what the result was made from."""
    try:
        with open(os.path.join(directory, RUN_CONFIG_FILE), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


PARQUET_MAGIC = b"PAR1"
DATASET_FOLDER_FILES = ("state.json", "dataset_info.json")  # what datasets' save_to_disk writes for one Dataset


def is_dataset_folder(path: str) -> bool:
    return all((Path(path) / name).is_file() for name in DATASET_FOLDER_FILES)


def is_parquet(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == PARQUET_MAGIC


def is_table(path: str) -> bool:
    """A Parquet file, an Arrow file (a shard datasets wrote) or a datasets.save_to_disk folder (rows without
    lines)."""
    return is_dataset_folder(path) if Path(path).is_dir() else is_parquet(path) or is_arrow(path)


def is_arrow(path: str) -> bool:
    return Path(path).suffix == ".arrow"


# The files a folder of shards is read as (a large corpus comes as data/train-00000-of-00042.parquet, ...).
SHARD_SUFFIXES = (".json", ".jsonl", ".parquet", ".arrow")


def shard_files(path: str) -> list[str]:
    """The data files directly in a folder of shards, in name order (shard 00001 before 00002); [] for a file, a
    datasets.save_to_disk folder or a folder without any."""
    p = Path(path)
    if not p.is_dir() or is_dataset_folder(path):
        return []
    return sorted(str(f) for f in p.iterdir() if f.is_file() and f.suffix in SHARD_SUFFIXES)


def problem_with_data_file(path: str) -> str | None:
    """Why `path` cannot be read as a data file (JSON, JSONL, Parquet, or a datasets.save_to_disk
    folder), or None."""
    p = Path(path)
    if not p.exists():
        return "no such file"
    if p.is_dir():
        if is_dataset_folder(path):
            return None
        if (p / "dataset_dict.json").is_file():
            splits = sorted(str(d) for d in p.iterdir() if is_dataset_folder(str(d)))
            return f"is a datasets DatasetDict folder; give one of its splits ({' '.join(splits) or 'none saved'})"
        for shard in shard_files(path):  # a folder of shards: each is read as a data file of its own
            problem = problem_with_data_file(shard)
            if problem:
                return f"its shard {Path(shard).name} {problem}"
        if shard_files(path):
            return None
        files = sorted(str(f) for f in p.iterdir() if f.suffix in (".json", ".jsonl", ".parquet"))[:3]
        hint = f" (e.g. {' '.join(files)})" if files else ""
        return f"is a directory; give the JSON/JSONL/Parquet files in it{hint}, or a datasets.save_to_disk folder"
    if not os.access(p, os.R_OK):
        return "not readable (check its permissions)"
    if p.stat().st_size == 0:
        return "is empty (0 bytes): no rows to read"
    if is_parquet(path):
        import pyarrow.parquet as pq

        try:
            pq.ParquetFile(path)
        except Exception as e:  # pyarrow raises several types for a damaged file
            return f"is not a readable Parquet file ({e})"
    if is_arrow(path):
        import pyarrow as pa

        try:
            with pa.memory_map(path) as source:
                pa.ipc.open_stream(source)  # reads the schema
        except Exception as e:  # pyarrow raises several types for a damaged file
            return f"is not a readable Arrow file, as datasets writes them ({e})"
    return None


def problem_with_output_dir(path: str | None) -> str | None:
    """Why nothing can be written under `path`, or None (checked before a model loads, not after)."""
    if not path:
        return "empty: give a directory to write to"
    p = Path(path)
    if p.exists() and not p.is_dir():
        return "is a file, not a directory"
    existing = p
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, so no directory can be made under it"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None
