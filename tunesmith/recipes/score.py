"""Scoring recipe: load a reward model -> read rows -> render as in training -> score -> write.

    python reward/score.py --model_name_or_path outputs/rm_demo --data_path data/demo/preference_eval.jsonl \
        --output_jsonl outputs/rm_demo/eval_scores.jsonl

Each input row gives one output line, in order: a preference pair {"chosen": s, "rejected": s}, a
conversation ending with an assistant turn {"score": s}; null where --max_seq_length drops it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import parse_args
from ..data.formats import Row, conversation_from_row, detect_format, read_rows
from ..data.preference import encode_pair, is_pair_row, pair_from_row
from ..models.loader import inference_model_args, load_for_inference
from ..train.reward_trainer import score_sequences
from ..utils.io import atomic_write_jsonl
from ..utils.logging import setup_logging

logger = logging.getLogger(__name__)


@dataclass
class ScoreArguments:
    data_path: str = field(
        metadata={"help": "A JSON/JSONL file of preference pairs (as for training) and/or conversations "
                  "(OpenAI messages, ShareGPT or Alpaca) ending with the assistant reply to score."}
    )
    output_jsonl: str = field(metadata={"help": "Where to write one JSON line of scores per input row."})
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "The reward model: a full/merged model directory, or a LoRA adapter directory (its base "
                  "model is read from adapter_config.json)."},
    )
    adapter: str | None = field(
        default=None, metadata={"help": "A LoRA reward adapter to load on top of --model_name_or_path."}
    )
    max_seq_length: int | None = field(
        default=None,
        metadata={"help": "Truncate like training does (context first; replies kept whole). Default: score every "
                  "sequence whole."},
    )
    batch_size: int = field(default=8, metadata={"help": "Sequences per forward pass."})


def _sequences(tokenizer: Any, row: Row, max_length: int | None) -> list[list[int]] | None:
    """The token sequences a row asks to score, or None when they do not fit."""
    if is_pair_row(row):
        pair = pair_from_row(row)
        enc = encode_pair(tokenizer, pair.context, pair.chosen, pair.rejected, max_length)
        return None if enc is None else [enc.chosen_ids, enc.rejected_ids]
    messages = conversation_from_row(row, detect_format(row)).messages
    enc = encode_pair(tokenizer, messages[:-1], messages[-1:], messages[-1:], max_length)
    return None if enc is None else [enc.chosen_ids]


def score_file(model: Any, tokenizer: Any, args: ScoreArguments) -> list[dict]:
    """One dict per row of args.data_path, in order."""
    rows = list(read_rows(args.data_path))
    per_row = [_sequences(tokenizer, row, args.max_seq_length) for row in rows]
    flat = [seq for seqs in per_row if seqs for seq in seqs]
    scores = iter(score_sequences(model, tokenizer, flat, args.batch_size))
    results = []
    for row, seqs in zip(rows, per_row):
        keys = ("chosen", "rejected") if is_pair_row(row) else ("score",)
        results.append({key: (next(scores) if seqs else None) for key in keys})
    return results


def pair_summary(results: list[dict]) -> dict[str, float] | None:
    """Accuracy (chosen scored strictly higher) and mean margin over the scored pairs."""
    pairs = [r for r in results if "chosen" in r and r["chosen"] is not None]
    if not pairs:
        return None
    margins = [r["chosen"] - r["rejected"] for r in pairs]
    return {"pairs": len(pairs), "accuracy": sum(m > 0 for m in margins) / len(pairs),
            "margin": sum(margins) / len(pairs)}


def main(argv: Sequence[str] | None = None) -> list[dict]:
    setup_logging()
    (args,) = parse_args((ScoreArguments,), argv)
    model_args = inference_model_args(args.model_name_or_path, args.adapter)
    model, tokenizer = load_for_inference(model_args, task="reward")
    if torch.cuda.is_available() and model_args.quantization_bit is None:
        model.cuda()
    results = score_file(model, tokenizer, args)
    atomic_write_jsonl(args.output_jsonl, results)
    skipped = sum(None in r.values() for r in results)
    print(f"{args.data_path}: scored {len(results) - skipped} of {len(results)} rows -> {args.output_jsonl}"
          + (f" ({skipped} did not fit in --max_seq_length {args.max_seq_length}: null)" if skipped else ""))
    summary = pair_summary(results)
    if summary:
        print(f"pairs: {summary['pairs']}  accuracy: {summary['accuracy']:.4f}  mean margin: {summary['margin']:.4f}")
    return results
