"""Checkpointed layers' inputs in pinned host memory, their copies overlapping compute (a side stream each way).

A checkpointed decoder layer saves only its input for backward; offloading moves that input to host memory until the
layer is recomputed. torch's `save_on_cpu` (transformers' `offload`) copies on the compute stream: each layer's
forward waits for its input to reach the host, and each recomputation for it to come back. For an 8B model at 32,768
tokens that input is 256 MB, a copy of about 10 ms each way at PCIe speed, 32 layers a step. Here:
- forward: the copy to host runs on a side stream while the next layer computes; the device memory is reused only
  after the copy (`record_stream`);
- backward: when a layer's input is taken back for its recomputation, the input of the layer below starts coming
  back on the side stream, so it is on the device when that layer's backward starts. That costs one layer input
  more on the device while a layer recomputes (train/layer_modes.choose_modes counts it).
The values are the same bytes copied both ways: offloaded layers train exactly as recomputed ones (tests/core/train/test_layer_modes.py,
tests/system/test_gpu.py).

TRL's (torchtune's) OffloadActivations overlaps the forward copy the same way, but it is made to wrap a whole forward:
it offloads every saved tensor under one context whose entry clears its state, and brings a tensor back only when
backward asks for it. Here the context is entered once per offloaded layer (only the layer's input is saved there),
and the point is the prefetch, so it does not fit.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

# smaller saved tensors stay where they are: their copies would cost more in launches than they free
MIN_OFFLOADED_BYTES = 1 << 20


class CopyStreams:
    """The compute stream and a side stream for the copies, on a device type with streams (CUDA)."""

    def __init__(self, device_type: str) -> None:
        self.module = torch.get_device_module(device_type)
        self.side = self.module.Stream()

    def compute(self) -> Any:
        return self.module.current_stream()

    def on_side(self) -> Any:
        """Work enqueued inside runs on the side stream, after what the compute stream has enqueued so far."""
        self.side.wait_stream(self.compute())
        return self.module.stream(self.side)

    def done_on_side(self) -> Any:
        return self.side.record_event()

    def wait(self, event: Any) -> None:
        self.compute().wait_event(event)

    def keep_until_side_is_done(self, tensor: torch.Tensor) -> None:
        tensor.record_stream(self.side)


class _Offloaded:
    """One saved layer input: its host copy, and its device copy once fetched."""

    __slots__ = ("host", "device", "on_device", "ready", "below", "__weakref__")

    def __init__(self, host: torch.Tensor, device: torch.device, below: weakref.ref | None) -> None:
        self.host = host
        self.device = device
        self.on_device: torch.Tensor | None = None
        self.ready: Any = None  # the side stream's event after the copy back
        self.below = below  # the input packed before this one: the next to come back in backward


class LayerInputOffload(saved_tensors_hooks):
    """Saved-tensor hooks for offloaded checkpointed layers. One instance serves every layer of a run: the chain of
    inputs (each knows the one packed before it) is held by autograd alone, so nothing outlives its backward."""

    def __init__(self, device_type: str, streams: Any = None, pin_memory: bool = True,
                 min_bytes: int = MIN_OFFLOADED_BYTES) -> None:
        self.streams = streams if streams is not None else CopyStreams(device_type)
        self.device_type = device_type
        self.pin_memory = pin_memory
        self.min_bytes = min_bytes
        self._last: weakref.ref | None = None
        super().__init__(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> Any:
        if (tensor.device.type != self.device_type or tensor.nbytes < self.min_bytes
                or isinstance(tensor, nn.Parameter)):
            return tensor
        with self.streams.on_side():
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=self.pin_memory)
            host.copy_(tensor, non_blocking=True)
        self.streams.keep_until_side_is_done(tensor)
        entry = _Offloaded(host, tensor.device, self._last)
        self._last = weakref.ref(entry)
        return entry

    def _fetch(self, entry: _Offloaded) -> None:
        if entry.on_device is not None:
            return
        # allocated on the compute stream, which uses it; written on the side stream once the compute stream's
        # earlier work (the last user of that memory) is done
        on_device = torch.empty(entry.host.shape, dtype=entry.host.dtype, device=entry.device)
        with self.streams.on_side():
            on_device.copy_(entry.host, non_blocking=True)
        self.streams.keep_until_side_is_done(on_device)
        entry.on_device, entry.ready = on_device, self.streams.done_on_side()

    def _unpack(self, entry: Any) -> torch.Tensor:
        if not isinstance(entry, _Offloaded):
            return entry
        self._fetch(entry)
        self.streams.wait(entry.ready)
        below = entry.below() if entry.below is not None else None
        if below is not None:
            self._fetch(below)  # comes back while this layer recomputes and runs its backward
        # the device copy is the caller's now; the host copy stays while autograd holds the entry (a graph kept for a
        # second backward unpacks it again) and goes with it
        tensor, entry.on_device = entry.on_device, None
        return tensor
