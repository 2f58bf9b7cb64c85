"""The rows of `tunesmith serve`: settings that cannot work, refused in one line after parsing and before any weight
loads. The parser checks them after the core's rows (hparams/rules.py, whose generation rows, and its refusal of beam
search with a prompt-based adapter, serve reads too) for this command only."""

from __future__ import annotations

import re

from ..errors import PathError

# The core table's helpers that its own rows share with these (as export/rules.py takes them).
from ..hparams.rules import Rule, _missing_dir, _problem, _prompt_adapter
from ..utils.network import LOOPBACK_HOSTS
from ..utils.paths import is_adapter_dir, is_torchao_quantized, prompt_adapter_kind

RULES: list[Rule] = [
    Rule("serve_image_root", ("serve",), lambda a: _missing_dir(a.serve.image_root),
         "--image_root {path}: {problem}; give the folder whose pictures requests may name.", PathError),
    Rule("serve_port", ("serve",), lambda a: not 0 <= a.serve.port <= 65535,
         "--port must be in 0..65535 (got {serve.port}); 0 takes any free port."),
    Rule("serve_batch", ("serve",), lambda a: a.serve.max_batch_size < 1 or a.serve.batch_wait_ms < 0,
         "--max_batch_size must be at least 1 and --batch_wait_ms at least 0 (got {serve.max_batch_size} and "
         "{serve.batch_wait_ms})."),
    Rule("serve_adapter_spec", ("serve",),
         lambda a: _problem(next((f"{spec!r} is not NAME=PATH" for spec in a.serve.adapter
                                  if not re.fullmatch(r"[^=\s]+=.+", spec)), None)
                            or (len({s.split("=", 1)[0] for s in a.serve.adapter}) < len(a.serve.adapter)
                                and "two adapters share a NAME") or None),
         "--adapter: {problem}; give each adapter as NAME=PATH, each NAME once."),
    Rule("serve_adapter_path", ("serve",),
         lambda a: _problem(next((path for path in (s.split("=", 1)[1] for s in a.serve.adapter if "=" in s)
                                  if not is_adapter_dir(path)), None)),
         "--adapter: {problem}: not a LoRA adapter folder (no adapter_config.json); give NAME=PATH with PATH an "
         "adapter folder that training wrote.", PathError),
    Rule("serve_prompt_adapter_alone", ("serve", "model"),
         lambda a: a.serve.adapter and (_prompt_adapter(a.model) or next(
             ({"path": p, "kind": prompt_adapter_kind(p)} for p in (s.split("=", 1)[1] for s in a.serve.adapter
                                                                    if "=" in s) if prompt_adapter_kind(p)), None)),
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
]
