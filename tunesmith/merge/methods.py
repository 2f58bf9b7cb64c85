"""Several models of one architecture merged into one through mergekit (the `merge` extra): tunesmith's merge
flags as a mergekit MergeConfiguration, run by mergekit's own run_merge. The methods (mergekit's names):

- linear: sum_i w_i W_i / sum_i w_i, tensor by tensor (Wortsman et al. 2022, model soups).
- ties: the base plus the elected-sign sum of each model's difference from the base, each difference first trimmed
  to its largest `density` share (Yadav et al. 2023, arXiv 2306.01708).
- dare_ties: ties with a random `density` share of each difference kept and rescaled by 1 / density instead of the
  largest (Yu et al. 2023, arXiv 2311.03099).
- slerp: the spherical interpolation between two models at `t`, row by row of each weight (0: the first model).

mergekit reads safetensors folders: a LoRA adapter is merged into its base first, by the caller (command.py),
so that the LoRA merge and its check are tunesmith's one path for adapters."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .args import MERGE_DEFAULT_DENSITY, MERGE_DEFAULT_SLERP_T, METHODS_WITH_BASE, MergeArguments


def _reference(path: str) -> Any:
    """A mergekit ModelReference to a local folder, built field by field: its string form would read a `+` in the
    path as `model+lora` and an `@` as a hub revision."""
    from mergekit.common import ModelPath, ModelReference

    return ModelReference(model=ModelPath(path=os.path.abspath(path)))


def merge_configuration(args: MergeArguments, folders: Sequence[str], base: str | None, dtype: str) -> Any:
    """mergekit's MergeConfiguration for --method over `folders` (full model folders, in --models' order), with
    `base` the ties/dare_ties base; tensors are loaded, merged and written in `dtype`."""
    from mergekit.config import MergeConfiguration

    weights = list(args.weights) or [1.0] * len(folders)
    if args.method == "slerp":
        # mergekit's slerp interpolates from its base (t = 0) to the other model (t = 1).
        models = [{"model": _reference(path)} for path in folders]
        parameters, base_ref = {"t": MERGE_DEFAULT_SLERP_T if args.slerp_t is None else args.slerp_t}, folders[0]
    else:
        per_model: dict[str, float] = {}
        if args.method in METHODS_WITH_BASE:
            per_model["density"] = MERGE_DEFAULT_DENSITY if args.density is None else args.density
        models = [{"model": _reference(path), "parameters": {"weight": weight, **per_model}}
                  for path, weight in zip(folders, weights, strict=True)]
        parameters, base_ref = {}, base if args.method in METHODS_WITH_BASE else None
    return MergeConfiguration(merge_method=args.method, models=models, parameters=parameters or None,
                              base_model=_reference(base_ref) if base_ref else None, dtype=dtype, out_dtype=dtype)


def run_mergekit(config: Any, output_dir: str, seed: int, trust_remote_code: bool = False) -> None:
    """mergekit's run_merge with its defaults (the CPU, lazy loading off, 5B-parameter shards), the tokenizer left
    to the caller: mergekit copies the base's (or an unordered first model's), and the merged folder is to chat as
    the first --models entry does."""
    from mergekit.merge import MergeOptions, run_merge

    run_merge(config, output_dir, MergeOptions(copy_tokenizer=False, random_seed=seed, quiet=True,
                                               trust_remote_code=trust_remote_code))
