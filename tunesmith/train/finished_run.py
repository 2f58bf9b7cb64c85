"""A rerun of a run that already finished: the command again, with output_dir holding the finished run. It
would resume the last checkpoint, which is the end, train nothing, and write the Trainer's report of that
nothing (train_loss 0.0) over the recorded one. Instead it says so in one line and leaves the outputs as they
are, exiting with status 0 (nothing went wrong, as `make` with nothing to make), so a script that reruns its
pipeline goes on to the next stage. Every stage, the RL loop's included, writes trainer_state.json in output_dir
last in its final save (train/lifecycle.py): that file, at the checkpoint's step, marks a finished run."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..errors import PathError
from .checkpoints import STATE_FILE, checkpoint_step, read_state

logger = logging.getLogger(__name__)


def finished_at(training: Any, resume: str | None) -> int | None:
    """The step the run in output_dir finished at, when the checkpoint this run would resume already reaches
    its end (--max_steps, or --num_train_epochs without it) and the final save made after it is in output_dir;
    else None."""
    if resume is None:
        return None
    final = Path(training.output_dir) / STATE_FILE
    if not final.is_file():
        return None  # stopped after its last checkpoint, before its final save: the resume finishes it
    state = read_state(resume)
    step = int(state.get("global_step", 0))
    try:
        if checkpoint_step(final.parent) != step:
            return None  # an earlier run's final save, and this one's failed (a full disk): the resume saves it
    except PathError:
        return None  # unreadable: not a finished save to keep
    if training.max_steps > 0:
        done = step >= training.max_steps
    else:
        done = float(state.get("epoch") or 0) >= training.num_train_epochs - 1e-6
    return step if done else None


def stop_if_finished(training: Any, resume: str | None) -> None:
    """Exit (status 0) with one line when the run in output_dir already finished what this one asks."""
    step = finished_at(training, resume)
    if step is None:
        return
    logger.info("--output_dir %s already holds this run, finished at step %d (%s): nothing to train, its outputs "
                "are left as they are; raise --max_steps or --num_train_epochs to train on, or pass "
                "--overwrite_output_dir to train it again", training.output_dir, step, resume)
    raise SystemExit(0)
