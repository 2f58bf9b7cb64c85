"""Reward-model training on preference pairs: a one-output score head on the model, trained so the
chosen reply outscores the rejected one. With --eval_data_path or --val_size, held-out eval_accuracy and
eval_margin at every checkpoint and at the end.

    tunesmith reward configs/reward_lora_demo.yaml
    tunesmith reward --data_path data/demo/preference.jsonl --eval_data_path data/demo/preference_eval.jsonl \\
        --output_dir outputs/rm [--finetuning_type full] [--center_rewards_coefficient 0.01]

A vision-language model of a type with a sequence-classification class (Gemma 3) trains on pairs with pictures.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import set_seed
from trl.trainer.reward_trainer import DataCollatorForPreference

from ..boundary import entry_point
from ..data.image_encoding import ImagePairCollator
from ..data.preference import build_preference_datasets
from ..data.template import processor_of
from ..models.loader import load_model, load_tokenizer
from ..train.run_setup import prepare_training_run, train_save_evaluate, trainer_options
from .reward_trainer import RewardTrainer


def build_trainer(argv: Sequence[str] | None = None) -> tuple[RewardTrainer, str | None]:
    """Everything up to training: parse, check, tokenize the pairs, load the model with its new head;
    and the checkpoint to resume from."""
    args, resume = prepare_training_run("reward", argv, __doc__)

    tokenizer = load_tokenizer(args.model)
    with args.training.main_process_first(desc="tokenize"):
        train_dataset, eval_dataset = build_preference_datasets(tokenizer, args.data, args.training.seed,
                                                                report_dir=args.training.output_dir)
    set_seed(args.training.seed)  # the new score head is drawn at random: make it the same every run
    model = load_model(args.model, args.finetuning, args.training, task="reward")
    processor = processor_of(tokenizer)  # a vision-language model's (Gemma 3's): pairs with their pictures

    trainer = RewardTrainer(
        model=model,
        args=args.training,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processor or tokenizer,  # a vision-language model's processor is saved whole
        data_collator=ImagePairCollator(processor, args.data.max_image_pixels) if processor is not None
        else DataCollatorForPreference(tokenizer.pad_token_id),
        **trainer_options(args),  # the loss plot, the run configs, LoRA's learning rates
        center_rewards_coefficient=args.reward.center_rewards_coefficient,
    )
    return trainer, resume


def run(argv: Sequence[str] | None = None) -> RewardTrainer:
    trainer, resume = build_trainer(argv)
    train_save_evaluate(trainer, resume)
    return trainer


main = entry_point(run)
