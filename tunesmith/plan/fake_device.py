"""A GPU's memory counted on the CPU: fake tensors (shapes and dtypes, no data) and a meter of the bytes they hold.

Why fake CPU tensors and not fake `cuda` ones: torch's CPU build makes fake cuda tensors (`torch.empty(4, device=
"cuda")` under FakeTensorMode), but cannot run a training step on them. Indexing them (`t[:, None]`), `.to("cuda")`
and autograd's gradient accumulation each ask C++ for the CUDA device guard, which a CPU build lacks ("PyTorch is not
linked with support for cuda devices"; in autograd's engine it aborts the process), and `torch.autocast("cuda")` is
switched off there ("CUDA is not available"). So the step runs on fake CPU tensors under CPU autocast, and what a
CUDA run does differently is put in its place where it changes memory (`cuda_stand_ins`):

- a packed row attends with torch's flash-attention varlen kernel, as models/attention.packed_kernel picks on CUDA
  for bf16 inputs (memory O(tokens)); this CPU would run SDPA per example;
- an offloaded layer (`--gradient_checkpointing offload`, or auto's choice) keeps its input as a copy in pinned host
  memory and brings it back to the device for the backward, one layer ahead (train/layer_input_offload.py, whose
  copies run on a side stream): counted as host and device bytes apart;
- dropout (LoRA's) keeps a one-byte mask, as CUDA's fused kernel (native_dropout) does; torch's CPU dropout
  multiplies by a mask of the input's dtype instead;
- transformers' packed-row detection reads the real position ids: on a fake tensor it cannot compare values and
  takes the row as packed, and a row of one conversation would get an N x N mask that a CUDA run never allocates;
- the one-time check of the model's mask on the first step (attention._check_model_mask, an N x N comparison per
  longer example) is left out: it reads values.

Counted as torch.cuda.memory_allocated counts: every storage a tensor op creates, rounded up to the caching
allocator's 512 bytes, until its last tensor is gone. Not counted: the allocator's reserved-but-free blocks
(fragmentation), cuBLAS/cuDNN workspaces and the CUDA context (several hundred MB outside torch's count)."""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Iterable, Iterator
from typing import Any
from unittest import mock

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..models import attention
from ..train.layer_input_offload import LayerInputOffload

DEVICE, HOST = "device", "host"
ALLOCATOR_BLOCK = 512  # bytes: CUDA's caching allocator rounds every allocation up to a multiple of this


class MemoryMeter(TorchDispatchMode):
    """Bytes held on the device and in host memory by the storages of tensors created while it is active (and those
    given to `track`), with the peak of each since the last `mark()`."""

    def __init__(self) -> None:
        super().__init__()
        self.current = {DEVICE: 0, HOST: 0}
        self.peak = {DEVICE: 0, HOST: 0}
        self._seen: set[int] = set()
        self._refs: list[weakref.ref] = []
        self._host_depth = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.track(t for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out

    def track(self, tensors: Iterable[torch.Tensor], place: str | None = None) -> None:
        """Count the storages of `tensors` not yet counted, on `place` (default: the device, or the host inside
        `on_host()`), until they are freed."""
        place = place or (HOST if self._host_depth else DEVICE)
        for tensor in tensors:
            for storage in get_untyped_storages(tensor):
                if id(storage) in self._seen:
                    continue
                size = storage.nbytes()
                if place == DEVICE:
                    size = math.ceil(size / ALLOCATOR_BLOCK) * ALLOCATOR_BLOCK
                self._add(place, size)
                self._seen.add(id(storage))
                self._refs.append(weakref.ref(storage, self._freed(id(storage), place, size)))

    def _freed(self, key: int, place: str, size: int) -> Any:
        def callback(_: weakref.ref) -> None:
            self._seen.discard(key)
            self._add(place, -size)
        return callback

    def _add(self, place: str, size: int) -> None:
        self.current[place] += size
        self.peak[place] = max(self.peak[place], self.current[place])

    def mark(self) -> dict[str, int]:
        """Start a new peak from what is held now; returns what is held now."""
        self.peak = dict(self.current)
        return dict(self.current)

    @contextlib.contextmanager
    def on_host(self) -> Iterator[None]:
        """Tensors created in the block are host memory (the pinned copies of offloaded activations)."""
        self._host_depth += 1
        try:
            yield
        finally:
            self._host_depth -= 1


class HostCopyStreams:
    """train/layer_input_offload.CopyStreams as its memory goes on a GPU, on this CPU: the copies run at once (there
    is no second stream), and what the side stream allocates (the host copies of the layer inputs) is counted by
    `meter` as host memory, where one is given. Its events are numbers, checked to be recorded before they are
    waited on."""

    def __init__(self, meter: MemoryMeter | None = None) -> None:
        self.meter, self.events = meter, 0

    def on_side(self) -> contextlib.AbstractContextManager:
        return self.meter.on_host() if self.meter is not None else contextlib.nullcontext()

    def done_on_side(self) -> int:
        self.events += 1
        return self.events

    def wait(self, event: int) -> None:
        if not 0 < event <= self.events:
            raise RuntimeError(f"waited on event {event}, never recorded (last {self.events})")

    def keep_until_side_is_done(self, tensor: torch.Tensor) -> None:
        pass


def offload_to_host(meter: MemoryMeter) -> LayerInputOffload:
    """The offload hooks a GPU run's offloaded layers use (train/layer_input_offload.py), as their memory goes on a
    GPU: each layer input copied to host memory in the forward (counted by `meter` as host bytes), and back to the
    device, one layer ahead, in backward."""
    return LayerInputOffload("cpu", streams=HostCopyStreams(meter), pin_memory=False)


def cuda_packed_kernel(query: torch.Tensor, key: torch.Tensor, window: int | None = None,
                       softcap: float | None = None, sinks: torch.Tensor | None = None) -> str:
    """packed_kernel's choice on a CUDA GPU with bf16 inputs: the flash varlen kernel wherever its head sizes fit,
    the model's eager attention for soft-caps and sinks."""
    kernel = real_packed_kernel(query, key, window, softcap, sinks)
    head_dim = query.shape[-1]
    if kernel == attention.SDPA_PER_EXAMPLE and head_dim % 8 == 0 and head_dim <= 256 \
            and query.shape[1] % key.shape[1] == 0:
        return attention.FLASH_VARLEN
    return kernel


real_packed_kernel = attention.packed_kernel


def cuda_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """torch.nn.functional.dropout as it runs on CUDA (at::dropout's fused path): native_dropout, whose mask is bool."""
    if not training or p == 0:
        return input
    return torch.native_dropout(input, p, True)[0]


def real_slice_packed_row(batch: dict[str, Any], start: int, end: int) -> dict[str, Any]:
    """data/packing.slice_packed_row on the real row the step was given (it indexes by values, which fake tensors
    do not have); the part's tensors are cloned onto the fake device as the whole row's are."""
    from ..data.packing import slice_packed_row

    with unset_fake_temporarily():
        return slice_packed_row(batch, start, end)


@contextlib.contextmanager
def cuda_memory_from(meter: MemoryMeter) -> Iterator[None]:
    """torch.cuda's allocator statistics, which the forward budget reads (train/forward_budget.py), as `meter` counts:
    memory_allocated is what it holds on the device, max_memory_allocated its peak since reset_peak_memory_stats."""
    with mock.patch.object(torch.cuda, "memory_allocated", lambda *args: meter.current[DEVICE]), \
            mock.patch.object(torch.cuda, "max_memory_allocated", lambda *args: meter.peak[DEVICE]), \
            mock.patch.object(torch.cuda, "reset_peak_memory_stats", lambda *args: meter.mark()), \
            mock.patch.object(torch.cuda, "synchronize", lambda *args: None):
        yield


@contextlib.contextmanager
def cuda_stand_ins(meter: MemoryMeter, position_ids: torch.Tensor) -> Iterator[None]:
    """What a CUDA run does differently from this CPU, where it changes memory (the module docstring); position_ids:
    the real ones of the row the step runs."""
    import transformers.masking_utils as masking

    from ..train import forward_budget, layer_modes

    real_find_packed = masking.find_packed_sequence_indices

    with unset_fake_temporarily():  # on the real ids, with real values
        found = real_find_packed(position_ids)

    def find_packed_sequence_indices(fake_position_ids: torch.Tensor) -> torch.Tensor | None:
        return None if found is None else torch.zeros(fake_position_ids.shape, dtype=found.dtype)

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(attention, "packed_kernel", cuda_packed_kernel))
        stack.enter_context(mock.patch.object(attention, "_needs_mask_check", lambda *args: False))
        stack.enter_context(mock.patch.object(masking, "find_packed_sequence_indices", find_packed_sequence_indices))
        offload = offload_to_host(meter)  # the hooks of every offloaded layer (--gradient_checkpointing offload, auto's)
        stack.enter_context(mock.patch.object(layer_modes, "offload_hooks", lambda device_type: offload))
        stack.enter_context(mock.patch.object(forward_budget, "slice_packed_row", real_slice_packed_row))
        stack.enter_context(mock.patch.object(torch.nn.functional, "dropout", cuda_dropout))
        yield
