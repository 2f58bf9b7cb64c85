"""Serve a model over HTTP with the OpenAI chat-completions API, every request rendered by the
chat template that training used.

    tunesmith serve                                              # the embedded SmolLM2-135M-Instruct
    tunesmith serve --model_name_or_path outputs/sft_demo   # an adapter dir (base from adapter_config.json)
    tunesmith serve --model_name_or_path M --adapter_name_or_path A --host 127.0.0.1 --port 8000 --api_key KEY
    tunesmith serve --adapter identity=outputs/sft_demo --adapter tools=outputs/sft_tools_demo   # several

--dtype auto serves in bfloat16 where the hardware computes it natively (a CPU with AVX512-BF16/AMX, a
GPU with bf16), float32 elsewhere; --dtype float32 gives the answers chat and compare give, bit for bit.

--adapter NAME=PATH (repeatable) serves LoRA adapters over the one base, each as model NAME with the chat
template it was trained with; GET /v1/models lists the model as given first, then every adapter, and a
request's `model` picks one (an unknown name is a 404 listing them). Rows of different adapters share
a batch through peft's mixed-adapter forward; adapters peft cannot mix (DoRA) run one adapter at a time.

Routes: POST /v1/chat/completions (`stream` over server-sent events or not; `temperature`, `top_p`,
`max_tokens` or `max_completion_tokens`, `stop`, `n`, `seed`; `tools` and `tool_choice`; `logprobs` and
`top_logprobs` (0..20); usage counts, and in a stream with `stream_options: {"include_usage": true}`),
GET /v1/models, GET /health (no key needed).

Tools are listed in the prompt by the model's own chat template (a template that renders none is
refused: serve a tool template, e.g. one trained with --chat_template chatml_tools); a reply that is a
call (`<tool_call>{json}</tool_call>`, or a bare JSON call as Llama 3 writes them) comes back as
`message.tool_calls` with finish_reason "tool_calls", streamed as `delta.tool_calls`; anything else
comes back as text. tool_choice "none" leaves the tools out of the prompt (--keep_tools_when_tool_choice_none
keeps them) and bans the call; "required" or a named function puts the call's opening after the prompt.
A template's `<think>` block goes to
`reasoning_content` (`delta.reasoning_content` streamed). Log-probabilities are the model's own, in
OpenAI's `choices[i].logprobs.content` (token, logprob, bytes, top_logprobs). Settings a
request leaves out come from the generation flags (--do_sample false: greedy; --max_new_tokens, cut to
the room the prompt leaves in the context); --top_k and --repetition_penalty apply to every request.
A `max_tokens` that does not fit the context with the prompt is refused with a 400 that says by how
many tokens, never cut. Requests that arrive together are generated as one batch.

POST /v1/completions is OpenAI's legacy completions API, for raw text: a `prompt` (a string, token ids,
or a list of either) goes in without the chat template; `max_tokens` (default 16; 0 with `echo` scores
the prompt alone), `echo`, `logprobs` (0..5: each token, its log-probability, its most likely
alternatives and its offset in the text), `n`, `seed`, `stop`, `stream`, the presence and frequency
penalties. It is what lm-eval's `local-completions` model calls:
`--model local-completions --model_args model=NAME,base_url=http://HOST:PORT/v1/completions,tokenizer=DIR`.

Errors come back as OpenAI's {"error": {"message", "type", "param", "code"}}: 400 for a malformed
request (`param` names the field, e.g. `tools[0].function.name`), 401 for a wrong key, 404 for another
model's name or an unknown path, 413 for a body over --max_request_bytes, 500 if generation fails, 503 for a
reply cut short by the server shutting down (SIGTERM or Ctrl-C cancel what is running; the process exits within
seconds). A --host other than loopback needs an API key (--allow_no_api_key to serve it open anyway).

--engine vllm serves the same model, adapters, chat template, host, port and API key with vLLM's OpenAI server
instead (its own venv: bash scripts/setup_vllm.sh), and prints the vLLM command it runs. What differs: adapters
vLLM cannot load (DoRA, trainable tokens, modules_to_save, a PiSSA checkpoint, prompt tuning) are refused before
it starts, saying whether to merge first; every adapter must share the model's chat template; tool calls are read
by vLLM's parser for the template (hermes for <tool_call> blocks); --image_root, --quantization_bit,
--batch_wait_ms, --max_request_bytes and --allow_no_api_key are tunesmith's engine only; --vllm_args passes more.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from ..boundary import entry_point
from ..generation import BASE
from ..hparams import ModelArguments, parse_run
from ..models.loader import add_adapters, load_for_inference, serving_model_args
from ..utils.network import listen

logger = logging.getLogger(__name__)


def run(argv: Sequence[str] | None = None) -> None:
    args = parse_run("serve", argv, __doc__)
    if args.serve.engine == "vllm":  # vLLM's server in its own venv, with the same settings (docs/serve.md#vllm)
        from .vllm_engine import serve_with_vllm

        return serve_with_vllm(args)
    from .app import ServedModel, create_app
    from .limits import serve_forever

    listener = listen(args.serve.host, args.serve.port)  # before the model loads: a busy port fails at once
    args.model = serving_model_args(args.model)  # --dtype auto: bf16 where the hardware computes it
    model, tokenizer = load_for_inference(args.model)
    main_id = args.serve.served_model_name or model_name(args.model)
    adapters = args.serve.adapters()
    model, tokenizers = add_adapters(model, args.model, adapters)
    # The model as given first; with extra adapters its own adapter is peft's "default", or none (BASE).
    first = None if not adapters else "default" if args.model.adapter_name_or_path else BASE
    models = [ServedModel(main_id, first, tokenizer)]
    models += [ServedModel(name, name, tokenizers[name]) for name in adapters]
    api_key = args.serve.key()
    app = create_app(model, models, args.serve, args.generation, api_key)
    port = listener.getsockname()[1]  # the one the system chose, for --port 0
    logger.info("serving %s at http://%s:%d/v1 (%s)", ", ".join(m.id for m in models), args.serve.host, port,
                "API key required" if api_key else "no API key")
    serve_forever(app, listener)


def model_name(model: ModelArguments) -> str:
    path = model.adapter_name_or_path or model.model_name_or_path or "model"
    return os.path.basename(os.path.normpath(path))


main = entry_point(run)
