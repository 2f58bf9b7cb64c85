"""What each decoder layer does with its activations in one forward, chosen from the memory a forward may take.

A layer can keep its activations for backward (fastest), keep only its input and recompute the rest in backward
(checkpointing: about a third more of that layer's compute), or also move that input to pinned host memory until
backward (offloading: a copy each way besides). With `--gradient_checkpointing` left out on a GPU, SFT's packed rows
start every layer recomputed and let train/forward_budget.py choose per forward, from measured rates:

    bytes a forward holds at its peak  ~=  tokens x (recomputed + kept x kept_extra - (offloaded - 1) x offload_saving)

`recomputed` is the rate with every layer recomputed (the loss and one layer's recomputation and backward included),
`kept_extra` what one layer adds by keeping its activations instead of its input, `offload_saving` the input a layer
moves to host memory (one of them comes back ahead of its layer: train/layer_input_offload.py). `choose_modes` keeps
as many layers as fit, and offloads only where recomputing every layer does not fit. The estimate adds a kept layer's
activations to the recomputation's working set, which backward never holds together (kept layers are the last ones,
whose backward runs and frees them first): it errs on the safe side.

transformers' GradientCheckpointingLayer reads `gradient_checkpointing` and `_gradient_checkpointing_func` per layer
at every call, so a forward's choice is two attributes a layer, and changes no maths: kept, recomputed and offloaded
layers give the same gradients (tests/core/train/test_layer_modes.py)."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .layer_input_offload import LayerInputOffload


@dataclass(frozen=True)
class LayerRates:
    """Measured bytes a token (train/forward_budget.ForwardBudget.probe)."""

    recomputed: float  # a forward and backward's peak with every layer recomputed, gradients apart
    kept_extra: float  # what one layer adds by keeping its activations instead of only its input
    offload_saving: float  # one layer's input: what offloading it frees on the device

    def tokens_kept(self, budget: float, layers: int) -> int:
        """The most tokens a forward with every layer kept holds in `budget` bytes."""
        return int(budget / (self.recomputed + layers * self.kept_extra))


@dataclass(frozen=True)
class LayerModes:
    kept: int
    recomputed: int
    offloaded: int
    fits: bool = True  # False: even offloading every layer leaves the estimate over the budget

    def describe(self) -> str:
        total = self.kept + self.recomputed + self.offloaded
        if self.recomputed == self.offloaded == 0:
            return f"all {total} layers keep their activations"
        parts = [f"{self.recomputed} of {total} layers recomputed in backward"]
        if self.offloaded:
            parts.append(f"{self.offloaded} recomputed with their inputs in host memory")
        if self.kept:
            parts.append(f"{self.kept} keep their activations")
        return ", ".join(parts)


def choose_modes(tokens: int, budget: float, rates: LayerRates, layers: int) -> LayerModes:
    """The fewest layers recomputed (then offloaded) for a forward of `tokens` to fit `budget` bytes."""
    spare = budget / max(tokens, 1) - rates.recomputed
    if spare >= 0:
        kept = layers if rates.kept_extra <= 0 else min(layers, math.floor(spare / rates.kept_extra))
        return LayerModes(kept, layers - kept, 0)
    if rates.offload_saving <= 0:
        return LayerModes(0, layers, 0, fits=False)
    # one more than the spare needs: the input of the layer below comes back while a layer recomputes
    offloaded = math.ceil(-spare / rates.offload_saving) + 1
    if offloaded > layers:
        return LayerModes(0, 0, layers, fits=False)
    return LayerModes(0, layers - offloaded, offloaded)


def estimated_forward_bytes(tokens: int, rates: LayerRates, modes: LayerModes) -> float:
    """The estimate choose_modes keeps under the budget (the module docstring's formula): the bytes a forward and
    backward of `tokens` tokens with these layer modes holds at its peak, the fixed bytes apart."""
    # an offloaded layer frees its input, less the one brought back ahead of its layer
    offloaded = max(modes.offloaded - 1, 0)
    return tokens * (rates.recomputed + modes.kept * rates.kept_extra - offloaded * rates.offload_saving)


def checkpointed_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers transformers checkpoints (GradientCheckpointingLayer with checkpointing on), in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


@functools.cache
def offload_hooks(device_type: str) -> contextlib.AbstractContextManager:
    """Where an offloaded layer's saved input goes: pinned host memory through a side stream on an accelerator (one
    instance, its stream, for the run), nowhere on a CPU (it is host memory already)."""
    if device_type == "cpu":
        return contextlib.nullcontext()
    return LayerInputOffload(device_type)


@functools.cache
def recompute_function(offload: bool, device_type: str) -> Callable:
    """The checkpoint function transformers builds for a layer (non-reentrant); with `offload`, the saved input in
    host memory (offload_hooks: read at every call, as a test stands in for it)."""
    if not offload:
        return functools.partial(checkpoint, use_reentrant=False)

    def offloaded(function: Callable, *args, **kwargs):
        with offload_hooks(device_type):
            return checkpoint(function, *args, use_reentrant=False, **kwargs)
    return offloaded


def set_layer_modes(layers: list[nn.Module], modes: LayerModes, device_type: str) -> None:
    """The first `modes.offloaded` layers offloaded, the next recomputed, the last `modes.kept` kept: the last layers'
    backward comes first, so their activations are freed before any layer is recomputed."""
    recompute, offload = recompute_function(False, device_type), recompute_function(True, device_type)
    for index, layer in enumerate(layers):
        layer.gradient_checkpointing = index < modes.offloaded + modes.recomputed
        layer._gradient_checkpointing_func = offload if index < modes.offloaded else recompute


def layer_input_bytes(args: tuple, kwargs: dict) -> int:
    """The bytes of a decoder layer's hidden-states input (its first tensor argument)."""
    hidden = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("hidden_states")
    return hidden.nbytes if isinstance(hidden, torch.Tensor) else 0
