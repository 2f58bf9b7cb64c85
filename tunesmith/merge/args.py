"""The settings of `tunesmith merge`: the model's (ModelArguments: the adapter to merge and its base, or ties' base)
and the merge's own (MergeArguments: where it goes, and mergekit's --method, --models and their parameters). Their
combinations are refused by the rows of rules.py beside it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..hparams.model_args import ModelArguments

# Merging changes the order of float operations (W x + B A x vs (W + B A) x) and, in half precision,
# rounds the merged weight once more; the error that adds up through the layers scales with the
# dtype's rounding step and with the size of the logits. Measured on SmolLM2-135M with trained
# adapters: ~2e-6 (float32), ~5e-3 (float16), ~3e-2 (bfloat16) of the largest logit.
MERGE_RELATIVE_TOLERANCES = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}
# The --method merges' defaults where the flag is left out (None in the dataclass, so that a rule can tell a value
# set for a method that does not read it): half of each difference kept (mergekit's own examples), the midpoint.
MERGE_DEFAULT_DENSITY = 0.5
MERGE_DEFAULT_SLERP_T = 0.5

# The --method merges that add each model's difference from a base to that base (mergekit's BasePolicy.REQUIRED,
# besides slerp's own): they read --model_name_or_path and --density.
METHODS_WITH_BASE = ("ties", "dare_ties")


@dataclass
class MergeArguments:
    role: ClassVar[str] = "merge"
    _argument_group_name: ClassVar[str] = "merge"

    output_dir: str | None = field(
        default=None,
        metadata={"help": "Where the merged model goes (must not exist or be empty, unless --overwrite_output_dir)."},
    )
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Replace a non-empty output_dir."})
    max_shard_size: str = field(default="2GB", metadata={"help": "Largest safetensors shard."})
    tolerance: float | None = field(
        default=None,
        metadata={"help": "Largest allowed max |logit difference| between the merged model and base + adapter "
                  "on a probe conversation. Default: the largest |logit| (at least 1) times "
                  + ", ".join(f"{v:g} ({k})" for k, v in MERGE_RELATIVE_TOLERANCES.items()) + "."},
    )
    # Several models through mergekit (methods.py); left out, the LoRA merge above.
    method: Literal["linear", "ties", "dare_ties", "slerp"] | None = field(
        default=None,
        metadata={"help": "Merge the --models into one through mergekit (pip install -e '.[merge]'): linear (a "
                  "weighted average of the weights), ties (each model's difference from the base --model_name_or_path, "
                  "trimmed to its largest --density share, signs elected, then added to the base), dare_ties (the "
                  "same with a random share of each difference dropped and the rest rescaled) or slerp (two models, "
                  "interpolated along the sphere by --slerp_t). Left out: merge the one --adapter_name_or_path into "
                  "its base."},
    )
    models: list[str] = field(
        default_factory=list,
        metadata={"help": "With --method: the model folders to merge, two or more of the same architecture and "
                  "shapes (full models, or LoRA adapters, each merged into the base its adapter_config.json records "
                  "first). The merged folder takes the first one's tokenizer and chat template."},
    )
    weights: list[float] = field(
        default_factory=list,
        metadata={"help": "With --method linear, ties or dare_ties: one weight per --models entry, in order (default: "
                  "1 each). linear divides by their sum, so 1 3 is a 0.25/0.75 average."},
    )
    density: float | None = field(
        default=None,
        metadata={"help": "With --method ties or dare_ties: the share of each model's difference from the base that "
                  "is kept, in (0, 1] (ties keeps the largest entries, dare_ties a random choice). Default: " + f"{MERGE_DEFAULT_DENSITY}."},
    )
    slerp_t: float | None = field(
        default=None,
        metadata={"help": "With --method slerp: where between the two --models the merge lies, in [0, 1]: 0 is the "
                  "first, 1 the second (mergekit's t). Default: " + f"{MERGE_DEFAULT_SLERP_T}."},
    )
    seed: int = field(default=0, metadata={"help": "The random seed of dare_ties' dropped entries."})


# The dataclasses `tunesmith merge` parses, in the order tunesmith_config.json records them.
ARGUMENTS: tuple[type, ...] = (ModelArguments, MergeArguments)
