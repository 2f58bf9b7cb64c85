"""Reward-model scoring and training: one scalar per sequence, read at its last real token, and a
Trainer whose loss asks the chosen reply to outscore the rejected one.

Why not trl.RewardTrainer: it needs its own RewardConfig (not our TrainingArguments), tokenizes
and filters data its own way (we truncate the context and keep both replies), and reads scores
where transformers' sequence-classification models do, at the rightmost token that differs from
the pad id. With pad == eos that is the wrong token whenever a sequence ends with eos, so scores
are read here at the last position of the attention mask. Its batch collator is reused."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from transformers import EvalPrediction

from ..config import ConfigError
from .sft_trainer import LoraTrainer


@dataclass
class RewardArguments:
    center_rewards_coefficient: float | None = field(
        default=None,
        metadata={"help": "Add this times mean((r_chosen + r_rejected)^2) to the loss, so scores stay centred on 0 "
                  "(0.01 is typical; off by default)."},
    )

    def __post_init__(self) -> None:
        if self.center_rewards_coefficient is not None and self.center_rewards_coefficient < 0:
            raise ConfigError(f"--center_rewards_coefficient must be >= 0 (got {self.center_rewards_coefficient}); "
                              "leave it unset to train without centring")


def score_head(model: nn.Module) -> nn.Module:
    """The one-output `score` layer of a sequence-classification model (PEFT's trainable copy,
    DDP and DeepSpeed wrappers included: the outermost module of that name)."""
    for name, module in model.named_modules():
        if name == "score" or name.endswith(".score"):
            return module
    raise ValueError(f"{type(model).__name__} has no `score` head: load reward models with "
                     "load_model(..., task='reward')")


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position of the last attended token of each row, whichever side the padding is on."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return (attention_mask.long() * positions).argmax(-1)


def sequence_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One score per row: the head's output at the row's last real token.

    The head's per-token output is captured by a hook inside the model's own forward (so DDP and
    ZeRO-3, which only gather weights during that forward, still see the call), and position ids
    follow the attention mask, so a left-padded row scores exactly as it does alone."""
    captured: list[torch.Tensor] = []
    handle = score_head(model).register_forward_hook(lambda _module, _inputs, output: captured.append(output))
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    finally:
        handle.remove()
    per_token = captured[-1]
    if per_token.shape[:2] != input_ids.shape or per_token.shape[-1] != 1:
        raise ValueError(f"expected the score head to give one value per token, got shape {tuple(per_token.shape)}")
    rows = torch.arange(input_ids.shape[0], device=per_token.device)
    return per_token[rows, last_token_index(attention_mask).to(per_token.device), 0]


@torch.no_grad()
def score_sequences(model: Any, tokenizer: Any, sequences: list[list[int]], batch_size: int = 8) -> list[float]:
    """One score per sequence, in the order given (reward/score.py and PPO's RewardModelScorer); batches are
    formed by length so that little is spent on padding."""
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda k: len(sequences[k]))
    scores = [0.0] * len(sequences)
    for i in range(0, len(order), batch_size):
        chunk = order[i:i + batch_size]
        batch = tokenizer.pad({"input_ids": [sequences[k] for k in chunk]}, return_tensors="pt")
        values = sequence_scores(model, batch["input_ids"].to(device), batch["attention_mask"].to(device))
        for k, value in zip(chunk, values.float().tolist()):
            scores[k] = value
    return scores


def pairwise_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_rewards_coefficient: float | None = None,
) -> torch.Tensor:
    """Bradley-Terry loss -log sigmoid(r_chosen - r_rejected - margin), plus the optional centring term."""
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin.to(diff)
    loss = -F.logsigmoid(diff).mean()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * ((chosen + rejected) ** 2).mean()
    return loss


def preference_metrics(prediction: EvalPrediction) -> dict[str, float]:
    """From (N, 2) predictions of [chosen, rejected] scores: accuracy (chosen scored strictly
    higher), mean margin, and mean score of each side."""
    scores = np.asarray(prediction.predictions, dtype=np.float64).reshape(-1, 2)
    chosen, rejected = scores[:, 0], scores[:, 1]
    return {"accuracy": float((chosen > rejected).mean()), "margin": float((chosen - rejected).mean()),
            "chosen_score": float(chosen.mean()), "rejected_score": float(rejected.mean())}


class RewardTrainer(LoraTrainer):
    """Batches hold the chosen sequences then the rejected ones (trl's DataCollatorForPreference),
    so both go through the model in one forward. Logs train accuracy and margin; evaluation
    reports preference_metrics."""

    # The loss is a mean over the pairs of one batch; the Trainer divides it for gradient accumulation.
    loss_is_scaled_for_ga = False

    def __init__(self, *args: Any, center_rewards_coefficient: float | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("compute_metrics", preference_metrics)
        super().__init__(*args, **kwargs)
        self.center_rewards_coefficient = center_rewards_coefficient
        self._train_stats = torch.zeros(3, dtype=torch.float64)  # pairs, correct, summed margin

    def _set_signature_columns_if_needed(self) -> None:
        if self._signature_columns is None:
            self._signature_columns = ["chosen_ids", "rejected_ids", "margin", "length"]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        scores = sequence_scores(model, inputs["input_ids"], inputs["attention_mask"]).float()
        chosen, rejected = scores.chunk(2)
        loss = pairwise_loss(chosen, rejected, inputs.get("margin"), self.center_rewards_coefficient)
        if model.training:
            with torch.no_grad():
                self._trained_tokens += inputs["attention_mask"].sum().cpu()
                diff = (chosen - rejected).double().cpu()
                self._train_stats += torch.tensor([len(diff), (diff > 0).sum().item(), diff.sum().item()],
                                                  dtype=torch.float64)
        return (loss, torch.stack([chosen, rejected], dim=-1)) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss, scores = self.compute_loss(model, inputs, return_outputs=True)
        if prediction_loss_only:
            return loss.detach(), None, None
        # Label 0: the first column, the chosen reply, is the preferred one.
        labels = torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device)
        return loss.detach(), scores.detach(), labels

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            pairs, correct, margin = self.accelerator.reduce(
                self._train_stats.to(self.accelerator.device), reduction="sum").tolist()
            if pairs:
                logs["accuracy"], logs["margin"] = correct / pairs, margin / pairs
            self._train_stats.zero_()
        super().log(logs, start_time)
