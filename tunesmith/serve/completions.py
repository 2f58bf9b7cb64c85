"""The legacy OpenAI completions API, POST /v1/completions: raw prompts (no chat template), `echo`, and
per-token `logprobs` as {tokens, token_logprobs, top_logprobs, text_offset}. It is what loglikelihood
clients such as lm-eval's `local-completions` model call: token ids of context and continuation, with
`echo`, `logprobs: 1` and `max_tokens: 1`, read back as every prompt token's log-probability.

A request's several prompts are submitted as separate engine jobs, so they share a batch; their
choices are numbered prompt-major (prompt k's i-th reply is choice k * n + i), as OpenAI numbers them.
Refusals are OpenAI's error object (protocol.APIError), one line naming the field."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import Field, ValidationInfo, field_validator

from ..generation import Completion, Event, SamplingParams, TokenLogprob
from ..generation import Request as Job
from ..generation.detokenizer import IncrementalDecoder
from . import protocol
from .limits import cancelled_error, cancelled_when_gone
from .protocol import MAX_BATCH, APIError, OpenAIRequest

if TYPE_CHECKING:
    from .app import ServedModel, Server

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this API
MAX_LOGPROBS = 5  # OpenAI's limit on `logprobs`
PROMPT_FORMS = "a string, a list of strings, a list of token ids, or a list of lists of token ids"
# -inf (a token the model rules out) has no JSON spelling; vLLM reports it as this.
LOWEST_LOGPROB = -9999.0


class CompletionRequest(OpenAIRequest):
    """A checked /v1/completions body; None where the client left a setting to the server's flags."""

    IGNORED: ClassVar[frozenset[str]] = frozenset({"user", "suffix"})  # suffix: at null only (refuse_unsupported)
    NEUTRAL_ONLY: ClassVar[frozenset[str]] = frozenset({"logit_bias"})
    REQUIRED: ClassVar[tuple[str, str]] = ("prompt", PROMPT_FORMS)
    INTEGERS: ClassVar[dict[str, tuple[int, int | None, str | None]]] = {
        "n": (1, MAX_BATCH, None), "best_of": (1, MAX_BATCH, None), "max_tokens": (0, 2**31 - 1, "at least 0"),
        "logprobs": (0, MAX_LOGPROBS, f"in 0..{MAX_LOGPROBS}"), "seed": (-(2**63), 2**63 - 1, "a 64-bit integer")}
    NUMBERS: ClassVar[dict[str, tuple[float, float]]] = {
        "temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "presence_penalty": (-2.0, 2.0),
        "frequency_penalty": (-2.0, 2.0)}
    TYPED: ClassVar[dict[str, type]] = {"model": str, "echo": bool, "stream": bool, "stream_options": dict}

    prompt: list[str | list[int]]  # one prompt or several, each a string or token ids
    model: str | None = None
    echo: bool = False
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    best_of: int | None = None
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, validate_default=True)
    logprobs: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)

    @classmethod
    def refuse_unsupported(cls, body: dict) -> None:
        if body.get("suffix") is not None:
            raise APIError(400, "`suffix` is not supported by this server (no fill-in-the-middle); leave it out",
                           "suffix")

    @field_validator("prompt", mode="before")
    @classmethod
    def prompts(cls, value: Any) -> list[str | list[int]]:
        return _prompts(value)

    @field_validator("best_of", mode="after")
    @classmethod
    def every_reply_returned(cls, value: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n", 1)
        if value is not None and value != n:
            raise APIError(400, f"`best_of` ({value}) must equal `n` ({n}) or be left out: this server returns "
                           "every reply it generates", "best_of")
        return value

    @field_validator("max_tokens", mode="after")
    @classmethod
    def something_asked(cls, value: int, info: ValidationInfo) -> int:
        if value == 0 and not info.data.get("echo"):
            raise APIError(400, "`max_tokens` 0 asks for nothing: give at least 1, or set `echo` (with `logprobs`) to "
                           "score the prompt alone", "max_tokens")
        return value


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompts(value: Any) -> list[str | list[int]]:
    """The prompts a `prompt` field holds: one string or token list, or a list of them."""
    single = isinstance(value, str) or isinstance(value, list) and value and all(map(_is_token, value))
    prompts = [value] if single else value
    if not isinstance(prompts, list) or not prompts:
        raise APIError(400, f"`prompt` must be {PROMPT_FORMS} (got {_kind(value)})", "prompt")
    for k, prompt in enumerate(prompts):
        name = "`prompt`" if single else f"`prompt[{k}]`"
        if not (isinstance(prompt, str) or isinstance(prompt, list) and all(map(_is_token, prompt))):
            raise APIError(400, f"{name} must be a string or a list of token ids (got {_kind(prompt)})", "prompt")
        if not prompt:
            raise APIError(400, f"{name} is empty: give at least one character or token", "prompt")
    return prompts


def _kind(value: Any) -> str:
    return "an empty list" if value == [] else type(value).__name__


@dataclass
class Prompt:
    """One prompt as the model sees it: its token ids, the text an `echo` returns, and each token's
    character offset in that text (counted when an echo asks for it: a long prompt's are slow to count)."""

    ids: list[int]
    text: str
    tokenizer: Any = field(repr=False)

    @cached_property
    def offsets(self) -> list[int]:
        # Counted on the decoded text; a special token the tokenizer put in front of a string (a BOS) is not
        # in the client's string, so they shift back by it.
        decoded = self.tokenizer.decode(self.ids)
        shift = len(decoded) - len(self.text) if decoded.endswith(self.text) else 0
        return [max(0, o - shift) for o in text_offsets(self.tokenizer, self.ids, skip_special=False)]


def encode(prompt: str | list[int], tokenizer: Any, name: str) -> Prompt:
    """A string is tokenized as is, no chat template, with the tokenizer's own special tokens
    (`add_special_tokens=True`, as vLLM does: a BOS for Llama's tokenizer, nothing for SmolLM2's), so a
    base model sees what it was trained on; token ids are taken as given, once checked against the
    vocabulary. The echo of ids is their decoding, special tokens kept."""
    if isinstance(prompt, str):
        return Prompt(tokenizer(prompt, add_special_tokens=True)["input_ids"], prompt, tokenizer)
    vocabulary = len(tokenizer)
    outside = next((t for t in prompt if not 0 <= t < vocabulary), None)
    if outside is not None:
        raise APIError(400, f"{name} has the token id {outside}, outside the model's vocabulary (0..{vocabulary - 1})",
                       "prompt")
    return Prompt(list(prompt), tokenizer.decode(prompt), tokenizer)


def text_offsets(tokenizer: Any, ids: list[int], skip_special: bool) -> list[int]:
    """Each token's character offset in the text `ids` decode to: the length of the text released
    before it. A token inside a character split over several byte tokens gets that character's
    offset, so text[offset:] always begins at a whole character."""
    decoder = IncrementalDecoder(tokenizer, skip_special_tokens=skip_special)
    offsets, length = [], 0
    for token in ids:
        offsets.append(length)
        length += len(decoder.add(token))
    return offsets


def check_context(prompt: Prompt, max_tokens: int, context: int, name: str) -> None:
    """A prompt that does not fit the context with max_tokens is refused, never cut."""
    total = len(prompt.ids) + max_tokens
    if total > context:
        raise APIError(400, f"{name} ({len(prompt.ids)} tokens) plus max_tokens ({max_tokens}) make {total} tokens, "
                       f"{total - context} more than the model's context of {context} tokens: lower max_tokens or "
                       "shorten the prompt", "prompt", "context_length_exceeded")


def sampling(server: Server, request: CompletionRequest) -> SamplingParams:
    """The request's settings over the server's generation flags, as the chat route takes them; with
    `logprobs` every generated token's log-probability, and with `echo` too the prompt's."""
    defaults = SamplingParams.from_arguments(server.generation)
    scored = request.logprobs is not None
    return defaults.replace(
        temperature=defaults.temperature if request.temperature is None else request.temperature,
        top_p=defaults.top_p if request.top_p is None else request.top_p,
        max_new_tokens=request.max_tokens, stop=tuple(request.stop), seed=request.seed, n=request.n,
        presence_penalty=request.presence_penalty, frequency_penalty=request.frequency_penalty,
        logprobs=scored, top_logprobs=request.logprobs or 0, prompt_logprobs=scored and request.echo,
    )


def logprobs_object(tokenizer: Any, ids: list[int], records: list[TokenLogprob | None], offsets: list[int]) -> dict:
    """OpenAI's legacy logprobs: each token as `tokenizer.decode([id])`, its log-probability and its `k`
    most likely alternatives (null for the prompt's first token, which nothing predicts), and its
    character offset in the choice's text."""
    return {"tokens": [tokenizer.decode([i]) for i in ids],
            "token_logprobs": [None if r is None else _finite(r.logprob) for r in records],
            "top_logprobs": [None if r is None else _top(tokenizer, r) for r in records],
            "text_offset": offsets}


def _finite(logprob: float) -> float:
    return max(logprob, LOWEST_LOGPROB) if not math.isnan(logprob) else LOWEST_LOGPROB


def _top(tokenizer: Any, record: TokenLogprob) -> dict[str, float]:
    top: dict[str, float] = {}
    for token, logprob in record.top:  # most likely first: two ids that decode alike keep the likelier
        top.setdefault(tokenizer.decode([token]), _finite(logprob))
    return top


class _ChoiceLogprobs:
    """The logprobs of one choice's generated tokens, in the pieces events bring them: offsets continue
    from the echoed prompt, and tokens past a stop string (generated before it was seen) are dropped."""

    def __init__(self, tokenizer: Any, start: int) -> None:
        self.tokenizer, self.length = tokenizer, start
        self.decoder = IncrementalDecoder(tokenizer)  # the engine's decoding of a reply: specials skipped

    def take(self, records: list[TokenLogprob], text_end: int, completion: Completion | None) -> dict:
        """`records` as a logprobs object; `text_end`: the choice's text length once this piece is added;
        `completion`: the finished reply, when this piece ends it."""
        ids, offsets = [r.token_id for r in records], []
        for token in ids:
            offsets.append(self.length)
            self.length += len(self.decoder.add(token))
        kept: list[TokenLogprob | None] = list(records)
        if completion is not None and completion.finish_reason == "stop" and completion.stop_token_id is None:
            keep = [k for k, o in enumerate(offsets) if o < text_end]  # cut at a stop string
            ids, kept, offsets = [ids[k] for k in keep], [kept[k] for k in keep], [offsets[k] for k in keep]
        if completion is not None and completion.stop_logprob is not None:
            ids, kept, offsets = ids + [completion.stop_token_id], kept + [completion.stop_logprob], offsets + [text_end]
        return logprobs_object(self.tokenizer, ids, kept, offsets)


def add_completion_routes(app: FastAPI, server: Server) -> None:
    """POST /v1/completions on the app."""

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        server.authorize(request)
        raw = await request.body()
        parsed, served, prompts = await asyncio.to_thread(_prepare, server, raw)  # CPU work: the loop goes on
        params = sampling(server, parsed)
        submitted = [server.submit(prompt.ids, params, served) for prompt in prompts]
        if parsed.stream:
            return StreamingResponse(_stream(submitted, prompts, parsed, served), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        async with cancelled_when_gone(request, [job for job, _ in submitted]):
            return await _complete(submitted, prompts, parsed, served)


def _prepare(server: Server, raw: bytes) -> tuple[CompletionRequest, ServedModel, list[Prompt]]:
    """The body checked, its model found, its prompts tokenized and checked against the context."""
    parsed = CompletionRequest.parse(protocol.parse_json_body(raw), server.serve.max_batch_size)
    served = server.model(parsed.model)
    names = ["`prompt`"] if len(parsed.prompt) == 1 else [f"`prompt[{k}]`" for k in range(len(parsed.prompt))]
    prompts = [encode(p, served.tokenizer, name) for p, name in zip(parsed.prompt, names)]
    for prompt, name in zip(prompts, names):
        check_context(prompt, parsed.max_tokens, server.context, name)
    return parsed, served, prompts


async def _events(submitted: list[tuple[Job, asyncio.Queue]]) -> AsyncIterator[tuple[int, Event]]:
    """Every job's events as they come, with the index of its prompt, until every reply has finished or
    an error ends them; the jobs are cancelled when it stops (a dropped client frees their rows)."""
    merged: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

    async def forward(k: int, job: Job, events: asyncio.Queue[Event]) -> None:
        finished = 0
        while finished < job.n:
            event = await events.get()
            merged.put_nowait((k, event))
            finished += event.finish_reason is not None or event.error is not None

    tasks = [asyncio.create_task(forward(k, job, events)) for k, (job, events) in enumerate(submitted)]
    try:
        left = sum(job.n for job, _ in submitted)
        while left:
            k, event = await merged.get()
            yield k, event
            if event.error:
                return
            left -= event.finish_reason is not None
    finally:
        for task in tasks:
            task.cancel()
        for job, _ in submitted:
            job.cancelled = True


def _echo(prompt: Prompt, job: Job, tokenizer: Any) -> dict:
    return logprobs_object(tokenizer, prompt.ids, job.prompt_logprobs or [None] * len(prompt.ids), prompt.offsets)


def _merge(first: dict, second: dict) -> dict:
    return {key: first[key] + second[key] for key in first}


async def _complete(submitted: list[tuple[Job, asyncio.Queue]], prompts: list[Prompt], request: CompletionRequest,
                    served: ServedModel) -> dict:
    async for _, event in _events(submitted):
        if event.error:
            raise APIError(500, event.error)
        if event.finish_reason == "cancelled":
            raise cancelled_error()
    choices, generated = [], 0
    for k, ((job, _), prompt) in enumerate(zip(submitted, prompts)):
        echoed = prompt.text if request.echo else ""
        for i, completion in enumerate(job.completions):
            generated += len(completion.token_ids)
            text = echoed + completion.text
            logprobs = None
            if request.logprobs is not None:
                logprobs = _ChoiceLogprobs(served.tokenizer, len(echoed)).take(completion.logprobs or [], len(text),
                                                                               completion)
                if request.echo:
                    logprobs = _merge(_echo(prompt, job, served.tokenizer), logprobs)
            choices.append({"index": k * request.n + i, "text": text, "logprobs": logprobs,
                            "finish_reason": completion.finish_reason})
    return {"id": protocol.completion_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": served.id,
            "choices": choices, "usage": protocol.usage(sum(len(p.ids) for p in prompts), generated)}


async def _stream(submitted: list[tuple[Job, asyncio.Queue]], prompts: list[Prompt], request: CompletionRequest,
                  served: ServedModel) -> AsyncIterator[str]:
    """Chunks of object "text_completion", one per event (text, its tokens' logprobs, the finish); with
    `echo`, a choice's first chunk is its prompt, sent with its first event (the prompt's logprobs are
    known once it is prefilled). Then the usage when asked (`stream_options.include_usage`) and [DONE]."""
    cid, tokenizer, n = protocol.completion_id("cmpl"), served.tokenizer, request.n
    echoed = [prompt.text if request.echo else "" for prompt in prompts]
    lengths = [len(echoed[c // n]) for c in range(len(prompts) * n)]  # each choice's text so far
    scored = [_ChoiceLogprobs(tokenizer, length) for length in lengths] if request.logprobs is not None else []
    started: set[int] = set()
    generated, done = 0, 0
    async for k, event in _events(submitted):
        if event.error or event.finish_reason == "cancelled":
            yield protocol.sse((APIError(500, event.error) if event.error else cancelled_error()).body())
            break
        c, job = k * n + event.index, submitted[k][0]
        if request.echo and c not in started:
            echo = _echo(prompts[k], job, tokenizer) if scored else None
            yield protocol.sse(_chunk(cid, served.id, c, prompts[k].text, None, echo))
        started.add(c)
        lengths[c] += len(event.text)
        finished = job.completions[event.index] if event.finish_reason else None
        logprobs = scored[c].take(event.logprobs, lengths[c], finished) if scored else None
        if event.finish_reason:
            generated, done = generated + event.completion_tokens, done + 1
        if event.text or event.finish_reason or (logprobs and logprobs["tokens"]):
            yield protocol.sse(_chunk(cid, served.id, c, event.text, event.finish_reason, logprobs))
    if request.include_usage and done == len(prompts) * n:
        usage = protocol.usage(sum(len(p.ids) for p in prompts), generated)
        yield protocol.sse({"id": cid, "object": "text_completion", "created": int(time.time()), "model": served.id,
                            "choices": [], "usage": usage})
    yield protocol.sse("[DONE]")


def _chunk(cid: str, model: str, index: int, text: str, finish_reason: str | None, logprobs: dict | None = None
           ) -> dict:
    return {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}]}

