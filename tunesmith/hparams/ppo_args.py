"""PPO's own settings. The rest comes from the shared dataclasses: the prompts from
PromptDataArguments, the policy from ModelArguments and FinetuningArguments, and output_dir,
learning_rate, seed, logging/save steps, max_steps, bf16 and deepspeed from TrainingArguments. The
checks on their combinations are rows of hparams/rules.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal


@dataclass
class PPOArguments:
    role: ClassVar[str] = "ppo"
    _argument_group_name: ClassVar[str] = "PPO"

    reward_model: str | None = field(
        default=None,
        metadata={"help": "The reward model from reward/train.py: a merged model directory, or an adapter directory "
                  "(its base model is read from adapter_config.json)."},
    )
    max_new_tokens: int = field(default=48, metadata={"help": "Longest reply generated in a rollout."})
    temperature: float = field(
        default=1.0,
        metadata={"help": "Sampling temperature; log-probabilities for the PPO ratio and the KL use the same one."},
    )
    top_k: int = field(
        default=0,
        metadata={"help": "Sample from the k most likely tokens only (0: off). Log-probabilities ignore the cut, so "
                  "keep it off for exact PPO."},
    )
    top_p: float = field(
        default=1.0, metadata={"help": "Nucleus sampling mass (1.0: off). Same caveat as top_k."}
    )
    ppo_epochs: int = field(default=2, metadata={"help": "Passes over each rollout batch."})
    num_mini_batches: int = field(
        default=1,
        metadata={"help": "Optimizer steps per PPO epoch: the rollout batch (per_device_train_batch_size prompts) is "
                  "split into this many shuffled mini-batches; each may be split further by "
                  "gradient_accumulation_steps."},
    )
    gamma: float = field(default=1.0, metadata={"help": "GAE discount factor."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda (bias/variance trade-off of the advantages)."})
    cliprange: float = field(default=0.2, metadata={"help": "Clip range of the policy ratio."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Clip range of the value prediction."})
    vf_coef: float = field(default=0.1, metadata={"help": "Weight of the value loss in the total loss."})
    kl_coef: float = field(
        default=0.05, metadata={"help": "Coefficient of the per-token KL penalty against the reference policy."}
    )
    adaptive_kl: bool = field(
        default=False,
        metadata={"help": "Adapt kl_coef towards kl_target (Ziegler et al. 2019) instead of keeping it fixed."},
    )
    kl_target: float = field(
        default=6.0, metadata={"help": "With adaptive_kl: the KL (nats per reply) to steer towards."}
    )
    kl_horizon: float = field(
        default=10000, metadata={"help": "With adaptive_kl: episodes over which kl_coef may change by about a fifth."}
    )
    kl_estimator: Literal["k1", "abs", "mse", "k3"] = field(
        default="k1",
        metadata={"help": "Per-token KL estimate: k1 = logp - ref_logp, or abs, mse, k3 (always >= 0)."},
    )
    missing_eos_penalty: float = field(
        default=0.0,
        metadata={"help": "Subtracted from the score of replies that hit max_new_tokens without ending (0: off)."},
    )
    samples_per_prompt: int = field(
        default=1,
        metadata={"help": "Replies sampled per prompt in a rollout batch (which then holds per_device_train_batch_size "
                  "/ samples_per_prompt prompts). Above 1, each score is taken relative to the mean score of the "
                  "other replies to its prompt (leave-one-out baseline) before the KL penalty and GAE: the advantages "
                  "then compare replies to the same prompt instead of easy prompts to hard ones."},
    )
    whiten_rewards: bool = field(
        default=False, metadata={"help": "Rescale the per-token rewards to unit variance before GAE."}
    )
    rollout_log_samples: int = field(
        default=1, metadata={"help": "Print this many (prompt, reply, score) samples at every log step."}
    )

