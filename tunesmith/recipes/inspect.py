"""Show which tokens of each example are trained: the rendered conversation with the trained text
highlighted (green in a terminal, wrapped in ⟦…⟧ otherwise), and the counts.

    tunesmith inspect --data_path data/demo/sft.jsonl --max_samples 3
    tunesmith inspect --data_path F --max_seq_length 256 --output_jsonl encoded.jsonl

--output_jsonl writes one JSON line per input row, in input order: its source, input_ids and labels
(IGNORE_INDEX = -100 where nothing is trained), or `"dropped": true` when nothing trainable fits.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..boundary import entry_point
from ..data.inspect import highlight_trained, inspect_rows
from ..data.template import trained_token_count
from ..hparams import parse_run
from ..models.loader import load_tokenizer
from ..utils.io import atomic_write_jsonl


def run(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_run("inspect", argv, __doc__)
    tokenizer = load_tokenizer(args.model)
    records = inspect_rows(tokenizer, args.data)
    color = args.inspect.color == "always" or (args.inspect.color == "auto" and sys.stdout.isatty())
    shown = records if args.inspect.show < 0 else records[: args.inspect.show]
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
    if args.inspect.output_jsonl:
        atomic_write_jsonl(args.inspect.output_jsonl, records)
    return records



main = entry_point(run)
