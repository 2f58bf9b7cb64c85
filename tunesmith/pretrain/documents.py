"""Continued pre-training's kind of data (data/dataset.py's DataKind): documents read by data/text_documents.py, each
cut into pieces that train every token; its reader and row parser bound to this run's --document_separator and
--text_column."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from ..data.dataset import DataKind, ItemEncoding
from ..data.text_documents import (
    Document,
    cut_into_pieces,
    document_from_row,
    document_token_array,
    read_text_rows,
)
from .args import PretrainDataArguments


def encode_document(tokenizer: Any, document: Document, max_seq_length: int, stride: int = 0,
                    add_eos: bool = True, **_: Any) -> ItemEncoding | None:
    """The pieces of one document (truncated: it was cut into more than one), each an int32 array (a view of the
    document's: the dataset is written from them without a Python int per token, data/dataset.records_to_dataset);
    a long document is tokenized in pieces (data/text_documents.py, PIECE_CHARS)."""
    ids = np.asarray(document_token_array(tokenizer, document.text, add_eos), dtype=np.int32)
    pieces = cut_into_pieces(ids, max_seq_length, stride)
    return ItemEncoding(pieces, truncated=len(pieces) > 1) if pieces else None


TEXT_DOCUMENTS = DataKind(
    name="pretrain",
    version="1",
    from_row=document_from_row,
    settings=lambda data_args: {"max_seq_length": data_args.max_seq_length, "stride": data_args.stride,
                                "add_eos": data_args.add_eos, "text_column": data_args.text_column,
                                "document_separator": data_args.document_separator},
    encode_one=encode_document,
    dropped_because="the document has no tokens",
    report_line="{name}: {rows} documents -> {kept} pieces ({truncated} documents longer than max_seq_length cut "
                "into several, {dropped} dropped: {dropped_because})",
    nothing_kept="no document has a token to train (--max_seq_length {max_seq_length})",
)


def text_kind(data_args: PretrainDataArguments) -> DataKind:
    """The data kind of this run's text: its reader and row parser bound to --document_separator and
    --text_column (both in the cache key, through the kind's settings)."""
    return replace(TEXT_DOCUMENTS,
                   from_row=partial(document_from_row, column=data_args.text_column),
                   read_rows=partial(read_text_rows, separator=data_args.document_separator,
                                     column=data_args.text_column))
