"""ForwardBudget (train/forward_budget.py): the first step's forwards are probes of at most PROBE_TOKENS, measured;
from the second step the forwards hold what the free memory takes at the measured rate, said in one line. torch's
allocator readings are replaced here by a simulated device (this machine has no GPU; tests/system/test_gpu.py runs the real
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
    with caplog.at_level(logging.WARNING, logger="tunesmith.train.forward_budget"):
        caplog.clear()
        for _ in range(2):  # a conversation longer than the limit runs whole, said once
            assert budget.splits(row([50000, 100])) == [0, 50000, 50100]
        assert [r.getMessage()[:60] for r in caplog.records] == [
            "a conversation of 50000 tokens is longer than the forwards t"]
    # after the probe, forwards are no longer measured (and the peak statistics no longer reset)
    device.peak = 123
    budget.measure(100, lambda: None)
    assert device.peak == 123 and budget.bytes_per_token == pytest.approx(400_000)


def test_a_short_first_step_runs_whole(monkeypatch):
    SimulatedDevice(weights=0, free=10**9, rate=1).install(monkeypatch)
    budget = ForwardBudget(torch.device("cuda", 0))
    assert budget.splits(row([PROBE_TOKENS - 1, 1])) is None


def test_the_trainer_trains_alike_however_the_budget_cuts_the_rows(tiny_model_dir, tmp_path, monkeypatch):
    """StageTrainer with a budget (a simulated device, probes of 64 tokens, then a 200-token limit): the first step's
    rows and the later ones are cut into forwards of whole conversations, and the losses are those of one forward a
    step."""
    import json

    from tests.core.models.test_architectures import TOPICS, conversation
    from tunesmith.data import packing
    from tunesmith.sft.command import run
    from tunesmith.train import stage_trainer

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"messages": conversation(i)}) + "\n" for i in range(len(TOPICS))))
    argv = ["--model_name_or_path", tiny_model_dir, "--data_path", str(data), "--max_steps", "3",
            "--per_device_train_batch_size", "4", "--bf16", "false", "--lora_dropout", "0", "--packing", "true",
            "--save_strategy", "no", "--plot_loss", "false", "--learning_rate", "5e-2", "--train_sampling_strategy",
            "sequential"]
    whole = run([*argv, "--output_dir", str(tmp_path / "whole"), "--max_forward_tokens", "0"])

    monkeypatch.setattr(stage_trainer, "CPU_FORWARD_TOKENS", None)  # the GPU default: the trainer sizes the forwards
    monkeypatch.setattr(forward_budget, "PROBE_TOKENS", 64)
    SimulatedDevice(weights=0, free=0, rate=0).install(monkeypatch)
    monkeypatch.setattr(ForwardBudget, "_limit_from_free_memory", lambda self: 200)
    cuts = []
    slice_row = packing.slice_packed_row
    monkeypatch.setattr(stage_trainer, "slice_packed_row", lambda batch, start, end: cuts.append(end - start)
                        or slice_row(batch, start, end))

    def budget_on_this_cpu(self):
        if self._forward_budget is None:
            self._forward_budget = ForwardBudget(torch.device("cpu"))
        return self._forward_budget

    monkeypatch.setattr(stage_trainer.StageTrainer, "_forward_budget_on_cuda", budget_on_this_cpu)
    monkeypatch.setattr(forward_budget.torch.cuda, "max_memory_allocated", lambda device=None: 10**6)
    cut = run([*argv, "--output_dir", str(tmp_path / "cut")])
    assert cut._forward_budget.limit == 200 and cut._forward_budget.bytes_per_token > 0
    assert len(cuts) > 6 and max(cuts) <= 200, cuts  # three rows of several conversations, each cut
    losses = [[r["loss"] for r in t.state.log_history if "loss" in r] for t in (whole, cut)]
    assert losses[1] == pytest.approx(losses[0], abs=1e-5)
