"""benchmarks/context.py: the search for the longest trainable context (doubling, then bisection to 5%)
against a fake memory limit, the RSS watchdog on a worker, and a smoke run of every variant on a tiny model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common import child_env
from benchmarks.context import Bracket, longest_fitting


def search(limit: int, start: int = 1024, cap: int = 1 << 20, answers: dict | None = None):
    """The search against a model that fits up to `limit` tokens; the lengths it tried, in order."""
    tried: list[int] = []

    def fits(length: int) -> bool | None:
        tried.append(length)
        if answers and length in answers:
            return answers[length]
        return length <= limit

    return longest_fitting(fits, start, cap), tried


@pytest.mark.parametrize("limit", [1024, 1500, 2047, 2048, 2049, 5000, 12345, 99_999, 700_001])
def test_search_finds_the_longest_fit_within_five_percent(limit):
    bracket, tried = search(limit)
    assert bracket.stopped is None
    assert bracket.longest <= limit < bracket.first_failure
    assert bracket.first_failure <= 1.05 * bracket.longest
    assert bracket.longest * 1.05 > limit  # so the answer is within 5% of the true longest
    assert tried[:2] == [1024, 2048]
    # doubling up to the first failure, then about log2(20) bisections: no length twice
    assert len(tried) == len(set(tried)) <= (limit // 1024).bit_length() + 7


def test_search_halves_when_the_start_fails_and_stops_at_the_floor():
    bracket, tried = search(300)
    assert tried[:3] == [1024, 512, 256]
    assert bracket.longest <= 300 < bracket.first_failure <= 1.05 * bracket.longest
    assert search(10) == (Bracket(None, 16), [1024, 512, 256, 128, 64, 32, 16])


def test_search_stops_at_the_cap_and_when_there_is_no_answer():
    bracket, tried = search(10**9, cap=5000)
    assert bracket == Bracket(5000, None) and tried == [1024, 2048, 4096, 5000]
    # no answer (time budget, an error that is not about memory): the bracket reached so far, marked stopped
    bracket, tried = search(100_000, answers={16384: None})
    assert bracket == Bracket(8192, None, "stopped") and tried[-1] == 16384
    bracket, _ = search(3000, answers={3072: None})
    assert bracket == Bracket(2048, 4096, "stopped")


def run_script(tmp_path: Path, *flags: str, timeout: int = 600) -> str:
    done = subprocess.run([sys.executable, "-m", "benchmarks.context", *flags], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path, env=child_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_worker_over_the_memory_limit_is_killed_and_counts_as_a_failure(tmp_path, tiny_model_dir):
    # 0.15 GB: every worker passes it while it imports torch, long before any training
    out = run_script(tmp_path, "--model", tiny_model_dir, "--quick", "--variants", "ours", "--memory_gb", "0.15")
    assert "lora ours L=128 steps=1: out of memory (killed at RSS" in out
    row = next(line for line in out.splitlines() if line.startswith("ours "))
    assert row.split()[1:3] == ["-", "16"] and row.endswith("nothing fits")
    # the fixed lengths have a guard of their own (75% of MemTotal by default): they measure speed past the
    # search's limit
    assert "lora ours L=128 steps=2: fits" in out and f"\nours{128:>18}" in out


@pytest.mark.heavy  # 1.5-2.5 minutes: a worker per variant, each importing transformers and TRL (15 s); -m heavy
def test_every_variant_trains_on_a_tiny_model(tmp_path, tiny_model_dir):
    out = run_script(tmp_path, "--model", tiny_model_dir, "--quick", "--one_process")
    table = out[out.index("== lora"):]
    for variant in ("ours", "ours_gc", "ours_offload", "trl"):
        row = next(line for line in table.splitlines() if line.startswith(variant + " "))
        assert row.split()[1] == "128", row  # the longest L: the cap, which fits
        assert f"\n{variant:<14}{128:>8}" in table  # its fixed-length row
    assert "trl_offload     skipped: CUDA only" in table
    unsloth = next(line for line in table.splitlines() if line.startswith("unsloth "))
    assert "skipped: unsloth is not installed" in unsloth or unsloth.split()[1] == "128"
    assert "longest context ours/trl: both sides lower bounds, 1.00x" in table  # both reached the cap
    assert "versions: torch" in out and "command: " in out


def test_a_peak_over_the_limit_between_two_polls_is_a_failure():
    from benchmarks.context import over_limit

    trial = {"status": "ok", "peak_rss_mb": 2100.0}
    assert over_limit(trial, 2.0, cuda=False)["status"] == "oom"
    assert over_limit(trial, 2.1, cuda=False) == trial
    assert over_limit(trial, 2.0, cuda=True) == trial  # on CUDA the GPU's own out-of-memory error decides
