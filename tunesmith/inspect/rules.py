"""The rows of `tunesmith inspect`: its own values out of their range, refused in one line after parsing (the parser
checks them after the core's rows, hparams/rules.py, for this command only). The data's rows are the core's: inspect
reads SFT's data arguments as `tunesmith sft` does."""

from __future__ import annotations

from ..hparams.rule_engine import Rule
from ..hparams.rule_helpers import bound_rule
from ..hparams.value_bounds import Bound, at_least

BOUNDS: tuple[Bound, ...] = (
    Bound("inspect", "show", at_least(-1), "-1 or more", "-1 shows every example, 0 none"),
)

RULES: list[Rule] = [*map(bound_rule, BOUNDS)]
