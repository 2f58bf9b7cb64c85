"""Start vLLM's OpenAI server for tunesmith's rollouts: the model the trainer trains (an adapter's base), LoRA on
with runtime updates, full-weight reloads, the log-probabilities of the sampling distribution, no prefix cache; its
own venv (scripts/setup_vllm.sh). Then train against it:

    bash scripts/setup_vllm.sh                                  # once: vLLM's own venv, cached
    tunesmith vllm-serve --port 8000                             # the embedded default model, float32 on a CPU
    tunesmith ppo configs/grpo_demo.yaml --rollout_engine vllm --vllm_url http://127.0.0.1:8000

Read top to bottom: parse -> the base model's folder and dtype as the trainer resolves them -> vLLM's command line
(generation/vllm_server.py) -> run it in the foreground until Ctrl-C."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence

from ..boundary import entry_point
from ..generation.vllm_server import VLLMServer, VLLMServerSettings
from ..hparams import parse_run
from ..models.loader import resolve_dtype, resolve_model_path

logger = logging.getLogger(__name__)


def run(argv: Sequence[str] | None = None) -> None:
    args = parse_run("vllm_serve", argv, __doc__)
    options = args.vllm_serve
    dtype = str(resolve_dtype(args.model)).removeprefix("torch.")  # the trainer's default: float32 on a CPU
    settings = VLLMServerSettings(
        model=resolve_model_path(args.model), host=options.host, port=options.port, dtype=dtype, seed=options.seed,
        max_model_len=options.max_model_len, max_lora_rank=options.max_lora_rank, api_key=options.key(), rl=True,
        kv_cache_gib=options.kv_cache_gib, extra_args=shlex.split(options.vllm_args))
    server = VLLMServer(settings, log_file=options.log_file)
    print(f"vLLM at {settings.url} for {settings.model} ({dtype}); train with: --rollout_engine vllm --vllm_url "
          f"{settings.url}", flush=True)
    with server:
        print(f"vLLM ready at {settings.url}", flush=True)
        try:
            server.process.wait()
        except KeyboardInterrupt:
            pass


main = entry_point(run)
