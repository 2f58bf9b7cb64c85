"""The OpenAI protocol as this server speaks it: each request type a pydantic model (`ChatRequest` here,
completions.py's `CompletionRequest`), their shared checks one validator per concern (`OpenAIRequest`: the fields
known, the integers and numbers in bounds, the flags, the stop strings), the error object, and the completion, chunk
and usage objects.

Every check raises an APIError itself (pydantic lets an exception other than ValueError through as it is), so a
refusal is today's one line naming the field, with its status, never pydantic's list of errors; a body's problems
are found in the order of its model's fields, the first one refused. Fields an OpenAI client may send that change
nothing here are dropped (`IGNORED`); any other field the model does not declare is refused.

Messages are read by the data layer's own reader (data/formats.py), so the server accepts exactly
what training accepts (roles, content strings or text parts, tool calls and results) and refuses the
rest with the same words; its errors come back as a 400 naming the field."""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..constants import ASSISTANT, LOSS_FLAG, TOOL, USER
from ..data.formats import Message, Row, check_role_order, link_tool_results, openai_messages
from ..data.tool_calls import tool_names
from .tool_choice import ToolChoice

ERROR_CODES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
               405: "invalid_request_error", 413: "invalid_request_error"}

# Fields an OpenAI client may send that change nothing here.
IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "safety_identifier",
           "prompt_cache_key", "prompt_cache_retention", "reasoning_effort", "verbosity"}
# Fields accepted only at a value that asks for nothing this server lacks (OpenAI's legacy `functions`
# and `function_call` are `tools` and `tool_choice` here).
NEUTRAL_ONLY = {"functions", "function_call", "logit_bias", "response_format", "audio", "modalities", "prediction",
                "web_search_options", "frequency_penalty", "presence_penalty"}
NEUTRAL_VALUES: list[Any] = [False, 0, 0.0, [], {}, "none", "auto", ["text"], {"type": "text"}]
# OpenAI takes 4; evaluation harnesses send more (lm-eval adds the end-of-text string to a task's
# `until` list) and vLLM sets no limit, so this server takes 16. Each is matched on every piece of text.
MAX_STOP_SEQUENCES = 16
MAX_TOP_LOGPROBS = 20
FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for a function's name
MAX_TOOLS = 128
TOOL_CHOICES = ("none", "auto", "required")
# Lists and objects inside each other, at most: a tool's JSON schema needs a few dozen levels; a body nested
# thousands deep would overflow Python's recursion wherever it is walked (json.loads, json.dumps, a comparison).
MAX_JSON_DEPTH = 64


class APIError(Exception):
    """A request refused, as OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = ERROR_CODES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class _RequestRow(Row):
    """The data layer's Row, its errors as 400s naming the request's field instead of a file and line; its pictures
    read from data: URLs, or from files under the server's --image_root only."""

    image_root: str | None = None

    def images_folder(self) -> tuple[Path | None, bool]:
        return (Path(self.image_root) if self.image_root else None), True

    def where(self, field: str | None = None) -> str:
        return f"`{field}`" if field else "the request"

    def error(self, message: str, field: str | None = None) -> APIError:  # type: ignore[override]
        return APIError(400, f"{self.where(field)}: {message}", param=field)


def parse_json_body(raw: bytes) -> dict:
    """The body as a JSON object, nested at most MAX_JSON_DEPTH levels deep."""
    too_deep = APIError(400, f"the request body nests lists and objects more than {MAX_JSON_DEPTH} levels deep; "
                        "send a flatter body")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f" ({e.msg} at line {e.lineno}, column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
        raise APIError(400, f"the request body is not valid JSON{where}") from None
    except RecursionError:  # deeper than the interpreter's recursion limit
        raise too_deep from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    if _depth(body, MAX_JSON_DEPTH + 1) > MAX_JSON_DEPTH:
        raise too_deep
    return body


def _depth(value: Any, stop: int) -> int:
    """How deep lists and objects nest in a parsed JSON value (a scalar: 0), counted level by level without
    recursion, up to `stop`."""
    depth, level = 0, [value]
    while depth < stop:
        containers = [item for item in level if isinstance(item, dict | list)]
        if not containers:
            return depth
        depth += 1
        level = [child for item in containers for child in (item.values() if isinstance(item, dict) else item)]
    return depth


def read_messages(items: Any, image_root: str | None = None) -> list[Message]:
    """A request's `messages` read as training reads them. Earlier replies in a request are context, never trained:
    the reader's refusal of an empty reply (nothing to train) does not apply, so they go in as `"loss": false` and
    come out without it."""
    body = {"messages": items}
    if isinstance(items, list):
        _check_tool_call_ids(items)
        items = [{**m, LOSS_FLAG: False} if isinstance(m, dict) and m.get("role") == ASSISTANT else m for m in items]
    row = _RequestRow("request", 1, body, image_root=image_root)
    messages = openai_messages(row, items)
    check_role_order(row, messages, "messages", ends_with=(USER, TOOL))
    link_tool_results(messages)
    for m in messages:
        m.pop(LOSS_FLAG, None)
    return messages


def _check_tool_call_ids(items: list) -> None:
    """A tool result names the call it answers (OpenAI requires it; the data reader would guess it from
    the order, as training files need)."""
    for i, m in enumerate(items):
        if isinstance(m, dict) and m.get("role") == TOOL and not (isinstance(m.get("tool_call_id"), str)
                                                                  and m["tool_call_id"]):
            raise APIError(400, f"`messages[{i}].tool_call_id` is required: the id of the assistant's tool call "
                           "this message answers", f"messages[{i}].tool_call_id")


def check_tools(value: Any) -> list[dict] | None:
    """The request's `tools` as OpenAI takes them: [{"type": "function", "function": {"name", "description"?,
    "parameters"? (a JSON schema object), "strict"?}}], names unique. None when left out or empty."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise APIError(400, f"`tools` must be a list of {{type: function, function: {{name, ...}}}} objects, got "
                       f"{type(value).__name__}", "tools")
    if len(value) > MAX_TOOLS:
        raise APIError(400, f"`tools` takes at most {MAX_TOOLS} functions (got {len(value)})", "tools")
    seen: set[str] = set()
    for k, tool in enumerate(value):
        where = f"tools[{k}]"
        if not isinstance(tool, dict):
            raise APIError(400, f"`{where}` must be an object {{type: function, function: {{name, ...}}}}", where)
        if tool.get("type") != "function":
            raise APIError(400, f"`{where}.type` must be 'function' (got {json.dumps(tool.get('type'))})",
                           f"{where}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise APIError(400, f"`{where}.function` is required: an object {{name, description, parameters}}",
                           f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
            raise APIError(400, f"`{where}.function.name` must be 1 to 64 letters, digits, underscores or dashes "
                           f"(got {json.dumps(name)})", f"{where}.function.name")
        if name in seen:
            raise APIError(400, f"`{where}.function.name`: {name!r} is offered twice; give each function once",
                           f"{where}.function.name")
        seen.add(name)
        for key, kind, what in (("description", str, "a string"), ("parameters", dict, "a JSON schema object"),
                                ("strict", bool, "true or false")):
            if function.get(key) is not None and not isinstance(function[key], kind):
                raise APIError(400, f"`{where}.function.{key}` must be {what}, got {type(function[key]).__name__}",
                               f"{where}.function.{key}")
    return value


def check_tool_choice(value: Any, tools: list[dict] | None) -> ToolChoice:
    """`tool_choice`: "none", "auto" (the default), "required", or {"type": "function", "function": {"name"}}
    naming one of `tools`. Without tools only none and auto mean something (nothing to call)."""
    if value is None:
        return ToolChoice()
    if isinstance(value, str) and value in TOOL_CHOICES:
        choice = ToolChoice(value)
    elif isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict) \
            and isinstance(value["function"].get("name"), str):
        choice = ToolChoice("function", value["function"]["name"])
    else:
        raise APIError(400, "`tool_choice` must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                       f"\"function\": {{\"name\": ...}}}} (got {json.dumps(value)})", "tool_choice")
    if choice.forced and not tools:
        raise APIError(400, f"`tool_choice` {json.dumps(value)} needs `tools` to call", "tool_choice")
    names = tool_names(tools)
    if choice.name is not None and choice.name not in names:
        raise APIError(400, f"`tool_choice` names the function {choice.name!r}, which is not in `tools` "
                       f"({', '.join(map(repr, names))})", "tool_choice")
    return choice


# Where a bound is the server's --max_batch_size (in the validation context as `max_n`).
MAX_BATCH = None
MAX_BATCH_BOUND = "at most {max_n} (the server's --max_batch_size)"


def neutral(value: Any) -> bool:
    """A value that asks for nothing: what an unsupported field may be sent at."""
    return value is None or any(value == v and type(value) is type(v) for v in NEUTRAL_VALUES)


class OpenAIRequest(BaseModel):
    """What every request type shares: its declared fields only, each checked by the validator of its concern.
    A subclass lists its fields in the order they are checked, the bounds of its integers and numbers, and the
    fields it takes and drops (IGNORED) or takes at a neutral value only (NEUTRAL_ONLY). Validate a body with
    `parse(body, max_n, ...)`: the server's --max_batch_size bounds `n`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    IGNORED: ClassVar[frozenset[str]] = frozenset()
    NEUTRAL_ONLY: ClassVar[frozenset[str]] = frozenset()
    REQUIRED: ClassVar[tuple[str, str]] = ("", "")  # (field, what it must hold)
    # field: (lowest, highest or MAX_BATCH, how the bound reads where not "in LOW..HIGH")
    INTEGERS: ClassVar[dict[str, tuple[int, int | None, str | None]]] = {}
    NUMBERS: ClassVar[dict[str, tuple[float, float]]] = {}  # field: (lowest, highest)
    TYPED: ClassVar[dict[str, type]] = {}  # field: the JSON type it must have (bool, str, dict)

    @classmethod
    def parse(cls, body: dict, max_n: int, image_root: str | None = None) -> Any:
        """The checked request; `max_n`: the server's --max_batch_size; `image_root`: where pictures named by path
        are read (None: data: URLs only)."""
        try:
            return cls.model_validate(body, context={"max_n": max_n, "image_root": image_root})
        except ValidationError as e:  # a value our validators passed that the declared type still refuses
            first = e.errors()[0]
            field = ".".join(map(str, first["loc"])) or None
            raise APIError(400, f"`{field}`: {first['msg']}" if field else first["msg"], field) from None

    @model_validator(mode="before")
    @classmethod
    def known_fields_only(cls, body: dict) -> dict:
        """An unknown field is refused (a misspelt one would otherwise change nothing, silently); an ignored one
        dropped; one taken at a neutral value only is refused at any other; the required one must be there."""
        unknown = sorted(set(body) - set(cls.model_fields) - cls.IGNORED - cls.NEUTRAL_ONLY)
        if unknown:
            raise APIError(400, f"unrecognized request argument supplied: {unknown[0]}", unknown[0])
        cls.refuse_unsupported(body)
        for key in sorted(cls.NEUTRAL_ONLY & set(body)):
            if not neutral(body[key]):
                raise APIError(400, f"`{key}` is not supported by this server; leave it out", key)
        required, what = cls.REQUIRED
        if required and required not in body:
            raise APIError(400, f"`{required}` is required: {what}", required)
        return {key: value for key, value in body.items() if key in cls.model_fields}

    @classmethod
    def refuse_unsupported(cls, body: dict) -> None:
        """A subclass's refusals of whole fields, before the neutral-only ones."""

    @field_validator("*", mode="before")
    @classmethod
    def json_type(cls, value: Any, info: ValidationInfo) -> Any:
        kind = cls.TYPED.get(info.field_name)
        if kind is None:
            return value
        if value is None:
            return cls.model_fields[info.field_name].get_default(call_default_factory=True)
        if not isinstance(value, kind):
            raise APIError(400, f"`{info.field_name}` must be {kind.__name__}, got {type(value).__name__}",
                           info.field_name)
        return value

    @field_validator("*", mode="before")
    @classmethod
    def in_bounds(cls, value: Any, info: ValidationInfo) -> Any:
        """An integer (INTEGERS: never a boolean) or a number (NUMBERS: an integer taken as a float) within its
        bounds; null: the field's default."""
        key = info.field_name
        if key not in cls.INTEGERS and key not in cls.NUMBERS:
            return value
        if value is None:
            return cls.model_fields[key].get_default(call_default_factory=True)
        integer = key in cls.INTEGERS
        if integer:
            low, high, bound = cls.INTEGERS[key]
            if high is MAX_BATCH:
                high, bound = info.context["max_n"], MAX_BATCH_BOUND.format(max_n=info.context["max_n"])
            bound = bound or f"in {low}..{high}"
        else:
            low, high = cls.NUMBERS[key]
            bound = f"in [{low:g}, {high:g}]"
        if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
            raise APIError(400, f"`{key}` must be {'an integer' if integer else 'a number'}, got {json.dumps(value)}",
                           key)
        if not low <= value <= high:
            raise APIError(400, f"`{key}` must be {bound} (got {value})", key)
        return value if integer else float(value)

    @field_validator("stop", mode="before", check_fields=False)
    @classmethod
    def stop_sequences(cls, value: Any) -> list[str]:
        stops = [] if value is None else [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise APIError(400, "`stop` must be a non-empty string or a list of them", "stop")
        if len(stops) > MAX_STOP_SEQUENCES:
            raise APIError(400, f"`stop` takes at most {MAX_STOP_SEQUENCES} sequences (got {len(stops)})", "stop")
        return stops

    @property
    def include_usage(self) -> bool:
        """A stream's last chunk carries the usage (`stream_options: {"include_usage": true}`)."""
        options = getattr(self, "stream_options", None) or {}
        return options.get("include_usage") is True


class ChatRequest(OpenAIRequest):
    """A checked /v1/chat/completions body; None where the client left a setting to the server."""

    IGNORED: ClassVar[frozenset[str]] = frozenset(IGNORED)
    NEUTRAL_ONLY: ClassVar[frozenset[str]] = frozenset(NEUTRAL_ONLY)
    REQUIRED: ClassVar[tuple[str, str]] = ("messages", "a list of {role, content} messages ending with a user message")
    INTEGERS: ClassVar[dict[str, tuple[int, int | None, str | None]]] = {
        "n": (1, MAX_BATCH, None), "max_completion_tokens": (1, 2**31 - 1, "at least 1"),
        "max_tokens": (1, 2**31 - 1, "at least 1"), "seed": (-(2**63), 2**63 - 1, "a 64-bit integer"),
        "top_logprobs": (0, MAX_TOP_LOGPROBS, None)}
    NUMBERS: ClassVar[dict[str, tuple[float, float]]] = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}
    TYPED: ClassVar[dict[str, type]] = {"model": str, "stream": bool, "stream_options": dict, "logprobs": bool}

    messages: list[dict[str, Any]]
    model: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    max_completion_tokens: int | None = None
    max_tokens: int | None = Field(default=None, validate_default=True)  # or max_completion_tokens, its new name
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice = Field(default_factory=ToolChoice)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, validate_default=True)  # 0 once checked, where not asked

    @field_validator("messages", mode="before")
    @classmethod
    def conversation(cls, value: Any, info: ValidationInfo) -> list[Message]:
        return read_messages(value, (info.context or {}).get("image_root"))

    @field_validator("max_tokens", mode="after")
    @classmethod
    def one_reply_budget(cls, value: int | None, info: ValidationInfo) -> int | None:
        given = {v for v in (info.data.get("max_completion_tokens"), value) if v is not None}
        if len(given) > 1:
            raise APIError(400, "`max_tokens` and `max_completion_tokens` differ: give one of them", "max_tokens")
        return given.pop() if given else None

    @field_validator("tools", mode="before")
    @classmethod
    def offered_tools(cls, value: Any) -> list[dict] | None:
        return check_tools(value)

    @field_validator("tool_choice", mode="before")
    @classmethod
    def choice_among_tools(cls, value: Any, info: ValidationInfo) -> ToolChoice:
        return check_tool_choice(value, info.data.get("tools"))

    @field_validator("top_logprobs", mode="after")
    @classmethod
    def top_logprobs_need_logprobs(cls, value: int | None, info: ValidationInfo) -> int:
        if value is not None and not info.data.get("logprobs"):
            raise APIError(400, "`top_logprobs` needs `logprobs: true`: ask for both, or leave top_logprobs out",
                           "top_logprobs")
        return value or 0


def completion_id(prefix: str = "chatcmpl") -> str:
    """A completion's id, as OpenAI spells them: chatcmpl-... (chat), cmpl-... (the legacy completions)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def choice(index: int, message: dict, finish_reason: str, logprobs: dict | None = None) -> dict:
    """One choice of a completion: the assistant message (content, and tool_calls or reasoning_content
    where there are some), why it ended, the log-probabilities when asked."""
    return {"index": index, "message": {"role": "assistant", **message}, "finish_reason": finish_reason,
            "logprobs": logprobs}


def completion(cid: str, model: str, choices: list[dict], usage_: dict) -> dict:
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage_}


def chunk(cid: str, model: str, index: int, delta: dict, finish_reason: str | None = None,
          logprobs: dict | None = None) -> dict:
    return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}]}


def usage_chunk(cid: str, model: str, usage_: dict) -> dict:
    return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [], "usage": usage_}


def sse(data: dict | str) -> str:
    """One server-sent event: `data: JSON` and a blank line."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"
