"""The GPU memory of an SFT step, computed on any machine (no GPU, no weights): weights, adapter and optimizer
state, activations kept per token (device or pinned host), one layer's backward, the loss, and the longest
conversation that fits --memory_gb. Give the SFT run's own flags (or its run config) and the rows to plan.

    tunesmith plan --model_name_or_path DIR --quantization_bit 4 --packing true --plan_tokens 16384 32768
    tunesmith plan configs/sft_lora_demo.yaml --packing true --memory_gb 24 --gradient_checkpointing offload
"""

from __future__ import annotations

from ..boundary import entry_point
from ..plan.command import run

main = entry_point(run)

__all__ = ["main", "run"]
