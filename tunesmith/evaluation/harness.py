"""lm-evaluation-harness in this process, on a model tunesmith loaded (any base, adapter or the embedded
default): the tasks are found and loaded first, so an unknown name or data that cannot be fetched stops
with one line before any model work; then lm-eval's simple_evaluate runs with the settings `lm_eval`
takes, and its results JSON is written where `lm_eval --output_path` writes it. lm-eval owns the
prompts, requests and metrics; this module only connects it to our models, errors and files."""

from __future__ import annotations

import difflib
import logging
import os
from pathlib import Path
from typing import Any

from ..data.template import processor_of
from ..errors import ConfigError, DataError

logger = logging.getLogger(__name__)

# The shipped offline tasks (YAML and data in the package): usable by name with --tasks, and by plain
# lm_eval with --include_path pointing here.
TASKS_DIR = Path(__file__).resolve().parent / "tasks"


def task_names(tasks: str) -> list[str]:
    """`a,b` as lm_eval reads --tasks; a .yaml path stays a path."""
    return [t.strip() for t in tasks.split(",") if t.strip()]


def quiet_lm_eval() -> None:
    """lm-eval's per-step INFO lines off (its progress bars and warnings stay; we print what ran and where
    it was written), and its advice about --metadata, given for every task that loads its own data (ours)."""
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    logging.getLogger("lm_eval.api.task").addFilter(_not_metadata_advice)  # the same function: added once


def _not_metadata_advice(record: logging.LogRecord) -> bool:
    return "Custom kwargs can be passed" not in record.getMessage()


def task_manager(include_path: str | None) -> Any:
    """lm-eval's TaskManager over its own tasks, the shipped ones and `include_path`."""
    from lm_eval.tasks import TaskManager

    quiet_lm_eval()

    paths = [str(TASKS_DIR)] if TASKS_DIR.is_dir() else []
    return TaskManager(include_path=paths + ([include_path] if include_path else []))


def check_tasks(manager: Any, names: list[str]) -> None:
    """Every task known, and its data loadable; else one line saying what to do."""
    for name in names:
        if name.endswith(".yaml"):
            if not os.path.isfile(name):
                raise ConfigError(f"--tasks {name}: no such task file")
            continue
        if not manager.match_tasks([name]):
            close = difflib.get_close_matches(name, manager.all_tasks, n=4, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}?" if close else "`lm_eval ls tasks` lists them all"
            raise ConfigError(f"--tasks: no lm-eval task or group named {name!r} ({hint}); tasks of your own go "
                              "in a folder given with --include_path")
    for name in names:
        try:
            manager.load([name])
        except OSError as e:  # no hub access (ConnectionError), a missing data file, a dataset not found
            raise DataError(_unloadable(manager, name, e)) from e


def _unloadable(manager: Any, name: str, error: Exception) -> str:
    entry = manager.task_index.get(name)
    config = (entry.cfg or {}) if entry else {}
    dataset = config.get("dataset_path") or "its dataset"
    where = f" ({entry.yaml_path})" if entry and entry.yaml_path else ""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (f"--tasks {name}: its data ({dataset}) could not be loaded: {reason}. Without hub access, fetch it "
            "where there is some, copy the task's YAML" + where + " into a folder of your own with `dataset_path: "
            "json` and `dataset_kwargs: {data_files: {test: FILE}}` pointing at the files (or set HF_DATASETS_CACHE "
            "to a cache that holds it), and pass that folder with --include_path")


def harness_model(model: Any, tokenizer: Any, batch_size: str) -> Any:
    """lm-eval's HF model around a model already loaded (the one lm_eval --model hf would build); for a
    vision-language model, its hf-multimodal model (`lm_eval --model hf-multimodal`) with the processor tunesmith
    loaded: the chat template training used, and Qwen's processor where torchvision is missing."""
    from lm_eval.models.huggingface import HFLM

    logging.getLogger("lm_eval.models.huggingface").setLevel(logging.ERROR)  # "model kwarg is not of type str"
    processor = processor_of(tokenizer)
    if processor is None:
        return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    # hf-multimodal refuses batch size auto
    return _multimodal_lm_class()(pretrained=model, tokenizer=processor,
                                  batch_size=1 if batch_size.startswith("auto") else batch_size)


def _multimodal_lm_class() -> type:
    from lm_eval.models.hf_vlms import HFMultimodalLM

    class LoadedProcessorLM(HFMultimodalLM):
        """HFMultimodalLM given the processor object itself (its own loader returns a passed processor without
        keeping it, and would load another from the model's hub name)."""

        def _create_tokenizer(self, pretrained: Any, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
            self.processor, self.tokenizer = tokenizer, tokenizer.tokenizer

    return LoadedProcessorLM


def model_args_text(model_path: str, adapter: str | None) -> str:
    """How `lm_eval --model_args` would name this model: lm-eval names the results folder after it."""
    return f"pretrained={model_path}" + (f",peft={adapter}" if adapter else "")


def evaluate(lm: Any, names: list[str], manager: Any, settings: Any, model_args: str) -> tuple[dict, Path]:
    """Run the tasks on `lm` as `lm_eval` would with `settings` (HarnessArguments) and write the results
    JSON (and, with --log_samples, the samples) under settings.output_path. Returns lm-eval's results with
    the per-document "samples" kept (what a paired comparison needs), and the results file."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    tracker = EvaluationTracker(output_path=settings.output_path)
    seeds = {} if settings.seed is None else {key: settings.seed for key in (
        "random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed")}
    results = simple_evaluate(
        model=lm, model_args=model_args, tasks=names, num_fewshot=settings.num_fewshot,
        batch_size=settings.batch_size, limit=settings.limit, log_samples=True, evaluation_tracker=tracker,
        system_instruction=settings.system_instruction, apply_chat_template=settings.apply_chat_template,
        fewshot_as_multiturn=settings.fewshot_as_multiturn, gen_kwargs=settings.gen_kwargs, task_manager=manager,
        **seeds)
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples if settings.log_samples else None)
    if settings.log_samples:
        for task in results["configs"]:
            tracker.save_results_samples(task_name=task, samples=samples[task])
    results_file = (Path(settings.output_path) / tracker.general_config_tracker.model_name_sanitized
                    / f"results_{tracker.date_id}.json")
    results["samples"] = samples
    return results, results_file


def results_table(results: dict) -> str:
    """lm-eval's own table (and its groups' table), as `lm_eval` prints them."""
    from lm_eval.utils import make_table

    table = make_table(results)
    return table + ("\n" + make_table(results, "groups") if results.get("groups") else "")
