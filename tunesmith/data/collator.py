"""Batching for causal-LM training (right padding with the pad id, IGNORE_INDEX for padded labels) and
for preference pairs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..constants import IGNORE_INDEX


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
class PreferenceCollator:
    """Preference pairs (data/preference.py records) as one batch: the chosen sequences, then the
    rejected ones, right-padded (as trl's DataCollatorForPreference pads them), plus `loss_mask`: 1 on
    the tokens of each reply (its end-of-turn included), 0 on the context and the padding."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        rows = [(f["chosen_ids"], f["chosen_start"], f["chosen_end"]) for f in features]
        rows += [(f["rejected_ids"], f["rejected_start"], f["rejected_end"]) for f in features]
        longest = max(len(ids) for ids, _, _ in rows)
        if self.pad_to_multiple_of:
            longest = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
        input_ids = torch.full((len(rows), longest), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), longest), dtype=torch.long)
        loss_mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for i, (ids, start, end) in enumerate(rows):
            input_ids[i, :len(ids)] = torch.as_tensor(ids)
            attention_mask[i, :len(ids)] = 1
            loss_mask[i, start:end] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}
