"""One rank's memory under DeepSpeed ZeRO-3, by arithmetic on the metered one-rank step.

DeepSpeed cannot run on fake tensors (its engine partitions real storages and all-gathers them through a process
group), so the fake step runs the model whole, with each gradient freed as soon as it is accumulated (ZeRO-3's
reduce-scatter hook copies it into its bucket and frees it), and the model states are then counted as DeepSpeed
0.19.8 allocates them with bf16 on (measured on two CPU ranks by tests/features/plan/test_plan.py):

- every parameter's bf16 bytes (engine._cast_module_mixed_precision casts floating ones; a 4-bit weight's packed
  bytes as they are) over the world size, except those of at most stage3_param_persistence_threshold elements, which
  every rank keeps whole;
- a trained parameter's gradient shard, in the gradient accumulation dtype (the model's, bf16, unless the config's
  data_types say otherwise: stage3's grad_partitions_flat_buffer), its fp32 master copy and Adam's two fp32 moments:
  14 bytes over the world size, held throughout; and at the optimizer step an fp32 copy of the gradient shard
  (4 bytes over the world size, freed after it). DeepSpeed's estimate_zero3_model_states_mem_needs counts 18 bytes
  a parameter in all;
- the gathered working set: the largest module's own parameters whole, plus the prefetch bucket
  (stage3_prefetch_bucket_size elements of bf16), at most stage3_max_live_parameters elements and the whole model;
- the gradients' reduce bucket (reduce_bucket_size elements of bf16), which stage3.py allocates whole at its start
  with contiguous_gradients (DeepSpeed's default);
- quantization constants and buffers, whole on every rank (they are not parameters: ZeRO-3 leaves them alone).

The config's "auto" values are filled as transformers' HfTrainerDeepSpeedConfig fills them from the model's hidden size
(reduce_bucket_size hidden^2, stage3_prefetch_bucket_size 0.9 hidden^2, stage3_param_persistence_threshold 10 hidden);
keys left out take DeepSpeed 0.19.8's defaults (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig)."""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..distributed import deepspeed_config
from .model import quant_state_tensors
from .report import mb
from .step import StepMemory, allocated

# DeepSpeed 0.19.8, deepspeed/runtime/zero/config.py: DeepSpeedZeroConfig's field defaults
DEEPSPEED_DEFAULTS = {"reduce_bucket_size": int(5e8), "stage3_prefetch_bucket_size": int(5e7),
                      "stage3_param_persistence_threshold": int(1e5), "stage3_max_live_parameters": int(1e9)}
BF16 = 2  # bytes
GRADIENT_SHARD = BF16  # bytes a trained parameter: its gradient shard, in the accumulation dtype (the model's)
MASTER_AND_MOMENTS = 12  # bytes a trained parameter: fp32 master copy and Adam's two fp32 moments
STEP_GRADIENT = 4  # bytes a trained parameter: the fp32 copy of its gradient shard at the optimizer step


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
    def read(cls, deepspeed: Any, hidden_size: int, world_size: int) -> Zero3Settings:
        """From --deepspeed (a config file's path, or the config itself), as distributed.deepspeed_config reads it."""
        zero = deepspeed_config(types.SimpleNamespace(deepspeed=deepspeed)).get("zero_optimization", {})
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
    gradient_shards: int  # 1/N of each trained parameter's gradient, in bf16
    optimizer_state: int  # 1/N of each trained parameter's fp32 master copy and Adam moments
    step_gradients: int  # the optimizer step's fp32 copy of the gradient shards
    gathered: int  # the largest module's parameters whole and the prefetch bucket
    reduce_bucket: int

    @property
    def held(self) -> int:
        """What a rank holds through a step besides its activations."""
        return (self.sharded_weights + self.persistent_weights + self.whole_tensors + self.gradient_shards
                + self.optimizer_state + self.gathered + self.reduce_bucket)


def parameter_bytes(param: nn.Parameter) -> int:
    """A parameter's bytes under DeepSpeed's bf16: floating ones cast to bf16, packed 4-bit storage as it is."""
    return param.numel() * BF16 if param.is_floating_point() and param.element_size() >= BF16 and \
        getattr(param, "quant_state", None) is None else param.untyped_storage().nbytes()


def zero3_rank(model: nn.Module, settings: Zero3Settings) -> Zero3Rank:
    """The model states one rank of `settings.world_size` holds (the module docstring's list)."""
    world = settings.world_size
    sharded = persistent = 0
    for param in model.parameters():
        size = parameter_bytes(param)
        if param.numel() <= settings.persistence_threshold:
            persistent += allocated_bytes(size)
        else:
            sharded += allocated_bytes(-(-size // world))
    # each trained parameter's 1/N (padded to a multiple of N), in DeepSpeed's flat buffers of every shard together
    trained = sum(-(-p.numel() // world) for p in model.parameters() if p.requires_grad)
    largest = max(sum(parameter_bytes(p) for p in m.parameters(recurse=False)) for m in model.modules())
    everything = sum(parameter_bytes(p) for p in model.parameters())  # a prefetch gathers no more than the model
    gathered = min(settings.max_live * BF16, largest + settings.prefetch_bucket * BF16, everything)
    whole = sum(allocated(t) for t in [*quant_state_tensors(model), *model.buffers()])
    # stage3.py allocates it at init with contiguous_gradients, in the gradients' bf16
    reduce_bucket = allocated_bytes(settings.reduce_bucket * BF16) if trained and settings.contiguous_gradients else 0
    return Zero3Rank(sharded, persistent, whole, allocated_bytes(trained * GRADIENT_SHARD),
                     allocated_bytes(trained * MASTER_AND_MOMENTS), allocated_bytes(trained * STEP_GRADIENT), gathered,
                     reduce_bucket)


def rank_step(step: StepMemory, rank: Zero3Rank) -> StepMemory:
    """`step` (metered with every gradient freed as it was accumulated) as one ZeRO-3 rank runs it: its activations,
    and the rank's model states in place of the whole model's weights, gradients and optimizer state."""
    return dataclasses.replace(step, resident=rank.held - rank.gradient_shards - rank.optimizer_state,
                               gradients=rank.gradient_shards, optimizer_state=rank.optimizer_state,
                               optimizer_peak=rank.optimizer_state + rank.step_gradients,
                               gradients_held=rank.gradient_shards)


def allocated_bytes(size: int) -> int:
    from .fake_device import ALLOCATOR_BLOCK

    return -(-size // ALLOCATOR_BLOCK) * ALLOCATOR_BLOCK


def rank_lines(rank: Zero3Rank, settings: Zero3Settings) -> list[str]:
    return [f"zero3_world_size: {settings.world_size}",
            f"zero3_sharded_weights_mb: {mb(rank.sharded_weights)}",
            f"zero3_persistent_weights_mb: {mb(rank.persistent_weights)}",
            f"zero3_gradient_shards_mb: {mb(rank.gradient_shards)}",
            f"zero3_optimizer_state_mb: {mb(rank.optimizer_state)}",
            f"zero3_gathered_mb: {mb(rank.gathered)}",
            f"zero3_reduce_bucket_mb: {mb(rank.reduce_bucket)}"]


def describe(settings: Zero3Settings) -> str:
    return (f"zero3: one rank of {settings.world_size}, by arithmetic on the one-rank step (DeepSpeed does not run on "
            "fake tensors): weights and gradients in bf16, trained ones' fp32 master and Adam moments sharded over the "
            f"ranks (an fp32 copy of the gradient shards at the optimizer step); parameters of at most {settings.persistence_threshold} elements whole; gathered: the largest "
            f"module whole and a prefetch bucket of {settings.prefetch_bucket} elements; reduce bucket "
            f"{settings.reduce_bucket} elements; the optimizer's own temporaries on the fp32 shards are not counted")
