"""The models of the RL stage (policy, value model, reference) behind one nn.Module. GRPO and RLOO
(`--advantage grpo|rloo`) have no value model: neither the value adapter nor the head is created,
trained or saved.

With LoRA (the default) there is ONE base model in memory:

* the policy is the PEFT adapter "default" (the SFT adapter, loaded trainable, when one is given;
  else a fresh LoRA whose zero-initialised B makes it equal to the base);
* the value model is a second adapter, "value", on the same PeftModel, plus a small nn.Linear
  value head on the last hidden state;
* the reference is the policy at step 0. Without an SFT adapter that is the bare base, reached
  with `disable_adapter()`. With one it is the SFT policy, so a frozen second copy of the SFT
  adapter, "reference", is loaded beside the trainable one. We keep the SFT adapter as an adapter
  rather than merging it into the base in memory, so that the saved policy adapter holds the
  whole SFT + PPO change relative to the base: chat, merge and eval load it like any other adapter
  of that base, and a quantized (QLoRA) base works too. The cost is one frozen LoRA copy.

With `--finetuning_type full` the policy, the value model and the reference are three copies (two
without a value model)."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..constants import IGNORE_INDEX
from ..errors import ConfigError
from ..hparams import FinetuningArguments, ModelArguments
from ..models.loader import load_model, resolve_model_path
from ..models.weights_check import check_adapter_folder
from ..utils.config_facts import config_fact
from ..utils.paths import adapter_config, is_adapter_dir, model_architecture, model_config
from .args import PPOArguments
from .losses import logprobs_from_logits
from .shared_prompts import prompt_groups, shared_prompt_logits

logger = logging.getLogger(__name__)

POLICY, VALUE, REFERENCE = "default", "value", "reference"
VALUE_DIR = "value"  # where the value adapter (or full value model) is saved, inside an output folder
VALUE_HEAD_FILE = "value_head.safetensors"


def response_logits(causal_lm: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    position_ids: torch.Tensor, context_length: int) -> torch.Tensor:
    """Logits that predict the response tokens (positions context_length ... end), without
    computing the vocabulary projection for the prompt; each distinct prompt runs once when the
    rows repeat prompts (GRPO's groups: shared_prompts.py)."""
    groups = prompt_groups(input_ids[:, :context_length], attention_mask[:, :context_length])
    if groups is not None:
        return shared_prompt_logits(causal_lm, input_ids, attention_mask, position_ids, context_length, groups)
    response_length = input_ids.size(1) - context_length
    out = causal_lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    logits_to_keep=response_length + 1, use_cache=False)
    return out.logits[:, :-1]


class ActorCritic(nn.Module):
    """Policy, value model (+ head) and frozen reference. `forward` is the training forward (policy
    logits and values), so DDP/DeepSpeed see one module; rollouts call the pieces directly."""

    def __init__(self, policy: nn.Module, value_head: nn.Linear | None, temperature: float = 1.0,
                 value_model: nn.Module | None = None, reference: nn.Module | None = None) -> None:
        super().__init__()
        self.policy = policy
        self.value_head = value_head
        self.value_model = value_model
        self.reference = reference
        self.temperature = temperature
        self.is_lora = hasattr(policy, "peft_config")
        if self.is_lora == (reference is not None):
            raise ValueError("pass a reference (and a value_model with a value_head) for full fine-tuning, and only then")
        if not self.is_lora and (value_head is None) != (value_model is None):
            raise ValueError("full fine-tuning takes a value_model with a value_head, or neither")
        self._trainable = {id(p) for p in self.parameters() if p.requires_grad}

    @property
    def has_value_model(self) -> bool:
        return self.value_head is not None

    # ------------------------------------------------------------------ adapters

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if id(p) in self._trainable]

    def policy_weights(self) -> dict[str, nn.Parameter]:
        """The policy's trained weights by their name in self.policy (its LoRA adapter, or every weight)."""
        return {name: p for name, p in self.policy.named_parameters() if id(p) in self._trainable
                and (not self.is_lora or f".{POLICY}." in name)}

    @contextmanager
    def adapter(self, name: str) -> Iterator[None]:
        """Run the shared base with adapter `name`. PEFT's set_adapter also flips requires_grad to
        the active adapter only; the trainable set is put back each time, so the optimizer (and
        DeepSpeed, which looks at requires_grad) always see the same parameters."""
        self.policy.set_adapter(name)
        self._restore_requires_grad()
        try:
            yield
        finally:
            self.policy.set_adapter(POLICY)
            self._restore_requires_grad()

    def _restore_requires_grad(self) -> None:
        for p in self.parameters():
            p.requires_grad_(id(p) in self._trainable)

    def _causal_lm(self) -> nn.Module:
        return self.policy.get_base_model() if self.is_lora else self.policy

    # ------------------------------------------------------------------ forwards

    def policy_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                      context_length: int) -> torch.Tensor:
        """Temperature-scaled logits of the policy for the response positions."""
        logits = response_logits(self.policy, input_ids, attention_mask, position_ids, context_length)
        return logits / self.temperature

    def reference_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                         context_length: int) -> torch.Tensor:
        args = (input_ids, attention_mask, position_ids, context_length)
        if not self.is_lora:
            logits = response_logits(self.reference, *args)
        elif REFERENCE in self.policy.peft_config:
            with self.adapter(REFERENCE):
                logits = response_logits(self.policy, *args)
        else:
            with self.policy.disable_adapter():
                logits = response_logits(self.policy, *args)
        return logits / self.temperature

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
               context_length: int) -> torch.Tensor:
        """V(s_t) for every response position: the value head on the hidden state that precedes
        response token t (float32)."""
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                  "use_cache": False}
        if self.is_lora:
            with self.adapter(VALUE):
                hidden = self._causal_lm().get_decoder()(**kwargs).last_hidden_state
        else:
            hidden = self.value_model.get_decoder()(**kwargs).last_hidden_state
        hidden = hidden[:, context_length - 1:-1]
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()

    def supervised_loss(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        labels: torch.Tensor) -> torch.Tensor:
        """PPO-ptx's term: the policy's cross-entropy per trained token, ``-mean_t log p(y_t)`` over the tokens whose
        label is not IGNORE_INDEX (right-padded rows, temperature 1: the SFT loss itself)."""
        logits = self.policy(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
        targets = labels[:, 1:]
        trained = targets != IGNORE_INDEX
        logprobs = logprobs_from_logits(logits, targets.clamp(min=0))
        return -(logprobs * trained).sum() / trained.sum().clamp(min=1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                context_length: int, ptx: tuple[torch.Tensor, ...] | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(policy logits, values, PPO-ptx loss): values None without a value model, the loss None without ptx, a
        batch (input_ids, attention_mask, labels). One forward of this module, so DeepSpeed sees one call."""
        args = (input_ids, attention_mask, position_ids, context_length)
        return (self.policy_logits(*args), self.values(*args) if self.has_value_model else None,
                self.supervised_loss(*ptx) if ptx is not None else None)

    # ------------------------------------------------------------------ saving

    def save(self, directory: str, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """The policy as a loadable adapter (or full model) in `directory`; with a value model, the value
        adapter (or model) in `directory/value` and the value head in `directory/value_head.safetensors`.

        state_dict: this module's trainable weights gathered from ZeRO-3 shards (keys as in
        self.state_dict()), where the parameters in memory are empty placeholders; default: those."""

        def part(prefix: str) -> dict[str, torch.Tensor] | None:
            if state_dict is None:
                return None
            return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}

        from safetensors.torch import save_file

        if self.is_lora:
            self.policy.save_pretrained(directory, selected_adapters=[POLICY], state_dict=part("policy."))
        else:
            self.policy.save_pretrained(directory, state_dict=part("policy."))
        if not self.has_value_model:
            return
        if self.is_lora:  # PEFT puts it in directory/value
            self.policy.save_pretrained(directory, selected_adapters=[VALUE], state_dict=part("policy."))
        else:
            self.value_model.save_pretrained(os.path.join(directory, VALUE_DIR), state_dict=part("value_model."))
        head = part("value_head.") or self.value_head.state_dict()
        save_file({k: v.detach().float().cpu().contiguous() for k, v in head.items()},
                  os.path.join(directory, VALUE_HEAD_FILE))


def critic_start(ppo_args: PPOArguments, model_args: ModelArguments, finetuning_args: FinetuningArguments,
                 ) -> str | None:
    """The reward model PPO's critic starts from (None: the base, with a zero value head). --critic_model_name_or_path
    left out means --reward_model when it fits the policy, as DeepSpeed-Chat initialises its critic from the reward
    model: its values then start as the reward model's score of each prefix rather than 0."""
    if not ppo_args.uses_value_model or ppo_args.critic_model_name_or_path == "base":
        return None
    chosen = ppo_args.critic_model_name_or_path or ppo_args.reward_model
    if chosen is None:
        return None
    why_not = critic_mismatch(chosen, resolve_model_path(model_args), finetuning_args.finetuning_type)
    if why_not is None:
        logger.info("critic: starts from the reward model %s", chosen)
        return chosen
    if ppo_args.critic_model_name_or_path:
        raise ConfigError(f"--critic_model_name_or_path {chosen} {why_not}: give one that is, or `base`.")
    logger.info("critic: starts from the base with a zero value head (the reward model %s %s)", chosen, why_not)
    return None


def critic_mismatch(path: str, base: str, finetuning_type: str) -> str | None:
    """Why the reward model at `path` cannot become the critic of a policy on `base` (None: it can)."""
    if finetuning_type == "lora":
        if not is_adapter_dir(path):
            return "is not a LoRA adapter of the policy's base (a LoRA policy's critic is a second adapter on it)"
        record = adapter_config(path)
        recorded = record.get("base_model_name_or_path") or ""
        if record.get("peft_type") != "LORA" or os.path.realpath(recorded) != os.path.realpath(base):
            return f"is not a LoRA adapter of the policy's base {base} (it records {recorded or 'no base'})"
        return None
    if is_adapter_dir(path):
        return "is a LoRA adapter, and a full policy's critic is a full model (merge the reward adapter first)"
    if _hidden_size(path) != _hidden_size(base):
        return f"has another hidden size than the policy's base {base}"
    return None


def _hidden_size(path: str) -> int | None:
    return config_fact(model_config(path), "hidden_size")


def _add_value_adapter_from_reward_adapter(policy: nn.Module, reward_adapter: str) -> torch.Tensor:
    """The reward adapter's LoRA weights as the trainable "value" adapter; returns its score head's weight."""
    from peft import LoraConfig, set_peft_model_state_dict
    from safetensors.torch import load_file

    config = LoraConfig.from_pretrained(reward_adapter)
    config.task_type, config.modules_to_save, config.inference_mode = "CAUSAL_LM", None, False
    policy.add_adapter(VALUE, config)
    saved = load_file(os.path.join(reward_adapter, "adapter_model.safetensors"))
    set_peft_model_state_dict(policy, {k: v for k, v in saved.items() if ".lora_" in k}, adapter_name=VALUE)
    (score,) = [v for k, v in saved.items() if k.endswith("score.weight")]
    return score


def _score_weight(reward_model: str) -> torch.Tensor:
    from safetensors import safe_open

    for name in sorted(os.listdir(reward_model)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(reward_model, name), framework="pt") as f:
                for key in f.keys():
                    if key == "score.weight" or key.endswith(".score.weight"):
                        return f.get_tensor(key)
    raise ConfigError(f"{reward_model}: no score.weight in its safetensors files: not a reward model from "
                      "reward/train.py")


def build_actor_critic(model_args: ModelArguments, finetuning_args: FinetuningArguments, training_args: Any,
                       temperature: float = 1.0, resume_from: str | None = None,
                       value_model: bool = True, critic: str | None = None) -> ActorCritic:
    """Load the policy, value model (unless value_model=False: GRPO, RLOO) and reference for a run,
    starting from the SFT adapter (or the base), or from the trainable weights in the checkpoint
    `resume_from`. critic: a reward model the value model and head start from (critic_start)."""
    base = resolve_model_path(model_args)
    value = None
    critic = None if resume_from else critic  # a checkpoint holds the critic as trained so far
    score = None
    if finetuning_args.finetuning_type == "lora":
        sft_adapter = model_args.adapter_name_or_path
        start = dataclasses.replace(model_args, adapter_name_or_path=resume_from or sft_adapter)
        policy = load_model(start, finetuning_args, training_args)
        check_adapter_folder(critic, "--critic_model_name_or_path (or --reward_model, where the critic starts)")
        if sft_adapter and resume_from:  # the first load read the checkpoint's adapter, not the SFT one
            check_adapter_folder(sft_adapter)
        if value_model and resume_from:
            policy.load_adapter(os.path.join(resume_from, VALUE_DIR), adapter_name=VALUE, is_trainable=True)
        elif value_model and critic:
            score = _add_value_adapter_from_reward_adapter(policy, critic)
        elif value_model:
            # Same shape as the policy adapter; zero-initialised B, so it starts as the base.
            value_config = copy.deepcopy(policy.peft_config[POLICY])
            value_config.inference_mode = False
            policy.add_adapter(VALUE, value_config)
        if sft_adapter:
            policy.load_adapter(sft_adapter, adapter_name=REFERENCE, is_trainable=False)
        policy.set_adapter(POLICY)
        policy.set_requires_grad([POLICY, VALUE] if value_model else [POLICY], requires_grad=True)
        if sft_adapter:
            policy.set_requires_grad(REFERENCE, requires_grad=False)
        reference = None
        hidden_size = config_fact(policy.get_base_model().config, "hidden_size")
    else:
        def full(path: str, trainable: bool) -> nn.Module:
            # A value model started from a reward model keeps its class (a sequence classifier) when saved.
            task = "reward" if (model_architecture(path) or "").endswith("ForSequenceClassification") else "causal_lm"
            return load_model(dataclasses.replace(model_args, model_name_or_path=path), finetuning_args,
                              training_args, is_trainable=trainable, task=task)

        policy = full(resume_from or base, True)
        if value_model:
            value = full(os.path.join(resume_from, VALUE_DIR) if resume_from else critic or base, True)
            if critic:
                score = _score_weight(critic)
        reference = full(base, False)
        if training_args is not None and training_args.gradient_checkpointing:
            for model in (policy, value):
                if model is not None:
                    model.gradient_checkpointing_enable()
        hidden_size = config_fact(policy.config, "hidden_size")

    value_head = new_value_head(hidden_size, resume_from) if value_model else None
    if score is not None:  # the reward model's head (no bias): the values start as its score of each prefix
        with torch.no_grad():
            value_head.weight.copy_(score.reshape(value_head.weight.shape))
    model = ActorCritic(policy, value_head, temperature, value_model=value, reference=reference)
    # PPO's ratio compares the rollout's log-probs with the update's: dropout would make them differ
    # before any weight has changed. eval() switches it off; gradients still flow.
    model.eval()
    return model


def new_value_head(hidden_size: int, resume_from: str | None = None) -> nn.Linear:
    """The value head: zero (every value starts at 0, the natural guess before any reward is seen), or the
    one saved in the checkpoint `resume_from`."""
    value_head = nn.Linear(hidden_size, 1)
    nn.init.zeros_(value_head.weight)
    nn.init.zeros_(value_head.bias)
    if resume_from:
        from safetensors.torch import load_file

        value_head.load_state_dict(load_file(os.path.join(resume_from, VALUE_HEAD_FILE)))
    return value_head
