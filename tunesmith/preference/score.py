"""Score conversations or preference pairs with a trained reward model, one output line per input row:
load the reward model -> read rows -> render as in training -> score -> write.

    tunesmith score --model_name_or_path outputs/rm_demo --data_path data/demo/preference_eval.jsonl \\
        --output_file outputs/rm_demo/eval_scores.jsonl

Each input row gives one output line, in order: a preference pair {"chosen": s, "rejected": s}, a
conversation ending with an assistant turn {"score": s}; null where --max_seq_length drops it. Pairs
print their accuracy and mean margin. A vision-language reward model (Gemma 3's) reads the rows' pictures.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from ..boundary import entry_point
from ..data.formats import Row, conversation_from_row, load_items, offered_tools
from ..data.image_encoding import processed_batch
from ..data.images import DEFAULT_MAX_IMAGE_PIXELS
from ..data.preference import PreferencePair, encode_pair, encode_pair_record, is_pair_row, pair_from_row
from ..data.template import processor_of
from ..families import is_vision_language
from ..hparams import DataArguments, parse_run
from ..models.loader import load_for_inference
from ..models.scoring import score_sequences, sequence_scores
from ..utils.io import atomic_write_jsonl
from .args import ScoreArguments

logger = logging.getLogger(__name__)


def _as_pair(row: Row) -> PreferencePair:
    """A preference row's pair; a conversation's last reply as both sides of one (its score is the chosen one)."""
    if is_pair_row(row):
        return pair_from_row(row)
    messages = conversation_from_row(row).messages
    return PreferencePair(row, messages[:-1], messages[-1:], messages[-1:])


def _sequences(tokenizer: Any, row: Row, max_length: int | None) -> list[list[int]] | None:
    """The token sequences a row asks to score, or None when they do not fit: rendered as training renders them,
    the row's tools included."""
    pair = _as_pair(row)
    enc = encode_pair(tokenizer, pair.context, pair.chosen, pair.rejected, max_length, offered_tools(row))
    if enc is None:
        return None
    return [enc.chosen_ids, enc.rejected_ids] if is_pair_row(row) else [enc.chosen_ids]


@torch.no_grad()
def score_image_rows(model: Any, tokenizer: Any, rows: list[Row], max_length: int | None, batch_size: int
                     ) -> list[list[float] | None]:
    """A vision-language reward model's scores of each row ([chosen, rejected], or [score]; None when it does
    not fit): each row encoded as training encodes a pair, each sequence it asks to score through the model's
    processor with the row's pictures, batch_size sequences a batch."""
    processor = processor_of(tokenizer)
    found = [encode_pair_record(tokenizer, _as_pair(row), max_length) for row in rows]
    sequences = [(k, side, enc.records[0]) for k, enc in enumerate(found) if enc is not None
                 for side in (("chosen", "rejected") if is_pair_row(rows[k]) else ("chosen",))]
    scores: list[list[float]] = [[] for _ in rows]
    device = next(model.parameters()).device
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start:start + batch_size]
        records = [record for _, _, record in chunk]
        batch = processed_batch(processor, records, [r[f"{side}_text"] for _, side, r in chunk],
                                [r["images"] for r in records], [r[f"{side}_ids"] for _, side, r in chunk],
                                DEFAULT_MAX_IMAGE_PIXELS)
        values = sequence_scores(model, **{key: value.to(device) for key, value in batch.items()})
        for (k, _, _), value in zip(chunk, values.float().tolist()):
            scores[k].append(value)
    return [values or None for values in scores]


def score_file(model: Any, tokenizer: Any, data: DataArguments, score: ScoreArguments) -> list[dict]:
    """One dict per row of the data files (the first --max_samples rows, or all), in order."""
    rows, _ = load_items(data.data_path, lambda row: row, data.max_samples, max_row_bytes=data.max_row_bytes)
    if is_vision_language(tokenizer):
        per_row = score_image_rows(model, tokenizer, rows, data.max_seq_length, score.batch_size)
        scores = iter(value for values in per_row if values for value in values)
    else:
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
