"""PPO RLHF recipe: parse -> check -> load policy/value/reference and the reward model -> prompts
-> train -> save.

    python ppo/train.py configs/ppo_lora_demo.yaml
    python ppo/train.py --adapter_name_or_path outputs/sft_demo --reward_model outputs/rm_demo \
        --data_path data/demo/prompts.jsonl --output_dir outputs/ppo_demo --max_steps 30
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..checks import check_compatibility
from ..config import parse_args
from ..data.prompts import encode_prompts, load_prompts
from ..distributed import start_single_process_world
from ..hparams import FinetuningArguments, ModelArguments, TrainingArguments
from ..models.loader import inference_model_args, load_for_inference, load_tokenizer
from ..ppo import PPOArguments, PPOTrainer, RewardModelScorer, build_actor_critic, check_ppo_args
from ..train.checkpoints import resolve_resume
from ..utils.logging import setup_logging


def policy_tokenizer(model_args: ModelArguments):
    """The SFT adapter's tokenizer when it saved one (it carries the chat template SFT trained
    with), else the base model's."""
    adapter = model_args.adapter_name_or_path
    if adapter and os.path.isfile(os.path.join(adapter, "tokenizer_config.json")):
        return load_tokenizer(ModelArguments(model_name_or_path=adapter, trust_remote_code=model_args.trust_remote_code,
                                             chat_template=model_args.chat_template))
    return load_tokenizer(model_args)


ARGUMENT_TYPES = (ModelArguments, FinetuningArguments, PPOArguments, TrainingArguments)


def main(argv: Sequence[str] | None = None) -> PPOTrainer:
    setup_logging()
    model_args, finetuning_args, ppo_args, training_args = parse_args(ARGUMENT_TYPES, argv)
    check_compatibility(model=model_args, finetuning=finetuning_args, training=training_args)
    start_single_process_world(training_args)
    check_ppo_args(ppo_args, finetuning_args, training_args)

    tokenizer = policy_tokenizer(model_args)
    prompts = encode_prompts(tokenizer, load_prompts(ppo_args.data_path, ppo_args.max_samples),
                             ppo_args.max_prompt_length)
    resume = resolve_resume(training_args.resume_from_checkpoint, training_args.output_dir)
    model = build_actor_critic(model_args, finetuning_args, training_args, ppo_args.temperature, resume_from=resume)
    reward_model, reward_tokenizer = load_for_inference(inference_model_args(ppo_args.reward_model), task="reward")

    trainer = PPOTrainer(
        model, tokenizer, prompts, ppo_args, training_args,
        reward_model=RewardModelScorer(reward_model, reward_tokenizer, tokenizer,
                                       batch_size=training_args.per_device_eval_batch_size),
        run_configs=(model_args, finetuning_args, ppo_args, training_args),
        resume_from=resume,
    )
    trainer.train()
    return trainer
