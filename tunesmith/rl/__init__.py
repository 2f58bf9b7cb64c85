"""The RL feature (`tunesmith ppo`: PPO, GRPO and RLOO, `--advantage gae|grpo|rloo`; and the policy evaluation,
`tunesmith eval --policy`): a readable PPOTrainer on accelerate (TRL has no PPO any more).

args: PPOArguments, the command's dataclasses; rules: its refusals; losses/: the maths, pure tensors, one module
per loss or estimate; models: policy / value / reference behind one module (one base model with LoRA; no value
model for GRPO and RLOO); shared_prompts: one forward of a prompt shared by its replies; rollout: generation,
reward-model scoring, per-token statistics; toolbox, tool_rollout, tool_funcs: functions the policy calls in
its rollouts; reward_sources: reward models and reward functions combined (the shipped functions are the core's,
data/reward_funcs.py, which lm-eval's tasks score with too); trainer: the loop, logging and checkpoints;
command: `tunesmith ppo`; policy_eval and evaluate_command: the policy evaluation."""

from .models import ActorCritic, build_actor_critic, critic_start
from .reward_sources import RewardFunction, Rewards, load_reward_function
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
