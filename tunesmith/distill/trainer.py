"""DistillTrainer: SFT's trainer (batches, packing, checkpoints, resume, trained-token counts, eval perplexity) with
the loss replaced by a divergence from a frozen teacher's distributions over the reply tokens (distill/losses.py).

The teacher's logits are computed per forward, on the very batch the student sees (the same packed row, position
ids and sequence boundaries, so its attention too stays within each conversation), rather than precomputed to disk
as axolotl's offline KD does: a dense [tokens x vocab] distribution is 49152 floats a token for the default model
(about 200 kB, a whole dataset's worth of which outgrows a disk fast), and the top-k logits that make offline KD
fit change the loss, which would no longer equal TRL's; a teacher forward without gradients costs about a third
of the student's step. Offline KD to disk is left out. With --lmbda, a step's batches may hold the student's own
replies instead of the data's (GKD's on-policy mix, distill/on_policy.py).

Under ZeRO-2 every rank holds a whole teacher. Under ZeRO-3 transformers has loaded the teacher sharded, as the
student: it runs in a DeepSpeed inference engine of its own (the run's config, no optimizer; TRL's
prepare_deepspeed), which gathers its weights layer by layer in each forward, and the student's on-policy samples
are generated synced across the ranks, since each of its forwards gathers too."""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import Any

import torch

from ..constants import IGNORE_INDEX
from ..data.packing import FORWARD_SPLITS
from ..distributed import zero3_inference_engine, zero_stage
from ..generation import SamplingParams
from ..generation.rollout_engines import hand_over_weights, rollout_engine
from ..generation.vllm_client import VLLMRollouts
from ..hparams.rollout_args import RolloutEngineArguments
from ..train.stage_trainer import StageTrainer
from .args import DistillArguments
from .losses import cross_entropy, generalized_jsd
from .on_policy import on_policy_batch

logger = logging.getLogger(__name__)

# Batch keys for the loss, never for a model's forward.
TARGET_KEYS = ("labels", "shift_labels")


class DistillTrainer(StageTrainer):
    """Trains the student on loss = mean over reply tokens of [D_beta(teacher, student) + sft_weight * CE], with D
    the --distill_loss divergence at --distill_temperature; the mean is over the optimizer step's reply tokens (all
    processes), as SFT's loss is. Evaluation reports eval_loss and eval_perplexity (the student's SFT loss on the
    held-out replies), eval_kl (KL(teacher || student) per reply token, at temperature 1) and eval_distill_loss (the
    training divergence per reply token)."""

    adds_router_loss = False  # its loss is its own: no router loss, no fused head (train/stage_trainer.py)

    def __init__(self, *args: Any, teacher: torch.nn.Module, distill: DistillArguments,
                 rollout: RolloutEngineArguments | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # compute_loss divides by num_items_in_batch, the step's reply tokens: the Trainer counts them and leaves the
        # loss undivided by the accumulation steps (its rule for a model whose loss takes num_items_in_batch).
        self.model_accepts_loss_kwargs = True
        teacher.eval().requires_grad_(False)
        self.zero3 = self.is_deepspeed_enabled and zero_stage(self.args) == 3
        if self.zero3:  # loaded sharded (deepspeed.zero.Init): an engine of its own gathers it in each forward
            self.teacher = zero3_inference_engine(teacher, self.accelerator.state.deepspeed_plugin.deepspeed_config)
        else:
            self.teacher = teacher
            if not getattr(teacher, "hf_device_map", None):  # a quantized teacher was placed as it loaded
                self.teacher.to(self.args.device)
        self.beta = distill.loss_beta
        self.temperature = distill.distill_temperature
        self.sft_weight = distill.sft_weight
        self.lmbda = distill.lmbda
        # the student's own distribution, at the loss's temperature (as TRL's DistillationTrainer samples)
        self.sampling = SamplingParams(temperature=distill.distill_temperature, top_k=0, top_p=1.0, min_p=0.0,
                                       repetition_penalty=1.0, max_new_tokens=distill.on_policy_max_new_tokens)
        self.on_policy_steps = 0  # of this train() call
        # vLLM (a server, or colocated) for the on-policy replies (--rollout_engine); None: tunesmith's engine
        self.server: VLLMRollouts | None = None
        if self.lmbda and rollout is not None:
            engine = rollout_engine(rollout, self.model, self.processing_class, self.args.output_dir,
                                    synced=self.zero3, dtype=torch.bfloat16 if self.args.bf16 else None)
            self.server = engine if isinstance(engine, VLLMRollouts) else None
        self._server_checked = False
        self._eval_divergences = torch.zeros(2, dtype=torch.float64)  # this evaluation: summed KL, summed divergence

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The step's batches; on an on-policy step (probability --lmbda, drawn from the seed and the step, so every
        rank and a resumed run draw the same) with the student's replies (distill/on_policy.py), and the step's
        reply tokens counted on those."""
        batches, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        if batches and self.lmbda and self.on_policy_step(self.state.global_step):
            params = dataclasses.replace(self.sampling, seed=self.args.seed + self.state.global_step)
            if self.server is not None:
                self.sync_rollout_weights()
            batches = [on_policy_batch(self.model, self.processing_class, batch, params, self.data_collator,
                                       synced=self.zero3, engine=self.server) for batch in batches]
            num_items_in_batch = self._get_num_items_in_batch(batches, device)
            self.on_policy_steps += 1
            if self.zero3:  # the weights ZeRO-3 gathered for sampling (in inference mode, and kept for reuse) are
                # released, so the training forward gathers them again as tensors autograd may save
                self.model_wrapped.empty_partition_cache()
        return batches, num_items_in_batch

    def sync_rollout_weights(self) -> None:
        """Hand the student's weights to the vLLM server when they changed since it last had them (every on-policy
        step after an update), and at the first (the server may hold an earlier run's), checked then against the
        student's (rollout_engines.py)."""
        step = self.state.global_step
        if self._server_checked and self.server.version == step:
            return
        student = self.accelerator.unwrap_model(self.model)
        probe = None if self._server_checked else self.train_dataset[0]["input_ids"][:64]
        dtype = torch.bfloat16 if self.args.bf16 else next(student.parameters()).dtype
        hand_over_weights(self.server, self.accelerator, student, step, probe, dtype)
        self._server_checked = True

    def on_policy_step(self, step: int) -> bool:
        """Whether optimizer step `step` (0-based) trains on the student's samples: GKD's coin of weight lambda."""
        return random.Random(self.args.seed * 1_000_003 + step).random() < self.lmbda

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs.pop(FORWARD_SPLITS, None)
        student, teacher, targets = self.reply_logits(model, inputs)
        divergence = generalized_jsd(student, teacher, self.beta, self.temperature)
        if not model.training:
            return self._evaluation_loss(student, teacher, targets, divergence, return_outputs)
        per_token = divergence + self.sft_weight * cross_entropy(student, targets) if self.sft_weight else divergence
        self._trained_tokens = self._trained_tokens.to(targets.device) + targets.numel()
        if num_items_in_batch is None:
            loss = per_token.sum() / max(targets.numel(), 1)
        else:
            loss = per_token.sum() / num_items_in_batch
            if self.args.average_tokens_across_devices:  # the ranks' gradients are averaged: undo it (as Trainer)
                loss = loss * self.accelerator.num_processes
        return (loss, {"loss": loss}) if return_outputs else loss

    def reply_logits(self, model: torch.nn.Module, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(student logits [K, V], teacher logits [K, V], targets [K]) at the K positions that predict a trained token
        of the batch. A packed row from SFT's collator names them (`logits_to_keep`, `shift_labels`): both models
        compute those logits only. Padded rows: all logits, then the positions whose next label is trained."""
        forward = {k: v for k, v in inputs.items() if k not in TARGET_KEYS}
        student = model(**forward).logits
        with torch.no_grad():
            teacher = self.teacher(**forward).logits
        if "logits_to_keep" in inputs and "shift_labels" in inputs:
            return student[0], teacher[0], inputs["shift_labels"]
        labels = inputs["labels"][..., 1:]  # position t predicts token t + 1
        trained = labels != IGNORE_INDEX
        return student[:, :-1][trained], teacher[:, :-1][trained], labels[trained]

    def _evaluation_loss(self, student, teacher, targets, divergence, return_outputs):
        """The batch's mean SFT loss; its sums (and the KL and divergence sums) added to the evaluation's totals."""
        with torch.no_grad():
            sft = cross_entropy(student, targets)
            kl = generalized_jsd(student, teacher, 0.0, 1.0)
        tokens = targets.numel()
        self._eval_totals += torch.tensor([sft.double().sum().item(), tokens], dtype=torch.float64)
        self._eval_divergences += torch.tensor([kl.double().sum().item(), divergence.double().sum().item()],
                                               dtype=torch.float64)
        loss = sft.sum() / max(tokens, 1)
        return (loss, {"loss": loss}) if return_outputs else loss

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):
        self._eval_divergences.zero_()
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        sums = self.accelerator.reduce(torch.cat([self._eval_divergences, self._eval_totals[1:]]).to(self.accelerator.device),
                                       reduction="sum").tolist()
        kl, divergence, tokens = sums
        if tokens:
            output.metrics[f"{metric_key_prefix}_kl"] = kl / tokens
            output.metrics[f"{metric_key_prefix}_distill_loss"] = divergence / tokens
        return output
