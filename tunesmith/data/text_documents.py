"""Raw text as documents, and documents as the pieces training takes (continued pre-training, `tunesmith pt`, and
`tunesmith inspect` of a text corpus).

A .txt file gives its documents (--document_separator: the whole file, blank-line runs, or a separator line), each
as a Row that starts on its first line; JSON/JSONL/Parquet files give one document per row, from --text_column, read
by the core's reader (data/formats.read_rows). A document is tokenized as it is (no chat template), with the BOS the
tokenizer adds and the EOS that --add_eos appends, then cut into pieces of at most --max_seq_length tokens, each a
record {input_ids, labels} with labels equal to input_ids: every token trains, except the tokens a --stride repeats
from the piece before (context, trained once already). The packing collator then ignores each piece's first label,
which no token of the same piece predicts."""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..constants import IGNORE_INDEX
from ..errors import DataError
from ..hparams.data_args import DEFAULT_MAX_ROW_BYTES
from .formats import Row, read_rows

TEXT_SUFFIX = ".txt"
# --document_separator's two named ways to cut a .txt file; any other value is a line that stands between documents.
WHOLE_FILE = "file"
BLANK_LINE = "blank_line"


@dataclass(frozen=True)
class Document:
    row: Row  # where it came from (file and first line)
    text: str


def is_text_file(path: str) -> bool:
    return Path(path).suffix == TEXT_SUFFIX


def text_file_rows(path: str, separator: str, column: str) -> Iterator[Row]:
    """The documents of a .txt file as rows {column: text}, each numbered by the line it starts on; blank
    documents (between two separators, or a file of blanks) are none."""
    raw = Path(path).read_bytes()
    start = 3 if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        text = raw[start:].decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, start + e.start) + 1
        raise DataError(f"{path}:line {line}: not UTF-8 text: byte {start + e.start} is 0x{raw[start + e.start]:02x}; "
                        "save the file as UTF-8") from None
    lines = text.splitlines(keepends=True)
    if separator == WHOLE_FILE:
        ends = lambda line: False  # noqa: E731 (one document: nothing ends it)
    elif separator == BLANK_LINE:
        ends = lambda line: not line.strip()  # noqa: E731
    else:
        ends = lambda line: line.rstrip("\r\n") == separator  # noqa: E731
    document: list[str] = []
    first = 1
    for number, line in enumerate(lines, 1):
        if ends(line):
            yield from _document(path, first, document, column)
            document, first = [], number + 1
        else:
            document.append(line)
    yield from _document(path, first, document, column)


def _document(path: str, first: int, lines: list[str], column: str) -> Iterator[Row]:
    """The document of these lines (the first is line `first`), numbered by its first line that is not blank."""
    for k, line in enumerate(lines):
        if line.strip():
            yield Row(path, first + k, {column: "".join(lines[k:]).rstrip("\r\n")})
            return


def read_text_rows(path: str, strict: bool = True, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES, *,
                   separator: str = WHOLE_FILE, column: str = "text") -> Iterator[Row | DataError]:
    """The rows of one data file: a .txt file's documents, or the core's rows of any other file."""
    if not is_text_file(path):
        yield from read_rows(path, strict, max_row_bytes)
        return
    try:
        yield from text_file_rows(path, separator, column)
    except DataError as error:
        if strict:
            raise
        yield error


def document_from_row(row: Row, column: str = "text") -> Document:
    """The document of a row, or a DataError naming its file, line and field."""
    if column not in row.data:
        raise row.error(f"no `{column}` field (keys: {sorted(row.data)}): name the field that holds the document "
                        "with --text_column")
    text = row.data[column]
    if not isinstance(text, str):
        raise row.error(f"expected the document as a string, got {type(text).__name__}", column)
    if not text.strip():
        raise row.error("the document is empty", column)
    return Document(row, text)


def document_ids(tokenizer: Any, text: str, add_eos: bool = True) -> list[int]:
    """The document's tokens: the tokenizer's own special tokens (its BOS, where it adds one), and its EOS at the
    end when add_eos and the tokenizer did not add it."""
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    eos = tokenizer.eos_token_id
    if add_eos and eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
    return ids


def cut_into_pieces(ids: list[int], max_length: int, stride: int = 0) -> list[dict[str, list[int]]]:
    """Pieces of at most max_length tokens covering ids in order. A piece after the first starts `stride` tokens
    before the previous one ended; those tokens are context (labels IGNORE_INDEX), so every token is a label in one
    piece only. A last piece with nothing new to train (one token without a stride) is left out."""
    if stride >= max_length:
        raise ValueError(f"stride {stride} must be smaller than the piece length {max_length}")
    pieces, start, trained_to = [], 0, 0
    while trained_to < len(ids):
        end = min(start + max_length, len(ids))
        piece = ids[start:end]
        labels = [IGNORE_INDEX] * (trained_to - start) + piece[trained_to - start:]
        if stride or len(piece) > 1 or not pieces:
            pieces.append({"input_ids": piece, "labels": labels})
        trained_to = end
        start = max(end - stride, 0)
    return pieces


