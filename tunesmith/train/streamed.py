"""A --streaming run in the Trainer (data/streaming.py holds the stream): its data loader, and the stream's place in
each checkpoint so that a resumed run continues at the example the stopped one would have trained next.

The Trainer's own resume of an iterable dataset re-reads it from the start and drops the batches already
trained (skip_first_batches); here the stream is put back where it was instead, and the Trainer is told that
nothing is to be skipped (StageTrainer._run_epoch)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader

from ..data.streaming import StreamedExamples
from ..errors import ConfigError
from ..utils.io import atomic_write_text

logger = logging.getLogger(__name__)

# accelerate's DataLoaderShard reads one batch ahead of the one training; a few more are kept, to be safe
BATCHES_AHEAD = 4


def stream_state_file(checkpoint: str | Path, rank: int) -> Path:
    return Path(checkpoint) / f"stream_state_rank{rank}.json"


def streamed_dataloader(trainer: Any) -> DataLoader:
    """The training batches of this rank's stream. Prepared as for one process: the stream is this rank's part
    already, and accelerate would otherwise have every rank read the whole stream and keep every n-th batch
    (IterableDatasetShard), or one rank read it all and send the others theirs (dispatch_batches)."""
    dataset: StreamedExamples = trainer.train_dataset
    dataset.lookahead = trainer._train_batch_size * (trainer.args.gradient_accumulation_steps + BATCHES_AHEAD)
    collator = trainer._get_collator_with_removed_columns(trainer.data_collator, description="training")
    loader = DataLoader(dataset, batch_size=trainer._train_batch_size, collate_fn=collator, num_workers=0,
                        pin_memory=trainer.args.dataloader_pin_memory)
    accelerator = trainer.accelerator
    prepared = prepare_data_loader(loader, accelerator.device, num_processes=1, process_index=0,
                                   put_on_device=accelerator.device_placement, dispatch_batches=False,
                                   non_blocking=accelerator.non_blocking)
    accelerator._dataloaders.append(prepared)  # as accelerator.prepare does: it tracks its loaders' ends
    return prepared


def trained_examples(trainer: Any) -> int:
    """Examples this rank has trained on: every optimizer step takes gradient_accumulation_steps batches."""
    return trainer.state.global_step * trainer.args.gradient_accumulation_steps * trainer._train_batch_size


def save_stream_state(trainer: Any, checkpoint: str) -> None:
    """This rank's stream state, beside the checkpoint's random states (written before trainer_state.json, which
    marks a checkpoint complete)."""
    dataset: StreamedExamples = trainer.train_dataset
    state = dataset.state_dict(trained_examples(trainer))
    # no indentation: the buffer's examples are long lists of token ids
    atomic_write_text(stream_state_file(checkpoint, trainer.args.process_index), json.dumps(state))


def load_stream_state(trainer: Any, checkpoint: str) -> None:
    """Put this rank's stream where the checkpoint's run stopped."""
    path = stream_state_file(checkpoint, trainer.args.process_index)
    if not path.is_file():
        raise ConfigError(f"{checkpoint}: no {path.name}: the checkpoint was not written by a --streaming run; "
                          "resume it without --streaming, or start again in a new --output_dir")
    dataset: StreamedExamples = trainer.train_dataset
    dataset.load_state_dict(json.loads(path.read_text(encoding="utf-8")))
    position = dataset.state.position
    logger.info("train: the stream continues at %s, epoch %d, row %d (%d examples trained)",
                dataset.files[min(position.file, len(dataset.files) - 1)], position.epoch + 1, position.rows,
                dataset.state.yielded)
