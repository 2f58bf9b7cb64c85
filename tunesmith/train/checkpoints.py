"""Checkpoints of every training stage (the Trainer's, and the RL loop's in the same layout) and the
output_dir they live in: naming, which one to resume (and saying so), rotation, the atomic swap
that publishes a new one, the guard that keeps a run from resuming or replacing a run made with
other settings, and the check that a save holds whole tensors."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..constants import RUN_CONFIG_FILE
from ..errors import ConfigError, PathError
from ..hparams.run_config import as_saved, describe_differences, result_differences
from ..models.weights_check import folder_problems
from ..utils.io import disk_full_error, folder_bytes, ran_out_of_space, replace_directory

logger = logging.getLogger(__name__)

# The Trainer writes trainer_state.json last, and PPO renames a checkpoint into place only after
# writing its own: a checkpoint whose state file is missing or unreadable was cut short.
STATE_FILE = "trainer_state.json"

_NOT_REQUESTED = (None, False, "", "false", "False")


# ---------------------------------------------------------------------------- naming and listing


def checkpoint_dir(output_dir: str | os.PathLike, step: int) -> Path:
    return Path(output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{step}"


def checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The checkpoint-<step> folders in output_dir, oldest step first (complete or not)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = []
    for child in folder.iterdir():
        match = re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


# ---------------------------------------------------------------------------- state and resume


def resume_problem(checkpoint: str | os.PathLike) -> str | None:
    """Why the checkpoint cannot be resumed, or None: its state file does not read, or another of its files
    (weights, optimizer, scheduler, random state, configs) is cut short or corrupt. Checked here, before the
    Trainer loads anything: a failure inside its resume would come after the model's weights were replaced,
    and leave nothing to fall back from."""
    try:
        read_state(checkpoint)
    except PathError as e:
        return str(e)
    problems = folder_problems(checkpoint, recursive=True)
    return problems[0] if problems else None


def read_state(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's trainer_state.json; PathError naming the file and what is wrong with it."""
    path = Path(checkpoint) / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PathError(f"{path}: missing (the run stopped while saving this checkpoint)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PathError(f"{path}: cannot be read ({e})") from None
    except json.JSONDecodeError as e:
        raise PathError(f"{path}: not valid JSON ({e}; cut short while being written?)") from None
    if not isinstance(state, dict):
        raise PathError(f"{path}: holds a {type(state).__name__}, not a training state")
    return state


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    """The optimizer step a checkpoint was saved at (the Trainer's global_step, PPO's step)."""
    state = read_state(checkpoint)
    return int(state.get("global_step", state.get("step", 0)))


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest checkpoint in output_dir whose files all read; newer ones that do not are skipped with a
    warning that names them and the reason, and when none reads one more line says so."""
    found = checkpoints(output_dir)
    for checkpoint in reversed(found):
        problem = resume_problem(checkpoint)
        if problem is None:
            return str(checkpoint)
        logger.warning("skipping %s: %s", checkpoint, problem)
    if found:
        logger.warning("no checkpoint in %s can be resumed (%d skipped)", output_dir, len(found))
    return None


def resolve_resume(training: Any) -> str | None:
    """The checkpoint this run continues, announced: --resume_from_checkpoint PATH (or `true`: the
    last complete one, which must exist); otherwise the last complete checkpoint in output_dir, if
    any, so that re-running a killed command continues it. None with --overwrite_output_dir."""
    requested = training.resume_from_checkpoint
    if requested in _NOT_REQUESTED:
        found = None if training.overwrite_output_dir else last_complete_checkpoint(training.output_dir)
    elif requested in (True, "true", "True"):
        found = last_complete_checkpoint(training.output_dir)
        if found is None:
            raise PathError(f"--resume_from_checkpoint true: no complete checkpoint in --output_dir "
                            f"{training.output_dir}; leave the flag out to start afresh")
    else:
        found = str(requested)
        if not os.path.isdir(found):
            raise PathError(f"--resume_from_checkpoint {found}: no such checkpoint folder")
        problem = resume_problem(found)
        if problem:
            raise PathError(f"--resume_from_checkpoint {found}: {problem}; give an earlier checkpoint, or leave "
                            "the flag out to resume the last complete one in --output_dir")
    if found is not None:
        logger.info("resuming from %s (step %d)", found, checkpoint_step(found))
    return found


# ---------------------------------------------------------------------------- writing


def staging_dir(final: str | os.PathLike) -> Path:
    """Where a checkpoint is built before publish_checkpoint renames it into place: a hidden sibling
    with a fixed name, so that every process of a run writes its own files into the same one."""
    final = Path(final)
    return final.parent / f".{final.name}.tmp"


def publish_checkpoint(staging: str | os.PathLike, final: str | os.PathLike) -> None:
    """Rename a finished staging folder to its checkpoint name (replacing one of that name)."""
    replace_directory(staging, final)
    logger.info("saved %s", final)


def rotate_checkpoints(output_dir: str | os.PathLike, save_total_limit: int | None) -> None:
    """Keep the save_total_limit newest checkpoints (all when the limit is None or 0)."""
    if not save_total_limit:
        return
    for old in checkpoints(output_dir)[:-save_total_limit]:
        shutil.rmtree(old)


@contextmanager
def stop_when_a_checkpoint_fills_the_disk(output_dir: str | os.PathLike, step: Callable[[], int]) -> Iterator[None]:
    """Training whose checkpoint saves may fill the disk (`step`: the step being saved). The Trainer writes
    checkpoint-<step> in place, its state file last: one that a full disk cut short is removed (no resume would
    read it, and its space is free again) and the run stops in one line (utils/io.stop_when_disk_fills), its
    earlier checkpoints intact."""
    try:
        yield
    except Exception as e:
        partial = checkpoint_dir(output_dir, step())
        written = partial if partial.is_dir() else Path(output_dir)
        if not ran_out_of_space(e, written):
            raise
        earlier = [c for c in checkpoints(output_dir) if c != partial and (c / STATE_FILE).is_file()]
        cut_short = partial.is_dir() and resume_problem(partial) is not None
        raise disk_full_error(e, written, folder_bytes(earlier[-1]) if earlier else 0,
                              discard=cut_short and int(os.environ.get("RANK", "0")) == 0) from e


# Files of a checkpoint that only a resume reads; the rest (weights, configs, tokenizer) a final save writes too.
TRAINING_STATE_PREFIXES = ("optimizer", "scheduler", "rng", "scaler", "global_step", STATE_FILE, "training_args")


def model_bytes(checkpoint: str | os.PathLike | None) -> int:
    """The size of what a final save of the same run writes, estimated from one of its checkpoints (0 for None)."""
    if checkpoint is None:
        return 0
    return sum(f.stat().st_size for f in Path(checkpoint).rglob("*")
               if f.is_file() and not f.relative_to(checkpoint).parts[0].startswith(TRAINING_STATE_PREFIXES))


# ---------------------------------------------------------------------------- the output_dir guard


def saved_run_config(output_dir: str | os.PathLike) -> tuple[Path, dict] | None:
    """The resolved config of the run in output_dir, and its file: the newest checkpoint's (what a
    resume would continue), else the finished run's. None when output_dir holds no run."""
    candidates = [c / RUN_CONFIG_FILE for c in reversed(checkpoints(output_dir))] + [Path(output_dir) / RUN_CONFIG_FILE]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            return path, json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            logger.warning("%s: cannot be read (%s); comparing with an older record of the run", path, e)
    return None


def guard_output_dir(run: Any) -> None:
    """Called right after parsing, before anything loads. A run in output_dir made with settings that
    change the result is neither resumed nor overwritten: refused with what differs. With
    --overwrite_output_dir its checkpoints are deleted instead (the finished files are replaced
    when this run saves)."""
    training = run.training
    if training.overwrite_output_dir:
        _check_resume_survives_overwrite(training)
        remove_checkpoints(training.output_dir)
        return
    found = saved_run_config(training.output_dir)
    if found is None:
        return
    path, saved = found
    differences = result_differences(saved, as_saved(*run.configs))
    if differences:
        raise ConfigError(
            f"--output_dir {training.output_dir} holds a run made with other settings ({path}): "
            f"{describe_differences(differences)}. Resuming or replacing it would leave an output that its "
            "config misdescribes: pass --overwrite_output_dir to start afresh, or choose another --output_dir."
        )


def _check_resume_survives_overwrite(training: Any) -> None:
    requested = training.resume_from_checkpoint
    if requested in _NOT_REQUESTED:
        return
    inside = requested in (True, "true", "True") or \
        Path(os.path.realpath(requested)).is_relative_to(os.path.realpath(training.output_dir))
    if inside:
        raise ConfigError(f"--overwrite_output_dir deletes the checkpoints in {training.output_dir}, and "
                          f"--resume_from_checkpoint {requested} asks to continue one of them: pass only one of the two")


def remove_checkpoints(output_dir: str | os.PathLike) -> None:
    """Delete output_dir's checkpoints (on the main process only: the others must not race it)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    old = checkpoints(output_dir)
    for path in old:
        shutil.rmtree(path)
    if old:
        logger.info("--overwrite_output_dir: removed %d old checkpoint(s) from %s (%s)", len(old), output_dir,
                    ", ".join(p.name for p in old))


# ---------------------------------------------------------------------------- checking a save


def empty_tensors(folder: str) -> list[str]:
    """Names of zero-size tensors in the safetensors files of a saved model or adapter (what a
    ZeRO-3 save without gathering leaves behind)."""
    from safetensors import safe_open

    empty = []
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if 0 in f.get_slice(name).get_shape():
                    empty.append(f"{path.name}:{name}")
    return empty
