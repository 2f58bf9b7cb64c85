"""Means, variances and whitening over the real tokens of right-padded ``[B, T]`` tensors: the statistics every
loss below averages with."""

from __future__ import annotations

import torch


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
