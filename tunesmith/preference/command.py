"""DPO on preference pairs: teach the policy (usually an SFT adapter, continued) to prefer the chosen
reply over the rejected one. The reference (sigmoid, ipo) is the model the run starts from: the adapter
it continues, the base without its adapter, or with --finetuning_type full a frozen copy, each scored
in every step or once before training (--precompute_ref_logps); simpo and orpo have none. With
--eval_data_path or --val_size, held-out implicit-reward eval_accuracy and eval_margin at every checkpoint
and at the end. --loss_type kto (KTO, arXiv 2402.01306) trains on single replies labelled desirable or
undesirable (`label` true/false; a pair gives one of each) against the reference in every step, and reports
the same eval_accuracy on the held-out pairs of --eval_data_path.

    tunesmith dpo configs/dpo_lora_demo.yaml
    tunesmith dpo --adapter_name_or_path outputs/sft_demo --data_path data/demo/preference.jsonl \\
        --eval_data_path data/demo/preference_eval.jsonl --output_dir outputs/dpo [--loss_type simpo --beta 2.0]
    tunesmith dpo configs/dpo_lora_demo.yaml --loss_type kto --output_dir outputs/kto_demo   # pairs, split

A vision-language model (docs/vision.md) trains on pairs whose context shows pictures (any loss but kto).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from transformers import set_seed

from ..boundary import entry_point
from ..data.collator import KTOPackingCollator, PreferencePackingCollator
from ..data.image_encoding import ImagePairCollator
from ..data.preference import build_preference_datasets
from ..data.template import processor_of
from ..data.unpaired import build_kto_datasets
from ..models.attention import use_varlen_attention
from ..models.loader import load_model, load_tokenizer
from ..train.run_setup import prepare_training_run, train_save_evaluate, trainer_options
from .dpo_trainer import DPOTrainer, add_reference_adapter
from .kto_trainer import KTOTrainer


def build_trainer(argv: Sequence[str] | None = None) -> tuple[DPOTrainer, str | None]:
    """Everything up to training: parse, check, tokenize the pairs, load the policy; and the
    checkpoint to resume from."""
    args, resume = prepare_training_run("dpo", argv, __doc__)

    kto = args.dpo.loss_type == "kto"
    tokenizer = load_tokenizer(args.model)
    with args.training.main_process_first(desc="tokenize"):
        if kto:  # single judged replies; evaluation on held-out pairs
            train_dataset, eval_dataset = build_kto_datasets(tokenizer, args.data, args.dpo, args.training.seed,
                                                             report_dir=args.training.output_dir)
        else:
            train_dataset, eval_dataset = build_preference_datasets(tokenizer, args.data, args.training.seed,
                                                                    report_dir=args.training.output_dir)
    set_seed(args.training.seed)  # a new adapter is drawn at random: make it the same every run
    model = load_model(args.model, args.finetuning, args.training)
    processor = processor_of(tokenizer)  # a vision-language model's: padded rows with their pictures
    if processor is None:
        use_varlen_attention(model)  # the pairs of a batch go through the model as one padding-free row
    reference_model = None
    if args.model.adapter_name_or_path and args.dpo.needs_reference:
        # Continuing an adapter (the SFT one): it, frozen, is the reference, not the bare base.
        add_reference_adapter(model, args.model.adapter_name_or_path)
    elif args.finetuning.finetuning_type == "full" and args.dpo.needs_reference and not args.dpo.precompute_ref_logps:
        reference_model = copy.deepcopy(model)

    trainer = (KTOTrainer if kto else DPOTrainer)(
        model=model,
        args=args.training,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processor or tokenizer,  # a vision-language model's processor is saved whole
        data_collator=pair_collator(processor, args.data, kto),
        **trainer_options(args),  # the loss plot, the run configs, LoRA's learning rates
        dpo_args=args.dpo,
        reference_model=reference_model,
    )
    return trainer, resume


def pair_collator(processor: Any, data_args: Any, kto: bool) -> Callable:
    """Pairs (or KTO's judged replies) packed in one padding-free row; a vision-language model's pairs as padded
    rows through its processor (the rules refuse KTO there)."""
    if processor is not None:
        return ImagePairCollator(processor, data_args.max_image_pixels)
    return KTOPackingCollator() if kto else PreferencePackingCollator()


def run(argv: Sequence[str] | None = None) -> DPOTrainer:
    trainer, resume = build_trainer(argv)
    train_save_evaluate(trainer, resume)
    return trainer


main = entry_point(run)
