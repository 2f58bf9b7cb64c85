"""The engine a training run samples with (--rollout_engine), chosen in one place for every stage that samples while
it trains (tunesmith ppo's rollouts, distill's on-policy replies), and the check that a vLLM server's weights are
the trainer's: the same log-probabilities of the same tokens."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import ConfigError
from ..hparams.rollout_args import SERVER_HINT, RolloutEngineArguments, colocation_problem, cuda_with_vllm
from .engine import Engine
from .vllm_client import VLLMEngine, VLLMRollouts

logger = logging.getLogger(__name__)

SYNC_FOLDER = "vllm_sync"  # inside output_dir, unless --vllm_sync_dir names another

# How far the server's log-probabilities of the policy's own tokens may be from the trainer's (mean |difference|,
# nats) before the server is said to serve another model: float32 on both sides agrees to about 1e-5 here, bf16 to a
# few hundredths; another model, or weights a step old, is tenths or more away.
SAME_MODEL_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.05}


def rollout_engine(args: RolloutEngineArguments, model: torch.nn.Module, tokenizer: Any, output_dir: str,
                   synced: bool = False, dtype: torch.dtype | None = None) -> Engine | VLLMRollouts:
    """tunesmith's engine on `model`, a vLLM server (--vllm_url), or vLLM colocated in this process; one log line
    says which. `dtype`: the precision the run computes in (colocated vLLM samples in it)."""
    if not args.uses_vllm:
        why = "--rollout_engine tunesmith" if args.rollout_engine == "tunesmith" else auto_colocation_blocker(model,
                                                                                                             synced)
        if why is None:  # auto, on a CUDA device with vLLM beside the trainer
            logger.info("rollout engine: auto, no --vllm_url given, a CUDA device and vLLM beside the trainer")
            return colocated_engine(args, model, tokenizer, args.vllm_sync_dir or os.path.join(output_dir, SYNC_FOLDER),
                                    dtype)
        logger.info("rollout engine: tunesmith's own, on the trainer's devices (%s)", why)
        return Engine(model, tokenizer, synced=synced)
    if not hasattr(model, "peft_config") and tied_output_head(model):
        raise ConfigError("--rollout_engine vllm with a full fine-tune of a model whose output head is its input "
                          "embeddings (tie_word_embeddings): vLLM 0.32 reloads weights in place layer by layer and "
                          "leaves a tied head at its old weights (it logs 'ParallelLMHead: Failed to load weights'), "
                          "so its replies would come from a model the trainer never had. Train LoRA (handed over as "
                          "an adapter), or use --rollout_engine tunesmith")
    sync_dir = args.vllm_sync_dir or os.path.join(output_dir, SYNC_FOLDER)
    if args.colocated:
        return colocated_engine(args, model, tokenizer, sync_dir, dtype)
    engine = VLLMEngine(args.vllm_url, tokenizer, sync_dir, timeout=args.vllm_timeout)
    logger.info("rollout engine: vLLM at %s (serving %s); the policy's weights go through %s after each optimizer "
                "step", args.vllm_url, engine.base_root, sync_dir)
    return engine


def auto_colocation_blocker(model: torch.nn.Module, synced: bool) -> str | None:
    """Why --rollout_engine auto keeps tunesmith's engine rather than colocating vLLM (None: nothing does). auto
    colocates only where nothing would refuse it: a CUDA device, vLLM beside the trainer's transformers, one process,
    weights whole (not ZeRO-3's shards), a LoRA or full policy vLLM can load."""
    if not cuda_with_vllm():
        return "auto, no --vllm_url given" + ("" if torch.cuda.is_available() else ", no CUDA device")
    problem = colocation_problem()
    if problem:
        return "auto: vLLM is installed but cannot colocate: " + problem.split(":", 1)[0]
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        return "auto: several processes, each of which would hold a vLLM; --vllm_url names a server they share"
    if synced:
        return "auto: ZeRO-3 shards the weights"
    peft_types = {str(c.peft_type) for c in getattr(model, "peft_config", {}).values()}
    if peft_types - {"LORA", "PeftType.LORA"}:
        return "auto: a prompt-based adapter, which vLLM does not serve"
    if not peft_types and tied_output_head(model):
        return "auto: a full fine-tune of a tied output head, which vLLM's reload leaves behind"
    return None


def colocated_engine(args: RolloutEngineArguments, model: torch.nn.Module, tokenizer: Any, sync_dir: str,
                     dtype: torch.dtype | None) -> VLLMRollouts:
    """vLLM in this process, on the policy's device: a run of one process only (each rank would hold a vLLM of its
    own, whose in-process worker joins a world of one)."""
    processes = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if processes > 1:
        raise ConfigError(f"colocated vLLM (--rollout_engine vllm without --vllm_url) runs in a run of one process, "
                          f"and this one has {processes}: {SERVER_HINT}")
    problem = colocation_problem()
    if problem:
        raise ConfigError(problem)
    from .vllm_colocated import colocated_engine_for

    engine = colocated_engine_for(model, tokenizer, sync_dir, args.vllm_max_model_len,
                                  args.vllm_gpu_memory_utilization, args.vllm_kv_cache_gib,
                                  args.vllm_enable_sleep_mode, dtype)
    logger.info("rollout engine: vLLM colocated in the trainer's process (serving %s); the policy's weights go to it "
                "after each optimizer step%s", engine.base_root,
                " (as adapters saved in " + sync_dir + ")" if hasattr(model, "peft_config") else ", from memory")
    return engine


def tied_output_head(model: torch.nn.Module) -> bool:
    """Whether the model's output head is its input embedding matrix (the same parameter)."""
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and embeddings is not None and head.weight is embeddings.weight


@torch.no_grad()
def prompt_logprobs(model: torch.nn.Module, ids: Sequence[int]) -> list[float]:
    """The model's log-probability of each token of `ids` after the ones before it, at temperature 1 (as a vLLM
    server reports a prompt's). Call it under the run's autocast, so it computes in the precision the run trains in."""
    device = next(model.parameters()).device
    tokens = torch.tensor([list(ids)], device=device)
    logits = model(input_ids=tokens).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None].to(device))[0, :, 0].tolist()


def server_disagreement(engine: VLLMRollouts, policy_logprobs: Sequence[float], prompt: Sequence[int]) -> float:
    """Mean |log p_server - log p_trainer| over `prompt`'s tokens after the first: policy_logprobs are the trainer's
    own (each token given the ones before it, at temperature 1)."""
    served = engine.prompt_logprobs(prompt)
    pairs = [(a, b) for a, b in zip(served, policy_logprobs) if not math.isnan(a)]
    if not pairs:
        return float("inf")
    return sum(abs(a - b) for a, b in pairs) / len(pairs)


def check_same_model(engine: VLLMRollouts, policy_logprobs: Sequence[float], prompt: Sequence[int],
                     dtype: torch.dtype) -> float:
    """A ConfigError when the server's log-probabilities of `prompt` are further from the trainer's than the dtype
    allows: it serves another model than the trainer's (or weights the trainer did not send). Returns the gap."""
    gap = server_disagreement(engine, policy_logprobs, prompt)
    tolerance = SAME_MODEL_TOLERANCE.get(dtype, 0.1)
    if gap > tolerance:
        raise ConfigError(f"{engine.where} serves {engine.base_root}, whose log-probabilities of a probe "
                          f"differ from the trainer's policy by {gap:.3g} nats a token on average (at most "
                          f"{tolerance:g} for {str(dtype).removeprefix('torch.')}): it is not the trainer's model. "
                          "Start the server with `tunesmith vllm-serve --model_name_or_path` the model the trainer "
                          "loads (the base under its adapter), in the same --dtype")
    return gap


def hand_over_weights(engine: VLLMRollouts, accelerator: Any, model: torch.nn.Module, step: int,
                      probe: Sequence[int] | None = None, dtype: torch.dtype = torch.float32,
                      state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """The trainer's current weights to the server: the main process writes them and the server loads them, then
    every process names the new version in its requests. With a `probe` (the first time: the server may hold another
    model, or an earlier run's weights), the server's log-probabilities of it are checked against the model's, computed
    under the run's autocast (`dtype` is the precision the run computes in)."""
    if accelerator.is_main_process:
        engine.sync(model, step, state_dict=state_dict)
    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        engine.follow(model, step)
    if probe is not None:
        with accelerator.autocast():
            mine = prompt_logprobs(model, probe)
        gap = check_same_model(engine, mine, probe, dtype)
        logger.info("vLLM serves the trainer's model: its log-probabilities of a probe are %.2g nats a token from the "
                    "trainer's", gap)
