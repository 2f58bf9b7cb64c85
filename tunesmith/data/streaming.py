"""--streaming: SFT examples read, rendered and masked as training takes them, for data larger than the memory.

The rows go through the one encoding the cached datasets use (dataset.encode_item: the same records, masks and
truncation), the padded or packed batches through the same collators; only the whole-set steps are left out:
no cache, no --val_size, --data_weights or --data_split (the rules refuse them), and the run's length is
--max_steps (the stream starts over at the end of the data, a new epoch, for as long as the steps ask).

Memory is bounded by the shuffle buffer (--shuffle_buffer examples, drawn at random as new ones replace them,
seeded; at the end of the data the buffer is given out before the next epoch begins, so epochs do not mix) and the one row being read (--max_row_bytes); not by the files. JSONL is read line by line from a byte
offset, Parquet by row groups, an Arrow shard or a datasets.save_to_disk folder by slices of its memory-mapped
table; a folder of shards file by file.

Why not datasets' own IterableDataset: the rows must give exactly the records (and the file:line problems) of
the cached path, which reads them with data/formats.py, not with datasets' JSON builder; and its resume re-reads
each shard up to the example and starts the shuffle buffer empty, where here a resume continues at the example
the run stopped at, buffer included (state_dict: the reader's byte offset or row, the buffer, the random state).

Several ranks read disjoint parts: row k of an epoch (counting every file's rows in order) is encoded by rank
k % world_size only, so the ranks' parts are disjoint and together the whole stream (each rank still reads
past the others' lines, without parsing them into conversations or tokenizing them).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from ..errors import ConfigError, DataError, UserError
from ..hparams.data_args import DEFAULT_MAX_ROW_BYTES, DEFAULT_SHUFFLE_BUFFER
from ..utils.paths import is_table, problem_with_data_file, shard_files
from .dataset import BAD_ROWS_FILE, DataKind, encode_item
from .formats import BadRows, Row, as_row, table_items
from .json_rows import json_items, jsonl_lines_from, jsonl_start

logger = logging.getLogger(__name__)

STATE_VERSION = 1
SHOWN_BAD_ROWS = 20  # bad rows logged one by one with --skip_bad_rows; all are listed in the bad-rows file


@dataclass
class StreamPosition:
    """Where the reader is: the next row to read. JSON-able, so a checkpoint can hold it."""

    epoch: int = 0
    file: int = 0  # index into the data files (a folder of shards gives several)
    rows: int = 0  # rows (values) already read from that file
    line: int = 0  # JSONL: the last line read; tables: the last row number
    offset: int | None = None  # JSONL: the byte offset of the next line (None: the file's start)
    ordinal: int = 0  # rows read this epoch over all files: decides the rank that encodes a row


def rows_from(path: str, position: StreamPosition,
              max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> Iterator[tuple[Row | DataError, int, int | None]]:
    """(row or the DataError of a row that cannot be read, the row's line or row number, the JSONL byte offset
    after it) for each row of `path` after the position's first `rows` rows. JSONL starts at the byte offset and
    Parquet/saved-dataset tables at the row without reading what comes before; a JSON array (one value) is read
    again up to the position."""
    problem = problem_with_data_file(path)
    if problem:
        raise DataError(f"data file {path}: {problem}")
    if is_table(path):
        items: Iterator[tuple[tuple[int, int | None, Any], int | None]] = (
            (item, None) for item in table_items(path, position.rows))
        unit = "row"
    else:
        start = jsonl_start(path, max_row_bytes)
        unit = "line"
        if start is not None:
            offset = start if position.offset is None else position.offset
            items = jsonl_lines_from(path, offset, position.line, max_row_bytes)
        else:
            skip = position.rows
            items = ((item, None) for k, item in enumerate(json_items(path, max_row_bytes)) if k >= skip)
    for (line, index, value), after in items:
        if isinstance(value, DataError):
            yield value, line, after
            continue
        try:
            yield as_row(path, line, value, index, unit), line, after
        except DataError as error:
            yield error, line, after


@dataclass
class StreamState:
    """Everything the stream needs to go on where it stopped (StreamedExamples.state_dict)."""

    position: StreamPosition = field(default_factory=StreamPosition)
    pending: list[dict] = field(default_factory=list)  # records of the row last read, not yet in the buffer
    buffer: list[dict] = field(default_factory=list)  # the shuffle buffer
    rng: dict | None = None  # the shuffle's numpy bit generator state
    yielded: int = 0  # examples given out, all epochs
    bad_rows: int = 0  # rows left out with --skip_bad_rows, first epoch
    kept_this_epoch: int = 0  # examples this rank kept in the current epoch (0 at an epoch's end: no data)
    draining: bool = False  # the data has ended: the buffer's examples are given out before the next epoch's


class StreamedExamples(IterableDataset):
    """The encoded examples of the --data_path files, endlessly (epoch after epoch), this rank's part, through
    a seeded shuffle buffer. state_dict(consumed)/load_state_dict make a resumed run continue at the example
    the stopped one would have trained next."""

    def __init__(self, kind: DataKind, tokenizer: Any, paths: Sequence[str], data_args: Any, seed: int = 42,
                 rank: int = 0, world_size: int = 1, report_dir: str | None = None) -> None:
        self.kind, self.tokenizer, self.paths = kind, tokenizer, list(paths)
        # a folder of shards is read file by file: the position names a file, and a resume opens only that one
        self.files = [file for path in self.paths for file in (shard_files(path) or [path])]
        self.settings = kind.settings(data_args)
        self.skip_bad_rows = getattr(data_args, "skip_bad_rows", False)
        self.max_row_bytes = getattr(data_args, "max_row_bytes", DEFAULT_MAX_ROW_BYTES)
        buffer = getattr(data_args, "shuffle_buffer", None)
        self.buffer_size = DEFAULT_SHUFFLE_BUFFER if buffer is None else buffer
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.bad_rows_file = (Path(report_dir) / (f"train_{BAD_ROWS_FILE}" if rank == 0 else
                                                   f"train_rank{rank}_{BAD_ROWS_FILE}")) if report_dir else None
        self.lookahead = 0  # how many examples given out may not be trained yet (the loader's prefetch)
        self.state = StreamState()
        self.replay: list[dict] = []  # given out before a resume but not trained: given again first
        self._recent: collections.deque[dict] = collections.deque()
        self._rng = np.random.default_rng([seed, rank])
        self._rows: Iterator[tuple[Row | DataError, int, int | None]] | None = None  # the open file's reader

    # ------------------------------------------------------------------ reading

    def __iter__(self) -> Iterator[dict]:
        while self.replay:
            yield self._give(self.replay.pop(0))
        state = self.state
        while True:
            while state.draining and state.buffer:  # the end of an epoch: its examples left, before the next's
                yield self._give(self._take(len(state.buffer)))
            state.draining = False
            record = self._next_record()
            if record is None:
                state.draining = True
                continue
            if self.buffer_size <= 1:
                yield self._give(record)
            elif len(state.buffer) < self.buffer_size:
                state.buffer.append(record)
            else:
                yield self._give(self._take(self.buffer_size, record))

    def _take(self, among: int, replacement: dict | None = None) -> dict:
        """An example drawn at random from the buffer's first `among`; `replacement` takes its place, or the
        buffer's last one does."""
        buffer = self.state.buffer
        i = int(self._rng.integers(among))
        record = buffer[i]
        last = buffer.pop() if replacement is None else replacement
        if i < len(buffer) or replacement is not None:
            buffer[i] = last
        return record

    def _give(self, record: dict) -> dict:
        self.state.yielded += 1
        if self.lookahead:
            self._recent.append(record)
            while len(self._recent) > self.lookahead:
                self._recent.popleft()
        return record

    def _next_record(self) -> dict | None:
        """The next example of this rank's part, reading (and encoding) rows as needed; None at the end of the
        data (the position is then at the next epoch's start)."""
        state = self.state
        while not state.pending:
            if not self._read_row():
                return None
        return state.pending.pop(0)

    def _read_row(self) -> bool:
        """Read rows until one is this rank's and gives records (into state.pending): True; or the epoch ends:
        False."""
        state, pos = self.state, self.state.position
        while pos.file < len(self.files):
            if self._rows is None:  # one open reader per file, kept between calls
                self._rows = rows_from(self.files[pos.file], pos, self.max_row_bytes)
            for row, line, after in self._rows:
                pos.rows, pos.line, pos.offset = pos.rows + 1, line, after
                mine = pos.ordinal % self.world_size == self.rank
                pos.ordinal += 1
                if not mine:
                    continue
                records = self._encode(row)
                if records:
                    state.pending = records
                    state.kept_this_epoch += len(records)
                    return True
            self._rows = None
            pos.file, pos.rows, pos.line, pos.offset = pos.file + 1, 0, 0, None
        if not state.kept_this_epoch:
            raise DataError(f"train ({', '.join(self.paths)}): "
                            + (f"rank {self.rank} of {self.world_size} reads no example: "
                               if self.world_size > 1 else "")
                            + self.kind.nothing_kept.format(**self.settings))
        logger.info("train: the stream reached the end of the data; epoch %d begins", pos.epoch + 2)
        state.position = StreamPosition(epoch=pos.epoch + 1)
        state.kept_this_epoch = 0
        return False

    def _encode(self, row: Row | DataError) -> list[dict]:
        """The records of one row (none when the kind drops it); a bad row stops the run, or with
        --skip_bad_rows is left out, counted and listed."""
        try:
            if isinstance(row, DataError):
                raise row
            encoded = encode_item(self.kind, self.tokenizer, self.kind.from_row(row), self.settings)
        except ConfigError:
            raise
        except UserError as e:
            if not self.skip_bad_rows:
                raise BadRows([str(e)]) from None
            self._note_bad_row(str(e))
            return []
        return encoded.records if encoded else []

    def _note_bad_row(self, problem: str) -> None:
        if self.state.position.epoch:  # noted in the first epoch already
            return
        self.state.bad_rows += 1
        if self.state.bad_rows <= SHOWN_BAD_ROWS:
            logger.warning("train: left out (--skip_bad_rows): %s", problem)
        if self.bad_rows_file is not None:
            self.bad_rows_file.parent.mkdir(parents=True, exist_ok=True)
            with self.bad_rows_file.open("a", encoding="utf-8") as f:
                f.write(f"{problem}\n")

    # ------------------------------------------------------------------ resume

    def state_dict(self, consumed: int) -> dict[str, Any]:
        """The stream's state once `consumed` of the examples given out have trained: the reader's place, the
        buffer, the random state, and the examples given out past `consumed` (the loader reads ahead), which a
        resumed stream gives again first."""
        ahead = self.state.yielded - consumed
        if ahead < 0 or ahead > len(self._recent):
            raise RuntimeError(f"the stream gave out {self.state.yielded} examples, {consumed} trained: "
                               f"{ahead} ahead, {len(self._recent)} kept to give again")
        replay = list(self._recent)[len(self._recent) - ahead:] if ahead else []
        state = asdict(self.state)
        state.update(yielded=consumed, rng=self._rng.bit_generator.state, replay=replay + self.replay,
                     version=STATE_VERSION, rank=self.rank, world_size=self.world_size, paths=self.paths)
        return state

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        if saved.get("version") != STATE_VERSION:
            raise ConfigError(f"the checkpoint's stream state is version {saved.get('version')}, this tunesmith "
                              f"reads {STATE_VERSION}: start the run again in a new --output_dir")
        if saved["world_size"] != self.world_size or saved["paths"] != self.paths:
            raise ConfigError(f"the checkpoint's stream was read by {saved['world_size']} process(es) from "
                              f"{', '.join(saved['paths'])}: resume with the same number of processes and --data_path")
        self.state = StreamState(position=StreamPosition(**saved["position"]), pending=saved["pending"],
                                 buffer=saved["buffer"], yielded=saved["yielded"], bad_rows=saved["bad_rows"],
                                 kept_this_epoch=saved["kept_this_epoch"], draining=saved["draining"])
        self._rng.bit_generator.state = saved["rng"]
        self.replay = list(saved["replay"])
        self._recent.clear()
        self._rows = None  # reopened at the saved position


def streamed_sft_datasets(tokenizer: Any, data_args: Any, seed: int, rank: int = 0, world_size: int = 1,
                          report_dir: str | None = None) -> tuple[StreamedExamples, Any]:
    """--streaming's training stream of SFT conversations, and the --eval_data_path examples (read whole and
    cached, as without --streaming), or None."""
    from .dataset import SFT_CONVERSATIONS, build_dataset

    train = StreamedExamples(SFT_CONVERSATIONS, tokenizer, data_args.data_path, data_args, seed, rank, world_size,
                             report_dir)
    logger.info("train: %s streamed (--streaming), %d process(es), a shuffle buffer of %d examples",
                ", ".join(data_args.data_path), world_size, train.buffer_size)
    evaluation = (build_dataset(SFT_CONVERSATIONS, tokenizer, data_args.eval_data_path, data_args, "eval", None,
                                report_dir) if data_args.eval_data_path else None)
    return train, evaluation
