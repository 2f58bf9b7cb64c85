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
tunesmith_tool_calls lm-eval task) is data/call_scores.py's: the server does not score calls."""

from __future__ import annotations

from dataclasses import dataclass

# Parsing lives in data/tool_calls.py, below serve/, since the RL rollouts parse and run calls too; its names are
# re-exported here, so the server and its callers import them from here as before.
from ..data.tool_calls import CLOSE, OPEN, CallFormat, ToolCall, call_id, parse_calls, tool_names

__all__ = ["CLOSE", "OPEN", "CallFormat", "ToolCall", "ToolChoice", "call_id", "parse_calls", "tool_names"]


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
