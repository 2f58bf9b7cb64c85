"""DPO training: a Trainer whose loss (train/dpo_loss.py) asks the policy to prefer the chosen reply
over the rejected one more than the reference model does (sigmoid, ipo), or outright (simpo, orpo).

Why not trl.DPOTrainer: it needs its own DPOConfig (not our TrainingArguments), tokenizes its own way
(we render pairs through the chat template as SFT does, and truncate the context, never a reply),
and keeps its own reference-model plumbing. Here the reference of a LoRA run is the same model with
its adapter switched off, so no second copy of the weights is held."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from transformers import EvalPrediction

from ..hparams import DPOArguments
from .dpo_loss import PreferenceLoss, preference_loss
from .pair_trainer import PairTrainer

# Per-pair statistics, summed over the pairs seen since the last log; their means are logged.
STAT_NAMES = ("rewards/chosen", "rewards/rejected", "rewards/accuracy", "rewards/margin", "logps/chosen",
              "logps/rejected")


def sequence_logps(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the log-prob of its masked tokens, summed (float32), and how many there are. Token t
    is predicted by the logits at t - 1, so the mask is read from position 1 on."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    labels, mask = input_ids[:, 1:], loss_mask[:, 1:].bool()
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    summed = torch.where(mask, picked, torch.zeros((), dtype=picked.dtype, device=picked.device)).sum(-1)
    return summed, mask.sum(-1)


REFERENCE_ADAPTER = "reference"


@contextlib.contextmanager
def reference_weights(peft_model: Any) -> Iterator[None]:
    """Run the reference: the frozen REFERENCE_ADAPTER where there is one, else no adapter. PEFT's
    set_adapter also moves requires_grad to the active adapter, so the trained one is made active again
    (and trainable) on the way out."""
    if REFERENCE_ADAPTER not in peft_model.peft_config:
        with peft_model.disable_adapter():
            yield
        return
    trained = peft_model.active_adapter
    peft_model.set_adapter(REFERENCE_ADAPTER)
    try:
        yield
    finally:
        peft_model.set_adapter(trained)


def add_reference_adapter(peft_model: Any, adapter_dir: str) -> None:
    """Load the adapter a run continues a second time, frozen, as the reference (one base in memory)."""
    trained = peft_model.active_adapter
    peft_model.load_adapter(adapter_dir, adapter_name=REFERENCE_ADAPTER, is_trainable=False)
    peft_model.set_adapter(trained)


def pair_statistics(result: PreferenceLoss, policy_chosen: torch.Tensor, policy_rejected: torch.Tensor) -> torch.Tensor:
    """[B, len(STAT_NAMES)]: each pair's rewards, whether chosen's is higher, the margin and the log-probs."""
    chosen, rejected = result.chosen_rewards, result.rejected_rewards
    return torch.stack([chosen, rejected, (chosen > rejected).float(), chosen - rejected,
                        policy_chosen.detach().float(), policy_rejected.detach().float()], dim=-1)


def dpo_metrics(prediction: EvalPrediction) -> dict[str, float]:
    """Means of the per-pair statistics (the predictions of DPOTrainer.prediction_step)."""
    stats = np.asarray(prediction.predictions, dtype=np.float64).reshape(-1, len(STAT_NAMES))
    return dict(zip(STAT_NAMES, stats.mean(axis=0).tolist()))


class DPOTrainer(PairTrainer):
    """Batches come from data/collator.PreferenceCollator: the chosen sequences, then the rejected
    ones, and a loss mask on the reply tokens; both sides go through the model in one forward (and,
    for the reference, one more without the adapter, without gradients). Logs the loss, the implicit
    rewards and the log-probs; evaluation reports the same as eval_* metrics."""

    # The loss is a mean over the pairs of one batch; the Trainer divides it for gradient accumulation.
    loss_is_scaled_for_ga = False

    def __init__(self, *args: Any, dpo_args: DPOArguments, **kwargs: Any) -> None:
        kwargs.setdefault("compute_metrics", dpo_metrics)
        super().__init__(*args, **kwargs)
        self.dpo_args = dpo_args
        self._train_stats = torch.zeros(len(STAT_NAMES) + 1, dtype=torch.float64)  # the sums, then the pair count

    def _set_signature_columns_if_needed(self) -> None:
        if self._signature_columns is None:
            self._signature_columns = ["chosen_ids", "rejected_ids", "chosen_start", "chosen_end", "rejected_start",
                                       "rejected_end", "length"]

    def reference_logps(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The summed reply log-probs under the reference: the frozen copy of the adapter the run
        started from (REFERENCE_ADAPTER, when it continues one, e.g. the SFT adapter), else the model
        with its adapter disabled (the base)."""
        peft_model = self.accelerator.unwrap_model(model)
        if not hasattr(peft_model, "disable_adapter"):
            raise TypeError(f"loss_type {self.dpo_args.loss_type} needs a LoRA model (the reference is the model "
                            "without its adapter)")
        with torch.no_grad(), reference_weights(peft_model):
            return sequence_logps(model, inputs["input_ids"], inputs["attention_mask"], inputs["loss_mask"])[0]

    def pair_loss(self, model: Any, inputs: dict[str, torch.Tensor]) -> tuple[PreferenceLoss, torch.Tensor]:
        """The loss of a batch and its per-pair statistics (pair_statistics)."""
        logps, lengths = sequence_logps(model, inputs["input_ids"], inputs["attention_mask"], inputs["loss_mask"])
        reference = self.reference_logps(model, inputs) if self.dpo_args.needs_reference else None
        (policy_c, policy_r), (length_c, length_r) = logps.chunk(2), lengths.chunk(2)
        ref_c, ref_r = reference.chunk(2) if reference is not None else (None, None)
        args = self.dpo_args
        result = preference_loss(args.loss_type, policy_c, policy_r, length_c, length_r, ref_c, ref_r,
                                 beta=args.beta, gamma=args.gamma, label_smoothing=args.label_smoothing)
        return result, pair_statistics(result, policy_c, policy_r)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        result, stats = self.pair_loss(model, inputs)
        if model.training:
            with torch.no_grad():
                self._trained_tokens += inputs["loss_mask"].sum().cpu()
                sums = stats.double().sum(0).cpu()
                self._train_stats += torch.cat([sums, torch.tensor([len(stats)], dtype=torch.float64)])
        return (result.loss, stats) if return_outputs else result.loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            *sums, pairs = self.accelerator.reduce(self._train_stats.to(self.accelerator.device),
                                                   reduction="sum").tolist()
            if pairs:
                logs.update({name: total / pairs for name, total in zip(STAT_NAMES, sums)})
            self._train_stats.zero_()
        super().log(logs, start_time)
