"""Supervised fine-tuning (full, LoRA, QLoRA, or PEFT's prompt tuning, p-tuning and prefix tuning) of a
causal LM on multi-turn conversations: only the replies are trained (see `tunesmith inspect`). With
--eval_data_path or --val_size, held-out loss and perplexity at every checkpoint and at the end.

    tunesmith sft configs/sft_lora_demo.yaml
    tunesmith sft --data_path data/demo/sft.jsonl --output_dir outputs/sft [--quantization_bit 4]
    tunesmith sft --data_path data/demo/sft.jsonl --output_dir outputs/sft_pt --finetuning_type prompt_tuning
    torchrun --nproc_per_node 2 sft/train.py configs/sft_lora_demo.yaml --deepspeed configs/ds_zero3.json
    accelerate launch --config_file configs/fsdp2.yaml sft/train.py configs/sft_lora_demo.yaml
"""

from __future__ import annotations

from collections.abc import Sequence

from ..boundary import entry_point
from ..data.dataset import build_sft_datasets
from ..data.streaming import streamed_sft_datasets
from ..data.template import processor_of
from ..models.loader import load_tokenizer
from ..train.run_setup import prepare_training_run, train_causal_lm
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
    return train_causal_lm(args, resume, train_dataset, eval_dataset,
                           processor_of(tokenizer) or tokenizer,  # a vision-language model's processor is saved whole
                           lambda model: sft_collator(model, tokenizer, args.data, args.training))


main = entry_point(run)
