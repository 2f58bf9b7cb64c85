"""Per-token rewards of a reply: PPO's KL penalty on every token plus the score on the last, and DAPO's soft
penalty for replies that run too long."""

from __future__ import annotations

import torch

from .kl import per_token_kl


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
