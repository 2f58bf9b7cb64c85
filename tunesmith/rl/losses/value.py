"""PPO's value-function loss, clipped around the rollout's values."""

from __future__ import annotations

import torch

from .masked import masked_mean


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
