"""Score conversations or preference pairs with a trained reward model, one output line per input row:
load the reward model -> read rows -> render as in training -> score -> write.

    python reward/score.py --model_name_or_path outputs/rm_demo --data_path data/demo/preference_eval.jsonl \\
        --output_file outputs/rm_demo/eval_scores.jsonl

Each input row gives one output line, in order: a preference pair {"chosen": s, "rejected": s}, a
conversation ending with an assistant turn {"score": s}; null where --max_seq_length drops it. Pairs
print their accuracy and mean margin.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..boundary import entry_point
from ..data.formats import Row, conversation_from_row, load_items, offered_tools
from ..data.preference import encode_pair, is_pair_row, pair_from_row
from ..hparams import DataArguments, ScoreArguments, parse_run
from ..models.loader import load_for_inference
from ..models.scoring import score_sequences
from ..utils.io import atomic_write_jsonl

logger = logging.getLogger(__name__)


def _sequences(tokenizer: Any, row: Row, max_length: int | None) -> list[list[int]] | None:
    """The token sequences a row asks to score, or None when they do not fit: rendered as training renders them,
    the row's tools included."""
    if is_pair_row(row):
        pair = pair_from_row(row)
        enc = encode_pair(tokenizer, pair.context, pair.chosen, pair.rejected, max_length, offered_tools(row))
        return None if enc is None else [enc.chosen_ids, enc.rejected_ids]
    conversation = conversation_from_row(row)
    messages = conversation.messages
    enc = encode_pair(tokenizer, messages[:-1], messages[-1:], messages[-1:], max_length, conversation.tools)
    return None if enc is None else [enc.chosen_ids]


def score_file(model: Any, tokenizer: Any, data: DataArguments, score: ScoreArguments) -> list[dict]:
    """One dict per row of the data files (the first --max_samples rows, or all), in order."""
    rows, _ = load_items(data.data_path, lambda row: row, data.max_samples)
    per_row = [_sequences(tokenizer, row, data.max_seq_length) for row in rows]
    flat = [seq for seqs in per_row if seqs for seq in seqs]
    scores = iter(score_sequences(model, tokenizer, flat, score.batch_size))
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


def run(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_run("score", argv, __doc__)
    model, tokenizer = load_for_inference(args.model, task="reward")
    results = score_file(model, tokenizer, args.data, args.score)
    atomic_write_jsonl(args.score.output_file, results)
    skipped = sum(None in r.values() for r in results)
    print(f"{' '.join(args.data.data_path)}: scored {len(results) - skipped} of {len(results)} rows -> "
          f"{args.score.output_file}"
          + (f" ({skipped} did not fit in --max_seq_length {args.data.max_seq_length}: null)" if skipped else ""))
    summary = pair_summary(results)
    if summary:
        print(f"pairs: {summary['pairs']}  accuracy: {summary['accuracy']:.4f}  mean margin: {summary['margin']:.4f}")
    return results


main = entry_point(run)
