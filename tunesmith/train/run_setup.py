"""What every training stage does before it loads anything: parse and check its flags, pin the default
model to its path (which the saved run config records), refuse an output_dir that holds a different
run, find (and announce) the checkpoint to resume from, and describe the process group; and what the
Trainer stages do at the end: train, save, evaluate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..distributed import start_single_process_world
from ..hparams import ParsedRun, parse_run
from ..models.loader import resolve_model_path
from .checkpoints import guard_output_dir, resolve_resume


def prepare_training_run(kind: str, argv: Sequence[str] | None, description: str | None) -> tuple[ParsedRun, str | None]:
    """(the parsed run, the checkpoint to resume from or None)."""
    args = parse_run(kind, argv, description)
    if args.finetuning.disable_dropout is None:  # auto: the RL stages compare forwards, so no dropout noise there
        args.finetuning.disable_dropout = kind == "ppo"
    resolve_model_path(args.model)
    guard_output_dir(args)
    resume = resolve_resume(args.training)
    start_single_process_world(args.training)
    return args, resume


def train_save_evaluate(trainer: Any, resume: str | None) -> None:
    """Train (continuing `resume`, if any), save the result, evaluate it once more when there is evaluation
    data, whatever --eval_strategy (its metrics printed, in eval_results.json and in the log history), and
    save the trainer's state. The evaluations during training follow hparams.resolve_eval_schedule."""
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model()
    if trainer.eval_dataset is not None:
        metrics = trainer.evaluate()
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    trainer.save_state()
