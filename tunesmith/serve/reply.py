"""A reply's text split into what OpenAI clients read apart: the reasoning (a template's `<think>`
block, as `reasoning_content`), the content, and the tool calls (data/tool_calls.py parses them), the same way
whether the reply comes whole or streamed.

Streamed, the text is held back only where the split is not yet known: a tail that may grow into
`</think>` or `<tool_call>`, whitespace that may end the reasoning or precede a call, and, while tools
are in play, everything from a call's opening (or a reply that opens with `{`, a bare JSON call) to the
end, when it is parsed. So the streamed deltas, joined, are the whole reply's fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..data.tool_calls import CLOSE, OPEN, CallFormat, ToolCall, parse_calls, tool_names
from .tool_choice import ToolChoice

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# What tool_choice none bans. The call tag's opening without its ">": a model tuned to call, refused the exact
# tag, writes a near one (`<tool_call*>`, `<tool_calls>`) and its call after it as text. A bare JSON call's
# starts, matched with whitespace aside (`{ "name"` too): a call's object or a list of them.
CALL_TAG_START = OPEN.removesuffix(">")
BARE_CALL_STARTS = ('{"name"', '[{"name"')


def template_text(tokenizer: Any) -> str:
    """The chat template's source (a tokenizer may carry several by name: all of them)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return template if isinstance(template, str) else "\n".join(map(str, template.values()))


@dataclass(frozen=True)
class ReplyShape:
    """What a reply may hold besides text, known before it is generated. `reasoning`: the template writes
    `<think>` blocks; `opened`: the prompt ends inside one (DeepSeek R1's and Qwen3's generation prompts
    open it), so the reply starts as reasoning; `names`: the functions a call may name (None: calls are
    not parsed: no tools, or tool_choice none); `forced`: the call's opening put after the prompt
    (tool_choice required or a function), put back before the reply is parsed; `stop`: stop strings
    that end a forced call; `banned`, `banned_openings`: what tool_choice none keeps out of the reply
    while it is sampled (SamplingParams' banned_strings and banned_openings): the template's call tag
    with whatever follows its opening (CALL_TAG_START), or for a template of bare JSON calls a call's
    opening at the reply's start (BARE_CALL_STARTS)."""

    reasoning: bool = False
    opened: bool = False
    names: tuple[str, ...] | None = None
    forced: str = ""
    stop: tuple[str, ...] = ()
    banned: tuple[str, ...] = ()
    banned_openings: tuple[str, ...] = ()

    @classmethod
    def of(cls, template: str, prompt: str, tools: list[dict] | None, choice: ToolChoice) -> ReplyShape:
        """The shape for a prompt rendered by `template`. A forced call starts right after the prompt,
        so it has no reasoning before it. tool_choice none bans the call, whether or not the prompt lists
        the tools (ToolChoice.prompt_tools): its reply is text whatever the model was tuned to do."""
        calls = tools is not None and choice.mode != "none"
        call_format = CallFormat.of(template)
        forced = call_format.opening(choice) if calls and choice.forced else ""
        # One call to a named function ends at its closing tag (a model that would go on cannot).
        stop = (CLOSE,) if choice.mode == "function" and call_format.tagged and calls else ()
        banned, banned_openings = (), ()
        if tools is not None and choice.mode == "none":
            if call_format.tagged:
                banned = (CALL_TAG_START,)
            else:  # a bare JSON call is a call only as the whole reply: it may not open with one
                banned_openings = BARE_CALL_STARTS
        reasoning = THINK_OPEN in template and not forced
        opened = reasoning and prompt.rstrip().endswith(THINK_OPEN)
        return cls(reasoning, opened, tuple(tool_names(tools)) if calls else None, forced, stop, banned,
                   banned_openings)


@dataclass
class Reply:
    reasoning: str | None
    content: str | None
    calls: list[ToolCall] = field(default_factory=list)

    def message(self) -> dict:
        """The assistant message's fields: content (null beside calls and no text), tool_calls, reasoning_content."""
        message: dict[str, Any] = {"content": self.content}
        if self.calls:
            message["tool_calls"] = [call.openai() for call in self.calls]
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        return message

    def call_deltas(self) -> list[dict]:
        """The calls as OpenAI streams them: per call, its id, type and name with empty arguments, then
        the arguments."""
        deltas = []
        for k, call in enumerate(self.calls):
            deltas.append({"tool_calls": [{"index": k, "id": call.id, "type": "function",
                                           "function": {"name": call.name, "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": k, "function": {"arguments": call.arguments}}]})
        return deltas

    def finish_reason(self, engine_reason: str) -> str:
        return "tool_calls" if self.calls else engine_reason


def _held(text: str, marker: str) -> int:
    """The length of text's longest tail that is the start of `marker` (it may yet grow into it)."""
    return max((k for k in range(1, len(marker)) if text.endswith(marker[:k])), default=0)


class ReplySplitter:
    """One reply's text in, its fields out: `feed` returns the deltas that can be sent now, `finish` the
    rest and the whole reply."""

    def __init__(self, shape: ReplyShape) -> None:
        self.shape, self.text = shape, ""
        self._sent = {"reasoning_content": 0, "content": 0}

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        reasoning, content, _ = self._split(final=False)
        return self._deltas(reasoning, content)

    def finish(self) -> tuple[list[dict], Reply]:
        reasoning, content, calls = self._split(final=True)
        deltas = self._deltas(reasoning, content)
        return deltas, Reply(reasoning or None, content or (None if calls else ""), calls)

    def _deltas(self, reasoning: str | None, content: str | None) -> list[dict]:
        deltas = []
        for key, value in (("reasoning_content", reasoning or ""), ("content", content or "")):
            if len(value) > self._sent[key]:
                deltas.append({key: value[self._sent[key]:]})
                self._sent[key] = len(value)
        return deltas

    def _split(self, final: bool) -> tuple[str | None, str, list[ToolCall]]:
        """(reasoning, content, calls) of the text so far: all of it when final, else what is sure."""
        text, reasoning = self.text, None
        if self.shape.reasoning:
            start: int | None = 0
            if not self.shape.opened:
                lead = len(text) - len(text.lstrip())
                if text[lead:].startswith(THINK_OPEN):
                    start = lead + len(THINK_OPEN)
                elif not final and THINK_OPEN.startswith(text[lead:]):
                    return None, "", []
                else:
                    start = None
            if start is not None:
                end = text.find(THINK_CLOSE, start)
                if end < 0:  # still thinking (or cut off while thinking)
                    body = text[start:] if final else text[start:len(text) - _held(text, THINK_CLOSE)]
                    return body.strip(), "", []
                reasoning, text = text[start:end].strip(), text[end + len(THINK_CLOSE):].lstrip()
        content, calls = self._content(text, final)
        return reasoning, content, calls

    def _content(self, text: str, final: bool) -> tuple[str, list[ToolCall]]:
        names = self.shape.names
        if names is None:
            return text, []
        if self.shape.forced:
            if not final:
                return "", []
            text = self.shape.forced + text  # the reply as the model wrote it, its forced opening included
        elif not final:
            if OPEN in text:
                return text[:text.index(OPEN)].rstrip(), []
            if text.lstrip().startswith(("{", "[")):
                return "", []
            return text[:len(text) - _held(text, OPEN)].rstrip(), []
        parsed = parse_calls(text, list(names))
        return (text, []) if parsed is None else parsed
