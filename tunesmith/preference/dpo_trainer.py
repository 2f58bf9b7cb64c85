"""DPO training: a Trainer whose loss (dpo_loss.py) asks the policy to prefer the chosen reply
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
from datasets import Dataset
from transformers import EvalPrediction

from ..constants import IGNORE_INDEX
from ..data.image_encoding import model_inputs
from .args import DPOArguments
from .dpo_loss import PreferenceLoss, preference_loss
from .pair_trainer import PairTrainer

# Per-pair statistics, summed over the pairs seen since the last log; their means are logged (with the
# eval_ prefix in evaluation). accuracy and margin are named as the reward model's are.
STAT_NAMES = ("rewards/chosen", "rewards/rejected", "accuracy", "margin", "logps/chosen", "logps/rejected")


# The model's own inputs in a PreferencePackingCollator batch (the rest is for the loss).
MODEL_INPUTS = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
                "use_cache", "logits_to_keep")


def sequence_logps(model: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence of a packed batch (data/collator.PreferencePackingCollator): the log-prob of its
    reply tokens, summed (float32), and how many there are. The model returns logits only at the
    positions that predict a reply token, flattened; each is scored against its target and summed into
    its sequence. A vision-language model's batch (data/image_encoding.ImagePairCollator) is padded rows
    with their pictures: padded_sequence_logps."""
    if "labels" in batch:
        return padded_sequence_logps(model, batch)
    logits = model(**{key: batch[key] for key in MODEL_INPUTS}).logits
    logits = logits.reshape(-1, logits.shape[-1]).float()
    picked = logits.gather(-1, batch["reply_targets"][:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    sequences = batch["cu_seq_lens_q"].numel() - 1
    index = batch["reply_index"]
    summed = torch.zeros(sequences, dtype=picked.dtype, device=picked.device).index_add(0, index, picked)
    return summed, torch.bincount(index, minlength=sequences)


def padded_sequence_logps(model: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """sequence_logps of padded rows whose `labels` hold the reply tokens (IGNORE_INDEX elsewhere): the model
    takes every input of the batch (pixel values, image grids, token types, ...), and only the logits that
    predict a reply token are scored."""
    logits = model(**model_inputs(batch)).logits
    targets = batch["labels"][:, 1:]
    trained = targets != IGNORE_INDEX
    picked = logits[:, :-1][trained].float()
    scores = picked.gather(-1, targets[trained][:, None]).squeeze(-1) - torch.logsumexp(picked, dim=-1)
    rows = trained.nonzero()[:, 0]
    sequences = targets.shape[0]
    return (torch.zeros(sequences, dtype=scores.dtype, device=scores.device).index_add(0, rows, scores),
            trained.sum(-1))


def reply_token_count(batch: dict[str, Any]) -> int:
    """How many reply tokens a batch of either kind (packed or padded) scores."""
    if "labels" in batch:
        return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
    return len(batch["reply_targets"])


REFERENCE_ADAPTER = "reference"
# The dataset columns of precomputed reference log-probs (DPOTrainer.precompute_reference).
REFERENCE_COLUMNS = ("reference_chosen_logps", "reference_rejected_logps")


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
    """Batches come from data/collator.PreferencePackingCollator: the chosen and the rejected sequences
    of a batch in one padding-free row, so both sides go through the model in one forward, with logits
    only where a reply token is predicted. The reference is, in this order: log-probs precomputed in one
    pass before training (`precompute_reference`), a frozen `reference_model` (full fine-tuning), the
    frozen adapter the run continues (REFERENCE_ADAPTER), or the model with its adapter disabled; each
    but the first costs one more forward per step, without gradients. Logs the loss, the implicit
    rewards and the log-probs; evaluation reports the same as eval_* metrics."""

    # The loss is a mean over the pairs of one batch; the Trainer divides it for gradient accumulation.
    loss_is_scaled_for_ga = False
    adds_router_loss = False  # the preference loss alone (no MoE router loss: --router_aux_loss_coef is SFT's)

    def __init__(self, *args: Any, dpo_args: DPOArguments, reference_model: Any = None, **kwargs: Any) -> None:
        kwargs.setdefault("compute_metrics", dpo_metrics)
        super().__init__(*args, **kwargs)
        self.dpo_args = dpo_args
        self.reference_model = reference_model
        if reference_model is not None:
            reference_model.eval().requires_grad_(False).to(self.args.device)
        self._train_stats = torch.zeros(len(STAT_NAMES) + 1, dtype=torch.float64)  # the sums, then the pair count

    def _set_signature_columns_if_needed(self) -> None:
        if self._signature_columns is None:
            self._signature_columns = ["chosen_ids", "rejected_ids", "chosen_start", "chosen_end", "rejected_start",
                                       "rejected_end", "length", *REFERENCE_COLUMNS,
                                       "chosen_text", "rejected_text", "images"]  # a vision-language model's

    @torch.no_grad()
    def reference_logps(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        """The summed reply log-probs of each sequence under the reference (see the class docstring)."""
        if "reference_logps" in inputs:
            return inputs["reference_logps"]
        if self.reference_model is not None:
            return sequence_logps(self.reference_model, inputs)[0]
        peft_model = self.accelerator.unwrap_model(model)
        if not hasattr(peft_model, "disable_adapter"):
            raise TypeError(f"loss_type {self.dpo_args.loss_type} needs a reference: a LoRA model, a reference_model "
                            "or precomputed reference log-probs")
        with reference_weights(peft_model):
            return sequence_logps(model, inputs)[0]

    @torch.no_grad()
    def precompute_reference(self, dataset: Dataset) -> Dataset:
        """`dataset` with the reference log-probs of every pair as two more columns, from one pass of
        the model as it is now (before training: for full fine-tuning that is the reference itself).
        Each rank scores every world_size-th pair and the ranks exchange their results."""
        model = self.model
        is_peft = hasattr(model, "disable_adapter")
        was_training = model.training
        model.eval()
        rank, world = self.args.process_index, self.args.world_size
        mine: dict[int, tuple[float, float]] = {}
        indices = list(range(rank, len(dataset), world))
        batch_size = self.args.per_device_eval_batch_size
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            batch = self._prepare_inputs(self.data_collator([dataset[i] for i in chunk]))
            logps = self.reference_logps(model, batch) if is_peft else sequence_logps(model, batch)[0]
            chosen, rejected = logps.float().cpu().chunk(2)
            mine.update(zip(chunk, zip(chosen.tolist(), rejected.tolist())))
        model.train(was_training)
        found = mine
        if world > 1:
            gathered: list[Any] = [None] * world
            torch.distributed.all_gather_object(gathered, mine)
            found = {i: v for part in gathered for i, v in part.items()}
        dataset = dataset.add_column(REFERENCE_COLUMNS[0], [found[i][0] for i in range(len(dataset))])
        return dataset.add_column(REFERENCE_COLUMNS[1], [found[i][1] for i in range(len(dataset))])

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        # PEFT saves every adapter a model holds; the frozen reference is the adapter the run started from
        # (the recipe loads it again on resume), not part of what this run made. Hidden from the save only.
        peft_config = getattr(self.accelerator.unwrap_model(self.model), "peft_config", {})
        reference = peft_config.pop(REFERENCE_ADAPTER, None)
        try:
            super()._save(output_dir, state_dict=state_dict)
        finally:
            if reference is not None:
                peft_config[REFERENCE_ADAPTER] = reference

    def train(self, *args: Any, **kwargs: Any) -> Any:
        if self.dpo_args.precompute_ref_logps and self.dpo_args.needs_reference:
            self.train_dataset = self.precompute_reference(self.train_dataset)
            if self.eval_dataset is not None:
                self.eval_dataset = self.precompute_reference(self.eval_dataset)
        return super().train(*args, **kwargs)

    def pair_loss(self, model: Any, inputs: dict[str, torch.Tensor]) -> tuple[PreferenceLoss, torch.Tensor]:
        """The loss of a batch and its per-pair statistics (pair_statistics)."""
        logps, lengths = sequence_logps(model, inputs)
        reference = self.reference_logps(model, inputs) if self.dpo_args.needs_reference else None
        (policy_c, policy_r), (length_c, length_r) = logps.chunk(2), lengths.chunk(2)
        ref_c, ref_r = reference.chunk(2) if reference is not None else (None, None)
        args = self.dpo_args
        result = preference_loss(args.loss_type, policy_c, policy_r, length_c, length_r, ref_c, ref_r,
                                 beta=args.beta, gamma=args.simpo_gamma, label_smoothing=args.label_smoothing)
        return result, pair_statistics(result, policy_c, policy_r)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        result, stats = self.pair_loss(model, inputs)
        if model.training:
            with torch.no_grad():
                self._trained_tokens += reply_token_count(inputs)
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
