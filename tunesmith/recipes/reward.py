"""Reward-model recipe: parse -> check -> load -> preference data -> train -> save -> evaluate.

    python reward/train.py configs/reward_lora_demo.yaml
    python reward/train.py --data_path data/demo/preference.jsonl --eval_data_path data/demo/preference_eval.jsonl \
        --output_dir outputs/rm [--finetuning_type full] [--center_rewards_coefficient 0.01]
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import set_seed
from trl.trainer.reward_trainer import DataCollatorForPreference

from ..checks import check_compatibility
from ..config import parse_args
from ..data.preference import PreferenceDataArguments, build_preference_datasets
from ..distributed import start_single_process_world
from ..hparams import FinetuningArguments, ModelArguments, TrainingArguments
from ..models.loader import load_model, load_tokenizer
from ..train.callbacks import LossPlotCallback
from ..train.checkpoints import resolve_resume
from ..train.reward_trainer import RewardArguments, RewardTrainer
from ..utils.logging import setup_logging

ARGUMENT_TYPES = (ModelArguments, PreferenceDataArguments, RewardArguments, FinetuningArguments, TrainingArguments)


def build_trainer(argv: Sequence[str] | None = None) -> RewardTrainer:
    """Everything up to training: parse, check, tokenize the pairs, load the model with its new head."""
    model_args, data_args, reward_args, finetuning_args, training_args = parse_args(ARGUMENT_TYPES, argv)
    check_compatibility(model=model_args, data=data_args, finetuning=finetuning_args, training=training_args)
    start_single_process_world(training_args)

    tokenizer = load_tokenizer(model_args)
    with training_args.main_process_first(desc="tokenize"):
        train_dataset, eval_dataset = build_preference_datasets(tokenizer, data_args, training_args.seed)
    set_seed(training_args.seed)  # the new score head is drawn at random: make it the same every run
    model = load_model(model_args, finetuning_args, training_args, task="reward")

    return RewardTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=DataCollatorForPreference(tokenizer.pad_token_id),
        callbacks=[LossPlotCallback()] if finetuning_args.plot_loss else [],
        run_configs=(model_args, data_args, reward_args, finetuning_args, training_args),
        center_rewards_coefficient=reward_args.center_rewards_coefficient,
    )


def main(argv: Sequence[str] | None = None) -> RewardTrainer:
    setup_logging()
    trainer = build_trainer(argv)
    args = trainer.args
    trainer.train(resume_from_checkpoint=resolve_resume(args.resume_from_checkpoint, args.output_dir))
    trainer.save_model()
    trainer.save_state()
    if trainer.eval_dataset is not None:
        metrics = trainer.evaluate()
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    return trainer
