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
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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


# A document longer than PIECE_CHARS characters is tokenized in pieces of about that many, so that its tokenization
# holds one piece's tokens, offsets and strings at a time, never the whole document's (tens of millions of tokens for
# a 60 MB file). A piece ends where the tokenizer's own pre-tokenizer splits the text (checked on CUT_WINDOW
# characters either side, at a whitespace character after a non-whitespace one): tokens never span a pre-token
# boundary, so the pieces' tokens are the whole document's. A tokenizer for which pieces and the whole differ on
# PIECES_PROBE (one that adds a prefix space to every text, say) tokenizes whole, as before.
PIECE_CHARS = 1 << 18
CUT_WINDOW = 64
CUT_SEARCH = 1 << 16  # how far past the wanted end a piece looks for a cut before it goes on to the next window
PIECES_PROBE = ("The first line.\nA second  line, with  two spaces;\tand a tab, 42 numbers and 3.14.\n\n"
                "New paragraph: émigré café, 日本語の文章, don't stop — 🙂 done.\r\n   indented\n") * 3
PIECES_EXACT_ATTRIBUTE = "_tunesmith_pieces_exact"
WHITESPACE_AFTER_TEXT = re.compile(r"(?<=\S)\s")


def _splits_at(pre_tokenizer: Any, text: str, cut: int) -> bool:
    """Whether the pre-tokenizer, on the characters around `cut`, starts a pre-token there."""
    start = max(cut - CUT_WINDOW, 0)
    window = text[start:cut + CUT_WINDOW]
    return any(begin == cut - start for _, (begin, _) in pre_tokenizer.pre_tokenize_str(window))


def piece_cuts(tokenizer: Any, text: str, piece_chars: int = PIECE_CHARS) -> list[int] | None:
    """Where to cut text into pieces of about piece_chars characters, each cut a pre-token boundary; None when the
    tokenizer has no pre-tokenizer to ask (a slow tokenizer)."""
    pre_tokenizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "pre_tokenizer", None)
    if pre_tokenizer is None:
        return None
    cuts, wanted = [], piece_chars
    while wanted < len(text):
        cut = next((m.start() for m in WHITESPACE_AFTER_TEXT.finditer(text, wanted, wanted + CUT_SEARCH)
                    if _splits_at(pre_tokenizer, text, m.start())), None)
        if cut is None:  # no boundary here (a run without whitespace): look further on
            wanted += CUT_SEARCH
            continue
        cuts.append(cut)
        wanted = cut + piece_chars
    return cuts


def _ids_in_pieces(tokenizer: Any, text: str, cuts: list[int]) -> list[np.ndarray]:
    """The tokens of text with the tokenizer's own special tokens, tokenized piece by piece: the arrays to join, int32
    (a vocabulary is far smaller than 2**31: 4 bytes a token)."""
    bounds = [0, *cuts, len(text)]
    pieces = [np.asarray(tokenizer(text[a:b], add_special_tokens=False)["input_ids"], dtype=np.int32)
              for a, b in zip(bounds, bounds[1:])]
    first = text[:bounds[1]]  # where the special tokens go: those the tokenizer adds around a text
    plain, special = (tokenizer(first, add_special_tokens=flag)["input_ids"] for flag in (False, True))
    at = next(k for k in range(len(special) - len(plain) + 1) if special[k:k + len(plain)] == plain)
    head, tail = special[:at], special[at + len(plain):]
    return [np.asarray(head, dtype=np.int32), *pieces, np.asarray(tail, dtype=np.int32)]


def pieces_are_exact(tokenizer: Any) -> bool:
    """Whether this tokenizer's pieces give the whole text's tokens on PIECES_PROBE, cut everywhere they may be."""
    known = getattr(tokenizer, PIECES_EXACT_ATTRIBUTE, None)
    if known is None:
        cuts = piece_cuts(tokenizer, PIECES_PROBE, piece_chars=1)
        whole = tokenizer(PIECES_PROBE, add_special_tokens=True)["input_ids"]
        known = bool(cuts) and np.concatenate(_ids_in_pieces(tokenizer, PIECES_PROBE, cuts)).tolist() == whole
        setattr(tokenizer, PIECES_EXACT_ATTRIBUTE, known)
    return known


def document_token_array(tokenizer: Any, text: str, add_eos: bool = True,
                         piece_chars: int = PIECE_CHARS) -> np.ndarray | list[int]:
    """The document's tokens: the tokenizer's own special tokens (its BOS, where it adds one), and its EOS at the
    end when add_eos and the tokenizer did not add it. A document longer than piece_chars characters is tokenized
    in pieces (PIECE_CHARS) and comes back as one int32 array: the same tokens, in a fraction of the memory."""
    cuts = piece_cuts(tokenizer, text, piece_chars) if len(text) > piece_chars and pieces_are_exact(tokenizer) else None
    if not cuts:
        return document_ids(tokenizer, text, add_eos, piece_chars=None)
    parts = _ids_in_pieces(tokenizer, text, cuts)
    last = next((part[-1] for part in reversed(parts) if len(part)), None)
    eos = tokenizer.eos_token_id
    if add_eos and eos is not None and last != eos:
        parts.append(np.asarray([eos], dtype=np.int32))
    return np.concatenate(parts)  # the one copy of the document's tokens


def document_ids(tokenizer: Any, text: str, add_eos: bool = True, piece_chars: int | None = PIECE_CHARS) -> list[int]:
    """document_token_array as a list (piece_chars None: tokenized whole)."""
    if piece_chars is not None:
        ids = document_token_array(tokenizer, text, add_eos, piece_chars)
        return ids.tolist() if isinstance(ids, np.ndarray) else ids
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    eos = tokenizer.eos_token_id
    if add_eos and eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
    return ids


def cut_into_pieces(ids: list[int] | np.ndarray, max_length: int, stride: int = 0) -> list[dict[str, Any]]:
    """Pieces of at most max_length tokens covering ids in order. A piece after the first starts `stride` tokens
    before the previous one ended; those tokens are context (labels IGNORE_INDEX), so every token is a label in one
    piece only. A last piece with nothing new to train (one token without a stride) is left out. An array's pieces
    are arrays (views of it), a list's lists."""
    if stride >= max_length:
        raise ValueError(f"stride {stride} must be smaller than the piece length {max_length}")
    pieces, start, trained_to = [], 0, 0
    while trained_to < len(ids):
        end = min(start + max_length, len(ids))
        piece = ids[start:end]
        if isinstance(piece, np.ndarray):  # views of one array: no copy where every token trains (no stride)
            context = trained_to - start
            labels = piece if not context else np.concatenate([np.full(context, IGNORE_INDEX, piece.dtype),
                                                               piece[context:]])
        else:
            labels = [IGNORE_INDEX] * (trained_to - start) + piece[trained_to - start:]
        if stride or len(piece) > 1 or not pieces:
            pieces.append({"input_ids": piece, "labels": labels})
        trained_to = end
        start = max(end - stride, 0)
    return pieces


