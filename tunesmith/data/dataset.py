"""Tokenized SFT datasets: read -> render and mask -> truncate -> drop examples with nothing to
train, cached on disk under a key made of the data files, the tokenizer, its chat template and
the arguments that change the result."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset, load_from_disk

from ..hparams import SFTDataArguments
from ..utils.io import atomic_directory
from ..utils.paths import cache_root
from .formats import Conversation, load_conversations
from .template import encode_conversation, trained_token_count, truncate

logger = logging.getLogger(__name__)

# Bump when encoding changes, so old caches are not reused.
ENCODING_VERSION = "1"


@dataclass
class EncodeStats:
    rows: int = 0
    kept: int = 0
    dropped_no_trained_tokens: int = 0
    truncated: int = 0

    def report(self, name: str) -> str:
        return (f"{name}: {self.rows} rows -> {self.kept} examples ({self.truncated} truncated to max_seq_length, "
                f"{self.dropped_no_trained_tokens} dropped: no trained token left)")


def encode_conversations(
    tokenizer: Any, conversations: list[Conversation], max_seq_length: int, train_on: str
) -> tuple[list[dict], EncodeStats]:
    """One record per kept example: input_ids, labels, and the source row it came from."""
    stats = EncodeStats(rows=len(conversations))
    records = []
    for conv in conversations:
        full = encode_conversation(tokenizer, conv.messages, train_on)
        enc = truncate(full, max_seq_length)
        stats.truncated += len(enc.input_ids) < len(full.input_ids)
        if trained_token_count(enc.labels) == 0:
            stats.dropped_no_trained_tokens += 1
            logger.debug("%s: dropped, no trained token within max_seq_length", conv.row.where())
            continue
        records.append({"input_ids": enc.input_ids, "labels": enc.labels,
                        "source": conv.row.path, "line": conv.row.line})
    stats.kept = len(records)
    return records, stats


def tokenizer_fingerprint(tokenizer: Any) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    h.update((tokenizer.chat_template or "").encode())
    h.update(str(tokenizer.eos_token).encode())
    return h.hexdigest()


def cache_key(paths: list[str], tokenizer: Any, data_args: SFTDataArguments) -> str:
    h = hashlib.sha256(ENCODING_VERSION.encode())
    for p in paths:
        h.update(os.path.abspath(p).encode())
        h.update(Path(p).read_bytes())
    h.update(tokenizer_fingerprint(tokenizer).encode())
    h.update(json.dumps([data_args.max_seq_length, data_args.train_on, data_args.max_samples]).encode())
    return h.hexdigest()[:24]


def build_sft_dataset(tokenizer: Any, paths: list[str], data_args: SFTDataArguments, name: str = "train") -> Dataset:
    """The tokenized dataset for these files, from the cache when the same data, tokenizer, template
    and arguments were tokenized before."""
    cache_dir = cache_root() / "datasets" / cache_key(paths, tokenizer, data_args)
    if cache_dir.exists() and not data_args.overwrite_cache:
        logger.info("%s: tokenized data from cache %s", name, cache_dir)
        return load_from_disk(str(cache_dir))
    conversations = load_conversations(paths, data_args.max_samples)
    records, stats = encode_conversations(tokenizer, conversations, data_args.max_seq_length, data_args.train_on)
    logger.warning(stats.report(name))
    if not records:
        raise ValueError(f"{name}: no example has a trained token within --max_seq_length {data_args.max_seq_length}")
    dataset = Dataset.from_list(records)
    with atomic_directory(cache_dir) as tmp:
        dataset.save_to_disk(str(tmp))
    return load_from_disk(str(cache_dir))


def build_sft_datasets(tokenizer: Any, data_args: SFTDataArguments, seed: int = 42) -> tuple[Dataset, Dataset | None]:
    train = build_sft_dataset(tokenizer, data_args.data_path, data_args, "train")
    evaluation = None
    if data_args.eval_data_path:
        evaluation = build_sft_dataset(tokenizer, data_args.eval_data_path, data_args, "eval")
    elif data_args.eval_split_ratio > 0:
        split = train.train_test_split(test_size=data_args.eval_split_ratio, seed=seed)
        train, evaluation = split["train"], split["test"]
    return train, evaluation
