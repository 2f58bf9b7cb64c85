"""The resolved arguments of a run, saved beside its outputs so that a result says how it was made."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..constants import RUN_CONFIG_FILE
from ..utils.io import atomic_write_json


def resolved_config(*configs: Any) -> dict[str, dict[str, Any]]:
    """{dataclass name: {field: value}} for the given argument dataclasses."""
    resolved: dict[str, dict[str, Any]] = {}
    for cfg in configs:
        resolved[type(cfg).__name__] = cfg.to_dict() if hasattr(cfg, "to_dict") else dataclasses.asdict(cfg)
    return resolved


def save_run_config(output_dir: str, *configs: Any) -> None:
    atomic_write_json(os.path.join(output_dir, RUN_CONFIG_FILE), resolved_config(*configs))
