"""--lora_target checked against the loaded model's module names, before PEFT: PEFT raises a traceback when no
target matches, and says nothing when one of several does not (a typo then trains fewer layers than asked)."""

from __future__ import annotations

import difflib

from torch import nn

from ..errors import ConfigError


def check_lora_targets(model: nn.Module, targets: list[str], linear_names: list[str]) -> None:
    """Refuse the first target that names no module of `model` the way PEFT matches a list of targets (the
    whole name, or its last dotted parts), naming the near matches and the linear layers (`linear_names`)."""
    names = [name for name, _ in model.named_modules() if name]
    for target in targets:
        if any(name == target or name.endswith("." + target) for name in names):
            continue
        leaves = sorted({name.rsplit(".", 1)[-1] for name in names})
        near = difflib.get_close_matches(target.rsplit(".", 1)[-1], leaves, n=3, cutoff=0.6)
        hint = f" (did you mean {_one_of(near)}?)" if near else ""
        raise ConfigError(f"--lora_target {target}: no module of this model is named so{hint}; its linear layers "
                          f"are {', '.join(linear_names)}, or give `all` for every one of them")


def _one_of(words: list[str]) -> str:
    """`a`, `a or b`, `a, b or c`."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
