"""Show which tokens of each example are trained: the rendered conversation with the trained text
highlighted (green in a terminal, wrapped in ⟦…⟧ otherwise), and the counts. A text corpus (a .txt file, or rows
with a `text` field and no conversation: continued pre-training, `tunesmith pt`) is shown as its pieces.

    tunesmith inspect --data_path data/demo/sft.jsonl --max_samples 3
    tunesmith inspect --data_path F --max_seq_length 256 --output_file encoded.jsonl
    tunesmith inspect --data_path corpus.txt --document_separator blank_line --max_seq_length 256

--output_file writes one JSON line per input row, in input order: its source, input_ids and labels
(IGNORE_INDEX = -100 where nothing is trained), or `"dropped": true` when nothing trainable fits.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..boundary import entry_point
from ..data.inspect import highlight_trained, inspect_rows, inspect_text_pieces, is_text_corpus
from ..data.template import trained_token_count
from ..hparams import parse_run
from ..models.loader import load_tokenizer
from ..utils.io import atomic_write_jsonl


def run(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_run("inspect", argv, __doc__)
    tokenizer = load_tokenizer(args.model)
    if is_text_corpus(args.data.data_path, args.inspect.text_column, args.data.max_row_bytes):
        records = inspect_text_pieces(tokenizer, args.data, args.inspect.text_column,
                                      args.inspect.document_separator, args.inspect.seed)
    else:
        records = inspect_rows(tokenizer, args.data, args.inspect.seed)
    color = args.inspect.color == "always" or (args.inspect.color == "auto" and sys.stdout.isatty())
    shown = records if args.inspect.show < 0 else records[: args.inspect.show]
    for r in shown:
        example = " example {}/{}".format(*r["example"]) if "example" in r else ""  # a piece, for a text corpus
        print(f"=== {r['source']}:{r['line']}{example}  {_status(r)}")
        if "error" not in r:
            print(highlight_trained(tokenizer, r["input_ids"], r["labels"], color))
    print(summary(records))
    if args.inspect.output_file:
        atomic_write_jsonl(args.inspect.output_file, records)
    return records


def _status(record: dict) -> str:
    if "error" in record:
        return f"BAD ROW: {record['error']}"
    n, total = trained_token_count(record["labels"]), len(record["input_ids"])
    if record.get("dropped"):
        return f"DROPPED: no whole reply fits in --max_seq_length (shown untruncated, {total} tokens)"
    notes = [note for key, note in (("truncated", "truncated"), ("replies_without_end_marker",
                                                                 "a reply ends in no end-of-turn token")) if record.get(key)]
    return f"{n}/{total} tokens trained" + (f" ({', '.join(notes)})" if notes else "")


def summary(records: list[dict]) -> str:
    """rows read, bad, dropped, expanded; tokens trained."""
    rows = {(r["source"], r["line"], r.get("row")) for r in records}
    bad = sum("error" in r for r in records)
    examples = [r for r in records if "error" not in r]
    kept = [r for r in examples if not r.get("dropped")]
    expanded = {(r["source"], r["line"], r.get("row")) for r in examples if "example" in r}
    total = sum(len(r["input_ids"]) for r in kept)
    trained = sum(trained_token_count(r["labels"]) for r in kept)
    no_marker = sum(r.get("replies_without_end_marker", 0) for r in kept)
    expansions = (f", {len(expanded)} expanded into {sum(1 for r in examples if 'example' in r)} examples"
                  if expanded else "")
    return (f"{len(rows)} rows, {bad} bad, {len(examples) - len(kept)} dropped{expansions}; {trained}/{total} tokens trained "
            f"({100 * trained / max(total, 1):.1f}%)" + (f"; {no_marker} replies end in no end-of-turn token"
                                                          if no_marker else ""))


main = entry_point(run)
