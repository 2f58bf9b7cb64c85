"""The rows of `tunesmith eval` (lm-evaluation-harness: the harness_* rows) and of `tunesmith compare` (the compare_*
rows): settings that cannot work, refused in one line after parsing and before any weight loads. The parser checks
them after the core's rows (hparams/rules.py) for these commands only; a row reads only its own command's roles, so
the other command's rows are passed over."""

from __future__ import annotations

import re
from types import SimpleNamespace

from ..errors import PathError
from ..hparams.rule_engine import Rule
from ..hparams.rule_helpers import bound_rule, missing_dir, problem_values, prompt_adapter
from ..hparams.value_bounds import Bound, at_least
from ..utils.paths import problem_with_model_dir


def _prompt_adapter_at(path: str | None) -> dict | None:
    """{"path", "kind"} when the second model (compare's --baseline, eval's --compare_to) is a prompt-based adapter."""
    return prompt_adapter(SimpleNamespace(adapter_name_or_path=path, model_name_or_path=None))


# The values' bounds: `--FIELD must be NEED (got VALUE); ADVICE.` (hparams/value_bounds.py's form).
BOUNDS: tuple[Bound, ...] = (
    Bound("compare", "max_new_tokens", at_least(1), "at least 1"),
    Bound("compare", "width", at_least(8), "at least 8 terminal cells"),
)

RULES: list[Rule] = [
    *map(bound_rule, BOUNDS),
    # -- compare
    Rule("compare_adapter_given", ("compare", "model"),
         lambda a: not a.model.adapter_name_or_path and not a.compare.baseline,
         "--adapter_name_or_path is required: the fine-tuned LoRA adapter to compare with its base (or give "
         "--baseline, the model or adapter to compare the --model_name_or_path one with)."),
    Rule("compare_baseline", ("compare",),
         lambda a: a.compare.baseline and problem_values(problem_with_model_dir(a.compare.baseline)),
         "--baseline {compare.baseline}: {problem}; give a model folder or an adapter folder.", PathError),
    Rule("compare_beams", ("compare",), lambda a: a.compare.num_beams < 1,
         "--num_beams must be at least 1 (got {compare.num_beams}); 1 is greedy decoding."),
    Rule("compare_prompt_adapter_beams", ("compare", "model"),
         lambda a: a.compare.num_beams > 1 and (prompt_adapter(a.model) or _prompt_adapter_at(a.compare.baseline)),
         "--num_beams with the {kind} adapter {path}: beam search runs PEFT's generate(), which in this version "
         "does not continue a prompt-based adapter's replies as its own forward does; use --num_beams 1."),
    # -- eval (lm-evaluation-harness)
    Rule("harness_tasks_given", ("harness",), lambda a: not (a.harness.tasks or "").strip(", "),
         "--tasks is required: lm-eval task or group names, comma-separated, e.g. --tasks tunesmith_knowledge "
         "(shipped offline: tunesmith_identity, tunesmith_arithmetic, tunesmith_tool_calls, tunesmith_knowledge)."),
    Rule("harness_prompt_adapter", ("harness", "model"),
         lambda a: prompt_adapter(a.model) or _prompt_adapter_at(a.harness.compare_to),
         "--tasks: {path} is a {kind} adapter, and lm-eval scores and generates through the model's own forward "
         "and PEFT's generate(), which do not line up with its virtual tokens; compare it with tunesmith compare "
         "or tunesmith eval --policy instead."),
    Rule("harness_compare_base", ("harness", "model"),
         lambda a: a.harness.compare_to == "base" and not a.model.adapter_name_or_path,
         "--compare_to base compares an adapter with the model under it: give --adapter_name_or_path (or compare "
         "two models with --compare_to PATH)."),
    Rule("harness_compare_path", ("harness",),
         lambda a: a.harness.compare_to not in (None, "base")
         and problem_values(problem_with_model_dir(a.harness.compare_to)),
         "--compare_to {harness.compare_to}: {problem}; give `base`, a model folder or an adapter folder.", PathError),
    Rule("harness_include_path", ("harness",), lambda a: missing_dir(a.harness.include_path),
         "--include_path {path}: {problem} (a folder of lm-eval task YAML files).", PathError),
    Rule("harness_limit", ("harness",), lambda a: a.harness.limit is not None and not a.harness.limit > 0,
         "--limit must be > 0 (got {harness.limit}): a number of documents per task, or a share below 1."),
    Rule("harness_batch_size", ("harness",),
         lambda a: not (a.harness.batch_size.isdigit() and int(a.harness.batch_size) > 0
                        or re.fullmatch(r"auto(:\d+)?", a.harness.batch_size)),
         "--batch_size must be a positive number or auto (got {harness.batch_size})."),
    Rule("harness_multiturn", ("harness",),
         lambda a: a.harness.fewshot_as_multiturn and not a.harness.apply_chat_template,
         "--fewshot_as_multiturn needs --apply_chat_template (few-shot turns are chat turns)."),]
