"""The causal-LM loss straight from the last hidden states: the LM head runs tile by tile and its logits never exist.

A packed SFT row computes logits for its trained positions only (data/packing.py), but those are still
[trained tokens, vocabulary]: 16,000 trained tokens of a long conversation are 1.6 GB of bf16 logits with SmolLM2's
49k vocabulary and 4.9 GB with Qwen2.5's 152k, and the loss's gradient buffer is as large again. That, not the layers,
is what stops a long conversation first once activations are checkpointed. Here the model's forward runs its backbone,
takes the hidden states of the trained positions, and hands them with the head's weight to TRL's
`ChunkedLogProbFunction`: online log-sum-exp over [4096 tokens x vocabulary chunk] tiles in float32 (a Triton kernel
on CUDA, torch elsewhere), the tiles recomputed in backward and turned into the gradient in place, accumulated in
float32. Memory is the hidden states' size; the price is the head's product run once more in backward.

Used when a forward's logits would hold more than FUSED_HEAD_ELEMENTS values (StageTrainer decides per forward): short
forwards keep the logits path, whose single head product is faster, and whose loss is the same (tests/core/train/test_head_loss.py
compares loss and gradients on every model type below). Only for model types whose forward does nothing to the logits
but the transforms below (final soft-capping, a scale): any other model keeps the logits path. Not while the router
logits of a mixture of experts are asked for (the aux loss is the model's own function of them), nor where the head's
weight is sharded (ZeRO-3, FSDP), which the tiles would read outside the head's forward: the logits path."""

from __future__ import annotations

import functools
import types
from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..families import types_where
from ..models.moe import causal_lm

FUSED_HEAD = "fused_head"  # the forward's keyword that asks for the loss from the hidden states
# Logits of more values than this in one forward go through the tiles: 64M values, 128 MB in bf16 (about 1,300 trained
# tokens of SmolLM2's vocabulary, 440 of Qwen2.5's).
FUSED_HEAD_ELEMENTS = 1 << 26
# Columns of a tile. TRL's SFT loss takes 32,768: a tile of 4,096 tokens is then 256 MB in bf16, and its float32
# temporaries on CPU several times that; 4,096 keeps them at 32 MB a copy, at a few more kernel calls.
VOCAB_CHUNK = 4096

# Model types whose causal-LM forward turns the head's output into logits with at most a final soft-cap
# (`final_logit_softcapping`) and a scale (`logit_scale`, or 1 / `logits_scaling`), read from the config: the
# registry's `plain_head` (families.py).
PLAIN_HEAD_TYPES = frozenset(types_where("plain_head"))


def head_transform(config: Any) -> tuple[float | None, float]:
    """(final soft-cap or None, logit scale) of a causal LM's config, as its forward applies them."""
    softcap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", None)
    if scale is None and getattr(config, "logits_scaling", None):
        scale = 1 / config.logits_scaling  # Granite divides
    return softcap, 1.0 if scale is None else float(scale)


def supports_fused_head(model: nn.Module) -> bool:
    base = causal_lm(model)
    config = getattr(base, "config", None)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    return (getattr(config, "model_type", None) in PLAIN_HEAD_TYPES and isinstance(head, nn.Linear)
            and hasattr(base, getattr(base, "base_model_prefix", "") or "-"))


def install_fused_head(model: nn.Module) -> bool:
    """Let `model(..., fused_head=True)` (through PEFT and DDP alike, as a keyword) compute its loss with the tiled
    head: a batch then needs `logits_to_keep` (positions) and `shift_labels` (their targets), as PackingCollator gives
    them. Returns False, changing nothing, for a model outside PLAIN_HEAD_TYPES."""
    if not supports_fused_head(model):
        return False
    base = causal_lm(model)
    if getattr(base.forward, "fused_head", False):
        return True
    if not isinstance(base.forward, types.MethodType):
        return False
    # The unbound function, called on `self`: a closure over the bound method would make a deep copy of the model
    # (a quantized copy, a DPO reference) run the original model's layers, not its own.
    original = base.forward.__func__
    softcap, scale = head_transform(base.config)

    @functools.wraps(original)
    def forward(self, *args: Any, fused_head: bool = False, **kwargs: Any):
        if not fused_head:
            return original(self, *args, **kwargs)
        positions, targets = kwargs.pop("logits_to_keep"), kwargs.pop("shift_labels")
        num_items = kwargs.pop("num_items_in_batch", None)
        kwargs.pop("labels", None)
        hidden = getattr(self, self.base_model_prefix)(*args, **kwargs).last_hidden_state
        head = self.get_output_embeddings()
        loss = -tiled_log_probs(hidden[0, positions], head, targets.to(hidden.device), softcap, scale).sum()
        if num_items is None:
            num_items = targets.numel()
        elif torch.is_tensor(num_items):
            num_items = num_items.to(loss.device)
        return CausalLMOutputWithPast(loss=loss / num_items)

    forward.fused_head = True
    base.forward = types.MethodType(forward, base)
    return True


def tiled_log_probs(hidden: torch.Tensor, head: nn.Module, targets: torch.Tensor, softcap: float | None,
                    scale: float) -> torch.Tensor:
    """log p(target) for each row of `hidden` [tokens, hidden] under the head `head` (weight [vocab, hidden]),
    never holding more than one tile of logits."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    return ChunkedLogProbFunction.apply(hidden, head.weight, head.bias, targets, 1.0, VOCAB_CHUNK, softcap, scale,
                                        ("log_probs",))[0]


def wants_fused_head(batch: dict[str, Any], vocab_size: int, any_size: bool = False) -> bool:
    """Whether a forward's logits (its kept positions x the vocabulary) are large enough to go through the tiles;
    `any_size`: whether its loss can go through them at all (a packed row's trained positions)."""
    positions = batch.get("logits_to_keep")
    return (torch.is_tensor(positions) and positions.dim() == 1 and "shift_labels" in batch
            and (any_size or positions.numel() * vocab_size > FUSED_HEAD_ELEMENTS))
