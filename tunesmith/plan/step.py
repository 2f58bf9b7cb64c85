"""One optimizer step of a packed SFT row on fake tensors, as StageTrainer runs it on a GPU, metered phase by phase:
the row from data/collator.PackingCollator, the loss from the tiled head where the trainer takes it
(train/head_loss.py), checkpointing enabled as the Trainer enables it, backward, gradient clipping and the optimizer
of the run's --optim (transformers' Trainer.get_optimizer_cls_and_kwargs)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..constants import IGNORE_INDEX
from ..data.collator import PackingCollator
from ..train.layer_modes import LayerModes, checkpointed_layers, set_layer_modes
from .fake_device import ALLOCATOR_BLOCK, DEVICE, HOST, MemoryMeter, cuda_stand_ins, real_slice_packed_row
from .model import quant_state_tensors


@dataclass
class StepMemory:
    """Bytes of one step on the device (host: the offloaded copies), from the meter, and the step's peak.

    Phases, each's peak above what was held when it began: the backbone's forward (`backbone_peak`, above the
    resident weights), the loss (`head_peak`, above what the backbone left), the loss's backward (`head_backward_peak`,
    above what the forward kept), the layers' recomputation and backward (`layers_backward_peak`, above what was held
    when they began), and the optimizer step (`optimizer_peak`, above weights and gradients, its state created)."""

    tokens: int
    resident: int  # weights, buffers and quantization states
    backbone_kept: int  # what the backbone's forward leaves for backward
    kept: dict[str, int]  # what the whole forward leaves for backward (backbone, logits, loss), device and host
    backbone_peak: int
    head_peak: int
    head_backward_peak: int
    layers_backward_peak: int
    gradients: int
    optimizer_state: int
    optimizer_peak: int
    host_peak: int
    passes_peak: int = 0  # every forward and backward's peak above the resident weights, gradients of earlier ones held
    gradients_held: int = 0  # gradient bytes held through the forwards (ZeRO-3's fp32 gradient shards)

    @property
    def forward_peak(self) -> int:
        return max(self.backbone_peak, self.backbone_kept + self.head_peak)

    @property
    def peak(self) -> int:
        """The device's peak in a step after the first, when the optimizer's state is held throughout (the first step
        creates it in optimizer.step() and peaks no higher): the forwards' and backwards' metered peak (the phases'
        sum above would count the loss's backward, freed before the layers' backward starts, twice) or the optimizer
        step's."""
        return max(self.resident + self.optimizer_state + self.gradients_held + self.passes_peak,
                   self.resident + self.gradients + self.optimizer_peak)


class PhaseRecorder:
    """Marks the meter where the backbone's forward ends (a forward hook on the decoder) and where the loss's
    backward ends (a gradient hook on the backbone's output)."""

    def __init__(self, meter: MemoryMeter, decoder: nn.Module) -> None:
        self.meter = meter
        self.backbone_kept = self.backbone_peak = 0
        self.head_backward_peak, self.layers_backward_from = 0, None
        self.resident = 0
        self.handle = decoder.register_forward_hook(self._backbone_done)

    def _backbone_done(self, module: nn.Module, args: Any, output: Any) -> None:
        self.backbone_peak = self.meter.peak[DEVICE] - self.resident
        self.backbone_kept = self.meter.mark()[DEVICE] - self.resident
        hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
        if hidden.requires_grad:
            hidden.register_hook(self._head_backward_done)

    def _head_backward_done(self, grad: torch.Tensor) -> None:
        self.head_backward_peak = self.meter.peak[DEVICE]
        self.layers_backward_from = self.meter.mark()[DEVICE]

def planned_row(tokens: int, conversations: int, trained_share: float) -> dict[str, Any]:
    """A packed row of `tokens` tokens, as the collator makes it from `conversations` conversations of equal length
    (the remainder in the last) whose last `trained_share` of tokens are reply tokens that train."""
    lengths = [tokens // conversations] * conversations
    lengths[-1] += tokens - sum(lengths)
    features = []
    for length in lengths:
        trained = max(1, round(length * trained_share))
        features.append({"input_ids": [0] * length, "labels": [IGNORE_INDEX] * (length - trained) + [0] * trained})
    return PackingCollator(trained_logits_only=True, max_forward_tokens=0)(features)


def enable_checkpointing(model: nn.Module, training: Any, offload: bool) -> None:
    """As transformers' Trainer does at the start of train(); with `offload`, as the Trainer's callback then does
    (train/callbacks.OffloadOnSideStream: every checkpointed layer's input offloaded by tunesmith's hooks)."""
    kwargs = dict(getattr(training, "activation_checkpointing_kwargs", None) or training.gradient_checkpointing_kwargs
                  or {})
    every_n_layers = kwargs.pop("every_n_layers", 1)
    kwargs.pop("offload", None)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None,
                                              every_n_layers=every_n_layers)
    else:  # transformers before 5.20: every layer checkpointed
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)
    if offload:
        layers = checkpointed_layers(model)
        set_layer_modes(layers, LayerModes(0, 0, len(layers)), "cuda")


def make_optimizer(model: nn.Module, training: Any) -> torch.optim.Optimizer:
    from transformers import Trainer

    optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(training, model)
    return optimizer_cls([p for p in model.parameters() if p.requires_grad], **kwargs)


def forward_backward(model: nn.Module, part: dict[str, Any], num_items: int, bf16: bool, fused_head_vocab: int,
                     between: Callable[[], None] | None = None) -> None:
    """One forward and backward of a packed row (or part of one), as the Trainer's training_step runs it: its inputs
    moved to the device, the tiled head where the trainer takes it, bf16 autocast; `between()` after the forward."""
    from ..train.head_loss import FUSED_HEAD, wants_fused_head

    # on the device as the Trainer moves them; the boundaries stay real: the packed attention reads them
    inputs = {k: v.clone() if torch.is_tensor(v) and not k.startswith("cu_seq_lens") else v for k, v in part.items()}
    if fused_head_vocab and wants_fused_head(part, fused_head_vocab):
        inputs[FUSED_HEAD] = True
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # CUDA's autocast: see fake_device
        loss = model(**inputs, num_items_in_batch=num_items).loss
    if between is not None:
        between()
    loss.backward()


def run_step(model: nn.Module, row: dict[str, Any], training: Any, bf16: bool, fused_head_vocab: int,
             mode: Any, forwards: list[int] | None = None, prepare: Callable[[int], None] | None = None,
             release_gradients: bool = False) -> StepMemory:
    """One step of `row` (the collator's real tensors) on the fake `model`, under FakeTensorMode `mode`: one forward,
    or one per part between the offsets `forwards` (the forward budget's splits), `prepare(tokens)` before each (the
    budget's layer modes). The phases are the last forward's; `passes_peak` holds every forward's. `release_gradients`:
    each gradient freed as soon as it is accumulated, as ZeRO-3's reduce-scatter does (plan/zero3.py counts its shard)."""
    num_items = int((row["labels"] != IGNORE_INDEX).sum())  # as the Trainer counts them, before faking
    forwards = forwards or [0, row["input_ids"].shape[1]]
    meter = MemoryMeter()
    recorder = PhaseRecorder(meter, model.get_decoder())
    released = [p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
                for p in model.parameters() if p.requires_grad and release_gradients]
    phases: dict[str, Any] = {}

    def forward_done() -> None:
        phases["forward_peak"] = meter.peak[DEVICE]
        phases["head_peak"] = meter.peak[DEVICE] - resident - recorder.backbone_kept
        phases["kept"] = meter.mark()

    try:
        with mode, cuda_stand_ins(meter, row["position_ids"]), meter:
            meter.track([*model.parameters(), *model.buffers(), *quant_state_tensors(model)])
            resident = recorder.resident = meter.mark()[DEVICE]
            passes_peak = 0
            for start, end in zip(forwards, forwards[1:]):
                if prepare is not None:
                    prepare(end - start)
                meter.mark()
                part = row if len(forwards) == 2 else real_slice_packed_row(row, start, end)
                forward_backward(model, part, num_items, bf16, fused_head_vocab, forward_done)
                # the recorder marks the meter where the loss's backward ends: the pass's peak is the largest of three
                passes_peak = max(passes_peak, phases["forward_peak"], recorder.head_backward_peak,
                                  meter.peak[DEVICE])
            passes_peak -= resident
            head_peak, kept = phases["head_peak"], phases["kept"]
            layers_backward_peak = meter.peak[DEVICE] - recorder.layers_backward_from
            trained = [p for p in model.parameters() if p.requires_grad]
            gradients = sum(allocated(p.grad) for p in trained if p.grad is not None)
            host_peak = max(kept[HOST], meter.peak[HOST])
            meter.mark()
            optimizer = make_optimizer(model, training)
            if training.max_grad_norm:
                nn.utils.clip_grad_norm_(trained, training.max_grad_norm)
            optimizer.step()
            state = sum(allocated(t) for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
            optimizer_peak = meter.peak[DEVICE] - resident - gradients
            optimizer.zero_grad(set_to_none=True)
            del optimizer
    finally:
        recorder.handle.remove()
        for handle in released:
            handle.remove()
    return StepMemory(tokens=row["input_ids"].shape[1], resident=resident, backbone_kept=recorder.backbone_kept,
                      kept={DEVICE: kept[DEVICE] - resident, HOST: kept[HOST]}, backbone_peak=recorder.backbone_peak,
                      head_peak=head_peak, head_backward_peak=recorder.head_backward_peak - kept[DEVICE],
                      layers_backward_peak=layers_backward_peak, gradients=gradients, optimizer_state=state,
                      optimizer_peak=optimizer_peak, host_peak=host_peak, passes_peak=passes_peak)


def allocated(tensor: torch.Tensor) -> int:
    """Bytes the CUDA caching allocator hands out for a tensor's storage."""
    return math.ceil(tensor.untyped_storage().nbytes() / ALLOCATOR_BLOCK) * ALLOCATOR_BLOCK
