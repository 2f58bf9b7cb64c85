"""GRPO against PPO on the same prompts, reward functions, batch, samples per prompt and steps: rollouts (sampled
replies) per second of training and the peak memory (RSS) of each run. The only difference is the advantage:
PPO (--advantage gae, KL in the reward) trains a value adapter and head beside the policy and runs it on
every rollout; GRPO (--advantage grpo, KL in the loss) has none.

    python scripts/bench_rl.py                       # configs/grpo_demo.yaml, 6 steps each
    python scripts/bench_rl.py --steps 10 --order grpo gae grpo gae

Each run is its own process (its peak RSS and CPU time come from os.wait4); rollouts/s counts the steps' own
time from metrics.jsonl (generation, scoring, update), not the model loading before the first step. On a
shared machine wall time follows the other processes' load; CPU seconds per rollout much less so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "gae": ["--advantage", "gae", "--kl_in_loss", "false"],
    "grpo": ["--advantage", "grpo", "--kl_in_loss", "true"],
}


def run(kind: str, config: str, steps: int, out: Path) -> dict[str, float]:
    cmd = [sys.executable, str(ROOT / "ppo/train.py"), config, *SETTINGS[kind], "--max_steps", str(steps),
           "--save_strategy", "no", "--rollout_log_samples", "0", "--output_dir", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise SystemExit(f"{kind} failed:\n{proc.stderr.read()[-3000:]}")
    log = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    phases = {k: sum(r[k] for r in log) for k in ("time_generate", "time_score", "time_train")}
    batch = int(config_value(config, "per_device_train_batch_size"))
    seconds = sum(phases.values())
    cpu = usage.ru_utime + usage.ru_stime  # the whole process, model loading included: steadier than wall time
    return {"rollouts_per_s": batch * len(log) / seconds, "seconds": seconds, **phases,  # on a shared machine
            "cpu_s_per_rollout": cpu / (batch * len(log)), "peak_rss_gb": usage.ru_maxrss / 2**20}  # KiB on Linux


def config_value(config: str, key: str) -> str:
    import yaml

    return str(yaml.safe_load(Path(config).read_text())[key])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs/grpo_demo.yaml"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--order", nargs="+", default=["grpo", "gae"], choices=sorted(SETTINGS))
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, kind in enumerate(args.order):
            r = run(kind, args.config, args.steps, Path(tmp) / f"{i}-{kind}")
            results.setdefault(kind, []).append(r)
            print(f"{kind:>4}: {r['rollouts_per_s']:.3f} rollouts/s ({r['seconds']:.0f} s for {args.steps} steps: "
                  f"generate {r['time_generate']:.0f} s, score {r['time_score']:.0f} s, update {r['time_train']:.0f} s)"
                  f", {r['cpu_s_per_rollout']:.1f} CPU s/rollout, peak RSS {r['peak_rss_gb']:.2f} GB, load "
                  f"{os.getloadavg()[0]:.2f}", flush=True)
    if {"gae", "grpo"} <= set(results):
        mean = {k: {m: sum(r[m] for r in v) / len(v) for m in v[0]} for k, v in results.items()}
        speed = mean["grpo"]["rollouts_per_s"] / mean["gae"]["rollouts_per_s"]
        memory = 1 - mean["grpo"]["peak_rss_gb"] / mean["gae"]["peak_rss_gb"]
        cpu = mean["grpo"]["cpu_s_per_rollout"] / mean["gae"]["cpu_s_per_rollout"]
        print(f"GRPO / PPO: {speed:.2f}x the rollouts per second, {cpu:.2f}x the CPU time per rollout, {memory:.0%} "
              "less peak memory")


if __name__ == "__main__":
    main()
