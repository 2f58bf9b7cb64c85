"""Every collator: right padding with the pad id and IGNORE_INDEX for padded labels (PaddingCollator), and the
padding-free rows of data/packing.py for SFT examples (PackingCollator), preference pairs
(PreferencePackingCollator) and KTO's judged replies (KTOPackingCollator)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..constants import IGNORE_INDEX
from .packing import FORWARD_SPLITS, SIZED_BY_FREE_MEMORY, forward_splits, trained_positions


@dataclass
class PaddingCollator:
    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        if self.pad_to_multiple_of:
            longest = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
        input_ids = torch.full((len(features), longest), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(features), longest), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(features), longest), dtype=torch.long)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            input_ids[i, :n] = torch.as_tensor(f["input_ids"])
            labels[i, :n] = torch.as_tensor(f["labels"])
            attention_mask[i, :n] = 1
        return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


@dataclass
class PackingCollator:
    """A batch of `{"input_ids", "labels"}` examples as one padding-free row of shape [1, total_tokens].
    With max_forward_tokens, a row longer than that also carries `forward_splits`: the token offsets
    where StageTrainer cuts it into forwards of whole examples (see forward_splits()); None leaves the forwards'
    size to the trainer, from the free GPU memory (train/forward_budget.py); 0: one forward."""

    trained_logits_only: bool = True
    max_forward_tokens: int | None = 0

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
        if self.max_forward_tokens is None:
            batch[FORWARD_SPLITS] = SIZED_BY_FREE_MEMORY
        elif self.max_forward_tokens and len(input_ids[0]) > self.max_forward_tokens:
            batch[FORWARD_SPLITS] = forward_splits(lengths, self.max_forward_tokens)
        return batch


def pack_replies(rows: list[tuple[list[int], int, int]]) -> dict[str, Any]:
    """Sequences `(ids, start, end)` as one padding-free row scored on their replies `[start, end)` only: the
    model's inputs (position ids, boundaries and `use_cache` as PackingCollator sets them), `logits_to_keep`
    (1-D, as PackingCollator's: the positions that predict a reply token; the model returns their logits in
    order), `reply_targets` (the tokens they predict) and `reply_index` (the sequence each belongs to)."""
    lengths = [len(ids) for ids, _, _ in rows]
    input_ids = torch.cat([torch.as_tensor(ids, dtype=torch.long) for ids, _, _ in rows])
    offsets = torch.as_tensor([0, *lengths]).cumsum(0)
    keep = torch.zeros(len(input_ids), dtype=torch.bool)
    for offset, (_, start, end) in zip(offsets.tolist(), rows):
        # Token t is predicted at t - 1; a reply never opens a sequence (the template puts its role
        # header first), so start - 1 stays inside the same sequence.
        keep[offset + start - 1:offset + end - 1] = True
    cu_seq_lens = offsets.to(torch.int32)
    return {
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


def pair_rows(features: list[dict[str, Any]]) -> list[tuple[list[int], int, int]]:
    """Every chosen sequence of a batch of preference pairs, then every rejected one."""
    rows = [(f["chosen_ids"], f["chosen_start"], f["chosen_end"]) for f in features]
    return rows + [(f["rejected_ids"], f["rejected_start"], f["rejected_end"]) for f in features]


@dataclass
class PreferencePackingCollator:
    """Preference pairs (data/preference.py records) as one padding-free row (pack_replies): every chosen
    sequence, then every rejected one, so chosen i is sequence i and rejected i is B + i. Precomputed
    reference log-probs, when the records carry them, come along as `reference_logps` in the same order."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        return with_reference_logps(pack_replies(pair_rows(features)), features)


def with_reference_logps(batch: dict[str, Any], features: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch of pairs with their precomputed reference log-probs, when the records carry them (DPO's
    --precompute_ref_logps), as `reference_logps`: every chosen one, then every rejected one."""
    if "reference_chosen_logps" in features[0]:
        batch["reference_logps"] = torch.as_tensor(
            [f["reference_chosen_logps"] for f in features] + [f["reference_rejected_logps"] for f in features],
            dtype=torch.float32)
    return batch


def mismatched_replies(rows: list[tuple[list[int], int, int]]) -> list[tuple[list[int], int, int]]:
    """KTO's sequences for its KL estimate: each row's prompt with the reply of the row `shift` places before
    it (a rotation, so every reply of the batch is used once), `shift` the smallest under which no prompt meets
    a reply of the same prompt (a pair's other reply); 1 where none avoids it (a batch of one prompt)."""
    prompts = [ids[:start] for ids, start, _ in rows]
    n = len(rows)
    shift = next((k for k in range(1, n) if all(prompts[i] != prompts[i - k] for i in range(n))), 1)
    mismatched = []
    for i, prompt in enumerate(prompts):
        ids, start, end = rows[(i - shift) % n]
        mismatched.append((prompt + ids[start:end], len(prompt), len(prompt) + end - start))
    return mismatched


@dataclass
class KTOPackingCollator:
    """KTO's batches: the judged replies (data/unpaired.py records, `desirable` per sequence) or, in
    evaluation, preference pairs (every chosen reply desirable, every rejected one not: pair i is
    sequences i and B + i, `pairs` True), packed as pack_replies does, plus under `kl` the same prompts
    with other rows' replies (mismatched_replies), packed apart: they go through the model without
    gradients, for the KL estimate only. Their tokens add up to the batch's own."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        pairs = "chosen_ids" in features[0]
        if pairs:
            rows = pair_rows(features)
            desirable = [True] * len(features) + [False] * len(features)
        else:
            rows = [(f["ids"], f["start"], f["end"]) for f in features]
            desirable = [bool(f["desirable"]) for f in features]
        batch = pack_replies(rows)
        batch["desirable"] = torch.as_tensor(desirable, dtype=torch.bool)
        batch["pairs"] = pairs
        batch["kl"] = pack_replies(mismatched_replies(rows))
        return batch
