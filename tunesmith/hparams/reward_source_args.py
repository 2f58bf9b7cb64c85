"""What scores a reply: a reward model and/or Python reward functions, each with a weight. Shared by the RL stage's
PPOArguments (tunesmith/rl/args.py) and the policy evaluation's EvalArguments (tool_args.py), so it stays in the
core."""

from __future__ import annotations

from dataclasses import dataclass, field

# Where a --reward_funcs name without a module is looked up (the functions tunesmith ships).
SHIPPED_REWARD_FUNCS_MODULE = "tunesmith.data.reward_funcs"


@dataclass
class RewardSourceArguments:
    """What scores a reply, in training (tunesmith ppo) and in evaluation (eval-policy): a reward model, Python
    functions, or both, each with a weight; the reward is the weighted sum."""

    reward_model: str | None = field(
        default=None,
        metadata={"help": "The reward model from reward/train.py: a merged model directory, or an adapter directory "
                  "(its base model is read from adapter_config.json)."},
    )
    reward_funcs: list[str] = field(
        default_factory=list,
        metadata={"help": "Reward functions, each `package.module:function` (or the bare name of one tunesmith ships "
                  "in tunesmith/data/reward_funcs.py: exact_answer, final_number, answer_format, length_penalty). Each is called "
                  "as f(prompts, replies, **fields) on a batch: prompts are the conversations (lists of {role, "
                  "content}), replies the decoded reply texts, and every other field of the data rows (e.g. "
                  "`answer`) comes as a keyword argument, one value per reply (None where a row lacks it); it "
                  "returns one float per reply."},
    )
    reward_weights: list[float] = field(
        default_factory=list,
        metadata={"help": "One weight per --reward_funcs entry, in order (default: 1.0 each)."},
    )
    reward_model_weight: float = field(
        default=1.0, metadata={"help": "Weight of the reward model's score in the reward (with --reward_funcs)."}
    )
