"""Supervised fine-tuning (full, LoRA, QLoRA, or PEFT's prompt tuning, p-tuning and prefix tuning) of a
causal LM on multi-turn conversations: only the replies are trained (see `tunesmith inspect`). With
--eval_data_path or --val_size, held-out loss and perplexity at every checkpoint and at the end.

    python sft/train.py configs/sft_lora_demo.yaml
    python sft/train.py --data_path data/demo/sft.jsonl --output_dir outputs/sft [--quantization_bit 4]
    python sft/train.py --data_path data/demo/sft.jsonl --output_dir outputs/sft_pt --finetuning_type prompt_tuning
    torchrun --nproc_per_node 2 sft/train.py configs/sft_lora_demo.yaml --deepspeed configs/ds_zero3.json
    accelerate launch --config_file configs/fsdp2.yaml sft/train.py configs/sft_lora_demo.yaml
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import set_seed

from ..boundary import entry_point
from ..data.dataset import build_sft_datasets
from ..data.streaming import streamed_sft_datasets
from ..data.template import processor_of
from ..models.loader import load_model, load_tokenizer
from ..models.qat import prepare_qat
from ..train.run_setup import prepare_training_run, train_save_evaluate, trainer_options
from ..train.stage_trainer import StageTrainer, sft_collator


def run(argv: Sequence[str] | None = None) -> StageTrainer:
    args, resume = prepare_training_run("sft", argv, __doc__)

    tokenizer = load_tokenizer(args.model)
    with args.training.main_process_first(desc="tokenize"):
        if args.data.streaming:  # read, rendered and masked as training takes them (data/streaming.py)
            train_dataset, eval_dataset = streamed_sft_datasets(
                tokenizer, args.data, args.training.seed, args.training.process_index, args.training.world_size,
                report_dir=args.training.output_dir)
        else:
            train_dataset, eval_dataset = build_sft_datasets(tokenizer, args.data, args.training.seed,
                                                             report_dir=args.training.output_dir)
    set_seed(args.training.seed)  # before the model: LoRA's initial weights are random too
    model = prepare_qat(load_model(args.model, args.finetuning, args.training), args.qat.qat, args.qat.qat_group_size)

    trainer = StageTrainer(
        model=model,
        args=args.training,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processor_of(tokenizer) or tokenizer,  # a vision-language model's processor is saved whole
        data_collator=sft_collator(model, tokenizer, args.data, args.training),
        **trainer_options(args),  # the loss plot, the run configs, LoRA's learning rates
        router_aux_loss_coef=args.finetuning.router_aux_loss_coef,
    )
    train_save_evaluate(trainer, resume)
    return trainer


main = entry_point(run)
