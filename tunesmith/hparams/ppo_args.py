"""The RL stage's own settings (PPO, GRPO, RLOO: one loop, --advantage picks the estimator). The rest comes
from the shared dataclasses: the prompts from PromptDataArguments, the policy from ModelArguments and
FinetuningArguments, and output_dir, learning_rate, seed, logging/save steps, max_steps, bf16 and deepspeed
from TrainingArguments. The checks on their combinations are rows of hparams/rules.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

# Where a --reward_funcs name without a module is looked up (the functions tunesmith ships).
SHIPPED_REWARD_FUNCS_MODULE = "tunesmith.ppo.reward_funcs"


@dataclass
class RewardSourceArguments:
    """What scores a reply, in training (ppo/train.py) and in evaluation (eval-policy): a reward model, Python
    functions, or both, each with a weight; the reward is the weighted sum."""

    reward_model: str | None = field(
        default=None,
        metadata={"help": "The reward model from reward/train.py: a merged model directory, or an adapter directory "
                  "(its base model is read from adapter_config.json)."},
    )
    reward_funcs: list[str] = field(
        default_factory=list,
        metadata={"help": "Reward functions, each `package.module:function` (or the bare name of one tunesmith ships "
                  "in tunesmith/ppo/reward_funcs.py: exact_answer, answer_format, length_penalty). Each is called "
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


@dataclass
class PPOArguments(RewardSourceArguments):
    role: ClassVar[str] = "ppo"
    _argument_group_name: ClassVar[str] = "PPO / GRPO"
    result_neutral: ClassVar[frozenset[str]] = frozenset({"rollout_log_samples"})  # hparams/run_config.py

    advantage: Literal["gae", "grpo", "rloo"] = field(
        default="gae",
        metadata={"help": "How each reply token's advantage is estimated. gae: PPO, a value model (a second LoRA "
                  "adapter and a value head) and GAE over per-token rewards. grpo: no value model; each reply's "
                  "reward standardised within the --samples_per_prompt replies to its prompt, (r - mean) / "
                  "(population std + 1e-4), 0 when all are equal, the same for every token of the reply. rloo: no "
                  "value model; each reply's reward minus the mean reward of the other replies to its prompt."},
    )
    critic_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Where PPO's critic (value model) starts, as in DeepSpeed-Chat: a reward model from "
                  "reward/train.py (a LoRA adapter of the policy's base for LoRA, a full model for --finetuning_type "
                  "full), whose body becomes the value adapter (or model) and whose score head the value head; "
                  "`base`: the policy's base with a zero value head. Default: --reward_model when it fits the policy, "
                  "else `base` (logged). gae only."},
    )
    ptx_data_path: list[str] = field(
        default_factory=list,
        metadata={"help": "PPO-ptx (InstructGPT, DeepSpeed-Chat's unsupervised data): conversations in any SFT format "
                  "whose supervised loss (the replies' tokens, as sft/train.py trains them, at most --max_prompt_length "
                  "+ --max_new_tokens tokens) is added to the policy loss at every update, times --ptx_coef, so the "
                  "policy keeps what SFT taught. Logged as ptx_loss."},
    )
    # None: 1.0 when --ptx_data_path is given (checked in hparams/rules.py: refused without it).
    ptx_coef: float | None = field(
        default=None,
        metadata={"help": "Weight of the --ptx_data_path loss (default 1.0; InstructGPT used 27.8 on its own scale)."},
    )
    ema_decay: float | None = field(
        default=None,
        metadata={"help": "Keep an exponential moving average of the policy (DeepSpeed-Chat's --enable_ema, which uses "
                  "0.992): after every update ema = decay * ema + (1 - decay) * policy. Saved as its own adapter (or "
                  "model) in output_dir/ema, which chat, serve and eval load like the policy. Not with ZeRO-3."},
    )
    kl_in_loss: bool = field(
        default=False,
        metadata={"help": "Add kl_coef times the KL to the reference to the loss (GRPO's way) instead of subtracting "
                  "it from the reward (PPO's way)."},
    )
    loss_aggregation: Literal["token", "sequence"] = field(
        default="token",
        metadata={"help": "How the per-token losses of a mini-batch are averaged: token: over all real tokens "
                  "(longer replies weigh more); sequence: over each reply first, then over replies (each reply "
                  "weighs the same)."},
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
    gamma: float = field(default=1.0, metadata={"help": "GAE discount factor (gae only)."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda (bias/variance trade-off of the advantages; gae only)."})
    cliprange: float = field(default=0.2, metadata={"help": "Clip range of the policy ratio."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Clip range of the value prediction (gae only)."})
    vf_coef: float = field(default=0.1, metadata={"help": "Weight of the value loss in the total loss (gae only)."})
    kl_coef: float = field(
        default=0.05, metadata={"help": "Coefficient of the per-token KL to the reference policy, in the reward or (--kl_in_loss) in the loss."}
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
    kl_estimator: Literal["k1", "abs", "mse", "k3"] | None = field(
        default=None,
        metadata={"help": "Per-token KL estimate: k1 = logp - ref_logp, or abs, mse, k3 = exp(ref_logp - logp) - 1 - "
                  "(ref_logp - logp) (always >= 0). Default: k1 in the reward, k3 with --kl_in_loss (k1's gradient "
                  "is zero on average, so as a loss it would hold nothing back)."},
    )
    missing_eos_penalty: float = field(
        default=0.0,
        metadata={"help": "Subtracted from the score of replies that hit max_new_tokens without ending (0: off)."},
    )
    samples_per_prompt: int = field(
        default=1,
        metadata={"help": "Replies sampled per prompt in a rollout batch (which then holds per_device_train_batch_size "
                  "/ samples_per_prompt prompts). With --advantage gae and above 1, each score is taken relative to the "
                  "mean score of the other replies to its prompt (leave-one-out baseline) before the KL penalty and "
                  "GAE: the advantages then compare replies to the same prompt instead of easy prompts to hard "
                  "ones. grpo and rloo need at least 2 (the group is their baseline)."},
    )
    whiten_rewards: bool = field(
        default=False, metadata={"help": "Rescale the per-token rewards to unit variance before GAE (gae only)."}
    )
    rollout_log_samples: int = field(
        default=1, metadata={"help": "Print this many (prompt, reply, score) samples at every log step."}
    )

    @property
    def ptx_weight(self) -> float:
        """The weight of the supervised loss (0 without --ptx_data_path)."""
        if not self.ptx_data_path:
            return 0.0
        return 1.0 if self.ptx_coef is None else self.ptx_coef

    def __post_init__(self) -> None:
        if self.kl_estimator is None:
            self.kl_estimator = "k3" if self.kl_in_loss else "k1"

    @property
    def uses_value_model(self) -> bool:
        return self.advantage == "gae"

