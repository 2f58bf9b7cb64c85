"""Attention kernels tunesmith registers with transformers: `sdpa_varlen`, torch's SDPA run once per example
of a padding-free packed row (data/packing.py), the maths of flash attention's varlen kernel on any device,
so a packed row costs the sum of its examples' attention rather than the square of its length."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

VARLEN_SDPA = "sdpa_varlen"


def sdpa_varlen_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, run once per example of a packed row (from `cu_seq_lens_q`)
    with a plain causal mask; anything else (padded batches, generation) goes to sdpa unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    packed = cu_seq_lens_q is not None and query.shape[0] == 1 and query.shape[2] == key.shape[2] > 1
    if not packed or int(cu_seq_lens_q[-1]) != query.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    bounds = cu_seq_lens_q.tolist()
    outputs = [
        sdpa_attention_forward(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None,
                               dropout=dropout, scaling=scaling, **kwargs)[0]
        for s, e in zip(bounds[:-1], bounds[1:])
    ]
    return torch.cat(outputs, dim=1), None  # [batch, tokens, heads, head_dim], as sdpa returns


def register_varlen_attention() -> None:
    """Make `sdpa_varlen` a valid attn_implementation (masks as for sdpa, used when not packed)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(VARLEN_SDPA, sdpa_varlen_attention_forward)
    AttentionMaskInterface.register(VARLEN_SDPA, sdpa_mask)


def use_varlen_attention(model: nn.Module) -> str:
    """Switch a model on sdpa to sdpa_varlen; flash attention (varlen already) and eager (the library's
    block-diagonal mask) stay as they are. Returns the implementation the model now uses."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    current = base.config._attn_implementation
    if current == "sdpa":
        register_varlen_attention()
        base.set_attn_implementation(VARLEN_SDPA)
        return VARLEN_SDPA
    return current
