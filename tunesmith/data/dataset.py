"""One path from data files to a tokenized dataset, for every kind of data (SFT conversations,
preference pairs, RLHF prompts): read -> cap at --max_samples -> encode -> report -> cache. A
DataKind says what its kind does its own way (parse a row, encode, the words of its report); the
rest is here, once. The cache is keyed by the files' bytes, the tokenizer (vocabulary, chat
template, EOS token), the kind and the arguments its encoding takes, so the same inputs are
tokenized once and any change to them tokenizes again. The SFT kind lives here too."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset, load_from_disk
from datasets.fingerprint import generate_random_fingerprint
from datasets.table import InMemoryTable

from ..errors import ConfigError, DataError, UserError
from ..hparams import SFTDataArguments, TrainDataArguments
from ..hparams.data_args import DEFAULT_MAX_ROW_BYTES
from ..utils.io import atomic_directory, atomic_write_json
from ..utils.paths import cache_root
from .formats import BadRows, Conversation, Row, conversation_from_row, load_items
from .image_encoding import fit_with_images
from .images import DEFAULT_MAX_IMAGE_PIXELS, message_images
from .mix import RowSelection
from .row_bound import bound_messages, log_bounded, renders_alike
from .template import Encoded, encode_examples, processor_of, trained_token_count, truncate

logger = logging.getLogger(__name__)

STATS_FILE = "encode_stats.json"  # beside the cached dataset, so a cache hit reports what the first build did
BAD_ROWS_FILE = "bad_rows.txt"  # the rows --skip_bad_rows left out, one problem per line
SELECTION_FILE = "selection.txt"  # what --data_split and --data_weights chose, one line per file


@dataclass
class EncodeStats:
    """What encoding did to the rows it was given."""

    rows: int = 0
    kept: int = 0  # examples kept (an expanded conversation gives several)
    truncated: int = 0  # kept, but cut to fit the length limit
    dropped: int = 0  # not kept (the kind's report says why)
    expanded: int = 0  # conversations expanded into one example per reply
    bad: int = 0  # rows left out with --skip_bad_rows
    replies_without_end_marker: int = 0  # trained replies whose span ends in no special token

    @property
    def lossless(self) -> bool:
        return not (self.truncated or self.dropped or self.bad)


@dataclass
class ItemEncoding:
    """The records one item (row) gives, and what it took."""

    records: list[dict]
    truncated: bool = False
    expanded: bool = False
    replies_without_end_marker: int = 0


@dataclass(frozen=True)
class DataKind:
    """What one kind of data does its own way; build_dataset does the rest."""

    name: str  # its cache folder, and part of the cache key
    version: str  # bump when the encoding changes, so older caches are not reused
    from_row: Callable[[Row], Any]  # the item of one row (with a `.row`), or a DataError naming file, line, field
    settings: Callable[[Any], dict[str, Any]]  # the data arguments encode_one takes: exactly what the key holds
    # (tokenizer, item, **settings) -> ItemEncoding, or None when the item cannot be used
    encode_one: Callable[..., ItemEncoding | None]
    dropped_because: str  # why encode_one gives None
    report_line: str  # formatted with `name`, `dropped_because` and the EncodeStats fields
    nothing_kept: str  # the error when no record is kept, formatted with the settings
    # (path, strict, max_row_bytes) -> the rows of one file; None: formats.read_rows (JSON, JSONL, Parquet, ...)
    read_rows: Callable[..., Any] | None = None

    def report(self, name: str, stats: EncodeStats) -> str:
        return self.report_line.format(name=name, dropped_because=self.dropped_because, **asdict(stats))


def encode_items(kind: DataKind, tokenizer: Any, items: Sequence[Any], skip_bad_rows: bool = False,
                 **settings: Any) -> tuple[list[dict], EncodeStats, list[str]]:
    """The records of the items kept, each with the file and line of its row; the counts of what was
    cut, dropped or expanded; the problems of rows the template could not render (raised together
    unless skip_bad_rows)."""
    stats = EncodeStats(rows=len(items))
    records, problems = [], []
    for item in items:
        try:
            encoded = encode_item(kind, tokenizer, item, settings)
        except ConfigError:  # the model and the data do not go together: no row is at fault
            raise
        except UserError as e:
            problems.append(str(e))
            continue
        if encoded is None:
            stats.dropped += 1
            continue
        stats.truncated += encoded.truncated
        stats.expanded += encoded.expanded
        stats.replies_without_end_marker += encoded.replies_without_end_marker
        records += encoded.records
    if problems and not skip_bad_rows:
        raise BadRows(problems)
    stats.kept = len(records)
    return records, stats, problems


def encode_item(kind: DataKind, tokenizer: Any, item: Any, settings: dict[str, Any]) -> ItemEncoding | None:
    """The records of one item, each with the file, line and array position of its row; None when the kind
    drops it. A row the template cannot render raises a UserError that names it. The one encoding of a row, for
    the cached datasets and for --streaming (data/streaming.py) alike."""
    try:
        encoded = kind.encode_one(tokenizer, item, **settings)
    except ConfigError as e:  # the model and the data do not go together: no row is at fault, the first says where
        raise ConfigError(f"{item.row.where()}: {e}") from None
    except UserError as e:
        raise DataError(f"{item.row.where()}: {e}") from None
    if encoded is None:
        logger.debug("%s: dropped: %s", item.row.where(), kind.dropped_because)
        return None
    origin = {"source": item.row.path, "line": item.row.line, "array_index": item.row.index or 0}
    encoded.records = [{**record, **origin} for record in encoded.records]
    return encoded


def report_encoding(kind: DataKind, name: str, paths: Sequence[str], stats: EncodeStats,
                    settings: dict[str, Any]) -> None:
    """Log what encoding did (a warning only when rows were cut or dropped); an error when nothing is left."""
    logger.log(logging.INFO if stats.lossless else logging.WARNING, kind.report(name, stats))
    if stats.expanded:
        logger.info("%s: %d conversations expanded into one example per reply (the chat template renders earlier "
                    "replies differently once more turns follow; --multi_turn)", name, stats.expanded)
    if stats.bad:
        logger.warning("%s: %d bad rows left out (--skip_bad_rows)", name, stats.bad)
    if stats.replies_without_end_marker:
        logger.warning("%s: %d trained replies end in no special token, so nothing teaches the model to stop there "
                       "(the chat template has no end-of-turn marker): use a --chat_template that ends each reply "
                       "with one", name, stats.replies_without_end_marker)
    if not stats.kept:
        raise DataError(f"{name} ({', '.join(map(str, paths))}): {kind.nothing_kept.format(**settings)}")


def tokenizer_fingerprint(tokenizer: Any) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode())
    h.update((tokenizer.chat_template or "").encode())
    h.update(str(tokenizer.eos_token).encode())
    processor = processor_of(tokenizer)
    if processor is not None:  # its settings decide how many tokens each image takes
        h.update(processor.image_processor.to_json_string().encode())
        h.update(json.dumps({k: v for k, v in processor.to_dict().items() if isinstance(v, (int, str, bool))},
                            sort_keys=True).encode())
    return h.hexdigest()


def cache_key(kind: DataKind, paths: Sequence[str], tokenizer: Any, settings: dict[str, Any],
              max_samples: int | None, selection: RowSelection | None = None) -> str:
    h = hashlib.sha256(f"{kind.name}/{kind.version}".encode())
    for p in paths:
        h.update(os.path.abspath(p).encode())
        files = sorted(f for f in Path(p).rglob("*") if f.is_file()) if Path(p).is_dir() else [Path(p)]
        for f in files:  # a datasets.save_to_disk folder: every file in it
            h.update(str(f.relative_to(p) if f != Path(p) else "").encode())
            with f.open("rb") as content:  # in pieces: a data file may be larger than the memory
                for block in iter(lambda: content.read(1 << 20), b""):
                    h.update(block)
    h.update(tokenizer_fingerprint(tokenizer).encode())
    h.update(json.dumps([settings, max_samples], sort_keys=True).encode())
    if selection:  # --data_split, --data_weights and the seed decide which rows are used
        h.update(json.dumps(selection.key(), sort_keys=True).encode())
    return h.hexdigest()[:24]


# Columns datasets stores as int32 when it infers their type (its OptimizedTypedSequence): kept so here too.
INT32_COLUMNS = ("input_ids",)


def records_to_dataset(records: list[dict]) -> Dataset:
    """Dataset.from_list(records), except that a column whose every value is a 1-D numpy array (a long document's
    pieces, data/text_documents.py) goes to Arrow as one concatenated array and its offsets: datasets' own conversion
    of such a column holds about 60 bytes a token on the way (measured: 477 MB for 8,000,000 tokens), this 12. The
    same types as from_list's (input_ids int32, the rest int64)."""
    import pyarrow as pa

    kinds = {c: {isinstance(r.get(c), np.ndarray) for r in records} for c in records[0]}
    if {True} not in kinds.values() or any(len(k) > 1 for k in kinds.values()):  # no array column, or a mixed one
        return Dataset.from_list(records)
    table = {}
    for column, (is_array,) in kinds.items():
        values = [r.get(column) for r in records]
        if not is_array:
            table[column] = pa.array(values)
            continue
        dtype = np.int32 if column in INT32_COLUMNS else np.int64
        offsets = np.zeros(len(values) + 1, dtype=np.int32)
        np.cumsum([len(v) for v in values], out=offsets[1:])
        table[column] = pa.ListArray.from_arrays(offsets, np.concatenate(values).astype(dtype, copy=False))
    # A fingerprint of its own: datasets would hash the whole table for one (pickled: 58 bytes a token on the way),
    # and this dataset is saved and read back from its cache folder, which fingerprints it again, before any use.
    return Dataset(InMemoryTable(pa.table(table)), fingerprint=generate_random_fingerprint())


def build_dataset(kind: DataKind, tokenizer: Any, paths: Sequence[str], data_args: Any, name: str = "train",
                  max_samples: int | None = None, report_dir: str | None = None,
                  selection: RowSelection | None = None) -> Dataset:
    """The encoded records of these files (the first max_samples good rows, or all; the selection's when
    given: its --data_split part, drawn by --data_weights), from the cache when the same files, tokenizer,
    chat template, settings and selection were encoded before (unless --overwrite_cache). Every row is
    checked: bad rows stop the build, listed together, or with --skip_bad_rows are left out, counted,
    and listed in report_dir/<name>_bad_rows.txt."""
    settings = kind.settings(data_args)
    skip_bad_rows = getattr(data_args, "skip_bad_rows", False)
    key = cache_key(kind, paths, tokenizer, {**settings, "skip_bad_rows": skip_bad_rows}, max_samples, selection)
    cache_dir = cache_root() / "datasets" / kind.name / key
    if not (cache_dir.is_dir() and not data_args.overwrite_cache):
        items, bad = load_items(paths, kind.from_row, max_samples, skip_bad_rows, selection,
                                getattr(data_args, "max_row_bytes", DEFAULT_MAX_ROW_BYTES), kind.read_rows)
        records, stats, bad_encodings = encode_items(kind, tokenizer, items, skip_bad_rows, **settings)
        bad += bad_encodings
        stats.bad = len(bad)
        if not records:
            report_encoding(kind, name, paths, stats, settings)  # raises: nothing kept
        with atomic_directory(cache_dir) as tmp:
            records_to_dataset(records).save_to_disk(str(tmp))
            atomic_write_json(tmp / STATS_FILE, asdict(stats))
            if bad:
                (tmp / BAD_ROWS_FILE).write_text("".join(f"{problem}\n" for problem in bad), encoding="utf-8")
            if selection:
                (tmp / SELECTION_FILE).write_text("".join(f"{note}\n" for note in selection.notes), encoding="utf-8")
    else:
        logger.info("%s: tokenized data from cache %s", name, cache_dir)
    if (cache_dir / SELECTION_FILE).is_file():  # which rows --data_split and --data_weights chose, hit or miss
        for note in (cache_dir / SELECTION_FILE).read_text(encoding="utf-8").splitlines():
            logger.info("%s: %s", name, note)
    stats = EncodeStats(**json.loads((cache_dir / STATS_FILE).read_text(encoding="utf-8")))
    report_encoding(kind, name, paths, stats, settings)
    if stats.bad and report_dir:
        listed = Path(report_dir) / f"{name}_{BAD_ROWS_FILE}"
        listed.parent.mkdir(parents=True, exist_ok=True)
        listed.write_text((cache_dir / BAD_ROWS_FILE).read_text(encoding="utf-8"), encoding="utf-8")
        logger.warning("%s: the %d rows left out are listed in %s", name, stats.bad, listed)
    return load_from_disk(str(cache_dir))


def build_datasets(kind: DataKind, tokenizer: Any, data_args: TrainDataArguments, seed: int = 42,
                   report_dir: str | None = None) -> tuple[Dataset, Dataset | None]:
    """Training and evaluation data. --data_split, --data_weights and --max_samples choose among the
    --data_path rows only, in that order (seeded by `seed`); evaluation is --eval_data_path, used whole,
    or --val_size of the chosen training examples held out."""
    train = build_dataset(kind, tokenizer, data_args.data_path, data_args, "train", data_args.max_samples, report_dir,
                          RowSelection.of(data_args, seed))
    if data_args.eval_data_path:
        return train, build_dataset(kind, tokenizer, data_args.eval_data_path, data_args, "eval", None, report_dir)
    if data_args.val_size > 0:
        return split_off(train, data_args.val_size, seed)
    return train, None


def split_off(dataset: Dataset, ratio: float, seed: int) -> tuple[Dataset, Dataset]:
    """(rest, held out): a seeded random `ratio` of the examples held out, at least one. The examples of
    one row (its copies drawn by --data_weights, the expansions of one conversation) stay on one side, so
    a held-out example never repeats a trained one. Only an index in memory (datasets' own
    train_test_split would write index files into the shared cache folder)."""
    wanted = math.ceil(ratio * len(dataset))
    rows: dict[Any, list[int]] = {}  # the examples of each row, by (file, line, place in a JSON array)
    columns = ("source", "line", "array_index")
    keys = (zip(*(dataset[c] for c in columns)) if set(columns) <= set(dataset.column_names)
            else range(len(dataset)))
    for k, key in enumerate(keys):
        rows.setdefault(key, []).append(k)
    groups = list(rows.values())
    held: list[int] = []
    rest: list[int] = []
    for g in np.random.default_rng(seed).permutation(len(groups)):
        (held if len(held) < wanted else rest).extend(groups[g])
    if not rest:
        raise DataError(f"--val_size {ratio} of {len(dataset)} training examples leaves none to train on: "
                        "give more data, a smaller ratio, or --eval_data_path")
    logger.info("eval: %d of the %d training examples held out (--val_size %s, seed %d)", len(held), len(dataset),
                ratio, seed)
    return dataset.select(rest, keep_in_memory=True), dataset.select(held, keep_in_memory=True)


# --------------------------------------------------------------------------- SFT conversations


@dataclass
class FittedExample:
    """One example as training keeps it: within max_seq_length, and for a vision-language model with its
    images' tokens in place and the text and pictures its collator gives the processor."""

    input_ids: list[int]
    labels: list[int]
    replies_without_end_marker: int = 0
    text: str | None = None
    images: list[str] | None = None

    def record(self) -> dict[str, Any]:
        kept = {"input_ids": self.input_ids, "labels": self.labels}
        return kept if self.text is None else {**kept, "text": self.text, "images": self.images}


def fit_example(tokenizer: Any, full: Encoded, images: list[str], max_seq_length: int, truncation: str,
                max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> tuple[FittedExample | None, bool]:
    """(the example as training keeps it, whether it was cut to fit max_seq_length); None when a
    vision-language model's example has no whole reply that fits with its images (data/image_encoding.py).
    The one home of this choice for training (encode_conversation_record) and for `tunesmith inspect`."""
    processor = processor_of(tokenizer)
    if processor is None:
        enc = truncate(full, max_seq_length, truncation)
        return (FittedExample(enc.input_ids, enc.labels, enc.replies_without_end_marker),
                len(enc.input_ids) < len(full.input_ids))
    example, cut = fit_with_images(processor, full, images, max_seq_length, truncation, max_image_pixels)
    if example is None:
        return None, False
    return FittedExample(example.input_ids, example.labels, full.replies_without_end_marker, example.text,
                         example.images), cut


def encode_conversation_record(tokenizer: Any, conversation: Conversation, max_seq_length: int, train_on: str,
                               truncation: str = "drop_turns", multi_turn: str = "auto",
                               max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> ItemEncoding | None:
    """input_ids and labels within max_seq_length, one record per example (several when the
    conversation is expanded); None when no trained token is left. A vision-language model's records also hold
    the text and images its collator gives the processor (data/image_encoding.py)."""
    messages, bounded = bound_messages(tokenizer, conversation.messages, max_seq_length)  # data/row_bound.py
    if bounded and not renders_alike(tokenizer, conversation.messages, messages, "head", tools=conversation.tools):
        messages, bounded = conversation.messages, [*bounded, "kept whole: the chat template renders them cut otherwise"]
    if bounded:
        log_bounded(conversation.row.where(), bounded, tokenizer, max_seq_length,
                    f"cut or dropped as --truncation {truncation} says")
    examples, expanded = encode_examples(tokenizer, messages, train_on, conversation.tools, multi_turn)
    images = message_images(conversation.messages)
    records, truncated, no_marker = [], False, 0
    for full in examples:
        fitted, cut = fit_example(tokenizer, full, images, max_seq_length, truncation, max_image_pixels)
        if fitted is None or trained_token_count(fitted.labels) == 0:
            continue
        truncated |= cut
        no_marker += fitted.replies_without_end_marker
        records.append(fitted.record())
    return ItemEncoding(records, truncated, expanded, no_marker) if records else None


SFT_CONVERSATIONS = DataKind(
    name="sft",
    version="5",  # 5: images (text and images columns for a vision-language model); 4: closing text (Phi) trains in no reply; 3: a reply after the system prompt trains; OpenAI preference rows; weight 0 under train_on all
    from_row=conversation_from_row,
    settings=lambda data_args: {"max_seq_length": data_args.max_seq_length, "train_on": data_args.train_on,
                                "truncation": data_args.truncation, "multi_turn": data_args.multi_turn,
                                "max_image_pixels": getattr(data_args, "max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS)},
    encode_one=encode_conversation_record,
    dropped_because="no whole reply fits in max_seq_length (--truncation)",
    report_line="{name}: {rows} rows -> {kept} examples ({truncated} truncated to max_seq_length, "
                "{dropped} dropped: {dropped_because})",
    nothing_kept="no example has a trained token within --max_seq_length {max_seq_length} (--train_on {train_on}, "
                 "--truncation {truncation}): raise --max_seq_length",
)


def build_sft_dataset(tokenizer: Any, paths: list[str], data_args: SFTDataArguments, name: str = "train",
                      max_samples: int | None = None) -> Dataset:
    return build_dataset(SFT_CONVERSATIONS, tokenizer, paths, data_args, name, max_samples)


def build_sft_datasets(tokenizer: Any, data_args: SFTDataArguments, seed: int = 42,
                       report_dir: str | None = None) -> tuple[Dataset, Dataset | None]:
    return build_datasets(SFT_CONVERSATIONS, tokenizer, data_args, seed, report_dir)


def build_ptx_dataset(tokenizer: Any, ppo_args: Any, prompt_args: Any) -> Dataset:
    """PPO-ptx's conversations (--ptx_data_path), encoded as SFT encodes them, each at most as long as a rollout
    (--max_prompt_length + --max_new_tokens), as DeepSpeed-Chat cuts its unsupervised data."""
    data_args = SFTDataArguments(data_path=list(ppo_args.ptx_data_path), overwrite_cache=prompt_args.overwrite_cache,
                                 skip_bad_rows=prompt_args.skip_bad_rows, max_row_bytes=prompt_args.max_row_bytes,
                                 max_seq_length=prompt_args.max_prompt_length + ppo_args.max_new_tokens)
    return build_sft_dataset(tokenizer, data_args.data_path, data_args, name="ptx")
