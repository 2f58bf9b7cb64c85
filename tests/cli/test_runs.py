"""Runs that say what they do: an output_dir holding a run made with other settings is refused (not
silently resumed, nor described by a config it was not made with) unless --overwrite_output_dir,
for SFT, reward and PPO alike. Resuming itself (announced, trained-token count continued, cut-short
checkpoints skipped) is tested with the other SFT runs in test_sft_training.py."""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tunesmith
from tests.features.sft.test_sft_training import run_sft, sft_data, sft_flags  # noqa: F401 (sft_data is a fixture)
from tunesmith.cli import COMMANDS
from tunesmith.errors import ConfigError
from tunesmith.hparams import parse_run, save_run_config
from tunesmith.hparams.run_config import as_saved, describe_differences, result_differences
from tunesmith.train.checkpoints import guard_output_dir

ROOT = Path(__file__).resolve().parents[2]
DEMO = {"reward": ROOT / "data/demo/preference.jsonl", "ppo": ROOT / "data/demo/prompts.jsonl"}


def sft_command(*flags: str) -> subprocess.CompletedProcess:
    """python sft/train.py FLAGS, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "sft/train.py", *flags], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_rerun_with_another_learning_rate_is_refused_until_overwrite(tiny_model_dir, sft_data, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    finished = ("--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1", "--learning_rate", "2e-4")
    run_sft(tiny_model_dir, sft_data, out, *finished)
    kept = {name: (out / name).read_bytes() for name in ("adapter_model.safetensors", "tunesmith_config.json")}

    refused = sft_command(*sft_flags(tiny_model_dir, sft_data, out, *finished, "--learning_rate", "1e-3"))
    assert refused.returncode == 2, refused.stderr
    assert "Traceback" not in refused.stderr
    message = refused.stderr.strip().splitlines()[-1]
    assert message.startswith("tunesmith: config error: --output_dir") and "learning_rate: 0.0002 -> 0.001" in message
    assert "--overwrite_output_dir" in message and "another --output_dir" in message
    assert {name: (out / name).read_bytes() for name in kept} == kept

    replaced = sft_command(*sft_flags(tiny_model_dir, sft_data, out, *finished, "--learning_rate", "1e-3",
                                      "--overwrite_output_dir"))
    assert replaced.returncode == 0, replaced.stderr
    assert "resuming" not in replaced.stderr
    assert "removed 2 old checkpoint(s)" in replaced.stderr
    record = json.loads((out / "tunesmith_config.json").read_text())
    assert record["TrainingArguments"]["learning_rate"] == 1e-3
    assert record["tunesmith"] == {"version": tunesmith.__version__}  # which release made it
    assert (out / "adapter_model.safetensors").read_bytes() != kept["adapter_model.safetensors"]


def test_the_same_command_again_or_longer_is_not_refused(tiny_model_dir, sft_data, tmp_path, caplog):  # noqa: F811
    out = tmp_path / "out"
    run_sft(tiny_model_dir, sft_data, out, "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "2")
    # Everything that only says how long, where, how often to log or save, or on what machine.
    caplog.set_level(logging.INFO, logger="tunesmith")
    longer = run_sft(tiny_model_dir, sft_data, out, "--max_steps", "3", "--save_strategy", "steps", "--save_steps", "1",
                     "--logging_steps", "2", "--save_total_limit", "3", "--report_to", "none", "--run_name", "again",
                     "--dataloader_num_workers", "0", "--gradient_checkpointing", "true")
    assert f"resuming from {out / 'checkpoint-2'} (step 2)" in caplog.messages
    assert longer.state.global_step == 3


@pytest.mark.parametrize("kind", ["reward", "ppo"])
def test_reward_and_ppo_runs_go_through_the_same_guard(kind, tiny_model_dir, tmp_path):
    out = tmp_path / kind
    flags = ["--model_name_or_path", tiny_model_dir, "--data_path", str(DEMO[kind]), "--output_dir", str(out),
             "--report_to", "none"] + (["--reward_model", tiny_model_dir] if kind == "ppo" else [])
    save_run_config(str(out), *parse_run(kind, flags).configs)  # what a finished run leaves behind

    guard_output_dir(parse_run(kind, [*flags, "--max_steps", "7", "--save_steps", "3", "--logging_steps", "5"]))
    recipe = importlib.import_module(COMMANDS[kind])  # a recipe, or a feature's command (ppo: tunesmith.rl)
    # Refused by the recipe itself, before a model or the data loads.
    with pytest.raises(ConfigError, match=r"holds a run made with other settings .*learning_rate: 0\.0002 -> 0\.001"
                                          r".*pass --overwrite_output_dir to start afresh"):
        recipe.run([*flags, "--learning_rate", "1e-3"])


def test_differences_are_listed_up_to_ten_then_counted():
    base = ["--data_path", str(DEMO["reward"]), "--output_dir", "unused", "--report_to", "none"]
    saved = as_saved(*parse_run("sft", base, check_paths=False).configs)
    changed = ["--learning_rate", "1e-3", "--seed", "1", "--lora_r", "8", "--lora_alpha", "8", "--lora_dropout", "0.1",
               "--max_seq_length", "512", "--weight_decay", "0.1", "--warmup_steps", "2", "--max_grad_norm", "0.5",
               "--gradient_accumulation_steps", "2", "--per_device_train_batch_size", "2", "--adam_beta1", "0.8"]
    differences = result_differences(saved, as_saved(*parse_run("sft", base + changed, check_paths=False).configs))
    assert len(differences) == 12 and "seed: 42 -> 1" in differences
    described = describe_differences(differences)
    assert described.count(" -> ") == 10 and described.endswith("; and 2 more")

    other_stage = as_saved(*parse_run("reward", base, check_paths=False).configs)
    assert result_differences(saved, other_stage) == [
        "arguments: ModelArguments+SFTDataArguments+FinetuningArguments+QATArguments+TrainingArguments -> "
        "ModelArguments+TrainDataArguments+RewardArguments+FinetuningArguments+TrainingArguments (another kind of run)"]


def test_overwrite_refuses_to_delete_the_checkpoint_it_is_asked_to_resume(tmp_path):
    (tmp_path / "checkpoint-2").mkdir()
    run = parse_run("sft", ["--data_path", str(DEMO["reward"]), "--output_dir", str(tmp_path), "--overwrite_output_dir",
                            "--resume_from_checkpoint", str(tmp_path / "checkpoint-2")], check_paths=False)
    with pytest.raises(ConfigError, match="pass only one of the two"):
        guard_output_dir(run)
    assert (tmp_path / "checkpoint-2").is_dir()


def test_which_settings_change_a_result_is_read_from_the_dataclasses(monkeypatch):
    """transformers' Trainer settings are sorted by what they are named for, read from the dataclass itself (a
    field a later release adds as hub_*, logging_*, save_* ... is neutral at once); tunesmith's own neutral
    settings are named by their dataclass (`result_neutral`); everything else changes the result."""
    import dataclasses

    from transformers import TrainingArguments as HFTrainingArguments

    from tunesmith.hparams import run_config

    keys = run_config.result_neutral_keys()
    assert {"logging_steps", "save_total_limit", "hub_model_id", "eval_steps", "report_to", "deepspeed",
            "output_dir", "overwrite_output_dir", "max_steps"} <= keys  # transformers' and the redefined ones
    assert {"overwrite_cache", "plot_loss", "rollout_log_samples", "trust_remote_code"} <= keys  # tunesmith's own
    assert not {"learning_rate", "seed", "per_device_train_batch_size", "lora_r", "data_path", "optim",
                "max_seq_length", "kl_coef", "bf16"} & keys

    @dataclasses.dataclass
    class LaterTrainingArguments(HFTrainingArguments):
        hub_new_option: bool = False
        new_regulariser: float = 0.0

    monkeypatch.setattr(run_config, "HFTrainingArguments", LaterTrainingArguments, raising=False)
    monkeypatch.setattr("transformers.TrainingArguments", LaterTrainingArguments)
    later = run_config._neutral_keys()
    assert "hub_new_option" in later and "new_regulariser" not in later
