"""The version: `tunesmith --version` prints setup.cfg's version (through the installed package's metadata, as
`tunesmith.__version__` reads it), and every run's tunesmith_config.json records it without making a run saved
by another release (or by one that recorded none) a different run."""

from __future__ import annotations

import configparser
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import tunesmith
from tunesmith.hparams import parse_run, save_run_config
from tunesmith.hparams.run_config import as_saved, result_differences

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
FLAGS = ["--data_path", str(ROOT / "data/demo/sft.jsonl"), "--output_dir", "unused", "--report_to", "none"]


def setup_cfg_version() -> str:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config["metadata"]["version"]


def test_version_prints_setup_cfgs_version():
    expected = setup_cfg_version()
    assert tunesmith.__version__ == importlib.metadata.version("tunesmith") == expected
    for flag in ("--version", "-V"):
        proc = subprocess.run([sys.executable, "-m", "tunesmith", flag], capture_output=True, text=True, env=ENV,
                              cwd=ROOT, timeout=120)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"tunesmith {expected}\n", "")
    console_script = Path(sys.executable).with_name("tunesmith")  # what `pip install` put in the venv
    proc = subprocess.run([str(console_script), "--version"], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.stdout == f"tunesmith {expected}\n"
    usage = subprocess.run([sys.executable, "-m", "tunesmith", "--help"], capture_output=True, text=True, env=ENV,
                           cwd=ROOT, timeout=120).stdout
    assert "`tunesmith --version` prints the version" in usage


def test_every_run_config_records_the_tunesmith_version(tmp_path):
    save_run_config(str(tmp_path), *parse_run("sft", FLAGS, check_paths=False).configs)
    record = json.loads((tmp_path / "tunesmith_config.json").read_text(encoding="utf-8"))
    assert list(record)[0] == "tunesmith" and record["tunesmith"] == {"version": tunesmith.__version__}
    assert record["TrainingArguments"]["learning_rate"] == 2e-4  # the settings are still all there


def test_a_run_saved_by_another_version_or_none_is_compared_by_its_settings_alone():
    saved = as_saved(*parse_run("sft", FLAGS, check_paths=False).configs)
    same = as_saved(*parse_run("sft", FLAGS, check_paths=False).configs)
    changed = as_saved(*parse_run("sft", [*FLAGS, "--learning_rate", "1e-3"], check_paths=False).configs)
    for record in ({"tunesmith": {"version": "0.0.1"}, **saved}, saved):  # another release; one before the record
        assert result_differences(record, same) == []
        assert result_differences(record, changed) == ["learning_rate: 0.0002 -> 0.001"]
    assert result_differences(saved, {"tunesmith": {"version": "9.9"}, **same}) == []
