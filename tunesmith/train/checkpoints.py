"""Finding a checkpoint to resume from, and checking that what was saved is complete."""

from __future__ import annotations

import os
import re
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

# The Trainer writes trainer_state.json last: a checkpoint without it was cut short by a kill.
COMPLETE_MARKER = "trainer_state.json"


def last_complete_checkpoint(output_dir: str) -> str | None:
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    steps = []
    for child in folder.iterdir():
        m = re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", child.name)
        if m and child.is_dir() and (child / COMPLETE_MARKER).is_file():
            steps.append((int(m.group(1)), str(child)))
    return max(steps)[1] if steps else None


def resolve_resume(resume_from_checkpoint: str | bool | None, output_dir: str) -> str | None:
    """--resume_from_checkpoint PATH resumes there; otherwise the last complete checkpoint in
    output_dir (if any) is resumed, so re-running a killed command continues it."""
    if resume_from_checkpoint in (None, False, "", "false", "False"):
        return last_complete_checkpoint(output_dir)
    if resume_from_checkpoint in (True, "true", "True"):
        found = last_complete_checkpoint(output_dir)
        if found is None:
            raise FileNotFoundError(f"--resume_from_checkpoint true: no complete checkpoint in {output_dir}")
        return found
    if not os.path.isdir(str(resume_from_checkpoint)):
        raise FileNotFoundError(f"--resume_from_checkpoint {resume_from_checkpoint}: no such checkpoint folder")
    return str(resume_from_checkpoint)


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
