"""The rows of `tunesmith serve`: settings that cannot work, refused in one line after parsing and before any weight
loads. The parser checks them after the core's rows (hparams/rules.py, whose generation rows, and its refusal of beam
search with a prompt-based adapter, serve reads too) for this command only."""

from __future__ import annotations

import re
from typing import Any

from ..errors import PathError
from ..generation.vllm_server import on_cuda, vllm_adapter_problem
from ..hparams.rule_engine import Rule
from ..hparams.rule_helpers import missing_dir, problem_values, prompt_adapter, vision_model
from ..utils.network import LOOPBACK_HOSTS
from ..utils.paths import is_adapter_dir, is_torchao_quantized, prompt_adapter_kind
from .args import ServeArguments


def _adapter_paths(a: Any) -> list[str]:
    """The PATH of each --adapter NAME=PATH."""
    return [spec.split("=", 1)[1] for spec in a.serve.adapter if "=" in spec]


def _adapter_spec_problem(a: Any) -> dict | None:
    """{"problem"}: an --adapter not of the form NAME=PATH, or two --adapter with one NAME."""
    malformed = next((f"{spec!r} is not NAME=PATH" for spec in a.serve.adapter
                      if not re.fullmatch(r"[^=\s]+=.+", spec)), None)
    if malformed:
        return problem_values(malformed)
    names = {spec.split("=", 1)[0] for spec in a.serve.adapter}
    return problem_values("two adapters share a NAME") if len(names) < len(a.serve.adapter) else None


def _adapter_path_not_adapter(a: Any) -> dict | None:
    """{"problem"}: the first --adapter PATH that is not an adapter folder."""
    return problem_values(next((path for path in _adapter_paths(a) if not is_adapter_dir(path)), None))


def _prompt_adapter_beside_others(a: Any) -> dict | None:
    """{"path", "kind"}: a prompt-based adapter (the model's, or an --adapter's) on a server of several adapters."""
    if not a.serve.adapter:
        return None
    return prompt_adapter(a.model) or next(({"path": p, "kind": prompt_adapter_kind(p)} for p in _adapter_paths(a)
                                            if prompt_adapter_kind(p)), None)


RULES: list[Rule] = [
    Rule("serve_image_root", ("serve",), lambda a: missing_dir(a.serve.image_root),
         "--image_root {path}: {problem}; give the folder whose pictures requests may name.", PathError),
    Rule("serve_port", ("serve",), lambda a: not 0 <= a.serve.port <= 65535,
         "--port must be in 0..65535 (got {serve.port}); 0 takes any free port."),
    Rule("serve_batch", ("serve",), lambda a: a.serve.max_batch_size < 1 or a.serve.batch_wait_ms < 0,
         "--max_batch_size must be at least 1 and --batch_wait_ms at least 0 (got {serve.max_batch_size} and "
         "{serve.batch_wait_ms})."),
    Rule("serve_adapter_spec", ("serve",), _adapter_spec_problem,
         "--adapter: {problem}; give each adapter as NAME=PATH, each NAME once."),
    Rule("serve_adapter_path", ("serve",), _adapter_path_not_adapter,
         "--adapter: {problem}: not a LoRA adapter folder (no adapter_config.json); give NAME=PATH with PATH an "
         "adapter folder that training wrote.", PathError),
    Rule("serve_prompt_adapter_alone", ("serve", "model"), _prompt_adapter_beside_others,
         "--adapter: {path} is a {kind} adapter, which PEFT does not load beside other adapters: serve it alone "
         "(--model_name_or_path {path}), or serve LoRA adapters side by side."),
    Rule("serve_torchao_adapter", ("serve", "model"),
         lambda a: (a.model.adapter_name_or_path or a.serve.adapter) and is_torchao_quantized(a.model.model_name_or_path),
         "{model.model_name_or_path} is torchao-quantized (a --qat run's quantized/) and serves as it is, without "
         "adapters: a LoRA --qat run's adapter is already merged into its quantized/; serve adapters over the float "
         "base instead."),
    Rule("serve_no_beams", ("serve", "generation"), lambda a: a.generation.num_beams != 1,
         "--num_beams cannot be used with serve: the server streams replies token by token (beam search picks "
         "a reply only at its end); leave it out."),
    Rule("serve_request_limit", ("serve",), lambda a: a.serve.max_request_bytes < 1024,
         "--max_request_bytes must be at least 1024 (got {serve.max_request_bytes})."),
    Rule("serve_key_needed", ("serve",),
         lambda a: a.serve.host not in LOOPBACK_HOSTS and not a.serve.key() and not a.serve.allow_no_api_key,
         "--host {serve.host} serves the model to every machine that can reach this one: give --api_key KEY too (or "
         "set TUNESMITH_API_KEY), or keep the default --host 127.0.0.1 (--allow_no_api_key: serve it open anyway)."),
    Rule("serve_context", ("serve",), lambda a: a.serve.context_length is not None and a.serve.context_length < 8,
         "--context_length must be at least 8 tokens (got {serve.context_length}); leave it out to use the model's."),
    Rule("serve_vllm_adapter", ("serve", "model"), lambda a: a.serve.engine == "vllm" and problem_values(next(
        filter(None, map(vllm_adapter_problem, _served_adapters(a))), None)),
         "--engine vllm: {problem}."),
    Rule("serve_vllm_flags", ("serve", "model"),
         lambda a: a.serve.engine == "vllm" and problem_values(_tunesmith_only(a)),
         "--engine vllm: {problem} is tunesmith's engine only; leave it out, or serve with --engine tunesmith."),
    Rule("serve_vllm_vision_cpu", ("serve", "model"),
         lambda a: a.serve.engine == "vllm" and not on_cuda() and vision_model(a.model),
         "--engine vllm with the vision-language model {model.model_name_or_path} ({model_type}) on a machine "
         "without CUDA: vLLM's CPU build reads images through torchvision, whose PyPI wheels are CUDA builds that "
         "scripts/setup_vllm.sh removes from vLLM's venv here (they fail to import beside torch+cpu); serve it with "
         "--engine tunesmith, or with --engine vllm on a CUDA machine."),
    Rule("serve_vllm_args_alone", ("serve",), lambda a: a.serve.engine != "vllm" and a.serve.vllm_args,
         "--vllm_args is for --engine vllm; add --engine vllm, or leave --vllm_args out."),
]

_DEFAULTS = ServeArguments()


def _served_adapters(run) -> list[str]:
    """Every adapter folder a server of this run serves: the model's own (given as the model or as
    --adapter_name_or_path) and each --adapter's."""
    own = [p for p in (run.model.adapter_name_or_path, run.model.model_name_or_path) if is_adapter_dir(p)]
    return own[:1] + [p for p in (spec.split("=", 1)[1] for spec in run.serve.adapter if "=" in spec)
                      if is_adapter_dir(p)]


def _tunesmith_only(run) -> str | None:
    """The first flag given that vLLM's server has no counterpart for."""
    serve = run.serve
    if serve.image_root:
        return "--image_root (vLLM reads local pictures under its own --allowed-local-media-path)"
    if serve.allow_no_api_key:
        return "--allow_no_api_key (tunesmith starts vLLM beyond loopback only with an API key)"
    if run.model.quantization_bit is not None:
        return "--quantization_bit (bitsandbytes on vLLM: --vllm_args \"--quantization bitsandbytes\" on a GPU)"
    if serve.batch_wait_ms != _DEFAULTS.batch_wait_ms:
        return "--batch_wait_ms (vLLM schedules every step)"
    if serve.max_request_bytes != _DEFAULTS.max_request_bytes:
        return "--max_request_bytes"
    return None
