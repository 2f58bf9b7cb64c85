"""The HTTP side: FastAPI routes for /v1/chat/completions (streamed over server-sent events or not),
/v1/models and /health, the API key check, the request size limit, and every refusal as OpenAI's error
object. Each request names one of the served models (the base or model as loaded, and each --adapter),
is rendered by that model's training template (data/template.py's encode_prompt, what chat uses),
checked against the context, and handed to the engine's worker thread (generation/worker.py); its
events come back through an asyncio queue, so the loop never waits on the model, nor on a request's parsing,
rendering and tokenizing (a thread of their own). A client that leaves cancels its request, streamed or
not; a shutdown cancels every request, so the process exits within seconds. A reply comes back
split into reasoning, content and tool calls (reply.py, data/tool_calls.py), with its log-probabilities when
asked (logprobs.py)."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from ..data.images import image_prompt, message_images
from ..data.template import processor_of, render_text
from ..errors import ConfigError, DataError, TemplateError
from ..generation import Event, SamplingParams
from ..generation import Request as Job
from ..generation.worker import Scheduler
from ..hparams import GenerationArguments
from ..utils.config_facts import config_fact
from . import protocol
from .args import ServeArguments
from .completions import add_completion_routes
from .limits import BodyLimit, cancelled_error, cancelled_when_gone
from .logprobs import TokenTexts, choice_logprobs
from .protocol import APIError, ChatRequest
from .reply import ReplyShape, ReplySplitter, template_text

logger = logging.getLogger(__name__)

ROUTES = "POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health"


@dataclass
class ServedModel:
    """One model clients can name: its id, the engine adapter it runs with (None: the model as loaded;
    BASE: every adapter off; else an adapter name) and the tokenizer with the chat template it trained with."""

    id: str
    adapter: str | None
    tokenizer: Any


class Server:
    """What the routes share: the served models, the context, the defaults, the scheduler."""

    def __init__(self, model: Any, models: list[ServedModel], serve: ServeArguments, generation: GenerationArguments,
                 api_key: str | None) -> None:
        self.models = {m.id: m for m in models}
        self.default = models[0]
        self.serve, self.generation, self.api_key = serve, generation, api_key
        self.context = serve.context_length or config_fact(model.config, "max_position_embeddings", 2048)
        self.dtype = str(model.dtype).removeprefix("torch.")
        self.scheduler = Scheduler(model, self.default.tokenizer, serve.max_batch_size, serve.batch_wait_ms / 1000)
        self.created = int(time.time())

    def model(self, name: str | None) -> ServedModel:
        """The served model a request names (None: the first); another name is a 404 listing them."""
        if name is None:
            return self.default
        if name not in self.models:
            raise APIError(404, f"the model {name!r} does not exist here: this server serves "
                           f"{', '.join(map(repr, self.models))} (GET /v1/models)", "model", "model_not_found")
        return self.models[name]

    def submit(self, prompt_ids: list[int], params: SamplingParams, served: ServedModel) -> tuple[Job, asyncio.Queue]:
        """Hand a request to the worker thread; its events arrive on the returned queue."""
        events: asyncio.Queue[Event] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        job = Job(prompt_ids, params, emit=lambda event: loop.call_soon_threadsafe(events.put_nowait, event),
                  adapter=served.adapter)
        self.scheduler.submit(job)
        return job, events

    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), self.api_key.encode()):
            raise APIError(401, "invalid or missing API key: send `Authorization: Bearer KEY` with the server's "
                           "--api_key", code="invalid_api_key")

    def sampling(self, request: ChatRequest, prompt_tokens: int, shape: ReplyShape | None = None) -> SamplingParams:
        """The request's settings over the server's defaults (--temperature etc.; --do_sample false:
        greedy unless the request asks for a temperature), with the stop strings a forced call adds and the
        call tag tool_choice none bans."""
        defaults = SamplingParams.from_arguments(self.generation)
        return defaults.replace(
            temperature=defaults.temperature if request.temperature is None else request.temperature,
            top_p=defaults.top_p if request.top_p is None else request.top_p,
            max_new_tokens=self.reply_budget(prompt_tokens, request.max_tokens),
            stop=tuple(request.stop) + (shape.stop if shape else ()), seed=request.seed, n=request.n,
            logprobs=request.logprobs, top_logprobs=request.top_logprobs,
            banned_strings=shape.banned if shape else (), banned_openings=shape.banned_openings if shape else (),
        )

    def reply_budget(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """max_tokens as asked, refused (never cut) when the prompt and it exceed the context; when left
        out, the server's --max_new_tokens cut to the room the prompt leaves."""
        room = self.context - prompt_tokens
        if max_tokens is None:
            if room < 1:
                raise APIError(400, f"the messages take {prompt_tokens} tokens, {1 - room} more than the model's "
                               f"context of {self.context} tokens leaves for a reply: shorten them",
                               "messages", "context_length_exceeded")
            return min(self.generation.max_new_tokens, room)
        if max_tokens > room:
            total = prompt_tokens + max_tokens
            raise APIError(400, f"the messages ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) make {total} "
                           f"tokens, {total - self.context} more than the model's context of {self.context} tokens: "
                           "lower max_tokens or shorten the messages", "max_tokens", "context_length_exceeded")
        return max_tokens


def create_app(model: Any, models: list[ServedModel], serve: ServeArguments, generation: GenerationArguments,
               api_key: str | None = None) -> FastAPI:
    server = Server(model, models, serve, generation, api_key)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.scheduler.start()
        yield
        server.scheduler.close()

    app = FastAPI(title="tunesmith", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    _add_error_handlers(app)
    app.add_middleware(BodyLimit, limit=serve.max_request_bytes)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": server.default.id, "models": list(server.models), "dtype": server.dtype,
                **server.scheduler.stats}

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict:
        server.authorize(request)
        return {"object": "list", "data": [_model_card(server, m) for m in server.models.values()]}

    @app.get("/v1/models/{name:path}")
    async def model_card(name: str, request: Request) -> dict:
        server.authorize(request)
        return _model_card(server, server.model(name))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        server.authorize(request)
        raw = await request.body()

        def prepare() -> tuple[ChatRequest, ServedModel, list[int], ReplyShape]:
            chat = ChatRequest.parse(protocol.parse_json_body(raw), serve.max_batch_size, serve.image_root)
            served = server.model(chat.model)
            return chat, served, *_prompt(served, chat, serve.keep_tools_when_tool_choice_none)

        chat, served, prompt_ids, shape = await asyncio.to_thread(prepare)  # CPU work: the loop goes on serving
        job, events = server.submit(prompt_ids, server.sampling(chat, len(prompt_ids), shape), served)
        texts = TokenTexts(served.tokenizer) if chat.logprobs else None
        if chat.stream:
            return StreamingResponse(_stream(job, events, chat, served.id, shape, texts),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        async with cancelled_when_gone(request, [job]):
            return await _complete(job, events, served.id, shape, texts)

    add_completion_routes(app, server)
    return app


def _model_card(server: Server, served: ServedModel) -> dict:
    return {"id": served.id, "object": "model", "created": server.created, "owned_by": "tunesmith",
            "context_length": server.context, "root": server.default.id,
            "parent": None if served is server.default else server.default.id}


def _prompt(served: ServedModel, chat: ChatRequest, keep_tools_for_none: bool) -> tuple[list[int], ReplyShape]:
    """The prompt's token ids, as encode_prompt makes them (the template's render, the tools listed by
    the template itself unless tool_choice is none (ToolChoice.prompt_tools), tokenized; a vision-language
    model's pictures through its processor), with a forced call's opening after them; and the reply's shape."""
    tokenizer = served.tokenizer
    tools = chat.tool_choice.prompt_tools(chat.tools, keep_tools_for_none)
    try:
        text = render_text(tokenizer, chat.messages, add_generation_prompt=True, tools=tools)
        if tools and text == render_text(tokenizer, chat.messages, add_generation_prompt=True):
            raise APIError(400, "`tools`: this model's chat template does not render tools (its prompt is the same "
                           "without them), so the model would never see them; serve a model whose template "
                           "supports tools, or one trained with --chat_template chatml_tools", "tools")
        shape = ReplyShape.of(template_text(tokenizer), text, chat.tools, chat.tool_choice)
        images = message_images(chat.messages)
        if images:
            return image_prompt(processor_of(tokenizer), text + shape.forced, images), shape
    except (TemplateError, ConfigError, DataError) as e:  # a text-only model shown images; a picture unreadable
        raise APIError(400, str(e), "messages") from None
    return tokenizer(text + shape.forced, add_special_tokens=False)["input_ids"], shape


async def _complete(job: Job, events: asyncio.Queue[Event], model_id: str, shape: ReplyShape,
                    texts: TokenTexts | None) -> dict:
    replies, reasons, records, tokens = [""] * job.n, [""] * job.n, [[] for _ in range(job.n)], 0
    done = 0
    try:
        while done < job.n:
            event = await events.get()
            if event.error:
                raise APIError(500, event.error)
            if event.finish_reason == "cancelled":
                raise cancelled_error()
            replies[event.index] += event.text
            records[event.index] += event.logprobs
            if event.finish_reason:
                reasons[event.index], done, tokens = event.finish_reason, done + 1, tokens + event.completion_tokens
    finally:
        job.cancelled = True  # nothing left to do for a finished job; a dropped client frees its rows
    choices = []
    for index, text in enumerate(replies):
        splitter = ReplySplitter(shape)
        splitter.feed(text)
        reply = splitter.finish()[1]
        logprobs = choice_logprobs(records[index], texts) if texts else None
        choices.append(protocol.choice(index, reply.message(), reply.finish_reason(reasons[index]), logprobs))
    usage = protocol.usage(len(job.prompt_ids), tokens)
    return protocol.completion(protocol.completion_id(), model_id, choices, usage)


async def _stream(job: Job, events: asyncio.Queue[Event], chat: ChatRequest, model_id: str, shape: ReplyShape,
                  texts: TokenTexts | None) -> AsyncIterator[str]:
    """Each reply's deltas as its splitter releases them (reasoning, content, then any tool calls); each
    chunk carries the log-probabilities of the tokens generated since the last chunk of its reply."""
    cid, done, tokens = protocol.completion_id(), 0, 0
    splitters = [ReplySplitter(shape) for _ in range(job.n)]
    pending: list[list] = [[] for _ in range(job.n)]

    def logprobs(index: int) -> dict | None:
        if texts is None or not pending[index]:
            return None
        records, pending[index] = pending[index], []
        return choice_logprobs(records, texts)

    try:
        for index in range(job.n):
            yield protocol.sse(protocol.chunk(cid, model_id, index, {"role": "assistant", "content": ""}))
        while done < job.n:
            event = await events.get()
            if event.error or event.finish_reason == "cancelled":
                yield protocol.sse((APIError(500, event.error) if event.error else cancelled_error()).body())
                break
            index = event.index
            pending[index] += event.logprobs
            deltas = splitters[index].feed(event.text) if event.text else []
            if event.finish_reason:
                rest, reply = splitters[index].finish()
                deltas += rest + reply.call_deltas()
            for delta in deltas:
                yield protocol.sse(protocol.chunk(cid, model_id, index, delta, logprobs=logprobs(index)))
            if event.finish_reason:
                done, tokens = done + 1, tokens + event.completion_tokens
                yield protocol.sse(protocol.chunk(cid, model_id, index, {}, reply.finish_reason(event.finish_reason),
                                                  logprobs(index)))
        if chat.include_usage and done == job.n:
            yield protocol.sse(protocol.usage_chunk(cid, model_id, protocol.usage(len(job.prompt_ids), tokens)))
        yield protocol.sse("[DONE]")
    finally:
        job.cancelled = True


def _add_error_handlers(app: FastAPI) -> None:
    """Every refusal as OpenAI's error object and status; an unexpected failure as a 500, the server
    going on."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        message = (f"no route {request.method} {request.url.path}: this server has {ROUTES}" if e.status_code in (404, 405)
                   else str(e.detail))
        return JSONResponse(APIError(e.status_code, message).body(), status_code=e.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return JSONResponse(APIError(400, str(e)).body(), status_code=400)

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception) -> JSONResponse:
        logger.exception("request failed: %s %s", request.method, request.url.path)
        return JSONResponse(APIError(500, f"internal error: {type(e).__name__}: {e}").body(), status_code=500)
