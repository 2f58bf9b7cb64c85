"""The RL feature's settings. Its own: PPOArguments (PPO, GRPO, RLOO: one loop, --advantage picks the estimator),
EvalArguments (the policy evaluation), and what both read with the same words: RewardSourceArguments (what scores a
reply) and ToolUseArguments (tools in rollouts). The rest comes from the core's dataclasses: the prompts from
PromptDataArguments, the policy from ModelArguments and FinetuningArguments, and output_dir, learning_rate, seed,
logging/save steps, max_steps, bf16 and deepspeed from TrainingArguments. The checks on their combinations are rows
of rules.py beside it (and the core's, hparams/rules.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..errors import ConfigError
from ..hparams.data_args import PromptDataArguments
from ..hparams.finetuning_args import FinetuningArguments
from ..hparams.model_args import ModelArguments
from ..hparams.rollout_args import RolloutEngineArguments
from ..hparams.training_args import TrainingArguments

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


DEFAULT_MAX_TOOL_CALLS = 4
DEFAULT_TOOL_TIMEOUT = 10.0
# Room for each call's result in the default trajectory budget: the tool message as the template wraps it, and the
# next assistant header.
RESULT_TOKENS = 256


@dataclass
class ToolUseArguments:
    role: ClassVar[str] = "tool_use"
    _argument_group_name: ClassVar[str] = "tools in rollouts"

    tool_funcs: list[str] = field(
        default_factory=list,
        metadata={"help": "Python functions the policy may call while it answers, each `package.module:function` "
                  "(space- or comma-separated). Each needs type hints and a docstring with an Args: section: they "
                  "become the tools schema the chat template lists in the prompt (transformers' get_json_schema; a "
                  "row's own `tools` are listed instead where it has them, each naming one of these functions). A "
                  "reply that is a call runs the function, its result (or its error as text) is appended as a tool "
                  "message, and the policy goes on. Tool results are never trained; the reward sees the whole "
                  "trajectory. Needs a chat template that renders tool calls (e.g. --chat_template chatml_tools)."},
    )
    max_tool_calls: int | None = field(
        default=None,
        metadata={"help": f"With --tool_funcs: the most calls run per trajectory (default {DEFAULT_MAX_TOOL_CALLS}); a "
                  "reply that asks for more ends the trajectory, its calls not run."},
    )
    tool_timeout: float | None = field(
        default=None,
        metadata={"help": f"With --tool_funcs: seconds a call may run (default {DEFAULT_TOOL_TIMEOUT:g}); a call still "
                  "running then is given up on, and its result is an error text."},
    )
    max_trajectory_tokens: int | None = field(
        default=None,
        metadata={"help": "With --tool_funcs: the most tokens of a whole trajectory after the prompt, the model's turns "
                  "and the tool results together (each turn stays within --max_new_tokens); a trajectory that reaches "
                  "it ends unfinished. Default: (max_tool_calls + 1) times --max_new_tokens, and "
                  f"{RESULT_TOKENS} tokens per call for its result."},
    )

    def __post_init__(self) -> None:
        # `a:f,b:g` as the issue writes it, or `a:f b:g` as --reward_funcs takes them
        self.tool_funcs = [spec.strip() for item in self.tool_funcs for spec in str(item).split(",") if spec.strip()]
        given = [f"--{name}" for name in ("max_tool_calls", "tool_timeout", "max_trajectory_tokens")
                 if getattr(self, name) is not None]
        if not self.tool_funcs:
            if given:
                raise ConfigError(f"{' and '.join(given)} given without --tool_funcs: they limit the tool loop, which "
                                  "runs only with functions to call (--tool_funcs package.module:function)")
            return
        if self.max_tool_calls is None:
            self.max_tool_calls = DEFAULT_MAX_TOOL_CALLS
        if self.tool_timeout is None:
            self.tool_timeout = DEFAULT_TOOL_TIMEOUT
        for name, broken, bound in (("max_tool_calls", self.max_tool_calls < 0, "0 or more"),
                                    ("tool_timeout", self.tool_timeout <= 0, "above 0"),
                                    ("max_trajectory_tokens", (self.max_trajectory_tokens or 1) < 1, "1 or more")):
            if broken:
                raise ConfigError(f"--{name} {getattr(self, name)}: must be {bound}")

    @property
    def enabled(self) -> bool:
        return bool(self.tool_funcs)


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
    # The GRPO loss family (the maths: rl/losses/; TRL 1.16's GRPOConfig has the same names).
    loss_type: Literal["dapo", "bnpo", "grpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo"] = field(
        default="dapo",
        metadata={"help": "The policy loss, for every --advantage. dapo (DAPO, Yu et al. 2025, arXiv 2503.14476; TRL's "
                  "default): PPO's clipped surrogate, every real token of the optimizer step (all micro-batches "
                  "and processes) weighing the same. bnpo: the same averaged over each micro-batch's tokens. grpo "
                  "(DeepSeekMath, Shao et al. 2024, arXiv 2402.03300): averaged over each reply, then over replies "
                  "(long replies' tokens weigh less). dr_grpo (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783): summed "
                  "and divided by batch x --max_new_tokens (no length bias). cispo (MiniMax-M1, arXiv 2506.13585): "
                  "the ratio capped at 1 + --epsilon_high and detached, times A log p (every token keeps a "
                  "gradient). sapo (SAPO, arXiv 2511.20347): a smooth sigmoid gate in place of the clip. luspo "
                  "(LUSPO, arXiv 2602.05261): GSPO's sequence ratio, each reply's loss times its length (needs "
                  "--importance_sampling_level sequence). vespo (VESPO, arXiv 2602.10693): -phi(w) A log p, phi a "
                  "Gamma-shaped weight of the reply's ratio w."},
    )
    epsilon_high: float | None = field(
        default=None,
        metadata={"help": "Upper clip of the ratio, 1 + epsilon_high (default: --cliprange, the lower one). DAPO's "
                  "clip-higher (arXiv 2503.14476) uses 0.28: rare tokens may gain more probability, which keeps "
                  "exploration alive. cispo: the cap of its weight is 1 + epsilon_high (TRL's epsilon_high is the "
                  "cap itself: its 5.0 is 4.0 here)."},
    )
    delta: float | None = field(
        default=None,
        metadata={"help": "Two-sided clip (INTELLECT-2, arXiv 2505.07291): the unclipped ratio is capped at delta "
                  "too, so a token with a negative advantage whose ratio has grown large cannot make a huge step "
                  "(they use 4; must exceed 1 + epsilon_high). Clipped loss types only."},
    )
    importance_sampling_level: Literal["token", "sequence"] = field(
        default="token",
        metadata={"help": "token: one ratio pi/pi_old per token (PPO, GRPO). sequence: one ratio per reply, the "
                  "geometric mean of its tokens' (GSPO, Zheng et al. 2025, arXiv 2507.18071), which suits a "
                  "reward given to the whole reply; GSPO's setting is --loss_type grpo with it."},
    )
    scale_rewards: Literal["group", "batch", "none"] = field(
        default="group",
        metadata={"help": "--advantage grpo: each reward less its group's mean, divided by the group's standard "
                  "deviation (group: GRPO), by the whole rollout batch's (batch: PPO Lite, arXiv 2508.08221), or "
                  "not divided (none: Dr. GRPO, arXiv 2503.20783, which found the division favours prompts that "
                  "are too easy or too hard)."},
    )
    multi_objective_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = field(
        default="sum_then_normalize",
        metadata={"help": "--advantage grpo with several reward sources: sum the weighted scores, then take "
                  "advantages (sum_then_normalize), or standardise each source within each group first, then sum "
                  "and standardise over the batch (normalize_then_sum: GDPO, arXiv 2601.05242), so that no source "
                  "drowns the others by its range."},
    )
    mask_truncated_completions: bool = field(
        default=False,
        metadata={"help": "Leave replies cut at --max_new_tokens out of the loss (DAPO): an unfinished reply's score "
                  "says little about its tokens. They still count in the advantages of their group."},
    )
    top_entropy_quantile: float = field(
        default=1.0,
        metadata={"help": "Train only the most uncertain tokens (Wang et al. 2025, \"Beyond the 80/20 rule\", arXiv "
                  "2506.01939, who use 0.2): the policy loss keeps the tokens whose entropy at sampling time is in "
                  "the top share of the rollout batch's real tokens. 1.0 keeps all."},
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "DAPO's dynamic sampling (grpo, rloo): drop the groups whose rewards are all equal (their "
                  "advantages are 0: nothing to learn) and sample more prompts until the batch is full, at most "
                  "--dynamic_sampling_rounds rounds; a batch still short is filled with dropped groups. Logged as "
                  "groups_dropped and sampling_rounds; score_sampled is the mean score before filtering."},
    )
    dynamic_sampling_rounds: int = field(
        default=4, metadata={"help": "With --dynamic_sampling: the most rounds of sampling for one batch."}
    )
    overlong_buffer: int = field(
        default=0,
        metadata={"help": "DAPO's soft overlong punishment (0: off): a reply longer than --max_new_tokens minus this "
                  "many tokens loses up to --overlong_penalty (linearly, all of it at --max_new_tokens)."},
    )
    overlong_penalty: float = field(
        default=1.0, metadata={"help": "With --overlong_buffer: the most a reply loses for its length."}
    )
    sapo_temperature_pos: float = field(
        default=1.0, metadata={"help": "sapo: the gate's temperature for tokens with a positive advantage."}
    )
    sapo_temperature_neg: float = field(
        default=1.05, metadata={"help": "sapo: the gate's temperature for the others (SAPO's paper: a bit sharper)."}
    )
    vespo_k_pos: float = field(default=2.0, metadata={"help": "vespo: the power k of phi(w) for positive advantages."})
    vespo_lambda_pos: float = field(
        default=3.0, metadata={"help": "vespo: the decay lambda of phi(w) for positive advantages."}
    )
    vespo_k_neg: float = field(default=3.0, metadata={"help": "vespo: the power k of phi(w) for negative advantages."})
    vespo_lambda_neg: float = field(
        default=2.0, metadata={"help": "vespo: the decay lambda of phi(w) for negative advantages."}
    )
    gamma: float = field(default=1.0, metadata={"help": "GAE discount factor (gae only)."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda (bias/variance trade-off of the advantages; gae only)."})
    cliprange: float = field(
        default=0.2, metadata={"help": "Clip range of the policy ratio: 1 - cliprange below (TRL's epsilon), 1 + "
                               "--epsilon_high above."})
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
    rollout_is_cap: float = field(
        default=2.0,
        metadata={"help": "With --rollout_engine vllm: truncated importance sampling (Yao et al. 2025, \"Your efficient "
                  "RL framework secretly brings you off-policy RL training\"; verl's TIS). The server's sampling "
                  "distribution differs a little from the trainer's (other kernels, other precision, and one step of "
                  "weights with --async_rollouts 1), so every trained token's policy loss is weighed by min(pi_old / "
                  "pi_rollout, cap): pi_old the trainer's own probability of the token before the update, pi_rollout "
                  "the server's. Logged each step: is_ratio_mean, is_ratio_max, is_capped (the share of tokens "
                  "capped) and rollout_logp_diff (mean |log pi_old - log pi_rollout|)."},
    )
    async_rollouts: int = field(
        default=0,
        metadata={"help": "1: the vLLM server samples the next batch while this one trains (one step stale: that "
                  "batch is sampled by the policy before this update), corrected by --rollout_is_cap like any "
                  "mismatch; generation then hides behind the update. 0: sample, then train (no staleness). Needs "
                  "--rollout_engine vllm."},
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


@dataclass
class EvalArguments(RewardSourceArguments):
    role: ClassVar[str] = "evaluation"
    _argument_group_name: ClassVar[str] = "policy evaluation"

    baseline: str | None = field(
        default=None, metadata={"help": "The policy compared against, usually the SFT one: an adapter directory or a "
                                "model directory. Default, when --policy is an adapter: the model under it (its "
                                "base, from adapter_config.json)."})
    policy: str | None = field(
        default=None, metadata={"help": "The tuned policy (output_dir of ppo/train.py or dpo/train.py)."})
    show: int = field(default=3, metadata={"help": "Print the first this many prompts with both replies."})
    max_new_tokens: int = field(default=48, metadata={"help": "Longest reply."})
    do_sample: bool = field(default=False, metadata={"help": "Sample replies (fixed seed) instead of greedy decoding."})
    temperature: float = field(default=1.0, metadata={"help": "With --do_sample: sampling temperature."})
    seed: int = field(default=0, metadata={"help": "With --do_sample: the seed each policy starts from."})
    batch_size: int = field(default=8, metadata={"help": "Prompts per generation batch."})
    output_file: str | None = field(
        default=None, metadata={"help": "Write each prompt, both replies and scores here (JSONL)."}
    )


# The dataclasses `tunesmith ppo` parses, in the order tunesmith_config.json records them.
ARGUMENTS: tuple[type, ...] = (ModelArguments, PromptDataArguments, FinetuningArguments, PPOArguments, ToolUseArguments,
                               RolloutEngineArguments, TrainingArguments)
# Each command of the feature and its dataclasses (hparams.run_kinds reads it): `tunesmith ppo`, and the policy
# evaluation (`tunesmith eval --policy`), which has no model of its own to name (--baseline and --policy are two).
ARGUMENTS_BY_KIND: dict[str, tuple[type, ...]] = {
    "ppo": ARGUMENTS,
    "eval_policy": (PromptDataArguments, EvalArguments, ToolUseArguments),
}
