"""The settings of the runs that use a trained model rather than train one: merge, score, inspect, compare
and the policy evaluation (GGUF export's are in tunesmith/export/args.py). Models, adapters and data come from
the shared dataclasses."""

from __future__ import annotations

import os
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
class InspectArguments:
    role: ClassVar[str] = "inspect"
    _argument_group_name: ClassVar[str] = "inspect"

    output_file: str | None = field(default=None, metadata={"help": "Write input_ids/labels per input row here."})
    show: int = field(default=5, metadata={"help": "How many examples to print (0: none, -1: all)."})
    color: str = field(default="auto", metadata={"help": "auto (when stdout is a terminal), always, never."})
    seed: int = field(default=42, metadata={"help": "The --seed of the training run to inspect: with --data_split or "
                                            "--data_weights, it chooses the same rows as that run."})
    text_column: str = field(
        default="text", metadata={"help": "A text corpus (continued pre-training, `tunesmith pt`): the field of its "
                                  "rows that holds the document, as pt's --text_column."})
    document_separator: str = field(
        default="file", metadata={"help": "A text corpus: how its .txt files are cut into documents, as pt's "
                                  "--document_separator (file, blank_line, or a separator line)."})


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


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass
class UIArguments:
    """`tunesmith ui`: a web page that runs the same commands as the CLI, each as its own process."""

    role: ClassVar[str] = "ui"
    _argument_group_name: ClassVar[str] = "web UI"

    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on. Anything but this machine "
                                                     "(127.0.0.1, localhost, ::1) needs --auth."})
    port: int = field(default=7860, metadata={"help": "TCP port to listen on."})
    root: str = field(default="outputs", metadata={"help": "The folder of runs: new runs go under it, the Runs tab "
                                                   "lists it, and every path the page takes is confined to it and "
                                                   "to the --data_dir folders."})
    data_dir: list[str] = field(
        default_factory=lambda: ["data", "configs"],
        metadata={"nargs": "+", "help": "Folders the page may read data files, run configs and models from (besides "
                  "--root and the embedded default model)."})
    allow_code: bool = field(
        default=False, metadata={"help": "Let runs started from the page run code that is not tunesmith's: "
                                 "--trust_remote_code (a model's own Python) and functions named "
                                 "package.module:function (--reward_funcs, --tool_funcs), from the Advanced flags or a "
                                 "Run config. Without it the page refuses them in one line. Paths stay confined either "
                                 "way."})
    auth: str | None = field(
        default=None, metadata={"help": "user:password asked by the page (required with a --host other than this "
                                "machine's; default: the TUNESMITH_UI_AUTH environment variable when set)."})

    def __post_init__(self) -> None:
        if self.auth is None:
            self.auth = os.environ.get("TUNESMITH_UI_AUTH") or None

    @property
    def credentials(self) -> tuple[str, str] | None:
        if not self.auth:
            return None
        user, _, password = self.auth.partition(":")
        return user, password
