"""The settings of the runs that use a trained model rather than train one: merge, score, compare and the policy
evaluation (GGUF export's are in tunesmith/export/args.py, inspect's in tunesmith/inspect/args.py). Models, adapters
and data come from the shared dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

# Merging changes the order of float operations (W x + B A x vs (W + B A) x) and, in half precision,
# rounds the merged weight once more; the error that adds up through the layers scales with the
# dtype's rounding step and with the size of the logits. Measured on SmolLM2-135M with trained
# adapters: ~2e-6 (float32), ~5e-3 (float16), ~3e-2 (bfloat16) of the largest logit.
MERGE_RELATIVE_TOLERANCES = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}
# The --method merges' defaults where the flag is left out (None in the dataclass, so that a rule can tell a value
# set for a method that does not read it): half of each difference kept (mergekit's own examples), the midpoint.
MERGE_DEFAULT_DENSITY = 0.5
MERGE_DEFAULT_SLERP_T = 0.5


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
    # Several models through mergekit (models/model_merge.py); left out, the LoRA merge above.
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


@dataclass
class ScoreArguments:
    role: ClassVar[str] = "score"
    _argument_group_name: ClassVar[str] = "scoring"

    output_file: str | None = field(
        default=None, metadata={"help": "Where to write one JSON line of scores per input row."}
    )
    batch_size: int = field(default=8, metadata={"help": "Sequences per forward pass."})


@dataclass
class CompareArguments:
    role: ClassVar[str] = "compare"
    _argument_group_name: ClassVar[str] = "compare"

    baseline: str | None = field(
        default=None, metadata={"help": "The left column: a model directory or an adapter directory (its base from "
                                "adapter_config.json). Default: the base model under --adapter_name_or_path."})
    max_new_tokens: int = field(default=48, metadata={"help": "Longest answer."})
    num_beams: int = field(default=1, metadata={"help": "Beam search over this many beams (1: greedy decoding)."})
    width: int = field(default=48, metadata={"help": "Column width when printing, in terminal cells."})
    count_word: str | None = field(
        default=None,
        metadata={"help": "Also count the answers of each column that contain this word (case-insensitive), "
                  "e.g. the new name a fine-tune teaches."},
    )


@dataclass
class HarnessArguments:
    """`tunesmith eval`: lm-evaluation-harness tasks run in this process on the model (and adapter) that
    ModelArguments names, with lm-eval's own flags and their meaning."""

    role: ClassVar[str] = "harness"
    _argument_group_name: ClassVar[str] = "evaluation (lm-evaluation-harness)"

    tasks: str | None = field(
        default=None,
        metadata={"help": "Comma-separated lm-eval task or group names (as `lm_eval --tasks`): the shipped offline "
                  "tasks tunesmith_identity, tunesmith_arithmetic, tunesmith_tool_calls, tunesmith_knowledge (group "
                  "tunesmith), tasks under --include_path, or lm-eval's own (their data from the Hugging Face hub)."},
    )
    include_path: str | None = field(
        default=None, metadata={"help": "A folder of your own lm-eval task YAMLs, searched as well (as lm_eval's)."})
    num_fewshot: int | None = field(
        default=None, metadata={"help": "Few-shot examples per question (default: each task's own, else 0)."})
    limit: float | None = field(
        default=None, metadata={"help": "Only the first N documents of each task (a fraction < 1: that share). "
                                "For quick checks; numbers on a limited set are not comparable with published ones."})
    batch_size: str = field(default="8", metadata={"help": "Requests per forward: a number, or auto (as lm_eval's)."})
    apply_chat_template: bool = field(
        default=False, metadata={"help": "Render each prompt through the model's chat template as a user turn "
                                 "(lm-eval's flag; what a chat model answers best)."})
    fewshot_as_multiturn: bool = field(
        default=False, metadata={"help": "With --apply_chat_template: few-shot examples as earlier turns."})
    system_instruction: str | None = field(default=None, metadata={"help": "A system prompt for every request."})
    gen_kwargs: str | None = field(
        default=None, metadata={"help": "Generation settings for generate_until tasks, e.g. temperature=0,max_gen_toks=64 "
                                "(lm-eval's --gen_kwargs)."})
    seed: int | None = field(
        default=None, metadata={"help": "One seed for lm-eval's four (python, numpy, torch, few-shot order), as "
                                "`lm_eval --seed N`. Default: lm_eval's 0,1234,1234,1234."})
    compare_to: str | None = field(
        default=None,
        metadata={"help": "Also evaluate another model on the same tasks and print, per task and metric, both scores, "
                  "the change and its paired standard error over the same documents: `base` (the model under "
                  "--adapter_name_or_path) or a model/adapter directory. Written as compare.md and compare.json "
                  "in --output_path."})
    output_path: str = field(
        default="outputs/eval",
        metadata={"help": "Where results go: lm-eval's results_<time>.json under <output_path>/<model name>/, as "
                  "`lm_eval --output_path` writes them."})
    log_samples: bool = field(
        default=False, metadata={"help": "Also write every document's prompt, answer and scores (lm-eval's samples files)."})
