"""What the rows of several rules tables read or say, the core's (hparams/rules.py) and the features' (their
rules.py): the message values of a path's problem, a value's bound as a row, the prompt-based adapter or the
vision-language model a run has, and the messages and rows more than one stage shares. Public names, so a feature's
table imports them as the core's API (tests/core/test_layout.py refuses a private name imported across packages)."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ..families import reward_model_types, vision_model_type
from ..utils.paths import adapter_config, is_adapter_dir, prompt_adapter_kind
from .rule_engine import Rule
from .value_bounds import Bound


def first_problem(values: list[str], problem: Callable[[str], str | None]) -> dict | None:
    """{"path", "problem"} of the first value that `problem` finds one with; None when none has."""
    for value in values:
        found = problem(value)
        if found:
            return {"path": value, "problem": found}
    return None


def missing_dir(path: str | None) -> dict | None:
    """{"path", "problem"} when a path is given and is not a directory; None otherwise."""
    if path and not os.path.isdir(path):
        return {"path": path, "problem": "is a file, not a directory" if os.path.exists(path) else "no such directory"}
    return None


def problem_values(found: str | None) -> dict | None:
    """A problem found (a text) as the message's {problem}; None when there is none."""
    return {"problem": found} if found else None


def bound_rule(bound: Bound) -> Rule:
    """The row of one value's bound: `--FIELD must be NEED (got VALUE); ADVICE.`"""

    def out_of_bound(a: SimpleNamespace) -> bool:
        value = getattr(getattr(a, bound.role), bound.field)  # the role and field the bound names
        return value is not None and (bound.when is None or bound.when(a)) and not bound.ok(value)

    advice = f"; {bound.advice}" if bound.advice else ""
    return Rule(f"{bound.role}_{bound.field}_value", (f"{bound.role}.{bound.field}",), out_of_bound,
                f"--{bound.field} must be {bound.need} (got {{{bound.role}.{bound.field}}}){advice}.")


def prompt_adapter(model: Any) -> dict | None:
    """{"path", "kind"} when the adapter given (as --adapter_name_or_path, or as the model) is prompt-based."""
    for path in (model.adapter_name_or_path, model.model_name_or_path):
        kind = prompt_adapter_kind(path)
        if kind:
            return {"path": path, "kind": kind}
    return None


def prompt_method(a: SimpleNamespace) -> dict | None:
    """{"kind"}: the prompt-based method a training run trains, by --finetuning_type or by the adapter it continues."""
    if a.finetuning.prompt_learning:
        return {"kind": a.finetuning.finetuning_type}
    found = prompt_adapter(a.model)
    return {"kind": found["kind"]} if found else None


def vision_model(model: Any) -> dict | None:
    """{"model_type": ...} when the model (the base, for an adapter) is a local vision-language model folder."""
    model_type = vision_model_type(model.model_name_or_path)
    return {"model_type": model_type} if model_type else None


def vision_folder(path: str) -> str | None:
    """The model type of a vision-language model folder, or of an adapter's base; None otherwise."""
    if is_adapter_dir(path):
        path = adapter_config(path).get("base_model_name_or_path")
    return vision_model_type(path)


def sequence_parallel_size(a: SimpleNamespace) -> int:
    """--sequence_parallel_size, of the training dataclass that has it (SFTTrainingArguments: sft, pt, distill, plan)."""
    return a.training.sequence_parallel_size


# What a prompt-based adapter cannot be merged or exported into, and why (merge's and export's rows).
NOTHING_TO_MERGE = ("{path} is a {kind} adapter: its virtual tokens go in front of the input and change no weight, "
                    "so there is nothing to merge into the weights; use it as it is with tunesmith chat, serve or "
                    "compare, or train a LoRA adapter (--finetuning_type lora) to merge.")


# What a training stage not built for pictures says to a vision-language model: all but SFT, DPO's paired losses and
# the reward model of a type with a sequence-classification class (KTO's unpaired replies and PPO's rollouts take no
# pictures yet). The rows are the stages' features' (preference/rules.py, rl/rules.py), with vision_stage_not_built.
VISION_STAGE_NOT_BUILT = (
    "{stage} on a vision-language model ({model_type}): not built (SFT, DPO with the sigmoid, ipo, simpo and orpo "
    "losses, and reward models of {reward_types} train on pictures; chat, serve, merge and eval take them); train it "
    "with one of those, or on its text with the language model alone.")


def vision_stage_not_built(model: Any, stage: str) -> dict | None:
    """VISION_STAGE_NOT_BUILT's values when the model is a vision-language model ({"model_type", "stage",
    "reward_types"}), None for a text model."""
    vision = vision_model(model)
    return vision and {**vision, "stage": stage, "reward_types": ", ".join(reward_model_types())}


def router_loss_is_sfts(stage: str) -> Rule:
    """The row of a training stage other than SFT (`stage`, the role of its own arguments) that refuses
    --router_aux_loss_coef; the stage's feature lists it."""
    return Rule("router_aux_loss_coef_sft_only", ("finetuning", stage),
                lambda a: a.finetuning.router_aux_loss_coef is not None and {"stage": stage},
                "--router_aux_loss_coef weighs a mixture-of-experts router loss that only SFT adds, and this is a "
                "{stage} run: drop it.")


# What a run that reads its data whole says to --streaming, which only `tunesmith sft` reads: the core table's row,
# for the commands without SFT's data or a training loop, and the rows of the features that parse SFT's data but read
# it whole (the memory plan, distillation).
STREAMING_IS_SFTS = ("--streaming reads SFT conversations as training takes them (tunesmith sft); this command reads "
                     "its --data_path whole: drop the flag.")
