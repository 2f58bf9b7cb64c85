"""OpenAI's `tool_choice` on the server (protocol.py checks the request's fields): none (never called), auto,
required (some call) or one function's, and the tools the template lists in the prompt under it. How a reply's text
becomes tool calls, and how the served template writes one, is data/tool_calls.py's (the RL rollouts parse calls
too, and a feature imports only the core); scoring a call against the one it should make is data/call_scores.py's."""

from __future__ import annotations

from dataclasses import dataclass


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
