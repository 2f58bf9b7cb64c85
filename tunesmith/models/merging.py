"""Base + LoRA adapter as one model: the loading and fit checks shared by the merge command (which saves
the merged model) and the GGUF export (which merges in memory and writes the result as GGUF)."""

from __future__ import annotations

from typing import Any

from ..errors import UserError
from ..hparams import ModelArguments
from ..utils.paths import adapter_config
from .loader import load_for_inference


class MergeError(UserError, RuntimeError):
    """A merge that cannot be done, or whose result does not match base + adapter."""

    kind = "merge error"


def adapter_task(adapter_dir: str) -> str:
    """reward for a sequence-classification adapter (task_type SEQ_CLS), else causal_lm."""
    return "reward" if adapter_config(adapter_dir).get("task_type") == "SEQ_CLS" else "causal_lm"


def load_adapted(model_args: ModelArguments, task: str) -> tuple[Any, Any]:
    """(PeftModel on the unquantized base, tokenizer); a library error about shapes or module names
    becomes one that names both sides."""
    adapter, base = model_args.adapter_name_or_path, model_args.model_name_or_path
    try:
        model, tokenizer = load_for_inference(model_args, task)
    except UserError:
        raise
    except (RuntimeError, ValueError, KeyError) as e:
        raise MergeError(f"adapter {adapter} does not fit base model {base}: {e}") from e
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise MergeError(
            f"adapter {adapter} does not fit base model {base}: its tokenizer has {len(tokenizer)} tokens but the "
            f"base has {rows} embedding rows (vocab mismatch); pass the base the adapter was trained on"
        )
    return model, tokenizer


def load_merged(model_args: ModelArguments) -> tuple[Any, Any]:
    """(causal LM with the adapter, if any, merged into its weights; the tokenizer training saved)."""
    if not model_args.adapter_name_or_path:
        return load_for_inference(model_args)
    model, tokenizer = load_adapted(model_args, "causal_lm")
    return model.merge_and_unload(safe_merge=True), tokenizer
