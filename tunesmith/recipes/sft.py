"""Supervised fine-tuning recipe: parse -> check -> load -> data -> train -> save.

    python sft/train.py configs/sft_lora_demo.yaml
    python sft/train.py --data_path data/demo/sft.jsonl --output_dir outputs/sft [--quantization_bit 4]
    torchrun --nproc_per_node 2 sft/train.py --deepspeed configs/ds_zero3.json --data_path ...
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import set_seed

from ..checks import check_compatibility
from ..config import parse_args
from ..data.dataset import build_sft_datasets
from ..data.packing import sft_collator
from ..distributed import start_single_process_world
from ..hparams import DataArguments, FinetuningArguments, ModelArguments, TrainingArguments
from ..models.loader import load_model, load_tokenizer
from ..train.callbacks import LossPlotCallback
from ..train.checkpoints import resolve_resume
from ..train.sft_trainer import LoraTrainer
from ..utils.logging import setup_logging


def main(argv: Sequence[str] | None = None) -> LoraTrainer:
    setup_logging()
    model_args, data_args, finetuning_args, training_args = parse_args(
        (ModelArguments, DataArguments, FinetuningArguments, TrainingArguments), argv
    )
    check_compatibility(model=model_args, data=data_args, finetuning=finetuning_args, training=training_args)
    start_single_process_world(training_args)

    tokenizer = load_tokenizer(model_args)
    with training_args.main_process_first(desc="tokenize"):
        train_dataset, eval_dataset = build_sft_datasets(tokenizer, data_args, training_args.seed)
    set_seed(training_args.seed)  # before the model: LoRA's initial weights are random too
    model = load_model(model_args, finetuning_args, training_args)

    trainer = LoraTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=sft_collator(model, tokenizer, data_args, training_args),
        callbacks=[LossPlotCallback()] if finetuning_args.plot_loss else [],
        run_configs=(model_args, data_args, finetuning_args, training_args),
    )
    trainer.train(resume_from_checkpoint=resolve_resume(training_args.resume_from_checkpoint, training_args.output_dir))
    trainer.save_model()
    trainer.save_state()
    return trainer
