"""The one front door: the `tunesmith` command, one parser for every kind of run (old flag spellings,
unknown flags and keys, `--help` order), and the one error boundary."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunesmith.boundary import EXIT_USER_ERROR, entry_point
from tunesmith.cli import COMMANDS
from tunesmith.errors import ConfigError, DataError
from tunesmith.hparams import RUN_ARGUMENTS, parse_run
from tunesmith.hparams.run_kinds import FEATURE_RUNS

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def tunesmith(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tunesmith", *args], capture_output=True, text=True, env=ENV,
                          cwd=ROOT, timeout=timeout)


def test_every_command_has_a_recipe_with_a_summary_and_a_run_kind():
    proc = tunesmith("--help")
    assert proc.returncode == 0
    for name, module in COMMANDS.items():
        line = next(line for line in proc.stdout.splitlines() if line.strip().startswith(name + " "))
        assert len(line.split(None, 1)[1]) > 20, f"{name}: no summary"
        # a recipe's name, or the kind whose feature package holds the command (tunesmith ppo: tunesmith.rl)
        features = {f"{package}.command": kind for kind, package in FEATURE_RUNS.items()}
        assert features.get(module, module.rsplit(".", 1)[1]) in RUN_ARGUMENTS
    bad = tunesmith("fine-tune")
    assert bad.returncode == 2 and "unknown command 'fine-tune'" in bad.stderr and "Traceback" not in bad.stderr


def test_stage_help_opens_with_the_stage_and_lists_tunesmith_flags_before_the_trainers():
    proc = tunesmith("sft", "--help")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("usage: tunesmith sft [RUN_CONFIG.yaml] [--flag value ...]\n\nSupervised fine-tuning")
    assert "Run config: the first argument may be a YAML or JSON file" in out
    for ours in ("--data_path", "--lora_r", "--learning_rate", "--deepspeed", "--overwrite_output_dir"):
        assert out.index(ours) < out.index("transformers Trainer options"), ours
    assert out.index("transformers Trainer options") < out.index("--adam_beta1")
    assert "(default: None)" not in out


def _adapter_dir(tmp_path: Path, base: str) -> str:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
    return str(adapter)


def test_old_flag_spellings_still_work_with_a_deprecation_line(tmp_path, tiny_model_dir, caplog):
    adapter = _adapter_dir(tmp_path, tiny_model_dir)
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        run = parse_run("merge", ["--adapter", adapter, "--output_dir", str(tmp_path / "m"), "--overwrite"])
    assert run.model.adapter_name_or_path == adapter and run.merge.overwrite_output_dir is True
    assert run.model.model_name_or_path == tiny_model_dir  # the base recorded by the adapter
    assert "--adapter is deprecated, use --adapter_name_or_path" in caplog.text
    assert "--overwrite is deprecated, use --overwrite_output_dir" in caplog.text

    config = tmp_path / "chat.yaml"
    config.write_text("max_input_tokens: 64\n")
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        assert parse_run("chat", [str(config)]).chat.max_prompt_length == 64
    assert f"run config {config}:1: --max_input_tokens is deprecated, use --max_prompt_length" in caplog.text

    # score and inspect wrote --output_jsonl; every command's output file is --output_file now
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        run = parse_run("score", ["--model_name_or_path", tiny_model_dir, "--data_path", str(config),
                                  "--output_jsonl", "s.jsonl"])
    assert run.score.output_file == "s.jsonl"
    assert "--output_jsonl is deprecated, use --output_file" in caplog.text


def test_an_adapter_given_as_the_model_becomes_the_adapter_on_its_recorded_base(tmp_path, tiny_model_dir):
    adapter = _adapter_dir(tmp_path, tiny_model_dir)
    run = parse_run("chat", ["--model_name_or_path", adapter])
    assert (run.model.model_name_or_path, run.model.adapter_name_or_path) == (tiny_model_dir, adapter)


@pytest.mark.parametrize("argv, message", [
    (["--lerning_rate", "1e-3"], r"unknown flag --lerning_rate \(did you mean --learning_rate\?\)"),
    (["--data_path=x.jsonl", "--lora_alpah", "8"], r"unknown flag --lora_alpah \(did you mean --lora_alpha\?\)"),
    (["data.jsonl"], r"unexpected argument 'data.jsonl': the first argument may be a run config"),
    (["--data_path", "x.jsonl", "--learning"], r"unknown flag --learning "),  # no silent prefix match
    # transformers' own check in TrainingArguments.__post_init__, as a ConfigError
    (["--data_path", "x.jsonl", "--val_size", "0.1", "--load_best_model_at_end", "true", "--eval_strategy", "no"],
     r"^--load_best_model_at_end requires the save and eval strategy to match"),
])
def test_unknown_and_malformed_flags_are_named(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_run("sft", argv, check_paths=False)


def test_unknown_run_config_key_names_file_line_and_suggests(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("data_path: x.jsonl\n\nlerning_rate: 1.0e-3\n")
    with pytest.raises(ConfigError, match=rf"run config {config}:3: unknown key `lerning_rate` \(did you mean "
                                          r"learning_rate\?\)"):
        parse_run("sft", [str(config)], check_paths=False)
    broken = tmp_path / "broken.yaml"
    broken.write_text("data_path: [x.jsonl\nlora_r: 8\n")
    with pytest.raises(ConfigError, match=rf"run config {broken}:\d+: not valid YAML/JSON"):
        parse_run("sft", [str(broken)], check_paths=False)


def test_the_boundary_prints_one_line_and_exits_2_and_shows_the_traceback_with_debug(capsys):
    def run(argv):
        raise DataError("data.jsonl:line 3: field `messages`: expected a list")

    main = entry_point(run)
    with pytest.raises(SystemExit) as exit_info:
        main([])
    err = capsys.readouterr().err
    assert exit_info.value.code == EXIT_USER_ERROR
    assert err == "tunesmith: data error: data.jsonl:line 3: field `messages`: expected a list\n"
    with pytest.raises(SystemExit):
        main(["--debug"])
    assert "Traceback" in capsys.readouterr().err


def test_a_bug_keeps_its_traceback(capsys):
    def run(argv):
        raise KeyError("internal")

    with pytest.raises(KeyError):
        entry_point(run)([])


@pytest.mark.heavy  # the deprecated spellings, each a process (~1.7 min loaded); -m heavy
def test_the_old_evaluation_commands_still_run_and_help_lists_only_eval():
    listed = tunesmith("--help").stdout
    assert "\n  eval " in listed and "eval-policy" not in listed and "eval-rl" not in listed
    from tunesmith.cli import HIDDEN_COMMANDS

    assert set(HIDDEN_COMMANDS) == {"eval-policy", "eval-ppo", "eval-rl"}
    proc = tunesmith("eval-rl", "--help")  # one of them run for real (they share one module)
    assert proc.returncode == 0 and "--reward_funcs" in proc.stdout
    front = tunesmith("eval", "--help").stdout
    assert "--tasks" in front and "--compare_to" in front and "tunesmith eval --policy" in front


def test_help_examples_keep_their_line_breaks():
    """A backslash at the end of a docstring line joins it to the next in the string (the `--help` text), so
    a continued example must spell it `\\\\`: no flag may follow a run of spaces mid-line."""
    import ast
    import importlib.util
    import re

    for name, module in COMMANDS.items():
        source = Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8")
        doc = ast.get_docstring(ast.parse(source), clean=False) or ""
        assert not re.search(r"\S {4,}--", doc), f"{name}: an example's lines were joined"
