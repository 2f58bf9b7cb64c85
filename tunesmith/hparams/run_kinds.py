"""Which argument dataclasses each kind of run parses (the parser's and the saved run config's one list)."""

from __future__ import annotations

from .data_args import DataArguments, PromptDataArguments, SFTDataArguments, TrainDataArguments
from .finetuning_args import DPOArguments, FinetuningArguments, RewardArguments
from .generating_args import ChatArguments, GenerationArguments, ServeArguments
from .model_args import ModelArguments
from .plan_args import PlanArguments
from .ppo_args import PPOArguments
from .tool_args import (
    CompareArguments,
    EvalArguments,
    ExportArguments,
    ExportModelArguments,
    HarnessArguments,
    InspectArguments,
    MergeArguments,
    ScoreArguments,
    UIArguments,
)
from .tool_use_args import ToolUseArguments
from .training_args import SFTTrainingArguments, TrainingArguments

# The dataclasses of each kind of run, in the order tunesmith_config.json records them.
RUN_ARGUMENTS: dict[str, tuple[type, ...]] = {
    "sft": (ModelArguments, SFTDataArguments, FinetuningArguments, SFTTrainingArguments),
    "reward": (ModelArguments, TrainDataArguments, RewardArguments, FinetuningArguments, TrainingArguments),
    "dpo": (ModelArguments, TrainDataArguments, DPOArguments, FinetuningArguments, TrainingArguments),
    "ppo": (ModelArguments, PromptDataArguments, FinetuningArguments, PPOArguments, ToolUseArguments, TrainingArguments),
    "merge": (ModelArguments, MergeArguments),
    "export": (ExportModelArguments, ExportArguments),
    "chat": (ModelArguments, ChatArguments, GenerationArguments),
    "serve": (ModelArguments, ServeArguments, GenerationArguments),
    "score": (ModelArguments, DataArguments, ScoreArguments),
    "inspect": (ModelArguments, SFTDataArguments, InspectArguments),
    "compare": (ModelArguments, PromptDataArguments, CompareArguments),
    "eval_policy": (PromptDataArguments, EvalArguments, ToolUseArguments),
    "eval": (ModelArguments, HarnessArguments),
    "ui": (UIArguments,),
    "plan": (ModelArguments, SFTDataArguments, FinetuningArguments, SFTTrainingArguments, PlanArguments),
}
