"""KTO training (Ethayarajh et al. 2024, arXiv 2402.01306): DPOTrainer's reference plumbing, with the loss
of dpo_loss.kto_loss on single replies, each desirable or undesirable, against a reference point z0
estimated in every batch from its prompts paired with other rows' replies (data/collator.KTOPackingCollator).

Why not trl.KTOTrainer: the reasons DPOTrainer gives (its own config, its own tokenization, a second copy
of the weights for the reference), and it fixes the mismatched pairs in the dataset, which ties training to
a sequential sampler; here the collator draws them from each batch as it comes."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers import EvalPrediction

from .dpo_loss import KTOLoss, kto_kl, kto_loss
from .dpo_trainer import REFERENCE_COLUMNS, STAT_NAMES, DPOTrainer, sequence_logps

# Logged means over the replies of each kind seen since the last log, and of the batches' KL estimates.
TRAIN_STAT_NAMES = ("rewards/desirable", "rewards/undesirable", "logps/desirable", "logps/undesirable", "kl")
# Per held-out pair: DPO's statistics (so eval_accuracy and eval_margin compare with a DPO run's on the same
# pairs), and the KL estimate of the pair's batch.
EVAL_STAT_NAMES = (*STAT_NAMES, "kl")


def kto_metrics(prediction: EvalPrediction) -> dict[str, float]:
    """Means of the per-pair statistics (the predictions of KTOTrainer.prediction_step)."""
    stats = np.asarray(prediction.predictions, dtype=np.float64).reshape(-1, len(EVAL_STAT_NAMES))
    return dict(zip(EVAL_STAT_NAMES, stats.mean(axis=0).tolist()))


class KTOTrainer(DPOTrainer):
    """Batches from KTOPackingCollator: the replies in one padding-free row, and their prompts with other
    rows' replies in a second (`kl`). Per step: the policy on the replies (the one forward with gradients),
    the policy on the mismatched replies without gradients, and the reference on both (DPOTrainer's
    reference: the frozen adapter the run continues, the model without its adapter, or a frozen copy).
    Evaluation runs the same loss on held-out pairs, split into one desirable and one undesirable reply,
    and reports DPO's per-pair statistics: eval_accuracy is how often the chosen reply's implicit reward
    beta (pi - ref) is above the rejected one's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("compute_metrics", kto_metrics)
        super().__init__(*args, **kwargs)
        # the sums of TRAIN_STAT_NAMES, then the desirable and undesirable counts and the batch count
        self._train_stats = torch.zeros(len(TRAIN_STAT_NAMES) + 3, dtype=torch.float64)

    def _set_signature_columns_if_needed(self) -> None:
        if self._signature_columns is None:
            self._signature_columns = ["ids", "start", "end", "desirable", "chosen_ids", "rejected_ids",
                                       "chosen_start", "chosen_end", "rejected_start", "rejected_end", "length",
                                       *REFERENCE_COLUMNS]

    def kto_batch_loss(self, model: Any, inputs: dict[str, Any]) -> tuple[KTOLoss, torch.Tensor]:
        """The loss of a batch and the policy's summed log-prob of each reply."""
        policy, _ = sequence_logps(model, inputs)
        with torch.no_grad():
            policy_kl, _ = sequence_logps(model, inputs["kl"])
        reference, reference_kl = self.reference_logps(model, inputs), self.reference_logps(model, inputs["kl"])
        mean = (lambda t: self.accelerator.reduce(t, reduction="mean")) if self.accelerator.num_processes > 1 else None
        kl = kto_kl(policy_kl, reference_kl, mean)
        args = self.dpo_args
        result = kto_loss(policy, reference, inputs["desirable"], kl, args.beta, args.desirable_weight,
                          args.undesirable_weight)
        return result, policy.detach().float()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        result, policy = self.kto_batch_loss(model, inputs)
        desirable = inputs["desirable"]
        if model.training:
            with torch.no_grad():
                self._trained_tokens += len(inputs["reply_targets"])
                good, bad = desirable, ~desirable
                sums = [result.rewards[good].sum(), result.rewards[bad].sum(), policy[good].sum(), policy[bad].sum(),
                        result.kl, good.sum(), bad.sum(), result.kl.new_ones(())]
                self._train_stats += torch.stack([t.double() for t in sums]).cpu()
        if not return_outputs:
            return result.loss
        if not inputs["pairs"]:
            raise TypeError("KTO evaluates on preference pairs (data/unpaired.HELD_OUT_PAIRS), not on judged replies")
        chosen, rejected = result.rewards.chunk(2)
        policy_c, policy_r = policy.chunk(2)
        stats = torch.stack([chosen, rejected, (chosen > rejected).float(), chosen - rejected, policy_c, policy_r,
                             result.kl.expand_as(chosen)], dim=-1)
        return result.loss, stats

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            *sums, good, bad, batches = self.accelerator.reduce(self._train_stats.to(self.accelerator.device),
                                                                reduction="sum").tolist()
            counts = (good, bad, good, bad, batches)
            logs.update({name: total / count for name, total, count in zip(TRAIN_STAT_NAMES, sums, counts) if count})
            self._train_stats.zero_()
        super(DPOTrainer, self).log(logs, start_time)
