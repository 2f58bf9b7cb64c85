"""PPO's own settings (the rest comes from ModelArguments, FinetuningArguments and TrainingArguments:
output_dir, learning_rate, seed, logging/save steps, max_steps, bf16, deepspeed), and the checks
on combinations that cannot work."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

from ..config import ConfigError
from ..hparams import FinetuningArguments


@dataclass
class PPOArguments:
    data_path: list[str] = field(
        default_factory=list,
        metadata={"help": "Prompt files (JSONL/JSON): `prompt` strings, or `messages` / `conversations` ending with "
                  "a user turn (e.g. data/demo/prompts.jsonl)."},
    )
    max_samples: int | None = field(
        default=None, metadata={"help": "Use only the first N prompts (quick runs)."}
    )
    max_prompt_length: int = field(
        default=512, metadata={"help": "Prompts longer than this many tokens (after the chat template) are dropped."}
    )
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


def check_ppo_args(ppo: PPOArguments, finetuning: FinetuningArguments, training: Any) -> None:
    """Raise ConfigError for PPO settings that cannot work, naming the flag and the fix."""
    if not ppo.data_path:
        raise ConfigError("--data_path is required: one or more prompt files (e.g. data/demo/prompts.jsonl).")
    if not ppo.reward_model:
        raise ConfigError("--reward_model is required: the output directory of reward/train.py "
                          "(e.g. outputs/rm_demo), a merged model or an adapter.")
    if not os.path.isdir(ppo.reward_model):
        raise ConfigError(f"--reward_model {ppo.reward_model}: no such directory (train one with reward/train.py).")
    if training.gradient_checkpointing and finetuning.finetuning_type == "lora":
        raise ConfigError("--gradient_checkpointing cannot be used with LoRA PPO: the policy and value adapters "
                          "share one model and the recomputed forward would run the wrong adapter; drop it "
                          "(or use --finetuning_type full).")
    check_batch_settings(ppo, training)


def check_batch_settings(ppo: PPOArguments, training: Any) -> None:
    """The checks PPOTrainer itself needs (it may be built without the recipe)."""
    batch = training.per_device_train_batch_size
    if ppo.num_mini_batches < 1 or batch % ppo.num_mini_batches:
        raise ConfigError(f"--num_mini_batches {ppo.num_mini_batches} must divide --per_device_train_batch_size "
                          f"{batch} (the rollout batch) into equal mini-batches.")
    mini = batch // ppo.num_mini_batches
    if mini % training.gradient_accumulation_steps:
        raise ConfigError(f"--gradient_accumulation_steps {training.gradient_accumulation_steps} must divide the "
                          f"mini-batch of {mini} rows (per_device_train_batch_size / num_mini_batches).")
    if ppo.samples_per_prompt < 1 or batch % ppo.samples_per_prompt:
        raise ConfigError(f"--samples_per_prompt {ppo.samples_per_prompt} must divide --per_device_train_batch_size "
                          f"{batch}: each process holds whole groups of replies to one prompt.")
    if ppo.temperature <= 0:
        raise ConfigError(f"--temperature must be positive (got {ppo.temperature}); PPO needs a sampling policy.")
    if ppo.max_new_tokens < 1 or ppo.ppo_epochs < 1:
        raise ConfigError(f"--max_new_tokens ({ppo.max_new_tokens}) and --ppo_epochs ({ppo.ppo_epochs}) "
                          "must be at least 1.")
    if training.max_steps <= 0 and training.num_train_epochs <= 0:
        raise ConfigError("set --max_steps (PPO steps, one rollout batch each) or --num_train_epochs.")
