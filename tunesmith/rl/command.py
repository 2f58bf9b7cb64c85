"""RL on prompts: PPO against a reward model, or GRPO / RLOO (`--advantage grpo|rloo`, no value model) against
a reward model and/or verifiable reward functions; the policy (LoRA on the SFT model by default) is held near
the reference by a KL term.

    tunesmith ppo configs/ppo_lora_demo.yaml
    tunesmith ppo --adapter_name_or_path outputs/sft_demo --reward_model outputs/rm_demo \\
        --data_path data/demo/prompts.jsonl --output_dir outputs/ppo_demo --max_steps 30
    tunesmith eval --baseline outputs/sft_demo --policy outputs/ppo_demo --reward_model outputs/rm_demo
    tunesmith ppo configs/grpo_demo.yaml     # GRPO: answers with `Answer: N`, rewarded by exact_answer
    tunesmith eval --policy outputs/grpo_demo --data_path data/demo/grpo_eval.jsonl \\
        --reward_funcs exact_answer answer_format --max_new_tokens 32
    tunesmith ppo configs/grpo_tools_demo.yaml   # GRPO whose rollouts call a calculator (--tool_funcs)
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import set_seed

from ..boundary import entry_point
from ..constants import MUON
from ..data.dataset import build_ptx_dataset
from ..data.prompts import build_prompts
from ..models.loader import (
    inference_model_args,
    load_for_inference,
    load_trained_tokenizer,
)
from ..train.muon import mark_muon_weights
from ..train.run_setup import prepare_training_run
from . import PPOTrainer, RewardModelScorer, build_actor_critic, critic_start
from .reward_sources import load_reward_function
from .tool_rollout import encode_tool_prompts
from .toolbox import Toolbox


def run(argv: Sequence[str] | None = None) -> PPOTrainer:
    args, resume = prepare_training_run("ppo", argv, __doc__)
    reward_funcs = [load_reward_function(spec) for spec in args.ppo.reward_funcs]  # a bad name fails before loading
    tools = args.tool_use
    toolbox = Toolbox.from_specs(tools.tool_funcs, tools.tool_timeout) if tools.enabled else None  # likewise

    tokenizer = load_trained_tokenizer(args.model)
    with args.training.main_process_first(desc="tokenize"):  # one process fills the cache, the others read it
        prompts = build_prompts(tokenizer, args.data, "train", args.training.seed)
        if toolbox is not None:  # rendered with the functions listed, as the policy will see them
            prompts = encode_tool_prompts(tokenizer, prompts, toolbox, args.data.max_prompt_length)
        ptx = build_ptx_dataset(tokenizer, args.ppo, args.data) if args.ppo.ptx_data_path else None
    set_seed(args.training.seed)  # a new policy (and value) adapter is drawn at random: make it the same every run
    model = build_actor_critic(args.model, args.finetuning, args.training, args.ppo.temperature, resume_from=resume,
                               value_model=args.ppo.uses_value_model,
                               critic=critic_start(args.ppo, args.model, args.finetuning))
    if str(args.training.optim) == MUON:  # the RL loop builds its optimizer without the model (train/muon.py)
        mark_muon_weights(model)
    scorer = None
    if args.ppo.reward_model:
        reward_model, reward_tokenizer = load_for_inference(inference_model_args(args.ppo.reward_model), task="reward")
        scorer = RewardModelScorer(reward_model, reward_tokenizer, tokenizer,
                                   batch_size=args.training.per_device_eval_batch_size)

    trainer = PPOTrainer(
        model, tokenizer, prompts, args.ppo, args.training,
        reward_model=scorer, reward_funcs=reward_funcs,
        run_configs=args.configs,
        resume_from=resume,
        lora_learning_rate=args.finetuning.lora_learning_rate,
        ptx_dataset=ptx,
        toolbox=toolbox, tool_use=tools, rollout=args.rollout,
    )
    trainer.train()
    return trainer


main = entry_point(run)
