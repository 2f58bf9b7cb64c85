"""Which tokens of each example are trained, for people to read: the encoded rows as training would
see them, and the rendered text with every trained run of tokens marked. The command is
`tunesmith inspect` (inspect/command.py)."""

from __future__ import annotations

import logging
import re
from typing import Any

from ..constants import IGNORE_INDEX
from ..errors import UserError
from ..hparams import SFTDataArguments
from .dataset import fit_example
from .formats import BadRows, conversation_from_row, load_items, read_rows
from .images import message_images
from .mix import RowSelection
from .template import Encoded, encode_examples, processor_of, trained_token_count
from .text_documents import cut_into_pieces, document_from_row, document_ids, is_text_file, read_text_rows

logger = logging.getLogger(__name__)

# The fields that make a row a conversation (formats.detect_format), not a text corpus's document.
CONVERSATION_KEYS = {"messages", "conversations", "instruction", "chosen", "prompt"}
TRAINED_ON, TRAINED_OFF = "\x1b[42;30m", "\x1b[0m"
PLAIN_ON, PLAIN_OFF = "⟦", "⟧"


def _image_runs(tokenizer: Any, text: str) -> str:
    """Text with every run of 4 or more identical image tokens shown once with its count (Qwen's 64
    `<|image_pad|>` of one picture as `<|image_pad|>×64`), so an image reads as one line."""
    processor = processor_of(tokenizer)
    tokens = {t for t in (getattr(processor, "image_token", None), getattr(tokenizer, "image_token", None)) if t}
    for token in tokens:
        text = re.sub(f"(?:{re.escape(token)}){{4,}}", lambda m, t=token: f"{t}×{len(m[0]) // len(t)}", text)
    return text


def highlight_trained(tokenizer: Any, input_ids: list[int], labels: list[int], color: bool) -> str:
    """The rendered text with every trained run of tokens marked (a vision-language model's image tokens
    counted, not repeated)."""
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
        chunk = _image_runs(tokenizer, tokenizer.decode(ids, skip_special_tokens=False))
        text += f"{on}{chunk}{off}" if is_trained else chunk
    return text


def inspect_rows(tokenizer: Any, data_args: SFTDataArguments, seed: int = 42) -> list[dict]:
    """One record per example, in input order, as training encodes it: source, line, input_ids and
    labels (the whole untruncated example with `"dropped": true` when nothing trainable fits, so the
    reader sees why), `"example": [k, n]` for the k-th of n examples of an expanded conversation, and
    one record with `"error"` per bad row (every bad row is shown, none stops the inspection). The rows
    are those SFT trains on with the same --seed: its --data_split part, drawn by --data_weights."""
    selection = RowSelection.of(data_args, seed)
    try:
        conversations, problems = load_items(data_args.data_path, conversation_from_row, data_args.max_samples,
                                             skip_bad_rows=True, selection=selection,
                                             max_row_bytes=data_args.max_row_bytes)
    except BadRows as e:  # every row is bad: show them all
        conversations, problems = [], e.problems
    for note in selection.notes if selection else []:
        logger.info(note)
    records: list[dict] = [_error_record(problem) for problem in problems]
    for conv in conversations:
        where = {"source": conv.row.path, "line": conv.row.line, **({"row": conv.row.index} if conv.row.index else {})}
        try:
            examples, expanded = encode_examples(tokenizer, conv.messages, data_args.train_on, conv.tools,
                                                 data_args.multi_turn)
        except UserError as e:
            records.append({**where, "error": f"{conv.row.where()}: {e}"})
            continue
        images = message_images(conv.messages)
        for k, full in enumerate(examples):
            record: dict[str, Any] = dict(where)
            try:
                fitted, truncated = fit_example(tokenizer, full, images, data_args.max_seq_length,
                                                data_args.truncation, data_args.max_image_pixels)
            except UserError as e:
                records.append({**where, "error": f"{conv.row.where()}: {e}"})
                break
            if expanded:
                record["example"] = [k + 1, len(examples)]
            if fitted is None or trained_token_count(fitted.labels) == 0:
                record["dropped"] = True  # shown whole, so the reader sees why
                shown = Encoded(full.input_ids, full.labels)
            else:
                shown = Encoded(fitted.input_ids, fitted.labels)
                record.update({"truncated": True} if truncated else {})
                record.update({"images": fitted.images} if fitted.images else {})
            if full.replies_without_end_marker:
                record["replies_without_end_marker"] = full.replies_without_end_marker
            records.append({**record, "input_ids": shown.input_ids, "labels": shown.labels})
    return sorted(records, key=lambda r: (r["source"], r["line"], r.get("row") or 0))


def _error_record(problem: str) -> dict:
    where = re.match(r"(.*?):line (\d+)(?: \(row (\d+)\))?", problem)
    if not where:
        return {"source": "", "line": 0, "error": problem}
    record = {"source": where[1], "line": int(where[2]), "error": problem}
    return {**record, "row": int(where[3])} if where[3] else record


def is_text_corpus(paths: list[str], column: str, max_row_bytes: int) -> bool:
    """A continued pre-training corpus: a .txt file, or rows whose first has the text column and no conversation."""
    if any(is_text_file(p) for p in paths):
        return True
    try:
        first = next(iter(read_rows(paths[0], strict=False, max_row_bytes=max_row_bytes)), None)
    except UserError:
        return False
    data = getattr(first, "data", {})
    return column in data and not set(data) & CONVERSATION_KEYS


def inspect_text_pieces(tokenizer: Any, data_args: SFTDataArguments, column: str, separator: str,
                        seed: int = 42) -> list[dict]:
    """One record per piece, in input order, as `tunesmith pt` cuts a corpus (no stride): source, line (where the
    document starts), `"example": [k, n]` for the k-th of n pieces of a document, input_ids and labels (every token
    trains); one record with `"error"` per bad row."""
    def reader(path: str, strict: bool = True, max_row_bytes: int = data_args.max_row_bytes):
        return read_text_rows(path, strict, max_row_bytes, separator=separator, column=column)

    try:
        documents, problems = load_items(data_args.data_path, lambda row: document_from_row(row, column),
                                         data_args.max_samples, skip_bad_rows=True,
                                         selection=RowSelection.of(data_args, seed),
                                         max_row_bytes=data_args.max_row_bytes, reader=reader)
    except BadRows as e:
        documents, problems = [], e.problems
    records: list[dict] = [_error_record(problem) for problem in problems]
    for document in documents:
        where = {"source": document.row.path, "line": document.row.line,
                 **({"row": document.row.index} if document.row.index else {})}
        pieces = cut_into_pieces(document_ids(tokenizer, document.text), data_args.max_seq_length)
        for k, piece in enumerate(pieces):
            records.append({**where, **({"example": [k + 1, len(pieces)]} if len(pieces) > 1 else {}), **piece})
    return sorted(records, key=lambda r: (r["source"], r["line"], r.get("row") or 0))
