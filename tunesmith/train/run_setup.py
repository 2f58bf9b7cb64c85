"""What every training stage does before it loads anything: parse and check its flags, pin the default
model to its path (which the saved run config records), refuse an output_dir that holds a different
run, find (and announce) the checkpoint to resume from, and describe the process group; and what the
Trainer stages do at the end: train, save, evaluate."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from transformers import set_seed

from ..distributed import start_single_process_world
from ..hparams import ParsedRun, parse_run
from ..models.loader import load_model, resolve_model_path
from ..models.lora_variants import save_as_plain_lora
from ..models.qat import prepare_qat, qat_scheme, save_quantized
from .callbacks import LossPlotCallback
from .checkpoints import guard_output_dir, resolve_resume, stop_when_a_checkpoint_fills_the_disk
from .finished_run import stop_if_finished
from .lifecycle import save_final
from .stage_trainer import StageTrainer


def prepare_training_run(kind: str, argv: Sequence[str] | None, description: str | None) -> tuple[ParsedRun, str | None]:
    """(the parsed run, the checkpoint to resume from or None)."""
    args = parse_run(kind, argv, description)
    if args.finetuning.disable_dropout is None:  # auto: the RL stages compare forwards, so no dropout noise there
        args.finetuning.disable_dropout = kind == "ppo"
    resolve_model_path(args.model)
    guard_output_dir(args)
    resume = resolve_resume(args.training)
    stop_if_finished(args.training, resume)  # a rerun of a finished run leaves its outputs alone
    start_single_process_world(args.training)
    return args, resume


def trainer_options(args: ParsedRun) -> dict[str, Any]:
    """The keyword arguments every Trainer stage (train/stage_trainer.StageTrainer and its subclasses) takes from the
    parsed run as they are: the loss plot's callback, the run configs saved beside each save, and the learning rates
    of LoRA's matrices (--lora_learning_rate, --loraplus_lr_ratio)."""
    return {"callbacks": [LossPlotCallback()] if args.finetuning.plot_loss else [], "run_configs": args.configs,
            "lora_learning_rate": args.finetuning.lora_learning_rate,
            "loraplus_lr_ratio": args.finetuning.loraplus_lr_ratio}


def train_causal_lm(args: ParsedRun, resume: str | None, train_dataset: Any, eval_dataset: Any,
                    processing_class: Any, collator: Callable[[Any], Any]) -> StageTrainer:
    """The end of the language-model stages (sft, pt): the model loaded, a StageTrainer over the datasets with
    `collator(model)` (a collator depends on the model: padding-free attention, a vision tower), then
    train_save_evaluate."""
    set_seed(args.training.seed)  # before the model: LoRA's initial weights are random too
    model = prepare_qat(load_model(args.model, args.finetuning, args.training), args.qat.qat, args.qat.qat_group_size)
    trainer = StageTrainer(
        model=model,
        args=args.training,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processing_class,
        data_collator=collator(model),
        **trainer_options(args),  # the loss plot, the run configs, LoRA's learning rates
        router_aux_loss_coef=args.finetuning.router_aux_loss_coef,
    )
    train_save_evaluate(trainer, resume)
    return trainer


def train_save_evaluate(trainer: Any, resume: str | None) -> None:
    """Train (continuing `resume`, if any), save the result, evaluate it once more when there is evaluation
    data, whatever --eval_strategy (its metrics printed, in eval_results.json and in the log history), and
    save the trainer's state. The evaluations during training follow hparams.resolve_eval_schedule."""
    with stop_when_a_checkpoint_fills_the_disk(trainer.args.output_dir, lambda: trainer.state.global_step):
        trainer.train(resume_from_checkpoint=resume)
    save_final_model(trainer)
    if trainer.eval_dataset is not None:
        metrics = trainer.evaluate()
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    trainer.save_state()


def save_final_model(trainer: Any) -> None:
    """trainer.save_model, published as every stage's final save is (train/lifecycle.save_final: staged, then
    moved into place file by file; a full disk is one line and leaves the previous finished model whole)."""

    def write(staging: Path) -> None:
        trainer.save_model(str(staging))
        model = trainer.accelerator.unwrap_model(trainer.model)
        if trainer.args.should_save:  # a PiSSA/OLoRA adapter as a plain LoRA of the unchanged base
            save_as_plain_lora(model, str(staging))
        if trainer.args.should_save and qat_scheme(model):  # --qat: torchao's convert, the model to serve
            save_quantized(model, staging, trainer.processing_class)

    save_final(trainer.args.output_dir, write, trainer.accelerator, trainer.args.should_save)
