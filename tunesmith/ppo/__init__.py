"""PPO RLHF: a readable PPOTrainer on accelerate (TRL has none any more), built on ppo/core.py (the maths).

core: pure tensor maths; models: policy / value / reference behind one module (one
base model with LoRA); rollout: generation, reward scoring, per-token statistics; trainer: the loop,
logging and checkpoints."""

from .models import ActorCritic, build_actor_critic
from .rollout import RewardFn, RewardModelScorer, Rollout
from .trainer import PPOTrainer

__all__ = [
    "ActorCritic",
    "build_actor_critic",
    "RewardFn",
    "RewardModelScorer",
    "Rollout",
    "PPOTrainer",
]
