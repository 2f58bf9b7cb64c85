"""Conversation data formats, read into one canonical form: a list of messages
`{"role": system|user|assistant|tool, "content": str}` (plus an optional `"loss": false`); a user or system
message that shows images has a list of text and image parts as its content (data/images.py).

Formats are detected per row (so a file may mix them): OpenAI `messages`, ShareGPT `conversations`,
Alpaca `instruction`/`input`/`output`. Every error names the file, the line (JSONL) or row (JSON
array), and the field."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..constants import ASSISTANT, LOSS_FLAG, ROLES, SYSTEM, TOOL, USER
from ..errors import DataError
from ..hparams.data_args import DEFAULT_MAX_ROW_BYTES
from ..utils.paths import is_arrow, is_table, problem_with_data_file, shard_files
from .hh import DAHOAS, HH, hh_conversation, hh_kind
from .images import (
    IMAGE_PARTS,
    PLACEHOLDER,
    content_text,
    has_images,
    image_part,
    part_reference,
    resolve_reference,
    split_placeholders,
)
from .json_rows import json_items
from .mix import RowSelection

Message = dict[str, Any]
T = TypeVar("T")

SHAREGPT_ROLES = {"system": SYSTEM, "human": USER, "user": USER, "gpt": ASSISTANT, "assistant": ASSISTANT,
                  "function_call": ASSISTANT, "observation": TOOL, "tool": TOOL}


@dataclass(frozen=True)
class Row:
    """One input row and where it came from."""

    path: str
    line: int  # 1-based line in the file where the row starts (the row number in a table)
    data: dict
    index: int | None = None  # 1-based position in a JSON array (rows may share a line there)
    unit: str = "line"  # "row" for a Parquet file or a datasets folder, which have no lines

    def images_folder(self) -> tuple[Path | None, bool]:
        """(where the row's relative image paths start, whether paths outside it are refused): a data file's
        own folder, anything readable."""
        return Path(self.path).parent, False

    def where(self, field: str | None = None) -> str:
        loc = f"{self.path}:{self.unit} {self.line}" + (f" (row {self.index})" if self.index else "")
        return f"{loc}: field `{field}`" if field else loc

    def error(self, message: str, field: str | None = None) -> DataError:
        return DataError(f"{self.where(field)}: {message}")


@dataclass(frozen=True)
class Conversation:
    row: Row
    messages: list[Message]
    tools: list[dict] | None = None  # function specs the template lists for the model


def read_rows(path: str | Path, strict: bool = True,
              max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> Iterator[Row | DataError]:
    """Rows of a data file, each with the line it starts on. JSON or JSONL is decided by the content,
    not the name: a JSON array (or one object), or one object per line (json_rows.py, which reads no row
    longer than max_row_bytes). A Parquet file, an Arrow file datasets wrote or a datasets.save_to_disk folder
    gives its rows, numbered from 1 ("file:row N"); a folder of such files (shards) the rows of each, in name
    order. A file that is missing, empty, a folder of anything else, or not UTF-8 is
    refused by name. A row that is not a JSON object raises (strict) or is yielded as its DataError, so a
    caller can list every bad row."""
    path = str(path)
    problem = problem_with_data_file(path)
    if problem:
        raise DataError(f"data file {path}: {problem}")
    if shard_files(path):  # a folder of shards: each file's rows, in name order, named by the file
        for shard in shard_files(path):
            yield from read_rows(shard, strict, max_row_bytes)
        return
    table = is_table(path)
    items = table_items(path) if table else json_items(path, max_row_bytes)
    for lineno, index, item in items:
        try:
            if isinstance(item, DataError):
                raise item
            yield as_row(path, lineno, item, index, "row" if table else "line")
        except DataError as error:
            if strict:
                raise
            yield error


def table_items(path: str, start: int = 0) -> Iterator[tuple[int, None, Any]]:
    """(row number, None, row) per row of a Parquet file, an Arrow file or a datasets.save_to_disk folder, after the first
    `start` rows (which are not read: a streamed run resumes there, data/streaming.py). A table gives every row
    every column, so a null there means the row lacks the field: nulls in objects are dropped."""
    if Path(path).is_dir() or is_arrow(path):
        from datasets import Dataset, load_from_disk

        # memory-mapped: a slice reads only its own rows
        table = (Dataset.from_file(path) if is_arrow(path) else load_from_disk(path)).data.table
        batches = (batch.to_pylist() for batch in table.slice(start).to_batches(max_chunksize=1024))
        number = start
    else:
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        groups, number = [], 0
        for g in range(parquet.num_row_groups):  # whole row groups before `start` are skipped unread
            if not groups and number + parquet.metadata.row_group(g).num_rows <= start:
                number += parquet.metadata.row_group(g).num_rows
            else:
                groups.append(g)
        batches = (batch.to_pylist() for batch in parquet.iter_batches(batch_size=1024, row_groups=groups))
        skip = start - number
        if skip:  # the rows of the first group read that come before `start`
            batches = _after(batches, skip)
            number = start
    for batch in batches:
        for item in batch:
            number += 1
            yield number, None, _without_nulls(item)


def _after(batches: Iterator[list], skip: int) -> Iterator[list]:
    """The batches without their first `skip` rows."""
    for batch in batches:
        if skip >= len(batch):
            skip -= len(batch)
            continue
        yield batch[skip:]
        skip = 0


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def as_row(path: str, line: int, item: Any, index: int | None = None, unit: str = "line") -> Row:
    row = Row(path, line, item if isinstance(item, dict) else {}, index, unit)
    if not isinstance(item, dict):
        raise row.error(f"expected a JSON object, got {type(item).__name__}")
    return row


def detect_format(row: Row) -> str:
    kind = hh_kind(row.data)
    if kind:
        return kind
    if "messages" in row.data:
        return "openai"
    if is_openai_preference(row.data):
        return "openai_preference"
    if "conversations" in row.data:
        return "sharegpt"
    if "instruction" in row.data:
        return "alpaca"
    raise row.error(
        f"unknown format (keys: {sorted(row.data)}); expected `messages` (OpenAI), `conversations` (ShareGPT) "
        "or `instruction`/`output` (Alpaca), or `chosen` as an HH transcript (\"\\n\\nHuman: ...\\n\\nAssistant: ...\")"
        + ("; rows of raw `text` are a pre-training corpus: train on them with `tunesmith pt`" if "text" in row.data
           else "")
    )


def _text(row: Row, value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise row.error(f"expected a string, got {type(value).__name__}", field)
    return value


@dataclass(frozen=True)
class MessageShape:
    """How one format spells a message: its two keys, and its speaker names mapped to roles."""

    role_key: str
    content_key: str
    roles: dict[str, str]
    unknown_role: str  # the error for a speaker not in `roles`, formatted with it


OPENAI = MessageShape("role", "content", {**{role: role for role in ROLES}, "developer": SYSTEM, "function": TOOL},
                      f"unknown role {{!r}} (expected one of {', '.join(ROLES)})")
SHAREGPT = MessageShape("from", "value", SHAREGPT_ROLES,
                        "unknown speaker {!r} (expected human, gpt, system, function_call or observation)")

TEXT_PARTS = ("text", "input_text", "output_text")
REASONING_PARTS = ("reasoning", "thinking")
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
# LLaMA-Factory's identity data leaves these for the user to fill in.
PLACEHOLDERS = ("{{name}}", "{{author}}")


def read_messages(row: Row, items: Any, field: str, shape: MessageShape) -> list[Message]:
    """The canonical messages of a list of one format's messages; errors name the field and index."""
    pair = f"{{{shape.role_key}, {shape.content_key}}}"
    if not isinstance(items, list):
        raise row.error(f"expected a list of {pair} messages", field)
    messages = []
    for i, m in enumerate(items):
        where = f"{field}[{i}]"
        if not isinstance(m, dict):
            raise row.error(f"expected a {pair} object", where)
        if shape.role_key not in m:
            raise row.error(f"missing `{shape.role_key}`", where)
        speaker = m[shape.role_key]
        role = shape.roles.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise row.error(shape.unknown_role.format(speaker), f"{where}.{shape.role_key}")
        if shape is SHAREGPT and speaker == "function_call":
            messages.append(_sharegpt_tool_call(row, m, where))
        else:
            messages.append(_message(row, role, m, where, shape.content_key))
    return messages


def openai_messages(row: Row, items: Any, field: str = "messages") -> list[Message]:
    return read_messages(row, items, field, OPENAI)


def sharegpt_messages(row: Row, items: Any, field: str = "conversations") -> list[Message]:
    return read_messages(row, items, field, SHAREGPT)


def _content(row: Row, value: Any, where: str) -> tuple[str | list[dict] | None, str | None, list]:
    """(content, reasoning, tool calls) of a message's content: a string, null, or a list of parts whose
    text parts are joined (a reasoning part becomes the reasoning, a tool_call part a call, as
    LLaMA-Factory's files hold them). With image parts the content stays a list of text and image parts, in
    order (data/images.py). Any other part is refused."""
    if value is None or isinstance(value, str):
        return value, None, []
    if not isinstance(value, list):
        raise row.error(f"expected a string or a list of content parts, got {type(value).__name__}", where)
    texts, reasoning, calls, parts = [], [], [], []
    for k, part in enumerate(value):
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        kind = kind if isinstance(kind, str) or kind is None else repr(kind)  # a list or object names no part
        if kind in IMAGE_PARTS:
            try:
                ref = resolve_reference(part_reference(part), *row.images_folder())
            except ValueError as e:
                raise row.error(str(e), f"{where}[{k}]") from None
            parts += [*([{"type": "text", "text": "".join(texts)}] if texts else []), image_part(ref)]
            texts = []
            continue
        text = next((part[key] for key in ("text", "value", kind or "") if isinstance(part, dict)
                     and isinstance(part.get(key), str)), None) if kind else None
        if kind in TEXT_PARTS + REASONING_PARTS + ("tool_call",) and text is None:
            raise row.error(f"a `{kind}` part needs its text in `text`", f"{where}[{k}]")
        if kind in TEXT_PARTS:
            texts.append(text)
        elif kind in REASONING_PARTS:
            reasoning.append(text)
        elif kind == "tool_call":
            try:
                calls.append(json.loads(text))
            except json.JSONDecodeError as e:
                raise row.error(f"a tool_call part holds the call as JSON text ({e.msg} at column {e.colno})",
                                f"{where}[{k}]") from None
        else:
            raise row.error(f"content part of type {kind!r}: tunesmith reads text, image and tool_call parts; "
                            "remove the part (or the row)", f"{where}[{k}].type")
    if parts:
        return parts + ([{"type": "text", "text": "".join(texts)}] if texts else []), ("".join(reasoning) or None), calls
    return "".join(texts), ("".join(reasoning) or None), calls


def _tool_call(row: Row, call: Any, where: str) -> dict:
    """{"type": "function", "function": {"name", "arguments": mapping}} (and its id), from the OpenAI
    form (arguments as JSON text or a mapping) or a bare {"name", "arguments"}."""
    if not isinstance(call, dict):
        raise row.error("expected a {type, function: {name, arguments}} object", where)
    function = call.get("function", call)
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise row.error("a tool call needs `function.name`", where)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise row.error(f"`arguments` is not valid JSON ({e.msg} at column {e.colno})",
                            f"{where}.function.arguments") from None
    if not isinstance(arguments, dict):
        raise row.error(f"`arguments` must be a JSON object, got {type(arguments).__name__}", f"{where}.function.arguments")
    out = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def _message(row: Row, role: str, source: dict, where: str, content_key: str) -> Message:
    if content_key not in source and not (role == ASSISTANT and (source.get("tool_calls") or source.get("function_call"))):
        raise row.error(f"missing `{content_key}`", where)
    content, reasoning, part_calls = _content(row, source.get(content_key), f"{where}.{content_key}")
    if isinstance(content, list) and role == ASSISTANT:
        raise row.error("an image in an assistant turn: the model reads images, it does not write them; put the "
                        "image in a user turn", f"{where}.{content_key}")
    message: Message = {"role": role, "content": content}
    if role == ASSISTANT:
        calls = source.get("tool_calls") or ([source["function_call"]] if source.get("function_call") else [])
        if not isinstance(calls, list):
            raise row.error("expected a list of tool calls", f"{where}.tool_calls")
        calls = calls + part_calls
        if part_calls and not (content or "").strip():
            message["content"] = None
        if calls:
            message["tool_calls"] = [_tool_call(row, c, f"{where}.tool_calls[{k}]") for k, c in enumerate(calls)]
        for key in REASONING_KEYS:
            if isinstance(source.get(key), str) and source[key].strip():
                reasoning = source[key]
        if reasoning:
            message["reasoning_content"] = reasoning
    elif content is None:
        raise row.error(f"a {role} message needs text; `{content_key}` is null", f"{where}.{content_key}")
    if role == TOOL:
        for key in ("tool_call_id", "name"):
            if isinstance(source.get(key), str):
                message[key] = source[key]
    _loss_flags(row, source, message, where)
    if role == ASSISTANT and not (content or "").strip() and not message.get("tool_calls") \
            and message.get(LOSS_FLAG, True):
        raise row.error("empty reply: nothing to train but the end of the turn; remove the turn, or keep it as "
                        'context with "loss": false (OpenAI: "weight": 0)', f"{where}.{content_key}")
    return message


def _loss_flags(row: Row, source: dict, message: Message, where: str) -> None:
    """`"loss": false` (tunesmith), `"weight": 0` (OpenAI fine-tuning) or `"loss_weight": 0` (LLaMA-Factory) keep
    a reply as context only; 1 (or true) trains it. Any other weight is refused, never rounded or ignored."""
    if LOSS_FLAG in source:
        if not isinstance(source[LOSS_FLAG], bool):
            raise row.error("expected true or false", f"{where}.{LOSS_FLAG}")
        message[LOSS_FLAG] = source[LOSS_FLAG]
    for key in ("weight", "loss_weight"):  # OpenAI's, LLaMA-Factory's
        if key not in source:
            continue
        if source[key] not in (0, 1) or isinstance(source[key], bool):
            # The loss is a mean over trained tokens, so a reply trains whole or not at all (OpenAI allows 0 and 1 too).
            raise row.error(f"expected 0 or 1 (0: context only, 1: trained), got {source[key]!r}: a reply trains whole "
                            'or not at all; give 0 or 1, or "loss": false', f"{where}.{key}")
        if message["role"] != ASSISTANT:
            if source[key]:
                raise row.error("only assistant messages can train (what trains is the replies)", f"{where}.{key}")
            continue
        message[LOSS_FLAG] = bool(source[key]) and message.get(LOSS_FLAG, True)


def _sharegpt_tool_call(row: Row, source: dict, where: str) -> Message:
    """A ShareGPT `function_call` turn: its value is the call as JSON text ({"name", "arguments"}, or a
    list of them for parallel calls)."""
    value = source.get("value")
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError as e:
        raise row.error(f"a function_call turn holds the call as JSON text ({e.msg} at column {e.colno})",
                        f"{where}.value") from None
    calls = parsed if isinstance(parsed, list) else [parsed]
    message: Message = {"role": ASSISTANT, "content": None,
                        "tool_calls": [_tool_call(row, c, f"{where}.value") for c in calls]}
    _loss_flags(row, source, message, where)
    return message


def openai_input(row: Row) -> tuple[list[Message], list[dict] | None]:
    """(messages, tools) of the `input` of an OpenAI preference fine-tuning row: {messages, tools}."""
    value = row.data.get("input")
    if not isinstance(value, dict) or "messages" not in value:
        raise row.error(f"expected an object with `messages` (and `tools`), got {type(value).__name__}", "input")
    tools = row_tools(Row(row.path, row.line, value, row.index, row.unit), "input.")
    return openai_messages(row, value["messages"], "input.messages"), tools


def is_openai_preference(data: dict) -> bool:
    """A row of OpenAI's preference fine-tuning: `input` ({messages, tools}) and the two outputs."""
    return isinstance(data.get("input"), dict) and ("preferred_output" in data or "non_preferred_output" in data)


def offered_tools(row: Row) -> list[dict] | None:
    """The function specs a row offers: its `tools`, or those of an OpenAI preference row's `input`."""
    return openai_input(row)[1] if is_openai_preference(row.data) else row_tools(row)


def row_tools(row: Row, prefix: str = "") -> list[dict] | None:
    """The function specs a row offers the model (`tools`: a list, or JSON text of one as
    LLaMA-Factory's files hold it; OpenAI's legacy `functions` too), each as {"type": "function",
    "function": spec}. `prefix` is where the row keeps them (errors name `input.tools`)."""
    key = "tools" if "tools" in row.data else "functions" if "functions" in row.data else None
    if key is None or row.data[key] in (None, "", []):
        return None
    value, field = row.data[key], prefix + key
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise row.error(f"expected a list of function specs as JSON ({e.msg} at column {e.colno})", field) from None
    if not isinstance(value, list):
        raise row.error(f"expected a list of function specs, got {type(value).__name__}", field)
    tools = []
    for k, spec in enumerate(value):
        if not isinstance(spec, dict):
            raise row.error("expected a function spec object", f"{field}[{k}]")
        if spec.get("type") == "function" and isinstance(spec.get("function"), dict):
            tools.append(spec)
        elif isinstance(spec.get("name"), str):
            tools.append({"type": "function", "function": spec})
        else:
            raise row.error("a function spec needs a `name` (or {type: function, function: {name, ...}})",
                            f"{field}[{k}]")
    return tools


def alpaca_messages(row: Row) -> list[Message]:
    d = row.data
    for key in ("instruction", "output"):
        if key not in d:
            raise row.error("missing (Alpaca rows need `instruction` and `output`)", key)
    messages: list[Message] = []
    if d.get("system"):
        messages.append({"role": SYSTEM, "content": _text(row, d["system"], "system")})
    history = d.get("history") or []
    if not isinstance(history, list):
        raise row.error("expected a list of [user, assistant] pairs", "history")
    for i, pair in enumerate(history):
        if not (isinstance(pair, list | tuple) and len(pair) == 2):
            raise row.error("expected a [user, assistant] pair", f"history[{i}]")
        messages.append({"role": USER, "content": _text(row, pair[0], f"history[{i}][0]")})
        messages.append({"role": ASSISTANT, "content": _text(row, pair[1], f"history[{i}][1]")})
    prompt = _text(row, d["instruction"], "instruction")
    extra = _text(row, d.get("input") or "", "input")
    messages.append({"role": USER, "content": f"{prompt}\n{extra}" if extra else prompt})
    output = _text(row, d["output"], "output")
    if not output.strip():
        raise row.error("empty reply: nothing to train", "output")
    messages.append({"role": ASSISTANT, "content": output})
    return messages


def check_role_order(row: Row, messages: list[Message], field: str,
                     ends_with: str | tuple[str, ...] | None = ASSISTANT) -> None:
    """System only first; then user and assistant alternate, starting with user, or with assistant
    right after the system prompt (OpenAI's fine-tuning format allows a reply to open the conversation
    there, and it trains); tool results follow an assistant turn that made tool calls (or another tool
    result) and precede the next assistant turn."""
    if not messages:
        raise row.error("empty conversation", field)
    previous = None
    for i, m in enumerate(messages):
        role = m["role"]
        if role == SYSTEM:
            ok = i == 0
        elif role == USER:
            ok = previous in (None, SYSTEM, ASSISTANT)
        elif role == ASSISTANT:
            ok = previous in (USER, TOOL, SYSTEM)
        else:
            ok = previous == TOOL or (previous == ASSISTANT and bool(messages[i - 1].get("tool_calls")))
        if not ok:
            after = f"after {previous!r}" if previous else "first"
            if role == TOOL and previous == ASSISTANT:
                after += " without tool_calls"
            raise row.error(f"wrong role order: {role!r} cannot come {after}", f"{field}[{i}].role")
        previous = role
    allowed = (ends_with,) if isinstance(ends_with, str) else ends_with
    if allowed is not None and previous not in allowed:
        raise row.error(f"wrong role order: the last turn must be {' or '.join(map(repr, allowed))}, not {previous!r}",
                        field)


def check_meaningful_fields(row: Row, messages: list[Message]) -> None:
    """Fields that change what a row means are honoured elsewhere or refused here, never dropped."""
    for key in ("videos", "audios"):
        if row.data.get(key):
            raise row.error(f"a multimodal row ({key}): tunesmith reads text and images; remove the row, or the "
                            f"`{key}` field and the placeholders that point at it", key)
    if "label" in row.data and isinstance(row.data["label"], bool):
        raise row.error("a KTO row (`label` true/false marks a desirable or undesirable reply): SFT would train "
                        "undesirable replies too; drop the `label: false` rows and the field", "label")
    for i, m in enumerate(messages):
        for placeholder in PLACEHOLDERS:
            if placeholder in content_text(m.get("content")):
                raise row.error(f"unfilled placeholder {placeholder} (LLaMA-Factory's identity data expects you to "
                                "replace it with your model's name/author)", f"messages[{i}].content")


def conversation_from_row(row: Row, fmt: str | None = None) -> Conversation:
    """A training conversation (ends with an assistant reply) from one row, of the given format or
    the one detected, with the tools it offers."""
    fmt = fmt or detect_format(row)
    if fmt == "openai":
        messages, field = openai_messages(row, row.data["messages"]), "messages"
    elif fmt == "openai_preference":  # SFT trains the preferred reply, as it trains HH's `chosen`
        context, _ = openai_input(row)
        messages = context + openai_messages(row, row.data.get("preferred_output"), "preferred_output")
        field = "preferred_output"
    elif fmt == "sharegpt":
        messages, field = sharegpt_messages(row, row.data["conversations"]), "conversations"
        system = row.data.get("system")
        if system and not (messages and messages[0]["role"] == SYSTEM):
            messages.insert(0, {"role": SYSTEM, "content": _text(row, system, "system")})
    elif fmt in (HH, DAHOAS):
        messages, field = hh_conversation(row, fmt), "chosen"
    else:
        messages, field = alpaca_messages(row), "instruction"
    check_role_order(row, messages, field)
    messages = with_column_images(row, messages, field)
    check_meaningful_fields(row, messages)
    link_tool_results(messages)
    return Conversation(row, messages, offered_tools(row))


def with_column_images(row: Row, messages: list[Message], field: str) -> list[Message]:
    """The messages with the row's `images` column (ShareGPT / LLaMA-Factory) in place: each `<image>` in the
    text of a user or system message is the next image. Every image needs its placeholder, and the reverse."""
    if "images" not in row.data or row.data["images"] in (None, []):
        return messages
    column = row.data["images"] if isinstance(row.data["images"], list) else [row.data["images"]]
    if has_images(messages):
        raise row.error("images both as content parts and in the `images` column: give them one way", "images")
    images = []
    for k, value in enumerate(column):
        try:
            images.append(resolve_reference(value, *row.images_folder()))
        except ValueError as e:
            raise row.error(str(e), f"images[{k}]") from None
    placeholders = sum(content_text(m.get("content")).count(PLACEHOLDER) for m in messages)
    if placeholders != len(images):
        raise row.error(f"{len(images)} image(s) in `images` but {placeholders} {PLACEHOLDER} placeholder(s) in "
                        f"`{field}`: put one {PLACEHOLDER} where each image goes, in order", "images")
    out, used = [], 0
    for i, m in enumerate(messages):
        if isinstance(m.get("content"), str) and PLACEHOLDER in m["content"]:
            if m["role"] not in (USER, SYSTEM):
                raise row.error(f"{PLACEHOLDER} in a {m['role']} turn: images go in user turns", f"{field}[{i}]")
            content, used = split_placeholders(m["content"], images, used)
            m = {**m, "content": content}
        out.append(m)
    return out


def link_tool_results(messages: list[Message]) -> None:
    """Give every tool call an id and every tool result the id and function name of its call (the
    results after an assistant turn answer its calls in order), as templates that show them expect
    (Mistral wants 9-character ids, Gemma the function's name). Ids and names the data gives stay."""
    pending: list[dict] = []
    count = 0
    for m in messages:
        if m["role"] == ASSISTANT:
            pending = []
            for call in m.get("tool_calls") or []:
                count += 1
                call.setdefault("id", f"call{count:05d}")
                pending.append(call)
        elif m["role"] == TOOL and pending:
            call = pending.pop(0)
            m.setdefault("tool_call_id", call["id"])
            m.setdefault("name", call["function"]["name"])


def load_items(paths: Sequence[str], from_row: Callable[[Row], T], max_samples: int | None = None,
               skip_bad_rows: bool = False, selection: RowSelection | None = None,
               max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
               reader: Callable[..., Iterable[Row | DataError]] | None = None) -> tuple[list[T], list[str]]:
    """(from_row of every good row of the given files, in order, stopping after max_samples good ones;
    the problems of the bad rows). Every row is checked before anything stops: bad rows raise one
    BadRows error listing them all, or with skip_bad_rows are left out and returned. A selection
    (--data_split, --data_weights; mix.py) first keeps each file's part of the split, then draws the
    rows by weight, max_samples of them in all when given. A row longer than max_row_bytes (--max_row_bytes)
    is a bad row, refused as it is read. `reader` reads one file as read_rows does (its default): a kind of data
    with files of its own (continued pre-training's .txt documents) passes its own."""
    per_file: list[list[T]] = []
    problems: list[str] = []
    cap = None if selection and selection.weights else max_samples  # weights draw from every good row
    for path in paths:
        rows: Iterable[Row | DataError] = (reader or read_rows)(path, strict=False, max_row_bytes=max_row_bytes)
        if selection:
            rows = selection.part_of(path, list(rows))
        items: list[T] = []
        per_file.append(items)
        for row in rows:
            try:
                if isinstance(row, DataError):
                    raise row
                items.append(from_row(row))
            except DataError as e:
                problems.append(str(e))
                continue
            if cap is not None and sum(map(len, per_file)) >= cap:
                break  # rows past the cap are never parsed
        else:
            continue
        break
    if problems and (not skip_bad_rows or not any(per_file)):
        raise BadRows(problems)
    if not any(per_file):
        raise DataError(f"{', '.join(map(str, paths))}: no rows found (one JSON object per line of a JSONL file, "
                        "a JSON array of objects, or a Parquet or saved-dataset table)" + (f"; all {len(problems)} rows are bad" if problems else ""))
    items = selection.mix(paths, per_file, max_samples) if selection else [item for items in per_file for item in items]
    return items, problems


class BadRows(DataError):
    """Every bad row of the data, each as file:line: field: problem."""

    SHOWN = 20

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "\n  ".join(problems[: self.SHOWN])
        more = f"\n  ... and {len(problems) - self.SHOWN} more" if len(problems) > self.SHOWN else ""
        super().__init__(f"{len(problems)} bad row{'s' if len(problems) > 1 else ''} (fix them, or pass "
                         f"--skip_bad_rows to leave them out and list them in the output folder):\n  {shown}{more}")


def load_conversations(paths: Sequence[str], max_samples: int | None = None) -> list[Conversation]:
    """Every conversation in the given files, in order; the format is detected per row, so files
    that mix formats work too."""
    return load_items(paths, conversation_from_row, max_samples)[0]
