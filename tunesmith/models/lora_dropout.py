"""LoRA's input dropout, for CPU training, with the random numbers drawn four times faster.

torch's CPU dropout draws one float per element from a single-threaded Mersenne Twister
(`bernoulli_`), and PEFT applies it to the input of every LoRA layer: on SmolLM2-135M with LoRA on
every linear layer that was a fifth of a training step in float32 and a third in bf16 (profiled; see
docs/benchmark.md). Here one 64-bit draw makes four 15-bit uniforms u in [0, 32768), and an element is
kept when u >= round(p * 32768): the same Bernoulli dropout with p rounded to a multiple of 2^-15
(0.05 -> 0.04999), kept elements scaled by 1 / (1 - p_rounded) so that E[dropout(x)] = x exactly.
Backward multiplies by the saved boolean mask, as torch's own dropout does.

On a GPU torch's Philox dropout is already fast; this is used on CPU only (loader._attach_lora).
"""

from __future__ import annotations

import torch
from torch import nn

RESOLUTION = 1 << 15  # 15 bits per draw: int64 random_() is uniform on [0, 2^63), so its top int16 has 15


def keep_mask(shape: torch.Size, p: float, device: torch.device | None = None) -> torch.Tensor:
    """A boolean mask, each element True with probability 1 - round(p * 2^15) / 2^15, independently."""
    n = shape.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_()
    uniforms = words.view(torch.int16)[:n].view(shape) & (RESOLUTION - 1)
    return uniforms >= round(p * RESOLUTION)


def rounded_p(p: float) -> float:
    return round(p * RESOLUTION) / RESOLUTION


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
    """nn.Dropout with keep_mask's draws (p rounded to a multiple of 2^-15)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = keep_mask(x.shape, self.p, x.device)
        return _KeepAndScale.apply(x, keep, 1.0 / (1.0 - rounded_p(self.p)))


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
    truthy. Under CPU autocast that copy (and its backward) is wasted: autocast casts it back to bf16 for
    the product. This flag is truthy only outside autocast, where the cast is needed."""

    def __bool__(self) -> bool:
        return not torch.is_autocast_enabled("cpu")


def skip_input_casts_under_autocast(model: nn.Module) -> None:
    for module in model.modules():
        if hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = _CastOutsideAutocast()
