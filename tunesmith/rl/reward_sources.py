"""Where a reply's reward comes from: a reward model, Python reward functions named on the command line
(`--reward_funcs package.module:function`, see reward_funcs.py for their shape), or both; the reward is
their weighted sum. A function that cannot be imported or called, or returns the wrong thing, is a
ConfigError naming it; an exception inside it is a DataError naming it and the data row (file:line)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..data.prompts import Prompt
from ..errors import ConfigError, DataError
from ..utils.imports import import_function
from .args import SHIPPED_REWARD_FUNCS_MODULE
from .rollout import RewardModelScorer

# Row fields that hold the prompt itself; every other field is passed to the reward functions.
PROMPT_FIELDS = ("messages", "conversations", "prompt")
REWARD_MODEL = "reward_model"


def load_reward_function(spec: str) -> RewardFunction:
    """`package.module:function`, or the bare name of a function in tunesmith/data/reward_funcs.py."""
    fn = import_function(spec, "reward_funcs", SHIPPED_REWARD_FUNCS_MODULE)
    _check_signature(fn, f"--reward_funcs {spec}")
    return RewardFunction(spec, fn)


def _check_signature(fn: Callable, where: str) -> None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C function: nothing to inspect, let the call tell
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if len(positional) < 2 or not any(p.kind == p.VAR_KEYWORD for p in params):
        raise ConfigError(f"{where}: a reward function must accept (prompts, replies, **fields) (the rows' other "
                          f"fields come as keyword arguments); its signature is {inspect.signature(fn)}")


def row_fields(prompts: Sequence[Prompt]) -> dict[str, list[Any]]:
    """Every non-prompt field of the prompts' rows, one value per prompt (None where a row lacks it)."""
    names = sorted({k for p in prompts for k in p.row.data if k not in PROMPT_FIELDS})
    return {k: [p.row.data.get(k) for p in prompts] for k in names}


class RewardFunction:
    """A user's reward function, called on a batch, with its mistakes turned into messages."""

    def __init__(self, spec: str, fn: Callable[..., Any]) -> None:
        self.spec, self.fn = spec, fn
        self.name = getattr(fn, "__name__", spec.rpartition(":")[2])

    def _call(self, prompts: Sequence[Prompt], replies: Sequence[str]) -> Any:
        return self.fn([p.messages for p in prompts], list(replies), **row_fields(prompts))

    def __call__(self, prompts: Sequence[Prompt], replies: Sequence[str]) -> list[float]:
        try:
            scores = self._call(prompts, replies)
        except Exception as e:  # noqa: BLE001 -- any failure of user code is reported with its row
            raise self._failure(prompts, replies, e) from e
        return self._checked(scores, prompts)

    def _failure(self, prompts: Sequence[Prompt], replies: Sequence[str], error: Exception) -> DataError:
        """The error of the first row that fails alone (the batch's error when none does)."""
        culprit, found = prompts[0], error
        if len(prompts) > 1:
            for prompt, reply in zip(prompts, replies):
                try:
                    self._call([prompt], [reply])
                except Exception as e:  # noqa: BLE001
                    culprit, found = prompt, e
                    break
        return DataError(f"reward function {self.spec} failed on {culprit.row.where()}: "
                         f"{type(found).__name__}: {found}")

    def _checked(self, scores: Any, prompts: Sequence[Prompt]) -> list[float]:
        if isinstance(scores, torch.Tensor) or type(scores).__module__ == "numpy":
            scores = scores.tolist()
        if not isinstance(scores, list | tuple):
            problem = f"returned a {type(scores).__name__}"
        elif len(scores) != len(prompts):
            problem = f"returned {len(scores)} values for {len(prompts)} replies"
        else:
            try:
                values = [float(s) for s in scores]
            except (TypeError, ValueError):
                problem = f"returned {next(s for s in scores if not _is_number(s))!r} among its values"
            else:
                if all(map(math.isfinite, values)):
                    return values
                problem = f"returned {next(v for v in values if not math.isfinite(v))}"
        raise ConfigError(f"reward function {self.spec} {problem} (batch from {prompts[0].row.where()}): it must "
                          "return one finite float per reply")


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


class Rewards:
    """Scores replies with every reward source: `(reward [B], scores [B, sources])`, the reward being the
    weighted sum of the sources' scores. `names` labels the sources (function names, "reward_model")."""

    def __init__(self, tokenizer: Any, functions: Sequence[RewardFunction] = (), weights: Sequence[float] = (),
                 reward_model: RewardModelScorer | None = None, reward_model_weight: float = 1.0) -> None:
        if not functions and reward_model is None:
            raise ValueError("Rewards needs a reward model or reward functions")
        self.tokenizer = tokenizer
        self.functions = list(functions)
        self.reward_model = reward_model
        self.weights = torch.tensor([*(weights or [1.0] * len(self.functions)),
                                     *([reward_model_weight] if reward_model is not None else [])])
        self.names = [f.name for f in self.functions] + ([REWARD_MODEL] if reward_model is not None else [])

    def __call__(self, prompts: Sequence[Prompt], responses: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        columns = []
        if self.functions:
            replies = self.tokenizer.batch_decode([list(r) for r in responses], skip_special_tokens=True)
            columns += [torch.tensor(f(prompts, replies), dtype=torch.float32) for f in self.functions]
        if self.reward_model is not None:
            columns.append(self.reward_model(prompts, responses).float().cpu())
        scores = torch.stack(columns, dim=1)
        return scores @ self.weights, scores
