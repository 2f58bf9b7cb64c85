"""Values that cannot work are refused in one line before anything loads (issue #51): a value out of its range
in every training stage, a null in a run config, a LoRA target the model does not have, a data row longer
than --max_row_bytes (read with bounded memory), and a rerun of a finished run, which leaves its outputs as
they are instead of recording a train_loss of 0.0."""

from __future__ import annotations

import hashlib
import json
import re
import tracemalloc
from pathlib import Path

import pytest

from tests.cli.test_cli_errors import ROW, assert_one_line_error, cli, write_jsonl  # noqa: E402
from tunesmith.chat.rules import BOUNDS as CHAT_BOUNDS  # noqa: E402
from tunesmith.data.formats import BadRows, load_items, read_rows  # noqa: E402
from tunesmith.errors import ConfigError, DataError  # noqa: E402
from tunesmith.evaluation.rules import BOUNDS as EVALUATION_BOUNDS  # noqa: E402
from tunesmith.hparams import RUN_ARGUMENTS, parse_run  # noqa: E402
from tunesmith.hparams.value_bounds import BOUNDS  # noqa: E402
from tunesmith.merge.rules import BOUNDS as MERGE_BOUNDS  # noqa: E402
from tunesmith.preference.rules import BOUNDS as PREFERENCE_BOUNDS  # noqa: E402
from tunesmith.rl.rules import BOUNDS as RL_BOUNDS  # noqa: E402

TRAINING_STAGES = ("sft", "reward", "dpo", "ppo")


def parse(kind: str, *argv: str):
    return parse_run(kind, ["--data_path", "x.jsonl", *argv], check_paths=False)


# -- one value out of its range


@pytest.mark.parametrize("kind", TRAINING_STAGES)
@pytest.mark.parametrize("argv, message", [
    (("--learning_rate", "-1"), r"--learning_rate must be >= 0 \(got -1.0\)"),
    (("--learning_rate", "nan"), r"--learning_rate must be >= 0 \(got nan\)"),
    (("--per_device_train_batch_size", "0"), r"--per_device_train_batch_size must be at least 1 \(got 0\)"),
    (("--per_device_eval_batch_size", "0"), r"--per_device_eval_batch_size must be at least 1 \(got 0\)"),
    (("--gradient_accumulation_steps", "0"), r"--gradient_accumulation_steps must be at least 1 \(got 0\)"),
    (("--max_steps", "-5"), r"--max_steps must be -1 or more \(got -5\); -1 trains --num_train_epochs"),
    (("--num_train_epochs", "0"), r"--num_train_epochs 0.0 with --max_steps -1 trains nothing: set --max_steps N"),
    (("--num_train_epochs", "-2"), r"--num_train_epochs -2.0 with --max_steps -1 trains nothing"),
    (("--save_steps", "0"), r"--save_steps must be > 0 \(got 0.0\)"),
    (("--weight_decay", "-0.1"), r"--weight_decay must be >= 0 \(got -0.1\)"),
    (("--lora_alpha", "0"), r"--lora_alpha must be > 0 \(got 0\); the adapter's output is scaled by lora_alpha"),
    (("--lora_dropout", "1"), r"--lora_dropout must be in \[0, 1\) \(got 1.0\)"),
], ids=lambda v: " ".join(v) if isinstance(v, tuple) else None)
def test_a_value_out_of_range_is_refused_in_every_training_stage(kind, argv, message):
    with pytest.raises(ConfigError, match=message):
        parse(kind, *argv)


@pytest.mark.parametrize("kind, argv, message", [
    ("ppo", ("--max_prompt_length", "0"), r"--max_prompt_length must be at least 1 token \(got 0\)"),
    ("ppo", ("--adaptive_kl", "--kl_horizon", "0"), r"--kl_horizon must be > 0 \(got 0.0\)"),
    ("ppo", ("--top_p", "0"), r"--top_p must be in \(0, 1\] \(got 0.0\)"),
    ("ppo", ("--rollout_log_samples", "-1"), r"--rollout_log_samples must be >= 0 \(got -1\); 0 prints none"),
    ("sft", ("--max_image_pixels", "0"), r"--max_image_pixels must be at least 1 pixel \(got 0\)"),
    ("sft", ("--max_row_bytes", "100"), r"--max_row_bytes must be at least 1024 bytes \(got 100\)"),
    ("chat", ("--top_k", "-1"), r"--top_k must be >= 0 \(got -1\); 0 turns it off"),
    ("chat", ("--repetition_penalty", "0"), r"--repetition_penalty must be > 0 \(got 0.0\)"),
    ("score", ("--batch_size", "0"), r"--batch_size must be at least 1 \(got 0\)"),
])
def test_a_stage_value_out_of_range_is_refused(kind, argv, message):
    data = [] if kind == "chat" else ["--data_path", "x.jsonl"]  # chat reads no data file
    with pytest.raises(ConfigError, match=message):
        parse_run(kind, [*data, *argv], check_paths=False)


def test_values_at_their_bounds_pass():
    run = parse("sft", "--learning_rate", "0", "--max_steps", "0", "--lora_dropout", "0", "--save_strategy", "no",
                "--save_steps", "0", "--max_row_bytes", "1024")
    assert run.training.learning_rate == 0 and run.finetuning.lora_dropout == 0 and run.data.max_row_bytes == 1024
    assert parse("sft", "--finetuning_type", "full", "--lora_alpha", "0").finetuning.lora_alpha == 0  # not read


def test_every_bound_names_a_field_of_its_role():
    """A misspelt field would pass every value silently (a role's dataclass without it passes)."""
    fields = {}
    for dataclasses in RUN_ARGUMENTS.values():
        for dtype in dataclasses:
            fields.setdefault(dtype.role, set()).update(dtype.__dataclass_fields__)
    assert [(b.role, b.field) for b in (*BOUNDS, *RL_BOUNDS, *CHAT_BOUNDS, *MERGE_BOUNDS, *EVALUATION_BOUNDS,
                                        *PREFERENCE_BOUNDS) if b.field not in fields.get(b.role, ())] == []


# -- nulls in a run config


def test_a_null_output_dir_in_a_run_config_is_refused(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("data_path: x.jsonl\noutput_dir: null\n")
    with pytest.raises(ConfigError, match=re.escape(f"run config {config}:2: `output_dir` is null: give a value, "
                                                    "or leave the key out for its default (outputs/run)")):
        parse_run("sft", [str(config)], check_paths=False)


def test_a_null_in_a_list_is_refused_and_a_null_default_is_left_out(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("data_path: [x.jsonl, null]\n")
    with pytest.raises(ConfigError, match=r"run.yaml:1: `data_path` is null: give a value"):
        parse_run("sft", [str(config)], check_paths=False)
    config.write_text("data_path: x.jsonl\nquantization_bit: ~\nmax_samples: null\n")
    run = parse_run("sft", [str(config)], check_paths=False)
    assert run.model.quantization_bit is None and run.data.max_samples is None


def test_run_config_with_bad_values_is_one_line_at_the_command_line(tmp_path):
    write_jsonl(tmp_path / "data.jsonl")
    (tmp_path / "run.yaml").write_text("data_path: data.jsonl\nlearning_rate: -1\n")
    assert_one_line_error(cli("sft/train.py", "run.yaml", cwd=tmp_path), "config error: --learning_rate must be >= 0")
    (tmp_path / "run.yaml").write_text("data_path: data.jsonl\noutput_dir: null\n")
    assert_one_line_error(cli("sft/train.py", "run.yaml", cwd=tmp_path), "run config run.yaml:2: `output_dir` is null")
    assert not (tmp_path / "None").exists()


# -- LoRA targets


def test_a_lora_target_the_model_lacks_is_named_with_near_matches(tiny_model_dir, tmp_path):
    from tunesmith.sft.command import run

    data = write_jsonl(tmp_path / "data.jsonl")
    argv = ["--model_name_or_path", tiny_model_dir, "--data_path", data, "--output_dir", str(tmp_path / "out"),
            "--max_steps", "1", "--report_to", "none"]
    with pytest.raises(ConfigError, match=r"--lora_target q_prj: no module of this model is named so \(did you mean "
                                          r"q_proj, v_proj or o_proj\?\); its linear layers are down_proj, gate_proj, k_proj, o_proj, "
                                          r"q_proj, up_proj, v_proj, or give `all`"):
        run([*argv, "--lora_target", "q_proj", "q_prj"])  # one good target among them: PEFT would say nothing
    assert not (tmp_path / "out" / "adapter_model.safetensors").exists()


# -- the length of a data row


def test_a_long_jsonl_line_is_a_bad_row_named_with_the_flag(tmp_path):
    path = tmp_path / "long.jsonl"
    huge = {"messages": [{"role": "user", "content": "x" * (24 * 2**20)}, ROW["messages"][1]]}
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(huge) + "\n" + json.dumps(ROW) + "\n")
    tracemalloc.start()
    try:
        rows = list(read_rows(path, strict=False, max_row_bytes=2**20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20  # the 24 MB line is read a MiB at a time and dropped, never held whole
    assert [type(r).__name__ for r in rows] == ["Row", "DataError", "Row"]
    assert str(rows[1]) == (f"{path}:line 2: the row is longer than --max_row_bytes 1048576 (1 MiB): fix it (a file "
                            "with no line breaks, a pasted dump?), or raise --max_row_bytes")
    assert rows[2].line == 3
    with pytest.raises(BadRows, match=r"long.jsonl:line 2: the row is longer than --max_row_bytes"):
        load_items([str(path)], lambda row: row, max_row_bytes=2**20)
    assert len(load_items([str(path)], lambda row: row, skip_bad_rows=True, max_row_bytes=2**20)[0]) == 2


def test_a_long_element_of_a_json_array_stops_the_read(tmp_path):
    path = tmp_path / "long.json"
    huge = {"messages": [{"role": "user", "content": "x" * (24 * 2**20)}, ROW["messages"][1]]}
    path.write_text(json.dumps([ROW, huge, ROW], indent=1))
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=re.escape(f"{path}:line 14 (row 2): the row is longer than "
                                                      "--max_row_bytes 1048576")):
            list(read_rows(path, max_row_bytes=2**20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20
    assert [r.index for r in read_rows(path)] == [1, 2, 3]  # the default bound, 64 MiB, reads it


def test_a_json_array_far_larger_than_the_bound_is_read_element_by_element(tmp_path):
    rows = [{"n": i, **ROW} for i in range(12000)]  # about 3 MB indented: several of the reader's 1 MiB reads
    path = tmp_path / "many.json"
    path.write_text("\ufeff" + json.dumps(rows, indent=2))
    read = list(read_rows(path, max_row_bytes=1024))  # each element fits the bound; the file is 3,000 times it
    assert [r.data["n"] for r in read] == list(range(12000))
    text = path.read_text(encoding="utf-8-sig")
    for n in (0, 5000, 11999):  # each element's line is its "{", the line before its first key
        assert read[n].line == text.count("\n", 0, text.index(f'"n": {n},'))
    path.write_text('[{"a": 1},\n{"a": 2,,}]')
    with pytest.raises(DataError, match=r"many.json:line 2: not valid JSON"):
        list(read_rows(path))


# -- a rerun of a finished run


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_rerunning_a_finished_run_leaves_its_outputs_alone(tiny_model_dir, tmp_path, caplog):
    from tunesmith.sft.command import run

    data = write_jsonl(tmp_path / "data.jsonl", n=8)
    out = tmp_path / "out"
    common = ["--model_name_or_path", tiny_model_dir, "--data_path", data, "--output_dir", str(out),
              "--per_device_train_batch_size", "2", "--save_steps", "1", "--report_to", "none", "--plot_loss", "false"]
    argv = [*common, "--max_steps", "2"]
    run(argv)
    before = snapshot(out)
    loss = json.loads((out / "trainer_state.json").read_text())["log_history"][-1]["train_loss"]
    assert loss > 0
    with caplog.at_level("INFO", logger="tunesmith"), pytest.raises(SystemExit) as exited:
        run(argv)
    assert exited.value.code == 0
    assert f"--output_dir {out} already holds this run, finished at step 2" in caplog.text
    assert snapshot(out) == before
    # asked for more steps, the same command continues from the last checkpoint
    run([*common, "--max_steps", "3"])
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and state["log_history"][-1]["train_loss"] > 0
    # a longer run whose final save failed (a full disk) leaves step 3's final save beside checkpoint-4: not
    # finished, so the rerun resumes checkpoint-4 and makes the final save instead of leaving step 3's in place
    final_of_step_3 = (out / "trainer_state.json").read_text()
    run([*common, "--max_steps", "4"])
    (out / "trainer_state.json").write_text(final_of_step_3)
    with caplog.at_level("INFO", logger="tunesmith"):
        run([*common, "--max_steps", "4"])
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4


def test_training_data_and_inspect_take_the_flag(tiny_model_dir, tokenizer, tmp_path, monkeypatch):
    from tunesmith.data.dataset import build_sft_datasets
    from tunesmith.hparams import SFTDataArguments
    from tunesmith.inspect.command import run as inspect

    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "data.jsonl"
    long_row = {"messages": [{"role": "user", "content": "x" * 3000}, ROW["messages"][1]]}
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(long_row) + "\n")
    with pytest.raises(BadRows, match=r"data.jsonl:line 2: the row is longer than --max_row_bytes 1024"):
        build_sft_datasets(tokenizer, SFTDataArguments(data_path=[str(path)], max_row_bytes=1024))
    out = tmp_path / "encoded.jsonl"
    inspect(["--model_name_or_path", tiny_model_dir, "--data_path", str(path), "--max_row_bytes", "1024",
             "--output_file", str(out), "--show", "0"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r.get("line") for r in records][0] == 1 and "--max_row_bytes 1024" in records[1]["error"]


def test_rerunning_a_finished_grpo_run_leaves_its_outputs_alone(tiny_model_dir, tmp_path):
    """The RL loop ends its final save with trainer_state.json in output_dir, as the Trainer stages do."""
    from tunesmith.rl.command import run

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {w}.", "answer": w}) + "\n" for w in "abcd"))
    out = tmp_path / "out"
    argv = ["--model_name_or_path", tiny_model_dir, "--data_path", str(data), "--output_dir", str(out),
            "--reward_funcs", "exact_answer", "--advantage", "grpo", "--samples_per_prompt", "2",
            "--per_device_train_batch_size", "4", "--max_new_tokens", "4", "--ppo_epochs", "1", "--save_steps", "1",
            "--max_steps", "2", "--report_to", "none", "--lora_r", "4"]
    run(argv)
    before = snapshot(out)
    with pytest.raises(SystemExit) as exited:
        run(argv)
    assert exited.value.code == 0 and snapshot(out) == before
