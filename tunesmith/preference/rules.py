"""The rows of `tunesmith dpo` (DPO, IPO, SimPO, ORPO, KTO), `tunesmith reward` and `tunesmith score`: settings that
cannot work, refused in one line after parsing and before any weight loads. The parser checks them after the core's
rows (hparams/rules.py) for these commands only, and a row applies where the run has every role it reads (the DPO
rows to dpo, the reward model's to reward), so each reads its command's roles without a guard."""

from __future__ import annotations

from typing import Any

from ..distributed import zero_stage
from ..families import reward_model_types
from ..hparams.finetuning_args import splits_base
from ..hparams.rule_engine import Rule
from ..hparams.rule_helpers import (
    VISION_STAGE_NOT_BUILT,
    bound_rule,
    prompt_method,
    router_loss_is_sfts,
    vision_stage_not_built,
)
from ..hparams.value_bounds import Bound, at_least

# The values' bounds: `--FIELD must be NEED (got VALUE); ADVICE.` (hparams/value_bounds.py's form).
BOUNDS: tuple[Bound, ...] = (
    Bound("score", "batch_size", at_least(1), "at least 1"),
)


def _vision_reward_model_not_built(a: Any) -> dict | None:
    """VISION_STAGE_NOT_BUILT's values: a reward model of a vision-language type transformers has no
    sequence-classification class for."""
    found = vision_stage_not_built(a.model, "reward")
    return found if found and found["model_type"] not in reward_model_types() else None


RULES: list[Rule] = [
    # -- the stages on a vision-language model: a reward model of a type with a score head that reads pictures, and
    # DPO's paired losses (KTO's unpaired replies take none)
    Rule("vision_reward", ("model", "reward", "training"), _vision_reward_model_not_built, VISION_STAGE_NOT_BUILT),
    Rule("vision_kto", ("model", "dpo", "training"),
         lambda a: a.dpo.loss_type == "kto" and vision_stage_not_built(a.model, "DPO with --loss_type kto"),
         VISION_STAGE_NOT_BUILT),
    router_loss_is_sfts("reward"),
    router_loss_is_sfts("dpo"),
    *map(bound_rule, BOUNDS),
    # -- the reward model
    Rule("reward_prompt_learning", ("reward", "model", "finetuning"), prompt_method,
         "--finetuning_type {kind} cannot train a reward model: its score head is a new layer that a prompt-based "
         "adapter does not train; use --finetuning_type lora or full.", first=True),
    Rule("center_rewards", ("reward",),
         lambda a: a.reward.center_rewards_coefficient is not None and a.reward.center_rewards_coefficient < 0,
         "--center_rewards_coefficient must be >= 0 (got {reward.center_rewards_coefficient}); leave it unset to "
         "train without centring."),
    # -- DPO and KTO
    Rule("dpo_prompt_learning", ("dpo", "model", "finetuning"), prompt_method,
         "--finetuning_type {kind} cannot be used with DPO: its pairs run as packed rows, where PEFT's virtual tokens "
         "would precede only the first sequence of each row; use --finetuning_type lora or full.", first=True),
    Rule("init_residual_dpo_reference", ("dpo", "finetuning"),
         lambda a: a.dpo.needs_reference and splits_base(a.finetuning.init_lora_weights),
         "--init_lora_weights {finetuning.init_lora_weights} with --loss_type {dpo.loss_type}: the reference of a new "
         "adapter is the model with its adapter switched off, which {finetuning.init_lora_weights} leaves as the "
         "residual weights, not the model you start from; use --loss_type simpo or orpo (no reference), or train "
         "the PiSSA/OLoRA adapter with SFT first and continue it (--adapter_name_or_path)."),
    Rule("dpo_beta", ("dpo",), lambda a: not a.dpo.beta > 0,
         "--beta must be > 0 (got {dpo.beta}); 0.1 is typical for sigmoid/ipo/kto, 2.0 for simpo, 0.1 for orpo."),
    Rule("dpo_label_smoothing", ("dpo",), lambda a: not 0.0 <= a.dpo.label_smoothing < 0.5,
         "--label_smoothing must be in [0, 0.5) (got {dpo.label_smoothing}): it is the assumed fraction of flipped "
         "pairs, and 0.5 or more would train towards the rejected replies."),
    Rule("dpo_smoothing_sigmoid_only", ("dpo",),
         lambda a: a.dpo.label_smoothing and a.dpo.loss_type != "sigmoid",
         "--label_smoothing {dpo.label_smoothing} applies to --loss_type sigmoid only (got {dpo.loss_type}, whose "
         "loss has no labels to smooth): drop it, or use --loss_type sigmoid."),
    Rule("dpo_precompute_needs_reference", ("dpo",),
         lambda a: a.dpo.precompute_ref_logps and not a.dpo.needs_reference,
         "--precompute_ref_logps: --loss_type {dpo.loss_type} has no reference model to score; drop the flag."),
    Rule("dpo_precompute_zero3", ("dpo", "training"),
         lambda a: a.dpo.precompute_ref_logps and zero_stage(a.training) == 3,
         "--precompute_ref_logps cannot be used with ZeRO-3: the pass runs before DeepSpeed gathers the sharded "
         "weights. Drop it (the reference then runs in each step, sharded like the policy), or use ZeRO-2."),
    Rule("dpo_full_reference_zero3", ("dpo", "finetuning", "training"),
         lambda a: a.dpo.needs_reference and a.finetuning.finetuning_type == "full" and zero_stage(a.training) == 3,
         "--loss_type {dpo.loss_type} with --finetuning_type full keeps a frozen copy of the model as its "
         "reference, which this version does not shard under ZeRO-3. Use --finetuning_type lora (the reference is "
         "the model without its adapter, sharded like the policy), ZeRO-2 with --precompute_ref_logps, or a "
         "reference-free loss (--loss_type simpo or orpo)."),
    Rule("kto_weights", ("dpo",), lambda a: not (a.dpo.desirable_weight > 0 and a.dpo.undesirable_weight > 0),
         "--desirable_weight and --undesirable_weight must be > 0 (got {dpo.desirable_weight} and "
         "{dpo.undesirable_weight}): they weigh KTO's loss on each kind of reply."),
    Rule("kto_weights_kto_only", ("dpo",),
         lambda a: a.dpo.loss_type != "kto" and (a.dpo.desirable_weight, a.dpo.undesirable_weight) != (1.0, 1.0),
         "--desirable_weight and --undesirable_weight apply to --loss_type kto only (got {dpo.loss_type}, whose "
         "pairs have one reply of each kind): drop them, or use --loss_type kto."),
    Rule("kto_precompute", ("dpo",), lambda a: a.dpo.loss_type == "kto" and a.dpo.precompute_ref_logps,
         "--precompute_ref_logps cannot be used with --loss_type kto: its KL estimate scores each batch's prompts "
         "with other rows' replies, paired anew in every batch, which no pass before training can score; drop the "
         "flag (the reference then runs in each step)."),
    Rule("kto_batch", ("dpo", "training"),
         lambda a: a.dpo.loss_type == "kto" and a.training.per_device_train_batch_size < 2,
         "--loss_type kto with --per_device_train_batch_size {training.per_device_train_batch_size}: KTO estimates "
         "its KL term from each batch's prompts paired with the batch's other replies, and one reply has none: use "
         "2 or more (8 or more gives a steadier estimate; lower --gradient_accumulation_steps to keep the step size)."),
    Rule("kto_val_size", ("dpo", "data"), lambda a: a.dpo.loss_type == "kto" and a.data.val_size > 0,
         "--val_size with --loss_type kto: KTO is evaluated on held-out preference pairs (how often the chosen reply "
         "gets the higher implicit reward, as DPO is): give them as --eval_data_path (a file of pairs), or drop "
         "--val_size."),
    # -- scoring
    Rule("score_output_given", ("score",), lambda a: not a.score.output_file,
         "--output_file is required: where to write one line of scores per input row."),
]
