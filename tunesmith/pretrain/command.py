"""Continued pre-training (full, LoRA, QLoRA) of a causal LM on raw text: .txt files or rows with a text column,
no chat template, every token trained. Teaches a model a domain or a language before SFT. With --eval_data_path or
--val_size, held-out loss and perplexity at every checkpoint and at the end.

    tunesmith pt configs/pt_lora_demo.yaml
    tunesmith pt --data_path corpus.txt --document_separator blank_line --output_dir outputs/pt --max_seq_length 1024
    tunesmith pt --data_path wiki.jsonl,code.parquet --data_weights 0.8,0.2 --text_column text --val_size 0.05
    tunesmith pt --data_path corpus.jsonl --lora_modules_to_save embed_tokens,lm_head   # a new language
    tunesmith pt --data_path corpus.jsonl --lora_trainable_tokens "é,è,à,ç"   # only those rows of embeddings and head
    torchrun --nproc_per_node 2 pt/train.py configs/pt_lora_demo.yaml --deepspeed configs/ds_zero3.json
    accelerate launch --config_file configs/fsdp2.yaml pt/train.py configs/pt_lora_demo.yaml

Documents longer than --max_seq_length are cut into pieces (--stride overlaps them); a batch's pieces are packed into
one row in which each attends within itself only (the loss each would have alone), or with
--cross_document_attention one causal sequence. `tunesmith inspect --data_path corpus.txt` shows the pieces.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import set_seed

from ..boundary import entry_point
from ..data.dataset import build_datasets
from ..models.loader import load_model, load_tokenizer
from ..models.qat import prepare_qat
from ..train.run_setup import prepare_training_run, train_save_evaluate, trainer_options
from ..train.stage_trainer import StageTrainer
from .collator import pretrain_collator
from .documents import text_kind


def run(argv: Sequence[str] | None = None) -> StageTrainer:
    args, resume = prepare_training_run("pt", argv, __doc__)

    tokenizer = load_tokenizer(args.model)
    with args.training.main_process_first(desc="tokenize"):  # read, cut into pieces, cached (data/dataset.py)
        train_dataset, eval_dataset = build_datasets(text_kind(args.data), tokenizer, args.data, args.training.seed,
                                                     report_dir=args.training.output_dir)
    set_seed(args.training.seed)  # before the model: LoRA's initial weights are random too
    model = prepare_qat(load_model(args.model, args.finetuning, args.training), args.qat.qat, args.qat.qat_group_size)

    trainer = StageTrainer(
        model=model,
        args=args.training,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=pretrain_collator(model, tokenizer, args.data, args.training),
        **trainer_options(args),  # the loss plot, the run configs, LoRA's learning rates
        router_aux_loss_coef=args.finetuning.router_aux_loss_coef,
    )
    train_save_evaluate(trainer, resume)
    return trainer


main = entry_point(run)

if __name__ == "__main__":
    main()
