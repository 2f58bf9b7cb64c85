"""The settings of `tunesmith chat`: the model's, how replies are generated (the core's GenerationArguments, as the
server's) and the session's own. Their combinations are refused by the rows of rules.py beside it (and the core's,
hparams/rules.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..hparams.generating_args import GenerationArguments
from ..hparams.model_args import ModelArguments


@dataclass
class ChatArguments:
    role: ClassVar[str] = "chat"
    _argument_group_name: ClassVar[str] = "chat"

    system: str | None = field(
        default=None, metadata={"help": "System prompt to start with (default: the chat template's own, if any)."}
    )
    max_prompt_length: int = field(
        default=2048,
        metadata={"help": "Longest prompt in tokens (system prompt + history + new message); the oldest whole "
                  "turns are dropped to fit, as for PPO/GRPO prompts; a message too long even alone is refused."},
    )
    output: Literal["text", "jsonl"] = field(
        default="text",
        metadata={"help": "text: each answer as it streams; jsonl: one JSON object per message, {\"content\", "
                  "\"finish_reason\"} (or {\"error\"}), for scripts reading multi-line answers from a pipe."},
    )


# The dataclasses `tunesmith chat` parses, in the order tunesmith_config.json records them.
ARGUMENTS: tuple[type, ...] = (ModelArguments, ChatArguments, GenerationArguments)
