"""The rows of `tunesmith ppo` (PPO, GRPO, RLOO) and of the policy evaluation: settings that cannot work, refused in
one line after parsing and before any weight loads. The parser checks them after the core's rows (hparams/rules.py)
for these commands only, so each may read the roles its command always has without a guard; the trainer checks
the rows it needs itself when it is built without the command (tests, scripts)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..distributed import fsdp_requested, zero_stage
from ..errors import PathError
from ..hparams.finetuning_args import splits_base
from ..hparams.rule_engine import Rule
from ..hparams.rule_helpers import (
    VISION_STAGE_NOT_BUILT,
    bound_rule,
    first_problem,
    missing_dir,
    problem_values,
    prompt_method,
    router_loss_is_sfts,
    vision_folder,
    vision_stage_not_built,
)
from ..hparams.value_bounds import Bound, at_least, in_range, positive
from ..utils.hub_data import problem_with_data_source
from ..utils.paths import is_adapter_dir


def _batch(a: Any) -> int:
    """--per_device_train_batch_size, which the mini-batches and the groups of replies divide."""
    return a.training.per_device_train_batch_size


# Settings only the value model of --advantage gae reads; under grpo/rloo a value other than the default was
# set on purpose and would silently do nothing.
_VALUE_ONLY_FLAGS = ("vf_coef", "cliprange_value", "gamma", "lam", "whiten_rewards")


def _value_only_flags_set(ppo: Any) -> dict | None:
    if ppo.uses_value_model:
        return None
    defaults = {f.name: f.default for f in dataclasses.fields(ppo)}
    for name in _VALUE_ONLY_FLAGS:
        if getattr(ppo, name) != defaults[name]:
            return {"flag": name, "value": getattr(ppo, name)}
    return None


def _missing_dir_problem(path: str) -> str | None:
    found = missing_dir(path)
    return found["problem"] if found else None


def _sft_only_lora_flag(a: Any) -> dict | None:
    """{"problem"}: --loraplus_lr_ratio, or an --init_lora_weights that splits the base, given to an RL run."""
    if a.finetuning.loraplus_lr_ratio is not None:
        return problem_values("--loraplus_lr_ratio")
    if splits_base(a.finetuning.init_lora_weights):
        return problem_values(f"--init_lora_weights {a.finetuning.init_lora_weights}")
    return None


def _delta_within_clip(a: Any) -> bool:
    """Whether --delta is given at or below the clip's ceiling, 1 + --epsilon_high (or --cliprange)."""
    if a.ppo.delta is None:
        return False
    return a.ppo.delta <= 1 + (a.ppo.cliprange if a.ppo.epsilon_high is None else a.ppo.epsilon_high)


def _model_dir_problem(a: Any) -> dict | None:
    """{"path", "problem"}: the first of --baseline, --policy and --reward_model that is not an output directory."""
    given = [p for p in (a.evaluation.baseline, a.evaluation.policy, a.evaluation.reward_model) if p]
    return first_problem(given, _missing_dir_problem)


# The values' bounds: `--FIELD must be NEED (got VALUE); ADVICE.` (hparams/value_bounds.py's form).
BOUNDS: tuple[Bound, ...] = (
    Bound("ppo", "top_k", at_least(0), ">= 0", "0 turns it off"),
    Bound("ppo", "top_p", lambda value: 0 < value <= 1, "in (0, 1]", "1.0 turns it off"),
    Bound("ppo", "cliprange", positive, "> 0", "0.2 is PPO's"),
    Bound("ppo", "kl_coef", at_least(0), ">= 0", "0 leaves the KL penalty out"),
    Bound("ppo", "kl_target", positive, "> 0", "the KL --adaptive_kl steers towards",
          lambda run: run.ppo.adaptive_kl),
    Bound("ppo", "kl_horizon", positive, "> 0", "episodes over which kl_coef may change by about a fifth",
          lambda run: run.ppo.adaptive_kl),
    Bound("ppo", "gamma", in_range(0, 1, high_included=True), "in [0, 1]", "1.0 does not discount"),
    Bound("ppo", "lam", in_range(0, 1, high_included=True), "in [0, 1]", "0.95 is usual"),
    Bound("ppo", "vf_coef", at_least(0), ">= 0"),
    Bound("ppo", "rollout_log_samples", at_least(0), ">= 0", "0 prints none"),
    Bound("evaluation", "batch_size", at_least(1), "at least 1"),
    Bound("evaluation", "max_new_tokens", at_least(1), "at least 1"),
)

RULES: list[Rule] = [
    Rule("vision_ppo", ("model", "ppo", "training"), lambda a: vision_stage_not_built(a.model, "ppo"),
         VISION_STAGE_NOT_BUILT),  # the rollouts take no pictures yet
    router_loss_is_sfts("ppo"),
    *map(bound_rule, BOUNDS),
    Rule("ppo_prompt_learning", ("ppo", "model", "finetuning"), prompt_method,
         "--finetuning_type {kind} cannot be used with PPO/GRPO/RLOO: the value model is a second adapter on the "
         "policy's model, and PEFT holds one prompt-based adapter per model; use --finetuning_type lora or full."),
    Rule("lora_variant_ppo", ("ppo", "finetuning"), _sft_only_lora_flag,
         "{problem} is for SFT, reward and DPO runs, not PPO/GRPO: drop it (a PiSSA/OLoRA SFT adapter is saved as a "
         "plain LoRA, which PPO continues)."),
    # -- PPO (the reward-model rows need "data" too: they are the recipe's, not the trainer's, which
    # may be given a reward function instead)
    Rule("ppo_reward_given", ("ppo", "data"), lambda a: not (a.ppo.reward_model or a.ppo.reward_funcs),
         "--reward_model or --reward_funcs is required: the output directory of reward/train.py (e.g. "
         "outputs/rm_demo), and/or reward functions (e.g. --reward_funcs exact_answer answer_format)."),
    Rule("ppo_reward_weights", ("ppo",),
         lambda a: a.ppo.reward_weights and len(a.ppo.reward_weights) != len(a.ppo.reward_funcs)
         and {"weights": len(a.ppo.reward_weights), "funcs": len(a.ppo.reward_funcs)},
         "--reward_weights has {weights} values for {funcs} --reward_funcs: give one weight per function, in order "
         "(the reward model's is --reward_model_weight)."),
    Rule("ppo_reward_model_path", ("ppo", "data"), lambda a: missing_dir(a.ppo.reward_model),
         "--reward_model {path}: {problem} (train one with reward/train.py).", PathError),
    Rule("ptx_files", ("ppo", "data"), lambda a: first_problem(a.ppo.ptx_data_path, problem_with_data_source),
         "--ptx_data_path {path}: {problem}.", PathError),
    Rule("ppo_vision_reward_model", ("ppo", "data"),
         lambda a: a.ppo.reward_model and vision_folder(a.ppo.reward_model)
         and {"path": a.ppo.reward_model, "model_type": vision_folder(a.ppo.reward_model)},
         "--reward_model {path} is a vision-language reward model ({model_type}): PPO's rollouts are text, with no "
         "pictures to show it; give a text reward model, or score with `tunesmith score`."),
    Rule("ptx_coef_without_data", ("ppo", "data"), lambda a: a.ppo.ptx_coef is not None and not a.ppo.ptx_data_path,
         "--ptx_coef weighs the supervised loss of --ptx_data_path, which is not given: add --ptx_data_path FILE "
         "(SFT conversations) or drop --ptx_coef."),
    Rule("ptx_coef", ("ppo", "data"), lambda a: a.ppo.ptx_coef is not None and not a.ppo.ptx_coef > 0,
         "--ptx_coef must be > 0 (got {ppo.ptx_coef}); leave out --ptx_data_path to train without it."),
    Rule("ema_decay", ("ppo", "data"), lambda a: a.ppo.ema_decay is not None and not 0 < a.ppo.ema_decay < 1,
         "--ema_decay must be between 0 and 1, both excluded (got {ppo.ema_decay}); 0.992 is DeepSpeed-Chat's."),
    Rule("ema_zero3", ("ppo", "training"), lambda a: a.ppo.ema_decay is not None and zero_stage(a.training) == 3,
         "--ema_decay keeps a whole copy of the policy's weights, which ZeRO-3 holds only in shards: use "
         "configs/ds_zero2.json, or drop --ema_decay."),
    Rule("critic_without_value_model", ("ppo", "data"),
         lambda a: a.ppo.critic_model_name_or_path is not None and a.ppo.advantage != "gae",
         "--critic_model_name_or_path starts PPO's value model, and --advantage {ppo.advantage} has none: drop it, "
         "or use --advantage gae."),
    Rule("critic_path", ("ppo", "data"),
         lambda a: a.ppo.critic_model_name_or_path != "base" and missing_dir(a.ppo.critic_model_name_or_path),
         "--critic_model_name_or_path {path}: {problem} (a reward model from reward/train.py, or `base`).",
         PathError),
    Rule("ppo_lora_checkpointing", ("ppo", "finetuning", "training"),
         lambda a: a.training.gradient_checkpointing and a.finetuning.finetuning_type == "lora",
         "--gradient_checkpointing cannot be used with LoRA PPO: the policy and value adapters share one model and "
         "the recomputed forward would run the wrong adapter; drop it (or use --finetuning_type full)."),
    Rule("ppo_fsdp", ("ppo", "training"), lambda a: fsdp_requested(a.training),
         "ppo/train.py (PPO, GRPO, RLOO) cannot run under FSDP: its rollouts generate with the whole policy, which "
         "it gathers only from DeepSpeed's shards. Use --deepspeed configs/ds_zero2.json or configs/ds_zero3.json."),
    Rule("ppo_mini_batches", ("ppo", "training"),
         lambda a: a.ppo.num_mini_batches < 1 or _batch(a) % a.ppo.num_mini_batches,
         "--num_mini_batches {ppo.num_mini_batches} must divide --per_device_train_batch_size "
         "{training.per_device_train_batch_size} (the rollout batch) into equal mini-batches."),
    Rule("ppo_accumulation", ("ppo", "training"),
         lambda a: a.ppo.num_mini_batches >= 1 and (_batch(a) // a.ppo.num_mini_batches)
         % a.training.gradient_accumulation_steps and {"rows": _batch(a) // a.ppo.num_mini_batches},
         "--gradient_accumulation_steps {training.gradient_accumulation_steps} must divide the mini-batch of {rows} "
         "rows (--per_device_train_batch_size / --num_mini_batches)."),
    Rule("ppo_samples_per_prompt", ("ppo", "training"),
         lambda a: a.ppo.samples_per_prompt < 1 or _batch(a) % a.ppo.samples_per_prompt,
         "--samples_per_prompt {ppo.samples_per_prompt} must divide --per_device_train_batch_size "
         "{training.per_device_train_batch_size}: each process holds whole groups of replies to one prompt."),
    Rule("ppo_group_baseline", ("ppo",), lambda a: a.ppo.advantage != "gae" and a.ppo.samples_per_prompt < 2,
         "--advantage {ppo.advantage} compares each reply with the other replies to its prompt: set "
         "--samples_per_prompt to 2 or more (got {ppo.samples_per_prompt}; a group of one has no baseline)."),
    Rule("ppo_value_flags_without_value_model", ("ppo",), lambda a: _value_only_flags_set(a.ppo),
         "--{flag} {value} belongs to the value model of --advantage gae; --advantage {ppo.advantage} has none: "
         "drop the flag, or use --advantage gae."),
    Rule("ppo_kl_in_loss_k1", ("ppo",), lambda a: a.ppo.kl_in_loss and a.ppo.kl_estimator == "k1",
         "--kl_estimator k1 with --kl_in_loss: the gradient of k1 (log p - log p_ref) is zero on average over the "
         "policy's samples, so the loss term would hold nothing back; use k3 (the default with --kl_in_loss) or "
         "mse."),
    Rule("ppo_temperature", ("ppo",), lambda a: a.ppo.temperature <= 0,
         "--temperature must be positive (got {ppo.temperature}); PPO needs a sampling policy."),
    Rule("ppo_lengths", ("ppo",), lambda a: a.ppo.max_new_tokens < 1 or a.ppo.ppo_epochs < 1,
         "--max_new_tokens ({ppo.max_new_tokens}) and --ppo_epochs ({ppo.ppo_epochs}) must be at least 1."),
    Rule("ppo_luspo_level", ("ppo",),
         lambda a: a.ppo.loss_type == "luspo" and a.ppo.importance_sampling_level != "sequence",
         "--loss_type luspo is LUSPO: GSPO's one ratio per reply, each reply's loss times its length; add "
         "--importance_sampling_level sequence."),
    Rule("ppo_vespo_level", ("ppo",),
         lambda a: a.ppo.loss_type == "vespo" and a.ppo.importance_sampling_level != "token",
         "--loss_type vespo builds its one weight per reply from the token ratios itself: leave "
         "--importance_sampling_level at token."),
    Rule("ppo_epsilon_high", ("ppo",), lambda a: a.ppo.epsilon_high is not None and a.ppo.epsilon_high < 0,
         "--epsilon_high must be >= 0 (got {ppo.epsilon_high}): the ratio's ceiling is 1 + epsilon_high."),
    Rule("ppo_delta_loss", ("ppo",),
         lambda a: a.ppo.delta is not None and a.ppo.loss_type not in ("dapo", "bnpo", "grpo", "dr_grpo", "luspo"),
         "--delta caps the unclipped ratio of PPO's clipped surrogate; --loss_type {ppo.loss_type} has none: drop "
         "--delta, or use dapo, bnpo, grpo, dr_grpo or luspo."),
    Rule("ppo_delta", ("ppo",), _delta_within_clip,
         "--delta {ppo.delta} must exceed the clip's ceiling 1 + --epsilon_high (or --cliprange), or it would cut "
         "ratios the clip lets through; INTELLECT-2 uses 4."),
    Rule("ppo_scale_rewards", ("ppo",), lambda a: a.ppo.scale_rewards != "group" and a.ppo.advantage != "grpo",
         "--scale_rewards {ppo.scale_rewards} scales --advantage grpo's group advantages; --advantage "
         "{ppo.advantage} has its own baseline: drop the flag, or use --advantage grpo."),
    Rule("ppo_multi_objective", ("ppo",),
         lambda a: a.ppo.multi_objective_aggregation == "normalize_then_sum"
         and (a.ppo.advantage != "grpo" or len(a.ppo.reward_funcs) + bool(a.ppo.reward_model) < 2),
         "--multi_objective_aggregation normalize_then_sum (GDPO) standardises each reward source within its "
         "group: it needs --advantage grpo and two or more sources (--reward_funcs and --reward_model; got "
         "--advantage {ppo.advantage} with {ppo.reward_funcs})."),
    Rule("ppo_dynamic_sampling", ("ppo",), lambda a: a.ppo.dynamic_sampling and a.ppo.advantage == "gae",
         "--dynamic_sampling drops groups whose rewards are all equal, which only a group baseline makes useless: "
         "use --advantage grpo or rloo."),
    Rule("ppo_dynamic_sampling_rounds", ("ppo",), lambda a: a.ppo.dynamic_sampling_rounds < 1,
         "--dynamic_sampling_rounds must be at least 1 (got {ppo.dynamic_sampling_rounds})."),
    Rule("ppo_entropy_quantile", ("ppo",), lambda a: not 0 <= a.ppo.top_entropy_quantile <= 1,
         "--top_entropy_quantile must be between 0 and 1 (got {ppo.top_entropy_quantile}; 0.2 trains the 20% most "
         "uncertain tokens, 1.0 all)."),
    Rule("ppo_overlong", ("ppo",), lambda a: not 0 <= a.ppo.overlong_buffer <= a.ppo.max_new_tokens,
         "--overlong_buffer {ppo.overlong_buffer} must be between 0 (off) and --max_new_tokens "
         "({ppo.max_new_tokens}): the penalty ramps over the last that many tokens."),
    Rule("ppo_sapo_temperatures", ("ppo",),
         lambda a: min(a.ppo.sapo_temperature_pos, a.ppo.sapo_temperature_neg) <= 0,
         "--sapo_temperature_pos and --sapo_temperature_neg must be positive (got {ppo.sapo_temperature_pos}, "
         "{ppo.sapo_temperature_neg})."),
    # -- where the rollouts are sampled (hparams/rollout_args.py)
    Rule("ppo_rollout_is_cap", ("ppo",), lambda a: a.ppo.rollout_is_cap < 1,
         "--rollout_is_cap must be at least 1 (got {ppo.rollout_is_cap}): a token's importance weight is capped "
         "there, and a cap below 1 would shrink every token's loss; 2 is verl's."),
    Rule("ppo_async_rollouts", ("ppo",), lambda a: a.ppo.async_rollouts not in (0, 1),
         "--async_rollouts must be 0 or 1 (got {ppo.async_rollouts}): a batch is sampled at most one step ahead."),
    Rule("ppo_async_engine", ("ppo", "rollout"), lambda a: a.ppo.async_rollouts and not a.rollout.uses_vllm,
         "--async_rollouts 1 samples the next batch on a vLLM server while this one trains; tunesmith's engine "
         "samples on the trainer's own devices, which the update is using: add --rollout_engine vllm --vllm_url URL "
         "(docs/rl.md#vllm), or drop --async_rollouts."),
    Rule("ppo_async_colocated", ("ppo", "rollout"), lambda a: a.ppo.async_rollouts and a.rollout.colocated,
         "--async_rollouts 1 samples the next batch while this one trains, and colocated vLLM shares the trainer's "
         "process and device: give a server's --vllm_url (`tunesmith vllm-serve`), or drop --async_rollouts."),
    Rule("ppo_async_dynamic_sampling", ("ppo",), lambda a: a.ppo.async_rollouts and a.ppo.dynamic_sampling,
         "--dynamic_sampling draws more prompts from the scores of the batch it fills, which --async_rollouts "
         "samples a step ahead of its scoring: use one of the two."),
    # -- the policy evaluation (`tunesmith eval --policy`)
    Rule("eval_models_given", ("evaluation",),
         lambda a: not (a.evaluation.policy and (a.evaluation.baseline or is_adapter_dir(a.evaluation.policy))
                        and (a.evaluation.reward_model or a.evaluation.reward_funcs)),
         "--policy, --baseline and --reward_model (or --reward_funcs) are required: e.g. the PPO, GRPO or DPO policy, "
         "the SFT policy (left out, an adapter's base) and the reward model (output directories of ppo/ or "
         "dpo/train.py, sft/train.py and reward/train.py)."),
    Rule("eval_reward_weights", ("evaluation",),
         lambda a: a.evaluation.reward_weights and len(a.evaluation.reward_weights) != len(a.evaluation.reward_funcs)
         and {"weights": len(a.evaluation.reward_weights), "funcs": len(a.evaluation.reward_funcs)},
         "--reward_weights has {weights} values for {funcs} --reward_funcs: give one weight per function, in order."),
    Rule("eval_model_paths", ("evaluation",), _model_dir_problem,
         "{path}: {problem} (--baseline, --policy and --reward_model take output directories).", PathError),
]
