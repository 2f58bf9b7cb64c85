"""One rank's memory under DeepSpeed ZeRO-3, by arithmetic on the metered one-rank step.

DeepSpeed cannot run on fake tensors (its engine partitions real storages and all-gathers them through a process
group), so the fake step runs the model whole, with each gradient freed as soon as it is accumulated (ZeRO-3's
reduce-scatter hook copies it into its bucket and frees it), and the model states are then counted as DeepSpeed 0.19
holds them with bf16 on (engine._cast_module_mixed_precision casts every floating parameter to bf16;
stage3.estimate_zero3_model_states_mem_needs counts the same 18 bytes a trained parameter):

- every parameter's bf16 bytes (a 4-bit weight's packed bytes) over the world size, except those of at most
  stage3_param_persistence_threshold elements, which every rank keeps whole;
- a trained parameter's fp32 master copy, Adam's two fp32 moments and its fp32 gradient: 16 bytes over the world size;
- the gathered working set: the largest module's own parameters whole, plus the prefetch bucket
  (stage3_prefetch_bucket_size elements of bf16), at most stage3_max_live_parameters elements;
- the gradients' reduce bucket (reduce_bucket_size elements of bf16), which stage3.py allocates whole at its start
  with contiguous_gradients (DeepSpeed's default);
- quantization constants and buffers, whole on every rank (they are not parameters: ZeRO-3 leaves them alone).

The config's "auto" values are filled as transformers' HfTrainerDeepSpeedConfig fills them from the model's hidden size
(reduce_bucket_size hidden^2, stage3_prefetch_bucket_size 0.9 hidden^2, stage3_param_persistence_threshold 10 hidden);
keys left out take DeepSpeed 0.19.8's defaults (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from torch import nn

from .model import quant_state_tensors
from .report import mb
from .step import StepMemory, allocated

# DeepSpeed 0.19.8, deepspeed/runtime/zero/config.py: DeepSpeedZeroConfig's field defaults
DEEPSPEED_DEFAULTS = {"reduce_bucket_size": int(5e8), "stage3_prefetch_bucket_size": int(5e7),
                      "stage3_param_persistence_threshold": int(1e5), "stage3_max_live_parameters": int(1e9)}
BF16 = 2  # bytes
TRAINED_STATE = 16  # bytes a trained parameter besides its bf16 weight: fp32 master, Adam's two moments, fp32 gradient


@dataclass(frozen=True)
class Zero3Settings:
    """The buckets of a ZeRO-3 config, in elements, as DeepSpeed runs them."""

    world_size: int
    reduce_bucket: int
    prefetch_bucket: int
    persistence_threshold: int
    max_live: int
    contiguous_gradients: bool = True  # DeepSpeed's default: the reduce bucket is allocated once, whole

    @classmethod
    def read(cls, path: str, hidden_size: int, world_size: int) -> Zero3Settings:
        with open(path) as f:
            zero = json.load(f).get("zero_optimization", {})
        auto = {"reduce_bucket_size": hidden_size * hidden_size,
                "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
                "stage3_param_persistence_threshold": 10 * hidden_size}
        value = {key: int(auto[key] if zero.get(key, default) == "auto" else zero.get(key, default))
                 for key, default in DEEPSPEED_DEFAULTS.items()}
        return cls(world_size, value["reduce_bucket_size"], value["stage3_prefetch_bucket_size"],
                   value["stage3_param_persistence_threshold"], value["stage3_max_live_parameters"],
                   bool(zero.get("contiguous_gradients", True)))


@dataclass(frozen=True)
class Zero3Rank:
    """One rank's model states under ZeRO-3, in bytes (CUDA allocator blocks for the whole tensors)."""

    sharded_weights: int  # each parameter's 1/N (its bf16 bytes, or its packed 4-bit bytes)
    persistent_weights: int  # parameters under the persistence threshold, whole
    whole_tensors: int  # quantization constants and buffers
    trained_state: int  # fp32 master copies, Adam's moments and fp32 gradients, 1/N of each
    gathered: int  # the largest module's parameters whole and the prefetch bucket
    reduce_bucket: int

    @property
    def held(self) -> int:
        """What a rank holds through a step besides its activations."""
        return (self.sharded_weights + self.persistent_weights + self.whole_tensors + self.trained_state
                + self.gathered + self.reduce_bucket)


def parameter_bytes(param: nn.Parameter) -> int:
    """A parameter's bytes under DeepSpeed's bf16: floating ones cast to bf16, packed 4-bit storage as it is."""
    return param.numel() * BF16 if param.is_floating_point() and param.element_size() >= BF16 and \
        getattr(param, "quant_state", None) is None else param.untyped_storage().nbytes()


def zero3_rank(model: nn.Module, settings: Zero3Settings) -> Zero3Rank:
    world = settings.world_size
    sharded = persistent = trained = 0
    for param in model.parameters():
        size = parameter_bytes(param)
        if param.numel() <= settings.persistence_threshold:
            persistent += allocated_bytes(size)
        else:
            sharded += allocated_bytes(-(-size // world))
        if param.requires_grad:
            trained += allocated_bytes(-(-param.numel() * TRAINED_STATE // world))
    largest = max(sum(parameter_bytes(p) for p in m.parameters(recurse=False)) for m in model.modules())
    everything = sum(parameter_bytes(p) for p in model.parameters())  # a prefetch gathers no more than the model
    gathered = min(settings.max_live * BF16, largest + settings.prefetch_bucket * BF16, everything)
    whole = sum(allocated(t) for t in [*quant_state_tensors(model), *model.buffers()])
    # stage3.py allocates it at init with contiguous_gradients, in the gradients' bf16
    reduce_bucket = allocated_bytes(settings.reduce_bucket * BF16) if trained and settings.contiguous_gradients else 0
    return Zero3Rank(sharded, persistent, whole, trained, gathered, reduce_bucket)


def rank_step(step: StepMemory, rank: Zero3Rank) -> StepMemory:
    """`step` (metered with every gradient freed as it was accumulated) as one ZeRO-3 rank runs it: its activations,
    and the rank's model states in place of the whole model's weights, gradients and optimizer state."""
    gradients = rank.trained_state // 4  # of 16 bytes a trained parameter, its fp32 gradient's 4
    state = rank.trained_state - gradients
    return dataclasses.replace(step, resident=rank.held - rank.trained_state, gradients=gradients,
                               optimizer_state=state, optimizer_peak=state, gradients_held=gradients)


def allocated_bytes(size: int) -> int:
    from .fake_device import ALLOCATOR_BLOCK

    return -(-size // ALLOCATOR_BLOCK) * ALLOCATOR_BLOCK


def rank_lines(rank: Zero3Rank, settings: Zero3Settings) -> list[str]:
    return [f"zero3_world_size: {settings.world_size}",
            f"zero3_sharded_weights_mb: {mb(rank.sharded_weights)}",
            f"zero3_persistent_weights_mb: {mb(rank.persistent_weights)}",
            f"zero3_trained_state_mb: {mb(rank.trained_state)}",
            f"zero3_gathered_mb: {mb(rank.gathered)}",
            f"zero3_reduce_bucket_mb: {mb(rank.reduce_bucket)}"]


def describe(settings: Zero3Settings) -> str:
    return (f"zero3: one rank of {settings.world_size}, by arithmetic on the one-rank step (DeepSpeed does not run on "
            "fake tensors): weights in bf16, trained ones' fp32 master, Adam moments and gradients sharded over the "
            f"ranks; parameters of at most {settings.persistence_threshold} elements whole; gathered: the largest "
            f"module whole and a prefetch bucket of {settings.prefetch_bucket} elements; reduce bucket "
            f"{settings.reduce_bucket} elements; the optimizer step's temporaries on the fp32 shards are not counted")
