"""The settings of the runs that use a trained model rather than train one: merge, score, inspect,
compare and the policy evaluation. Models, adapters and data come from the shared dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .ppo_args import RewardSourceArguments

# Merging changes the order of float operations (W x + B A x vs (W + B A) x) and, in half precision,
# rounds the merged weight once more; the error that adds up through the layers scales with the
# dtype's rounding step and with the size of the logits. Measured on SmolLM2-135M with trained
# adapters: ~2e-6 (float32), ~5e-3 (float16), ~3e-2 (bfloat16) of the largest logit.
MERGE_RELATIVE_TOLERANCES = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}


@dataclass
class MergeArguments:
    role: ClassVar[str] = "merge"
    _argument_group_name: ClassVar[str] = "merge"

    output_dir: str | None = field(
        default=None,
        metadata={"help": "Where the merged model goes (must not exist or be empty, unless --overwrite_output_dir)."},
    )
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Replace a non-empty output_dir."})
    max_shard_size: str = field(default="2GB", metadata={"help": "Largest safetensors shard."})
    tolerance: float | None = field(
        default=None,
        metadata={"help": "Largest allowed max |logit difference| between the merged model and base + adapter "
                  "on a probe conversation. Default: the largest |logit| (at least 1) times "
                  + ", ".join(f"{v:g} ({k})" for k, v in MERGE_RELATIVE_TOLERANCES.items()) + "."},
    )


@dataclass
class ScoreArguments:
    role: ClassVar[str] = "score"
    _argument_group_name: ClassVar[str] = "scoring"

    output_jsonl: str | None = field(
        default=None, metadata={"help": "Where to write one JSON line of scores per input row."}
    )
    batch_size: int = field(default=8, metadata={"help": "Sequences per forward pass."})


@dataclass
class InspectArguments:
    role: ClassVar[str] = "inspect"
    _argument_group_name: ClassVar[str] = "inspect"

    output_jsonl: str | None = field(default=None, metadata={"help": "Write input_ids/labels per input row here."})
    show: int = field(default=5, metadata={"help": "How many examples to print (0: none, -1: all)."})
    color: str = field(default="auto", metadata={"help": "auto (when stdout is a terminal), always, never."})


@dataclass
class CompareArguments:
    role: ClassVar[str] = "compare"
    _argument_group_name: ClassVar[str] = "compare"

    max_new_tokens: int = field(default=48, metadata={"help": "Longest answer."})
    width: int = field(default=48, metadata={"help": "Column width when printing."})
    count_word: str | None = field(
        default=None,
        metadata={"help": "Also count the answers of each column that contain this word (case-insensitive), "
                  "e.g. the new name a fine-tune teaches."},
    )


@dataclass
class EvalArguments(RewardSourceArguments):
    role: ClassVar[str] = "evaluation"
    _argument_group_name: ClassVar[str] = "policy evaluation"

    baseline: str | None = field(
        default=None, metadata={"help": "The policy compared against, usually the SFT one: an adapter directory or a "
                                "model directory. Default, when --policy is an adapter: the model under it (its "
                                "base, from adapter_config.json)."})
    policy: str | None = field(
        default=None, metadata={"help": "The tuned policy (output_dir of ppo/train.py or dpo/train.py)."})
    show: int = field(default=3, metadata={"help": "Print the first this many prompts with both replies."})
    max_new_tokens: int = field(default=48, metadata={"help": "Longest reply."})
    do_sample: bool = field(default=False, metadata={"help": "Sample replies (fixed seed) instead of greedy decoding."})
    temperature: float = field(default=1.0, metadata={"help": "With --do_sample: sampling temperature."})
    seed: int = field(default=0, metadata={"help": "With --do_sample: the seed each policy starts from."})
    batch_size: int = field(default=8, metadata={"help": "Prompts per generation batch."})
    output_file: str | None = field(
        default=None, metadata={"help": "Write each prompt, both replies and scores here (JSONL)."}
    )
