"""Every stage's argument dataclasses (each field documented once, in its help text), one parser for
every kind of run, and the one table of rules applied after parsing. Bottom of the stack above
utils/, errors and distributed: it imports nothing else of tunesmith."""

from __future__ import annotations

from collections.abc import Sequence

from .data_args import DataArguments, PromptDataArguments, SFTDataArguments, TrainDataArguments
from .finetuning_args import FinetuningArguments, QATArguments
from .generating_args import GenerationArguments
from .model_args import ModelArguments
from .parser import ParsedRun, parse_args
from .rules import check
from .run_config import save_run_config
from .run_kinds import RUN_ARGUMENTS, feature_rules
from .training_args import SFTTrainingArguments, TrainingArguments


def parse_run(kind: str, argv: Sequence[str] | None = None, description: str | None = None,
              check_paths: bool = True) -> ParsedRun:
    """Parse and check the command line of one kind of run (a key of RUN_ARGUMENTS): the core's rules, then those
    of the kind's feature package."""
    return parse_args(RUN_ARGUMENTS[kind], argv, description, check_paths, rules=feature_rules(kind))


__all__ = [
    "RUN_ARGUMENTS", "parse_run", "parse_args", "ParsedRun", "check",
    "save_run_config", "ModelArguments", "DataArguments", "TrainDataArguments", "SFTDataArguments",
    "PromptDataArguments", "FinetuningArguments", "QATArguments", "GenerationArguments", "SFTTrainingArguments", "TrainingArguments",
]
