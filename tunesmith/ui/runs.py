"""The runs under a folder, read from what every stage leaves in its output_dir: tunesmith_config.json
(how it was made), metrics.jsonl (one JSON line per logged step; trainer_state.json's log_history for
runs older than that file), the saved model or adapter (finished), and the log the page wrote while
running it (<root>/.ui_logs/<name>.log)."""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from ..constants import METRICS_FILE, RUN_CONFIG_FILE
from ..utils.paths import run_config_record

LOG_FOLDER = ".ui_logs"
SERIES = ("loss", "eval_loss", "learning_rate", "grad_norm", "score", "kl")
FINISHED_FILES = ("adapter_config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
COLUMNS = ["run", "stage", "model", "dataset", "steps", "final loss", "date", "status"]


@dataclass
class Run:
    """A run's folder, its tunesmith_config.json (written when the run saves; empty before) and the command
    the page started it with (from its log; empty for a run started elsewhere)."""

    path: str
    config: dict[str, Any]
    command: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.path))

    @property
    def stage(self) -> str:
        if self.config or not self.command:
            return stage_of(self.config)
        stage = self.command[1] if len(self.command) > 1 else "?"
        return self.flag("advantage") or stage if stage == "ppo" else stage

    def flag(self, name: str) -> str | None:
        """A flag's value in the command the page ran (None when absent)."""
        option = f"--{name}"
        return self.command[self.command.index(option) + 1] if option in self.command[:-1] else None

    def metrics(self) -> list[dict]:
        return read_metrics(self.path)

    def is_adapter(self) -> bool:
        return os.path.isfile(os.path.join(self.path, "adapter_config.json"))


def stage_of(config: dict[str, Any]) -> str:
    """sft, pt, distill, reward, dpo, ppo, grpo (or rloo), merge, or ? from the dataclasses a run recorded."""
    if "PPOArguments" in config:
        advantage = config["PPOArguments"].get("advantage", "gae")
        return "ppo" if advantage == "gae" else advantage
    for key, stage in (("DPOArguments", "dpo"), ("RewardArguments", "reward"), ("DistillArguments", "distill"),
                       ("PretrainDataArguments", "pt"), ("SFTDataArguments", "sft"),
                       ("MergeArguments", "merge")):
        if key in config:
            return stage
    return "?"


def read_metrics(run_dir: str) -> list[dict]:
    """The logged records of a run: metrics.jsonl, else trainer_state.json's log_history (a run from before
    metrics.jsonl), else none. A line being written as it is read is skipped."""
    path = os.path.join(run_dir, METRICS_FILE)
    if os.path.isfile(path):
        rows = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return rows
    state = os.path.join(run_dir, "trainer_state.json")
    if os.path.isfile(state):
        try:
            with open(state, encoding="utf-8") as f:
                return list(json.load(f).get("log_history", []))
        except (OSError, json.JSONDecodeError):
            return []
    return []


def series(rows: list[dict], keys: tuple[str, ...] = SERIES) -> list[dict]:
    """Long-form points for a plot: {"step", "value", "series"} for each key logged at each step."""
    return [{"step": r["step"], "value": float(r[k]), "series": k} for r in rows if "step" in r
            for k in keys if isinstance(r.get(k), int | float)]


def find_runs(root: str) -> list[Run]:
    """Every folder under root (two levels deep at most) that holds a tunesmith_config.json, or the metrics.jsonl
    of a run still going or stopped before it saved, newest first."""
    found = []
    if not os.path.isdir(root):
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        depth = os.path.relpath(dirpath, root).count(os.sep) + (dirpath != root)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "checkpoint-"))) if depth < 2 else []
        if RUN_CONFIG_FILE not in filenames and METRICS_FILE not in filenames:
            continue
        found.append(Run(dirpath, run_config_record(dirpath), started_with(root, dirpath)))
    return sorted(found, key=lambda r: _mtime(r.path), reverse=True)


def started_with(root: str, run_dir: str) -> list[str]:
    """The command line the page ran for run_dir, from the first line of its log (`$ tunesmith ...`)."""
    try:
        with open(log_path(root, run_dir), encoding="utf-8") as f:
            first = f.readline()
    except OSError:
        return []
    try:
        return shlex.split(first[2:]) if first.startswith("$ ") else []
    except ValueError:
        return []


def log_path(root: str, run_dir: str) -> str:
    """Where the page keeps the log of the run that writes to run_dir."""
    name = os.path.relpath(os.path.realpath(run_dir), os.path.realpath(root)).replace(os.sep, "__")
    return os.path.join(root, LOG_FOLDER, f"{name}.log")


def status(run: Run, running: set[str] | None = None) -> str:
    """running (a job of this page writes it), finished (its model or adapter saved), or incomplete."""
    if running and os.path.realpath(run.path) in running:
        return "running"
    if any(os.path.isfile(os.path.join(run.path, f)) for f in FINISHED_FILES):
        return "finished"
    return "incomplete"


def row(run: Run, running: set[str] | None = None) -> list[Any]:
    config = run.config
    model = config.get("ModelArguments", {}).get("model_name_or_path") or run.flag("model_name_or_path") \
        or "(embedded default)"
    data = next((c.get("data_path") for c in config.values() if isinstance(c, dict) and c.get("data_path")),
                run.flag("data_path"))
    dataset = ", ".join(data) if isinstance(data, list) else (data or "")
    metrics = run.metrics()
    steps = max((r.get("step", 0) for r in metrics), default=0)
    losses = [r["loss"] for r in metrics if isinstance(r.get("loss"), int | float)]
    date = time.strftime("%Y-%m-%d %H:%M", time.localtime(_mtime(run.path)))
    return [run.name, run.stage, os.path.basename(os.path.normpath(model)), dataset, steps,
            round(losses[-1], 4) if losses else None, date, status(run, running)]


def table(root: str, running: set[str] | None = None) -> list[list[Any]]:
    return [row(run, running) for run in find_runs(root)]


def _mtime(path: str) -> float:
    latest = os.path.getmtime(path)
    for name in (RUN_CONFIG_FILE, METRICS_FILE, "trainer_state.json"):
        p = os.path.join(path, name)
        if os.path.isfile(p):
            latest = max(latest, os.path.getmtime(p))
    return latest
