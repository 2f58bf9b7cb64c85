"""Attention kernels tunesmith registers with transformers for padding-free packed rows (data/packing.py):
`sdpa_varlen` runs each example of a row with a causal mask of its own, so a packed row costs the sum of its
examples' attention rather than the square of its length. Which kernel does that depends on the device and is
chosen in one place (`packed_kernel`):

- on CUDA, in half precision (float32 inputs under autocast included): torch's own flash-attention varlen
  kernel (the one behind its nested-tensor SDPA), one call for the whole row from `cu_seq_lens_q`, with `max_length_q` from the collator, so no
  host-device synchronisation; no flash-attn package needed;
- elsewhere (CPU, float32): torch's SDPA once per example, a Python loop whose per-call overhead is small next
  to a CPU's maths (measured in docs/benchmark.md) but which leaves a GPU waiting on the host.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

VARLEN_SDPA = "sdpa_varlen"
FLASH_VARLEN, SDPA_PER_EXAMPLE = "torch flash-attention varlen kernel (one call per row)", "SDPA per example"
_reported: set[str] = set()


def attention_dtype(query: torch.Tensor) -> torch.dtype:
    """The precision attention computes in: under CUDA autocast, float32 inputs go to the autocast dtype, as
    torch's SDPA casts them there (a QLoRA model's 4-bit layers return float32, and its upcast norms keep the
    residual stream there); otherwise the inputs' own."""
    if query.is_cuda and query.dtype == torch.float32 and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return query.dtype


def packed_kernel(query: torch.Tensor, key: torch.Tensor) -> str:
    """The kernel a packed row's attention runs on: FLASH_VARLEN where torch's flash kernel takes these
    tensors (CUDA, float16/bfloat16 inputs or autocast to them, head size a multiple of 8 up to 256, heads a
    multiple of the key's), else SDPA_PER_EXAMPLE."""
    head_dim = query.shape[-1]
    fits = (query.is_cuda and attention_dtype(query) in (torch.float16, torch.bfloat16) and key.dtype == query.dtype
            and head_dim % 8 == 0 and head_dim <= 256 and query.shape[1] % key.shape[1] == 0
            and torch.backends.cuda.is_flash_attention_available() and torch.backends.cuda.flash_sdp_enabled())
    return FLASH_VARLEN if fits else SDPA_PER_EXAMPLE


def flash_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_lens: torch.Tensor,
                 max_length: int, dropout: float, scaling: float | None) -> torch.Tensor:
    """Causal attention within each example of one packed row, [1, heads, tokens, dim] in (grouped key/value
    heads as they are), [1, tokens, heads, dim] out. torch's kernel takes [tokens, heads, dim] and the
    examples' cumulative lengths (int32), as flash-attn's flash_attn_varlen_func does; autograd has its
    backward."""
    dtype = attention_dtype(query)
    q, k, v = (t[0].transpose(0, 1).to(dtype).contiguous() for t in (query, key, value))
    cu = cu_seq_lens.to(device=q.device, dtype=torch.int32)
    out = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_length, max_length, dropout, True, False,
                                                  scale=scaling)[0]
    return out.unsqueeze(0)


def sdpa_varlen_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention within each example of a packed row (from `cu_seq_lens_q`), on the kernel `packed_kernel`
    picks; anything else (padded batches, generation) goes to transformers' sdpa unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    packed = cu_seq_lens_q is not None and query.shape[0] == 1 and query.shape[2] == key.shape[2] > 1
    if not packed or cu_seq_lens_q.numel() < 2:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kernel = packed_kernel(query, key)
    if kernel not in _reported:  # once per process: which kernel a run's packed rows attend with
        _reported.add(kernel)
        logger.info("packed rows attend with %s", kernel)
    if kernel == FLASH_VARLEN:
        if not isinstance(max_length_q, int):  # the collators give it; a caller without it pays one sync
            max_length_q = int((cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]).max())
        return flash_varlen(query, key, value, cu_seq_lens_q, max_length_q, dropout, scaling), None
    bounds = cu_seq_lens_q.tolist()
    if bounds[-1] != query.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
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
