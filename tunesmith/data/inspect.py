"""Show which tokens of each example are trained.

    python -m tunesmith.data.inspect --data_path data/demo/sft.jsonl --max_samples 3
    python -m tunesmith.data.inspect --data_path F --max_seq_length 256 --output_jsonl encoded.jsonl

Trained text is highlighted (green) in a terminal, and wrapped in ⟦…⟧ when the output is not one.
--output_jsonl writes one JSON line per input row, in input order: its source, input_ids and labels
(IGNORE_INDEX = -100 where nothing is trained), or `"dropped": true` when nothing trainable fits.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import parse_args
from ..constants import IGNORE_INDEX
from ..hparams import DataArguments, ModelArguments
from ..models.loader import load_tokenizer
from ..utils.io import atomic_write_jsonl
from .formats import load_conversations
from .template import encode_conversation, trained_token_count, truncate

TRAINED_ON, TRAINED_OFF = "\x1b[42;30m", "\x1b[0m"
PLAIN_ON, PLAIN_OFF = "⟦", "⟧"


@dataclass
class InspectArguments:
    output_jsonl: str | None = field(default=None, metadata={"help": "Write input_ids/labels per input row here."})
    show: int = field(default=5, metadata={"help": "How many examples to print (0: none, -1: all)."})
    color: str = field(default="auto", metadata={"help": "auto (when stdout is a terminal), always, never."})


def highlight_trained(tokenizer: Any, input_ids: list[int], labels: list[int], color: bool) -> str:
    """The rendered text with every trained run of tokens marked."""
    on, off = (TRAINED_ON, TRAINED_OFF) if color else (PLAIN_ON, PLAIN_OFF)
    pieces, run, trained = [], [], None
    for tok, lab in zip(input_ids, labels):
        is_trained = lab != IGNORE_INDEX
        if trained is not None and is_trained != trained:
            pieces.append((trained, run))
            run = []
        run.append(tok)
        trained = is_trained
    if run:
        pieces.append((trained, run))
    text = ""
    for is_trained, ids in pieces:
        chunk = tokenizer.decode(ids, skip_special_tokens=False)
        text += f"{on}{chunk}{off}" if is_trained else chunk
    return text


def inspect_rows(tokenizer: Any, data_args: DataArguments) -> list[dict]:
    records = []
    for conv in load_conversations(data_args.data_path, data_args.max_samples):
        enc = truncate(encode_conversation(tokenizer, conv.messages, data_args.train_on), data_args.max_seq_length)
        record: dict[str, Any] = {"source": conv.row.path, "line": conv.row.line}
        if trained_token_count(enc.labels) == 0:
            record["dropped"] = True
        record.update(input_ids=enc.input_ids, labels=enc.labels)
        records.append(record)
    return records


def main(argv: Sequence[str] | None = None) -> list[dict]:
    model_args, data_args, inspect_args = parse_args((ModelArguments, DataArguments, InspectArguments), argv)
    tokenizer = load_tokenizer(model_args)
    records = inspect_rows(tokenizer, data_args)
    color = inspect_args.color == "always" or (inspect_args.color == "auto" and sys.stdout.isatty())
    shown = records if inspect_args.show < 0 else records[: inspect_args.show]
    for r in shown:
        n = trained_token_count(r["labels"])
        status = "DROPPED (no trained token fits)" if r.get("dropped") else f"{n}/{len(r['input_ids'])} tokens trained"
        print(f"=== {r['source']}:{r['line']}  {status}")
        print(highlight_trained(tokenizer, r["input_ids"], r["labels"], color))
    kept = [r for r in records if not r.get("dropped")]
    total = sum(len(r["input_ids"]) for r in kept)
    trained = sum(trained_token_count(r["labels"]) for r in kept)
    print(f"{len(records)} rows, {len(records) - len(kept)} dropped; {trained}/{total} tokens trained "
          f"({100 * trained / max(total, 1):.1f}%)")
    if inspect_args.output_jsonl:
        atomic_write_jsonl(inspect_args.output_jsonl, records)
    return records


if __name__ == "__main__":
    main()
