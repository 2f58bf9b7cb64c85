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

from collections.abc import Sequence

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
    "LOSS_AGGREGATIONS",
]

KL_KINDS = ("k1", "abs", "mse", "k3")
LOSS_AGGREGATIONS = ("token", "sequence")

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


# --------------------------------------------------------------------------- losses


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, how: str = "token") -> torch.Tensor:
    """Average a per-token loss ``[B, T]`` over the real tokens of a batch, in one of two ways:

    * ``"token"``: ``sum_{i,t} m_it l_it / sum_{i,t} m_it`` -- every token weighs the same, so a long
      reply moves the policy more than a short one (DAPO's token-level loss);
    * ``"sequence"``: ``(1/B') sum_i (sum_t m_it l_it / sum_t m_it)`` over the ``B'`` rows with at least
      one real token -- every reply weighs the same, its tokens share its weight (GRPO as published).

    The two agree when every reply has the same length.
    """
    if how == "token":
        return masked_mean(per_token, mask)
    if how == "sequence":
        has_tokens = mask.bool().any(-1)
        return masked_mean(masked_mean(per_token, mask, dim=-1), has_tokens)
    raise ValueError(f"unknown loss aggregation {how!r}; expected one of {LOSS_AGGREGATIONS}")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float,
    aggregation: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss (Schulman et al. 2017).

    ``ratio = exp(logp - old_logp)``,
    ``loss = aggregate_loss(max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)), aggregation)``
    (``"token"``: the masked mean over every real token of the batch).

    Stats (detached): ``clipfrac`` = fraction of real tokens where the clipped term won,
    ``approx_kl = 0.5 * masked_mean((logp - old_logp)^2)``, ``ratio_mean``.
    """
    keep = mask.bool()
    # Zero the log-ratio on padding *before* exp: garbage there could overflow to inf,
    # and even a where()-masked inf turns into nan in the backward pass.
    log_ratio = torch.where(keep, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    advantages = advantages.detach()
    pg_unclipped = -advantages * ratio
    pg_clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    # max of the two negated objectives = pessimistic (lower) bound on the improvement.
    loss = aggregate_loss(torch.maximum(pg_unclipped, pg_clipped), mask, aggregation)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((pg_clipped > pg_unclipped).to(logprobs.dtype), mask),
            "approx_kl": 0.5 * masked_mean(log_ratio.square(), mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return loss, stats


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
    aggregation: str = "token",
) -> torch.Tensor:
    """The KL to the reference as a loss term (GRPO's way; PPO's puts it in the reward instead):
    ``aggregate_loss(per_token_kl(logp, ref_logp, kind), aggregation)``, differentiated through the
    policy's ``logp`` on the sampled tokens (the reference is fixed).

    Which estimator matters here, unlike in a reward: ``k1 = logp - ref`` has gradient ``grad logp``,
    whose expectation over the policy's own samples is 0 -- it penalises nothing. ``k3`` (the
    DeepSeekMath choice) has gradient ``(1 - exp(ref - logp)) grad logp``, which pulls each sampled
    token's probability towards the reference's; ``mse`` (``0.5 d^2``) does the same to first order.
    """
    ref_logprobs = ref_logprobs.detach()
    # Padding gets logp = ref (KL 0) before the estimator: an exp of garbage there could overflow, and
    # a where()-masked inf still turns the backward pass into nan.
    logprobs = torch.where(mask.bool(), logprobs, ref_logprobs)
    return aggregate_loss(per_token_kl(logprobs, ref_logprobs, kind), mask, aggregation)


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
