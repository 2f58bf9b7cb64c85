"""Truncated importance sampling (TIS: Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy
RL training"; verl's `tis_imp_ratio_cap`, TRL's `vllm_importance_sampling_mode="token_truncate"`): when the replies
were sampled by another engine (a vLLM server: other kernels, other precision, or the weights of one step before
with asynchronous rollouts), the tokens came from ``pi_rollout``, not from the trainer's ``pi_old``. Each token's
policy loss is weighed by

    w_t = min(pi_old(y_t) / pi_rollout(y_t), C) = min(exp(log pi_old - log pi_rollout), C)

(no gradient), which corrects the expectation towards ``pi_old`` while the cap ``C`` bounds the variance a token
that the server found unlikely could add."""

from __future__ import annotations

import torch

from .masked import masked_mean


def truncated_importance_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
                                 cap: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``w = min(exp(old - rollout), cap)`` per token ``[B, T]`` (1 on padding and where the rollout engine gave no
    log-probability, NaN), and its statistics over the real tokens: ``is_ratio_mean``, ``is_ratio_max`` (of the
    uncapped ratio), ``is_capped`` (the share of tokens at the cap) and ``rollout_logp_diff`` (mean ``|old -
    rollout|``)."""
    keep = mask.bool() & ~torch.isnan(rollout_logprobs)
    diff = torch.where(keep, old_logprobs.detach() - rollout_logprobs, torch.zeros_like(old_logprobs))
    ratio = torch.exp(diff.clamp(max=20.0))
    weights = torch.where(keep, ratio.clamp(max=cap), torch.ones_like(ratio))
    zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    stats = {
        "is_ratio_mean": masked_mean(ratio, keep) if keep.any() else zero + 1,
        "is_ratio_max": ratio[keep].max() if keep.any() else zero + 1,
        "is_capped": masked_mean((ratio > cap).to(ratio.dtype), keep) if keep.any() else zero,
        "rollout_logp_diff": masked_mean(diff.abs(), keep) if keep.any() else zero,
    }
    return weights, stats
