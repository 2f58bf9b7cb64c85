"""An exponential moving average of the trained weights (DeepSpeed-Chat's `--enable_ema` for the actor):
``ema <- decay * ema + (1 - decay) * weight`` after every optimizer step, by torch's own
`get_ema_multi_avg_fn`, kept in float32 beside the model and saved as a model of its own (a PEFT adapter of
the same base, or a full model), which chat, serve and eval load like any other."""

from __future__ import annotations

import os
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.optim.swa_utils import get_ema_multi_avg_fn

STATE_FILE = "ema_state.safetensors"  # the average in a checkpoint, by parameter name, for resuming


class WeightAverage:
    """The average of `weights` (name -> parameter, e.g. a policy's trained parameters), starting at their values
    now."""

    def __init__(self, weights: dict[str, nn.Parameter], decay: float) -> None:
        self.weights = weights
        self.average = {name: p.detach().float().clone() for name, p in weights.items()}
        self.decay = decay
        self._blend = get_ema_multi_avg_fn(decay)

    def update(self) -> None:
        self._blend(list(self.average.values()), [p.detach().float() for p in self.weights.values()], None)

    def state_dict_of(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """`model`'s state dict with every averaged weight replaced by its average (a tied copy too)."""
        by_storage = {p.data_ptr(): self.average[name] for name, p in self.weights.items()}
        return {key: by_storage.get(value.data_ptr(), value) for key, value in model.state_dict().items()}

    def save_model(self, model: nn.Module, directory: str, **save_kwargs: Any) -> None:
        """The averaged model through the model's own save_pretrained (PEFT keeps only the adapter's part)."""
        model.save_pretrained(directory, state_dict=self.state_dict_of(model), **save_kwargs)

    def save_state(self, directory: str) -> None:
        save_file({k: v.contiguous() for k, v in self.average.items()}, os.path.join(directory, STATE_FILE))

    def load_state(self, directory: str) -> None:
        saved = load_file(os.path.join(directory, STATE_FILE))
        if saved.keys() != self.average.keys():
            raise ValueError(f"{directory}/{STATE_FILE} averages other weights than this run trains")
        self.average = {name: saved[name] for name in self.average}
