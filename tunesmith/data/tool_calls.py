"""A reply's text parsed back into tool calls, in the format the chat template teaches: the server turns
them into OpenAI's `tool_calls` (serve/), the RL rollouts run them (rl/tool_rollout.py). Its own module
below both, since rl/ (a feature) may not import serve/.

A reply is a call in one of the formats chat templates teach: `<tool_call>{json}</tool_call>` blocks
(tunesmith's chatml_tools, Hermes, Qwen2.5 and Qwen3), or a reply that is nothing but a JSON object
(or list of them) with "name" and "arguments" or "parameters" (Llama 3.x). A call must name a function
that was offered and carry an object of arguments; anything else is no call, and the reply is text: a
model's malformed call is the model's answer, not an error."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Protocol

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class ForcedChoice(Protocol):
    """What `CallFormat.opening` reads of a tool choice (the server's ToolChoice): `mode` required or
    function, and the function's `name`."""

    mode: str
    name: str | None


def tool_names(tools: list[dict] | None) -> list[str]:
    return [tool["function"]["name"] for tool in tools or []]


@dataclass(frozen=True)
class CallFormat:
    """How the served model's template writes a call, read from the template's text: `<tool_call>` blocks
    when it mentions them (with a newline after the tag where it writes one: Hermes, Qwen), else a bare
    JSON object (Llama 3.x), whose arguments key is "parameters" where the template writes that."""

    tagged: bool = True
    newline: bool = False
    arguments_key: str = "arguments"

    @classmethod
    def of(cls, template: str | None) -> CallFormat:
        template = template or ""
        tagged = OPEN in template
        newline = tagged and re.search(r"<tool_call>(\\n|\n)", template) is not None
        key = "parameters" if not tagged and '"parameters"' in template else "arguments"
        return cls(tagged, newline, key)

    def opening(self, choice: ForcedChoice) -> str:
        """The text put after the prompt so the model can only go on with a call: the call's opening up
        to the function's name (required), or up to its arguments (a named function)."""
        start = (OPEN + ("\n" if self.newline else "")) if self.tagged else ""
        if choice.mode == "function":
            return f'{start}{{"name": {json.dumps(choice.name)}, "{self.arguments_key}": '
        return start + '{"name": "'


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    """One parsed call: the function's name, its arguments as JSON text (OpenAI's form), an id."""

    name: str
    arguments: str
    id: str = field(default_factory=call_id)

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_calls(text: str, names: list[str]) -> tuple[str, list[ToolCall]] | None:
    """(the text around the calls, the calls) of a reply, or None when it holds no well-formed call to
    one of `names`. A block the reply did not close (it ended at a stop string, or ran out of tokens
    just after the JSON) counts when its JSON is whole."""
    if OPEN in text:
        before, _, rest = text.partition(OPEN)
        outside, calls = [before.rstrip()], []
        for block in rest.split(OPEN):
            body, _, after = block.partition(CLOSE)
            found = _calls(body, names, bare=False)
            if found is None:
                return None
            calls += found
            outside.append(after.strip())
        return "\n".join(part for part in outside if part), calls
    if text.lstrip().startswith(("{", "[")):
        calls = _calls(text, names, bare=True)
        return None if calls is None else ("", calls)
    return None


def _calls(body: str, names: list[str], bare: bool) -> list[ToolCall] | None:
    """The calls in one JSON text: an object {"name", "arguments"|"parameters"}, or a list of them. Inside
    a call's tags the arguments may be left out (none); a bare object must have them, or a JSON answer
    that happens to hold a "name" would be taken for a call."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    items = value if isinstance(value, list) and value else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            return None
        if bare and not ("arguments" in item or "parameters" in item):
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as JSON text, as OpenAI sends them
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None
        if not isinstance(arguments, dict):
            return None
        calls.append(ToolCall(item["name"], json.dumps(arguments, ensure_ascii=False)))
    return calls
