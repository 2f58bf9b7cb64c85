"""A vLLM server as the rollout engine: `VLLMEngine.generate` takes and returns what `Engine.generate` does (token
ids in, `Completion`s with their tokens, text and log-probabilities out), so rollouts, tool rollouts and distill's
on-policy samples run on either engine unchanged. The server is vLLM's own OpenAI server (started by
`tunesmith vllm-serve`, generation/vllm_server.py), on this machine or another, in a venv of its own.

Prompts go as token ids and replies come back as token ids (`return_token_ids`): nothing is re-tokenized, so a
multi-turn tool rollout appends exactly the tokens the server sampled. Each reply's tokens come with their
log-probabilities under the distribution they were drawn from (the server's `--logprobs-mode
processed_logprobs`): the trainer compares them with its own to correct the mismatch (rl/losses/off_policy.py).

The policy's weights reach the server after each optimizer step (`sync`, called before the next sampling):
- a LoRA policy as an adapter: saved in `sync_dir` (a folder the server reads: the same machine, or a shared
  file system) and loaded under a new name, `/v1/load_lora_adapter`; the previous one is unloaded. An adapter of
  the 135M default model at rank 16 is 7 MB; saving and loading it takes well under a second here, against the
  seconds a full reload takes, and the base never changes, so nothing is merged (a merge into a quantized base
  would change it);
- a fully fine-tuned policy: saved in `sync_dir` as safetensors and reloaded in place by the server's workers
  (`/collective_rpc` `reload_weights`, the server started with VLLM_SERVER_DEV_MODE=1). vLLM's weight-transfer
  engines (NCCL, CUDA IPC) need GPUs on both sides; reloading from disk works anywhere, at the cost of a save.

TRL's `VLLMClient` was read and not reused: it talks to `trl vllm-serve`'s own endpoints (TRL installed beside
vLLM, the same TRL as the trainer's) and sends weights over NCCL, which a CPU or a server in another venv cannot
use; here the server is plain vLLM and the protocol is its public one."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from .engine import stop_token_ids
from .results import Completion, TokenLogprob
from .sampling import SamplingParams

logger = logging.getLogger(__name__)

START_HINT = "start one with `tunesmith vllm-serve --model_name_or_path MODEL` (docs/rl.md#vllm)"


def adapter_name(step: int) -> str:
    return f"policy-step-{step}"


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


class VLLMError(RuntimeError):
    """The server refused a request or could not be reached."""


class VLLMRollouts:
    """What a vLLM engine is to a training run, wherever vLLM runs (a server, `VLLMEngine`; in the trainer's
    process, generation/vllm_colocated.py): `generate` as Engine.generate, `prompt_logprobs`, and `sync` of the
    policy's weights after each optimizer step. A subclass says how to complete prompts and load weights."""

    where = "vLLM"  # how refusals name it

    def __init__(self, tokenizer: Any, sync_dir: str | os.PathLike | None) -> None:
        self.tokenizer = tokenizer
        self.sync_dir = Path(sync_dir) if sync_dir else None
        self.stop_ids = stop_token_ids(None, tokenizer)
        self.synced = False  # the Engine's ZeRO-3 flag: vLLM needs no collective steps
        self.base_root = ""  # the model vLLM loaded
        self.version = 0
        self.sync_seconds = 0.0

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams],
                 max_batch_size: int | None = None, **_: Any) -> list[list[Completion]]:
        """Every prompt's `n` completions, as Engine.generate returns them. Prompts with the same settings go in one
        batch; each reply carries its tokens' log-probabilities."""
        settings = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        groups: dict[SamplingParams, list[int]] = defaultdict(list)
        for i, s in enumerate(settings):
            groups[s].append(i)
        out: list[list[Completion]] = [[] for _ in prompts]
        for s, rows in groups.items():
            if s.num_beams > 1 or s.bans:
                raise ConfigError("the vLLM rollout engine samples token by token without bans or beams")
            if s.max_new_tokens < 1:  # vLLM refuses max_tokens 0; nothing to sample
                for i in rows:
                    out[i] = [Completion(k, [], "", "length") for k in range(s.n)]
                continue
            for i, completions in zip(rows, self._complete([list(prompts[i]) for i in rows], s)):
                out[i] = completions
        return out

    def _complete(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        raise NotImplementedError

    def prompt_logprobs(self, prompt: Sequence[int]) -> list[float]:
        """Each prompt token's log-probability after the ones before it (the first has none), under the policy's
        weights as vLLM holds them now, at temperature 1."""
        raise NotImplementedError

    def sampling_fields(self, params: SamplingParams) -> dict[str, Any]:
        """The settings of `params` under vLLM's names (its SamplingParams and its OpenAI server's request take the
        same), with the replies' log-probabilities and the tokenizer's end-of-turn ids as stops."""
        return {"n": params.n, "max_tokens": params.max_new_tokens, "temperature": params.temperature,
                "top_p": params.top_p, "top_k": params.top_k or -1, "min_p": params.min_p,
                "repetition_penalty": params.repetition_penalty, "presence_penalty": params.presence_penalty,
                "frequency_penalty": params.frequency_penalty,
                "stop_token_ids": sorted(self.stop_ids | set(params.stop_token_ids)),
                "stop": list(params.stop) or None, "logprobs": 0, "skip_special_tokens": True,
                "spaces_between_special_tokens": False}

    def sync(self, model: torch.nn.Module, step: int, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Hand the policy's current weights to vLLM: a PEFT model's active adapter as a new LoRA (saved in
        sync_dir, never merged into the base), else the whole model. `state_dict`: the trainable weights gathered
        from ZeRO-3 shards (keys as in model.state_dict()). In a run of several processes the main one calls this,
        and the others follow() once it has."""
        if self.sync_dir is None:
            raise ConfigError("the vLLM rollout engine needs a folder to hand weights over in (--vllm_sync_dir)")
        start = time.perf_counter()
        folder = self.sync_dir / f"step-{step}"
        shutil.rmtree(folder, ignore_errors=True)
        if is_peft(model):
            name = model.active_adapter
            model.save_pretrained(str(folder), selected_adapters=[name], state_dict=state_dict)
            if name != "default":  # PEFT writes any other adapter in a subfolder of its name
                folder = folder / name
            self._load_adapter(step, folder)
        else:
            self._load_full(model, folder, state_dict)
        previous = self.sync_dir / f"step-{self.version}"
        if self.version != step and previous.exists():
            shutil.rmtree(previous, ignore_errors=True)
        self.version = step
        self.sync_seconds = time.perf_counter() - start

    def follow(self, model: torch.nn.Module, step: int) -> None:
        """Another process has synced the weights of `step`: name them in this process's requests too."""
        raise NotImplementedError

    def _load_adapter(self, step: int, folder: Path) -> None:
        raise NotImplementedError

    def _load_full(self, model: torch.nn.Module, folder: Path, state_dict: dict[str, torch.Tensor] | None) -> None:
        raise NotImplementedError


def completion_of(index: int, ids: list[int], logprob_values: Sequence[float | None], finish_reason: str | None,
                  stop_reason: Any, text: str) -> Completion:
    """One of vLLM's replies as a Completion: a reply that ended on an end-of-turn or stop token (vLLM's
    stop_reason None, the model's EOS, or that token's id) has it taken off the tokens, as the own engine does; one
    cut by a stop string (its stop_reason) or the length keeps them all."""
    ids = list(ids)
    logprobs = [TokenLogprob(t, float("nan") if v is None else float(v)) for t, v in zip(ids, logprob_values)]
    finish = "stop" if finish_reason == "stop" else "length"
    stop_id = stop_logprob = None
    if finish == "stop" and ids and not isinstance(stop_reason, str):
        stop_id = ids.pop()
        stop_logprob = logprobs.pop() if len(logprobs) > len(ids) else None
    return Completion(index, ids, text or "", finish, stop_id, logprobs[:len(ids)], stop_logprob)


class VLLMEngine(VLLMRollouts):
    """Rollouts on a vLLM server at `url`. `tokenizer` is the trainer's (its end-of-turn ids end a reply);
    `sync_dir` is where weights are written for the server to read (default: a folder beside the run's
    output, which must be on a file system the server sees)."""

    def __init__(self, url: str, tokenizer: Any, sync_dir: str | os.PathLike | None = None,
                 api_key: str | None = None, timeout: float = 600.0) -> None:
        super().__init__(tokenizer, sync_dir)
        self.url, self.timeout = url.rstrip("/"), timeout
        self.where = f"--vllm_url {self.url}"
        self.api_key = api_key or os.environ.get("VLLM_API_KEY")
        try:
            models = self._get("/v1/models")["data"]
        except VLLMError as e:
            raise ConfigError(f"--vllm_url {url}: no vLLM server answers there ({e}); {START_HINT}") from None
        self.base_model = models[0]["id"]
        self.base_root = models[0].get("root", self.base_model)
        self.model_name = self.base_model  # what requests name: the base, or the policy's adapter once synced

    # ------------------------------------------------------------------ HTTP

    def _request(self, path: str, body: dict | None = None, method: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url + path, data=data, headers=headers,
                                         method=method or ("POST" if body is not None else "GET"))
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            raise VLLMError(f"{path}: HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            raise VLLMError(f"{path}: {getattr(e, 'reason', e)}") from None
        try:
            return json.loads(text) if text.strip() else None
        except json.JSONDecodeError:  # /v1/load_lora_adapter answers in plain text
            return text

    def _get(self, path: str) -> Any:
        return self._request(path)

    def _post(self, path: str, body: dict) -> Any:
        return self._request(path, body)

    # ------------------------------------------------------------------ sampling

    def _complete(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        body = {"model": self.model_name, "prompt": prompts, "return_token_ids": True, **self.sampling_fields(params)}
        choices = self._post("/v1/completions", body)["choices"]
        out: list[list[Completion]] = [[None] * params.n for _ in prompts]  # type: ignore[list-item]
        for choice in choices:
            prompt_index, k = divmod(choice["index"], params.n)
            values = (choice.get("logprobs") or {}).get("token_logprobs") or []
            out[prompt_index][k] = completion_of(k, choice.get("token_ids") or [], values, choice.get("finish_reason"),
                                                 choice.get("stop_reason"), choice.get("text") or "")
        return out

    def prompt_logprobs(self, prompt: Sequence[int]) -> list[float]:
        body = {"model": self.model_name, "prompt": [list(prompt)], "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": 0, "logprobs": 0}
        choice = self._post("/v1/completions", body)["choices"][0]
        rows = choice.get("prompt_logprobs") or []
        values = []
        for token, row in zip(prompt[1:], rows[1:]):
            entry = (row or {}).get(str(token))
            values.append(float(entry["logprob"]) if entry else float("nan"))
        return values

    # ------------------------------------------------------------------ weights

    def follow(self, model: torch.nn.Module, step: int) -> None:
        self.model_name = adapter_name(step) if is_peft(model) else self.base_model
        self.version = step

    def _load_adapter(self, step: int, folder: Path) -> None:
        # load_inplace: a server reused from an earlier run may hold an adapter of that name
        name = adapter_name(step)
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder.resolve()), "load_inplace": True})
        old, self.model_name = self.model_name, name
        if old != self.base_model:
            try:
                self._post("/v1/unload_lora_adapter", {"lora_name": old})
            except VLLMError as e:  # the new one serves; an old one left loaded costs memory only
                logger.warning("vLLM kept the previous adapter %s: %s", old, e)

    def _load_full(self, model: torch.nn.Module, folder: Path, state_dict: dict[str, torch.Tensor] | None) -> None:
        model.save_pretrained(str(folder), state_dict=state_dict, safe_serialization=True)
        try:
            self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder.resolve())}})
        except VLLMError as e:
            if "HTTP 404" in str(e):
                raise ConfigError(f"the vLLM server at {self.url} cannot reload weights (/collective_rpc is off): "
                                  "start it with `tunesmith vllm-serve`, which sets VLLM_SERVER_DEV_MODE=1") from None
            raise
        self.model_name = self.base_model
