"""Which argument dataclasses each kind of run parses (the parser's and the saved run config's one list), and the
rows each kind's feature package adds to the core's rules for its own command. Every command is a feature now
(docs/architecture.md): the core holds the dataclasses and rows they share, each feature its own."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from .rule_engine import Rule

# The kinds of run and the feature package of each (the shape in docs/architecture.md): `PACKAGE.args.ARGUMENTS`
# (or `ARGUMENTS_BY_KIND[kind]` for a feature of several commands), its dataclasses in the order tunesmith_config.json
# records them, and `PACKAGE.rules.RULES`, its rows, checked after the core's for that command only. Named here, not
# imported: the core imports no feature (tests/core/test_layout.py), and a command loads no other feature's code; only
# what lists every kind (the CLI reference, the web UI's checks) loads them all.
FEATURE_RUNS: dict[str, str] = {
    "sft": "tunesmith.sft",
    "export": "tunesmith.export",
    "pt": "tunesmith.pretrain",
    "distill": "tunesmith.distill",
    "reward": "tunesmith.preference",
    "dpo": "tunesmith.preference",
    "score": "tunesmith.preference",
    "ppo": "tunesmith.rl",
    "eval_policy": "tunesmith.rl",  # the policy evaluation: `tunesmith eval --policy`
    "chat": "tunesmith.chat",
    "serve": "tunesmith.serve",
    "vllm_serve": "tunesmith.vllm_serve",
    "ui": "tunesmith.ui",
    "inspect": "tunesmith.inspect",
    "plan": "tunesmith.plan",
    "eval": "tunesmith.evaluation",  # lm-evaluation-harness: `tunesmith eval --tasks`
    "compare": "tunesmith.evaluation",
    "merge": "tunesmith.merge",
}


def _feature_module(kind: str, module: str) -> object:
    return importlib.import_module(f"{FEATURE_RUNS[kind]}.{module}")


def feature_rules(kind: str) -> tuple[Rule, ...]:
    """The rows of the kind's feature package."""
    return tuple(_feature_module(kind, "rules").RULES)


class RunArguments(Mapping[str, tuple[type, ...]]):
    """Every kind of run and its dataclasses, read from its feature package when first asked for."""

    def __getitem__(self, kind: str) -> tuple[type, ...]:
        args = _feature_module(kind, "args")  # a feature of several commands names each one's (rl: ARGUMENTS_BY_KIND)
        return tuple(getattr(args, "ARGUMENTS_BY_KIND", {}).get(kind, args.ARGUMENTS))

    def __iter__(self) -> Iterator[str]:
        return iter(FEATURE_RUNS)

    def __len__(self) -> int:
        return len(FEATURE_RUNS)


RUN_ARGUMENTS = RunArguments()
