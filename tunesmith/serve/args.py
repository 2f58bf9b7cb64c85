"""The settings of `tunesmith serve`: the model's, the defaults of the replies a request leaves unset (the core's
GenerationArguments, as chat's) and the server's own. Their combinations are refused by the rows of rules.py beside
it (and the core's, hparams/rules.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..hparams.generating_args import GenerationArguments
from ..hparams.model_args import ModelArguments


@dataclass
class ServeArguments:
    role: ClassVar[str] = "serve"
    _argument_group_name: ClassVar[str] = "serve"

    engine: Literal["tunesmith", "vllm"] = field(
        default="tunesmith",
        metadata={"help": "What generates the replies. tunesmith: its own engine, in this process (every feature on "
                  "this page). vllm: vLLM's OpenAI server in its own venv (bash scripts/setup_vllm.sh builds it), "
                  "started with the same model, adapters, chat template, host, port, API key and reply defaults; "
                  "adapters vLLM cannot load are refused first, saying what to do (docs/serve.md#vllm)."},
    )
    vllm_args: str = field(
        default="",
        metadata={"help": "With --engine vllm: more flags for `vllm serve`, as one string (e.g. \"--tensor-parallel-size "
                  "2 --gpu-memory-utilization 0.8\"), passed through as they are."},
    )
    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on (0.0.0.0: every interface)."})
    port: int = field(default=8000, metadata={"help": "TCP port to listen on (0: any free one; the log says which)."})
    api_key: str | None = field(
        default=None,
        metadata={"help": "Require `Authorization: Bearer KEY` on /v1 requests (default: the TUNESMITH_API_KEY "
                  "environment variable when set, else no key)."},
    )
    allow_no_api_key: bool = field(
        default=False,
        metadata={"help": "Serve a --host other than loopback without an API key, to every machine that can reach "
                  "this one (refused unless set)."},
    )
    served_model_name: str | None = field(
        default=None,
        metadata={"help": "The model id clients name in requests and /v1/models lists (default: the adapter's "
                  "or the model's folder name)."},
    )
    max_batch_size: int = field(
        default=16, metadata={"help": "Most replies (rows, counting each of a request's n) generated together."}
    )
    batch_wait_ms: float = field(
        default=10.0,
        metadata={"help": "How long the first request of a batch waits for others to join it, in milliseconds."},
    )
    adapter: list[str] = field(
        default_factory=list,
        metadata={"action": "append", "help": "NAME=PATH: serve the LoRA adapter at PATH (over the same base) as "
                  "model NAME, with the chat template it was trained with; repeat the flag for several. A "
                  "request's `model` picks one; GET /v1/models lists them all."},
    )
    max_request_bytes: int = field(
        default=8 * 1024 * 1024, metadata={"help": "Largest request body; a larger one is refused with a 413."}
    )
    image_root: str | None = field(
        default=None,
        metadata={"help": "A vision-language model: the folder whose pictures a request may name by path (a relative "
                  "path is relative to it; nothing outside it is read). Default: none; pictures come as data: URLs. "
                  "Remote http(s) URLs are always refused: the server fetches nothing."},
    )
    context_length: int | None = field(
        default=None,
        metadata={"help": "Most tokens of prompt plus reply (default: the model's max_position_embeddings); a "
                  "request over it is refused with a 400 that says by how much."},
    )
    keep_tools_when_tool_choice_none: bool = field(
        default=False,
        metadata={"help": "List a request's `tools` in the prompt under `tool_choice: \"none\"` too (the call is still "
                  "banned while sampling). Default: the prompt leaves them out, so a model tuned to call when it "
                  "sees tools answers in text."},
    )

    def __post_init__(self) -> None:
        # `--adapter a=X --adapter b=Y` and `--adapter a=X b=Y` (and a config file's list) mean the same.
        self.adapter = [spec for item in self.adapter for spec in (item if isinstance(item, list) else [item])]

    def key(self) -> str | None:
        """The API key requests must send: --api_key, else the TUNESMITH_API_KEY environment variable; None: none."""
        return self.api_key or os.environ.get("TUNESMITH_API_KEY") or None

    def adapters(self) -> dict[str, str]:
        """--adapter as {name: path}, in the order given (the rules table has checked the specs)."""
        return dict(spec.split("=", 1) for spec in self.adapter)


# The dataclasses `tunesmith serve` parses, in the order tunesmith_config.json records them.
ARGUMENTS: tuple[type, ...] = (ModelArguments, ServeArguments, GenerationArguments)
