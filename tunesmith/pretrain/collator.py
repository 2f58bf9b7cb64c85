"""A batch of pieces as training takes it: SFT's collators (padded rows, or one packed row in which each piece
attends within itself only: data/packing.py), or with --cross_document_attention one causal sequence."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch

from ..train.stage_trainer import sft_collator


@dataclass
class OneSequenceCollator:
    """The batch's pieces joined into one example before `packed` (a PackingCollator) makes its row: position ids
    run on across pieces, every token attends to all before it, and each piece's first token is predicted from the
    end of the piece before it; only the row's first token predicts nothing. The loss is that of one causal row."""

    packed: Callable[[list[dict[str, Any]]], dict[str, Any]]

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        joined = {key: list(chain.from_iterable(f[key] for f in features)) for key in ("input_ids", "labels")}
        return self.packed([joined])


def pretrain_collator(model: torch.nn.Module, tokenizer: Any, data_args: Any, training_args: Any) -> Callable:
    collator = sft_collator(model, tokenizer, data_args, training_args)
    return OneSequenceCollator(collator) if data_args.cross_document_attention else collator
