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
SDPA once per example with `is_causal`, the maths of flash attention's varlen kernel on any device
(models/attention.py).

The collators that build these rows (PackingCollator for SFT, PreferencePackingCollator for pairs) are in
data/collator.py; this module holds the row's own arithmetic: where to cut it, a part of it, its trained
positions.

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

from typing import Any

import torch

from ..constants import IGNORE_INDEX

FORWARD_SPLITS = "forward_splits"
# FORWARD_SPLITS' value in a row whose forwards the trainer sizes from the free GPU memory (train/forward_budget.py)
SIZED_BY_FREE_MEMORY = "free_memory"


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
    before a cut predicts nothing, and the part's loss terms are exactly the row's terms in it. An `end` inside an
    example keeps that example's beginning, for a measurement (train/forward_budget.ForwardBudget.probe)."""
    bounds = [b - start for b in batch["cu_seq_lens_q"].tolist() if start <= b <= end]
    if bounds[-1] != end - start:
        bounds.append(end - start)
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
