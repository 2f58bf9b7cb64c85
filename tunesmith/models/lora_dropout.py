"""LoRA's input dropout, for CPU training, drawing about p random numbers per element instead of one.

torch's CPU dropout draws one float per element from a single-threaded Mersenne Twister
(`bernoulli_`), and PEFT applies it to the input of every LoRA layer: on SmolLM2-135M with LoRA on
every linear layer that was a fifth of a training step in float32 and a third in bf16 (profiled; see
docs/benchmark.md). LoRA's dropout is small (0.05 is usual), so this draws where the drops go instead:
K ~ Poisson(n * lam) positions uniform on the n elements, with lam = -log(1 - p), and drops every
position drawn at least once. By Poisson thinning the number of draws landing on each element is
Poisson(lam), independently across elements, so each element is dropped with probability
1 - exp(-lam) = p, independently: exactly nn.Dropout's distribution, from about n * lam draws
(0.05 n for p = 0.05). Kept elements are scaled by 1 / (1 - p); backward multiplies by the saved
boolean mask, as torch's own dropout does.

On a GPU torch's Philox dropout is already fast; this is used on CPU only (loader.load_model).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def keep_mask(shape: torch.Size, p: float, device: torch.device | None = None) -> torch.Tensor:
    """A boolean mask, each element False (dropped) with probability p, independently."""
    n = shape.numel()
    mask = torch.ones(n, dtype=torch.bool, device=device)
    if n and p > 0:
        rate = torch.tensor([n * -math.log1p(-p)], dtype=torch.float64)
        draws = int(torch.poisson(rate).item())
        mask[torch.randint(0, n, (draws,), device=device)] = False
    return mask.view(shape)


class _KeepAndScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


class FastDropout(nn.Dropout):
    """nn.Dropout, drawing the dropped positions (keep_mask)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if self.p >= 1:
            return x * 0
        keep = keep_mask(x.shape, self.p, x.device)
        return _KeepAndScale.apply(x, keep, 1.0 / (1.0 - self.p))


def use_fast_lora_dropout(model: nn.Module) -> int:
    """Swap the nn.Dropout of every PEFT LoRA layer for FastDropout; returns how many were swapped.
    The adapter's config and saved weights do not change (dropout has no weights)."""
    swapped = 0
    for module in model.modules():
        dropouts = getattr(module, "lora_dropout", None)
        if not isinstance(dropouts, nn.ModuleDict):
            continue
        for name, dropout in list(dropouts.items()):
            if type(dropout) is nn.Dropout and dropout.p > 0:
                dropouts[name] = FastDropout(dropout.p)
                swapped += 1
    return swapped


class _CastOutsideAutocast:
    """PEFT casts a LoRA layer's input to the adapter's float32 when `cast_input_dtype_enabled` is
    truthy. Under autocast (CPU or CUDA) that copy (and its backward) is wasted: autocast casts it back to
    bf16 for the product. This flag is truthy only outside autocast, where the cast is needed."""

    def __bool__(self) -> bool:
        return not (torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"))


def skip_input_casts_under_autocast(model: nn.Module) -> None:
    for module in model.modules():
        if hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = _CastOutsideAutocast()
