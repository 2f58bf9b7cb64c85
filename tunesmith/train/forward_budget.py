"""How many tokens one forward/backward of a packed row holds on a GPU when --max_forward_tokens is not given.

A packed step runs as one forward where it fits: each forward reads every weight and launches every kernel, so fewer
forwards are faster. But a step's tokens vary with its conversations, and the largest step decides whether a run
runs out of memory. So the first step is measured: it runs as forwards of at most PROBE_TOKENS whole conversations,
and the peak memory each forward adds over what was allocated before it, per token, gives the model's bytes per token
in this run (its checkpointing, head and precision included). At the second step, when the optimizer's state exists,
the free memory (the device's, plus what torch's allocator holds unused) over that rate, less HEADROOM, is the most a
forward may hold from then on, logged once:

    forwards of at most 123456 tokens (free memory 61.2 GB, about 0.41 MB a token)

A step longer than that runs as several forwards of whole conversations before its one optimizer step, with the same
gradients (LoraTrainer._training_step_parts); a step that fits stays one forward. A single conversation longer than
the limit still runs as one forward, and is what --gradient_checkpointing (offload) and --max_seq_length are for.

The measurement restarts torch's peak-memory statistics at the first forward (the only way to read one forward's
peak), so a peak read after a run leaves out model loading."""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..data.packing import forward_splits

logger = logging.getLogger(__name__)

PROBE_TOKENS = 2048  # the first step's forwards: small enough to fit wherever the model trains at all
HEADROOM = 0.15  # of the free memory, left for fragmentation and the memory a longer row needs beyond its tokens'


class ForwardBudget:
    """The forward size of a run on one CUDA device: `splits(batch)` cuts a packed row, `measure(tokens, run)` wraps
    each forward of the first step."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bytes_per_token: float | None = None  # the largest of the first step's forwards' rates
        self.limit: int | None = None  # tokens a forward may hold, from the second step on
        self.probing = True
        self.warned = False  # about a conversation longer than the limit, once

    def splits(self, batch: dict[str, Any]) -> list[int] | None:
        """Offsets cutting this packed row into forwards of whole conversations, or None for one forward."""
        bounds = batch["cu_seq_lens_q"].tolist()
        lengths = [b - a for a, b in zip(bounds, bounds[1:])]
        if self.bytes_per_token is not None and self.probing:
            self.probing = False
            self.limit = self._limit_from_free_memory()
        cap = PROBE_TOKENS if self.probing else self.limit
        if not self.probing and not self.warned and max(lengths) > cap:
            self.warned = True
            logger.warning("a conversation of %d tokens is longer than the forwards this GPU holds (%d tokens): it runs "
                           "as one forward and may run out of memory; --gradient_checkpointing true (or offload) "
                           "lowers the memory a token takes", max(lengths), cap)
        if sum(lengths) <= cap:
            return None
        return forward_splits(lengths, cap)

    def measure(self, tokens: int, run: Any) -> Any:
        """run() (one forward and backward of `tokens` tokens), measured while the first step is probed."""
        if not self.probing:
            return run()
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        result = run()
        rate = (torch.cuda.max_memory_allocated(self.device) - before) / max(tokens, 1)
        self.bytes_per_token = max(self.bytes_per_token or 0.0, rate)
        return result

    def _limit_from_free_memory(self) -> int:
        free, _ = torch.cuda.mem_get_info(self.device)
        free += torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        limit = max(256, int(free * (1 - HEADROOM) / self.bytes_per_token))
        logger.info("forwards of at most %d tokens (free memory %.1f GB, about %.2f MB a token)", limit, free / 1e9,
                    self.bytes_per_token / 1e6)
        return limit
