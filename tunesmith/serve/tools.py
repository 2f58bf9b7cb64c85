"""Function calling on the server (OpenAI's `tools` and `tool_choice`; protocol.py checks the fields):
how the served template writes a call, the text that forces a call's opening onto the prompt, and a
reply's text parsed back into OpenAI tool calls.

A reply is a call in one of the formats chat templates teach: `<tool_call>{json}</tool_call>` blocks
(tunesmith's chatml_tools, Hermes, Qwen2.5 and Qwen3), or a reply that is nothing but a JSON object
(or list of them) with "name" and "arguments" or "parameters" (Llama 3.x). A call must name a function
the request offered and carry an object of arguments; anything else is no call, and the reply comes
back as text: a model's malformed call is the model's answer, not a server error.

Scoring a reply's call against the one it should make (`score_call`, for compare and the shipped
tunesmith_tool_calls lm-eval task) is more lenient: the first JSON object with a string "name" anywhere
in the reply is its call, whatever the format around it."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolChoice:
    """`mode` none (tools shown, never called), auto, required (some call), or function (`name`'s)."""

    mode: str = "auto"
    name: str | None = None

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "function")


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

    def opening(self, choice: ToolChoice) -> str:
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


CALL_SCORES = ("well_formed", "right_function", "right_arguments")


def first_call(text: str) -> dict | None:
    """The first JSON object with a string `name` in a reply (how every tool-call format writes it)."""
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            return value
    return None


def score_call(reply: str, expected: dict) -> dict[str, int]:
    """1 or 0 for each of CALL_SCORES: the reply holds a well-formed call (a JSON object with a name and
    object arguments), to the expected function, with the expected arguments too."""
    scores = dict.fromkeys(CALL_SCORES, 0)
    call = first_call(reply)
    if call is None or not isinstance(call.get("arguments", {}), dict):
        return scores
    scores["well_formed"] = 1
    if call["name"] == expected["name"]:
        scores["right_function"] = 1
        scores["right_arguments"] = int(same_arguments(call.get("arguments", {}), expected.get("arguments", {})))
    return scores


def score_calls(replies: list[str], expected: list[dict]) -> dict[str, int]:
    """How many replies score on each of CALL_SCORES (see score_call)."""
    scores = [score_call(reply, want) for reply, want in zip(replies, expected)]
    return {key: sum(s[key] for s in scores) for key in CALL_SCORES}


def same_arguments(got: dict, want: dict) -> bool:
    """Equal arguments, numbers compared as numbers (5 == 5.0)."""
    return got.keys() == want.keys() and all(
        float(got[k]) == float(want[k]) if isinstance(want[k], int | float) and isinstance(got[k], int | float)
        else got[k] == want[k] for k in want)
