"""Conversation data formats, read into one canonical form: a list of messages
`{"role": system|user|assistant|tool, "content": str}` (plus an optional `"loss": false`).

Formats are detected per row (so a file may mix them): OpenAI `messages`, ShareGPT `conversations`,
Alpaca `instruction`/`input`/`output`. Every error names the file, the line (JSONL) or row (JSON
array), and the field."""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..constants import ASSISTANT, LOSS_FLAG, ROLES, SYSTEM, TOOL, USER
from ..errors import DataError
from ..utils.paths import problem_with_data_file

Message = dict[str, Any]
T = TypeVar("T")

SHAREGPT_ROLES = {"system": SYSTEM, "human": USER, "user": USER, "gpt": ASSISTANT, "assistant": ASSISTANT,
                  "function_call": ASSISTANT, "observation": TOOL, "tool": TOOL}


@dataclass(frozen=True)
class Row:
    """One input row and where it came from."""

    path: str
    line: int  # 1-based line in a JSONL file, or 1-based position in a JSON array
    data: dict

    def where(self, field: str | None = None) -> str:
        unit = "row" if self.path.endswith(".json") else "line"
        loc = f"{self.path}:{unit} {self.line}"
        return f"{loc}: field `{field}`" if field else loc

    def error(self, message: str, field: str | None = None) -> DataError:
        return DataError(f"{self.where(field)}: {message}")


@dataclass(frozen=True)
class Conversation:
    row: Row
    messages: list[Message]


def read_rows(path: str | Path) -> Iterator[Row]:
    """Rows of a JSONL file (blank lines skipped) or of a JSON array, each with its position. A file
    that is missing, empty, a directory, Parquet or not UTF-8 is refused by name."""
    path = str(path)
    text = read_data_text(path)
    if path.endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
        items = data if isinstance(data, list) else [data]
        for i, item in enumerate(items, start=1):
            yield _as_row(path, i, item)
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:line {lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
        yield _as_row(path, lineno, item)


def read_data_text(path: str) -> str:
    """The text of a data file, decoded as UTF-8 (a byte-order mark is allowed and dropped)."""
    problem = problem_with_data_file(path)
    if problem:
        raise DataError(f"data file {path}: {problem}")
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        utf16 = " (it looks like UTF-16)" if raw[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) else ""
        raise DataError(f"{path}:line {line}: not UTF-8 text{utf16}: byte {e.start} is 0x{raw[e.start]:02x}; "
                        "save the file as UTF-8") from None
    return text.removeprefix("\ufeff")


def _as_row(path: str, line: int, item: Any) -> Row:
    row = Row(path, line, item if isinstance(item, dict) else {})
    if not isinstance(item, dict):
        raise row.error(f"expected a JSON object, got {type(item).__name__}")
    return row


def detect_format(row: Row) -> str:
    if "messages" in row.data:
        return "openai"
    if "conversations" in row.data:
        return "sharegpt"
    if "instruction" in row.data:
        return "alpaca"
    raise row.error(
        f"unknown format (keys: {sorted(row.data)}); expected `messages` (OpenAI), `conversations` (ShareGPT) "
        "or `instruction`/`output` (Alpaca)"
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


OPENAI = MessageShape("role", "content", {role: role for role in ROLES},
                      f"unknown role {{!r}} (expected one of {', '.join(ROLES)})")
SHAREGPT = MessageShape("from", "value", SHAREGPT_ROLES, "unknown speaker {!r} (expected human, gpt or system)")


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
        for key in (shape.role_key, shape.content_key):
            if key not in m:
                raise row.error(f"missing `{key}`", where)
        speaker = m[shape.role_key]
        role = shape.roles.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise row.error(shape.unknown_role.format(speaker), f"{where}.{shape.role_key}")
        content = _text(row, m[shape.content_key], f"{where}.{shape.content_key}")
        messages.append(_message(row, role, content, m, where))
    return messages


def openai_messages(row: Row, items: Any, field: str = "messages") -> list[Message]:
    return read_messages(row, items, field, OPENAI)


def sharegpt_messages(row: Row, items: Any, field: str = "conversations") -> list[Message]:
    return read_messages(row, items, field, SHAREGPT)


def _message(row: Row, role: str, content: str, source: dict, where: str) -> Message:
    message: Message = {"role": role, "content": content}
    if LOSS_FLAG in source:
        if not isinstance(source[LOSS_FLAG], bool):
            raise row.error("expected true or false", f"{where}.{LOSS_FLAG}")
        message[LOSS_FLAG] = source[LOSS_FLAG]
    return message


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
    messages.append({"role": ASSISTANT, "content": _text(row, d["output"], "output")})
    return messages


def check_role_order(row: Row, messages: list[Message], field: str, ends_with: str | None = ASSISTANT) -> None:
    """System only first; then user and assistant alternate, starting with user (tool results may
    follow an assistant turn and precede the next assistant turn)."""
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
            ok = previous in (USER, TOOL)
        else:
            ok = previous in (ASSISTANT, TOOL)
        if not ok:
            after = f"after {previous!r}" if previous else "first"
            raise row.error(f"wrong role order: {role!r} cannot come {after}", f"{field}[{i}].role")
        previous = role
    if ends_with is not None and previous != ends_with:
        raise row.error(f"wrong role order: the last turn must be {ends_with!r}, not {previous!r}", field)


def conversation_from_row(row: Row, fmt: str | None = None) -> Conversation:
    """A training conversation (ends with an assistant reply) from one row, of the given format or
    the one detected."""
    fmt = fmt or detect_format(row)
    if fmt == "openai":
        messages, field = openai_messages(row, row.data["messages"]), "messages"
    elif fmt == "sharegpt":
        messages, field = sharegpt_messages(row, row.data["conversations"]), "conversations"
    else:
        messages, field = alpaca_messages(row), "instruction"
    check_role_order(row, messages, field)
    return Conversation(row, messages)


def load_items(paths: Sequence[str], from_row: Callable[[Row], T], max_samples: int | None = None) -> list[T]:
    """from_row of every row of the given files, in order, stopping after max_samples; the one reader
    of conversations, preference pairs and prompts alike."""
    items: list[T] = []
    for path in paths:
        for row in read_rows(path):
            items.append(from_row(row))
            if max_samples is not None and len(items) >= max_samples:
                return items  # before reading another row: rows past the cap are never parsed
    if not items:
        raise DataError(f"{', '.join(map(str, paths))}: no rows found (one JSON object per line of a JSONL file, "
                        "or a JSON array of objects)")
    return items


def load_conversations(paths: Sequence[str], max_samples: int | None = None) -> list[Conversation]:
    """Every conversation in the given files, in order; the format is detected per row, so files
    that mix formats work too."""
    return load_items(paths, conversation_from_row, max_samples)
