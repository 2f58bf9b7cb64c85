"""Sequence parallelism (--sequence_parallel_size N): one long packed row cut across N ranks, attention exact over the
whole row. DeepSpeed's Ulysses (ALST, deepspeed/runtime/sequence_parallel/ulysses_sp.py), switched on through
accelerate's ParallelismConfig(sp_backend="deepspeed"), which transformers' Trainer knows: before attention, an
all-to-all gives each rank all the row's tokens for 1/N of the heads; after it, another gives each rank its own
tokens back with every head (UlyssesSPAttentionHF). What tunesmith adds, and why:

- The attention run after the all-to-all is the packed kernel of models/attention.py (sdpa_varlen / eager_varlen),
  given the whole row's `cu_seq_lens_q`: each conversation attends within itself, through the model's sliding
  window where it has one. DeepSpeed drops the model's mask and calls the wrapped implementation, which for plain
  sdpa is causal over the whole row (across conversations, and with no window). accelerate accepts only the names
  flash_attention_2/3 and sdpa, so the name is set on its handler after construction (`parallelism_config`).
- The rows are cut by `packed_row_shard` in `PackedRowShards`, DeepSpeed's UlyssesSPDataLoaderAdapter with its own
  refill: DeepSpeed's cuts every tensor of a batch along dimension 1, which the row's boundaries (`cu_seq_lens_*`,
  1-D, for the whole row) and the trained positions (`logits_to_keep`) are not; and it needs a row whose length N
  divides, where a packed row has any length (here it is padded with a conversation of its own that trains nothing).
- The loss (`shard_loss`): each rank sums its tokens' losses and divides by the trained tokens of the whole step
  (every rank, every accumulated row: `step_token_count`), as a one-rank run does, times what DeepSpeed divides
  the ranks' summed gradients by (`gradient_divisor`), which differs between its ZeRO paths. transformers' own SP
  loss (integrations/deepspeed.deepspeed_sp_compute_loss) gives every rank the row's mean through a differentiable
  all_gather, whose backward sums the N ranks' copies: N times the gradient, right only where DeepSpeed divides by
  the whole world (ZeRO-3's reduce-scatter); under ZeRO-2 the gradients come out N times too large (measured: grad
  norm 1.353 on two ranks against 0.676 on one, same loss). It also ignores gradient accumulation.

The SP ranks take turns: each draws its own batch, and the N of them train one after the other, every rank holding
1/N of each (DeepSpeed's "SP over DP"; the Trainer counts N times the batches per epoch).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from ..constants import IGNORE_INDEX
from ..errors import ConfigError
from ..models.moe import router_loss_attribute
from ..utils.config_facts import text_config

SEQUENCE_PARALLEL_BACKEND = "deepspeed"  # accelerate's sp_backend: DeepSpeed's Ulysses
# what the row is padded with (a conversation of its own, trained on nothing) to a length N divides
PADDING_TOKEN = 0


def check_heads(config: Any, size: int) -> None:
    """One line where Ulysses over `size` ranks cannot split this (text) config's attention heads."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % size or (kv_heads % size and size % kv_heads):  # DeepSpeed repeats key/value heads only to N
        raise ConfigError(f"--sequence_parallel_size {size}: {config.model_type} has {heads} attention heads and "
                          f"{kv_heads} key/value heads, and each rank attends with 1/{size} of them; choose a size "
                          f"that divides {heads} and divides or is a multiple of {kv_heads}")


def parallelism_config(size: int, model: nn.Module) -> Any:
    """accelerate's ParallelismConfig for Ulysses over `size` ranks, wrapping the attention `model` uses (after
    models/attention.use_varlen_attention: the packed kernel). One line for a model it cannot cut: heads `size`
    does not divide, a mixture of experts (whose router loss would be each piece's)."""
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = text_config(base.config)
    check_heads(config, size)
    if router_loss_attribute(model) is not None:
        raise ConfigError(f"--sequence_parallel_size with a mixture-of-experts model ({config.model_type}): its "
                          "router's load-balancing loss is not computed over the ranks' pieces of a row; train it "
                          "without --sequence_parallel_size")
    handler = DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=True)
    # after __post_init__, which knows only flash_attention_2/3 and sdpa: DeepSpeed wraps any registered name
    handler.sp_attn_implementation = base.config._attn_implementation
    return ParallelismConfig(sp_size=size, sp_backend=SEQUENCE_PARALLEL_BACKEND, sp_handler=handler)


def packed_row_shard(row: dict[str, Any], rank: int, size: int, trained_logits_only: bool) -> dict[str, Any]:
    """Rank `rank`'s 1/`size` of a PackingCollator row (one row, [1, tokens], no forward splits): its tokens, their
    positions and the targets they predict (`shift_labels`, taken from the whole row, so the last token of a shard
    predicts the first of the next), with the whole row's boundaries for the attention after the all-to-all. With
    `trained_logits_only`, `logits_to_keep` and `shift_labels` hold the trained positions only, as the collator's."""
    input_ids, labels, positions = row["input_ids"], row["labels"], row["position_ids"]
    bounds = row["cu_seq_lens_q"].to(torch.int32)
    longest = row["max_length_q"]
    padding = -input_ids.shape[1] % size
    if padding:
        input_ids = nn.functional.pad(input_ids, (0, padding), value=PADDING_TOKEN)
        labels = nn.functional.pad(labels, (0, padding), value=IGNORE_INDEX)
        positions = torch.cat([positions, torch.arange(padding, dtype=positions.dtype)[None]], dim=1)
        bounds = torch.cat([bounds, bounds[-1:] + padding])
        longest = max(longest, padding)
    targets = torch.cat([labels[0, 1:], labels.new_full((1,), IGNORE_INDEX)])
    length = input_ids.shape[1] // size
    start, end = rank * length, (rank + 1) * length
    shard = {"input_ids": input_ids[:, start:end], "position_ids": positions[:, start:end],
             "cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": longest, "max_length_k": longest,
             "use_cache": False}
    shard_targets = targets[start:end]
    if trained_logits_only:
        keep = shard_targets != IGNORE_INDEX
        shard.update(logits_to_keep=keep.nonzero()[:, 0], shift_labels=shard_targets[keep])
    else:
        shard["shift_labels"] = shard_targets[None]
    return shard


def _shard_adapter_class() -> type:
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    class PackedRowShards(UlyssesSPDataLoaderAdapter):
        """DeepSpeed's adapter (length, SP over DP) with the rows cut by packed_row_shard, and epochs that restart."""

        trained_logits_only = True
        skip_shards = 0  # shards to drop at the start of the next iteration (a resumed epoch's)

        def __iter__(self) -> PackedRowShards:
            # DeepSpeed's returns itself as it is: its iterator over the wrapped loader restarts only after a
            # StopIteration, which an epoch that ends on a whole optimizer step never raises, so the next epoch
            # would be empty (the Trainer stops there).
            self.iter = iter(self.dl)
            self.micro_batches.clear()
            if self.skip_shards:
                self.refill()
                for _ in range(self.skip_shards):
                    self.micro_batches.popleft()
                self.skip_shards = 0
            return self

        def set_epoch(self, epoch: int) -> None:
            """Each epoch's order, as the Trainer sets it on a plain loader."""
            if hasattr(self.dl, "set_epoch"):
                self.dl.set_epoch(epoch)

        @property
        def batch_sampler(self) -> Any:  # the Trainer sets the epoch on the sampler a sharded loader wraps too
            return getattr(self.dl, "batch_sampler", None)

        def refill(self) -> None:
            try:
                batch = next(self.iter)
            except StopIteration:
                self.iter = iter(self.dl)  # the next epoch starts over, as DeepSpeed's does
                raise
            rows: list[Any] = [None] * self.sp_world_size
            row = {k: v.cpu() if torch.is_tensor(v) else v for k, v in batch.items()}
            torch.distributed.all_gather_object(rows, row, group=self.sp_group)
            for each in rows:
                self.micro_batches.append(packed_row_shard(each, self.sp_rank, self.sp_world_size,
                                                           self.trained_logits_only))

        def skipping(self, shards: int) -> PackedRowShards:
            """The same epoch less its first `shards` shards: whole rows skipped in the wrapped dataloader (by
            accelerate's skip_first_batches), the rest dropped from the first refill."""
            from accelerate import skip_first_batches

            rows, rest = divmod(shards, self.sp_world_size)
            skipped = type(self)(skip_first_batches(self.dl, rows), sp_rank=self.sp_rank, sp_group=self.sp_group,
                                 sp_world_size=self.sp_world_size, device=self.device)
            skipped.trained_logits_only, skipped.skip_shards = self.trained_logits_only, rest
            return skipped

    return PackedRowShards


def shard_packed_rows(dataloader: Any, model: nn.Module, trained_logits_only: bool) -> Any:
    """What accelerate's deepspeed_ulysses_dl_adapter does (the Trainer calls it once DeepSpeed has made the SP
    groups), with PackedRowShards."""
    from deepspeed.utils import groups

    adapter = _shard_adapter_class()(dataloader, sp_rank=groups._get_sequence_parallel_rank(),
                                     sp_group=groups._get_sequence_parallel_group(),
                                     sp_world_size=groups._get_sequence_parallel_world_size(), device=model.device)
    adapter.trained_logits_only = trained_logits_only
    return adapter


def use_packed_row_shards(accelerator: Any, trained_logits_only: bool) -> None:
    """Make the Trainer's call to accelerator.deepspeed_ulysses_dl_adapter cut rows with PackedRowShards, and tell
    DeepSpeed a micro batch is one row: whatever --per_device_train_batch_size, a packed batch is one row, and
    UlyssesSPAttentionHF reshapes every layer's heads by the micro batch size it is given (accelerate passes
    DeepSpeed's train_micro_batch_size_per_gpu, which the Trainer sets to the batch size)."""
    accelerator.deepspeed_ulysses_dl_adapter = functools.partial(shard_packed_rows,
                                                                 trained_logits_only=trained_logits_only)
    accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1


def resume_epoch_arguments(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Trainer._run_epoch's arguments for the epoch a resumed run continues: transformers skips its trained batches
    with accelerate's skip_first_batches, which rebuilds a DataLoader from the loader's `dataset` (DeepSpeed's
    adapter has none: AttributeError). The shards' adapter skips them itself, and the epoch is then run as one
    that starts there (transformers then restores the random state before its first batch, as it does after a
    skip; only the logged epoch fraction restarts)."""
    skipped = kwargs.get("steps_trained_in_current_epoch", 0)
    if skipped and kwargs.get("resume_from_checkpoint") is not None and kwargs["epoch"] == kwargs["epochs_trained"]:
        kwargs = {**kwargs, "train_dataloader": kwargs["train_dataloader"].skipping(skipped),
                  "steps_trained_in_current_epoch": 0}
    return kwargs


def step_token_count(batches: list[dict[str, Any]], accelerator: Any) -> torch.Tensor:
    """The trained tokens of an optimizer step over every rank: each of its shards' `shift_labels`, summed over the
    world (every token of a row is in one shard)."""
    count = sum((batch["shift_labels"] != IGNORE_INDEX).sum() for batch in batches)
    return accelerator.reduce(torch.as_tensor(count, device=accelerator.device), reduction="sum")


def gradient_divisor(deepspeed_config: dict, world_size: int, size: int) -> int:
    """What DeepSpeed (0.19) divides the ranks' summed gradients by under Ulysses: the data-parallel size (world /
    N) in the engine's all-reduce, ZeRO-1/2 (stage_1_and_2.py) and ZeRO-3 without reduce_scatter; the whole world in
    ZeRO-3's reduce-scatter, its default (coalesced_collectives.reduce_scatter_coalesced pre-divides by the group's
    size, leaving out the SP size the other paths take out). Measured on two CPU ranks: ZeRO-3's gradients came
    out half ZeRO-2's for the same losses."""
    zero = deepspeed_config.get("zero_optimization", {})
    if int(zero.get("stage", 0)) == 3 and zero.get("reduce_scatter", True):
        return world_size
    return world_size // size


def shard_loss(model: nn.Module, inputs: dict[str, Any], step_tokens: torch.Tensor, divisor: int,
               return_outputs: bool = False) -> Any:
    """This rank's shard's summed token losses over the step's trained tokens (all ranks), times what DeepSpeed
    divides the ranks' summed gradients by (`gradient_divisor`): the gradients are those of the step's mean token
    loss. The ranks' mean of these losses is the step's loss times divisor / world size."""
    outputs = model(**inputs, labels=inputs["shift_labels"], num_items_in_batch=step_tokens)
    loss = outputs.loss * divisor
    return (loss, outputs) if return_outputs else loss
