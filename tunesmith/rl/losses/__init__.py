"""The RL stage's maths, pure tensors in, tensors out: one small module per loss or estimate, each with its
equations in its docstrings (as torchtune's rlhf/loss/).

Nothing in here knows about models, tokenizers or optimizers: every function takes
tensors and returns tensors, so each piece can be unit-tested against a hand
calculation and the trainer stays a thin loop around them.

Conventions used throughout
---------------------------
* Batches are **right-padded** response tensors of shape ``[B, T]``.
* ``mask`` has the same shape; a nonzero entry marks a real response token, zero marks
  padding. Any dtype (bool / int / float) is accepted.
* Padded positions may hold arbitrary values (including ``inf``/``nan``): they are
  selected away with ``torch.where`` rather than multiplied by the mask, because
  ``0 * inf`` is ``nan``.
* Scalar statistics are returned as detached 0-dim tensors (no ``.item()``), so calling
  these functions never forces a GPU sync; the caller decides when to log.

The modules
-----------
* ``masked``: means, variances and whitening over the real tokens;
* ``tokens``: log-probabilities and entropies from logits, where each reply ends, the high-entropy tokens;
* ``kl``: the KL estimators (k1, abs, mse, k3), the KL as a loss term, the fixed and adaptive KL coefficient;
* ``reward_shaping``: per-token rewards (the KL penalty, the score on the last token), DAPO's overlong penalty;
* ``advantages``: GAE, and the group baselines of GRPO, RLOO, Dr. GRPO and GDPO, DAPO's filter of tied groups;
* ``policy``: PPO's clipped surrogate and the GRPO loss family (DAPO, BNPO, Dr. GRPO, GSPO/LUSPO, CISPO, SAPO,
  VESPO), and how each averages its tokens;
* ``value``: PPO's clipped value loss;
* ``off_policy``: truncated importance sampling, for replies another engine sampled.
"""

from .advantages import (
    REWARD_AGGREGATIONS,
    REWARD_SCALINGS,
    compute_gae,
    decoupled_group_advantages,
    group_advantages,
    leave_one_out_scores,
    scaled_group_advantages,
    varied_groups,
)
from .kl import KL_KINDS, AdaptiveKLController, FixedKLController, kl_loss, per_token_kl
from .masked import masked_mean, masked_var, masked_whiten
from .off_policy import truncated_importance_weights
from .policy import (
    CLIPPED_LOSSES,
    IMPORTANCE_LEVELS,
    LOSS_TYPES,
    PolicyLossSpec,
    aggregate_loss,
    cispo_surrogate,
    clipped_surrogate,
    log_importance_weights,
    policy_loss,
    sapo_surrogate,
    vespo_weights,
)
from .reward_shaping import compute_rewards, overlong_penalty
from .tokens import (
    entropy_from_logits,
    first_true_indices,
    high_entropy_mask,
    logprobs_from_logits,
    truncate_after_eos,
)
from .value import value_loss

__all__ = [
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "logprobs_from_logits",
    "entropy_from_logits",
    "per_token_kl",
    "compute_rewards",
    "leave_one_out_scores",
    "group_advantages",
    "compute_gae",
    "aggregate_loss",
    "policy_loss",
    "kl_loss",
    "value_loss",
    "AdaptiveKLController",
    "FixedKLController",
    "first_true_indices",
    "truncate_after_eos",
    "KL_KINDS",
    "LOSS_TYPES",
    "IMPORTANCE_LEVELS",
    "REWARD_SCALINGS",
    "REWARD_AGGREGATIONS",
    "PolicyLossSpec",
    "log_importance_weights",
    "clipped_surrogate",
    "cispo_surrogate",
    "sapo_surrogate",
    "vespo_weights",
    "high_entropy_mask",
    "overlong_penalty",
    "varied_groups",
    "scaled_group_advantages",
    "decoupled_group_advantages",
    "CLIPPED_LOSSES",
    "truncated_importance_weights",
]
