"""What the hardware computes natively, for the choices `auto` makes (precision, kernels)."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch


def trains_on_cpu(training_args: Any = None) -> bool:
    """A run with these training arguments (None: no training) computes on the CPU: asked to with
    --use_cpu, or there is no CUDA device."""
    return bool(getattr(training_args, "use_cpu", False)) or not torch.cuda.is_available()


def native_bf16(on_cpu: bool) -> bool:
    """bfloat16 matrix products run in hardware: a CUDA GPU that supports bf16, or a CPU with AVX512-BF16
    or AMX (Intel Cooper Lake / Sapphire Rapids and later, AMD Zen 4 and later). Elsewhere torch emulates
    bf16 on CPU, slower than float32, so `auto` stays in float32 there."""
    if not on_cpu:  # not torch's default including_emulation=True, which says yes on a T4 or V100 (emulated bf16)
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def flash_attention_usable() -> bool:
    """attn_implementation flash_attention_2 can run here: the flash-attn package is installed and a CUDA GPU is
    there (what --attn_implementation auto picks it by, and flash_attention_2 needs)."""
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def liger_kernel_usable() -> bool:
    """--use_liger_kernel can run here: the liger-kernel package is installed (transformers' Trainer applies its
    kernels) and a CUDA GPU is there (its kernels are Triton's, GPU only)."""
    return torch.cuda.is_available() and importlib.util.find_spec("liger_kernel") is not None
