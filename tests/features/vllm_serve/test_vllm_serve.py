"""`tunesmith vllm-serve` (tunesmith/vllm_serve/): each of its rows refuses in one line before anything starts, the
server it starts is the rollout server the trainer expects (the model's folder and dtype as the trainer resolves
them, LoRA updates on, no prefix cache), and without vLLM's venv it says how to get one. The server itself, run for
real, is tests/features/rl/test_vllm.py's (marker vllm)."""

from __future__ import annotations

import importlib.util

import pytest

from tunesmith.errors import ConfigError
from tunesmith.hparams import parse_run
from tunesmith.vllm_serve import command


@pytest.mark.parametrize("flags, message", [
    (["--host", "0.0.0.0"], r"--host 0.0.0.0 serves the model to every machine that can reach this one: give "
                            r"--api_key KEY"),
    (["--port", "0"], r"--port must be between 1 and 65535 \(got 0\)"),
    (["--max_lora_rank", "0"], r"--max_lora_rank must be at least 1 \(got 0\)"),
    (["--kv_cache_gib", "0"], r"--kv_cache_gib must be at least 1 \(got 0\): vLLM takes whole GiB"),
])
def test_each_row_refuses_in_one_line(flags, message, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(ConfigError, match=message):
        parse_run("vllm_serve", flags, check_paths=False)


def test_a_key_from_the_environment_lets_the_server_listen_beyond_loopback(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "secret")
    assert parse_run("vllm_serve", ["--host", "0.0.0.0"], check_paths=False).vllm_serve.key() == "secret"


class RecordingServer:
    """Stands where vLLM's process would: records what the command starts it with, and ends at once."""

    started: list = []

    def __init__(self, settings, log_file=None):
        self.settings, self.log_file = settings, log_file
        self.process = self

    def __enter__(self):
        RecordingServer.started.append(self)
        return self

    def __exit__(self, *exc):
        return False

    def wait(self):
        return 0


def test_the_server_is_started_as_the_trainer_expects_its_rollout_server(tiny_model_dir, tmp_path, monkeypatch,
                                                                          capsys):
    monkeypatch.setattr(command, "VLLMServer", RecordingServer)
    RecordingServer.started = []
    command.run(["--model_name_or_path", tiny_model_dir, "--port", "8123", "--max_lora_rank", "16",
                 "--vllm_args", "--max-num-seqs 4", "--log_file", str(tmp_path / "vllm.log")])
    (server,) = RecordingServer.started
    argv = server.settings.argv("python")
    assert argv[argv.index("--model") + 1] == tiny_model_dir
    assert argv[argv.index("--dtype") + 1] == "float32"  # the trainer's default on a CPU
    assert argv[argv.index("--max-lora-rank") + 1] == "16" and "--enable-lora" in argv
    assert "--no-enable-prefix-caching" in argv and argv[-2:] == ["--max-num-seqs", "4"]
    assert server.log_file == str(tmp_path / "vllm.log")
    assert "--rollout_engine vllm --vllm_url http://127.0.0.1:8123" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this venv")
def test_without_vllms_venv_the_command_says_how_to_get_one(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TUNESMITH_VLLM_VENV", str(tmp_path / "no-venv"))
    with pytest.raises(SystemExit) as stop:
        command.main(["--model_name_or_path", tiny_model_dir])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip()
    assert "Traceback" not in error and len(error.splitlines()) == 1
    assert "vLLM is not installed: run `bash scripts/setup_vllm.sh` once" in error
