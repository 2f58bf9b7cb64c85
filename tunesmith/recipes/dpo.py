"""DPO on preference pairs: teach the policy (usually an SFT adapter, continued) to prefer the chosen
reply over the rejected one. The reference is the model without its adapter (sigmoid, ipo), or there
is none (simpo, orpo); held-out implicit-reward accuracy and margin at the end.

    python dpo/train.py configs/dpo_lora_demo.yaml
    python dpo/train.py --adapter_name_or_path outputs/sft_demo --data_path data/demo/preference.jsonl \
        --eval_data_path data/demo/preference_eval.jsonl --output_dir outputs/dpo [--loss_type simpo --beta 2.0]
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import set_seed

from ..boundary import entry_point
from ..data.collator import PreferenceCollator
from ..data.preference import build_preference_datasets
from ..models.loader import load_model, load_tokenizer
from ..train.callbacks import LossPlotCallback
from ..train.dpo_trainer import DPOTrainer, add_reference_adapter
from ..train.run_setup import prepare_training_run, train_save_evaluate


def build_trainer(argv: Sequence[str] | None = None) -> tuple[DPOTrainer, str | None]:
    """Everything up to training: parse, check, tokenize the pairs, load the policy; and the
    checkpoint to resume from."""
    args, resume = prepare_training_run("dpo", argv, __doc__)

    tokenizer = load_tokenizer(args.model)
    with args.training.main_process_first(desc="tokenize"):
        train_dataset, eval_dataset = build_preference_datasets(tokenizer, args.data, args.training.seed,
                                                                report_dir=args.training.output_dir)
    set_seed(args.training.seed)  # a new adapter is drawn at random: make it the same every run
    model = load_model(args.model, args.finetuning, args.training)
    if args.model.adapter_name_or_path and args.dpo.needs_reference:
        # Continuing an adapter (the SFT one): it, frozen, is the reference, not the bare base.
        add_reference_adapter(model, args.model.adapter_name_or_path)

    trainer = DPOTrainer(
        model=model,
        args=args.training,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=PreferenceCollator(tokenizer.pad_token_id),
        callbacks=[LossPlotCallback()] if args.finetuning.plot_loss else [],
        run_configs=args.configs,
        dpo_args=args.dpo,
    )
    return trainer, resume


def run(argv: Sequence[str] | None = None) -> DPOTrainer:
    trainer, resume = build_trainer(argv)
    train_save_evaluate(trainer, resume)
    return trainer


main = entry_point(run)
