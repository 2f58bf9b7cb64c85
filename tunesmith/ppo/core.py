"""Pure-tensor building blocks for PPO-based RLHF.

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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

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
]

KL_KINDS = ("k1", "abs", "mse", "k3")

# Low-precision dtypes whose log-softmax/entropy we compute in float32: bf16 has ~3
# significant digits, which is not enough for log-prob differences that feed exp(ratio).
_LOW_PRECISION = (torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------- masked stats


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over entries where ``mask`` is nonzero.

    ``mean = sum_i(m_i * x_i) / sum_i(m_i)`` over all entries (``dim=None``) or along
    ``dim``. An all-padding slice gives 0 rather than ``nan`` (denominator clamped to 1).
    """
    keep = mask.bool()
    total = torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))
    count = keep.to(x.dtype)
    if dim is None:
        return total.sum() / count.sum().clamp(min=1)
    return total.sum(dim) / count.sum(dim).clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all masked entries (a scalar).

    ``var = sum_i m_i (x_i - mean)^2 / sum_i m_i``, multiplied by ``n / (n - 1)``
    (Bessel's correction) when ``unbiased``. With ``n <= 1`` the correction is skipped
    so a single token gives variance 0 instead of ``nan``.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.bool().sum().to(x.dtype)
        var = var * n / (n - 1).clamp(min=1)
    return var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise ``x`` to zero mean / unit (unbiased) variance over masked entries.

    ``y = (x - mean) / sqrt(var + eps)``; with ``shift_mean=False`` the mean is added
    back (``y + mean``), i.e. only the scale changes -- used for rewards, where the sign
    carries meaning. Padded positions of the output are 0, so the result does not
    depend on what the padding held.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros((), dtype=whitened.dtype, device=x.device))


# --------------------------------------------------------------------------- logits


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of each label: ``log p(y_t) = z_t[y_t] - logsumexp(z_t)``.

    ``logits``: ``[..., V]``, ``labels``: ``[...]`` (valid token ids, also at padding).
    Returns ``[...]``. Equivalent to ``log_softmax(logits).gather(-1, labels)`` but
    never materialises a second ``[..., V]`` tensor in full precision.
    """
    if logits.dtype not in _LOW_PRECISION:
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    # Half precision: logsumexp in bf16 is too coarse, but upcasting the whole
    # [B, T, V] tensor at once can double peak memory for a large vocab. Upcast one
    # sequence at a time instead.
    rows = []
    for row_logits, row_labels in zip(logits, labels):
        row_logp = torch.log_softmax(row_logits.float(), dim=-1)
        rows.append(torch.gather(row_logp, -1, row_labels.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: ``H = -sum_v p_v log p_v``.

    ``logits``: ``[..., V]`` -> ``[...]``. Computed in float32 for half-precision inputs.
    Vocabulary entries with ``-inf`` logits (p = 0) contribute 0, not ``nan``.
    """
    if logits.dtype in _LOW_PRECISION:
        logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    # 0 * log 0 is defined as 0 for entropy; the plain product would give 0 * -inf = nan.
    plogp = torch.where(p > 0, p * logp, torch.zeros((), dtype=p.dtype, device=p.device))
    return -plogp.sum(-1)


# --------------------------------------------------------------------------- KL & rewards


def per_token_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probs.

    With ``d = logp - ref_logp``:

    * ``"k1"``:  ``d``                       (unbiased, can be negative per token)
    * ``"abs"``: ``|d|``
    * ``"mse"``: ``0.5 * d^2``
    * ``"k3"``:  ``exp(-d) - 1 + d``         (= ``exp(ref - logp) - 1 - (ref - logp)``;
      unbiased and always >= 0, Schulman 2020 "Approximating KL divergence")
    """
    diff = logprobs - ref_logprobs
    if kind == "k1":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "mse":
        return 0.5 * diff.square()
    if kind == "k3":
        # expm1 keeps precision when the two policies are close (d ~ 0), where
        # exp(-d) - 1 would cancel catastrophically.
        return torch.expm1(-diff) + diff
    raise ValueError(f"unknown KL kind {kind!r}; expected one of {KL_KINDS}")


def _last_real_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last nonzero mask entry per row, or -1 for an all-padding row."""
    positions = torch.arange(mask.size(-1), device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, torch.full_like(positions, -1)).amax(-1)


def compute_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float | torch.Tensor,
    kind: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO rewards: a KL penalty on every token plus the sequence score at the end.

    ``kl_t = per_token_kl(logp_t, ref_t, kind)`` (0 on padding),
    ``non_score_reward_t = -kl_coef * kl_t``,
    ``rewards_t = non_score_reward_t + score * [t == last real token]``.

    ``scores``: ``[B]`` (``[B, 1]`` accepted). Returns ``(rewards, non_score_reward, kl)``,
    each ``[B, T]``. A row with no real tokens gets no score (there is nowhere to put it).
    """
    keep = mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    kl = torch.where(keep, per_token_kl(logprobs, ref_logprobs, kind), zero)
    non_score_reward = -kl_coef * kl
    rewards = non_score_reward.clone()

    last = _last_real_index(mask)
    rows = torch.arange(rewards.size(0), device=rewards.device)
    scores = scores.reshape(-1).to(rewards.dtype)
    # Only the final token sees the reward model's score: the RM judged the whole
    # response, and GAE propagates it back to earlier tokens.
    scores = torch.where(last >= 0, scores, torch.zeros_like(scores))
    rewards[rows, last.clamp(min=0)] += scores
    return rewards, non_score_reward, kl


def leave_one_out_scores(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Each score minus the mean score of the other replies to the same prompt (RLOO's baseline).

    ``scores``: ``[B]``, ``B`` a multiple of ``group_size``, the replies to one prompt consecutive.
    How good a prompt's replies can be varies far more between prompts than between replies to one
    prompt; a critic has to learn that per prompt before the advantages say anything about the
    reply, while this baseline removes it at once and leaves the expected gradient unchanged
    (the baseline does not depend on the reply it is subtracted from). ``group_size`` 1: unchanged.
    """
    if group_size == 1:
        return scores
    if group_size < 1 or scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size}")
    groups = scores.reshape(-1, group_size)
    others = (groups.sum(1, keepdim=True) - groups) / (group_size - 1)
    return (groups - others).reshape(scores.shape)


def group_advantages(scores: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """GRPO's advantage (Shao et al. 2024, DeepSeekMath): each score standardised within its group.

    ``A_i = (r_i - mean_g) / (std_g + eps)`` with ``mean_g = (1/G) sum_j r_j`` and the *population*
    standard deviation ``std_g = sqrt((1/G) sum_j (r_j - mean_g)^2)`` over the ``G`` replies to the same
    prompt. Population, not sample (Bessel's ``G - 1``): the group is the whole set being standardised,
    not a sample whose spread we estimate, and with it every group's advantages have mean 0 and mean
    square 1 (up to ``eps``) whatever ``G`` is; the sample std (TRL's choice) gives the same direction
    scaled by ``sqrt((G - 1) / G)``, i.e. only a smaller step (0.71x for ``G = 2``).

    A group whose scores are all equal says nothing about which reply is better: its advantages are
    exactly 0 (checked with ``max == min``, not left to ``0 / eps``, which rounding in the mean could
    turn into a small nonzero number). ``scores``: ``[B]``, ``B`` a multiple of ``group_size`` with each
    group's replies consecutive; ``group_size`` must be at least 2 (one reply has no baseline).
    """
    if group_size < 2 or scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size} >= 2")
    groups = scores.reshape(-1, group_size)
    mean = groups.mean(1, keepdim=True)
    std = groups.std(1, keepdim=True, correction=0)
    advantages = (groups - mean) / (std + eps)
    tied = groups.amax(1, keepdim=True) == groups.amin(1, keepdim=True)
    return torch.where(tied, torch.zeros_like(advantages), advantages).reshape(scores.shape)


def scaled_group_advantages(scores: torch.Tensor, group_size: int, scaling: str = "group",
                            eps: float = 1e-4) -> torch.Tensor:
    """Each reply's advantage from its group's mean, scaled one of three ways (``r_i``, group mean ``mean_g``):

    * ``group``: ``(r_i - mean_g) / (std_g + eps)``, :func:`group_advantages` (GRPO, DeepSeekMath);
    * ``batch``: ``(r_i - mean_g) / (std_B + eps)``, ``std_B`` the population standard deviation of every score
      in ``scores`` (the whole rollout batch; PPO Lite, arXiv 2508.08221): a prompt whose replies barely differ
      no longer gets the same step as one whose replies differ a lot;
    * ``none``: ``r_i - mean_g`` (Dr. GRPO, arXiv 2503.20783: dividing by the group's spread favours prompts
      that are too easy or too hard).

    A group whose scores are all equal gets exactly 0 under each."""
    if scaling == "group":
        return group_advantages(scores, group_size, eps)
    if scaling not in REWARD_SCALINGS:
        raise ValueError(f"unknown reward scaling {scaling!r}; expected one of {REWARD_SCALINGS}")
    if group_size < 2 or scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size} >= 2")
    groups = scores.reshape(-1, group_size)
    centred = groups - groups.mean(1, keepdim=True)
    if scaling == "batch":
        centred = centred / (scores.std(correction=0) + eps)
    tied = groups.amax(1, keepdim=True) == groups.amin(1, keepdim=True)
    return torch.where(tied, torch.zeros_like(centred), centred).reshape(scores.shape)


def decoupled_group_advantages(source_scores: torch.Tensor, weights: torch.Tensor, group_size: int,
                               eps: float = 1e-4) -> torch.Tensor:
    """GDPO's (arXiv 2601.05242) advantages for several reward sources: each source standardised within each
    group first, ``z_ik = (r_ik - mean_gk) / (std_gk + eps)`` (0 for a group where the source does not vary),
    then summed with the weights, ``s_i = sum_k w_k z_ik``, and ``s`` standardised over the batch,
    ``A_i = (s_i - mean(s)) / (std(s) + eps)``. Summing first (GRPO) lets the source with the widest range
    decide every comparison; standardising first gives each source its say. ``source_scores``: ``[B, K]``."""
    per_source = torch.stack([group_advantages(source_scores[:, k], group_size, eps)
                              for k in range(source_scores.size(1))], dim=1)
    summed = per_source @ weights.to(per_source.dtype)
    return (summed - summed.mean()) / (summed.std(correction=0) + eps)


# --------------------------------------------------------------------------- GAE


def compute_gae(
    values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016), backwards over time.

    ``delta_t = r_t + gamma * V_{t+1} - V_t``,
    ``A_t = delta_t + gamma * lam * A_{t+1}``,
    ``returns_t = A_t + V_t``,
    with ``V`` and ``A`` beyond a row's last real token taken as 0 (the episode ends
    there). Padded positions of both outputs are 0. Advantages are *not* whitened;
    call :func:`masked_whiten` on them if wanted.

    Inputs are detached: advantages and returns are fixed targets for the update and
    must not carry gradient back into the value head.
    """
    keep = mask.bool()
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    # Zeroing padded V and r makes every delta past the end 0 and V_{T_last+1} = 0, so
    # the terminal bootstrap and "no leak from padding" both fall out of one loop.
    values = torch.where(keep, values.detach(), zero)
    rewards = torch.where(keep, rewards.detach().to(values.dtype), zero)
    keep_f = keep.to(values.dtype)

    T = values.size(-1)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    advantages_reversed = []
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        # Multiplying by the mask guarantees A = 0 on padding even if a caller's mask
        # and values disagree.
        next_adv = (delta + gamma * lam * next_adv) * keep_f[:, t]
        advantages_reversed.append(next_adv)
        next_value = values[:, t]
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = torch.where(keep, advantages + values, zero)
    return advantages, returns


# --------------------------------------------------------------------------- the GRPO loss family



# Each loss type: how the per-token surrogate is formed and how it is averaged (aggregate_loss).
# The papers: grpo (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300), dapo (Yu et al. 2025, DAPO, arXiv
# 2503.14476), dr_grpo (Liu et al. 2025, Dr. GRPO, arXiv 2503.20783), bnpo (TRL's batch-normalised GRPO),
# cispo (MiniMax 2025, MiniMax-M1, arXiv 2506.13585), sapo (Gao et al. 2025, SAPO, arXiv 2511.20347), luspo
# (LUSPO, arXiv 2602.05261), vespo (VESPO, arXiv 2602.10693).
LOSS_TYPES = ("dapo", "bnpo", "grpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo")
CLIPPED_LOSSES = ("dapo", "bnpo", "grpo", "dr_grpo", "luspo")  # PPO's clipped surrogate, averaged differently
IMPORTANCE_LEVELS = ("token", "sequence")
REWARD_SCALINGS = ("group", "batch", "none")
REWARD_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


@dataclass(frozen=True)
class PolicyLossSpec:
    """What the policy loss computes: the loss type and its constants (the RL stage's flags of the same names).

    ``epsilon_high`` defaults to ``epsilon_low`` (PPO's symmetric clip); DAPO's clip-higher raises it (0.28).
    ``delta`` (INTELLECT-2, arXiv 2505.07291) caps the unclipped ratio too. ``max_new_tokens`` is Dr. GRPO's
    constant denominator. ``vespo`` holds (k_pos, lambda_pos, k_neg, lambda_neg)."""

    loss_type: str = "dapo"
    epsilon_low: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    importance_sampling_level: str = "token"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo: tuple[float, float, float, float] = (2.0, 3.0, 3.0, 2.0)
    max_new_tokens: int | None = None

    @property
    def high(self) -> float:
        return self.epsilon_low if self.epsilon_high is None else self.epsilon_high


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str = "dapo",
                   num_tokens: float | torch.Tensor | None = None, max_new_tokens: int | None = None) -> torch.Tensor:
    """Average a per-token loss ``[B, T]`` (``l``, real tokens ``m``) as each loss type does:

    * ``bnpo``: ``sum_{i,t} m l / sum_{i,t} m`` over this micro-batch: every token weighs the same;
    * ``dapo``, ``cispo``, ``vespo``: ``sum_{i,t} m l / N``, ``N`` = ``num_tokens``, the real tokens of the whole
      optimizer step (every micro-batch and process) divided by (micro-batches x processes), so that after
      gradient accumulation and the processes' average every token of the step weighs the same (DAPO's
      token-level loss). Without ``num_tokens``: this micro-batch's tokens (= ``bnpo``);
    * ``grpo``, ``sapo``: ``(1/B') sum_i (sum_t m_it l_it / sum_t m_it)`` over the ``B'`` rows with a real token:
      every reply weighs the same (GRPO as published; longer replies' tokens weigh less);
    * ``dr_grpo``: ``sum_{i,t} m l / (B * max_new_tokens)``: a constant denominator (no length bias);
    * ``luspo``: ``(1/B') sum_i sum_t m_it l_it``: each reply's loss scaled by its length.
    """
    keep = mask.bool()
    total = torch.where(keep, per_token, torch.zeros((), dtype=per_token.dtype, device=per_token.device))
    has_tokens = keep.any(-1)
    if loss_type == "bnpo" or (loss_type in ("dapo", "cispo", "vespo") and num_tokens is None):
        return masked_mean(per_token, mask)
    if loss_type in ("dapo", "cispo", "vespo"):
        return total.sum() / torch.as_tensor(num_tokens, dtype=total.dtype, device=total.device).clamp(min=1)
    if loss_type in ("grpo", "sapo"):
        return masked_mean(masked_mean(per_token, mask, dim=-1), has_tokens)
    if loss_type == "dr_grpo":
        if not max_new_tokens:
            raise ValueError("dr_grpo divides by the batch size times max_new_tokens: give max_new_tokens")
        return total.sum() / (per_token.size(0) * max_new_tokens)
    if loss_type == "luspo":
        return masked_mean(total.sum(-1), has_tokens)
    raise ValueError(f"unknown loss type {loss_type!r}; expected one of {LOSS_TYPES}")


def log_importance_weights(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor,
                           level: str = "token") -> torch.Tensor:
    """``log w`` of the policy ratio ``pi / pi_old``, 0 on padding.

    * ``token``: ``log w_it = logp_it - old_it`` (``[B, T]``), PPO's and GRPO's ratio;
    * ``sequence``: ``log w_i = (1/|y_i|) sum_t (logp_it - old_it)`` (``[B, 1]``, one ratio per reply, the
      geometric mean of its tokens' ratios: GSPO, Zheng et al. 2025, arXiv 2507.18071), whose gradient reaches
      every token of the reply.
    """
    # Zeroed on padding before any exp: garbage there could overflow, and a where()-masked inf still turns the
    # backward pass into nan.
    log_ratio = torch.where(mask.bool(), logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    if level == "token":
        return log_ratio
    if level == "sequence":
        return masked_mean(log_ratio, mask, dim=-1).unsqueeze(-1)
    raise ValueError(f"unknown importance sampling level {level!r}; expected one of {IMPORTANCE_LEVELS}")


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float, epsilon_high: float,
                      delta: float | None = None) -> torch.Tensor:
    """PPO's clipped surrogate per token (Schulman et al. 2017), with DAPO's clip-higher and INTELLECT-2's
    two-sided clip: ``-min(r' A, clip(r, 1 - eps_low, 1 + eps_high) A)`` with ``r' = min(r, delta)`` when
    ``delta`` is given (else ``r' = r``). The min takes the pessimistic bound: a token whose ratio has already
    moved past the clip in the advantage's direction gets no gradient; ``delta`` also bounds the step of a
    token with a negative advantage whose ratio has grown large."""
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    unclipped = ratio if delta is None else torch.clamp(ratio, max=delta)
    return -torch.minimum(unclipped * advantages, clipped * advantages)


def cispo_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, logprobs: torch.Tensor,
                    epsilon_high: float) -> torch.Tensor:
    """CISPO (MiniMax-M1, arXiv 2506.13585): clip the importance weight, not the update, and keep every token's
    gradient: ``-sg(min(r, 1 + eps_high)) A logp`` (``sg``: no gradient). TRL names the cap itself
    (``epsilon_high`` 5.0 there is ``--epsilon_high 4.0`` here)."""
    weight = torch.clamp(ratio, max=1.0 + epsilon_high).detach()
    return -weight * advantages * logprobs


def sapo_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, temperature_pos: float,
                   temperature_neg: float) -> torch.Tensor:
    """SAPO (arXiv 2511.20347): a smooth gate in place of the hard clip,
    ``-(4 / tau) sigmoid(tau (r - 1)) A`` with ``tau = tau_pos`` where ``A > 0`` and ``tau_neg`` elsewhere; its
    gradient is PPO's at ``r = 1`` (``4 sigmoid'(0) = 1``) and fades smoothly as ``r`` leaves 1."""
    tau = torch.where(advantages > 0, temperature_pos, temperature_neg)
    return -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * advantages


def vespo_weights(log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  vespo: tuple[float, float, float, float]) -> torch.Tensor:
    """VESPO's (arXiv 2602.10693) weight per reply ``[B, 1]``, no gradient: with the sequence ratio
    ``w = exp(clamp(sum_t log r_t, log 1e-8, 20))``, ``phi(w) = exp(lam + k log w - lam w)`` (a Gamma shape,
    ``phi(1) = 1``), ``(k, lam) = (k_pos, lam_pos)`` where ``A >= 0`` else ``(k_neg, lam_neg)``."""
    k_pos, lambda_pos, k_neg, lambda_neg = vespo
    with torch.no_grad():
        lower = math.log(1e-8)
        per_token = torch.where(mask.bool(), log_ratio.clamp(-20.0, 20.0), torch.zeros_like(log_ratio))
        log_w = per_token.sum(-1, keepdim=True).clamp(lower, 20.0)
        positive = advantages >= 0
        k = torch.where(positive, k_pos, k_neg)
        lam = torch.where(positive, lambda_pos, lambda_neg).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    spec: PolicyLossSpec,
    num_tokens: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss of ``spec.loss_type``: a per-token surrogate of the ratio ``r = exp(log w)``
    (:func:`log_importance_weights` at ``spec.importance_sampling_level``) averaged by :func:`aggregate_loss`.

    * ``dapo``, ``bnpo``, ``grpo``, ``dr_grpo``, ``luspo``: :func:`clipped_surrogate`;
    * ``cispo``: :func:`cispo_surrogate`; ``sapo``: :func:`sapo_surrogate`;
    * ``vespo``: ``-phi(w) A logp`` with :func:`vespo_weights` (token ratios summed per reply).

    ``advantages``: ``[B, T]`` or ``[B]`` (one per reply). ``mask``: the tokens that train (zero for padding,
    tool results, truncated replies or tokens the entropy filter drops). Stats (detached): ``clipfrac`` (the
    share of tokens whose gradient the clip cut: ``r < 1 - eps_low`` with ``A < 0`` or ``r > 1 + eps_high``
    with ``A > 0``; for cispo the share whose weight was capped; none for sapo and vespo), ``approx_kl =
    0.5 * mean((logp - old)^2)`` per token, ``ratio_mean``.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.detach()
    log_w = log_importance_weights(logprobs, old_logprobs, mask, spec.importance_sampling_level)
    ratio = torch.exp(log_w)
    kind = spec.loss_type
    if kind in CLIPPED_LOSSES:
        per_token = clipped_surrogate(ratio, advantages, spec.epsilon_low, spec.high, spec.delta)
        cut = ((ratio < 1 - spec.epsilon_low) & (advantages < 0)) | ((ratio > 1 + spec.high) & (advantages > 0))
    elif kind == "cispo":
        per_token = cispo_surrogate(ratio, advantages, logprobs, spec.high)
        cut = (ratio > 1 + spec.high) & (advantages > 0)
    elif kind == "sapo":
        per_token, cut = sapo_surrogate(ratio, advantages, spec.sapo_temperature_pos, spec.sapo_temperature_neg), None
    elif kind == "vespo":
        token_log_ratio = log_importance_weights(logprobs, old_logprobs, mask, "token")
        per_token = -vespo_weights(token_log_ratio, advantages, mask, spec.vespo) * advantages * logprobs
        cut = None
    else:
        raise ValueError(f"unknown loss type {kind!r}; expected one of {LOSS_TYPES}")
    per_token = per_token.expand_as(logprobs)
    loss = aggregate_loss(per_token, mask, kind, num_tokens, spec.max_new_tokens)
    with torch.no_grad():
        token_log_ratio = log_importance_weights(logprobs, old_logprobs, mask, "token")
        stats = {"approx_kl": 0.5 * masked_mean(token_log_ratio.square(), mask),
                 "ratio_mean": masked_mean(ratio.expand_as(logprobs), mask)}
        if cut is not None:
            stats["clipfrac"] = masked_mean(cut.expand_as(logprobs).to(logprobs.dtype), mask)
    return loss, stats


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float,
                      pool: torch.Tensor | None = None) -> torch.Tensor:
    """The tokens the policy loss keeps under "Beyond the 80/20 rule" (Wang et al. 2025, arXiv 2506.01939):
    ``m_it and H_it >= q``, ``q`` the ``(1 - quantile)`` quantile of the entropies ``H`` of the real tokens
    (``quantile`` 0.2: the 20% most uncertain tokens, the "forks" where reasoning branches). ``quantile`` 1.0
    keeps every real token; 0.0 keeps the most uncertain one(s). ``pool``: the entropies the quantile is taken
    over, when they are more than this batch's (every process's real tokens); default ``entropy[mask]``."""
    keep = mask.bool()
    pool = entropy[keep] if pool is None else pool
    if quantile >= 1.0 or not pool.numel():
        return keep
    threshold = torch.quantile(pool.float(), 1.0 - quantile)
    return keep & (entropy >= threshold)


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13), added to the reward: with ``L_max =
    max_new_tokens`` and ``L_cache = buffer``,
    ``0`` for ``|y| <= L_max - L_cache``, ``((L_max - L_cache) - |y|) / L_cache`` up to ``L_max`` (falling
    linearly to -1), and ``-1`` beyond."""
    lengths = lengths.float()
    start = max_new_tokens - buffer
    ramp = (start - lengths) / max(buffer, 1)
    return torch.where(lengths <= start, torch.zeros_like(lengths),
                       torch.where(lengths <= max_new_tokens, ramp, torch.full_like(lengths, -1.0)))


def varied_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO's dynamic sampling filter: ``[B / G]`` booleans, True for a group whose rewards are not all equal.
    A group of equal rewards has zero advantage under every group baseline, so it only dilutes the batch."""
    groups = scores.reshape(-1, group_size)
    return groups.amax(1) != groups.amin(1)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value-function loss.

    ``V_clip = old_V + clip(V - old_V, -eps, eps)``,
    ``loss = 0.5 * masked_mean(max((V - R)^2, (V_clip - R)^2))``.

    Stats (detached): ``vf_clipfrac`` = fraction of real tokens where the clipped term won.
    """
    old_values = old_values.detach()
    returns = returns.detach()
    values_clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    loss_unclipped = (values - returns).square()
    loss_clipped = (values_clipped - returns).square()
    loss = 0.5 * masked_mean(torch.maximum(loss_unclipped, loss_clipped), mask)
    with torch.no_grad():
        stats = {"vf_clipfrac": masked_mean((loss_clipped > loss_unclipped).to(values.dtype), mask)}
    return loss, stats


def kl_loss(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, kind: str = "k3",
    loss_type: str = "dapo", num_tokens: float | torch.Tensor | None = None, max_new_tokens: int | None = None,
) -> torch.Tensor:
    """The KL to the reference as a loss term (GRPO's way; PPO's puts it in the reward instead):
    ``aggregate_loss(per_token_kl(logp, ref_logp, kind), loss_type)``, averaged as the policy loss is, and
    differentiated through the policy's ``logp`` on the sampled tokens (the reference is fixed).

    Which estimator matters here, unlike in a reward: ``k1 = logp - ref`` has gradient ``grad logp``,
    whose expectation over the policy's own samples is 0 -- it penalises nothing. ``k3`` (the
    DeepSeekMath choice) has gradient ``(1 - exp(ref - logp)) grad logp``, which pulls each sampled
    token's probability towards the reference's; ``mse`` (``0.5 d^2``) does the same to first order.
    """
    ref_logprobs = ref_logprobs.detach()
    # Padding gets logp = ref (KL 0) before the estimator: an exp of garbage there could overflow, and
    # a where()-masked inf still turns the backward pass into nan.
    logprobs = torch.where(mask.bool(), logprobs, ref_logprobs)
    return aggregate_loss(per_token_kl(logprobs, ref_logprobs, kind), mask, loss_type, num_tokens, max_new_tokens)


# --------------------------------------------------------------------------- KL control


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning LMs from Human Preferences").

    ``e = clip(current_kl / target - 1, -0.2, 0.2)``,
    ``value <- value * (1 + e * n_steps / horizon)``.

    The clip bounds how fast the coefficient can react to one noisy KL measurement.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError("target and horizon must be positive")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


class FixedKLController:
    """Constant KL coefficient; ``update`` is a no-op so it can stand in for the adaptive one."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        return None


# --------------------------------------------------------------------------- EOS handling


def first_true_indices(bools: torch.Tensor) -> torch.Tensor:
    """Index of the first ``True`` along the last dim, or its length if there is none.

    ``idx = min_t (t if b_t else T)``, computed without a Python loop.
    """
    length = bools.size(-1)
    positions = torch.arange(length, device=bools.device)
    return torch.where(bools.bool(), positions, length).amin(-1)


def truncate_after_eos(
    response_ids: torch.Tensor, eos_token_ids: int | Sequence[int], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cut each response at its first EOS.

    Returns ``(ids, mask, ended)``:

    * ``ids``: tokens after the first EOS replaced by ``pad_token_id``;
    * ``mask`` (long, ``[B, T]``): 1 up to *and including* the first EOS, 0 after it, so
      the policy is trained on choosing to stop and the score lands on the EOS token;
    * ``ended`` (bool, ``[B]``): whether the row contained an EOS at all (rows that hit
      the length limit are often penalised by the trainer).
    """
    if isinstance(eos_token_ids, int):
        eos_token_ids = [eos_token_ids]
    eos = torch.as_tensor(list(eos_token_ids), dtype=response_ids.dtype, device=response_ids.device)
    first_eos = first_true_indices(torch.isin(response_ids, eos))
    positions = torch.arange(response_ids.size(-1), device=response_ids.device)
    keep = positions.unsqueeze(0) <= first_eos.unsqueeze(-1)
    ids = torch.where(keep, response_ids, torch.full_like(response_ids, pad_token_id))
    ended = first_eos < response_ids.size(-1)
    return ids, keep.long(), ended
