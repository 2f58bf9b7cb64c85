"""The RL stage: a readable PPOTrainer on accelerate (TRL has no PPO any more) for PPO, GRPO and RLOO, built on
ppo/core.py (the maths).

core: pure tensor maths; models: policy / value / reference behind one module (one base model with
LoRA; no value model for GRPO and RLOO); rollout: generation, reward-model scoring, per-token statistics;
rewards: reward models and reward functions combined; reward_funcs: the shipped verifiable rewards;
trainer: the loop, logging and checkpoints."""

from .models import ActorCritic, build_actor_critic, critic_start
from .rewards import RewardFunction, Rewards, load_reward_function
from .rollout import RewardFn, RewardModelScorer, Rollout
from .trainer import PPOTrainer

__all__ = [
    "ActorCritic",
    "build_actor_critic",
    "critic_start",
    "RewardFn",
    "RewardModelScorer",
    "RewardFunction",
    "Rewards",
    "load_reward_function",
    "Rollout",
    "PPOTrainer",
]
