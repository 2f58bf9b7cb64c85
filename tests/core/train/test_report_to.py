"""`--report_to wandb` with wandb offline (WANDB_MODE=offline: no account, no network), as for TensorBoard: the
Trainer stages through transformers' callback, PPO/GRPO/RLOO through accelerate's trackers. The offline run file
is read back and holds what metrics.jsonl holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.rows import write_jsonl

pytest.importorskip("wandb")

ROOT = Path(__file__).resolve().parents[3]
BLOCK = 32768  # the .wandb file is a LevelDB log: 32 KiB blocks of records, each with a 7-byte header


def wandb_history(run_file: Path) -> list[dict]:
    """The history rows (wandb.log calls) of an offline run's run-*.wandb file."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    records, chunk, pos = [], b"", 7
    while pos + 7 <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        kind = data[pos + 6] if left_in_block >= 7 else 0
        if kind == 0:  # the zero padding at a block's end
            pos += left_in_block
            continue
        length = int.from_bytes(data[pos + 4:pos + 6], "little")
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            records.append(chunk)
            chunk = b""
    history = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
    return history


def run_offline(stage: str, args: list[str], tmp_path: Path) -> Path:
    """Run a stage as users do (its own process: the run ends when the process does) with wandb offline; the
    run's .wandb file."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "tunesmith", stage, *args, "--report_to", "wandb"], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    return run


def test_sft_logs_to_wandb_offline(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": f"Say {w}."},
                                                            {"role": "assistant", "content": w}]}
                                              for w in ("cat", "dog", "sun", "tea")])
    out = tmp_path / "sft"
    run = run_offline("sft", ["--model_name_or_path", tiny_model_dir, "--data_path", data, "--output_dir", str(out),
                              "--max_steps", "2", "--per_device_train_batch_size", "2", "--logging_steps", "1",
                              "--save_strategy", "no", "--plot_loss", "false"], tmp_path)
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    history = [row for row in wandb_history(run) if "train/loss" in row]
    assert [row["train/loss"] for row in history] == pytest.approx([row["loss"] for row in logged])
    assert [row["train/global_step"] for row in history] == [1, 2]


@pytest.mark.heavy  # the same report_to path as SFT's above, through the RL trainer
def test_grpo_logs_to_wandb_offline(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)])
    out = tmp_path / "grpo"
    run = run_offline("ppo", ["--model_name_or_path", tiny_model_dir, "--data_path", data, "--output_dir", str(out),
                              "--advantage", "grpo", "--samples_per_prompt", "2", "--reward_funcs", "exact_answer",
                              "answer_format", "--per_device_train_batch_size", "4", "--max_new_tokens", "4",
                              "--ppo_epochs", "1", "--max_steps", "2", "--save_strategy", "no", "--lora_r", "4"],
                      tmp_path)
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    history = [row for row in wandb_history(run) if "train/score" in row]  # named as the Trainer stages name them
    assert [row["train/global_step"] for row in history] == [1, 2]
    for row, wrote in zip(history, logged):
        assert {k: row[f"train/{k}"] for k in ("score", "kl", "score/exact_answer")} == pytest.approx(
            {k: wrote[k] for k in ("score", "kl", "score/exact_answer")})
