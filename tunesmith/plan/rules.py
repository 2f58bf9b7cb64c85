"""The rows of `tunesmith plan`: SFT flags the plan cannot honour, refused in one line after parsing (the parser checks
them after the core's rows, hparams/rules.py, for this command only). The plan's own flags check themselves
(args.PlanArguments), and the SFT settings it does not cover yet are refused by command.parse_plan."""

from __future__ import annotations

from ..hparams.rule_engine import Rule
from ..hparams.rule_helpers import STREAMING_IS_SFTS

RULES: list[Rule] = [
    # the plan opens no data (it plans packed rows of --plan_tokens), and refuses the flag only SFT's training reads
    # as every command but `tunesmith sft` does
    Rule("plan_streaming", ("data",), lambda a: a.data.streaming, STREAMING_IS_SFTS),
]
