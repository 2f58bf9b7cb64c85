"""The rows of `tunesmith chat`: settings that cannot work, refused in one line after parsing and before any weight
loads. The parser checks them after the core's rows (hparams/rules.py: the generation rows, which the server reads
too, are there) for this command only; chat's own is the bound of its prompt's length."""

from __future__ import annotations

from ..hparams.rule_engine import Rule
from ..hparams.rule_helpers import bound_rule
from ..hparams.value_bounds import Bound, at_least

# The values' bounds: `--FIELD must be NEED (got VALUE); ADVICE.` (hparams/value_bounds.py's form).
BOUNDS: tuple[Bound, ...] = (
    Bound("chat", "max_prompt_length", at_least(1), "at least 1 token"),
)

RULES: list[Rule] = [*map(bound_rule, BOUNDS)]
