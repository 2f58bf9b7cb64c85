"""Every mistake a user reported gets one line on stderr, exit status 2 and no traceback, through the
real command line; the noise real runs printed (DeepSpeed, bitsandbytes, generation flags) is gone;
and a CPU run is told when torch's threads outnumber the cores it can use."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from tunesmith.errors import PathError
from tunesmith.hparams import ModelArguments, parse_run
from tunesmith.models.loader import load_tokenizer
from tunesmith.utils.paths import looks_local
from tunesmith.utils.threads import thread_advice, warn_about_cpu_threads

REPO = Path(__file__).resolve().parents[2]
ROW = {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]}


def cli(script: str, *args: str, cwd: Path, offline: bool = True, stdin: str = "", timeout: int = 300):
    """Run a stage script as a user would, from `cwd`. OMP_NUM_THREADS=1 keeps the shared test cores
    calm, and with it the busy-machine thread note out of the output checked."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, str(REPO / script), *args], input=stdin, capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess, *words: str) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("tunesmith:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def write_jsonl(path: Path, n: int = 4) -> str:
    path.write_text("".join(json.dumps(ROW) + "\n" for _ in range(n)))
    return str(path)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tiny_model_dir) -> tuple[str, str]:
    """Two real LoRA adapters on the tiny model."""
    out = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                               LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
        path = tmp_path_factory.mktemp(f"adapter{seed}")
        model.save_pretrained(path)
        out.append(str(path))
    return out[0], out[1]


# -- models


def test_missing_local_model_fails_at_once_without_asking_the_hub(tmp_path):
    # Online, transformers took the path for a hub id and retried for a minute before blaming the network.
    proc = cli("chat/cli.py", "--model_name_or_path", "outputs/does_not_exist", cwd=tmp_path, offline=False,
               timeout=60)
    assert_one_line_error(proc, "--model_name_or_path outputs/does_not_exist: no such directory",
                          "Give a local model directory")
    assert "huggingface.co" not in proc.stderr and "Retrying" not in proc.stderr


def test_folder_without_a_model_is_named(tmp_path):
    (tmp_path / "run" / "checkpoint-2").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint-2" / "adapter_config.json").write_text("{}")
    proc = cli("chat/cli.py", "--model_name_or_path", "run", cwd=tmp_path)
    assert_one_line_error(proc, "--model_name_or_path run: holds neither a model (config.json) nor a LoRA adapter",
                          "these folders in it do: run/checkpoint-2")


def test_model_folder_without_tokenizer_files_is_a_path_error(tiny_model_dir, tmp_path):
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((Path(tiny_model_dir) / name).read_bytes())
    with pytest.raises(PathError, match=rf"--model_name_or_path {tmp_path}: .*no tokenizer files \(tokenizer.json"):
        load_tokenizer(ModelArguments(model_name_or_path=str(tmp_path)))


def test_what_looks_local(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no outputs/ here, as in a fresh clone
    assert looks_local("outputs/sft_demo") and looks_local("./m") and looks_local("a/b/c")
    assert not looks_local("HuggingFaceTB/SmolLM2-135M-Instruct")


# -- data files


def test_empty_data_file(tmp_path):
    (tmp_path / "empty.jsonl").touch()
    proc = cli("sft/train.py", "--data_path", "empty.jsonl", cwd=tmp_path)
    assert_one_line_error(proc, "data file empty.jsonl: is empty (0 bytes)")


def test_data_file_not_utf8_names_file_line_and_byte(tiny_model_dir, tmp_path):
    good = (json.dumps(ROW) + "\n").encode()
    (tmp_path / "latin1.jsonl").write_bytes(good + json.dumps(ROW, ensure_ascii=False).replace("Hello", "Café").encode("latin-1"))
    byte = len(good) + json.dumps(ROW).index("Hello") + 3
    proc = cli("sft/train.py", "--model_name_or_path", tiny_model_dir, "--data_path", "latin1.jsonl",
               "--output_dir", "out", cwd=tmp_path)
    assert_one_line_error(proc, f"latin1.jsonl:line 2: not UTF-8 text: byte {byte} is 0xe9", "save the file as UTF-8")


def parquet_file(folder: Path) -> Path:
    (folder / "t.parquet").write_bytes(b"PAR1\0\0PAR1")  # Parquet's magic bytes, but no footer to read
    return folder / "t.parquet"


@pytest.mark.parametrize("make, problem", [
    (lambda d: d / "missing.jsonl", "no such file"),
    (lambda d: d, "is a directory; give the JSON/JSONL/Parquet files in it, or a datasets.save_to_disk folder"),
    (parquet_file, "is not a readable Parquet file"),
], ids=["missing", "directory", "damaged parquet"])
def test_unreadable_data_files_stop_before_anything_loads(tmp_path, make, problem):
    path = make(tmp_path)
    with pytest.raises(PathError, match=re.escape(f"data file {path}: {problem}")):
        parse_run("sft", ["--data_path", str(path), "--output_dir", str(tmp_path / "out")])


# -- flags and run configs


def test_unknown_run_config_key_names_file_line_and_suggests(tmp_path):
    (tmp_path / "run.yaml").write_text("data_path: data.jsonl\nlearning_rat: 1.0e-4\n")
    proc = cli("sft/train.py", "run.yaml", cwd=tmp_path)
    assert_one_line_error(proc, "run config run.yaml:2: unknown key `learning_rat` (did you mean learning_rate?)")


def test_unknown_flag_suggests(tmp_path):
    proc = cli("sft/train.py", "--data_path", "data.jsonl", "--learning_rat", "1e-4", cwd=tmp_path)
    assert_one_line_error(proc, "unknown flag --learning_rat (did you mean --learning_rate?)")


def test_output_dir_that_is_a_file(tmp_path):
    write_jsonl(tmp_path / "data.jsonl")
    (tmp_path / "out").write_text("not a folder")
    proc = cli("sft/train.py", "--data_path", "data.jsonl", "--output_dir", "out", cwd=tmp_path)
    assert_one_line_error(proc, "--output_dir out: is a file, not a directory; choose another directory")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores permissions")
def test_output_dir_that_is_not_writable(tmp_path):
    write_jsonl(tmp_path / "data.jsonl")
    (tmp_path / "locked").mkdir(mode=0o555)
    proc = cli("sft/train.py", "--data_path", "data.jsonl", "--output_dir", "locked/run", cwd=tmp_path)
    assert_one_line_error(proc, "--output_dir locked/run: locked is not writable")


def test_a_rules_refusal_is_one_line(tmp_path):
    write_jsonl(tmp_path / "data.jsonl")
    proc = cli("sft/train.py", "--data_path", "data.jsonl", "--quantization_bit", "8",
               "--deepspeed", str(REPO / "configs" / "ds_zero3.json"), cwd=tmp_path)
    assert_one_line_error(proc, "config error: ZeRO-3 cannot partition 8-bit", "use --quantization_bit 4")


def test_merge_refuses_an_adapter_as_the_base(adapters, tmp_path):
    first, second = adapters
    proc = cli("merge/merge_lora.py", "--model_name_or_path", first, "--adapter_name_or_path", second,
               "--output_dir", "merged", cwd=tmp_path)
    assert_one_line_error(proc, f"--model_name_or_path {first} is a LoRA adapter, not a base model")
    assert not (tmp_path / "merged").exists()


def test_merge_output_dir_that_is_a_file_stops_before_loading(adapters, tmp_path):
    (tmp_path / "merged").write_text("not a folder")
    with pytest.raises(PathError, match="--output_dir .*merged: is a file, not a directory; choose another directory"):
        parse_run("merge", ["--adapter_name_or_path", adapters[0], "--output_dir", str(tmp_path / "merged")])


# -- noise


def test_training_run_prints_no_library_noise(tiny_model_dir, tmp_path):
    write_jsonl(tmp_path / "data.jsonl")
    proc = cli("sft/train.py", "--model_name_or_path", tiny_model_dir, "--data_path", "data.jsonl",
               "--output_dir", "out", "--max_steps", "1", "--per_device_train_batch_size", "2",
               "--save_strategy", "no", "--plot_loss", "false", "--report_to", "none", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()  # the save that imports DeepSpeed ran
    assert "Setting accelerator to CPU" not in output  # DeepSpeed, on stdout, at every save
    assert "gemm_4bit_forward" not in output  # bitsandbytes, at import, about a kernel it does not need
    assert "Traceback" not in output


def test_greedy_chat_prints_no_generation_flag_warning(tiny_model_dir, tmp_path):
    proc = cli("chat/cli.py", "--model_name_or_path", tiny_model_dir, "--do_sample", "false",
               "--max_new_tokens", "3", cwd=tmp_path, stdin="Hi\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "generation flags" not in proc.stderr and "top_k" not in proc.stderr


# -- threads


@pytest.mark.parametrize("threads, processes, cores, load, chosen, expected", [
    (2, 1, 2, 0.1, False, None),  # an idle machine, one thread per core
    (4, 2, 8, 1.0, False, None),
    (16, 1, 4, 0.0, False, "set OMP_NUM_THREADS=4"),  # a container limited to 4 of 16 cores
    (8, 4, 8, 0.0, False, "set OMP_NUM_THREADS=2"),  # 4 ranks of 8 threads on 8 cores
    (8, 4, 8, 0.0, True, "set OMP_NUM_THREADS=2"),  # chosen, but still oversubscribed
    (2, 1, 2, 4.0, False, "already busy (1-minute load average 4.0 on the 2 core(s)"),
    (8, 1, 8, 5.0, False, "set OMP_NUM_THREADS=3"),  # 3 cores idle
    (2, 1, 2, 4.0, True, None),  # OMP_NUM_THREADS set: a busy machine is the user's call
    (1, 1, 2, 4.0, False, None),  # already one thread
])
def test_thread_advice(threads, processes, cores, load, chosen, expected):
    advice = thread_advice(threads, processes, cores, load, threads_chosen=chosen)
    assert advice is None if expected is None else expected in advice


@pytest.mark.skipif(torch.cuda.is_available(), reason="the check is for CPU runs")
def test_more_ranks_than_cores_are_warned_about(monkeypatch, caplog):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(len(os.sched_getaffinity(0)) + 1))
    with caplog.at_level("WARNING", logger="tunesmith"):
        warn_about_cpu_threads()
    assert [r.name for r in caplog.records] == ["tunesmith.utils.threads"]
    assert "set OMP_NUM_THREADS=1" in caplog.text
