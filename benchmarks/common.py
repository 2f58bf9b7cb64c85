"""What every benchmark here shares: the repository's root, an offline environment, a step clock, peak memory, and a
driver that runs each variant in its own subprocess (`python -m benchmarks.<name> --worker V`), the variants taking
turns, checks the machine's load before each run, and reports medians with their spread.

Quiet is measured, not assumed. Before each run the driver waits (up to --settle seconds) until the
cores have been idle for two seconds in /proc/stat; the 1-minute load average is useless for this,
since it still counts the previous run of this very benchmark for a minute after it ended. During the
run it counts the CPU time the whole machine spent busy, takes away the run's own (os.wait4), and
reports the rest as `other CPU`: the share of the cores that other processes took while the run was
timed. A run where that share is above --quiet_share is flagged with '!' in its line and its variant
with '(loaded)' in the table: another job then shared the cores, and its times say more about that job
than about the variant. The 1-minute load average before each run is printed too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the repository: configs/, data/demo/, chat/serve.py

# Every benchmark reads local folders only, and starts processes after a tokenizer has run in it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The Trainer settings of every timed training run: the rows in their order (each variant trains the same batches),
# no checkpoint written among the timed steps, every step's loss in the log history, no progress bar.
TIMED_TRAINER = {"train_sampling_strategy": "sequential", "save_strategy": "no", "report_to": "none",
                 "logging_steps": 1, "disable_tqdm": True}


@contextlib.contextmanager
def scratch(name: str) -> Iterator[Path]:
    """A temporary folder for a benchmark's data and its workers' results, with tunesmith's data cache inside it for
    the while (the workers inherit it), so that the sets a benchmark tokenizes stay out of the user's cache."""
    before = os.environ.get("TUNESMITH_CACHE")
    with tempfile.TemporaryDirectory(prefix=f"{name}.") as tmp:
        workdir = Path(tmp)
        os.environ["TUNESMITH_CACHE"] = str(workdir / "cache")
        try:
            yield workdir
        finally:
            if before is None:
                os.environ.pop("TUNESMITH_CACHE")
            else:
                os.environ["TUNESMITH_CACHE"] = before


class StepClock:
    """Wall-clock and process CPU time at the end of every optimizer step."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.cpu: list[float] = []

    def tick(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())
        self.cpu.append(time.process_time())


def trainer_clock() -> tuple[StepClock, Any]:
    """A StepClock and the Trainer callback that ticks it."""
    from transformers import TrainerCallback

    clock = StepClock()

    class Callback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()

    return clock, Callback()


def benchmark_model(model: str | None) -> str:
    """The model folder to benchmark: the embedded SmolLM2-135M-Instruct when none is given. A path that is
    not a folder stops the benchmark with one line, before any run starts."""
    if model is None:
        from tunesmith.models.default_model import ensure_default_model

        return str(ensure_default_model())
    if not os.path.isdir(model):
        raise SystemExit(f"{running_benchmark()}: --model {model}: no such folder (give a model directory, "
                         "or leave --model out for the embedded SmolLM2-135M-Instruct)")
    return model


def running_benchmark() -> str:
    """The benchmark this process runs, as its messages name it: `benchmarks.sft` (from `python -m`)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return spec.name if spec else Path(sys.argv[0]).name


class CountingCollator:
    """Wraps a Trainer's collator; keeps `count(batch)` of every batch it makes, in order (the positions computed, the
    tokens trained: what a step's throughput divides by)."""

    def __init__(self, collator: Any, count: Callable[[dict], Any]) -> None:
        self.collator, self.count, self.counts = collator, count, []

    def __call__(self, features: list[dict]) -> dict:
        batch = self.collator(features)
        self.counts.append(self.count(batch))
        return batch


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_gpu_memory() -> dict[str, float]:
    """{"peak_gpu_mb": this process's peak of allocated CUDA memory} for a result, or {} without CUDA."""
    import torch

    return {"peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20} if torch.cuda.is_available() else {}


def logged_losses(trainer: Any) -> list[float]:
    """The loss of every step (logging_steps 1), from the Trainer's log history."""
    return [r["loss"] for r in trainer.state.log_history if "loss" in r]


def busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, over all cores, from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / tick, sum(fields[:8]) / tick


def wait_until_idle(settle: float, share: float) -> float:
    """Waits until two seconds pass with the cores under `share` busy, at most `settle` seconds; returns
    the busy share of the last two seconds."""
    deadline = time.monotonic() + settle
    while True:
        busy0, total0 = busy_seconds()
        time.sleep(2.0)
        busy1, total1 = busy_seconds()
        busy = (busy1 - busy0) / max(total1 - total0, 1e-9)
        if busy <= share or time.monotonic() > deadline:
            return busy


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process a benchmark starts: the repository first on PYTHONPATH, so that the child imports
    this checkout's `benchmarks` and `tunesmith` whatever folder it runs in."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def worker_command(module: str, variant: str, workdir: Path, *args: str) -> list[str]:
    """The command of one worker: the benchmark's own module (its `__spec__.name`) run with --worker."""
    return [sys.executable, "-m", module, "--worker", variant, "--workdir", str(workdir), *args]


def add_worker_arguments(parser: argparse.ArgumentParser, variants: Sequence[str] | None = None) -> None:
    """The hidden flags a worker gets from worker_command: the variant it runs and the folder its result goes to."""
    parser.add_argument("--worker", choices=variants, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)


def run_measured(command: list[str]) -> tuple[int, str, float]:
    """Runs a command; returns (exit status, stderr, share of the cores other processes used meanwhile)."""
    busy0, total0 = busy_seconds()
    with open(os.devnull, "w") as devnull:
        proc = subprocess.Popen(command, stdout=devnull, stderr=subprocess.PIPE, text=True, env=child_env())
        stderr = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
    busy1, total1 = busy_seconds()
    other = (busy1 - busy0) - (usage.ru_utime + usage.ru_stime)
    return os.waitstatus_to_exitcode(status), stderr, max(other, 0.0) / max(total1 - total0, 1e-9)


def run_interleaved(module: str, variants: Sequence[str], repeats: int, workdir: Path, worker_args: list[str],
                    quiet_share: float, describe: Callable[[dict], str], settle: float = 120.0) -> dict[str, list[dict]]:
    """Runs `python -m module --worker V --workdir W *worker_args` for every variant, round after round, each once
    the machine is idle, and collects what each worker wrote to W/V.json with the load it ran under."""
    results: dict[str, list[dict]] = {v: [] for v in variants}
    for repeat in range(repeats):
        for variant in variants:
            idle_before = wait_until_idle(settle, quiet_share)
            load_before = os.getloadavg()[0]
            code, stderr, other = run_measured(worker_command(module, variant, workdir, *worker_args))
            if code != 0:
                print(f"run {repeat + 1} {variant}: failed (exit {code})\n{stderr[-3000:]}", flush=True)
                continue
            result = {**json.loads((workdir / f"{variant}.json").read_text()), "load": load_before,
                      "other_cpu": other, "busy_before": idle_before}
            results[variant].append(result)
            flag = "!" if other > quiet_share else ""
            print(f"run {repeat + 1} {variant}: {describe(result)}; other CPU {other:.0%}{flag} (busy before "
                  f"{idle_before:.0%}), 1-min load before {load_before:.1f}", flush=True)
    return results


def run_worker(args: Any, runs: dict[str, Callable[[Any, Path], dict]]) -> bool:
    """In a worker process (`--worker V --workdir W`, started by run_interleaved): runs variant V and writes
    its result to W/V.json. False in the driver, which has no --worker."""
    if not args.worker:
        return False
    result = runs[args.worker](args, Path(args.workdir))
    (Path(args.workdir) / f"{args.worker}.json").write_text(json.dumps(result))
    return True


def medians(runs: list[dict]) -> dict[str, Any]:
    """The median of every numeric field over a variant's runs (lists and others: the first run's)."""
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        out[key] = statistics.median(r[key] for r in runs) if numeric else value
    return out


def spread(runs: list[dict], key: str, digits: int) -> str:
    values = [r[key] for r in runs]
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def loaded(runs: list[dict], quiet_share: float) -> str:
    return " (loaded)" if max(r["other_cpu"] for r in runs) > quiet_share else ""


def check_choices(parser: Any, flag: str, value: str, choices: Sequence[str]) -> None:
    """Stop with argparse's one-line usage error if the comma-separated `value` of --flag names anything but
    `choices`."""
    unknown = [v for v in value.split(",") if v not in choices]
    if unknown:
        parser.error(f"--{flag} {value}: unknown {unknown}; choose from {', '.join(choices)}")


def add_quiet_arguments(parser: Any) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="Runs of each variant, interleaved.")
    parser.add_argument("--quiet_share", type=float, default=0.1,
                        help="Other processes using more than this share of the cores during a run flag it.")
    parser.add_argument("--settle", type=float, default=120.0,
                        help="Seconds to wait at most, before each run, for the cores to be idle.")
