"""LoraTrainer: the HF Trainer, plus what a chat fine-tune needs to be checkable afterwards."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Trainer

from ..constants import IGNORE_INDEX
from ..hparams import save_run_config
from .checkpoints import empty_tensors


class LoraTrainer(Trainer):
    """Trains full models and PEFT adapters alike (PEFT's own save writes adapters; the Trainer
    gathers ZeRO-3 shards first). Adds: the count of trained tokens in the logs, the resolved run
    config beside every save, and a refusal to leave a save with empty (ungathered) tensors."""

    def __init__(self, *args: Any, run_configs: tuple = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_configs = run_configs
        self._trained_tokens = torch.zeros((), dtype=torch.long)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if "labels" in inputs:
            self._trained_tokens += (inputs["labels"] != IGNORE_INDEX).sum().cpu()
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            total = self.accelerator.reduce(self._trained_tokens.to(self.accelerator.device), reduction="sum")
            logs["trained_tokens"] = int(total.item())
        super().log(logs, start_time)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        output_dir = output_dir or self.args.output_dir
        super()._save(output_dir, state_dict=state_dict)
        if self.args.should_save:
            if self.run_configs:
                save_run_config(output_dir, *self.run_configs)
            empty = empty_tensors(output_dir)
            if empty:
                raise RuntimeError(
                    f"{output_dir}: saved {len(empty)} empty tensors ({empty[:3]}...): under ZeRO-3 set "
                    "\"stage3_gather_16bit_weights_on_model_save\": true (configs/ds_zero3.json does)"
                )
