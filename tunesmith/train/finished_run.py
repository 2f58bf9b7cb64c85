"""A rerun of a run that already finished: the command again, with output_dir holding the finished run. It
would resume the last checkpoint, which is the end, train nothing, and write the Trainer's report of that
nothing (train_loss 0.0) over the recorded one. Instead it says so in one line and leaves the outputs as they
are, exiting with status 0 (nothing went wrong, as `make` with nothing to make), so a script that reruns its
pipeline goes on to the next stage."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..constants import RUN_CONFIG_FILE
from ..errors import PathError
from .checkpoints import STATE_FILE, checkpoint_step, read_state

logger = logging.getLogger(__name__)


def finished_at(kind: str, training: Any, resume: str | None) -> int | None:
    """The step the run in output_dir finished at, when the checkpoint this run would resume already reaches
    its end (--max_steps, or --num_train_epochs without it) and the final save is in output_dir (the Trainer
    stages write trainer_state.json there last; PPO, which writes none, its run config); else None."""
    if resume is None:
        return None
    final = Path(training.output_dir) / (STATE_FILE if kind != "ppo" else RUN_CONFIG_FILE)
    if not final.is_file():
        return None  # stopped after its last checkpoint, before its final save: the resume finishes it
    state = read_state(resume)
    step = int(state.get("global_step", 0))
    if not _final_save_is_of(final, kind, step, Path(resume)):
        return None  # an earlier run's final save, and this one's failed (a full disk): the resume saves it
    if training.max_steps > 0:
        done = step >= training.max_steps
    else:
        done = float(state.get("epoch") or 0) >= training.num_train_epochs - 1e-6
    return step if done else None


def _final_save_is_of(final: Path, kind: str, step: int, checkpoint: Path) -> bool:
    """Whether the final save in output_dir is the one made after `checkpoint`: the Trainer's state there records
    its step; PPO's run config records none, so it must be written after the checkpoint's state was."""
    if kind != "ppo":
        try:
            return checkpoint_step(final.parent) == step
        except PathError:
            return False  # unreadable: not a finished save to keep
    return final.stat().st_mtime_ns >= (checkpoint / STATE_FILE).stat().st_mtime_ns


def stop_if_finished(kind: str, training: Any, resume: str | None) -> None:
    """Exit (status 0) with one line when the run in output_dir already finished what this one asks."""
    step = finished_at(kind, training, resume)
    if step is None:
        return
    logger.info("--output_dir %s already holds this run, finished at step %d (%s): nothing to train, its outputs "
                "are left as they are; raise --max_steps or --num_train_epochs to train on, or pass "
                "--overwrite_output_dir to train it again", training.output_dir, step, resume)
    raise SystemExit(0)
