"""Which argument dataclasses each kind of run parses (the parser's and the saved run config's one list), and the
rows a feature package adds to the core's rules for its own command."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from .data_args import PromptDataArguments, SFTDataArguments
from .finetuning_args import FinetuningArguments
from .generating_args import ChatArguments, GenerationArguments, ServeArguments
from .model_args import ModelArguments
from .plan_args import PlanArguments
from .rules import Rule
from .tool_args import (
    CompareArguments,
    HarnessArguments,
    InspectArguments,
    MergeArguments,
    UIArguments,
)
from .training_args import SFTTrainingArguments

# The dataclasses of each kind of run, in the order tunesmith_config.json records them.
CORE_RUN_ARGUMENTS: dict[str, tuple[type, ...]] = {
    "sft": (ModelArguments, SFTDataArguments, FinetuningArguments, SFTTrainingArguments),
    "merge": (ModelArguments, MergeArguments),
    "chat": (ModelArguments, ChatArguments, GenerationArguments),
    "serve": (ModelArguments, ServeArguments, GenerationArguments),
    "inspect": (ModelArguments, SFTDataArguments, InspectArguments),
    "compare": (ModelArguments, PromptDataArguments, CompareArguments),
    "eval": (ModelArguments, HarnessArguments),
    "ui": (UIArguments,),
    "plan": (ModelArguments, SFTDataArguments, FinetuningArguments, SFTTrainingArguments, PlanArguments),
}

# The kinds of run a feature package defines (the shape in docs/architecture.md): `PACKAGE.args.ARGUMENTS`, its
# dataclasses, and `PACKAGE.rules.RULES`, its rows, checked after the core's for that command only. Named here, not
# imported: the core imports no feature (tests/test_layout.py), and a command loads no other feature's code; only
# what lists every kind (the CLI reference, the web UI's checks) loads them all.
FEATURE_RUNS: dict[str, str] = {
    "export": "tunesmith.export",
    "pt": "tunesmith.pretrain",
    "distill": "tunesmith.distill",
    "reward": "tunesmith.preference",
    "dpo": "tunesmith.preference",
    "score": "tunesmith.preference",
    "ppo": "tunesmith.rl",
    "eval_policy": "tunesmith.rl",  # the policy evaluation: `tunesmith eval --policy`
}


def _feature_module(kind: str, module: str) -> object:
    return importlib.import_module(f"{FEATURE_RUNS[kind]}.{module}")


def feature_rules(kind: str) -> tuple[Rule, ...]:
    """The rows of the kind's feature package (none for the core's kinds)."""
    return tuple(_feature_module(kind, "rules").RULES) if kind in FEATURE_RUNS else ()


class RunArguments(Mapping[str, tuple[type, ...]]):
    """Every kind of run and its dataclasses: the core's, and each feature's, read from it when first asked for."""

    def __getitem__(self, kind: str) -> tuple[type, ...]:
        if kind in FEATURE_RUNS:
            args = _feature_module(kind, "args")  # a feature of several commands names each one's (rl: ARGUMENTS_BY_KIND)
            return tuple(getattr(args, "ARGUMENTS_BY_KIND", {}).get(kind, args.ARGUMENTS))
        return CORE_RUN_ARGUMENTS[kind]

    def __iter__(self) -> Iterator[str]:
        return iter([*CORE_RUN_ARGUMENTS, *FEATURE_RUNS])

    def __len__(self) -> int:
        return len(CORE_RUN_ARGUMENTS) + len(FEATURE_RUNS)


RUN_ARGUMENTS = RunArguments()
