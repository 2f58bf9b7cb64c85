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
gradients (StageTrainer._training_step_parts); a step that fits stays one forward. A single conversation longer than
the limit still runs as one forward, and is what --gradient_checkpointing (offload) and --max_seq_length are for.

The measurement restarts torch's peak-memory statistics at the first forward (the only way to read one forward's
peak), so a peak read after a run leaves out model loading.

With `--gradient_checkpointing` left out (SFT's packed rows on a GPU: hparams/training_args.resolve_checkpointing),
the budget also chooses what each decoder layer does in each forward (train/layer_modes.py). Before the first step,
`probe` runs prefixes of the first row (PROBE_TOKENS and half that, whole conversations where they fit; once with the
last layer keeping its activations, twice with every layer recomputed), its gradients and random state put back
after, and reads the fixed bytes (dequantized weights, workspaces; the gradients, held through the probe, apart), the
bytes a token of a fully recomputed forward, what a kept layer adds and what an offloaded one frees, and the two
runs' times (a forward's fixed seconds and a token's). From then on a forward keeps every layer where its tokens fit
the free memory; a packed row longer than that runs as forwards of whole conversations, as many as the timings say
is fastest: several that keep every layer, or fewer, longer ones that recompute some (each forward launches every
kernel and reads every weight again, which at small forwards costs more than recomputing: measured on an H100, a
1.07B QLoRA's step split in three ran at 0.56x one forward's speed). A conversation longer than a forward keeping
every layer recomputes as few layers as fit, and offloads layer inputs to host memory where recomputing all of them
does not. Logged once:

    forwards of at most 41234 tokens keep every layer (free memory 61.2 GB, 1.21 MB a token); longer conversations
    recompute layers, and offload layer inputs past 150123 tokens
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..data.packing import forward_splits, slice_packed_row
from .head_loss import FUSED_HEAD, wants_fused_head
from .layer_modes import LayerModes, LayerRates, choose_modes, layer_input_bytes, set_layer_modes

logger = logging.getLogger(__name__)

PROBE_TOKENS = 2048  # the first step's forwards: small enough to fit wherever the model trains at all
HEADROOM = 0.15  # of the free memory, left for fragmentation and the memory a longer row needs beyond its tokens'


@dataclass(frozen=True)
class ForwardSeconds:
    """A forward and backward with every layer recomputed takes `fixed` + `token` x its tokens seconds."""

    fixed: float
    token: float


class ForwardBudget:
    """The forward size of a run on one CUDA device: `splits(batch)` cuts a packed row, `measure(tokens, run)` wraps
    each forward of the first step. Given the model's checkpointed decoder `layers`, it also chooses each forward's
    layer modes: `probe(batch, run, parameters)` before the first step, then `prepare(tokens)` before each forward."""

    def __init__(self, device: torch.device, layers: list[nn.Module] | None = None, fused_head_vocab: int = 0) -> None:
        self.device = device
        self.fused_head_vocab = fused_head_vocab  # the model's tiled head's vocabulary (train/head_loss.py); 0: none
        # the bytes a step may still take, read at each decision: the device's (tunesmith plan gives its own memory)
        self.free_memory: Callable[[], int] = self._free_on_device
        self.bytes_per_token: float | None = None  # the largest of the first step's forwards' rates
        self.limit: int | None = None  # tokens a forward may hold, from the second step on
        self.probing = True
        self.warned = False  # about a conversation longer than the limit, once
        self.layers = layers or None  # decoder layers whose modes this budget chooses (layer_modes.py)
        self.rates: LayerRates | None = None
        self.fixed = 0.0  # bytes of a forward and backward that do not grow with its tokens, gradients apart
        self.parameters: list[nn.Parameter] = []
        self.available = 0.0  # this step's bytes for a forward (layer modes)
        self.most_recomputed: LayerModes | None = None  # the most recomputation logged so far
        self.seconds: ForwardSeconds | None = None  # the probe's timings

    def splits(self, batch: dict[str, Any], optimizer_ready: bool = True) -> list[int] | None:
        """Offsets cutting this packed row into forwards of whole conversations, or None for one forward.
        `optimizer_ready` False: the optimizer's state is not created yet, and is set aside (layer modes)."""
        bounds = batch["cu_seq_lens_q"].tolist()
        lengths = [b - a for a, b in zip(bounds, bounds[1:])]
        if self.rates is not None:
            return self._splits_keeping_layers(lengths, optimizer_ready)
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
        if not self.probing or self.layers is not None:
            return run()
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        result = run()
        rate = (torch.cuda.max_memory_allocated(self.device) - before) / max(tokens, 1)
        self.bytes_per_token = max(self.bytes_per_token or 0.0, rate)
        return result

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _free_on_device(self) -> int:
        """The device's free bytes and what torch's allocator holds unused, within the process's memory fraction
        (torch.cuda.set_per_process_memory_fraction: a card shared, or a smaller one stood for)."""
        free, total = torch.cuda.mem_get_info(self.device)
        allocated = torch.cuda.memory_allocated(self.device)
        free += torch.cuda.memory_reserved(self.device) - allocated
        fraction = torch.cuda.get_per_process_memory_fraction(self.device) if torch.cuda.is_available() else 1.0
        return min(free, int(fraction * total) - allocated) if fraction < 1 else free

    def _limit_from_free_memory(self) -> int:
        free = self.free_memory()
        limit = max(256, int(free * (1 - HEADROOM) / self.bytes_per_token))
        logger.info("forwards of at most %d tokens (free memory %.1f GB, about %.2f MB a token)", limit, free / 1e9,
                    self.bytes_per_token / 1e6)
        return limit

    # -- layer modes (--gradient_checkpointing left out) --

    def probe(self, batch: dict[str, Any], run: Callable[[dict[str, Any]], Any],
              parameters: Iterable[nn.Parameter]) -> None:
        """Measure LayerRates on a prefix of this packed row: run(part) is one forward and backward (the caller puts
        gradients, counters and random state back). The smaller of two sizes runs twice, the first time taking what
        a first call allocates once (cuBLAS workspaces) and reading a kept layer; the two sizes' peaks, every layer
        recomputed, give the fixed bytes and those of a token.

        The gradients are allocated before the probes and held through them. Without, a step's peak is the highest of
        phases that differ in when the gradients appear: on an H100 (full fine-tuning, 8 layers of hidden 1,024) the
        probes' peaks came from the end of backward, where every gradient is held, and their slope (25 KB a token)
        under-read a 16,384-token forward's (73 KB, from the loss's backward): the budget would have run out."""
        self.parameters = [p for p in parameters if p.requires_grad]
        for parameter in self.parameters:
            parameter.grad = torch.zeros_like(parameter)
        layers, tokens = self.layers, int(batch["input_ids"].shape[-1])
        bounds = [b for b in batch["cu_seq_lens_q"].tolist() if 0 < b <= PROBE_TOKENS]
        large = bounds[-1] if bounds and bounds[-1] >= PROBE_TOKENS // 2 else min(tokens, PROBE_TOKENS)
        small = max(1, large // 2)
        # the first run, with the last layer kept, reads what a kept layer holds (and takes the first call's
        # one-time allocations); the two measured runs recompute every layer
        set_layer_modes(layers, LayerModes(1, len(layers) - 1, 0), self.device.type)
        _, _, deltas = self._probe_once(self._on_the_rows_head(slice_packed_row(batch, 0, small), batch), run)
        set_layer_modes(layers, LayerModes(0, len(layers), 0), self.device.type)
        peaks, seconds = {}, {}
        for size in (small, large):
            part = self._on_the_rows_head(slice_packed_row(batch, 0, size), batch)
            peaks[size], seconds[size], _ = self._probe_once(part, run)
        for parameter in self.parameters:
            parameter.grad = None
        offload_saving = deltas["input"] / small
        per_token = (peaks[large] - peaks[small]) / (large - small) if large > small else peaks[large] / large
        # never less than what a forward with every layer recomputed holds for certain: each layer's input
        per_token = max(per_token, len(layers) * offload_saving)
        self.fixed = max(0.0, peaks[large] - per_token * large)
        kept_extra = max(0.0, deltas["kept"] - deltas.get("recomputed", deltas["input"])) / small
        self.rates = LayerRates(recomputed=per_token, kept_extra=kept_extra, offload_saving=offload_saving)
        # the time of a forward and backward, every layer recomputed: fixed (launches, reading every weight) + a token's
        token_seconds = max((seconds[large] - seconds[small]) / max(large - small, 1), 1e-12)
        self.seconds = ForwardSeconds(max(0.0, seconds[small] - token_seconds * small), token_seconds)
        self.probing = False

    def _on_the_rows_head(self, part: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        """A probe's part on the loss path of the row it is cut from: the tiled head wherever the row's logits take it,
        whatever the part's size. Below FUSED_HEAD_ELEMENTS logits a forward computes them whole, so probes on either
        side of that size read two paths: on Llama 3's vocabulary (128,256) with half the tokens trained, the
        1,024-token probe held its full logits and the 2,048-token one went through the tiles, and the slope read
        148 KB a token where an 8B QLoRA step takes about 570 (on a 1B shape, 0: the budget divided by it; tunesmith
        plan found both, issue 52). A row whose logits stay whole keeps its parts on that path too."""
        if (self.fused_head_vocab and wants_fused_head(row, self.fused_head_vocab)
                and wants_fused_head(part, self.fused_head_vocab, any_size=True)):
            return {**part, FUSED_HEAD: True}
        return part

    def _probe_once(self, part: dict[str, Any], run: Callable) -> tuple[int, float, dict]:
        """One forward and backward of `part`: its peak above what was held, its seconds, and the memory the last
        layer (kept) and the first (recomputed, where there are two) left after their forward, and a layer's input."""
        deltas: dict[str, int] = {}
        hooks = []
        measured = {"kept": self.layers[-1], **({"recomputed": self.layers[0]} if len(self.layers) > 1 else {})}
        for name, layer in measured.items():
            def before(module, args, kwargs, name=name):
                deltas[name] = -torch.cuda.memory_allocated(self.device)
                deltas["input"] = layer_input_bytes(args, kwargs)

            def after(module, args, kwargs, output, name=name):
                deltas[name] += torch.cuda.memory_allocated(self.device)
            hooks += [layer.register_forward_pre_hook(before, with_kwargs=True),
                      layer.register_forward_hook(after, with_kwargs=True)]
        try:
            held = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._synchronize()
            start = time.perf_counter()
            run(part)
            self._synchronize()
            seconds = time.perf_counter() - start
            peak = torch.cuda.max_memory_allocated(self.device) - held
        finally:
            for hook in hooks:
                hook.remove()
        return peak, seconds, deltas

    def _splits_keeping_layers(self, lengths: list[int], optimizer_ready: bool) -> list[int] | None:
        # what the step will add besides its tokens': the gradients (held through the probe, so in no rate), and
        # before the first optimizer step AdamW's two moments, in the trained weights' dtype
        pending = sum(p.nbytes for p in self.parameters if p.grad is None)
        if not optimizer_ready:
            pending += 2 * sum(p.nbytes for p in self.parameters)
        free = self.free_memory()
        self.available = free * (1 - HEADROOM) - self.fixed - pending
        limit = max(1, self.rates.tokens_kept(self.available, len(self.layers)))
        if self.limit is None:
            self.limit = limit
            recomputing_all = int(self.available / self.rates.recomputed)
            logger.info("forwards of at most %d tokens keep every layer (free memory %.1f GB, %.2f MB a token); longer "
                        "conversations recompute layers, and offload layer inputs past %d tokens", limit, free / 1e9,
                        (self.rates.recomputed + len(self.layers) * self.rates.kept_extra) / 1e6, recomputing_all)
        if sum(lengths) <= limit:
            return None
        return self._fastest_splits(lengths, limit)

    def _fastest_splits(self, lengths: list[int], limit: int) -> list[int]:
        """Of the ways to run this row (forwards of whole conversations of at most `limit` tokens, every layer kept;
        or fewer, longer forwards with layers recomputed), the fastest by the probe's timings: each forward costs
        its fixed time (kernel launches, every weight read again) and its tokens', a recomputed layer a third more."""
        layers = len(self.layers)

        def seconds(splits: list[int]) -> float:
            total = 0.0
            for start, end in zip(splits, splits[1:]):
                modes = choose_modes(end - start, self.available, self.rates, layers)
                if not modes.fits:
                    return math.inf
                recomputed = (modes.recomputed + modes.offloaded) / layers
                total += self.seconds.fixed + self.seconds.token * (end - start) * (3 + recomputed) / 4
            return total

        kept = forward_splits(lengths, limit)
        total = sum(lengths)
        options = [kept] + [forward_splits(lengths, math.ceil(total / n)) for n in range(1, len(kept) - 1)]
        return min(options, key=seconds)  # the kept-layer split first: it wins a tie

    def prepare(self, tokens: int) -> None:
        """Before a forward of `tokens` tokens: its layers' modes, from this step's free memory."""
        if self.rates is None:
            return
        modes = choose_modes(tokens, self.available, self.rates, len(self.layers))
        set_layer_modes(self.layers, modes, self.device.type)
        most = self.most_recomputed
        if modes.kept < len(self.layers) and (most is None or (modes.offloaded, modes.recomputed) >
                                              (most.offloaded, most.recomputed)):
            self.most_recomputed = modes
            logger.info("a forward of %d tokens: %s (--gradient_checkpointing true, offload or false fixes it)",
                        tokens, modes.describe())
        if not modes.fits and not self.warned:
            self.warned = True
            logger.warning("a forward of %d tokens may not fit this GPU even with every layer's input in host memory "
                           "(%.1f GB for it): it runs and may run out of memory; --tiled_mlp true or a shorter "
                           "--max_seq_length lowers what a token takes", tokens, self.available / 1e9)
