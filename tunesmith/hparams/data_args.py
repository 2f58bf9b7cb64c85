"""Which data to read and how long its sequences may be. The same flag means the same thing in every
stage: --data_path (one or more files), --max_samples, --max_seq_length (prompt + reply tokens),
--max_prompt_length (prompt tokens, where only a prompt is read)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal


@dataclass
class DataFileArguments:
    """The fields of every stage that reads data files."""

    role: ClassVar[str] = "data"
    _argument_group_name: ClassVar[str] = "data"

    data_path: list[str] = field(
        default_factory=list,
        metadata={"help": "One or more JSON/JSONL files, the format detected per row. Conversations: OpenAI "
                  "`messages`, ShareGPT `conversations` or Alpaca; preference pairs add `chosen`/`rejected`; "
                  "prompts (PPO, evaluation) are `prompt` strings or conversations ending with a user turn."},
    )
    max_samples: int | None = field(
        default=None,
        metadata={"help": "Use only the first N rows of --data_path (quick runs). --eval_data_path files are "
                  "used whole; --eval_split_ratio holds out its share of these N."},
    )
    overwrite_cache: bool = field(
        default=False,
        metadata={"help": "Tokenize again even when the cache holds these files tokenized with the same tokenizer, "
                  "chat template and settings."},
    )


@dataclass
class DataArguments(DataFileArguments):
    max_seq_length: int = field(
        default=1024,
        metadata={"help": "Longest example in tokens (prompt + reply). Longer examples lose whole early or "
                  "trailing turns first; an example with no reply left is dropped and counted."},
    )


@dataclass
class TrainDataArguments(DataArguments):
    eval_data_path: list[str] = field(
        default_factory=list, metadata={"help": "Evaluation files, same formats as --data_path."}
    )
    eval_split_ratio: float = field(
        default=0.0, metadata={"help": "Hold out this fraction of the training rows for evaluation."}
    )


@dataclass
class SFTDataArguments(TrainDataArguments):
    train_on: Literal["assistant", "last_assistant", "all"] = field(
        default="assistant",
        metadata={"help": "Which tokens are trained: every assistant reply and its end-of-turn token, only the "
                  "last reply, or everything (prompt included)."},
    )
    packing: bool = field(
        default=False,
        metadata={"help": "Pack several examples into one row with no attention between them (no padding)."},
    )


@dataclass
class PromptDataArguments(DataFileArguments):
    max_prompt_length: int = field(
        default=512,
        metadata={"help": "Prompts longer than this many tokens (after the chat template) are dropped, and counted."},
    )
