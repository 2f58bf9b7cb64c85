"""What the Trainer stages on preference pairs (reward model, DPO) share: evaluation that returns one
row of per-pair predictions per pair, with label 0 (the chosen reply, first, is the preferred one)."""

from __future__ import annotations

import torch

from ..train.stage_trainer import StageTrainer


class PairTrainer(StageTrainer):
    """A subclass's compute_loss(..., return_outputs=True) gives (loss, per-pair predictions [pairs, k])."""

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss, per_pair = self.compute_loss(model, inputs, return_outputs=True)
        if prediction_loss_only:
            return loss.detach(), None, None
        # Labels are needed for compute_metrics to run; every pair's preferred reply is the chosen one.
        labels = torch.zeros(per_pair.shape[0], dtype=torch.long, device=per_pair.device)
        return loss.detach(), per_pair.detach(), labels
