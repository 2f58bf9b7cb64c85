"""The lifecycle every training stage shares around its own step: the checkpoint's layout (the Trainer's file names
and contents), its atomic publish with full-disk handling and rotation, the random state, the optimizer state (a ZeRO
shard through a safe unpickler), the final save (staged, then published file by file, its trainer_state.json last)
and the callbacks that log (metrics.jsonl, --report_to, the progress events).

The Trainer stages (train/stage_trainer.StageTrainer) get it from transformers' Trainer and call the final save here
(train/run_setup.save_final_model); the RL loop (rl/trainer.PPOTrainer), whose step is a rollout, its scoring and
several updates, calls each piece itself. Resume and its checks (train/checkpoints.resolve_resume) and the rerun of a
finished run (train/finished_run.py) read what both write, the same way."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import random
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback
from transformers.integrations import get_reporting_integration_callbacks
from transformers.trainer_callback import CallbackHandler, TrainerState
from transformers.trainer_pt_utils import safe_globals

from ..errors import PathError
from ..utils.io import atomic_write_text, folder_bytes, publish_files, stop_when_disk_fills
from .callbacks import MetricsFileCallback
from .checkpoints import (
    STATE_FILE,
    checkpoint_dir,
    checkpoints,
    model_bytes,
    publish_checkpoint,
    rotate_checkpoints,
    staging_dir,
)

logger = logging.getLogger(__name__)

# The Trainer's names (transformers/trainer.py), so a checkpoint of any stage reads the same.
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
FINAL_STAGING = "final-model"  # output_dir/.final-model.tmp: where a final save is built


def zero_shard_file(rank: int) -> str:
    """A ZeRO optimizer's state is one shard per process (the Trainer lets DeepSpeed write its own folder instead)."""
    return f"optimizer-rank{rank}.pt"


# ---------------------------------------------------------------------------- the random state


def rng_state_file(folder: str | os.PathLike, process_index: int, world_size: int) -> Path:
    """The Trainer's name: rng_state.pth for one process, rng_state_<rank>.pth for each of several."""
    return Path(folder) / ("rng_state.pth" if world_size <= 1 else f"rng_state_{process_index}.pth")


def save_rng_state(folder: str | os.PathLike, process_index: int, world_size: int) -> None:
    """This process's random states (python, numpy, torch's CPU and CUDA generators), as the Trainer saves them."""
    states: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                              "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    torch.save(states, rng_state_file(folder, process_index, world_size))


def load_rng_state(folder: str | os.PathLike, process_index: int, world_size: int) -> None:
    path = rng_state_file(folder, process_index, world_size)
    with safe_globals():  # numpy's state through torch's weights_only unpickler, as the Trainer reads it
        states = torch.load(path, weights_only=True)
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.random.set_rng_state_all(states["cuda"])


# ---------------------------------------------------------------------------- the optimizer state


def save_optimizer_state(optimizer: Any, folder: Path, process_index: int, zero_stage: int, is_main: bool) -> None:
    """optimizer.pt (the main process's: the others hold the same) or, under ZeRO, this process's shard."""
    if zero_stage:
        torch.save(optimizer.state_dict(), folder / zero_shard_file(process_index))
    elif is_main:
        torch.save(optimizer.state_dict(), folder / OPTIMIZER_FILE)


def load_optimizer_state(optimizer: Any, folder: Path, process_index: int, num_processes: int,
                         zero_stage: int) -> None:
    if not zero_stage:
        optimizer.load_state_dict(torch.load(folder / OPTIMIZER_FILE, map_location="cpu"))
        return
    # ZeRO optimizers take a list of every rank's state, pick their own, and restore their fp32 master
    # weights from it too.
    states: list[dict | None] = [None] * num_processes
    states[process_index] = load_zero_optimizer_state(folder / zero_shard_file(process_index))
    optimizer.optimizer.load_state_dict(states, load_from_fp32_weights=True)


def zero_optimizer_state_types() -> list[type]:
    """The DeepSpeed classes a ZeRO-1/2/3 optimizer's state_dict holds beside tensors, numbers and strings (its
    loss scaler, the stage, ZeRO-1/2's fragment offsets): torch.load's weights_only unpickler rebuilds these and
    nothing else, so a crafted optimizer file cannot run code (a full unpickle runs whatever it names)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def load_zero_optimizer_state(path: Path) -> dict[str, Any]:
    """A ZeRO optimizer's saved state, through torch's weights_only unpickler; PathError naming the file when it
    holds anything else."""
    try:
        with torch.serialization.safe_globals(zero_optimizer_state_types()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message: a paragraph on weights_only, the reason (the global it refused), a link
        lines = [line for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        reason = next((line for line in lines if "GLOBAL" in line), lines[0])
        raise PathError(f"{path}: refused: it holds more than a ZeRO optimizer's state ({reason}); resume from a "
                        "checkpoint this run wrote") from None


# ---------------------------------------------------------------------------- writing and publishing


def write_checkpoint(output_dir: str | os.PathLike, step: int, write: Callable[[Path], None], accelerator: Any,
                     save_total_limit: int | None) -> Path:
    """output_dir/checkpoint-<step>, built by `write` (called on every process, into the same staging folder; it
    writes the state file last) and renamed into place when whole, then the oldest beyond save_total_limit
    removed. A full disk: one line, the staging folder removed, the earlier checkpoints whole."""
    final = checkpoint_dir(output_dir, step)
    staging = staging_dir(final)
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)  # a killed run's
        staging.mkdir(parents=True)
    accelerator.wait_for_everyone()
    earlier = checkpoints(output_dir)
    with stop_when_disk_fills(staging, needed=folder_bytes(earlier[-1]) if earlier else 0,
                              discard=accelerator.is_main_process):
        write(staging)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        publish_checkpoint(staging, final)
        rotate_checkpoints(output_dir, save_total_limit)
    accelerator.wait_for_everyone()
    return final


def save_final(output_dir: str | os.PathLike, write: Callable[[Path], None], accelerator: Any,
               should_save: bool) -> None:
    """A stage's finished model: `write` (called on every process: a gathering save is a collective) into a staging
    folder in output_dir, then each file moved into place, so that a save that fails part way (a full disk: one
    line) leaves the previous finished model whole, where saving in place would leave it half overwritten."""
    output_dir = Path(output_dir)
    staging = staging_dir(output_dir / FINAL_STAGING)
    if should_save:
        shutil.rmtree(staging, ignore_errors=True)  # a killed run's
    accelerator.wait_for_everyone()
    newest = checkpoints(output_dir)
    with stop_when_disk_fills(staging, needed=model_bytes(newest[-1] if newest else None), discard=should_save):
        write(staging)
    accelerator.wait_for_everyone()  # every process's files written before they move
    if should_save:
        publish_files(staging, output_dir)
    accelerator.wait_for_everyone()


def save_state(state: TrainerState, folder: str | os.PathLike) -> None:
    """trainer_state.json (the Trainer's format), written whole or not at all: a checkpoint's last file, and in
    output_dir the mark of a finished save (train/finished_run.py)."""
    atomic_write_text(Path(folder) / STATE_FILE, json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True) + "\n")


def load_state(checkpoint: str | os.PathLike) -> TrainerState:
    return TrainerState.load_from_json(str(Path(checkpoint) / STATE_FILE))


# ---------------------------------------------------------------------------- logging


def stage_callbacks() -> list[TrainerCallback]:
    """The callbacks every stage logs through beside transformers' own: metrics.jsonl and the progress events."""
    return [MetricsFileCallback()]


def callback_handler(args: Any, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any,
                     console: TrainerCallback, extra: Iterable[TrainerCallback] = ()) -> CallbackHandler:
    """For a loop that is not the Trainer's: the --report_to integrations (TensorBoard, wandb ...), the stages'
    callbacks and the console's, as the Trainer builds them."""
    return CallbackHandler([*get_reporting_integration_callbacks(args.report_to), *stage_callbacks(), *extra,
                            console], model, tokenizer, optimizer, scheduler)
