"""Knowledge distillation: train a student (the run's model, full or LoRA/QLoRA) to match a frozen teacher's
next-token distributions over the replies of SFT data, by forward KL, reverse KL or GKD's generalized JSD, optionally
plus the SFT loss. The data is SFT's: rendered, masked (only the replies train) and packed as `tunesmith sft` does.

    tunesmith distill --teacher_model_name_or_path outputs/sft_demo --data_path data/demo/sft.jsonl --output_dir outputs/distill_demo
    tunesmith distill configs/distill_demo.yaml --distill_loss jsd --beta 0.5 --distill_temperature 2.0 --sft_weight 0.5
    torchrun --nproc_per_node 2 distill/train.py configs/distill_demo.yaml --deepspeed configs/ds_zero2.json
    torchrun --nproc_per_node 2 distill/train.py configs/distill_demo.yaml --deepspeed configs/ds_zero3.json

Read top to bottom: parse (SFT's flags and the distillation's) -> the student's tokenizer and data -> the student
-> the teacher (eval mode, no gradients) -> train -> save. What it leaves out, for now:
1. on-policy steps sample the student's replies one batch at a time, in the training process (TRL can hand them to
   vLLM); a sampled reply replaces an example's last reply only;
2. offline KD (teacher logits precomputed to disk, as axolotl's kd plugin): the teacher runs per forward, see
   distill/trainer.py for why;
3. vision-language models, prompt-based adapters, FSDP, sequence parallelism and a quantized teacher under ZeRO-3:
   refused in one line (distill/rules.py). Under ZeRO-3 the teacher is sharded too, in an inference engine of its
   own (distill/trainer.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import set_seed

from ..boundary import entry_point
from ..data.dataset import build_sft_datasets
from ..hparams import FinetuningArguments, ModelArguments, check
from ..models.attention import use_varlen_attention
from ..models.loader import load_model, load_tokenizer
from ..train.run_setup import prepare_training_run, train_save_evaluate, trainer_options
from ..train.stage_trainer import sft_collator
from .args import DistillArguments
from .rules import RULES
from .trainer import DistillTrainer


def run(argv: Sequence[str] | None = None) -> DistillTrainer:
    args, resume = prepare_training_run("distill", argv, __doc__)
    # the rows about the teacher again, now that the student's folder is known (the default model's is only
    # known once prepare_training_run has found it)
    check(feature_rules=RULES, model=args.model, distill=args.distill)

    tokenizer = load_tokenizer(args.model)
    with args.training.main_process_first(desc="tokenize"):
        train_dataset, eval_dataset = build_sft_datasets(tokenizer, args.data, args.training.seed,
                                                         report_dir=args.training.output_dir)
    set_seed(args.training.seed)  # before the student: LoRA's initial weights are random too
    student = load_model(args.model, args.finetuning, args.training)
    teacher = load_teacher(args.distill, args.model, args.training)

    collator = sft_collator(student, tokenizer, args.data, args.training)
    if args.data.packing:  # the teacher attends within each conversation of the packed row, as the student does
        use_varlen_attention(teacher)
    trainer = DistillTrainer(
        model=student,
        teacher=teacher,
        distill=args.distill,
        rollout=args.rollout,
        args=args.training,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=collator,
        **trainer_options(args),  # the loss plot, the run configs, LoRA's learning rates
    )
    train_save_evaluate(trainer, resume)
    return trainer


def load_teacher(distill: DistillArguments, student: ModelArguments, training: object) -> torch.nn.Module:
    """The teacher in eval mode with no trainable weights: its folder (or base + adapter), in --teacher_dtype (auto:
    as the student's base, bfloat16 under --bf16), quantized with --teacher_quantization_bit."""
    model_args = ModelArguments(
        model_name_or_path=distill.teacher_model_name_or_path,
        adapter_name_or_path=distill.teacher_adapter_name_or_path,
        trust_remote_code=student.trust_remote_code,
        dtype=student.dtype if distill.teacher_dtype == "auto" else distill.teacher_dtype,
        attn_implementation=student.attn_implementation,
        quantization_bit=distill.teacher_quantization_bit,
    )
    finetuning = FinetuningArguments(finetuning_type="lora" if model_args.adapter_name_or_path else "full")
    return load_model(model_args, finetuning, training, is_trainable=False)


main = entry_point(run)
