"""StageTrainer: the HF Trainer, plus what a chat fine-tune needs to be checkable afterwards."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel, Trainer
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

from ..constants import CPU_FORWARD_TOKENS, IGNORE_INDEX
from ..data.collator import PackingCollator, PaddingCollator
from ..data.image_encoding import ImageConversationCollator, ImagePackingCollator
from ..data.packing import FORWARD_SPLITS, SIZED_BY_FREE_MEMORY, slice_packed_row
from ..data.streaming import StreamedExamples
from ..data.template import processor_of
from ..distributed import fsdp_requested, shard_cpu_ranks_with_fsdp
from ..hparams import save_run_config
from ..models.attention import use_varlen_attention
from ..models.prompt_learning import save_encoder
from ..models.tiled_mlp import use_tiled_mlp
from ..models.vision import mrope_index
from ..utils.hardware import trains_on_cpu
from .callbacks import OffloadOnSideStream, PromptEncoderLoader
from .checkpoints import empty_tensors, read_state
from .forward_budget import ForwardBudget
from .head_loss import FUSED_HEAD, install_fused_head, wants_fused_head
from .layer_modes import LayerModes, checkpointed_layers, set_layer_modes
from .lifecycle import stage_callbacks
from .losses import use_chunked_loss
from .param_groups import split_lora_groups
from .router_loss import OUTPUT_ROUTER_LOGITS, routed_tokens, router_loss_for
from .sequence_parallel import (
    gradient_divisor,
    parallelism_config,
    resume_epoch_arguments,
    shard_loss,
    step_token_count,
    use_packed_row_shards,
)
from .streamed import load_stream_state, save_stream_state, streamed_dataloader

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def train_returns_when_training(model: torch.nn.Module, modules: list[torch.nn.Module]):
    """Within the block, model.train() does nothing when it would change nothing (every one of `modules` is
    already in training mode); model.train(False) and any other call run as ever."""
    full_train = model.train

    def train(mode: bool = True) -> torch.nn.Module:
        if mode and all(module.training for module in modules):
            return model
        return full_train(mode)

    model.train = train
    try:
        yield
    finally:
        del model.train


class StageTrainer(Trainer):
    """The Trainer every Trainer stage runs on (SFT and continued pre-training as it is; distillation, the reward
    model and DPO/KTO as subclasses that override only their loss). Trains full models and PEFT adapters alike (PEFT's own save writes adapters; the Trainer
    gathers ZeRO-3 shards, or FSDP2's full state dict, first; FSDP2 runs on CPU ranks too). Adds: the count of trained tokens in the logs (continued across a
    resume), eval_loss per predicted token and eval_perplexity (evaluation_loop), the resolved run config
    beside every save, and a refusal to leave a save with empty (ungathered) tensors."""

    # Its compute_loss adds a mixture-of-experts model's router loss (train/router_loss.py), and runs a long forward's
    # loss from the hidden states (train/head_loss.py); a stage whose compute_loss computes a loss of its own sets
    # False, and its MoE runs train without one.
    adds_router_loss = True

    def __init__(self, *args: Any, run_configs: tuple = (), lora_learning_rate: float | None = None,
                 router_aux_loss_coef: float | None = None, loraplus_lr_ratio: float | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lora_learning_rate = lora_learning_rate
        self.loraplus_lr_ratio = loraplus_lr_ratio
        # None for a model without one
        self.router_loss = router_loss_for(self.model, router_aux_loss_coef) if self.adds_router_loss else None
        self._step_tokens: torch.Tensor | int = 0  # routed tokens of this optimizer step's batches, this process
        self._aux_in_step = torch.zeros(())  # the aux terms added in this training_step (left out of its loss)
        self._aux_summed, self._aux_steps = torch.zeros(()), 0  # since the last log: per-step aux losses, steps
        for callback in stage_callbacks():  # every Trainer stage keeps output_dir/metrics.jsonl (train/lifecycle.py)
            self.add_callback(callback)
        self._encoder_loader = PromptEncoderLoader()  # a p-tuning adapter's encoder, on a resume
        self.add_callback(self._encoder_loader)
        # set on a GPU only (hparams); transformers before 5.20 has no such argument
        if (getattr(self.args, "activation_checkpointing_kwargs", None) or {}).get("offload"):
            self.add_callback(OffloadOnSideStream())
        if trains_on_cpu(self.args):
            use_chunked_loss(self.model)  # measured on CPU only (docs/benchmark.md)
        # a long forward's loss from the hidden states, its logits never held (train/head_loss.py); 0: not used. Not
        # where the head's weight is sharded (ZeRO-3, FSDP): the tiles read it outside the head's own forward.
        self._fused_head_vocab = 0
        sharded = self.is_fsdp_enabled or is_deepspeed_zero3_enabled()
        if self.adds_router_loss and not sharded and install_fused_head(self.model):  # SFT's own loss
            self._fused_head_vocab = self.model.get_output_embeddings().weight.shape[0]
        use_tiled_mlp(self.model, self.args)  # --tiled_mlp: each layer's MLP over chunks of the row
        self.run_configs = run_configs
        self.sequence_parallel_size = getattr(self.args, "sequence_parallel_size", 1)
        self._gradient_divisor = 1  # under sequence parallelism: train/sequence_parallel.gradient_divisor
        if self.sequence_parallel_size > 1:  # train/sequence_parallel.py
            use_packed_row_shards(self.accelerator, getattr(self.data_collator, "trained_logits_only", True))
            self.loss_is_scaled_for_ga = True  # shard_loss divides by the step's trained tokens
            self._gradient_divisor = gradient_divisor(self.accelerator.state.deepspeed_plugin.deepspeed_config,
                                                      self.args.world_size, self.sequence_parallel_size)
        self._trained_tokens = torch.zeros((), dtype=torch.long)  # this process, this train() call
        self._tokens_before = 0  # all processes, up to the resumed checkpoint
        self._eval_totals = torch.zeros(2, dtype=torch.float64)  # this process, this evaluation: summed loss, tokens
        self._modules_of: tuple[torch.nn.Module | None, list[torch.nn.Module]] = (None, [])  # _train_mode_kept's
        self._flops_per_token: int | None = None  # floating_point_ops's parameter count, taken once
        self._forward_budget: ForwardBudget | None = None  # a GPU run's forward size (train/forward_budget.py)

    def create_accelerator_and_postprocess(self) -> None:
        size = getattr(self.args, "sequence_parallel_size", 1)
        if size > 1:  # for accelerate only: the arguments (and the run config saved from them) stay as parsed
            self.args.parallelism_config = parallelism_config(size, self.model)
        try:
            super().create_accelerator_and_postprocess()
        finally:
            if size > 1:
                self.args.parallelism_config = None
        if fsdp_requested(self.args) and not self.is_fsdp_enabled:
            shard_cpu_ranks_with_fsdp(self.accelerator, self.args.fsdp_plugin_args)
            self.is_fsdp_enabled = self.accelerator.is_fsdp2
        if self.is_fsdp_enabled:
            plugin = self.accelerator.state.fsdp_plugin
            logger.info("FSDP%d (fully_shard) on %d process(es), state dict %s", plugin.fsdp_version,
                        self.accelerator.num_processes, plugin.state_dict_type.name)

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any):
        self._trained_tokens.zero_()
        self._aux_summed, self._aux_steps = torch.zeros(()), 0
        self._tokens_before = 0
        self._encoder_loader.checkpoint = resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None
        if isinstance(resume_from_checkpoint, str):
            self._tokens_before = trained_tokens_at(resume_from_checkpoint)
            if self.streamed:
                load_stream_state(self, resume_from_checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    @property
    def streamed(self) -> bool:
        """--streaming: the training examples come from data/streaming.py's stream (train/streamed.py)."""
        return isinstance(self.train_dataset, StreamedExamples)

    def get_train_dataloader(self):
        return streamed_dataloader(self) if self.streamed else super().get_train_dataloader()

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        if self.streamed:  # where the stream is, beside the random state: a resume continues there
            save_stream_state(self, output_dir)

    def _run_epoch(self, *args: Any, **kwargs: Any) -> None:
        # transformers takes a step before it checks max_steps: a run resumed from its last checkpoint
        # (the same command run again) would train one step past its end.
        if self.state.global_step >= self.state.max_steps:
            logger.info("step %d of %d: nothing left to train (raise --max_steps to train further)",
                        self.state.global_step, self.state.max_steps)
            self.control.should_training_stop = True
            return
        if self.sequence_parallel_size > 1:
            kwargs = resume_epoch_arguments(kwargs)
        if self.streamed:  # the stream is where the run stopped (train/streamed.py): nothing to skip, random state loaded
            kwargs["steps_trained_in_current_epoch"] = 0
        super()._run_epoch(*args, **kwargs)

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        if self.lora_learning_rate is not None or self.loraplus_lr_ratio is not None:
            # transformers' decay/no-decay groups, each split LoRA (A, and LoRA+'s B)/other
            optimizer.param_groups[:] = split_lora_groups(optimizer.param_groups, self.model if model is None else model,
                                                          self.args.learning_rate, self.lora_learning_rate,
                                                          self.loraplus_lr_ratio)
        return optimizer

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.sequence_parallel_size > 1 and batches:
            num_items_in_batch = step_token_count(batches, self.accelerator)
        if self.router_loss is not None and self.router_loss.active and batches:
            # each forward's aux loss is weighed by its share of the step's tokens (train/router_loss.py)
            self._step_tokens = sum(routed_tokens(batch) for batch in batches)
            self._aux_steps += 1
        return batches, num_items_in_batch

    def training_step(self, model, inputs, num_items_in_batch=None):
        """The loss it returns (which the Trainer logs) is the language-model loss; the router's aux loss, in the
        objective, is logged apart (train/router_loss.py). Under sequence parallelism each rank's loss is its
        shard's part of the gradient (train/sequence_parallel.shard_loss); the Trainer logs the ranks' mean, so
        the part is scaled to the row's loss there."""
        if self.sequence_parallel_size > 1:
            loss = self._training_step_parts(model, inputs, num_items_in_batch)
            return loss * (self.args.world_size / self._gradient_divisor)
        if self.router_loss is None or not self.router_loss.active:
            return self._training_step_parts(model, inputs, num_items_in_batch)
        self._aux_in_step = torch.zeros(())
        loss = self._training_step_parts(model, inputs, num_items_in_batch)
        return loss - self._aux_in_step.to(loss.device)

    def _training_step_parts(self, model, inputs, num_items_in_batch=None):
        """A packed row with `forward_splits` runs as several forward/backward passes of whole examples
        before the optimizer step. Each part's loss is its summed token losses over the whole batch's
        num_items_in_batch, so the gradients add up to the one-forward gradients; only the last part
        synchronizes gradients across processes (DDP), whatever the number of parts on each. A row whose forwards
        the free GPU memory sizes is cut by the run's ForwardBudget, which measures the first step's forwards."""
        with self._train_mode_kept(model):
            splits, budget = inputs.pop(FORWARD_SPLITS, None), None
            if splits != SIZED_BY_FREE_MEMORY and getattr(self.args, "checkpointing_by_budget", False):
                self._layers_without_budget()
            if splits == SIZED_BY_FREE_MEMORY:
                budget = self._forward_budget_on_cuda()
                if budget is not None and budget.layers and budget.rates is None:
                    self._probe_layer_rates(model, inputs, num_items_in_batch, budget)
                optimizer_ready = bool(self.optimizer is None or self.optimizer.state)
                splits = (budget.splits(inputs, optimizer_ready) or [0, inputs["input_ids"].shape[-1]]) \
                    if budget else None
            if not splits or (len(splits) <= 2 and budget is None):
                return super().training_step(model, inputs, num_items_in_batch)
            parts = list(zip(splits[:-1], splits[1:]))
            total = None
            for i, (start, end) in enumerate(parts):
                part = inputs if len(parts) == 1 else slice_packed_row(inputs, start, end)
                sync = contextlib.nullcontext() if i == len(parts) - 1 else self.accelerator.no_sync(model)
                with sync:
                    if budget is not None:
                        budget.prepare(end - start)
                    step = functools.partial(super().training_step, model, part, num_items_in_batch)
                    loss = step() if budget is None else budget.measure(end - start, step)
                total = loss if total is None else total + loss
            return total

    def _forward_budget_on_cuda(self) -> ForwardBudget | None:
        """The run's forward budget; None off CUDA (rows sized by the free memory then run whole). With
        --gradient_checkpointing left out it chooses each forward's layer modes too (train/layer_modes.py)."""
        if self._forward_budget is None and self.args.device.type == "cuda":
            by_budget = getattr(self.args, "checkpointing_by_budget", False)
            self._forward_budget = ForwardBudget(self.args.device, checkpointed_layers(self.model) if by_budget else None,
                                                 self._fused_head_vocab)
        return self._forward_budget

    def _layers_without_budget(self) -> None:
        """--gradient_checkpointing left out, on rows the budget does not size (a vision-language model's, which run
        whole): the rule before the budget, once: a quantized base recomputes every layer, others keep theirs."""
        self.args.checkpointing_by_budget = False
        if not (getattr(self.model, "is_loaded_in_4bit", False) or getattr(self.model, "is_loaded_in_8bit", False)):
            layers = checkpointed_layers(self.model)
            set_layer_modes(layers, LayerModes(len(layers), 0, 0), self.args.device.type)

    def _probe_layer_rates(self, model, inputs, num_items_in_batch, budget: ForwardBudget) -> None:
        """budget.probe on this row before its step, leaving the run as it was: the gradients of an accumulation
        in progress, the trained-token and aux-loss counters, and the random state (dropout) of a resumed run."""
        trained = [p for p in self.model.parameters() if p.requires_grad]
        grads = [p.grad for p in trained]
        counters = (self._trained_tokens.clone(), self._aux_in_step.clone(), self._aux_summed.clone())
        step = functools.partial(super().training_step, model)
        with torch.random.fork_rng(devices=[self.args.device]), self.accelerator.no_sync(model):
            budget.probe(inputs, lambda part: step(part, num_items_in_batch), trained)
        for parameter, grad in zip(trained, grads):
            parameter.grad = grad
        self._trained_tokens, self._aux_in_step, self._aux_summed = counters

    def _train_mode_kept(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The Trainer calls model.train() at every training step, and nn.Module.train sets the flag of every
        module through Module.__setattr__: 3 ms a step for a 16-layer PEFT model on this CPU, host time a GPU
        waits on at small batches (docs/benchmark.md). While a step runs, train() returns at once if every
        module is already training (reading the flags: 0.07 ms); after an evaluation, or anything else that
        left a module in eval mode, the full train() runs. Only for the model itself: wrappers (DeepSpeed,
        FSDP, DDP) keep their own train()."""
        if model is not self.model:
            return contextlib.nullcontext()
        if self._modules_of[0] is not model:
            self._modules_of = (model, list(model.modules()))
        return train_returns_when_training(model, self._modules_of[1])

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """transformers' estimate for the logged total_flos (6 x input tokens x parameters without embeddings),
        with the parameters counted once: the Trainer recounts them at every step by walking every module (2.3 ms a
        step for a 16-layer PEFT model on this CPU). The count does not change while a run trains."""
        main = getattr(self.model, "main_input_name", "input_ids")
        if main not in inputs:
            return super().floating_point_ops(inputs)
        if self._flops_per_token is None:
            self._flops_per_token = super().floating_point_ops({main: torch.empty(1, 1)})
        return self._flops_per_token * inputs[main].numel()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs.pop(FORWARD_SPLITS, None)  # evaluation runs a batch in one forward: no backward to free
        if self.router_loss is not None:  # eval_loss is the language-model loss alone, whatever the config says
            inputs[OUTPUT_ROUTER_LOGITS] = model.training and self.router_loss.active
        if not model.training:
            return self.evaluation_loss(model, inputs, return_outputs)
        if self.sequence_parallel_size > 1:  # a shard of a row: its targets are shift_labels
            self._trained_tokens = self._trained_tokens.to(inputs["shift_labels"].device) + \
                (inputs["shift_labels"] != IGNORE_INDEX).sum()
            return shard_loss(model, inputs, num_items_in_batch, self._gradient_divisor, return_outputs)
        if "labels" in inputs:  # counted where the labels are: no host-device sync per step
            count = (inputs["labels"] != IGNORE_INDEX).sum()
            self._trained_tokens = self._trained_tokens.to(count.device) + count
        if not inputs.get(OUTPUT_ROUTER_LOGITS):
            if self._fused_head_vocab and wants_fused_head(inputs, self._fused_head_vocab):
                inputs[FUSED_HEAD] = True
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        return self._loss_with_router_loss(model, inputs, return_outputs, num_items_in_batch)

    def _loss_with_router_loss(self, model, inputs, return_outputs, num_items_in_batch):
        """The loss plus the forward's share of the router's aux loss (train/router_loss.py). Where the Trainer
        divides a forward's loss by the accumulation steps (a loss not normalised over the step), the term is
        multiplied by them first, so it reaches the gradients with its share as it is."""
        share = routed_tokens(inputs) / self._step_tokens if self._step_tokens else 1.0
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        term, aux = self.router_loss.term(outputs, share)
        # kept where the loss is: no host-device sync per forward
        self._aux_summed = self._aux_summed.to(aux.device) + aux.float()
        self._aux_in_step = self._aux_in_step.to(term.device) + term.detach().float()
        if not self._loss_scaled_for_accumulation(num_items_in_batch):
            term = term * self.current_gradient_accumulation_steps
        loss = loss + term.to(loss.device)
        return (loss, outputs) if return_outputs else loss

    def _loss_scaled_for_accumulation(self, num_items_in_batch) -> bool:
        """Whether training_step leaves the loss as it is (normalised over the step by num_items_in_batch) rather
        than divide it by the accumulation steps: transformers' own rule."""
        scaled = getattr(self, "loss_is_scaled_for_ga", None)
        if scaled is not None:
            return scaled
        return bool(self.model_accepts_loss_kwargs and num_items_in_batch is not None) or self.compute_loss_func is not None

    def evaluation_loss(self, model, inputs, return_outputs=False):
        """An evaluation batch's mean loss over its predicted tokens; their summed loss and count are added to
        the totals that evaluation_loop turns into eval_loss and eval_perplexity."""
        targets = predicted_targets(inputs)  # before the loss: label smoothing pops the labels
        result = super().compute_loss(model, inputs, return_outputs=return_outputs)  # this batch's own mean
        if targets is not None:
            loss = result[0] if return_outputs else result
            tokens = (targets != IGNORE_INDEX).sum()
            self._eval_totals += torch.stack([loss.detach().double() * tokens, tokens.double()]).cpu()
        return result

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):
        """transformers' eval_loss is the mean of the batches' mean losses, which weighs a token of a short batch
        more than one of a long batch. Here eval_loss is the mean loss per predicted token over the whole
        evaluation set (all processes), and eval_perplexity its exp, in the same log record: a model's
        perplexity on a set does not depend on the batch size or on packing. (Across processes, the examples
        that pad the last batches to equal sizes are counted again, as they are in transformers' own losses.)"""
        self._eval_totals.zero_()
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        summed, tokens = self.accelerator.reduce(self._eval_totals.to(self.accelerator.device), reduction="sum").tolist()
        if tokens:
            loss = summed / tokens
            output.metrics[f"{metric_key_prefix}_loss"] = loss
            output.metrics[f"{metric_key_prefix}_perplexity"] = math.exp(loss) if loss < 700 else math.inf
        return output

    def trained_tokens(self) -> int:
        """Label tokens trained on so far, over all processes (a collective: every process calls it)."""
        total = self.accelerator.reduce(self._trained_tokens.to(self.accelerator.device), reduction="sum")
        return self._tokens_before + int(total.item())

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            logs["trained_tokens"] = self.trained_tokens()
            if self.router_loss is not None and self.router_loss.active:
                logs["aux_loss"] = self.logged_aux_loss()
        super().log(logs, start_time)

    def logged_aux_loss(self) -> float:
        """The router's aux loss per optimizer step since the last log, averaged over the steps and processes as
        `loss` is (a collective: every process calls it); the count starts again."""
        mean = self._aux_summed.to(self.accelerator.device) / max(self._aux_steps, 1)
        self._aux_summed, self._aux_steps = torch.zeros(()), 0
        return self.accelerator.reduce(mean, reduction="mean").item()

    def _save_checkpoint(self, model, trial) -> None:
        # A resume continues the count from the checkpoint's log history: record it there at the
        # checkpoint's own step when logging_steps did not just do so.
        step = self.state.global_step
        tokens = self.trained_tokens()
        if trained_tokens_logged(self.state.log_history, step) != (step, tokens):
            self.state.log_history.append({"step": step, "trained_tokens": tokens})
        super()._save_checkpoint(model, trial)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        output_dir = output_dir or self.args.output_dir
        if state_dict is not None:  # gathered (FSDP2's full state dict, ZeRO-3's): tied weights are copies there
            state_dict = without_tied_copies(self.accelerator.unwrap_model(self.model), state_dict)
        super()._save(output_dir, state_dict=state_dict)
        if self.args.should_save:
            save_encoder(self.accelerator.unwrap_model(self.model), output_dir)
            if self.run_configs:
                save_run_config(output_dir, *self.run_configs)
            empty = empty_tensors(output_dir)
            if empty:
                raise RuntimeError(
                    f"{output_dir}: saved {len(empty)} empty tensors ({empty[:3]}...): under ZeRO-3 set "
                    "\"stage3_gather_16bit_weights_on_model_save\": true (configs/ds_zero3.json does)"
                )


def without_tied_copies(model: torch.nn.Module, state_dict: dict) -> dict:
    """A full model's gathered state dict without the second copy of each tied weight (a head tied to the
    embeddings): transformers' save drops a tied key only where the two tensors share storage, which a gathered state
    dict's copies do not, so the file held the embeddings twice (a reload ties them again, so only the size showed).
    A key is dropped only where its tensor equals its source's; an adapter's state dict is returned as it is."""
    if not isinstance(model, PreTrainedModel):
        return state_dict
    tied = model.get_expanded_tied_weights_keys(all_submodels=True)  # {copy: source}, empty where the config unties
    copies = {name for name, source in tied.items() if name in state_dict and source in state_dict
              and torch.equal(state_dict[name], state_dict[source])}
    return {name: tensor for name, tensor in state_dict.items() if name not in copies}


def predicted_targets(inputs: dict[str, Any]) -> torch.Tensor | None:
    """The targets a causal-LM loss scores in a batch (IGNORE_INDEX where none): `shift_labels` where the
    packing collator gives them, else each label but a row's first (no token predicts it)."""
    if "shift_labels" in inputs:
        return inputs["shift_labels"]
    return inputs["labels"][..., 1:] if "labels" in inputs else None


def trained_tokens_logged(log_history: list[dict], up_to_step: int) -> tuple[int, int]:
    """(step, trained_tokens) of the last record of the count at or before up_to_step; (0, 0) if none."""
    for record in reversed(log_history):
        if "trained_tokens" in record and record.get("step", 0) <= up_to_step:
            return record.get("step", 0), int(record["trained_tokens"])
    return 0, 0


def trained_tokens_at(checkpoint: str) -> int:
    """The trained-token count of a checkpoint, from its log history."""
    state = read_state(checkpoint)
    return trained_tokens_logged(state.get("log_history", []), int(state.get("global_step", 0)))[1]


def sft_collator(model: torch.nn.Module, tokenizer: Any, data_args: Any, training_args: Any) -> Callable:
    """The collator an SFT run batches with: padded rows (a vision-language model's through its processor), or
    with --packing one padding-free row per batch (and the model's sdpa attention switched to sdpa_varlen), split
    into forwards of at most
    --max_forward_tokens. Logits are kept for trained positions only unless something else reads the
    full logits (label smoothing) or computes the loss from hidden states itself (Liger's fused linear
    cross-entropy)."""
    processor = processor_of(tokenizer)
    if processor is not None and not data_args.packing:  # a vision-language model: its processor makes the batches
        return ImageConversationCollator(processor, data_args.max_image_pixels)
    if not data_args.packing:
        return PaddingCollator(tokenizer.pad_token_id)
    use_varlen_attention(model)
    full_logits = training_args.use_liger_kernel or training_args.label_smoothing_factor != 0
    if processor is not None:  # the families the rules let pack (families.py: the entries `packable`)
        return ImagePackingCollator(processor, data_args.max_image_pixels, trained_logits_only=not full_logits,
                                    rope_index=mrope_index(model))
    max_forward_tokens = data_args.max_forward_tokens
    if max_forward_tokens is None and training_args.deepspeed:  # DeepSpeed steps at every backward: one forward
        max_forward_tokens = 0
    elif max_forward_tokens is None and trains_on_cpu(training_args):
        max_forward_tokens = CPU_FORWARD_TOKENS
    # else None: on a GPU, the trainer sizes forwards from the free memory (train/forward_budget.py)
    return PackingCollator(trained_logits_only=not full_logits, max_forward_tokens=max_forward_tokens)
