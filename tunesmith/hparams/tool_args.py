"""The settings of `tunesmith score` (the features' own are in their folders: tunesmith/export/args.py,
merge/args.py, evaluation/args.py, inspect/args.py, ui/args.py, rl/args.py). Models, adapters and data come from the
shared dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class ScoreArguments:
    role: ClassVar[str] = "score"
    _argument_group_name: ClassVar[str] = "scoring"

    output_file: str | None = field(
        default=None, metadata={"help": "Where to write one JSON line of scores per input row."}
    )
    batch_size: int = field(default=8, metadata={"help": "Sequences per forward pass."})
