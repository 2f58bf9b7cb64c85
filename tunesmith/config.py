"""Command-line parsing shared by every stage: an optional YAML/JSON run config as the first
argument, then `--flag value` overrides, into HfArgumentParser dataclasses."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from transformers import HfArgumentParser

from .constants import RUN_CONFIG_FILE
from .utils.io import atomic_write_json

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


class ConfigError(ValueError):
    """A run config or flag combination that cannot work; the message says what to change."""


def config_file_to_argv(path: str) -> list[str]:
    """Turn a flat YAML/JSON mapping into `--key value` tokens so that flags given after it win."""
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) if path.endswith((".yaml", ".yml")) else json.load(f)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a run config must be a mapping of flag names to values, got {type(data).__name__}")
    base = Path(path).resolve().parent
    argv: list[str] = []
    for key, value in data.items():
        if isinstance(value, dict):
            raise ConfigError(f"{path}: field `{key}` is a mapping; give a file path instead (e.g. a DeepSpeed json).")
        argv.append(f"--{key}")
        values = value if isinstance(value, list) else [value]
        for v in values:
            argv.append(_config_value(v, key, base))
    return argv


# Paths in a run config are relative to the repo root when they exist there, else to the config file.
_PATH_KEYS = {"data_path", "eval_data_path", "deepspeed", "chat_template"}


def _config_value(value: Any, key: str, base: Path) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if key in _PATH_KEYS and not os.path.isabs(text) and not os.path.exists(text) and (base / text).exists():
        return str(base / text)
    return text


def parse_args(dataclass_types: Sequence[type], args: Sequence[str] | None = None) -> tuple[Any, ...]:
    argv = list(sys.argv[1:] if args is None else args)
    file_argv: list[str] = []
    if argv and argv[0].endswith(CONFIG_SUFFIXES) and not argv[0].startswith("-"):
        file_argv = config_file_to_argv(argv[0])
        argv = argv[1:]
    parser = HfArgumentParser(list(dataclass_types))
    return tuple(parser.parse_args_into_dataclasses(args=file_argv + argv))


def save_run_config(output_dir: str, *configs: Any) -> None:
    """The resolved arguments, saved beside the outputs so a result says how it was made."""
    resolved: dict[str, Any] = {}
    for cfg in configs:
        fields = cfg.to_dict() if hasattr(cfg, "to_dict") else dataclasses.asdict(cfg)
        resolved[type(cfg).__name__] = fields
    atomic_write_json(os.path.join(output_dir, RUN_CONFIG_FILE), resolved)
