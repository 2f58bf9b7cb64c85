"""Reward-model training: a Trainer whose loss asks the chosen reply to outscore the rejected one,
with scores read as models/scoring.py reads them.

Why not trl.RewardTrainer: it needs its own RewardConfig (not our TrainingArguments), tokenizes
and filters data its own way (we truncate the context and keep both replies), and reads scores
where transformers' sequence-classification models do, at the rightmost token that differs from
the pad id. With pad == eos that is the wrong token whenever a sequence ends with eos, so scores
are read at the last position of the attention mask. Its batch collator is reused."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from transformers import EvalPrediction

from ..data.image_encoding import model_inputs
from ..models.scoring import sequence_scores
from .pair_trainer import PairTrainer


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


def pair_model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """What the reward model reads of a batch of pairs: ids and mask (trl's DataCollatorForPreference), and a
    vision-language model's picture inputs (data/image_encoding.ImagePairCollator)."""
    if "labels" in batch:
        return model_inputs(batch)
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


class RewardTrainer(PairTrainer):
    """Batches hold the chosen sequences then the rejected ones (trl's DataCollatorForPreference),
    so both go through the model in one forward. Logs train accuracy and margin; evaluation
    reports preference_metrics."""

    # The loss is a mean over the pairs of one batch; the Trainer divides it for gradient accumulation.
    loss_is_scaled_for_ga = False
    adds_router_loss = False  # the pairwise loss alone (no MoE router loss: --router_aux_loss_coef is SFT's)

    def __init__(self, *args: Any, center_rewards_coefficient: float | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("compute_metrics", preference_metrics)
        super().__init__(*args, **kwargs)
        self.center_rewards_coefficient = center_rewards_coefficient
        self._train_stats = torch.zeros(3, dtype=torch.float64)  # pairs, correct, summed margin

    def _set_signature_columns_if_needed(self) -> None:
        if self._signature_columns is None:
            self._signature_columns = ["chosen_ids", "rejected_ids", "margin", "length",
                                       "chosen_text", "rejected_text", "images",  # a vision-language model's
                                       "chosen_start", "chosen_end", "rejected_start", "rejected_end"]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        scores = sequence_scores(model, **pair_model_inputs(inputs)).float()
        chosen, rejected = scores.chunk(2)
        loss = pairwise_loss(chosen, rejected, inputs.get("margin"), self.center_rewards_coefficient)
        if model.training:
            with torch.no_grad():
                self._trained_tokens += inputs["attention_mask"].sum().cpu()
                diff = (chosen - rejected).double().cpu()
                self._train_stats += torch.tensor([len(diff), (diff > 0).sum().item(), diff.sum().item()],
                                                  dtype=torch.float64)
        return (loss, torch.stack([chosen, rejected], dim=-1)) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            pairs, correct, margin = self.accelerator.reduce(
                self._train_stats.to(self.accelerator.device), reduction="sum").tolist()
            if pairs:
                logs["accuracy"], logs["margin"] = correct / pairs, margin / pairs
            self._train_stats.zero_()
        super().log(logs, start_time)
