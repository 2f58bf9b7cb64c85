"""The decoder layers' MLP run over chunks of the sequence, forward and backward (`--tiled_mlp`): its intermediate
activations are one chunk's, never the whole row's. ALST's sequence tiling (arXiv 2506.13996, "Tiled MLP compute").

Once the layers are checkpointed, the peak of a long row's step is one layer's recomputation and backward, and there
the MLP's intermediate activations dominate: gate, up, their activation and product are [tokens, intermediate_size]
each (14,336 for a Llama-3.1-8B shape, 3.5x the hidden size), where the layer's input is [tokens, hidden_size]. An
MLP whose every token is computed on its own (no mixing along the sequence) gives the same output and gradients when
run chunk by chunk. Here each chunk runs under torch's non-reentrant checkpoint: the forward keeps only the chunk's
input (a view of the MLP's input, which the untiled MLP keeps too) and the backward recomputes one chunk at a time,
the autograd engine finishing each chunk's backward before it starts the next (its nodes were made later). The price
is one more MLP forward per step (three in all instead of two under layer checkpointing). Under ZeRO-3 and FSDP2 the
chunks run the MLP's own layers, whose hooks gather the sharded weights.

Why not DeepSpeed's `TiledMLP` (deepspeed/runtime/sequence_parallel/ulysses_sp.py), which tiles the same way: its
backward recomputes each shard with no record of the random state, so LoRA's dropout (tunesmith's default 0.05) draws
other masks than the forward did and the gradients are not those of the loss computed; and it accumulates the
parameters' gradients with a nested `torch.autograd.backward` per shard, so a parameter is reported ready once per
shard, which DDP's reducer refuses (its own comment: "DDP, FSDP will need something similar"). torch's checkpoint
restores the random state per chunk, and the parameters' gradients flow through the one autograd graph (summed by the
engine, reported once). A packed row [1, tokens, hidden] fits either.

The layers' norms (RMSNorm, LayerNorm: every module of a decoder layer whose class name ends in "Norm", Qwen3's and
OLMo 2's per-head q/k norms included) and the final norm before the head run the same way, for the same reason at a smaller scale: each normalizes a token
over its last dimension, in float32. Untiled, the backward of one norm of a checkpointed layer holds about eight
float32 copies of the row at once (the upcast input, its square, their products and gradients): 128 KB a token for
a hidden size of 4,096, the largest part of a 400,000-token step's peak (counted by `tunesmith plan`: 51 of 64 GB at
the peak of one layer's backward). Tiled, one chunk's; a frozen norm's gradients (LoRA, QLoRA) are bitwise the
untiled ones, a trained norm's weight gradient is summed chunk by chunk (float rounding).

Chunks: ceil(tokens / hidden_size), DeepSpeed's and ALST's rule: a chunk of hidden_size tokens holds intermediates of
hidden_size x intermediate_size values, the size of one of the MLP's weight matrices, so the MLP's working set no
longer grows with the row, and chunks stay large enough for full-speed matrix products. A forward of hidden_size
tokens or fewer runs untiled (one chunk would only add the recomputation)."""

from __future__ import annotations

import functools
import logging
import math
import types
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import ConfigError
from ..families import types_where
from ..utils.config_facts import config_fact
from .moe import EXPERT_COUNT_FIELDS, causal_lm

logger = logging.getLogger(__name__)

# Model types whose decoder layers' `mlp` computes each token on its own: a gated or plain MLP and nothing else (the
# registry's `position_wise_mlp`, families.py).
TILED_MLP_TYPES = frozenset(types_where("position_wise_mlp"))


def tiled_mlp_problem(config: Any) -> str | None:
    """Why `--tiled_mlp` cannot run on a model of this config (a config object or config.json's dict), or None
    where it can."""
    model_type = config_fact(config, "model_type")
    if model_type in TILED_MLP_TYPES:
        return None
    if any(isinstance(n := config_fact(config, name), int) and n > 1 for name in EXPERT_COUNT_FIELDS):
        return (f"model type {model_type} routes tokens to experts, and its router's load-balancing loss is taken "
                "over the whole sequence's routing: its MoE layers are not tiled")
    return f"model type {model_type} is not among those whose MLP is known to be position-wise"


def mlp_chunks(tokens: int, hidden_size: int) -> int:
    """How many chunks a forward of `tokens` tokens runs its MLP in: ceil(tokens / hidden_size)."""
    return max(1, math.ceil(tokens / hidden_size))


def tiled(module: nn.Module, hidden_size: int) -> types.MethodType:
    """`module`'s forward (a position-wise MLP's or norm's, on [..., hidden]) run over chunks of its tokens, bound to
    the module. Its function is called on `self`, not closed over bound: a deep copy of the model (a quantized copy, a
    DPO reference) then runs its own MLPs, not the original's. A forward that is not a bound method (a hook's wrapper)
    is called as it is."""
    mlp_forward = module.forward
    if isinstance(mlp_forward, types.MethodType):
        function = mlp_forward.__func__
    else:
        def function(_: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
            return mlp_forward(hidden_states)

    @functools.wraps(function)
    def forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        rows = hidden_states.reshape(-1, hidden_states.shape[-1])  # a padded batch's tokens are position-wise too
        chunks = mlp_chunks(rows.shape[0], hidden_size)
        if chunks == 1:
            return function(self, hidden_states)
        if torch.is_grad_enabled():
            outputs = [checkpoint(function, self, piece, use_reentrant=False) for piece in rows.chunk(chunks)]
        else:  # nothing is kept for a backward: the chunks only bound the forward's intermediates
            outputs = [function(self, piece) for piece in rows.chunk(chunks)]
        return torch.cat(outputs).view(*hidden_states.shape[:-1], -1)

    forward.tiled_mlp = True
    return types.MethodType(forward, module)


def install_tiled_mlp(model: nn.Module) -> int:
    """Make every decoder layer's MLP of `model` (a transformers model, or PEFT's around one; LoRA and 4-bit layers
    inside the MLP run as they are) run sequence-tiled. Returns the number of MLPs tiled; ConfigError, changing
    nothing, for a model type outside TILED_MLP_TYPES."""
    base = causal_lm(model)
    problem = tiled_mlp_problem(base.config)
    if problem:
        raise ConfigError(f"--tiled_mlp: {problem}; tiled are {', '.join(sorted(TILED_MLP_TYPES))}. Drop --tiled_mlp.")
    hidden_size = config_fact(base.config, "hidden_size")
    decoder = base.get_decoder()
    layers = decoder.layers
    final_norms = [m for m in decoder.children() if is_norm(m)]  # before the head: a row too
    for module in [layer.mlp for layer in layers] + [n for layer in layers for n in layer_norms(layer)] + final_norms:
        if not getattr(module.forward, "tiled_mlp", False):
            module.forward = tiled(module, hidden_size)
    return len(layers)


def is_norm(module: nn.Module) -> bool:
    """A position-wise norm: its class name ends in "Norm" (LlamaRMSNorm, Gemma3RMSNorm, nn.LayerNorm,
    CohereLayerNorm...)."""
    return type(module).__name__.endswith("Norm")


def layer_norms(layer: nn.Module) -> list[nn.Module]:
    """The norms of a decoder layer, attention's per-head norms included."""
    return [m for m in layer.modules() if is_norm(m)]


def use_tiled_mlp(model: nn.Module, training_args: Any) -> None:
    """install_tiled_mlp where the training arguments ask for it (`--tiled_mlp true`)."""
    if getattr(training_args, "tiled_mlp", False) is True:
        layers = install_tiled_mlp(model)
        hidden_size = config_fact(causal_lm(model).config, "hidden_size")
        logger.info("--tiled_mlp: the MLP and norms of %d decoder layers run over chunks of %d tokens (a forward of "
                    "more)",
                    layers, hidden_size)
