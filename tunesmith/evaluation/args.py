"""The settings of `tunesmith eval` (lm-evaluation-harness tasks: HarnessArguments) and of `tunesmith compare` (two
models' answers side by side: CompareArguments); the model comes from the core's ModelArguments and compare's prompts
from PromptDataArguments. Their combinations are refused by the rows of rules.py beside it. The policy evaluation
(`tunesmith eval --policy`) is the RL feature's (rl/args.py, EvalArguments)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..hparams.data_args import PromptDataArguments
from ..hparams.model_args import ModelArguments


@dataclass
class HarnessArguments:
    """`tunesmith eval`: lm-evaluation-harness tasks run in this process on the model (and adapter) that
    ModelArguments names, with lm-eval's own flags and their meaning."""

    role: ClassVar[str] = "harness"
    _argument_group_name: ClassVar[str] = "evaluation (lm-evaluation-harness)"

    tasks: str | None = field(
        default=None,
        metadata={"help": "Comma-separated lm-eval task or group names (as `lm_eval --tasks`): the shipped offline "
                  "tasks tunesmith_identity, tunesmith_arithmetic, tunesmith_tool_calls, tunesmith_knowledge (group "
                  "tunesmith), tasks under --include_path, or lm-eval's own (their data from the Hugging Face hub)."},
    )
    include_path: str | None = field(
        default=None, metadata={"help": "A folder of your own lm-eval task YAMLs, searched as well (as lm_eval's)."})
    num_fewshot: int | None = field(
        default=None, metadata={"help": "Few-shot examples per question (default: each task's own, else 0)."})
    limit: float | None = field(
        default=None, metadata={"help": "Only the first N documents of each task (a fraction < 1: that share). "
                                "For quick checks; numbers on a limited set are not comparable with published ones."})
    batch_size: str = field(default="8", metadata={"help": "Requests per forward: a number, or auto (as lm_eval's)."})
    apply_chat_template: bool = field(
        default=False, metadata={"help": "Render each prompt through the model's chat template as a user turn "
                                 "(lm-eval's flag; what a chat model answers best)."})
    fewshot_as_multiturn: bool = field(
        default=False, metadata={"help": "With --apply_chat_template: few-shot examples as earlier turns."})
    system_instruction: str | None = field(default=None, metadata={"help": "A system prompt for every request."})
    gen_kwargs: str | None = field(
        default=None, metadata={"help": "Generation settings for generate_until tasks, e.g. temperature=0,max_gen_toks=64 "
                                "(lm-eval's --gen_kwargs)."})
    seed: int | None = field(
        default=None, metadata={"help": "One seed for lm-eval's four (python, numpy, torch, few-shot order), as "
                                "`lm_eval --seed N`. Default: lm_eval's 0,1234,1234,1234."})
    compare_to: str | None = field(
        default=None,
        metadata={"help": "Also evaluate another model on the same tasks and print, per task and metric, both scores, "
                  "the change and its paired standard error over the same documents: `base` (the model under "
                  "--adapter_name_or_path) or a model/adapter directory. Written as compare.md and compare.json "
                  "in --output_path."})
    output_path: str = field(
        default="outputs/eval",
        metadata={"help": "Where results go: lm-eval's results_<time>.json under <output_path>/<model name>/, as "
                  "`lm_eval --output_path` writes them."})
    log_samples: bool = field(
        default=False, metadata={"help": "Also write every document's prompt, answer and scores (lm-eval's samples files)."})


@dataclass
class CompareArguments:
    role: ClassVar[str] = "compare"
    _argument_group_name: ClassVar[str] = "compare"

    baseline: str | None = field(
        default=None, metadata={"help": "The left column: a model directory or an adapter directory (its base from "
                                "adapter_config.json). Default: the base model under --adapter_name_or_path."})
    max_new_tokens: int = field(default=48, metadata={"help": "Longest answer."})
    num_beams: int = field(default=1, metadata={"help": "Beam search over this many beams (1: greedy decoding)."})
    width: int = field(default=48, metadata={"help": "Column width when printing, in terminal cells."})
    count_word: str | None = field(
        default=None,
        metadata={"help": "Also count the answers of each column that contain this word (case-insensitive), "
                  "e.g. the new name a fine-tune teaches."},
    )
    output_path: str | None = field(
        default=None,
        metadata={"help": "Also write the comparison as compare.json in this folder (as `tunesmith eval --compare_to` "
                  "writes its own): each question with the two answers, the columns' names, and the counts."},
    )


# The dataclasses `tunesmith eval` parses, in the order tunesmith_config.json records them.
ARGUMENTS: tuple[type, ...] = (ModelArguments, HarnessArguments)
# Each command of the feature and its dataclasses (hparams.run_kinds reads it): `tunesmith eval` and `tunesmith compare`.
ARGUMENTS_BY_KIND: dict[str, tuple[type, ...]] = {
    "eval": ARGUMENTS,
    "compare": (ModelArguments, PromptDataArguments, CompareArguments),
}
