"""The policy loss: PPO's clipped surrogate and the GRPO family (DAPO, Dr. GRPO, BNPO, GSPO/LUSPO, CISPO, SAPO,
VESPO), each a per-token surrogate of the importance ratio averaged as its paper does."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .masked import masked_mean

# Each loss type: how the per-token surrogate is formed and how it is averaged (aggregate_loss).
# The papers: grpo (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300), dapo (Yu et al. 2025, DAPO, arXiv
# 2503.14476), dr_grpo (Liu et al. 2025, Dr. GRPO, arXiv 2503.20783), bnpo (TRL's batch-normalised GRPO),
# cispo (MiniMax 2025, MiniMax-M1, arXiv 2506.13585), sapo (Gao et al. 2025, SAPO, arXiv 2511.20347), luspo
# (LUSPO, arXiv 2602.05261), vespo (VESPO, arXiv 2602.10693).
LOSS_TYPES = ("dapo", "bnpo", "grpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo")
CLIPPED_LOSSES = ("dapo", "bnpo", "grpo", "dr_grpo", "luspo")  # PPO's clipped surrogate, averaged differently


IMPORTANCE_LEVELS = ("token", "sequence")


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
    token_weights: torch.Tensor | None = None,
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
    0.5 * mean((logp - old)^2)`` per token, ``ratio_mean``. ``token_weights`` ``[B, T]`` (no gradient): each
    token's surrogate is multiplied by its weight before the average (truncated importance sampling of replies
    another engine sampled: off_policy.py).
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
    if token_weights is not None:
        per_token = per_token * token_weights.detach()
    loss = aggregate_loss(per_token, mask, kind, num_tokens, spec.max_new_tokens)
    with torch.no_grad():
        token_log_ratio = log_importance_weights(logprobs, old_logprobs, mask, "token")
        stats = {"approx_kl": 0.5 * masked_mean(token_log_ratio.square(), mask),
                 "ratio_mean": masked_mean(ratio.expand_as(logprobs), mask)}
        if cut is not None:
            stats["clipfrac"] = masked_mean(cut.expand_as(logprobs).to(logprobs.dtype), mask)
    return loss, stats
