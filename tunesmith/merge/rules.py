"""The rows of `tunesmith merge` (the LoRA merge, and mergekit's --method merges of several models): settings that
cannot work, refused in one line after parsing and before any weight loads (the parser checks them after the core's
rows, hparams/rules.py, for this command only), and the facts they read, each stored once: here what two models must
share to merge; which methods read a base is args.METHODS_WITH_BASE."""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace
from typing import Any

from ..errors import PathError
from ..hparams.rule_engine import Rule
from ..hparams.rule_helpers import NOTHING_TO_MERGE, bound_rule, first_problem, problem_values, prompt_adapter
from ..hparams.value_bounds import Bound, in_range
from ..utils.paths import (
    adapter_config,
    is_adapter_dir,
    is_torchao_quantized,
    model_config,
    problem_with_model_dir,
    problem_with_output_dir,
    prompt_adapter_kind,
)
from .args import METHODS_WITH_BASE

# What two models must share to merge weight by weight (config.json's fields; an adapter has its base's).
MERGE_SHAPE_FIELDS = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings")


def _weights_config(path: str) -> dict:
    """The config.json of the weights a --models entry stands for: an adapter's recorded base's."""
    if is_adapter_dir(path):
        base = adapter_config(path).get("base_model_name_or_path")
        return model_config(base) if base else {}
    return model_config(path)


def _merge_shape_difference(a: SimpleNamespace) -> dict | None:
    """{"first", "other", "field", "a", "b"}: the first config.json field (of MERGE_SHAPE_FIELDS) in which a --models
    entry (or the ties base) differs from the first; models whose config cannot be read are left to other rows."""
    paths = ([a.model.model_name_or_path] if a.merge.method in METHODS_WITH_BASE and a.model.model_name_or_path
             else []) + list(a.merge.models)
    configs = [(path, _weights_config(path)) for path in paths if os.path.isdir(path)]
    configs = [(path, config) for path, config in configs if config]
    for path, config in configs[1:]:
        first, reference = configs[0]
        field = next((f for f in MERGE_SHAPE_FIELDS if config.get(f) != reference.get(f)), None)
        if field:
            return {"first": first, "other": path, "field": field, "a": reference.get(field), "b": config.get(field)}
    return None


def _unmergeable_adapter(models: list[str]) -> dict | None:
    """{"path", "kind"}: the first --models adapter that mergekit cannot take as a causal LM's weights."""
    for path in models:
        kind = prompt_adapter_kind(path) or (
            "reward-model (task_type SEQ_CLS)" if is_adapter_dir(path)
            and adapter_config(path).get("task_type") == "SEQ_CLS" else None)
        if kind:
            return {"path": path, "kind": kind}
    return None


# The values' bounds: `--FIELD must be NEED (got VALUE); ADVICE.` (hparams/value_bounds.py's form).
BOUNDS: tuple[Bound, ...] = (
    Bound("merge", "density", lambda value: 0 < value <= 1, "in (0, 1]", "the share of each difference kept; 1 keeps "
          "all"),
    Bound("merge", "slerp_t", in_range(0, 1, high_included=True), "in [0, 1]", "0 is the first model, 1 the second"),
)


def _torchao_model(a: Any) -> dict | None:
    """{"problem"}: the first model to merge (the base, or one of --models) that is torchao-quantized."""
    models = [a.model.model_name_or_path, *(a.merge.models or [])]
    return problem_values(next((p for p in models if is_torchao_quantized(p)), None))


RULES: list[Rule] = [
    *map(bound_rule, BOUNDS),
    Rule("merge_models_need_method", ("merge",), lambda a: a.merge.models and not a.merge.method,
         "--models needs --method (linear, ties, dare_ties or slerp): how to merge them."),
    Rule("merge_adapter_given", ("merge", "model"), lambda a: not a.merge.method and not a.model.adapter_name_or_path,
         "--adapter_name_or_path is required: the LoRA adapter directory to merge (an SFT or reward-model output); "
         "or merge several models with --method and --models."),
    Rule("merge_method_adapter", ("merge", "model"), lambda a: a.merge.method and a.model.adapter_name_or_path,
         "--method {merge.method} merges the --models; {model.adapter_name_or_path} came as --adapter_name_or_path "
         "(or as an adapter folder in --model_name_or_path): list every model and adapter in --models instead, and "
         "give ties' base as --model_name_or_path."),
    Rule("merge_mergekit_installed", ("merge",),
         lambda a: a.merge.method and importlib.util.find_spec("mergekit") is None,
         "--method {merge.method} merges through mergekit, which is not installed: pip install -e '.[merge]' (the "
         "merge extra; or pip install mergekit)."),
    Rule("merge_models_count", ("merge",),
         lambda a: a.merge.method and len(a.merge.models) < 2 and {"count": len(a.merge.models)},
         "--method {merge.method} merges two or more --models (got {count}): give the model or adapter folders "
         "after --models."),
    Rule("merge_models_paths", ("merge",),
         lambda a: a.merge.method and first_problem(list(a.merge.models), problem_with_model_dir),
         "--models {path}: {problem}; give model or LoRA adapter folders.", PathError),
    Rule("merge_models_lora", ("merge",), lambda a: a.merge.method and _unmergeable_adapter(list(a.merge.models)),
         "--models {path} is a {kind} adapter: --method merges chat models' weights, so give full models or LoRA "
         "adapters of a causal LM."),
    Rule("merge_slerp_two", ("merge",),
         lambda a: a.merge.method == "slerp" and len(a.merge.models) != 2 and {"count": len(a.merge.models)},
         "--method slerp interpolates between exactly two --models (got {count}); merge more with linear, ties or "
         "dare_ties."),
    Rule("merge_slerp_weights", ("merge",), lambda a: a.merge.method == "slerp" and a.merge.weights,
         "--weights is not read by --method slerp: its --slerp_t says where between the two models the merge lies."),
    Rule("merge_weights_count", ("merge",),
         lambda a: a.merge.weights and len(a.merge.weights) != len(a.merge.models)
         and {"weights": len(a.merge.weights), "models": len(a.merge.models)},
         "--weights has {weights} values for {models} --models: give one weight per model, in order."),
    Rule("merge_base_given", ("merge", "model"),
         lambda a: a.merge.method in METHODS_WITH_BASE and not a.model.model_name_or_path,
         "--method {merge.method} adds each model's difference from a base to that base: give the base they were "
         "fine-tuned from as --model_name_or_path (old spelling --base_model)."),
    Rule("merge_base_unread", ("merge", "model"),
         lambda a: a.merge.method in ("linear", "slerp") and a.model.model_name_or_path,
         "--model_name_or_path {model.model_name_or_path}: --method {merge.method} reads no base (only ties and "
         "dare_ties do); list the models to merge in --models and leave it out."),
    Rule("merge_base_path", ("merge", "model"),
         lambda a: a.merge.method in METHODS_WITH_BASE and a.model.model_name_or_path
         and problem_values(problem_with_model_dir(a.model.model_name_or_path)),
         "--model_name_or_path {model.model_name_or_path} (the base of --method {merge.method}): {problem}.", PathError),
    Rule("merge_density_unread", ("merge",),
         lambda a: a.merge.density is not None and a.merge.method not in METHODS_WITH_BASE,
         "--density is read by --method ties and dare_ties only (this merge: {merge.method}); leave it out."),
    Rule("merge_slerp_t_unread", ("merge",), lambda a: a.merge.slerp_t is not None and a.merge.method != "slerp",
         "--slerp_t is read by --method slerp only (this merge: {merge.method}); leave it out."),
    Rule("merge_tolerance_unread", ("merge",), lambda a: a.merge.method and a.merge.tolerance is not None,
         "--tolerance bounds a LoRA merge's difference from base + adapter; a --method merge has no such reference "
         "(it checks that the merged model loads and gives finite logits): leave it out."),
    Rule("merge_shapes", ("merge", "model"), lambda a: a.merge.method and _merge_shape_difference(a),
         "--models: {first} and {other} differ in config.json's {field} ({a} vs {b}): models merge weight by weight "
         "only with one architecture and shape; give fine-tunes of the same base (an adapter has its base's)."),
    Rule("merge_prompt_learning", ("merge", "model"), lambda a: prompt_adapter(a.model),
         "merge: " + NOTHING_TO_MERGE),
    Rule("merge_torchao", ("merge", "model"), _torchao_model,
         "merge: {problem} is torchao-quantized (a --qat run's quantized/): merging into its int4 weights would round "
         "the sum again; merge into the float base (a LoRA --qat run's quantized/ already holds its adapter merged "
         "and converted)."),
    Rule("merge_output_given", ("merge",), lambda a: not a.merge.output_dir,
         "--output_dir is required: where the merged model goes."),
    Rule("merge_output_dir", ("merge",),
         lambda a: a.merge.output_dir and problem_values(problem_with_output_dir(a.merge.output_dir)),
         "--output_dir {merge.output_dir}: {problem}; choose another directory.", PathError),
    Rule("merge_unquantized", ("merge", "model"), lambda a: a.model.quantization_bit is not None,
         "--quantization_bit cannot be used with merge: the base is always loaded unquantized (merging into "
         "quantized weights would round away what the adapter learned); drop the flag."),
    Rule("merge_output_free", ("merge",),
         lambda a: not a.merge.overwrite_output_dir and a.merge.output_dir and os.path.isdir(a.merge.output_dir)
         and os.listdir(a.merge.output_dir),
         "--output_dir {merge.output_dir} exists and is not empty: choose another, or pass --overwrite_output_dir."),
]
