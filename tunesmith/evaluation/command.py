"""Evaluate a model: lm-evaluation-harness tasks in process (the shipped offline ones or any other), base
vs tuned with paired standard errors, or generated answers scored by reward models and functions.

    tunesmith eval --adapter_name_or_path outputs/sft_demo --tasks tunesmith_identity,tunesmith_knowledge \\
        --apply_chat_template --compare_to base --output_path outputs/eval
    tunesmith eval --model_name_or_path M --tasks arc_easy --num_fewshot 5 --limit 200   # a hub task
    tunesmith eval --tasks my_task --include_path my_tasks/                               # your own YAML
    tunesmith eval --policy outputs/grpo_demo --data_path data/demo/grpo_eval.jsonl --reward_funcs exact_answer

With --tasks, the numbers are lm-eval's: the same as `lm_eval --model hf --model_args
pretrained=M[,peft=A]` with the same settings, and its results JSON goes where `lm_eval --output_path`
puts it (<output_path>/<model name>/results_<time>.json). No model given: the embedded default.
--compare_to base (the model under the adapter) or --compare_to PATH runs the other model on the same
documents and prints per task and metric both scores, the change and its paired standard error
(compare.md and compare.json in --output_path).
With --policy, --data_path, --reward_model or --reward_funcs: the policy evaluation (replies of
a baseline and a tuned policy scored, with KL); `tunesmith eval --policy P --help` lists its flags.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..boundary import entry_point
from ..errors import ConfigError
from ..hparams import parse_run
from ..models.loader import inference_model_args, load_for_inference, resolve_model_path
from ..utils.io import atomic_write_json, atomic_write_text
from .harness import (
    check_tasks,
    evaluate,
    harness_model,
    model_args_text,
    results_table,
    task_manager,
    task_names,
)
from .paired import compare_runs, markdown_table

# Flags that only the policy evaluation has: any of them (on the command line or in the run config)
# makes `tunesmith eval` that evaluation.
POLICY_FLAGS = {"policy", "baseline", "reward_model", "reward_funcs", "prompts", "data_path", "sft", "ppo"}
# The policy evaluation is the RL feature's command (it reads replies as the rollouts do). Named, not imported: a
# feature imports no other (tests/core/test_layout.py), as hparams.run_kinds names each feature's package.
POLICY_EVALUATION = "tunesmith.rl.evaluate_command"


def run(argv: Sequence[str] | None = None) -> Any:
    argv = list(argv or [])
    if _named_flags(argv) & POLICY_FLAGS:
        # passed as given: its parser maps an old spelling (--prompts, --sft, --ppo) with a deprecation line
        return importlib.import_module(POLICY_EVALUATION).run(argv)
    args = parse_run("eval", argv, __doc__)
    require_lm_eval()
    settings = args.harness
    resolve_model_path(args.model)
    names = task_names(settings.tasks)
    manager = task_manager(settings.include_path)
    check_tasks(manager, names)  # before any weights load

    model, tokenizer = load_for_inference(args.model)
    tuned_name = model_args_text(args.model.model_name_or_path, args.model.adapter_name_or_path)
    tuned, tuned_file = evaluate(harness_model(model, tokenizer, settings.batch_size), names, manager, settings,
                                 tuned_name)
    print(f"\n{tuned_name}: {tuned_file}\n{results_table(tuned)}")
    if not settings.compare_to:
        return tuned

    if settings.compare_to == "base":
        base_name = model_args_text(args.model.model_name_or_path, None)
        with model.disable_adapter():  # the same weights with the adapter off: no second model in memory
            base, base_file = evaluate(harness_model(model, tokenizer, settings.batch_size), names, manager,
                                       settings, base_name)
    else:
        del model
        other = inference_model_args(settings.compare_to)
        base_model, base_tokenizer = load_for_inference(other)
        base_name = model_args_text(other.model_name_or_path, other.adapter_name_or_path)
        base, base_file = evaluate(harness_model(base_model, base_tokenizer, settings.batch_size), names, manager,
                                   settings, base_name)
    print(f"\n{base_name}: {base_file}\n{results_table(base)}")

    rows = compare_runs(base, tuned)
    labels = ("base" if settings.compare_to == "base" else _short(settings.compare_to),
              _short(args.model.adapter_name_or_path or args.model.model_name_or_path))
    table = markdown_table(rows, labels)
    atomic_write_text(os.path.join(settings.output_path, "compare.md"),
                      f"{labels[0]}: {base_name}\n{labels[1]}: {tuned_name}\n\n{table}\n")
    atomic_write_json(os.path.join(settings.output_path, "compare.json"),
                      {"base": {"label": labels[0], "model_args": base_name, "results_file": str(base_file)},
                       "tuned": {"label": labels[1], "model_args": tuned_name, "results_file": str(tuned_file)},
                       "rows": rows})
    print(f"\n{labels[0]} -> {labels[1]} (change ± its paired standard error over the same documents):\n{table}")
    return rows


def require_lm_eval() -> None:
    """lm-evaluation-harness is the `eval` extra's, not the base install's: without it, one line saying so."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise ConfigError("tunesmith eval --tasks runs lm-evaluation-harness, which is not installed: "
                          "pip install 'tunesmith[eval]' (from a clone: pip install -e '.[eval]')") from None


def _short(path: str) -> str:
    return os.path.basename(os.path.normpath(path))


def _named_flags(argv: list[str]) -> set[str]:
    """The flag names given on the command line and as keys of a leading run config."""
    names = {a[2:].split("=")[0] for a in argv if a.startswith("--")}
    if argv and argv[0].endswith((".yaml", ".yml", ".json")) and os.path.isfile(argv[0]):
        import yaml

        try:
            config = yaml.safe_load(Path(argv[0]).read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError):
            config = None  # the parser reports it in one line
        names |= set(config) if isinstance(config, dict) else set()
    return names


main = entry_point(run)
