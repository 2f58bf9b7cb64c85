"""What `--gradient_checkpointing auto` does on a GPU, planned by the run's own code: the forward budget
(train/forward_budget.py) probes the fake model as it probes the real one before the first step, its reads of
torch.cuda's allocator answered by the plan's meter, and then chooses, for a row and the memory given, the forwards
(ForwardBudget.splits) and each forward's layer modes (ForwardBudget.prepare: layer_modes.choose_modes, then
set_layer_modes on the model). The step then runs with those modes set, so the row's metered peak checks the
budget's estimate, which the `auto:` line prints.

The one input the plan cannot measure is time: fake tensors take no GPU seconds, and the budget weighs a split of a
row (more forwards, each launching every kernel again) against recomputing layers by the probe's seconds. The plan
takes ASSUMED_SECONDS (a forward's fixed time negligible next to its tokens'), under which a row that does not fit
keeping every layer is split into forwards that keep every layer whenever its conversations allow; one conversation
is never split, so the search for the longest conversation does not depend on it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..constants import IGNORE_INDEX
from ..data.collator import PackingCollator
from ..train.forward_budget import HEADROOM, PROBE_TOKENS, ForwardBudget, ForwardSeconds
from ..train.layer_modes import LayerModes, checkpointed_layers, choose_modes, estimated_forward_bytes
from .fake_device import MemoryMeter, cuda_memory_from, cuda_stand_ins
from .model import quant_state_tensors
from .report import mb
from .step import forward_backward

ASSUMED_SECONDS = ForwardSeconds(fixed=0.0, token=1.0)
CUDA = torch.device("cuda")  # the budget's device: only its type is read (pinned host copies for offloaded layers)


@dataclass(frozen=True)
class AutoChoice:
    """The budget's choice for one row: the offsets of its forwards, the largest forward's layer modes, and the
    budget's estimate of the step's device peak (what it holds, its gradients, fixed bytes and tokens' bytes)."""

    forwards: list[int]
    modes: LayerModes
    predicted_peak: int
    timed: bool = False  # the budget weighed splits by their seconds: the plan's ASSUMED_SECONDS decided

    def line(self, metered_peak: int, memory: int) -> str:
        """The row's `auto:` line; flagged where the metered step of a choice the budget takes to fit does not."""
        sizes = [b - a for a, b in zip(self.forwards, self.forwards[1:])]
        m = self.modes
        timed = " (chosen by the assumed timings: a forward's fixed seconds 0)" if self.timed else ""
        return (f"  auto: forwards {len(sizes)} of at most {max(sizes)} tokens{timed}; layers kept {m.kept}, recomputed "
                f"{m.recomputed}, offloaded {m.offloaded}{'' if m.fits else ' (over the budget: may not fit)'}; "
                f"predicted_peak_device_mb {mb(self.predicted_peak)}"
                + ("; the metered peak is over the memory: the run's estimate is low here" if m.fits and
                   metered_peak > memory else ""))


def probe_row(tokens: int, trained_share: float) -> dict[str, Any]:
    """One conversation whose trained tokens are spread evenly, so that each of the probe's prefixes trains its share
    of its tokens, as a row of many short conversations does (a packed row of several conversations would also bring
    transformers' tokens x tokens packed mask into the rates, which a row of one conversation does not have)."""
    trained = [math.floor((i + 1) * trained_share) > math.floor(i * trained_share) for i in range(tokens)]
    trained[0] = False  # the first token predicts nothing
    labels = [0 if t else IGNORE_INDEX for t in trained]
    return PackingCollator(trained_logits_only=True, max_forward_tokens=0)([{"input_ids": [0] * tokens,
                                                                             "labels": labels}])


class AutoPlanner:
    """The forward budget of a run, probed on the fake `model`; `choose(row, held)` is its choice for a row."""

    def __init__(self, model: nn.Module, memory: int, bf16: bool, fused_head_vocab: int, mode: Any,
                 trained_share: float) -> None:
        self.memory = memory
        self.layers = checkpointed_layers(model)
        self.budget = ForwardBudget(CUDA, self.layers, fused_head_vocab)
        row = probe_row(PROBE_TOKENS, trained_share)
        num_items = int((row["labels"] != IGNORE_INDEX).sum())
        meter = MemoryMeter()
        with mode, cuda_stand_ins(meter, row["position_ids"]), meter, cuda_memory_from(meter):
            meter.track([*model.parameters(), *model.buffers(), *quant_state_tensors(model)])
            meter.mark()
            self.budget.probe(row, lambda part: forward_backward(model, part, num_items, bf16, fused_head_vocab),
                              model.parameters())
        self.budget.seconds = ASSUMED_SECONDS

    def choose(self, row: dict[str, Any], held: int) -> AutoChoice:
        """The forwards and layer modes the budget chooses for `row` with `held` bytes allocated before the step (the
        weights and the optimizer's state), as if the device had `memory` bytes."""
        free = self.memory - held
        self.budget.free_memory = lambda: free  # the device's free memory, which the plan stands in for
        tokens = int(row["input_ids"].shape[-1])
        forwards = self.budget.splits(row, optimizer_ready=True) or [0, tokens]
        largest = max(b - a for a, b in zip(forwards, forwards[1:]))
        modes = choose_modes(largest, self.budget.available, self.budget.rates, len(self.layers))
        gradients = sum(p.nbytes for p in self.budget.parameters)  # held by the probe's measurement, as by a step
        predicted = held + gradients + self.budget.fixed + estimated_forward_bytes(largest, self.budget.rates, modes)
        conversations = len(row["cu_seq_lens_q"]) - 1
        # as ForwardBudget.splits decides: a row that does not fit keeping every layer, of several conversations,
        # is cut by _fastest_splits, which weighs the options by the probe's seconds
        timed = conversations > 1 and tokens > self.budget.rates.tokens_kept(self.budget.available, len(self.layers))
        return AutoChoice(forwards, modes, int(predicted), timed)

    def describe(self) -> str:
        rates, kb = self.budget.rates, lambda value: f"{value / 1024:.1f}"
        return (f"auto: probed as the run probes (train/forward_budget.py): {kb(rates.recomputed)} KB a token with "
                f"every layer recomputed, {kb(rates.kept_extra)} KB more a kept layer, {kb(rates.offload_saving)} KB "
                f"less an offloaded one, {mb(self.budget.fixed)} MB fixed; forwards get the free memory less "
                f"{HEADROOM:.0%}; a split is weighed against recomputation assuming a forward's fixed seconds are 0 "
                "(fake tensors take no time): a row splits into forwards that keep every layer where its "
                "conversations allow")
