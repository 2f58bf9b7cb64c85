"""PPO RLHF: a readable PPOTrainer on accelerate (TRL has none any more), built on tunesmith.ppo_core.

args: PPOArguments and their checks; models: policy / value / reference behind one module (one
base model with LoRA); rollout: generation, reward scoring, per-token statistics; trainer: the loop,
logging and checkpoints."""

from .args import PPOArguments, check_ppo_args
from .models import ActorCritic, build_actor_critic
from .rollout import RewardFn, RewardModelScorer, Rollout
from .trainer import PPOTrainer

__all__ = [
    "PPOArguments",
    "check_ppo_args",
    "ActorCritic",
    "build_actor_critic",
    "RewardFn",
    "RewardModelScorer",
    "Rollout",
    "PPOTrainer",
]
