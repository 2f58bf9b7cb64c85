"""Advantages: GAE over a value model's estimates (PPO), and the group baselines of the critic-free methods, each
reply's reward against the other replies to its prompt (GRPO, RLOO, Dr. GRPO, GDPO), with DAPO's filter of groups
that say nothing."""

from __future__ import annotations

import torch

REWARD_SCALINGS = ("group", "batch", "none")
REWARD_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


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


def varied_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO's dynamic sampling filter: ``[B / G]`` booleans, True for a group whose rewards are not all equal.
    A group of equal rewards has zero advantage under every group baseline, so it only dilutes the batch."""
    groups = scores.reshape(-1, group_size)
    return groups.amax(1) != groups.amin(1)
