"""ForwardBudget (train/forward_budget.py): the first step's forwards are probes of at most PROBE_TOKENS, measured;
from the second step the forwards hold what the free memory takes at the measured rate, said in one line. torch's
allocator readings are replaced here by a simulated device (this machine has no GPU; tests/test_gpu.py runs the real
one under a memory cap)."""

from __future__ import annotations

import functools
import logging

import pytest
import torch

from tunesmith.data.collator import PackingCollator
from tunesmith.data.packing import FORWARD_SPLITS, SIZED_BY_FREE_MEMORY
from tunesmith.train import forward_budget
from tunesmith.train.forward_budget import PROBE_TOKENS, ForwardBudget


class SimulatedDevice:
    """Allocated bytes and their peak, as a forward of `tokens` at `rate` bytes a token moves them."""

    def __init__(self, weights: int, free: int, rate: int) -> None:
        self.allocated, self.peak, self.free, self.rate = weights, weights, free, rate

    def forward(self, tokens: int) -> None:
        self.peak = max(self.peak, self.allocated + tokens * self.rate)

    def install(self, monkeypatch) -> None:
        cuda = forward_budget.torch.cuda
        monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: setattr(self, "peak", self.allocated))
        monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: self.allocated + 10**9)
        monkeypatch.setattr(cuda, "mem_get_info", lambda device=None: (self.free, 80 * 10**9))


def row(lengths: list[int]) -> dict:
    return PackingCollator(max_forward_tokens=None)([{"input_ids": [5] * n, "labels": [5] * n} for n in lengths])


def test_a_gpu_row_is_sized_by_the_trainer():
    assert row([3, 4])[FORWARD_SPLITS] == SIZED_BY_FREE_MEMORY


def test_the_first_step_probes_then_the_free_memory_sets_the_forwards(monkeypatch, caplog):
    device = SimulatedDevice(weights=4 * 10**9, free=20 * 10**9, rate=400_000)
    device.install(monkeypatch)
    budget = ForwardBudget(torch.device("cuda", 0))
    first = row([1500, 1500, 1000])  # 4,000 tokens: probed as forwards of at most PROBE_TOKENS whole conversations
    splits = budget.splits(first)
    assert splits == [0, 1500, 3000, 4000]
    for start, end in zip(splits, splits[1:]):
        budget.measure(end - start, functools.partial(device.forward, end - start))
    assert budget.bytes_per_token == pytest.approx(400_000)
    with caplog.at_level(logging.INFO, logger="tunesmith.train.forward_budget"):
        assert budget.splits(row([8000, 9000])) is None  # fits the budget: one forward
    free = 20 * 10**9 + 10**9  # the device's free memory and what the allocator holds unused
    limit = int(free * (1 - forward_budget.HEADROOM) / 400_000)
    assert budget.limit == limit
    assert [r.getMessage() for r in caplog.records] == [
        f"forwards of at most {limit} tokens (free memory {free / 1e9:.1f} GB, about 0.40 MB a token)"]
    assert budget.splits(row([30000, 20000, 10000])) == [0, 30000, 60000]  # limit 44,625: 30,000 | 20,000 + 10,000
    # after the probe, forwards are no longer measured (and the peak statistics no longer reset)
    device.peak = 123
    budget.measure(100, lambda: None)
    assert device.peak == 123 and budget.bytes_per_token == pytest.approx(400_000)


def test_a_short_first_step_runs_whole(monkeypatch):
    SimulatedDevice(weights=0, free=10**9, rate=1).install(monkeypatch)
    budget = ForwardBudget(torch.device("cuda", 0))
    assert budget.splits(row([PROBE_TOKENS - 1, 1])) is None
