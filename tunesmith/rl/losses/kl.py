"""KL(policy || reference) from sampled tokens' log-probabilities: the estimators, the KL as a loss term (GRPO), and
the coefficient of the KL penalty in the reward (PPO), fixed or adaptive."""

from __future__ import annotations

import torch

from .policy import aggregate_loss

KL_KINDS = ("k1", "abs", "mse", "k3")


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
