"""The rows of `tunesmith vllm-serve`, checked after the core's (hparams/rules.py)."""

from __future__ import annotations

from ..generation.vllm_server import LOOPBACK
from ..hparams.rule_engine import Rule

RULES: list[Rule] = [
    Rule("vllm_serve_api_key", ("vllm_serve",), lambda a: a.vllm_serve.host not in LOOPBACK and not a.vllm_serve.key(),
         "--host {vllm_serve.host} serves the model to every machine that can reach this one: give --api_key KEY "
         "(or set VLLM_API_KEY, which the trainer reads too), or keep --host 127.0.0.1."),
    Rule("vllm_serve_port", ("vllm_serve",), lambda a: not 0 < a.vllm_serve.port < 65536,
         "--port must be between 1 and 65535 (got {vllm_serve.port})."),
    Rule("vllm_serve_lora_rank", ("vllm_serve",), lambda a: a.vllm_serve.max_lora_rank < 1,
         "--max_lora_rank must be at least 1 (got {vllm_serve.max_lora_rank})."),
    Rule("vllm_serve_kv_cache", ("vllm_serve",), lambda a: a.vllm_serve.kv_cache_gib < 1,
         "--kv_cache_gib must be at least 1 (got {vllm_serve.kv_cache_gib}): vLLM takes whole GiB."),
]
