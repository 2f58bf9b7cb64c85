"""Padding-free packing for SFT: the examples of a batch become one row, with no padding and no
attention from one example into another.

It is the row format transformers itself understands (DataCollatorWithFlattening's):
- `position_ids` restart at 0 for every example and no `attention_mask` is sent. From that,
  transformers' masking_utils (find_packed_sequence_indices) builds a block-diagonal causal mask for
  sdpa and eager, and flash_attention_2 runs its varlen kernel;
- `use_cache=False`: transformers looks for packed rows only when no KV cache is passed, and a model
  whose config says use_cache (most do) builds one in every forward, in training too;
- `cu_seq_lens_q/k` and `max_length_q/k` give the example boundaries, which flash attention takes as
  they are instead of deriving them from the position ids in every layer;
- the first label of every example is IGNORE_INDEX: causal-LM losses shift labels by one inside the
  model, so that label would train the previous example's last token to predict across the boundary.

The block-diagonal mask is correct but still attends over the whole row, a cost that grows with the
square of the row's length. So a model on sdpa switches to `sdpa_varlen` (registered here): torch's
SDPA once per example with `is_causal`, the maths of flash attention's varlen kernel on any device.

With `trained_logits_only` the LM head also runs only where the next token is trained: `logits_to_keep`
holding those positions and `shift_labels` their targets, both taken by transformers' causal-LM
forward and ForCausalLMLoss. The loss is the same; the 49k-wide logits of untrained prompt tokens are
never computed. The positions are a 1-D index tensor, not a boolean mask: up to transformers 5.20 the
heads index `hidden_states[:, logits_to_keep, :]`, which takes indices in every 5.x release but a
[1, tokens] mask only from 5.21 (slice_logits_to_keep; before it, IndexError on any device). The logits
come back as [1, kept, vocab], which every loss here flattens. The Trainer counts `shift_labels` for `num_items_in_batch`, which is the count the
padded path gets from `labels[..., 1:]`, so both paths train on the same objective.

Why one row per batch rather than bin-packing the dataset into fixed-length rows: on a CPU the cost is
the tokens computed, and a flattened batch computes no padding either way, while it keeps a step's
examples exactly those of the padded run (the same objective, step for step) and needs no
preprocessing. Fixed-length rows matter for shape-stable compiled kernels on a GPU, not here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..constants import IGNORE_INDEX
from ..utils.hardware import trains_on_cpu
from .collator import PaddingCollator

VARLEN_SDPA = "sdpa_varlen"


FORWARD_SPLITS = "forward_splits"
# The default --max_forward_tokens on CPU. Every forward/backward reads all the weights however few tokens
# it holds (about 0.2 s a pass for SmolLM2-135M on a 2-core CPU, measured), so small forwards cost
# throughput; at 2,048 tokens that is a few percent, and activation memory stops growing with the batch.
CPU_FORWARD_TOKENS = 2048


@dataclass
class PackingCollator:
    """A batch of `{"input_ids", "labels"}` examples as one padding-free row of shape [1, total_tokens].
    With max_forward_tokens, a row longer than that also carries `forward_splits`: the token offsets
    where LoraTrainer cuts it into forwards of whole examples (see forward_splits())."""

    trained_logits_only: bool = True
    max_forward_tokens: int = 0

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        lengths = [len(f["input_ids"]) for f in features]
        input_ids = torch.cat([torch.as_tensor(f["input_ids"], dtype=torch.long) for f in features])[None]
        labels = torch.cat([torch.as_tensor(f["labels"], dtype=torch.long) for f in features])[None]
        position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
        starts = torch.as_tensor([0, *lengths]).cumsum(0)
        labels[0, starts[:-1]] = IGNORE_INDEX
        cu_seq_lens = starts.to(torch.int32)
        batch: dict[str, Any] = {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": position_ids,
            "cu_seq_lens_q": cu_seq_lens,
            "cu_seq_lens_k": cu_seq_lens,
            "max_length_q": max(lengths),
            "max_length_k": max(lengths),
            # A model that builds a KV cache (use_cache defaults to True, in training too) skips
            # transformers' packed-row detection and lets sdpa/eager attend across examples.
            "use_cache": False,
        }
        if self.trained_logits_only:
            batch.update(trained_positions(labels))
        if self.max_forward_tokens and len(input_ids[0]) > self.max_forward_tokens:
            batch[FORWARD_SPLITS] = forward_splits(lengths, self.max_forward_tokens)
        return batch


def forward_splits(lengths: list[int], max_tokens: int) -> list[int]:
    """Offsets [0, ..., total] cutting a row of examples of these lengths into runs of whole examples of at
    most max_tokens tokens each (an example longer than that is a run of its own), filled in order."""
    cuts, start, end = [0], 0, 0
    for n in lengths:
        if end > start and end + n - start > max_tokens:
            cuts.append(end)
            start = end
        end += n
    return cuts + [end]


def slice_packed_row(batch: dict[str, Any], start: int, end: int) -> dict[str, Any]:
    """The part of a PackingCollator row from token `start` to `end` (both example boundaries) as a row of its
    own. Nothing crosses a boundary: the first label of every example is IGNORE_INDEX, so the position
    before a cut predicts nothing, and the part's loss terms are exactly the row's terms in it."""
    bounds = [b - start for b in batch["cu_seq_lens_q"].tolist() if start <= b <= end]
    cu_seq_lens = torch.as_tensor(bounds, dtype=torch.int32)
    longest = max(b - a for a, b in zip(bounds, bounds[1:]))
    part = {**batch, "cu_seq_lens_q": cu_seq_lens, "cu_seq_lens_k": cu_seq_lens, "max_length_q": longest,
            "max_length_k": longest}
    for key in ("input_ids", "labels", "position_ids"):
        part[key] = batch[key][:, start:end]
    if "logits_to_keep" in batch:
        keep = batch["logits_to_keep"]
        inside = (keep >= start) & (keep < end)
        part["logits_to_keep"] = keep[inside] - start
        part["shift_labels"] = batch["shift_labels"][inside]
    return part


def trained_positions(labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """For a packed row (labels [1, tokens]): `logits_to_keep`, the positions whose next token is trained
    (1-D, ascending; see the module docstring); `shift_labels`, those next tokens. The same targets
    ForCausalLMLoss would take from `labels`, without logits for the others."""
    targets = torch.cat([labels[0, 1:], torch.full_like(labels[0, :1], IGNORE_INDEX)])
    keep = targets != IGNORE_INDEX
    return {"logits_to_keep": keep.nonzero()[:, 0], "shift_labels": targets[keep]}


def sdpa_varlen_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, run once per example of a packed row (from `cu_seq_lens_q`)
    with a plain causal mask; anything else (padded batches, generation) goes to sdpa unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    packed = cu_seq_lens_q is not None and query.shape[0] == 1 and query.shape[2] == key.shape[2] > 1
    if not packed or int(cu_seq_lens_q[-1]) != query.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    bounds = cu_seq_lens_q.tolist()
    outputs = [
        sdpa_attention_forward(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None,
                               dropout=dropout, scaling=scaling, **kwargs)[0]
        for s, e in zip(bounds[:-1], bounds[1:])
    ]
    return torch.cat(outputs, dim=1), None  # [batch, tokens, heads, head_dim], as sdpa returns


def register_varlen_attention() -> None:
    """Make `sdpa_varlen` a valid attn_implementation (masks as for sdpa, used when not packed)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(VARLEN_SDPA, sdpa_varlen_attention_forward)
    AttentionMaskInterface.register(VARLEN_SDPA, sdpa_mask)


def use_varlen_attention(model: nn.Module) -> str:
    """Switch a model on sdpa to sdpa_varlen; flash attention (varlen already) and eager (the library's
    block-diagonal mask) stay as they are. Returns the implementation the model now uses."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    current = base.config._attn_implementation
    if current == "sdpa":
        register_varlen_attention()
        base.set_attn_implementation(VARLEN_SDPA)
        return VARLEN_SDPA
    return current


def sft_collator(model: nn.Module, tokenizer: Any, data_args: Any, training_args: Any) -> Callable:
    """The collator an SFT run batches with: padded rows, or with --packing one padding-free row per
    batch (and the model's sdpa attention switched to sdpa_varlen), split into forwards of at most
    --max_forward_tokens. Logits are kept for trained positions only unless something else reads the
    full logits (label smoothing) or computes the loss from hidden states itself (Liger's fused linear
    cross-entropy)."""
    if not data_args.packing:
        return PaddingCollator(tokenizer.pad_token_id)
    use_varlen_attention(model)
    full_logits = training_args.use_liger_kernel or training_args.label_smoothing_factor != 0
    max_forward_tokens = data_args.max_forward_tokens
    if max_forward_tokens is None:  # DeepSpeed steps at every backward: one forward per batch there
        max_forward_tokens = CPU_FORWARD_TOKENS if trains_on_cpu(training_args) and not training_args.deepspeed else 0
    return PackingCollator(trained_logits_only=not full_logits, max_forward_tokens=max_forward_tokens)


@dataclass
class PreferencePackingCollator:
    """Preference pairs (data/preference.py records) as one padding-free row: every chosen sequence, then
    every rejected one, with position ids, boundaries and `use_cache` as PackingCollator sets them.

    Only reply tokens are scored, so the LM head runs only where the next token is in a reply:
    `logits_to_keep` holds those positions (1-D, as PackingCollator's; the model returns their logits in order),
    `reply_targets` holds the tokens they predict and `reply_index` the sequence each belongs to
    (0..2B-1: chosen i is i, rejected i is B + i). Precomputed reference log-probs, when the records
    carry them, come along as `reference_logps` in the same order."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        rows = [(f["chosen_ids"], f["chosen_start"], f["chosen_end"]) for f in features]
        rows += [(f["rejected_ids"], f["rejected_start"], f["rejected_end"]) for f in features]
        lengths = [len(ids) for ids, _, _ in rows]
        input_ids = torch.cat([torch.as_tensor(ids, dtype=torch.long) for ids, _, _ in rows])
        offsets = torch.as_tensor([0, *lengths]).cumsum(0)
        keep = torch.zeros(len(input_ids), dtype=torch.bool)
        for offset, (_, start, end) in zip(offsets.tolist(), rows):
            # Token t is predicted at t - 1; a reply never opens a sequence (the template puts its role
            # header first), so start - 1 stays inside the same sequence.
            keep[offset + start - 1:offset + end - 1] = True
        cu_seq_lens = offsets.to(torch.int32)
        batch: dict[str, Any] = {
            "input_ids": input_ids[None],
            "position_ids": torch.cat([torch.arange(n) for n in lengths])[None],
            "cu_seq_lens_q": cu_seq_lens,
            "cu_seq_lens_k": cu_seq_lens,
            "max_length_q": max(lengths),
            "max_length_k": max(lengths),
            "use_cache": False,
            "logits_to_keep": keep.nonzero()[:, 0],
            "reply_targets": input_ids[1:][keep[:-1]],
            "reply_index": torch.repeat_interleave(torch.arange(len(rows)),
                                                   torch.as_tensor([end - start for _, start, end in rows])),
        }
        if "reference_chosen_logps" in features[0]:
            batch["reference_logps"] = torch.as_tensor(
                [f["reference_chosen_logps"] for f in features] + [f["reference_rejected_logps"] for f in features],
                dtype=torch.float32)
        return batch
