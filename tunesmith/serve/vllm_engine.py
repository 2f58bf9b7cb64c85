"""`tunesmith serve --engine vllm`: the same model, adapters, chat template, address, API key and reply defaults
served by vLLM's OpenAI server in its own venv (generation/vllm_server.py starts it). tunesmith adds what vLLM
would otherwise leave to the user: adapters it cannot load are refused before anything starts (the serve rules'
`serve_vllm_adapter` row, generation/vllm_server.vllm_adapter_problem), the chat template the adapter was trained
with, the tool parser that reads that template's calls, and the key off loopback.

What maps onto what:
- the model as given (a full model, or an adapter on its recorded base): the base is vLLM's model; an adapter given
  as the model is served as a LoRA module under the served name, so a request's `model` picks it as in tunesmith's
  server; each --adapter NAME=PATH is a LoRA module NAME; --max-lora-rank holds the largest rank;
- the chat template: the one tunesmith's server renders with (the adapter's tokenizer, or --chat_template); vLLM
  renders one template for every model it serves, so adapters with other templates are refused;
- tools: `--enable-auto-tool-choice --tool-call-parser hermes` for `<tool_call>{json}</tool_call>` templates
  (chatml_tools), `llama3_json` for Llama 3.x's bare JSON; tool_choice "none" leaves the tools out of the prompt
  (`--exclude-tools-when-tool-choice-none`) unless --keep_tools_when_tool_choice_none;
- reply defaults (--do_sample, --temperature, --top_p, --top_k, --min_p, --repetition_penalty): vLLM's
  `--generation-config vllm --override-generation-config`; --max_new_tokens is left out (vLLM would make it a
  limit, not a default: a request without max_tokens gets the room the context leaves);
- --context_length: --max-model-len; --max_batch_size: --max-num-seqs; --dtype auto: as tunesmith's server picks it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex
import signal
import tempfile
from types import SimpleNamespace
from typing import Any

from ..errors import ConfigError
from ..generation.vllm_server import (
    VLLMServer,
    VLLMServerSettings,
    adapter_max_rank,
    tool_call_parser,
    vllm_lora_rank,
)
from ..hparams.parser import resolve_adapter_base
from ..models.loader import load_trained_tokenizer, resolve_dtype, resolve_model_path, serving_model_args
from ..utils.network import free_port
from ..utils.paths import adapter_config

logger = logging.getLogger(__name__)


def vllm_settings(args: SimpleNamespace, template_dir: str) -> VLLMServerSettings:
    """vLLM's server settings for a parsed `tunesmith serve --engine vllm` run; the chat template is written into
    `template_dir` (vLLM reads it from a file)."""
    serve, generation = args.serve, args.generation
    model_args = serving_model_args(args.model)
    resolve_adapter_base(model_args, warn=False)
    base = resolve_model_path(model_args)
    own = model_args.adapter_name_or_path
    main_id = serve.served_model_name or os.path.basename(os.path.normpath(own or base))
    loras = ({main_id: own} if own else {}) | serve.adapters()
    base_id = main_id if not own else f"{main_id}-base"
    template = served_chat_template(model_args, serve.adapters())
    template_file = os.path.join(template_dir, "chat_template.jinja")
    with open(template_file, "w", encoding="utf-8") as f:
        f.write(template)
    extra = ["--generation-config", "vllm", "--override-generation-config", json.dumps(reply_defaults(generation)),
             "--max-num-seqs", str(serve.max_batch_size)]
    parser = tool_call_parser(template)
    if parser:
        extra += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
        if not serve.keep_tools_when_tool_choice_none:
            extra += ["--exclude-tools-when-tool-choice-none"]
    return VLLMServerSettings(
        model=base, host=serve.host, port=serve.port or free_port(serve.host), served_model_name=base_id,
        dtype=str(resolve_dtype(model_args)).removeprefix("torch."), max_model_len=serve.context_length,
        max_lora_rank=vllm_lora_rank([adapter_max_rank(adapter_config(path)) for path in loras.values()]),
        lora_modules=loras, chat_template=template_file, api_key=serve.key(), enable_lora=bool(loras),
        extra_args=extra + shlex.split(serve.vllm_args))


def served_chat_template(model_args: Any, adapters: dict[str, str]) -> str:
    """The chat template tunesmith's server renders the model with; every --adapter must render with the same
    (vLLM has one per server)."""
    template = load_trained_tokenizer(model_args).chat_template
    if not template:
        raise ConfigError(f"--engine vllm: {model_args.adapter_name_or_path or model_args.model_name_or_path} has no "
                          "chat template: give --chat_template (e.g. chatml)")
    for name, path in adapters.items():
        own = load_trained_tokenizer(dataclasses.replace(model_args, adapter_name_or_path=path))
        if own.chat_template and own.chat_template != template:
            raise ConfigError(f"--engine vllm --adapter {name}={path}: trained with another chat template than the "
                              "model's, and vLLM renders every model it serves with one: serve it alone, or with "
                              "--engine tunesmith")
    return template


def reply_defaults(generation: Any) -> dict[str, float | int]:
    """The generation flags as vLLM's defaults for what a request leaves out (greedy: temperature 0)."""
    defaults: dict[str, float | int] = {"temperature": generation.temperature if generation.do_sample else 0.0,
                                         "repetition_penalty": generation.repetition_penalty}
    if generation.do_sample:
        defaults |= {"top_p": generation.top_p, "top_k": generation.top_k or -1, "min_p": generation.min_p}
    return defaults


def serve_with_vllm(args: SimpleNamespace) -> None:
    """Start vLLM with the run's settings and keep it in the foreground until Ctrl-C or SIGTERM (which stop it)."""
    with tempfile.TemporaryDirectory(prefix="tunesmith-vllm-") as template_dir:
        settings = vllm_settings(args, template_dir)
        server = VLLMServer(settings, console=True)
        names = [settings.served_model_name, *settings.lora_modules]
        print("starting vLLM (its own venv): " + shlex.join(settings.argv(server.python)), flush=True)
        # vLLM runs in a session of its own: a SIGTERM to this process stops it through the `finally` below.
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            server.start()
            logger.info("serving %s with vLLM at %s/v1 (%s)", ", ".join(names), settings.url,
                        "API key required" if settings.api_key else "no API key")
            server.process.wait()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt
