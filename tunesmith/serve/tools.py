"""Function calling on the server (OpenAI's `tools` and `tool_choice`; protocol.py checks the fields):
how the served template writes a call, the text that forces a call's opening onto the prompt, and a
reply's text parsed back into OpenAI tool calls (the parsing itself is data/tool_calls.py's, re-exported
here: the RL rollouts parse calls too, and the rl/ feature imports only the core).

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
from dataclasses import dataclass

# Parsing lives in data/tool_calls.py, below serve/, since the RL rollouts parse and run calls too; its names are
# re-exported here, so the server and its callers import them from here as before.
from ..data.tool_calls import CLOSE, OPEN, CallFormat, ToolCall, call_id, parse_calls, tool_names

__all__ = ["CALL_SCORES", "CLOSE", "OPEN", "CallFormat", "ToolCall", "ToolChoice", "call_id", "first_call",
           "parse_calls", "same_arguments", "score_call", "score_calls", "tool_names"]


@dataclass(frozen=True)
class ToolChoice:
    """`mode` none (never called), auto, required (some call), or function (`name`'s)."""

    mode: str = "auto"
    name: str | None = None

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "function")

    def prompt_tools(self, tools: list[dict] | None, keep_for_none: bool = False) -> list[dict] | None:
        """The tools the template lists in the prompt: the request's, but none under tool_choice none
        unless `keep_for_none` (serve's --keep_tools_when_tool_choice_none). A model tuned to call when it
        sees tools goes on trying to call when they are listed, whatever the ban lets through (issue #56),
        so "none" shows it a prompt without them, as vLLM's --expand-tools-even-if-tool-choice-none
        (off by default) did."""
        return None if self.mode == "none" and not keep_for_none else tools


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
